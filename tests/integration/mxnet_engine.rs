//! MXNet's engine tests, ported: random workloads of reads and writes over variables,
//! checked against the same workloads evaluated one by one.
//!
//! Ported from MXNet's `tests/cpp/engine/threaded_engine_test.cc`, as crossbeam ports Go's
//! channel tests. There, `RandSumExpr` generates random workloads over a set of variables,
//! each reading some variables and writing others; pushes them to each engine
//! (`NaiveEngine`, `ThreadedEngine`, `ThreadedEnginePerDevice`) with the variables read as
//! `const_vars` and those written as `mutable_vars`; waits for all; and compares every
//! variable with the workloads evaluated in order, for several seeds. Its basic test waits
//! for one variable (`WaitForVar`) and for everything (`WaitForAll`) between pushes.
//!
//! Here a variable is a small `f32` tensor on `cpu:0`, `mock:0` or `mock:1`, the engines are
//! the VM's thread topologies and its synchronous mode (`NaiveEngine`'s counterpart), and a
//! workload is a few built-in ops: its reads (copied onto its device where they live on
//! another) are added up, and each variable it writes gets a multiple of that sum plus one,
//! each op on a stream of the device chosen at random, so that the workloads cross streams
//! and devices. A wait for one variable (`Tensor::wait`, then its value) comes every few
//! workloads, and a wait for everything (`vm.sync`) at the end; every value must equal the
//! sequential evaluation's bit for bit. The last test plants a bug (the VM skips its
//! device-side waits) and checks that these workloads catch it.

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::vm::ThreadTopology;

/// Variables, as MXNet's test has a fixed set of them.
const VARS: usize = 30;
/// Elements per variable.
const WIDTH: usize = 4;
/// The devices the variables live on, variable `v` on `DEVICES[v % 3]`.
const DEVICES: [DeviceId; 3] = [DeviceId::CPU, DeviceId::mock(0), DeviceId::mock(1)];

/// The splitmix64 generator: every run of a seed makes the same workloads.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

/// One workload: the variables it reads and the ones it writes (disjoint, as MXNet requires
/// of `const_vars` and `mutable_vars`), all written ones on one device; and a random choice
/// of stream for each of its ops.
#[derive(Debug, Clone)]
struct Workload {
    reads: Vec<usize>,
    writes: Vec<usize>,
    streams: Vec<usize>,
}

/// `n` random workloads: 1–4 variables read, 1–2 written on one device.
fn generate(n: usize, rng: &mut Rng) -> Vec<Workload> {
    (0..n)
        .map(|_| {
            let device = rng.below(DEVICES.len());
            let mut writes = Vec::new();
            for _ in 0..1 + rng.below(2) {
                let w = device + DEVICES.len() * rng.below(VARS / DEVICES.len());
                if !writes.contains(&w) {
                    writes.push(w);
                }
            }
            let mut reads = Vec::new();
            while reads.len() < 1 + rng.below(4) {
                let r = rng.below(VARS);
                if !writes.contains(&r) && !reads.contains(&r) {
                    reads.push(r);
                }
            }
            let streams = (0..16).map(|_| rng.below(64)).collect();
            Workload { reads, writes, streams }
        })
        .collect()
}

/// The multiple of the sum that the `j`-th variable written gets: below one over the number
/// read, so that values stay bounded over thousands of workloads.
fn factor(reads: usize, j: usize) -> f64 {
    0.5 / reads as f64 * (j + 1) as f64
}

/// The sequential evaluation of `w` on `data` (MXNet's `EvaluateWorkload`), in the VM's
/// arithmetic: `add` adds elementwise in `f32`, `scale` multiplies by the scalar as `f32`.
fn evaluate(w: &Workload, data: &mut [[f32; WIDTH]]) {
    let mut sum = data[w.reads[0]];
    for &r in &w.reads[1..] {
        for (s, x) in sum.iter_mut().zip(data[r]) {
            *s += x;
        }
    }
    for (j, &v) in w.writes.iter().enumerate() {
        let f = factor(w.reads.len(), j) as f32;
        for (d, s) in data[v].iter_mut().zip(sum) {
            *d = s * f + 1.0;
        }
    }
}

/// The initial value of variable `v`.
fn initial(v: usize) -> [f32; WIDTH] {
    std::array::from_fn(|i| (v * WIDTH + i) as f32 / 8.0 - 3.0)
}

/// The VM's side of the port: the variables, a tensor of ones per device, and each device's
/// streams.
struct OnVm<'a> {
    vm: &'a VirtualMachine,
    vars: Vec<Tensor>,
    ones: Vec<Tensor>,
    streams: Vec<Vec<StreamId>>,
    ops: [Op; 3],
}

impl<'a> OnVm<'a> {
    fn new(vm: &'a VirtualMachine) -> Result<OnVm<'a>> {
        let vars =
            (0..VARS).map(|v| vm.from_slice(&initial(v), &[WIDTH], DEVICES[v % 3])).collect::<Result<_>>()?;
        let ones =
            DEVICES.iter().map(|&d| vm.from_slice(&[1.0f32; WIDTH], &[WIDTH], d)).collect::<Result<_>>()?;
        let streams = DEVICES
            .iter()
            .map(|&d| match d.is_host() {
                true => Ok(vec![vm.compute_stream(d)?]),
                false => StreamType::DEVICE.iter().map(|&ty| vm.stream(d, ty)).collect(),
            })
            .collect::<Result<_>>()?;
        let ops = [vm.op("add")?, vm.op("scale")?, vm.op("copy")?];
        Ok(OnVm { vm, vars, ones, streams, ops })
    }

    /// Push `w`: its reads onto its device, their sum, and each write (MXNet's `PushSync`
    /// with the reads as `const_vars` and the writes as `mutable_vars`).
    fn push(&self, b: &mut InstructionsBuilder<'_>, w: &Workload) -> Result<()> {
        let [add, scale, copy] = self.ops;
        let d = w.writes[0] % DEVICES.len();
        let mut pick = w.streams.iter().copied().cycle();
        let mut on_d = || self.streams[d][pick.next().unwrap_or(0) % self.streams[d].len()];
        let mut local = Vec::new();
        for &r in &w.reads {
            let from = r % DEVICES.len();
            if from == d {
                local.push(self.vars[r].clone());
                continue;
            }
            // A copy runs on a stream of either end.
            let there = self.vm.empty(&[WIDTH], DType::F32, DEVICES[d])?;
            let s = match w.streams[r % w.streams.len()] % 2 {
                0 => self.streams[from][w.streams[1] % self.streams[from].len()],
                _ => on_d(),
            };
            b.call_into(copy, &[&self.vars[r]], &[&there], Attrs::default(), s)?;
            local.push(there);
        }
        let mut sum = local[0].clone();
        for x in &local[1..] {
            sum = b.call(add, &[&sum, x], Attrs::default(), on_d())?;
        }
        for (j, &v) in w.writes.iter().enumerate() {
            let part = b.call(scale, &[&sum], Attrs::scalar(factor(w.reads.len(), j)), on_d())?;
            b.call_into(add, &[&part, &self.ones[d]], &[&self.vars[v]], Attrs::default(), on_d())?;
        }
        Ok(())
    }
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// MXNet's `RandSumExpr` on `vm` with `seed`: `n` workloads pushed in batches of a few, a
/// wait for one variable every few batches, a wait for everything at the end; `Err` names
/// the first variable whose value differs from the sequential evaluation's.
fn rand_sum_expr(vm: &VirtualMachine, seed: u64, n: usize) -> std::result::Result<(), String> {
    let mut rng = Rng(seed);
    let workloads = generate(n, &mut rng);
    let engine = OnVm::new(vm).map_err(|e| e.to_string())?;
    let mut truth: Vec<[f32; WIDTH]> = (0..VARS).map(initial).collect();
    let check = |v: usize, truth: &[[f32; WIDTH]], at: usize| -> std::result::Result<(), String> {
        let got = engine.vars[v].to_vec::<f32>().map_err(|e| e.to_string())?;
        match bits(&got) == bits(&truth[v]) {
            true => Ok(()),
            false => {
                Err(format!("seed {seed}: variable {v} after {at} workloads is {got:?}, not {:?}", truth[v]))
            }
        }
    };
    let mut pushed = 0;
    for (k, chunk) in workloads.chunks(1 + rng.below(8)).enumerate() {
        vm.run(|b| chunk.iter().try_for_each(|w| engine.push(b, w))).map_err(|e| e.to_string())?;
        for w in chunk {
            evaluate(w, &mut truth);
        }
        pushed += chunk.len();
        if k % 4 == 3 {
            // `WaitForVar`: once it returns, every write of the variable pushed so far is done.
            let v = rng.below(VARS);
            engine.vars[v].wait().map_err(|e| e.to_string())?;
            check(v, &truth, pushed)?;
        }
    }
    // `WaitForAll`: nothing is left in flight, and every variable holds its last value.
    vm.sync().map_err(|e| e.to_string())?;
    // The count drains: the scheduler counts retirements after it handles completions,
    // which may be just after the barrier's callback let `sync` return.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while vm.in_flight() != 0 {
        if std::time::Instant::now() > deadline {
            return Err(format!("seed {seed}: {} instructions in flight 10 s after sync", vm.in_flight()));
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    (0..VARS).try_for_each(|v| check(v, &truth, n))
}

fn vm_with(threads: ThreadTopology, synchronous: bool, mock: MockConfig) -> VirtualMachine {
    let mut c = Config::default().with_mock_devices(2, mock);
    c.threads = threads;
    c.synchronous = synchronous;
    VirtualMachine::new(c).expect("the VM starts")
}

/// Each engine of the port, with MXNet's number of repetitions (five seeds).
fn rand_sum_expr_on(threads: ThreadTopology, synchronous: bool) {
    let vm = vm_with(threads, synchronous, MockConfig::jittery());
    for seed in 0..5 {
        rand_sum_expr(&vm, seed, 1500).unwrap_or_else(|e| panic!("{e}"));
    }
}

#[test]
fn rand_sum_expr_with_a_worker_per_stream() {
    rand_sum_expr_on(ThreadTopology::PerStream, false);
}

#[test]
fn rand_sum_expr_with_a_worker_per_device() {
    rand_sum_expr_on(ThreadTopology::PerDevice, false);
}

#[test]
fn rand_sum_expr_with_a_single_worker() {
    rand_sum_expr_on(ThreadTopology::Single, false);
}

#[test]
fn rand_sum_expr_in_synchronous_mode() {
    rand_sum_expr_on(ThreadTopology::PerStream, true);
}

#[test]
fn the_sequential_evaluation_is_what_the_ops_compute() {
    // One workload by hand: reads 1 and 2, writes 0 and 3.
    let w = Workload { reads: vec![1, 2], writes: vec![0, 3], streams: vec![0] };
    let mut data: Vec<[f32; WIDTH]> = vec![[0.0; WIDTH], [1.0, 2.0, 3.0, 4.0], [10.0; WIDTH], [0.0; WIDTH]];
    evaluate(&w, &mut data);
    assert_eq!(data[0], [3.75, 4.0, 4.25, 4.5]); // (11, 12, 13, 14) × 0.25 + 1
    assert_eq!(data[3], [6.5, 7.0, 7.5, 8.0]); // × 0.5 + 1
}

#[test]
fn skipping_device_side_waits_is_caught() {
    // The planted bug of `planted_bug.rs`: every `StreamWaitEvent` returns without waiting.
    // Slow launches make a read that overtakes its write likely.
    let mock = MockConfig { launch_delay: Duration::from_micros(100), ..MockConfig::jittery() };
    let mut c = Config::default().with_mock_devices(2, mock);
    c.fault.skip_stream_wait_every = 1;
    let bad = VirtualMachine::new(c).expect("the VM starts");
    let caught = (0..10).filter(|&seed| rand_sum_expr(&bad, seed, 300).is_err()).count();
    eprintln!("caught on {caught} of 10 seeds");
    assert!(caught >= 3, "{caught} of ten seeds gave a wrong value on a VM that skips its device-side waits");
}
