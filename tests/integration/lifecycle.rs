//! Shutdown with work in flight, back-pressure, releases, synchronous mode, and the
//! fault-injection soak.

use std::time::{Duration, Instant};

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::vm::ThreadTopology;

use crate::common;

#[test]
fn back_pressure_bounds_instructions_in_flight() {
    let mock = MockConfig { launch_delay: Duration::from_micros(50), ..MockConfig::default() };
    let mut c = Config::default().with_mock_devices(1, mock);
    c.high_water = 64;
    c.low_water = 16;
    c.batch_size = 8;
    let vm = VirtualMachine::new(c).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let relu = vm.op("relu").unwrap();
    let x = vm.from_slice(&[1.0f32], &[1], DeviceId::mock(0)).unwrap();
    let ys: Vec<Tensor> = (0..16).map(|_| vm.empty(&[1], DType::F32, DeviceId::mock(0)).unwrap()).collect();
    let mut max_seen = 0;
    let t0 = Instant::now();
    vm.run(|b| {
        for i in 0..1000 {
            b.call_into(relu, &[&x], &[&ys[i % 16]], Attrs::default(), g).unwrap();
            max_seen = max_seen.max(vm.in_flight());
        }
    });
    // The caller was held back: submitting took at least (1000 - 64) device launches' time.
    assert!(max_seen <= 64 + 8 + 1, "in flight peaked at {max_seen}");
    assert!(t0.elapsed() >= Duration::from_micros(50 * 900), "{:?}", t0.elapsed());
    vm.sync().unwrap();
    assert_eq!(ys[3].to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn dropping_handles_releases_storage_after_its_last_use() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (add, relu) = (vm.op("add").unwrap(), vm.op("relu").unwrap());
    let a = vm.from_slice(&[1.0f32, -2.0], &[2], DeviceId::CPU).unwrap();
    // Temporaries dropped inside the closure are released after the calls that use them.
    let out = vm
        .run(|b| -> Result<Tensor> {
            let mut acc = b.call(relu, &[&a], Attrs::default(), cpu)?;
            for _ in 0..100 {
                let t = b.call(add, &[&acc, &a], Attrs::default(), cpu)?;
                acc = t; // the old `acc` drops here, with its uses still unsubmitted
            }
            Ok(acc)
        })
        .unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![101.0, -200.0]);
    vm.sync().unwrap();
}

#[test]
fn synchronous_mode_runs_everything_before_returning() {
    let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
    c.synchronous = true;
    let vm = VirtualMachine::new(c).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let x = vm.from_slice(&[3.0f32, -1.0], &[2], DeviceId::mock(0)).unwrap();
    let y = vm.run(|b| b.call(vm.op("relu").unwrap(), &[&x], Attrs::default(), g)).unwrap();
    assert_eq!(vm.in_flight(), 0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 0.0]);
    vm.sync().unwrap();
}

#[test]
fn every_thread_topology_runs_the_same_program() {
    let mut results = Vec::new();
    for threads in [ThreadTopology::PerStream, ThreadTopology::PerDevice, ThreadTopology::Single] {
        let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
        c.threads = threads;
        let vm = VirtualMachine::new(c).unwrap();
        let (g, cpu) =
            (vm.compute_stream(DeviceId::mock(0)).unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
        let w = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], DeviceId::mock(0)).unwrap();
        let h = vm.from_slice(&[0.5f32, -1.0, 2.0, 1.0], &[2, 2], DeviceId::CPU).unwrap();
        let out = vm
            .run(|b| -> Result<Tensor> {
                let hw = vm.empty(&[2, 2], DType::F32, DeviceId::mock(0))?;
                b.call_into(
                    vm.op("copy")?,
                    &[&h],
                    &[&hw],
                    Attrs::default(),
                    vm.stream(DeviceId::mock(0), StreamType::H2D)?,
                )?;
                let m = b.call(vm.op("matmul")?, &[&w, &hw], Attrs::default(), g)?;
                let back = vm.empty(&[2, 2], DType::F32, DeviceId::CPU)?;
                b.call_into(
                    vm.op("copy")?,
                    &[&m],
                    &[&back],
                    Attrs::default(),
                    vm.stream(DeviceId::mock(0), StreamType::D2H)?,
                )?;
                b.call(vm.op("sum")?, &[&back], Attrs::default(), cpu)
            })
            .unwrap();
        results.push(out.to_vec::<f32>().unwrap());
    }
    // [[1,2],[3,4]] x [[0.5,-1],[2,1]] = [[4.5,1],[9.5,1]]; sum 16.
    assert_eq!(results, vec![vec![16.0]; 3]);
}

/// A thread the VM needs cannot be started: waits return an error instead of hanging, the
/// VM says why at `sync`, and dropping it returns.
#[test]
fn a_missing_watcher_thread_is_an_error_not_a_hang() {
    let mut config = Config::default().with_mock_devices(1, MockConfig::default());
    config.fault.refuse_watcher_threads = true;
    let vm = VirtualMachine::new(config).unwrap();
    let x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::mock(0));
    // The copy to the device can never complete; reading it back must not hang.
    let read = x.and_then(|x| x.to_vec::<f32>());
    assert!(read.is_err(), "read {read:?}");
    let e = vm.sync().unwrap_err();
    assert!(matches!(e, Error::ShutDown | Error::Failed { .. }), "{e}");
    drop(vm);
}

/// The last handle of a tensor dropped on one thread while another thread's builder still
/// holds unsubmitted instructions that use it: the `Release` must follow those
/// instructions, not overtake them.
#[test]
fn a_release_from_another_thread_waits_for_unsubmitted_uses() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let relu = vm.op("relu").unwrap();
    for _ in 0..20 {
        let t = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::CPU).unwrap();
        let elsewhere = t.clone();
        let (built_tx, built_rx) = std::sync::mpsc::channel::<()>();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        let y = std::thread::scope(|s| {
            s.spawn(move || {
                built_rx.recv().unwrap();
                drop(elsewhere); // the last handle, while the other thread's batch is open
                dropped_tx.send(()).unwrap();
            });
            vm.run(|b| {
                let y = b.call(relu, &[&t], Attrs::default(), cpu)?;
                drop(t);
                built_tx.send(()).unwrap();
                dropped_rx.recv().unwrap();
                Ok::<_, Error>(y)
            })
            .unwrap()
        });
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0]);
    }
    vm.sync().unwrap();
}

/// On an asynchronous stream most launches have no event of their own (`event_interval`):
/// they retire with the next event, at the latest the one recorded when a worker's batch
/// ends. A host wait after fewer launches than the interval still returns, results are
/// those of one event per launch, and nothing stays in flight.
#[test]
fn launches_without_an_event_of_their_own_retire_with_a_later_one() {
    // Run where a hang (a launch no event ever covers) fails the test instead of stalling it.
    let (done, finished) = std::sync::mpsc::channel();
    let body = std::thread::spawn(move || {
        retire_with_a_later_event();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => body.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(body.join().expect_err("it panicked"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a host wait never returned: a launch was left without an event")
        }
    }
}

fn retire_with_a_later_event() {
    for interval in [1u32, 3, 1_000_000] {
        let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
        c.event_interval = interval;
        c.batch_size = 7;
        let vm = VirtualMachine::new(c).unwrap();
        let dev = DeviceId::mock(0);
        let (s, h2d) = (vm.compute_stream(dev).unwrap(), vm.stream(dev, StreamType::H2D).unwrap());
        let (scale, copy) = (vm.op("scale").unwrap(), vm.op("copy").unwrap());
        let a = vm.from_slice(&[1.0f32], &[1], dev).unwrap();
        let b = vm.empty(&[1], DType::F32, dev).unwrap();
        // Five launches, fewer than the interval and than a batch: a host wait must return.
        vm.run(|bld| -> Result<()> {
            for i in 0..5 {
                let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                bld.call_into(scale, &[from], &[to], Attrs::scalar(2.0), s)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![32.0], "interval {interval}");
        // Many batches, and a cross-stream reader on the device's H2D stream, which waits
        // for an event recorded on the compute stream in the middle of an interval.
        let host = vm.from_slice(&[0.5f32], &[1], DeviceId::CPU).unwrap();
        vm.run(|bld| -> Result<()> {
            for i in 0..100 {
                let (from, to) = if i % 2 == 0 { (&b, &a) } else { (&a, &b) };
                bld.call_into(scale, &[from], &[to], Attrs::scalar(if i % 2 == 0 { 0.5 } else { 2.0 }), s)?;
                if i % 17 == 0 {
                    bld.call_into(copy, &[&host], &[to], Attrs::default(), h2d)?;
                }
            }
            Ok(())
        })
        .unwrap();
        vm.sync().unwrap();
        // The last copy (i = 85, into b) set 0.5; fourteen more calls halve then double.
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![0.5], "interval {interval}");
        // The count drops once per scheduler loop, just after the waiters are released.
        let deadline = Instant::now() + Duration::from_secs(10);
        while vm.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(vm.in_flight(), 0, "interval {interval}: everything retired");
    }
}

/// Program steps the soak runs: `EAGERVM_SOAK_INSTRUCTIONS`, else 10^5 (a few seconds in
/// release). `.ci/run` runs 10^6.
fn soak_steps() -> usize {
    std::env::var("EAGERVM_SOAK_INSTRUCTIONS").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(100_000)
}

/// Tensors of the soak's programs: six on each of `cpu:0`, `mock:0` and `mock:1`.
const SOAK_TENSORS: usize = 18;
/// About one tensor in this many cannot get storage (`FaultInjection::fail_alloc_one_in`).
const SOAK_ALLOC_ONE_IN: u64 = 64;
/// The most the process's resident memory may grow from the end of the soak's first tenth
/// to its end. A VM that kept a tensor object (256 bytes) per step would grow by about
/// 23 MiB over 10^5 steps and 230 MiB over 10^6; the bound leaves room for the allocator's
/// settling.
const SOAK_RSS_GROWTH_KIB: u64 = 12 << 10;

/// The process's resident memory, in KiB (`VmRSS` of `/proc/self/status`).
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS in kB")
}

/// SplitMix64: the soak's programs follow from its seed alone.
struct SoakRng(u64);

impl SoakRng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// Keep the expected panics of the `panic` op (thousands of them) out of the test's
/// output; every other panic is reported as before.
fn quiet_expected_panics() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let message = payload
                .downcast_ref::<String>()
                .map(String::as_str)
                .or_else(|| payload.downcast_ref::<&str>().copied());
            if !message.is_some_and(|m| m.starts_with("panic op: ")) {
                previous(info);
            }
        }));
    });
}

/// The soak's VM and program state, and the sequential reference beside it.
struct Soak<'vm> {
    vm: &'vm VirtualMachine,
    streams: Vec<StreamId>,
    ts: Vec<Tensor>,
    reference: common::Interpreter,
}

impl<'vm> Soak<'vm> {
    fn new(vm: &'vm VirtualMachine) -> Self {
        let streams = common::Mix::CPU_MOCK.stream_table(vm).unwrap();
        let mut soak =
            Soak { vm, streams, ts: Vec::new(), reference: common::Interpreter::new(0, &mut |_| None) };
        let made: Vec<_> = (0..SOAK_TENSORS).map(|t| soak.create(t)).collect();
        let mut origins = made.iter().map(|(_, o)| o.clone());
        soak.reference =
            common::Interpreter::new(SOAK_TENSORS, &mut |_| origins.next().expect("one per tensor"));
        soak.ts = made.into_iter().map(|(t, _)| t).collect();
        soak
    }

    /// Why the storage of `t` cannot be allocated, if the fault injection chose it.
    fn alloc_fails(&self, t: &Tensor) -> Option<common::Origin> {
        self.vm.config().fault.fails_alloc(t.id()).then(|| common::Origin::Alloc(t.id()))
    }

    /// Tensor `t` with its initial value, written on the host and copied to its device
    /// through tensors whose ids the soak knows (so that it knows which allocations fail),
    /// and the failure it carries if one of them cannot be allocated.
    fn create(&self, t: usize) -> (Tensor, Option<common::Origin>) {
        let device = common::device_of(t);
        let staging = self.vm.from_slice(&common::initial(t), &common::SHAPE, DeviceId::CPU).unwrap();
        if device.is_host() {
            let failed = self.alloc_fails(&staging);
            return (staging, failed);
        }
        let dst = self.vm.empty(&common::SHAPE, DType::F32, device).unwrap();
        let h2d = self.streams[common::streams_of(device)[1]];
        let copy = self.vm.op("copy").unwrap();
        self.vm.run(|b| b.call_into(copy, &[&staging], &[&dst], Attrs::default(), h2d)).unwrap();
        let failed = self.alloc_fails(&staging).or_else(|| self.alloc_fails(&dst));
        (dst, failed)
    }

    /// Read tensor `t` on the VM (a device tensor through a new host tensor of known id)
    /// and in the reference, and compare.
    fn read(&mut self, t: usize, what: &str) {
        let device = common::device_of(t);
        let (got, scratch) = if device.is_host() {
            (self.ts[t].to_vec::<f32>(), None)
        } else {
            let scratch = self.vm.empty(&common::SHAPE, DType::F32, DeviceId::CPU).unwrap();
            let d2h = self.streams[common::streams_of(device)[2]];
            let copy = self.vm.op("copy").unwrap();
            self.vm.run(|b| b.call_into(copy, &[&self.ts[t]], &[&scratch], Attrs::default(), d2h)).unwrap();
            (scratch.to_vec::<f32>(), Some(scratch))
        };
        let failed = scratch.as_ref().and_then(|s| self.alloc_fails(s));
        let want = self.reference.step(&common::Step::Read { t }, &mut |_| failed.clone()).expect("a read");
        match (&got, &want) {
            (Ok(v), Ok(w)) => {
                assert_eq!(common::bits(v), common::bits(w), "{what}: tensor {t} has the wrong value")
            }
            (Err(e), Err(o)) => {
                assert_eq!(common::Origin::of(e).as_ref(), Some(o), "{what}: tensor {t}: {e}")
            }
            _ => panic!("{what}: tensor {t} reads {got:?}, the reference says {want:?}"),
        }
    }

    /// Run `steps` on the VM and in the reference, comparing every read.
    fn run(&mut self, steps: &[common::Step]) {
        use common::Step;
        let mut i = 0;
        while i < steps.len() {
            let start = i;
            let (vm, ts, streams) = (self.vm, &self.ts, &self.streams);
            vm.run(|b| {
                while let Some(s) =
                    steps.get(i).filter(|s| !matches!(s, Step::Read { .. } | Step::Recreate { .. }))
                {
                    common::emit(vm, b, s, ts, streams).expect("valid calls are accepted");
                    i += 1;
                }
            });
            for s in &steps[start..i] {
                let out = match *s {
                    Step::Fill { out, .. } | Step::Unary { out, .. } | Step::Binary { out, .. } => out,
                    Step::Copy { dst, .. } => dst,
                    Step::Read { .. } | Step::Recreate { .. } => unreachable!("not in a run"),
                    Step::Collective { .. } => unreachable!("the soak's programs issue no collectives"),
                };
                let failed = self.alloc_fails(&self.ts[out]);
                self.reference.step(s, &mut |_| failed.clone());
            }
            match steps.get(i) {
                Some(&Step::Read { t }) => self.read(t, "a read in the program"),
                Some(&Step::Recreate { t }) => {
                    let (tensor, failed) = self.create(t);
                    self.ts[t] = tensor;
                    self.reference.step(&Step::Recreate { t }, &mut |_| failed.clone());
                }
                _ => {}
            }
            i += 1;
        }
    }

    /// Wait for everything; the VM's failure log must count exactly the instructions that
    /// failed themselves since the last check.
    fn check_failures(&mut self, what: &str) {
        let want = self.reference.take_failures();
        match self.vm.sync() {
            Ok(()) => assert_eq!(want, 0, "{what}: sync reports no failure, the reference {want}"),
            Err(Error::Failed { count, first }) => {
                assert_eq!(count, want, "{what}: failures counted");
                assert!(common::Origin::of(&first).is_some(), "{what}: an unexpected failure: {first}");
            }
            Err(e) => panic!("{what}: sync: {e}"),
        }
    }
}

/// `count` random program steps over the soak's tensors: mostly calls and copies, about
/// 0.2 % host reads and 1 % re-created tensors, and about 1 % of the steps a `fail` or
/// `panic` kernel (tagged with a unique number, which its error repeats).
fn soak_program(rng: &mut SoakRng, count: usize, tag: &mut u32) -> Vec<common::Step> {
    let mut steps = Vec::with_capacity(count);
    while steps.len() < count {
        let raw: common::Raw = (0..count - steps.len())
            .map(|_| {
                let r = rng.next();
                let kind = match r % 1000 {
                    0..=1 => 10,  // read
                    2..=11 => 11, // re-create
                    _ => (r >> 10) % 10,
                } as u8;
                let b = (r >> 20).to_le_bytes();
                (kind, b[0], b[1], b[2], b[3], b[4] as i8)
            })
            .collect();
        for mut s in common::decode(SOAK_TENSORS, &raw).steps {
            if let common::Step::Unary { op, factor, .. } = &mut s {
                let r = rng.next();
                if r % 20 == 0 {
                    *tag += 1;
                    *op = if r & (1 << 8) == 0 { "fail" } else { "panic" };
                    *factor = *tag as f32;
                }
            }
            steps.push(s);
        }
    }
    steps
}

/// The fault-injection soak (issue 19): `soak_steps()` instructions over `cpu:0` and two
/// mock devices, about 1 % of kernels failing or panicking and about one tensor in 64
/// unable to get storage. The VM survives; every read (random ones, and every tensor at
/// each tenth of the run) gives what a sequential reference of the same program gives,
/// value or failure, the failure named by its origin; `sync` counts exactly the
/// instructions that failed; and resident memory stays flat. Run alone in a child process,
/// so that the resident memory it measures is its own.
#[test]
fn soak_with_failing_kernels_panics_and_allocations() {
    if !common::alone(module_path!(), "soak_with_failing_kernels_panics_and_allocations", &[]) {
        return;
    }
    quiet_expected_panics();
    let total = soak_steps();
    let mut c = Config::default().with_mock_devices(2, MockConfig::default());
    c.fault.fail_alloc_one_in = SOAK_ALLOC_ONE_IN;
    c.fault.fail_alloc_seed = 0x50A4_0019;
    // Memory held by instructions in flight is bounded by the water marks; the allocator
    // keeps the pages of its peak, so low marks make the resident set reach its plateau in
    // the first tenth, and what it measures is what is kept, not how far the caller ran ahead.
    (c.high_water, c.low_water) = (1 << 12, 1 << 10);
    let vm = VirtualMachine::new(c).unwrap();
    let mut soak = Soak::new(&vm);
    let mut rng = SoakRng(0x19);
    let mut tag = 0;
    let mut rss = Vec::new();
    let t0 = Instant::now();
    for tenth in 1..=10 {
        // Generated a chunk at a time, so that the test's own memory does not grow with the
        // run's length.
        let mut left = total * tenth / 10 - total * (tenth - 1) / 10;
        while left > 0 {
            let steps = soak_program(&mut rng, left.min(4096), &mut tag);
            soak.run(&steps);
            left -= steps.len();
        }
        let what = format!("after tenth {tenth}");
        soak.check_failures(&what);
        for t in 0..SOAK_TENSORS {
            soak.read(t, &what);
        }
        soak.check_failures(&what);
        rss.push(rss_kib());
    }
    let (first, last) = (rss[0], rss[9]);
    println!(
        "soak: {total} steps, {tag} failing or panicking kernels, in {:.1?}; resident KiB at each tenth: {rss:?}",
        t0.elapsed()
    );
    assert!(tag as usize >= total / 200, "only {tag} failing kernels in {total} steps");
    assert!(
        last <= first + SOAK_RSS_GROWTH_KIB,
        "resident memory grew from {first} KiB to {last} KiB over the soak (bound {SOAK_RSS_GROWTH_KIB} KiB)"
    );
    // The VM still runs work, on every device.
    for t in 0..SOAK_TENSORS {
        let device = common::device_of(t);
        let fresh = vm.from_slice(&[3.0f32, -3.0], &[2], device).unwrap();
        let s = vm.compute_stream(device).unwrap();
        let r = vm.run(|b| b.call(vm.op("relu").unwrap(), &[&fresh], Attrs::default(), s));
        assert!(r.is_ok());
    }
}

/// Every distinct span opened in this process, as `name{field=value ...}`: a subscriber of
/// the smallest kind, installed process-wide because the VM's spans open on its own threads
/// (so the test that installs it runs alone in a child process). Numbers are kept only for
/// the water marks (the rest show their names), so the set stays small.
mod spans {
    use std::collections::BTreeSet;
    use std::fmt::Write as _;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::{Mutex, Once};

    use tracing::field::{Field, Visit};
    use tracing::span::{Attributes, Id, Record};
    use tracing::{Event, Metadata, Subscriber};

    static SEEN: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());

    struct Fields(String);

    impl Visit for Fields {
        fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
            let _ = write!(self.0, " {}={:?}", field.name(), value);
        }
        fn record_u64(&mut self, field: &Field, value: u64) {
            match field.name() {
                "high_water" | "low_water" => self.record_debug(field, &value),
                name => {
                    let _ = write!(self.0, " {name}=");
                }
            }
        }
        fn record_i64(&mut self, field: &Field, value: i64) {
            self.record_u64(field, value.unsigned_abs());
        }
    }

    struct Spans {
        next: AtomicU64,
    }

    impl Subscriber for Spans {
        fn enabled(&self, _: &Metadata<'_>) -> bool {
            true
        }
        fn new_span(&self, span: &Attributes<'_>) -> Id {
            let mut f = Fields(format!("{}{{", span.metadata().name()));
            span.record(&mut f);
            f.0.push('}');
            SEEN.lock().unwrap().insert(f.0);
            Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed))
        }
        fn record(&self, _: &Id, _: &Record<'_>) {}
        fn record_follows_from(&self, _: &Id, _: &Id) {}
        fn event(&self, _: &Event<'_>) {}
        fn enter(&self, _: &Id) {}
        fn exit(&self, _: &Id) {}
    }

    /// Install the recorder (once per process).
    pub fn record() {
        static ONCE: Once = Once::new();
        ONCE.call_once(|| {
            tracing::subscriber::set_global_default(Spans { next: AtomicU64::new(1) })
                .expect("no other subscriber in this process");
        });
    }

    /// Whether a span whose text starts with `name{` and contains each of `fields` was opened.
    pub fn seen(name: &str, fields: &[&str]) -> bool {
        let head = format!("{name}{{");
        SEEN.lock().unwrap().iter().any(|s| s.starts_with(&head) && fields.iter().all(|f| s.contains(f)))
    }
}

#[test]
fn a_run_opens_batch_sync_barrier_wait_back_pressure_and_shutdown_spans() {
    if !common::alone(
        module_path!(),
        "a_run_opens_batch_sync_barrier_wait_back_pressure_and_shutdown_spans",
        &[],
    ) {
        return;
    }
    spans::record();
    let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
    // Water marks no other test uses, so that the back-pressure span found is this VM's.
    c.high_water = 37;
    c.low_water = 5;
    c.batch_size = 4;
    let vm = VirtualMachine::new(c).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let relu = vm.op("relu").unwrap();
    let x = vm.from_slice(&[1.0f32, -1.0], &[2], DeviceId::mock(0)).unwrap();
    let y = vm.empty(&[2], DType::F32, DeviceId::mock(0)).unwrap();
    vm.run(|b| {
        for _ in 0..400 {
            b.call_into(relu, &[&x], &[&y], Attrs::default(), g).unwrap();
        }
    });
    vm.sync().unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
    drop(vm);
    assert!(spans::seen("start", &[]));
    assert!(spans::seen("batch", &["worker=", "stream=\"mock:0:compute\"", "n="]));
    assert!(spans::seen("sync", &["in_flight="]));
    assert!(spans::seen("barrier", &["program="]));
    assert!(spans::seen("host_wait", &["wait_only=false"]));
    assert!(spans::seen("back_pressure", &["high_water=37", "low_water=5"]));
    assert!(spans::seen("stop_workers", &[]));
    assert!(spans::seen("shutdown", &[]));
}
