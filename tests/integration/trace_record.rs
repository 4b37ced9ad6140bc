//! Record → replay: programs built directly with `InstructionsBuilder`, recorded while they
//! run, replay with the same results (every host read bit for bit, every final checksum),
//! as recorded and with the synchronisation derived again on another device layout.

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::trace::{self, DeviceMap, Recorder, ReplayOptions};
use eagervm::vm::ThreadTopology;
use proptest::prelude::*;

use crate::common::{self, decode, execute, vm, Raw};

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("eagervm-trace-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn fast_mock() -> MockConfig {
    MockConfig { launch_delay: std::time::Duration::ZERO, ..MockConfig::default() }
}

fn bits(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| {
            let v = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            if v.is_nan() {
                u32::MAX
            } else {
                v.to_bits()
            }
        })
        .collect()
}

/// Record `raw`'s program, then replay its trace in every mode; all reads must match.
fn record_replay(name: &str, raw: &Raw) {
    record_replay_on(name, raw, common::Mix::CPU_MOCK)
}

fn record_replay_on(name: &str, raw: &Raw, mix: common::Mix) {
    // Two tensors on each device at least, which a collective step needs.
    let p = common::decode_on(mix, if mix.collectives { 8 } else { 5 }, raw);
    let path = temp(name);
    let vm = vm(fast_mock(), ThreadTopology::PerStream, false);
    if mix.collectives {
        // Made before recording starts, so that the trace declares them.
        for k in 0..common::COMMS.len() {
            common::communicator(&vm, k).expect("communicator");
        }
    }
    let rec = Recorder::start(&vm, &path).expect("start");
    let outcome = execute(&vm, &p).expect("program runs");
    let summary = rec.finish(&vm, &[], None).expect("finish");
    assert!(summary.failure.is_none());
    let trace = trace::load(&path).expect("the recorded trace parses");
    trace::validate(&trace, &Default::default()).expect("the recorded trace is valid, syncs included");
    let modes = [(false, DeviceMap::AsRecorded), (true, DeviceMap::AsRecorded), (true, DeviceMap::Cpu)];
    // A mock communicator needs its members on distinct devices: not all on the CPU.
    let modes = if mix.collectives { &modes[..2] } else { &modes[..] };
    for &(resync, device) in modes {
        let config = Config { mock: fast_mock(), ..Config::default() };
        let opts = ReplayOptions { resync, device, config, ..Default::default() };
        let report =
            trace::replay(&trace, &opts).unwrap_or_else(|e| panic!("replay {resync} {device:?}: {e}"));
        let reads: Vec<Vec<u32>> =
            report.reads.iter().map(|r| bits(r.result.as_ref().expect("no failures"))).collect();
        assert_eq!(reads, outcome, "replay (resync {resync}, {device:?}) of {p:?}");
    }
}

#[test]
fn collectives_are_declared_recorded_and_replayed() {
    // Every step a collective (kind 12 or 13 of 14), over both communicators.
    let raw: Raw =
        (0..24u8).map(|i| (12 + (i % 2) + 14 * (i % 5), i, i.wrapping_mul(3), i ^ 5, i, i as i8)).collect();
    record_replay_on("all-collectives.trace", &raw, common::Mix::COLLECTIVES);
    let text = std::fs::read_to_string(temp("all-collectives.trace")).unwrap();
    assert!(text.contains("comm pair mock mock:0,mock:1\n"), "{text}");
    assert!(text.contains("comm trio mock cpu:0,mock:1,mock:0\n"), "{text}");
    assert!(text.contains("@pair in=") && text.contains("@trio in="), "{text}");
    assert!(text.contains("stream s") && text.contains("cpu:0 collective"), "{text}");
}

proptest! {
    #![proptest_config(common::proptest_config(24))]
    #[test]
    fn random_programs_replay_to_the_same_reads(raw in prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..40)) {
        record_replay("random.trace", &raw);
    }

    #[test]
    fn random_programs_with_collectives_replay_to_the_same_reads(raw in prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..40)) {
        record_replay_on("collectives.trace", &raw, common::Mix::COLLECTIVES);
    }
}

#[test]
fn expectations_are_written_and_checked() {
    let path = temp("expect.trace");
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, fast_mock())).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let big: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let x = vm.from_slice(&big, &[10, 100], DeviceId::mock(0)).unwrap();
    let w = vm.from_slice(&vec![0.25f32; 100 * 3], &[100, 3], DeviceId::mock(0)).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let y = vm
        .run(|b| {
            let m = b.call(vm.op("matmul")?, &[&x, &w], Attrs::default(), g)?;
            b.call(vm.op("relu")?, &[&m], Attrs::default(), g)
        })
        .unwrap();
    let want = y.to_vec::<f32>().unwrap();
    let summary = rec.finish(&vm, &[&y], None).unwrap();
    assert_eq!(summary.expects, 1);
    assert!(summary.sidecar.is_some(), "1000 floats go to the sidecar");
    let trace = trace::load(&path).unwrap();
    let report = trace::replay(&trace, &ReplayOptions::default()).unwrap();
    assert_eq!(report.checked, 1);
    assert_eq!(
        bits(report.reads[0].result.as_ref().unwrap()),
        bits(&want.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<_>>())
    );

    // A changed checksum is a mismatch naming the line.
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().position(|l| l.starts_with("expect t")).unwrap() + 1;
    let bad: String = text
        .lines()
        .map(|l| {
            if !l.starts_with("expect t") {
                return format!("{l}\n");
            }
            let flipped = if l.ends_with('0') { '1' } else { '0' };
            format!("{}{flipped}\n", &l[..l.len() - 1])
        })
        .collect();
    let bad_path = temp("expect-bad.trace");
    std::fs::write(&bad_path, &bad).unwrap();
    std::fs::copy(summary.sidecar.as_ref().unwrap(), temp("expect-bad.trace.bin")).unwrap();
    let bad_trace = trace::load(&bad_path).unwrap();
    let e = trace::replay(&bad_trace, &ReplayOptions::default()).unwrap_err();
    assert!(matches!(e, trace::TraceError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains(&format!(":{line}:")), "{e}");
}

#[test]
fn a_deliberate_failure_is_recorded_and_expected() {
    let path = temp("failure.trace");
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let f = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let r = vm
        .run(|b| {
            b.call_into(vm.op("fail")?, &[], &[&f], Attrs::scalar(7.0), cpu)?;
            b.call(vm.op("relu")?, &[&f], Attrs::default(), cpu)
        })
        .unwrap();
    let err = r.to_vec::<f32>().unwrap_err();
    let summary = rec.finish(&vm, &[], Some(&err)).unwrap();
    assert!(summary.failure.as_deref().is_some_and(|f| f.contains("fail")), "{summary:?}");
    let trace = trace::load(&path).unwrap();
    let report = trace::replay(&trace, &ReplayOptions::default()).expect("the failure is expected");
    assert!(report.expected_failure.is_some());
    assert!(!report.failures.is_empty());

    // Without its `expect error` line the same trace fails the replay, naming a line.
    let text = std::fs::read_to_string(&path).unwrap();
    let stripped: String =
        text.lines().filter(|l| !l.starts_with("expect error")).map(|l| format!("{l}\n")).collect();
    let p2 = temp("failure-unexpected.trace");
    std::fs::write(&p2, stripped).unwrap();
    let e = trace::replay(&trace::load(&p2).unwrap(), &ReplayOptions::default()).unwrap_err();
    assert!(matches!(e, trace::TraceError::Vm { .. }), "{e}");
}

#[test]
fn cuda_is_a_typed_unavailable_error() {
    let (t, d) = trace::parse_str(
        "x.trace",
        "eagervm-trace 1\ndevice cpu:0\ndevice cuda:0\nstream s0 cpu:0 compute\nstream s1 cuda:0 compute\n",
    );
    assert!(d.is_empty(), "{d:?}");
    let opts = ReplayOptions { resync: true, device: DeviceMap::Cuda, ..Default::default() };
    if eagervm::ep::cuda::available(0).is_ok() {
        // With a GPU, the trace replays on it as recorded, and mapped onto it.
        trace::replay(&t, &ReplayOptions::default()).expect("replays on cuda:0");
        trace::replay(&t, &opts).expect("replays mapped onto cuda:0");
    } else {
        let e = trace::replay(&t, &ReplayOptions::default()).unwrap_err();
        assert!(matches!(e, trace::TraceError::DeviceUnavailable { .. }), "{e}");
        assert!(matches!(trace::replay(&t, &opts).unwrap_err(), trace::TraceError::DeviceUnavailable { .. }));
    }
    let opts = ReplayOptions { resync: true, device: DeviceMap::Mock, ..Default::default() };
    trace::replay(&t, &opts).expect("cuda maps onto mock with --resync");
    let opts = ReplayOptions { resync: false, device: DeviceMap::Mock, ..Default::default() };
    assert!(
        matches!(trace::replay(&t, &opts).unwrap_err(), trace::TraceError::Invalid { .. }),
        "layout change needs resync"
    );
}

#[test]
fn i64_data_and_panics_round_trip() {
    let path = temp("i64-panic.trace");
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[i64::MIN, -1, 0, 7, i64::MAX], &[5], DeviceId::CPU).unwrap();
    let (y, p) = vm
        .run(|b| -> eagervm::Result<_> {
            let y = b.call(vm.op("scale")?, &[&x], Attrs::scalar(-3.0), cpu)?;
            let p = vm.empty(&[1], DType::I64, DeviceId::CPU)?;
            b.call_into(vm.op("panic")?, &[&y], &[&p], Attrs::default(), cpu)?;
            Ok((y, p))
        })
        .unwrap();
    let want = y.to_vec::<i64>().unwrap();
    let summary = rec.finish(&vm, &[&y, &p], None).unwrap();
    assert_eq!(summary.expects, 1, "the panicked output has no checksum");
    assert!(summary.failure.as_deref().is_some_and(|f| f.starts_with("panic")), "{summary:?}");
    let t = trace::load(&path).unwrap();
    assert!(t.to_text().contains("i64 -9223372036854775808 -1 0 7 9223372036854775807"));
    let r = trace::replay(&t, &ReplayOptions::default()).expect("the panic is expected");
    assert_eq!(r.checked, 1);
    assert!(r.expected_failure.as_deref().is_some_and(|f| f.starts_with("panic")));
    assert_eq!(want, vec![i64::MIN.wrapping_mul(-3), 3, 0, -21, i64::MAX.wrapping_mul(-3)]);
}

/// Check a recording of concurrent builders: it validates as recorded (no `--resync`), and
/// a replay as recorded reproduces every output's checksum.
fn replays_as_recorded(path: &std::path::Path, outputs: usize) -> String {
    let text = std::fs::read_to_string(path).expect("the trace was written");
    let t = trace::load(path).expect("the recorded trace parses");
    trace::validate(&t, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let opts =
        ReplayOptions { config: Config { mock: fast_mock(), ..Config::default() }, ..Default::default() };
    let r = trace::replay(&t, &opts).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(r.checked, outputs, "{text}");
    text
}

#[test]
fn a_nested_run_replays_as_recorded() {
    let path = temp("nested.trace");
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, fast_mock())).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let (m, cpu) = (DeviceId::mock(0), DeviceId::CPU);
    let (g, d2h, host) = (
        vm.compute_stream(m).unwrap(),
        vm.stream(m, StreamType::D2H).unwrap(),
        vm.compute_stream(cpu).unwrap(),
    );
    let (relu, scale, copy) = (vm.op("relu").unwrap(), vm.op("scale").unwrap(), vm.op("copy").unwrap());
    // `x` is last used on mock:0's H2D stream (its upload).
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[4], m).unwrap();
    let w = vm.from_slice(&[0.5f32; 4], &[4], m).unwrap();
    let outs = vm
        .run(|b1| -> eagervm::Result<Vec<Tensor>> {
            // The outer builder uses `x` on mock:0's compute stream and writes `w` there;
            // neither reaches the VM before the inner builders' batches.
            let y = b1.call(relu, &[&x], Attrs::default(), g)?;
            b1.call_into(scale, &[&x], &[&w], Attrs::scalar(3.0), g)?;
            // The inner builders read `x` and `w` on other streams of the device and on the
            // host: their soft sync was made for `x` last used on the compute stream.
            let (h, v) = vm.run(|b2| -> eagervm::Result<_> {
                let h = b2.call(copy, &[&x], Attrs::default(), d2h)?;
                let v = vm.empty(&[4], DType::F32, cpu)?;
                b2.call_into(copy, &[&w], &[&v], Attrs::default(), host)?;
                Ok((h, v))
            })?;
            let k = vm.run(|b3| b3.call(scale, &[&x], Attrs::scalar(-1.0), g))?;
            Ok(vec![y, h, v, k])
        })
        .unwrap();
    let want: Vec<Vec<f32>> = outs.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    // The inner builders ran first: `v` holds `w` from before the outer builder's write.
    assert_eq!(want[2], vec![0.5; 4]);
    assert_eq!(want[1], vec![1.0, -2.0, 3.0, -4.0]);
    rec.finish(&vm, &outs.iter().collect::<Vec<_>>(), None).unwrap();
    let text = replays_as_recorded(&path, outs.len());
    assert!(text.lines().any(|l| l.starts_with("after ")), "{text}");
}

#[test]
fn threads_sharing_a_tensor_across_streams_replay_as_recorded() {
    use std::sync::mpsc::channel;
    let path = temp("threads.trace");
    let vm = VirtualMachine::new(Config::default().with_mock_devices(2, fast_mock())).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let (m0, m1, cpu) = (DeviceId::mock(0), DeviceId::mock(1), DeviceId::CPU);
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[4], m0).unwrap();
    let z = vm.from_slice(&[2.0f32; 4], &[4], cpu).unwrap();
    let (scale, copy, add) = (vm.op("scale").unwrap(), vm.op("copy").unwrap(), vm.op("add").unwrap());
    // Three threads share `x` (on mock:0) and `z` (on the host). Each builds while the
    // others' builders are open, and they submit in another order than they built: A
    // builds first and submits last; B (mock:1) and C (the host) build and submit between.
    let (a_built, a_wait) = channel::<()>();
    let (b_done, b_wait) = channel::<()>();
    let (c_done, c_wait) = channel::<()>();
    let outs = std::thread::scope(|s| {
        let (vm, x, z) = (&vm, &x, &z);
        let a = s.spawn(move || {
            let g0 = vm.compute_stream(m0).unwrap();
            vm.run(|b| -> eagervm::Result<Vec<Tensor>> {
                let y = b.call(scale, &[x], Attrs::scalar(2.0), g0)?;
                let zz = vm.empty(&[4], DType::F32, m0)?;
                b.call_into(copy, &[z], &[&zz], Attrs::default(), vm.stream(m0, StreamType::H2D)?)?;
                b.call_into(scale, &[&y], &[x], Attrs::scalar(0.5), g0)?;
                a_built.send(()).unwrap();
                c_wait.recv().unwrap();
                Ok(vec![y, zz])
            })
        });
        let b = s.spawn(move || {
            a_wait.recv().unwrap();
            let g1 = vm.compute_stream(m1).unwrap();
            let r = vm.run(|b| -> eagervm::Result<Vec<Tensor>> {
                let x1 = vm.empty(&[4], DType::F32, m1)?;
                b.call_into(copy, &[x], &[&x1], Attrs::default(), vm.stream(m1, StreamType::H2D)?)?;
                let s1 = b.call(add, &[&x1, &x1], Attrs::default(), g1)?;
                Ok(vec![x1, s1])
            });
            b_done.send(()).unwrap();
            r
        });
        let c = s.spawn(move || {
            b_wait.recv().unwrap();
            let host = vm.compute_stream(cpu).unwrap();
            let r = vm.run(|b| -> eagervm::Result<Vec<Tensor>> {
                let xh = vm.empty(&[4], DType::F32, cpu)?;
                b.call_into(copy, &[x], &[&xh], Attrs::default(), host)?;
                let sum = b.call(add, &[&xh, &xh], Attrs::default(), host)?;
                b.call_into(scale, &[&xh], &[z], Attrs::scalar(4.0), host)?;
                Ok(vec![xh, sum])
            });
            c_done.send(()).unwrap();
            r
        });
        let mut outs = a.join().unwrap().unwrap();
        outs.extend(b.join().unwrap().unwrap());
        outs.extend(c.join().unwrap().unwrap());
        outs
    });
    let want: Vec<Vec<f32>> = outs.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    // B and C were admitted before A: they read `x` as uploaded, and A's copy of `z` reads
    // C's write.
    assert_eq!(want[2], vec![1.0, -2.0, 3.0, -4.0]);
    assert_eq!(want[4], vec![1.0, -2.0, 3.0, -4.0]);
    assert_eq!(want[1], vec![4.0, -8.0, 12.0, -16.0]);
    let mut all: Vec<&Tensor> = outs.iter().collect();
    all.extend([&x, &z]);
    rec.finish(&vm, &all, None).unwrap();
    let text = replays_as_recorded(&path, all.len());
    assert!(text.lines().any(|l| l.starts_with("after ")), "{text}");
}

/// Build step `s` of a random program with `b`.
fn build_step(
    vm: &VirtualMachine,
    b: &mut InstructionsBuilder<'_>,
    ts: &[Tensor],
    streams: &[StreamId],
    s: &common::Step,
) -> eagervm::Result<()> {
    use common::Step;
    let op = |n: &str| vm.op(n).expect("built-in");
    match *s {
        Step::Fill { out, value, stream } => {
            b.call_into(op("fill"), &[], &[&ts[out]], Attrs::scalar(value as f64), streams[stream])
        }
        Step::Unary { op: name, a, out, factor, stream } => {
            b.call_into(op(name), &[&ts[a]], &[&ts[out]], common::unary_attrs(name, factor), streams[stream])
        }
        Step::Binary { op: name, a, b: y, out, stream } => {
            b.call_into(op(name), &[&ts[a], &ts[y]], &[&ts[out]], Attrs::default(), streams[stream])
        }
        Step::Copy { src, dst, stream } => {
            b.call_into(op("copy"), &[&ts[src]], &[&ts[dst]], Attrs::default(), streams[stream])
        }
        Step::Collective { .. } => common::emit(vm, b, s, ts, streams),
        Step::Read { .. } | Step::Recreate { .. } => Ok(()),
    }
}

/// Two builders open at once on one thread: the steps marked `true` are built by inner
/// builders (`vm.run` inside the outer one's closure), each run of them by one, which
/// submits before the outer builder's batch (in part: the batches are `batch` instructions
/// long). The recording validates and replays as recorded to the same final values.
fn interleaved(raw: &Raw, inner: &[bool], batch: usize) {
    let p = decode(6, raw);
    let path = temp("interleaved.trace");
    let mut config = Config::default().with_mock_devices(2, fast_mock());
    config.batch_size = batch;
    let vm = VirtualMachine::new(config).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let streams = p.mix.stream_table(&vm).unwrap();
    let ts: Vec<Tensor> = (0..p.tensors)
        .map(|t| {
            let v: Vec<f32> = (0..4).map(|k| (t * 4 + k) as f32 * 0.25 - 2.0).collect();
            vm.from_slice(&v, &common::SHAPE, p.mix.device_of(t)).unwrap()
        })
        .collect();
    vm.run(|outer| {
        let mut i = 0;
        while i < p.steps.len() {
            if !inner.get(i).copied().unwrap_or(false) {
                build_step(&vm, outer, &ts, &streams, &p.steps[i]).unwrap();
                i += 1;
                continue;
            }
            vm.run(|b| {
                while i < p.steps.len() && inner.get(i).copied().unwrap_or(false) {
                    build_step(&vm, b, &ts, &streams, &p.steps[i]).unwrap();
                    i += 1;
                }
            });
        }
    });
    let want: Vec<Vec<f32>> = ts.iter().map(|t| t.to_vec::<f32>().unwrap()).collect();
    rec.finish(&vm, &ts.iter().collect::<Vec<_>>(), None).unwrap();
    let t = trace::load(&path).unwrap();
    let text = t.to_text();
    trace::validate(&t, &Default::default()).unwrap_or_else(|e| panic!("{e}\n{text}"));
    let opts =
        ReplayOptions { config: Config { mock: fast_mock(), ..Config::default() }, ..Default::default() };
    let r = trace::replay(&t, &opts).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(r.checked, want.len(), "{text}");
}

proptest! {
    #![proptest_config(common::proptest_config(48))]
    #[test]
    fn interleaved_builders_replay_as_recorded(
        raw in prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..32),
        inner in prop::collection::vec(any::<bool>(), 32),
        batch in 1usize..5,
    ) {
        interleaved(&raw, &inner, batch);
    }
}

#[test]
fn racing_threads_replay_as_recorded() {
    // Four threads build random programs over the same tensors at once, on every stream of
    // cpu:0, mock:0 and mock:1; whatever order their batches reach the scheduler in, the
    // trace replays as recorded to the values the VM computed.
    let path = temp("racing.trace");
    let mut config = Config::default().with_mock_devices(2, fast_mock());
    config.batch_size = 3;
    let vm = VirtualMachine::new(config).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let mut seed = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let programs: Vec<common::Program> = (0..4)
        .map(|_| {
            let raw: Raw = (0..1500)
                .map(|_| {
                    let r = next().to_le_bytes();
                    (r[0], r[1], r[2], r[3], r[4], r[5] as i8)
                })
                .collect();
            decode(6, &raw)
        })
        .collect();
    let mix = programs[0].mix;
    let streams = mix.stream_table(&vm).unwrap();
    let ts: Vec<Tensor> = (0..6)
        .map(|t| vm.from_slice(&[t as f32, 1.0, -2.0, 0.5], &common::SHAPE, mix.device_of(t)).unwrap())
        .collect();
    let start = std::sync::Barrier::new(programs.len());
    std::thread::scope(|s| {
        for p in &programs {
            let (vm, ts, streams, start) = (&vm, &ts, &streams, &start);
            s.spawn(move || {
                start.wait();
                for chunk in p.steps.chunks(5) {
                    vm.run(|b| {
                        for step in chunk {
                            build_step(vm, b, ts, streams, step).unwrap();
                            // Keep the builder open while others build and submit.
                            std::thread::yield_now();
                        }
                    });
                }
            });
        }
    });
    rec.finish(&vm, &ts.iter().collect::<Vec<_>>(), None).unwrap();
    replays_as_recorded(&path, ts.len());
}
