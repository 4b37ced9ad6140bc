//! The cost of the call path as an eager user meets it (docs/performance.md, "The call
//! path"):
//!
//! - `chain/call`: a chain of tiny adds through `call`, which makes each output (and drops
//!   the previous one, so every step also emits a `Release`), then one sync;
//! - `chain/call_into`: the same chain into two preallocated tensors, then one sync (the
//!   baseline the others are divided by);
//! - `round_trip`: issue one add, then read its result (`loss.item()`-style), the read going
//!   with the add; `round_trip/read_after`: the read made once the add is handed over;
//! - `mlp_step`: the MLP step of `run mlp` (64×8×32, 24 distinct call signatures) through
//!   `call`, with (`mlp_step/read_loss`) and without reading the loss every step.
//!
//! After criterion's groups, a summary times the chains and the round trip in interleaved
//! rounds and prints medians and ratios against `call_into` measured in the same rounds,
//! and the CPU time the process burns while the VM sits idle for a second after a round
//! trip. `cargo bench --bench call_path` runs both; `cargo bench --bench call_path --
//! --summary` only the summary.

use std::time::{Duration, Instant};

use criterion::{BatchSize, Criterion, Throughput};
use eagervm::framework::Op;
use eagervm::prelude::*;

/// Adds per chain in the criterion groups (the summary uses [`SUMMARY_CHAIN`]).
const CHAIN: usize = 10_000;
/// Adds per chain in the summary (the issue's figure: 10^5 adds, then one sync).
const SUMMARY_CHAIN: usize = 100_000;

/// What every case needs: a VM, its CPU stream and the ops.
struct Setup {
    vm: VirtualMachine,
    cpu: StreamId,
    add: Op,
}

fn setup() -> Setup {
    let vm = VirtualMachine::new(Config::default()).expect("vm");
    let cpu = vm.compute_stream(DeviceId::CPU).expect("cpu");
    let add = vm.op("add").expect("add");
    Setup { vm, cpu, add }
}

/// `n` adds `x = x + y` through `call`, then a sync. Returns the time until the caller
/// had issued them all (before the sync).
fn chain_call(s: &Setup, y: &Tensor, n: usize) -> Duration {
    let t = Instant::now();
    let mut x = y.clone();
    s.vm.run(|b| {
        for _ in 0..n {
            x = b.call(s.add, &[&x, y], Attrs::default(), s.cpu).expect("call");
        }
    });
    drop(x);
    let issued = t.elapsed();
    s.vm.sync().expect("sync");
    issued
}

/// `n` adds alternating between two preallocated tensors through `call_into`, then a sync.
/// Returns the time until the caller had issued them all.
fn chain_call_into(s: &Setup, y: &Tensor, ab: &[Tensor; 2], n: usize) -> Duration {
    let t = Instant::now();
    s.vm.run(|b| {
        for i in 0..n {
            let (src, dst) = (&ab[i & 1], &ab[(i + 1) & 1]);
            b.call_into(s.add, &[src, y], &[dst], Attrs::default(), s.cpu).expect("call_into");
        }
    });
    let issued = t.elapsed();
    s.vm.sync().expect("sync");
    issued
}

/// Issue one add and wait for its value, the read going with the add
/// (`InstructionsBuilder::to_vec`): an idle VM lets this thread run both.
fn round_trip(s: &Setup, y: &Tensor) -> f32 {
    let v = s.vm.run(|b| {
        let x = b.call(s.add, &[y, y], Attrs::default(), s.cpu)?;
        b.to_vec::<f32>(&x)
    });
    v.expect("read")[0]
}

/// [`round_trip`] with the read made after the builder is done (`Tensor::to_vec`): the add
/// is handed to the VM's threads before the read is known.
fn round_trip_read_after(s: &Setup, y: &Tensor) -> f32 {
    let x = s.vm.run(|b| b.call(s.add, &[y, y], Attrs::default(), s.cpu)).expect("call");
    x.to_vec::<f32>().expect("read")[0]
}

/// The MLP of `run mlp` at its default shapes, stepped through `call`.
struct Mlp {
    s: Setup,
    ops: [Op; 11],
    x: Tensor,
    y: Tensor,
    w: [Tensor; 4],
    inv_n: f64,
}

impl Mlp {
    fn new() -> Mlp {
        let s = setup();
        let opts = eagervm::programs::mlp::MlpOptions::default();
        let (n, d, h) = (opts.samples, opts.inputs, opts.hidden);
        let (xv, yv) = eagervm::programs::mlp::dataset(&opts);
        let (w1v, w2v) = eagervm::programs::mlp::initial_weights(&opts);
        let t = |v: &[f32], shape: &[usize]| s.vm.from_slice(v, shape, DeviceId::CPU).expect("tensor");
        let (x, y) = (t(&xv, &[n, d]), t(&yv, &[n, 1]));
        let w = [t(&w1v, &[d, h]), t(&vec![0.0; h], &[h]), t(&w2v, &[h, 1]), t(&[0.0], &[1])];
        let names = [
            "matmul",
            "add_bias",
            "relu",
            "sub",
            "mul",
            "sum",
            "scale",
            "matmul_tn",
            "sum_rows",
            "relu_grad",
            "matmul_nt",
        ];
        let ops = names.map(|o| s.vm.op(o).expect("op"));
        Mlp { s, ops, x, y, w, inv_n: 1.0 / n as f64 }
    }

    /// One step (forward, loss, backward, SGD); returns the loss tensor (on the host).
    fn step(&mut self) -> Tensor {
        let [matmul, add_bias, relu, sub, mul, sum, scale, matmul_tn, sum_rows, relu_grad, matmul_nt] =
            self.ops;
        let (cpu, none, inv_n, lr) = (self.s.cpu, Attrs::default(), self.inv_n, 0.05);
        let (x, y) = (&self.x, &self.y);
        let [w1, b1, w2, b2] = &self.w;
        let (loss, w) = self
            .s
            .vm
            .run(|b| -> Result<_> {
                let z = b.call(matmul, &[x, w1], none, cpu)?;
                let z = b.call(add_bias, &[&z, b1], none, cpu)?;
                let a = b.call(relu, &[&z], none, cpu)?;
                let p = b.call(matmul, &[&a, w2], none, cpu)?;
                let p = b.call(add_bias, &[&p, b2], none, cpu)?;
                let diff = b.call(sub, &[&p, y], none, cpu)?;
                let sq = b.call(mul, &[&diff, &diff], none, cpu)?;
                let l = b.call(sum, &[&sq], none, cpu)?;
                let loss = b.call(scale, &[&l], Attrs::scalar(inv_n), cpu)?;
                let dp = b.call(scale, &[&diff], Attrs::scalar(2.0 * inv_n), cpu)?;
                let dw2 = b.call(matmul_tn, &[&a, &dp], none, cpu)?;
                let db2 = b.call(sum_rows, &[&dp], none, cpu)?;
                let dh = b.call(matmul_nt, &[&dp, w2], none, cpu)?;
                let dz = b.call(relu_grad, &[&dh, &z], none, cpu)?;
                let dw1 = b.call(matmul_tn, &[x, &dz], none, cpu)?;
                let db1 = b.call(sum_rows, &[&dz], none, cpu)?;
                let mut sgd = |w: &Tensor, g: &Tensor| -> Result<Tensor> {
                    let g = b.call(scale, &[g], Attrs::scalar(lr), cpu)?;
                    b.call(sub, &[w, &g], none, cpu)
                };
                Ok((loss, [sgd(w1, &dw1)?, sgd(b1, &db1)?, sgd(w2, &dw2)?, sgd(b2, &db2)?]))
            })
            .expect("step");
        self.w = w;
        loss
    }
}

fn chains(c: &mut Criterion) {
    let s = setup();
    let y = s.vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).expect("y");
    let ab = [0, 1].map(|_| s.vm.from_slice(&[0.0f32], &[1], DeviceId::CPU).expect("tensor"));
    let mut g = c.benchmark_group("chain");
    g.throughput(Throughput::Elements(CHAIN as u64)).sample_size(20);
    g.bench_function("call_into", |b| b.iter(|| chain_call_into(&s, &y, &ab, CHAIN)));
    g.bench_function("call", |b| b.iter(|| chain_call(&s, &y, CHAIN)));
    g.finish();
    c.bench_function("round_trip", |b| b.iter(|| round_trip(&s, &y)));
    c.bench_function("round_trip/read_after", |b| b.iter(|| round_trip_read_after(&s, &y)));
}

fn mlp_steps(c: &mut Criterion) {
    let mut m = Mlp::new();
    let mut g = c.benchmark_group("mlp_step");
    g.bench_function("no_read", |b| {
        b.iter_batched(|| (), |()| drop(m.step()), BatchSize::SmallInput);
    });
    m.s.vm.sync().expect("sync");
    g.bench_function("read_loss", |b| b.iter(|| m.step().to_vec::<f32>().expect("loss")[0]));
    g.finish();
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}

/// CPU time (user + system) this process has used, all threads.
fn cpu_time() -> Duration {
    // SAFETY: `getrusage` writes the struct it is given, which lives on this frame.
    let ru = unsafe {
        let mut ru = std::mem::zeroed::<libc::rusage>();
        libc::getrusage(libc::RUSAGE_SELF, &mut ru);
        ru
    };
    let tv = |t: libc::timeval| Duration::new(t.tv_sec as u64, t.tv_usec as u32 * 1000);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Interleaved rounds of each case, medians, and ratios within the same rounds.
fn summary() {
    const ROUNDS: usize = 7;
    const TRIPS: usize = 2000;
    let s = setup();
    let y = s.vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).expect("y");
    let ab = [0, 1].map(|_| s.vm.from_slice(&[0.0f32], &[1], DeviceId::CPU).expect("tensor"));
    let mut m = Mlp::new();
    let (mut into, mut call, mut ratio, mut trip, mut step, mut step_read) =
        (vec![], vec![], vec![], vec![], vec![], vec![]);
    let mut trip_after = vec![];
    let (mut into_issue, mut call_issue) = (vec![], vec![]);
    let (mut into_cpu, mut call_cpu) = (vec![], vec![]);
    let cpu_per = |c: Duration, n: usize| (cpu_time() - c).as_secs_f64() * 1e9 / n as f64;
    let issue = |d: Duration| d.as_secs_f64() * 1e9 / SUMMARY_CHAIN as f64;
    let per = |t: Instant, n: usize| t.elapsed().as_secs_f64() * 1e9 / n as f64;
    for _ in 0..ROUNDS {
        let (t, c) = (Instant::now(), cpu_time());
        into_issue.push(issue(chain_call_into(&s, &y, &ab, SUMMARY_CHAIN)));
        let a = per(t, SUMMARY_CHAIN);
        into_cpu.push(cpu_per(c, SUMMARY_CHAIN));
        let (t, c) = (Instant::now(), cpu_time());
        call_issue.push(issue(chain_call(&s, &y, SUMMARY_CHAIN)));
        let b = per(t, SUMMARY_CHAIN);
        call_cpu.push(cpu_per(c, SUMMARY_CHAIN));
        into.push(a);
        call.push(b);
        ratio.push(b / a);
        let mut rts: Vec<f64> = (0..TRIPS)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(round_trip(&s, &y));
                per(t, 1)
            })
            .collect();
        trip.push(median(&mut rts));
        let mut rts: Vec<f64> = (0..TRIPS)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(round_trip_read_after(&s, &y));
                per(t, 1)
            })
            .collect();
        trip_after.push(median(&mut rts));
        let t = Instant::now();
        for _ in 0..200 {
            drop(m.step());
        }
        m.s.vm.sync().expect("sync");
        step.push(per(t, 200));
        let t = Instant::now();
        for _ in 0..200 {
            std::hint::black_box(m.step().to_vec::<f32>().expect("loss")[0]);
        }
        step_read.push(per(t, 200));
    }
    let spread = |v: &[f64]| {
        let (lo, hi) = v.iter().fold((f64::MAX, 0f64), |(l, h), &x| (l.min(x), h.max(x)));
        hi / lo
    };
    println!("call path summary: medians of {ROUNDS} interleaved rounds (max/min across rounds in brackets)");
    println!("  chain of {SUMMARY_CHAIN} adds, per op:");
    println!("    call_into  {:>8.1} ns  [{:.2}]", median(&mut into.clone()), spread(&into));
    println!("    call       {:>8.1} ns  [{:.2}]", median(&mut call.clone()), spread(&call));
    println!("    call / call_into (per round)  {:.2}  [{:.2}]", median(&mut ratio.clone()), spread(&ratio));
    println!("    CPU time of all the process's threads (user + system), per op:");
    println!("      call_into  {:>8.1} ns  [{:.2}]", median(&mut into_cpu.clone()), spread(&into_cpu));
    println!("      call       {:>8.1} ns  [{:.2}]", median(&mut call_cpu.clone()), spread(&call_cpu));
    println!("    the caller's share (issued, before the sync):");
    println!("      call_into  {:>8.1} ns  [{:.2}]", median(&mut into_issue.clone()), spread(&into_issue));
    println!("      call       {:>8.1} ns  [{:.2}]", median(&mut call_issue.clone()), spread(&call_issue));
    println!(
        "  round trip (issue one add, read it; median of {TRIPS} per round)  {:>8.1} ns  [{:.2}]",
        median(&mut trip.clone()),
        spread(&trip)
    );
    println!(
        "  the same, read after the add was handed over        {:>8.1} ns  [{:.2}]",
        median(&mut trip_after.clone()),
        spread(&trip_after)
    );
    println!("  MLP step (64x8x32, 24 signatures), per step:");
    println!("    loss not read  {:>8.1} ns  [{:.2}]", median(&mut step.clone()), spread(&step));
    println!("    loss read      {:>8.1} ns  [{:.2}]", median(&mut step_read.clone()), spread(&step_read));
    // A VM that has just answered a round trip, then sits idle: what its threads burn.
    round_trip(&s, &y);
    let (c0, t0) = (cpu_time(), Instant::now());
    std::thread::sleep(Duration::from_secs(1));
    let (cpu, wall) = (cpu_time() - c0, t0.elapsed());
    println!(
        "  idle for {:.2} s after a round trip: {:.2} ms of CPU ({:.3}% of one core)",
        wall.as_secs_f64(),
        cpu.as_secs_f64() * 1e3,
        100.0 * cpu.as_secs_f64() / wall.as_secs_f64()
    );
}

fn main() {
    // `--profile-call`: only chains through `call`, for a profiler to watch.
    if std::env::args().any(|a| a == "--profile-call") {
        let s = setup();
        let y = s.vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).expect("y");
        for _ in 0..20 {
            chain_call(&s, &y, SUMMARY_CHAIN);
        }
        return;
    }
    let only_summary = std::env::args().any(|a| a == "--summary");
    if !only_summary {
        let mut c = Criterion::default()
            .measurement_time(Duration::from_secs(3))
            .warm_up_time(Duration::from_secs(1))
            .configure_from_args();
        chains(&mut c);
        mlp_steps(&mut c);
        c.final_summary();
    }
    summary();
}
