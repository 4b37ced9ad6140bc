//! The CPU kernels against their baselines, measured in one run (`docs/performance.md`,
//! "CPU kernels"):
//!
//! - **Matrix products** (`f32`, square, 64, 512 and 1024): the previous kernel (plain i-p-j
//!   loops, copied here), the `gemm` crate on 1 and 2 threads, `matrixmultiply` (on
//!   `MATMUL_NUM_THREADS` threads, default 1 here: it reads the variable once per process),
//!   and eagervm's `matmul` through the VM (submit and sync) on 1 and 2 kernel threads; at 512,
//!   `matmul_tn` and `matmul_nt`; with `EAGERVM_PEER_PYTHON` set to a Python with PyTorch,
//!   `torch.matmul` on 1 and 2 threads (`benches/peers/matmul.py --serve`, a child process
//!   answering between eagervm's rounds).
//! - **Elementwise ops and reductions** on 64 MiB tensors, through the VM, against a plain
//!   Rust loop and a memcpy, in GB/s (bytes read and written).
//! - **Layouts and dtypes**: `add` on the same 16 Mi elements in place, with a broadcast
//!   row, with a transposed input, over every other element, in `f16`; a cast to `f16`; the
//!   sum of a transposed view; each against the contiguous `f32` `add`.
//!
//! The machine is shared and noisy, so every comparison is interleaved: each round times
//! every variant once (the median of a few calls), and a ratio is the median of the per-round
//! ratios, printed with its range over the rounds. `KERNELS_ROUNDS` sets the rounds (default
//! 7); `KERNELS_STAT=min` takes each variant's fastest call in a round instead of its
//! median; `KERNELS_SIZES=64,512,1024` the products' sizes; `KERNELS_ONLY=matmul`, `KERNELS_ONLY=bandwidth` or `KERNELS_ONLY=layouts` runs one part. Then criterion times each eagervm kernel on its own (`cargo bench --bench kernels --
//! matmul/512` filters; `KERNELS_SUMMARY_ONLY=1` skips criterion).

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::Instant;

use criterion::{BenchmarkId, Criterion, Throughput};
use eagervm::kernels::set_kernel_threads;
use eagervm::prelude::*;

// ---- measuring ------------------------------------------------------------------------

/// Whether a variant's time in a round is its fastest call rather than its median call
/// (`KERNELS_STAT=min`): on a machine others load, the fastest call is the one least
/// disturbed.
fn use_min() -> bool {
    static MIN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| std::env::var("KERNELS_STAT").is_ok_and(|v| v == "min"))
}

/// Seconds per call of `f`: the median (or, with `KERNELS_STAT=min`, the fastest) of
/// `reps` calls.
fn median_call(reps: usize, mut f: impl FnMut()) -> f64 {
    let mut t: Vec<f64> = (0..reps.max(1))
        .map(|_| {
            let s = Instant::now();
            f();
            s.elapsed().as_secs_f64()
        })
        .collect();
    if use_min() {
        t.iter().copied().fold(f64::MAX, f64::min)
    } else {
        median(&mut t)
    }
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn rounds() -> usize {
    std::env::var("KERNELS_ROUNDS").ok().and_then(|v| v.parse().ok()).filter(|&n| n > 0).unwrap_or(7)
}

/// One variant's per-round times.
struct Series {
    name: String,
    times: Vec<f64>,
}

/// Run `rounds` rounds of every variant in turn; each variant returns its seconds per call.
/// A named variant: each call times one round and returns seconds per call.
type Variant<'a> = (String, Box<dyn FnMut() -> f64 + 'a>);

fn interleaved(rounds: usize, variants: &mut [Variant<'_>]) -> Vec<Series> {
    let mut out: Vec<Series> =
        variants.iter().map(|(n, _)| Series { name: n.clone(), times: vec![] }).collect();
    for _ in 0..rounds {
        for (i, (_, f)) in variants.iter_mut().enumerate() {
            out[i].times.push(f());
        }
    }
    out
}

/// Median, lowest and highest over the rounds of `num[r] / den[r]`.
fn ratio(num: &Series, den: &Series) -> (f64, f64, f64) {
    let mut r: Vec<f64> = num.times.iter().zip(&den.times).map(|(a, b)| a / b).collect();
    let (lo, hi) = r.iter().fold((f64::MAX, f64::MIN), |(lo, hi), &x| (lo.min(x), hi.max(x)));
    (median(&mut r), lo, hi)
}

fn med(s: &Series) -> f64 {
    median(&mut s.times.clone())
}

// ---- data -----------------------------------------------------------------------------

/// Values in [-1, 1) from a fixed seed.
fn values(len: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
        })
        .collect()
}

/// The `matmul` kernel before the `gemm` crate: plain i-p-j loops (the baseline).
fn old_matmul(m: usize, k: usize, n: usize, a: &[f32], b: &[f32], out: &mut [f32]) {
    out.fill(0.0);
    for i in 0..m {
        let row = &mut out[i * n..(i + 1) * n];
        for p in 0..k {
            let x = a[i * k + p];
            for (o, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                *o += x * y;
            }
        }
    }
}

fn gemm_crate(n: usize, a: &[f32], b: &[f32], out: &mut [f32], par: gemm::Parallelism) {
    assert!(a.len() >= n * n && b.len() >= n * n && out.len() >= n * n);
    let s = n as isize;
    // SAFETY: three row-major n×n matrices, each slice holding n·n elements (asserted).
    unsafe {
        gemm::gemm(
            n,
            n,
            n,
            out.as_mut_ptr(),
            1,
            s,
            false,
            a.as_ptr(),
            1,
            s,
            b.as_ptr(),
            1,
            s,
            0.0,
            1.0,
            false,
            false,
            false,
            par,
        )
    }
}

fn matrixmultiply(n: usize, a: &[f32], b: &[f32], out: &mut [f32]) {
    assert!(a.len() >= n * n && b.len() >= n * n && out.len() >= n * n);
    let s = n as isize;
    // SAFETY: as for `gemm_crate`: row-major n×n matrices within their slices.
    unsafe {
        matrixmultiply::sgemm(n, n, n, 1.0, a.as_ptr(), s, 1, b.as_ptr(), s, 1, 0.0, out.as_mut_ptr(), s, 1)
    }
}

// ---- the peer -------------------------------------------------------------------------

/// `benches/peers/matmul.py --serve`, answering "SIZE THREADS REPS" with a JSON line.
struct Torch {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Torch {
    fn start() -> Option<Torch> {
        let python = std::env::var_os("EAGERVM_PEER_PYTHON")?;
        let script = concat!(env!("CARGO_MANIFEST_DIR"), "/benches/peers/matmul.py");
        let mut child = Command::new(&python)
            .args([script, "--serve"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .map_err(|e| eprintln!("EAGERVM_PEER_PYTHON={python:?}: cannot start {script}: {e}"))
            .ok()?;
        let stdin = child.stdin.take()?;
        let stdout = BufReader::new(child.stdout.take()?);
        let mut t = Torch { child, stdin, stdout };
        // One answer proves torch imports.
        t.time(64, 1, 1).map(|_| t)
    }

    fn time(&mut self, size: usize, threads: usize, reps: usize) -> Option<f64> {
        writeln!(self.stdin, "{size} {threads} {reps}").ok()?;
        let mut line = String::new();
        self.stdout.read_line(&mut line).ok()?;
        let v: serde_json::Value = serde_json::from_str(&line).ok()?;
        v.get(if use_min() { "min_s" } else { "median_s" })?.as_f64()
    }
}

impl Drop for Torch {
    fn drop(&mut self) {
        // Closing stdin ends its loop.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---- the VM side ----------------------------------------------------------------------

struct Vm {
    vm: VirtualMachine,
    cpu: StreamId,
}

impl Vm {
    /// A VM with its scheduler and worker threads, or (`synchronous`) one that runs each
    /// instruction on the caller: the kernel's own cost plus the VM's bookkeeping, without
    /// the hand-offs between threads, which on a loaded machine each wait for a core.
    fn new(synchronous: bool) -> Vm {
        let vm = VirtualMachine::new(Config { synchronous, ..Config::default() }).expect("vm");
        let cpu = vm.compute_stream(DeviceId::CPU).expect("cpu stream");
        Vm { vm, cpu }
    }

    fn tensor(&self, v: &[f32], shape: &[usize]) -> Tensor {
        self.vm.from_slice(v, shape, DeviceId::CPU).expect("tensor")
    }

    fn empty(&self, shape: &[usize]) -> Tensor {
        self.vm.empty(shape, DType::F32, DeviceId::CPU).expect("tensor")
    }

    /// Run `op` on `ins` into `out` and wait for it.
    fn call(&self, op: &str, ins: &[&Tensor], out: &Tensor, scalar: f64) {
        self.call_with(op, ins, out, Attrs::scalar(scalar));
    }

    /// [`call`](Self::call) with any attributes.
    fn call_with(&self, op: &str, ins: &[&Tensor], out: &Tensor, attrs: Attrs) {
        let op = self.vm.op(op).expect("op");
        self.vm.run(|b| b.call_into(op, ins, &[out], attrs, self.cpu)).expect("call");
        self.vm.sync().expect("sync");
    }
}

// ---- the summary ----------------------------------------------------------------------

fn matmul_summary(vm: &Vm, sync: &Vm, torch: &mut Option<Torch>) {
    let rounds = rounds();
    let mm_threads = std::env::var("MATMUL_NUM_THREADS").unwrap_or_default();
    let pool2 = rayon::ThreadPoolBuilder::new().num_threads(2).build().expect("pool");
    let torch_cell = torch.as_mut().map(std::cell::RefCell::new);
    println!("\n== f32 matmul, square, {rounds} interleaved rounds; ratios: median [lowest, highest] over the rounds");
    let sizes: Vec<usize> = std::env::var("KERNELS_SIZES")
        .ok()
        .map(|v| v.split(',').filter_map(|x| x.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![64, 512, 1024]);
    for n in sizes {
        // Repetitions for about 4·10^9 multiply-adds per variant and round (1 to 200): long
        // enough to time at every size, short enough for 7 rounds.
        let reps = (4e9 / (n * n * n) as f64).clamp(1.0, 200.0) as usize;
        let (av, bv) = (values(n * n, 1), values(n * n, 2));
        let mut out = vec![0.0f32; n * n];
        let (a, b, o) = (vm.tensor(&av, &[n, n]), vm.tensor(&bv, &[n, n]), vm.empty(&[n, n]));
        let (sa, sb, so) = (sync.tensor(&av, &[n, n]), sync.tensor(&bv, &[n, n]), sync.empty(&[n, n]));
        let flops = 2.0 * (n * n * n) as f64;
        let (old_reps, old_rounds) = if n >= 1024 { (1, rounds.min(3)) } else { (reps, rounds) };
        let out = std::cell::RefCell::new(&mut out);
        let mut variants: Vec<Variant<'_>> = vec![
            (
                "gemm crate, 1 thread".into(),
                Box::new(|| {
                    median_call(reps, || {
                        gemm_crate(n, &av, &bv, &mut out.borrow_mut()[..], gemm::Parallelism::None)
                    })
                }),
            ),
            (
                "gemm crate, 2 threads".into(),
                Box::new(|| {
                    median_call(reps, || {
                        let mut o = out.borrow_mut();
                        let o: &mut [f32] = &mut o[..];
                        pool2.install(|| gemm_crate(n, &av, &bv, o, gemm::Parallelism::Rayon(2)))
                    })
                }),
            ),
            (
                format!(
                    "matrixmultiply, MATMUL_NUM_THREADS={}",
                    if mm_threads.is_empty() { "1" } else { &mm_threads }
                ),
                Box::new(|| median_call(reps, || matrixmultiply(n, &av, &bv, &mut out.borrow_mut()[..]))),
            ),
            (
                "eagervm matmul, synchronous VM, 1 kernel thread".into(),
                Box::new(|| {
                    set_kernel_threads(1);
                    median_call(reps, || sync.call("matmul", &[&sa, &sb], &so, 0.0))
                }),
            ),
            (
                "eagervm matmul, synchronous VM, 2 kernel threads".into(),
                Box::new(|| {
                    set_kernel_threads(2);
                    let t = median_call(reps, || sync.call("matmul", &[&sa, &sb], &so, 0.0));
                    set_kernel_threads(1);
                    t
                }),
            ),
            (
                "eagervm matmul via the VM, 1 kernel thread".into(),
                Box::new(|| {
                    set_kernel_threads(1);
                    median_call(reps, || vm.call("matmul", &[&a, &b], &o, 0.0))
                }),
            ),
            (
                "eagervm matmul via the VM, 2 kernel threads".into(),
                Box::new(|| {
                    set_kernel_threads(2);
                    let t = median_call(reps, || vm.call("matmul", &[&a, &b], &o, 0.0));
                    set_kernel_threads(1);
                    t
                }),
            ),
        ];
        if n == 512 {
            for op in ["matmul_tn", "matmul_nt"] {
                let (a, b, o) = (&sa, &sb, &so);
                variants.push((
                    format!("eagervm {op}, synchronous VM, 1 kernel thread"),
                    Box::new(move || median_call(reps, || sync.call(op, &[a, b], o, 0.0))),
                ));
            }
        }
        let torch = torch_cell.as_ref().filter(|_| n == 512);
        if let Some(t) = torch {
            // The child's answers are medians of its own `reps` calls, like ours.
            variants.push((
                "torch.matmul, 1 thread".into(),
                Box::new(move || t.borrow_mut().time(n, 1, reps).unwrap_or(f64::NAN)),
            ));
            variants.push((
                "torch.matmul, 2 threads".into(),
                Box::new(move || t.borrow_mut().time(n, 2, reps).unwrap_or(f64::NAN)),
            ));
        }
        let series = interleaved(rounds, &mut variants);
        drop(variants);
        // The old loop is slow: timed after the others, in fewer rounds at 1024.
        let old = Series {
            name: "previous kernel (plain i-p-j loops)".into(),
            times: (0..old_rounds)
                .map(|_| median_call(old_reps, || old_matmul(n, n, n, &av, &bv, &mut out.borrow_mut()[..])))
                .collect(),
        };
        report_matmul(n, flops, &series, Some(old));
    }
}

fn report_matmul(n: usize, flops: f64, series: &[Series], old: Option<Series>) {
    println!("\n-- {n}x{n}x{n}");
    println!("{:<48} {:>10} {:>9}", "variant", "ms", "GFLOP/s");
    for s in series.iter().chain(&old) {
        let t = med(s);
        println!("{:<48} {:>10.3} {:>9.1}", s.name, t * 1e3, flops / t / 1e9);
    }
    let find = |p: &str| series.iter().find(|s| s.name.starts_with(p));
    let show = |label: &str, num: Option<&Series>, den: Option<&Series>| {
        if let (Some(a), Some(b)) = (num, den) {
            let (m, lo, hi) = ratio(a, b);
            println!("  {label:<62} {m:>6.2}  [{lo:.2}, {hi:.2}]");
        }
    };
    println!("speed ratios (time of the second / time of the first; > 1: the first is faster)");
    let g1 = find("gemm crate, 1");
    let g2 = find("gemm crate, 2");
    let v1 = find("eagervm matmul, synchronous VM, 1");
    let v2 = find("eagervm matmul, synchronous VM, 2");
    let w1 = find("eagervm matmul via the VM, 1");
    let w2 = find("eagervm matmul via the VM, 2");
    show("gemm 1 thread vs matrixmultiply", find("matrixmultiply"), g1);
    show("eagervm (synchronous VM) 1 thread vs torch 1 thread", find("torch.matmul, 1"), v1);
    show("eagervm (synchronous VM) 2 threads vs torch 2 threads", find("torch.matmul, 2"), v2);
    show("eagervm 1 thread vs the gemm crate called directly", g1, v1);
    show("eagervm 2 threads vs eagervm 1 thread", v1, v2);
    show("worker thread vs synchronous VM, 1 kernel thread", v1, w1);
    show("worker thread vs synchronous VM, 2 kernel threads", v2, w2);
    show("torch 1 thread vs eagervm on the VM's worker, 1 thread", find("torch.matmul, 1"), w1);
    show("torch 2 threads vs eagervm on the VM's worker, 2 threads", find("torch.matmul, 2"), w2);
    show("gemm 2 threads vs gemm 1 thread", g1, g2);
    show("eagervm matmul_tn vs matmul (1 thread)", v1, find("eagervm matmul_tn"));
    show("eagervm matmul_nt vs matmul (1 thread)", v1, find("eagervm matmul_nt"));
    if let Some(old) = &old {
        // Fewer rounds of the old loop at 1024: compare medians.
        let (o, v) = (med(old), v1.map(med).unwrap_or(f64::NAN));
        println!("  {:<62} {:>6.2}  (medians)", "eagervm 1 thread vs the previous kernel", o / v);
        if let Some(g) = g1 {
            println!("  {:<62} {:>6.2}  (medians)", "gemm crate 1 thread vs the previous kernel", o / med(g));
        }
    }
}

/// Bytes moved per element: reads and writes.
fn gbs(bytes: f64, s: f64) -> f64 {
    bytes / s / 1e9
}

fn bandwidth_summary(vm: &Vm, threaded: &Vm) {
    let rounds = rounds();
    const N: usize = 16 << 20; // 64 MiB of f32
    let reps = 3;
    let (av, bv) = (values(N, 3), values(N, 4));
    let mut out = vec![0.0f32; N];
    let (a, b, o) = (vm.tensor(&av, &[N]), vm.tensor(&bv, &[N]), vm.empty(&[N]));
    let s = vm.empty(&[]);
    let (ta, tb, to) = (threaded.tensor(&av, &[N]), threaded.tensor(&bv, &[N]), threaded.empty(&[N]));
    let (rows, cols) = (4096usize, N / 4096);
    let (x2, cs) = (vm.tensor(&av, &[rows, cols]), vm.empty(&[cols]));
    let mut colsum = vec![0.0f32; cols];
    let out = std::cell::RefCell::new(&mut out);
    let colsum = std::cell::RefCell::new(&mut colsum);
    let f = 4.0 * N as f64; // bytes of one tensor
    let mut variants: Vec<Variant<'_>> = vec![
        (
            "memcpy (copy_from_slice)".into(),
            Box::new(|| median_call(reps, || out.borrow_mut().copy_from_slice(&av))),
        ),
        (
            "plain loop: add".into(),
            Box::new(|| {
                median_call(reps, || {
                    for ((o, x), y) in out.borrow_mut().iter_mut().zip(&av).zip(&bv) {
                        *o = x + y;
                    }
                })
            }),
        ),
        ("eagervm add".into(), Box::new(|| median_call(reps, || vm.call("add", &[&a, &b], &o, 0.0)))),
        (
            "eagervm add on the VM's worker".into(),
            Box::new(|| median_call(reps, || threaded.call("add", &[&ta, &tb], &to, 0.0))),
        ),
        (
            "plain loop: relu".into(),
            Box::new(|| {
                median_call(reps, || {
                    for (o, &x) in out.borrow_mut().iter_mut().zip(&av) {
                        *o = if x < 0.0 { 0.0 } else { x };
                    }
                })
            }),
        ),
        ("eagervm relu".into(), Box::new(|| median_call(reps, || vm.call("relu", &[&a], &o, 0.0)))),
        ("eagervm scale".into(), Box::new(|| median_call(reps, || vm.call("scale", &[&a], &o, 0.5)))),
        ("eagervm copy".into(), Box::new(|| median_call(reps, || vm.call("copy", &[&a], &o, 0.0)))),
        (
            "plain loop: sum (iter().sum(), in order)".into(),
            Box::new(|| {
                median_call(reps, || {
                    black_box(black_box(&av[..]).iter().sum::<f32>());
                })
            }),
        ),
        ("eagervm sum".into(), Box::new(|| median_call(reps, || vm.call("sum", &[&a], &s, 0.0)))),
        (
            "plain loop: sum_rows (row by row)".into(),
            Box::new(|| {
                median_call(reps, || {
                    let mut c = colsum.borrow_mut();
                    c.fill(0.0);
                    for row in av.chunks_exact(cols) {
                        for (o, &v) in c.iter_mut().zip(row) {
                            *o += v;
                        }
                    }
                })
            }),
        ),
        ("eagervm sum_rows".into(), Box::new(|| median_call(reps, || vm.call("sum_rows", &[&x2], &cs, 0.0)))),
    ];
    let series = interleaved(rounds, &mut variants);
    drop(variants);
    println!("\n== 64 MiB f32 tensors (16 Mi elements), {rounds} interleaved rounds; GB/s = bytes read + written per second");
    println!("(eagervm: a synchronous VM, the kernel on the calling thread, unless it says otherwise)");
    println!("{:<44} {:>9} {:>8}", "variant", "ms", "GB/s");
    let bytes = |name: &str| -> f64 {
        if name.contains("sum") {
            f // read only (sum_rows writes 16 KiB)
        } else if name.contains("add") {
            3.0 * f
        } else {
            2.0 * f
        }
    };
    for s in &series {
        let t = med(s);
        println!("{:<44} {:>9.2} {:>8.1}", s.name, t * 1e3, gbs(bytes(&s.name), t));
    }
    let find = |p: &str| series.iter().find(|s| s.name == p).expect("variant");
    println!("bandwidth ratios (GB/s of the first / GB/s of the second): median [lowest, highest]");
    for (x, y) in [
        ("eagervm add", "plain loop: add"),
        ("eagervm add on the VM's worker", "eagervm add"),
        ("eagervm relu", "plain loop: relu"),
        ("eagervm copy", "memcpy (copy_from_slice)"),
        ("eagervm add", "memcpy (copy_from_slice)"),
        ("eagervm sum", "plain loop: sum (iter().sum(), in order)"),
        ("eagervm sum", "memcpy (copy_from_slice)"),
        ("eagervm sum_rows", "plain loop: sum_rows (row by row)"),
    ] {
        // GB/s ratio = (bytes_x / t_x) / (bytes_y / t_y)
        let (m, lo, hi) = ratio(find(y), find(x));
        let scale = bytes(x) / bytes(y);
        println!(
            "  {:<62} {:>6.2}  [{:.2}, {:.2}]",
            format!("{x} vs {y}"),
            m * scale,
            lo * scale,
            hi * scale
        );
    }
}

/// `add` and friends over views and other dtypes, against the contiguous `f32` `add`.
fn layouts_summary(vm: &Vm) {
    let rounds = rounds();
    const SIDE: usize = 4096;
    const N: usize = SIDE * SIDE; // 64 MiB of f32
    let reps = 3;
    let (av, bv) = (values(N, 3), values(N, 4));
    let (a, b, o) = (vm.tensor(&av, &[SIDE, SIDE]), vm.tensor(&bv, &[SIDE, SIDE]), vm.empty(&[SIDE, SIDE]));
    let x = vm.tensor(&av, &[SIDE, SIDE]);
    let row = vm.tensor(&bv[..SIDE], &[SIDE]);
    let bt = b.view_layout(&[SIDE, SIDE], &[1, SIDE as isize], 0).expect("view");
    let (a2, b2) =
        (a.view_layout(&[N / 2], &[2], 0).expect("view"), b.view_layout(&[N / 2], &[2], 1).expect("view"));
    let o2 = vm.empty(&[N / 2]);
    let half = |v: &[f32]| v.iter().map(|&x| eagervm::framework::f16::from_f32(x)).collect::<Vec<_>>();
    let h = |v: &[f32]| vm.vm.from_slice(&half(v), &[N], DeviceId::CPU).expect("tensor");
    let (ha, hb, ho) = (h(&av), h(&bv), vm.vm.empty(&[N], DType::F16, DeviceId::CPU).expect("tensor"));
    let at = a.view_layout(&[SIDE, SIDE], &[1, SIDE as isize], 0).expect("view");
    let ho2 = ho.view_layout(&[SIDE, SIDE], &[SIDE as isize, 1], 0).expect("view");
    let to_f16 = Attrs::default().with_dtype(DType::F16);
    let s = vm.empty(&[]);
    let f = 4.0 * N as f64;
    // (name, bytes moved, call)
    type Case<'a> = (&'a str, f64, Box<dyn Fn() + 'a>);
    let cases: Vec<Case<'_>> = vec![
        ("add, contiguous f32", 3.0 * f, Box::new(|| vm.call("add", &[&a, &b], &o, 0.0))),
        ("add in place (x += b)", 3.0 * f, Box::new(|| vm.call("add", &[&x, &b], &x, 0.0))),
        ("add, a row broadcast ([n, n] + [n])", 2.0 * f, Box::new(|| vm.call("add", &[&a, &row], &o, 0.0))),
        ("add, a transposed input (a + bᵀ)", 3.0 * f, Box::new(|| vm.call("add", &[&a, &bt], &o, 0.0))),
        ("add, every other element (step 2)", 1.5 * f, Box::new(|| vm.call("add", &[&a2, &b2], &o2, 0.0))),
        ("add, f16 (computed in f32)", 1.5 * f, Box::new(|| vm.call("add", &[&ha, &hb], &ho, 0.0))),
        ("cast f32 to f16", 1.5 * f, Box::new(|| vm.call_with("cast", &[&a], &ho2, to_f16))),
        ("sum of a transposed view", f, Box::new(|| vm.call("sum", &[&at], &s, 0.0))),
    ];
    let mut variants: Vec<Variant<'_>> = cases
        .iter()
        .map(|(name, _, call)| {
            (name.to_string(), Box::new(move || median_call(reps, call)) as Box<dyn FnMut() -> f64>)
        })
        .collect();
    let series = interleaved(rounds, &mut variants);
    drop(variants);
    println!("\n== layouts and dtypes: 16 Mi elements, {rounds} interleaved rounds (a synchronous VM)");
    println!("{:<44} {:>9} {:>8} {:>10}", "variant", "ms", "GB/s", "time / add");
    for (s, (_, bytes, _)) in series.iter().zip(&cases) {
        let t = med(s);
        let (r, _, _) = ratio(s, &series[0]);
        println!("{:<44} {:>9.2} {:>8.1} {:>10.2}", s.name, t * 1e3, gbs(*bytes, t), r);
    }
}

// ---- criterion ------------------------------------------------------------------------

fn criterion_benches(c: &mut Criterion, vm: &Vm) {
    set_kernel_threads(1);
    let mut g = c.benchmark_group("matmul");
    g.sample_size(10);
    for n in [64usize, 512, 1024] {
        let (a, b, o) =
            (vm.tensor(&values(n * n, 1), &[n, n]), vm.tensor(&values(n * n, 2), &[n, n]), vm.empty(&[n, n]));
        g.throughput(Throughput::Elements((2 * n * n * n) as u64));
        for op in ["matmul", "matmul_tn", "matmul_nt"] {
            g.bench_with_input(BenchmarkId::new(op, n), &n, |bch, _| {
                bch.iter(|| vm.call(op, &[&a, &b], &o, 0.0))
            });
        }
    }
    g.finish();
    const N: usize = 16 << 20;
    let mut g = c.benchmark_group("elementwise_64MiB");
    g.sample_size(10);
    g.throughput(Throughput::Bytes((4 * N) as u64));
    let (a, b, o, s) =
        (vm.tensor(&values(N, 3), &[N]), vm.tensor(&values(N, 4), &[N]), vm.empty(&[N]), vm.empty(&[]));
    g.bench_function("add", |bch| bch.iter(|| vm.call("add", &[&a, &b], &o, 0.0)));
    g.bench_function("relu", |bch| bch.iter(|| vm.call("relu", &[&a], &o, 0.0)));
    g.bench_function("sum", |bch| bch.iter(|| vm.call("sum", &[&a], &s, 0.0)));
    g.finish();
}

fn main() {
    // matrixmultiply reads this once; its default is every physical core.
    if std::env::var_os("MATMUL_NUM_THREADS").is_none() {
        std::env::set_var("MATMUL_NUM_THREADS", "1");
    }
    let vm = Vm::new(false);
    let sync = Vm::new(true);
    let mut torch = Torch::start();
    if torch.is_none() {
        println!("(no PyTorch comparison: set EAGERVM_PEER_PYTHON to a Python with torch)");
    }
    let only = std::env::var("KERNELS_ONLY").unwrap_or_default();
    if only.is_empty() || only == "matmul" {
        matmul_summary(&vm, &sync, &mut torch);
    }
    drop(torch);
    if only.is_empty() || only == "bandwidth" {
        bandwidth_summary(&sync, &vm);
    }
    if only.is_empty() || only == "layouts" {
        layouts_summary(&sync);
    }
    if std::env::var_os("KERNELS_SUMMARY_ONLY").is_none() {
        let mut c = Criterion::default().configure_from_args();
        criterion_benches(&mut c, &vm);
        c.final_summary();
    }
}
