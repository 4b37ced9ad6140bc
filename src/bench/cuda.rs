//! GPU benchmarks: what the VM costs over a plain loop on one CUDA stream, and how well it
//! overlaps copies with compute.
//!
//! - **(a) overhead**: a chain of `n` tiny `scale` kernels (one element) through the VM,
//!   against the same kernels launched in a plain loop on one stream. Both alternate between
//!   two buffers: through the VM, `call_into` two tensors in turn. Reported as the ratio of
//!   the process's CPU time (all threads: caller, scheduler, workers, watchers, the
//!   driver's) per kernel (target ≤ 1.10), and of wall time, which is above 1 when the GPU
//!   waits for the VM.
//! - **(a′) eager chain**: the same chain written as an eager program does, `x = f(x)`: each
//!   call makes a new tensor, whose storage comes from the caching allocator when the kernel
//!   runs, and the previous one is released (a `Release` instruction). Against the same
//!   plain loop: what the tensor lifecycle adds on top of (a).
//! - **(b) overlap**: `chunks` chunks, each copied in on the H2D stream, scaled `rounds`
//!   times on the compute stream and copied out on the D2H stream, all through the VM;
//!   reported as ideal / measured, where ideal is the time of the busiest of the three
//!   stages run alone (target ≥ 0.9).
//! - **(c) MLP step**: `x·W1 → relu → ·W2 → sum`, `steps` times, through the VM against a
//!   plain loop of the same kernels on one stream.
//! - **(d) `run mlp` step**: the training step of `eagervm run mlp` (`super::mlp`) on
//!   `cuda:0`, at 64×8×32 and 1024×1024×1024, `steps` steps per repetition, with the loss
//!   read at the end and every step; `benches/peers/torch_mlp.py --device cuda` runs the
//!   same step in PyTorch, eager and with CUDA graphs.
//!
//! Without a usable GPU, [`run`] returns a report whose `skipped` says why.

use std::time::{Duration, Instant};

use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, DType, Tensor};
use crate::vm::Config;
use crate::vm::Result;
use crate::VirtualMachine;

/// Sizes of the three benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaBenchOptions {
    /// Kernels in the overhead chain (a); 0 skips (a) and (a′).
    pub chain: usize,
    /// Chunks in the overlap pipeline (b); 0 skips it.
    pub chunks: usize,
    /// `f32` elements per chunk.
    pub chunk_elems: usize,
    /// Compute kernels per chunk.
    pub rounds: usize,
    /// MLP steps (c); 0 skips it.
    pub steps: usize,
    /// MLP width (batch = width).
    pub width: usize,
}

impl Default for CudaBenchOptions {
    fn default() -> Self {
        CudaBenchOptions {
            chain: 100_000,
            chunks: 64,
            chunk_elems: 1 << 20,
            rounds: 8,
            steps: 200,
            width: 512,
        }
    }
}

/// One measured comparison.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ratio {
    /// Wall time through the VM.
    pub vm: Duration,
    /// Wall time of the reference (plain loop, or ideal overlap).
    pub reference: Duration,
    /// The reported ratio (see the module docs for each benchmark's direction).
    pub ratio: f64,
    /// CPU time of the whole process through the VM and in the reference, where the
    /// system tells (overhead and MLP benchmarks).
    pub cpu: Option<(Duration, Duration)>,
    /// The VM run's CPU time by kind of thread, where the system tells.
    pub roles: Option<super::cpu::RoleCpu>,
    /// The reference run's CPU time by kind of thread (its own threads and the driver's),
    /// where the system tells and the reference ran in this process.
    pub reference_roles: Option<super::cpu::RoleCpu>,
}

impl Ratio {
    /// VM / reference, in wall time.
    fn slower(vm: Timing, reference: Timing) -> Ratio {
        Ratio {
            vm: vm.wall,
            reference: reference.wall,
            ratio: vm.wall.as_secs_f64() / reference.wall.as_secs_f64(),
            cpu: vm.cpu.zip(reference.cpu),
            roles: vm.roles,
            reference_roles: reference.roles,
        }
    }

    /// CPU time through the VM / CPU time of the reference.
    pub fn cpu_ratio(&self) -> Option<f64> {
        self.cpu.map(|(vm, reference)| vm.as_secs_f64() / reference.as_secs_f64())
    }
}

/// The results, or why there are none.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaBenchReport {
    /// Why nothing ran (no GPU, no driver, no `cuda` feature), if so.
    pub skipped: Option<String>,
    /// Kernels in the overhead chain (a).
    pub chain: usize,
    /// (a): VM time per kernel / plain time per kernel.
    pub overhead: Option<Ratio>,
    /// (a′): the eager chain's time per kernel / plain time per kernel.
    pub eager_chain: Option<Ratio>,
    /// (b): ideal overlapped time / VM time.
    pub overlap: Option<Ratio>,
    /// With (b): the H2D and D2H copies of every chunk at once, on independent tensors,
    /// with no compute (what the copy engines and the bus give both directions together).
    pub both_ways: Option<Duration>,
    /// (c): VM time / plain time.
    pub mlp: Option<Ratio>,
    /// (d): the `run mlp` step at 64×8×32 and 1024×1024×1024.
    pub mlp_steps: Vec<super::mlp::MlpResult>,
}

/// A duration in microseconds, for the JSON report.
fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

impl CudaBenchReport {
    /// The report as one JSON object: `skipped` (why nothing ran, or null), and per
    /// benchmark its wall times in µs, ratio and CPU ratio, or null where it did not run.
    pub fn to_json(&self) -> serde_json::Value {
        let ratio = |r: &Option<Ratio>| {
            r.as_ref().map(|r| {
                serde_json::json!({
                    "vm_us": us(r.vm),
                    "reference_us": us(r.reference),
                    "ratio": r.ratio,
                    "cpu_ratio": r.cpu_ratio(),
                })
            })
        };
        serde_json::json!({
            "bench": "cuda",
            "skipped": self.skipped,
            "chain": self.chain,
            "overhead": ratio(&self.overhead),
            "eager_chain": ratio(&self.eager_chain),
            "overlap": ratio(&self.overlap),
            "both_ways_us": self.both_ways.map(us),
            "mlp": ratio(&self.mlp),
            "mlp_steps": self.mlp_steps,
        })
    }
}

impl std::fmt::Display for CudaBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "cuda benchmarks skipped: {why}");
        }
        let cpu = |r: &Ratio| match (r.cpu, r.cpu_ratio()) {
            (Some((vm, reference)), Some(x)) => {
                format!("; cpu vm {vm:.3?} reference {reference:.3?} ratio {x:.3}")
            }
            _ => String::new(),
        };
        for (name, r, target) in
            [("overhead", &self.overhead, " (target <= 1.10)"), ("eager", &self.eager_chain, "")]
        {
            let Some(r) = r else {
                writeln!(f, "{name:<10} not run")?;
                continue;
            };
            let per = |d: Duration| d.as_secs_f64() * 1e6 / self.chain.max(1) as f64;
            let (vm_cpu, ref_cpu) = r.cpu.map_or((f64::NAN, f64::NAN), |(a, b)| (per(a), per(b)));
            writeln!(
                f,
                "{name:<10} cpu us/kernel vm {vm_cpu:.2} plain {ref_cpu:.2}  ratio {:.3}{target}; \
                 wall us/kernel vm {:.2} plain {:.2}  ratio {:.3} (above 1: the GPU waited for the VM)",
                r.cpu_ratio().unwrap_or(f64::NAN),
                per(r.vm),
                per(r.reference),
                r.ratio
            )?;
            for (side, roles) in [("vm", r.roles), ("plain", r.reference_roles)] {
                let Some(c) = roles else { continue };
                let n = self.chain.max(1) as f64;
                let us = |ns: u64| ns as f64 / 1e3 / n;
                let per = |k: u64| k as f64 / n;
                let (t, w) = (c.ns, c.slices);
                writeln!(
                    f,
                    "           {side} cpu us/kernel by thread: caller {:.2} scheduler {:.2} worker {:.2} \
                     watcher {:.2} other {:.2}; wake-ups/kernel: {:.3} {:.3} {:.3} {:.3} {:.3}",
                    us(t.caller),
                    us(t.scheduler),
                    us(t.workers),
                    us(t.watchers),
                    us(t.other),
                    per(w.caller),
                    per(w.scheduler),
                    per(w.workers),
                    per(w.watchers),
                    per(w.other)
                )?;
            }
        }
        match &self.overlap {
            Some(r) => {
                writeln!(
                    f,
                    "overlap    vm {:>10.3?}  ideal {:>10.3?}  ratio {:.3} (target >= 0.90)",
                    r.vm, r.reference, r.ratio
                )?;
                if let Some(both) = self.both_ways {
                    writeln!(f, "           both copy stages at once, no compute: {both:.3?}")?;
                }
            }
            None => writeln!(f, "overlap    not run")?,
        }
        match &self.mlp {
            Some(r) => writeln!(
                f,
                "mlp        vm {:>10.3?}  plain {:>10.3?}  ratio {:.3} (wall){}",
                r.vm,
                r.reference,
                r.ratio,
                cpu(r)
            )?,
            None => writeln!(f, "mlp        not run")?,
        }
        for m in &self.mlp_steps {
            writeln!(
                f,
                "run mlp    {:<14} {:>10.1} us/step, {:>10.1} with the loss read every step ({} steps, median of {})",
                m.shape.label(),
                m.step_us,
                m.step_us_loss_read,
                m.steps,
                m.reps
            )?;
        }
        Ok(())
    }
}

/// Run the three benchmarks on `cuda:0`, through a VM started with `config` plus one CUDA
/// device, or report why they were skipped.
pub fn run(opts: &CudaBenchOptions, config: &Config) -> Result<CudaBenchReport> {
    let skipped = |why: String| CudaBenchReport {
        skipped: Some(why),
        chain: opts.chain,
        overhead: None,
        eager_chain: None,
        overlap: None,
        both_ways: None,
        mlp: None,
        mlp_steps: Vec::new(),
    };
    if let Err(e) = crate::ep::cuda::available(0) {
        return Ok(skipped(e.to_string()));
    }
    let vm = VirtualMachine::new(config.clone().with_cuda_devices(1))?;
    let gpu = DeviceId::cuda(0);
    // A size of zero skips that benchmark.
    let chain = opts.chain > 0;
    let overlapped = (opts.chunks > 0 && opts.rounds > 0).then(|| overlap(&vm, gpu, opts)).transpose()?;
    Ok(CudaBenchReport {
        skipped: None,
        chain: opts.chain,
        overhead: chain.then(|| overhead(&vm, gpu, opts.chain, false)).transpose()?,
        eager_chain: chain.then(|| overhead(&vm, gpu, opts.chain, true)).transpose()?,
        overlap: overlapped.map(|o| o.0),
        both_ways: overlapped.map(|o| o.1),
        mlp: (opts.steps > 0 && opts.width > 0).then(|| mlp(&vm, gpu, opts.steps, opts.width)).transpose()?,
        mlp_steps: match opts.steps {
            0 => Vec::new(),
            steps => [super::mlp::MlpShape::SMALL, super::mlp::MlpShape::LARGE]
                .into_iter()
                .map(|shape| super::mlp::measure(&vm, gpu, shape, steps, 3, &super::Progress::hidden()))
                .collect::<Result<_>>()?,
        },
    })
}

/// Wall time and process CPU time of one call.
#[derive(Debug, Clone, Copy)]
struct Timing {
    wall: Duration,
    cpu: Option<Duration>,
    roles: Option<super::cpu::RoleCpu>,
}

/// Time `f` once.
fn timed(mut f: impl FnMut() -> Result<()>) -> Result<Timing> {
    let threads0 = super::cpu::sample();
    let cpu0 = super::cpu::process_cpu();
    let t = Instant::now();
    f()?;
    let wall = t.elapsed();
    let cpu = super::cpu::process_cpu().zip(cpu0).map(|(b, a)| b.saturating_sub(a));
    let roles = threads0.zip(super::cpu::sample()).map(|(a, b)| a.roles_until(&b));
    Ok(Timing { wall, cpu, roles })
}

/// Rounds of each side of a comparison, taken in turn (VM, reference, VM, ...) so that a
/// slow spell of a shared machine falls on both; the median of each side is reported.
const ROUNDS: usize = 5;

/// Time `vm` and `reference` [`ROUNDS`] times each, in turn, after one warm-up call of each;
/// the median wall time and the median CPU time (with its run's split by thread) of each.
fn compare(
    mut vm: impl FnMut() -> Result<()>,
    mut reference: impl FnMut() -> Result<()>,
) -> Result<(Timing, Timing)> {
    vm()?;
    reference()?;
    let (mut a, mut b) = (Vec::with_capacity(ROUNDS), Vec::with_capacity(ROUNDS));
    for _ in 0..ROUNDS {
        a.push(timed(&mut vm)?);
        b.push(timed(&mut reference)?);
    }
    Ok((median(a), median(b)))
}

/// The median wall time, and the median CPU time with its split.
fn median(mut runs: Vec<Timing>) -> Timing {
    runs.sort_by_key(|t| t.wall);
    let wall = runs[runs.len() / 2].wall;
    runs.sort_by_key(|t| t.cpu);
    let mid = runs[runs.len() / 2];
    Timing { wall, ..mid }
}

fn overhead(vm: &VirtualMachine, gpu: DeviceId, n: usize, eager: bool) -> Result<Ratio> {
    let s = vm.compute_stream(gpu)?;
    let scale = vm.op("scale")?;
    let x0 = vm.from_slice(&[1.0f32], &[1], gpu)?;
    let x1 = vm.from_slice(&[1.0f32], &[1], gpu)?;
    vm.sync()?;
    let through_vm = || {
        if eager {
            let mut x = x0.clone();
            vm.run(|b| -> Result<()> {
                for _ in 0..n {
                    x = b.call(scale, &[&x], Attrs::scalar(1.0), s)?;
                }
                Ok(())
            })?;
        } else {
            vm.run(|b| -> Result<()> {
                let (mut from, mut to) = (&x0, &x1);
                for _ in 0..n {
                    b.call_into(scale, &[from], &[to], Attrs::scalar(1.0), s)?;
                    std::mem::swap(&mut from, &mut to);
                }
                Ok(())
            })?;
        }
        vm.sync()
    };
    let (through_vm, plain) = compare(through_vm, || plain::chain(gpu, n))?;
    Ok(Ratio::slower(through_vm, plain))
}

/// (b), and the time of both copy stages at once with no compute.
fn overlap(vm: &VirtualMachine, gpu: DeviceId, o: &CudaBenchOptions) -> Result<(Ratio, Duration)> {
    let (h2d, c, d2h) =
        (vm.stream(gpu, StreamType::H2D)?, vm.compute_stream(gpu)?, vm.stream(gpu, StreamType::D2H)?);
    let (copy, scale) = (vm.op("copy")?, vm.op("scale")?);
    let shape = [o.chunk_elems];
    let data: Vec<f32> = (0..o.chunk_elems).map(|i| i as f32).collect();
    let hosts: Vec<Tensor> =
        (0..o.chunks).map(|_| vm.from_slice(&data, &shape, DeviceId::CPU)).collect::<Result<_>>()?;
    let outs: Vec<Tensor> =
        (0..o.chunks).map(|_| vm.empty(&shape, DType::F32, DeviceId::CPU)).collect::<Result<_>>()?;
    let devs: Vec<Tensor> =
        (0..o.chunks).map(|_| vm.empty(&shape, DType::F32, gpu)).collect::<Result<_>>()?;
    let others: Vec<Tensor> =
        (0..o.chunks).map(|_| vm.from_slice(&data, &shape, gpu)).collect::<Result<_>>()?;
    vm.sync()?;
    // Each stage alone, every chunk: the stage's total time.
    let h2d_only = || {
        vm.run(|b| {
            hosts
                .iter()
                .zip(&devs)
                .try_for_each(|(h, d)| b.call_into(copy, &[h], &[d], Attrs::default(), h2d))
        })?;
        vm.sync()
    };
    let compute_only = || {
        vm.run(|b| -> Result<()> {
            for d in &devs {
                let mut x = d.clone();
                for _ in 0..o.rounds {
                    x = b.call(scale, &[&x], Attrs::scalar(1.0), c)?;
                }
            }
            Ok(())
        })?;
        vm.sync()
    };
    let d2h_only = || {
        vm.run(|b| {
            devs.iter().zip(&outs).try_for_each(|(d, h)| b.call_into(copy, &[d], &[h], Attrs::default(), d2h))
        })?;
        vm.sync()
    };
    let pipelined = || {
        vm.run(|b| -> Result<()> {
            for ((h, d), out) in hosts.iter().zip(&devs).zip(&outs) {
                b.call_into(copy, &[h], &[d], Attrs::default(), h2d)?;
                let mut x = d.clone();
                for _ in 0..o.rounds {
                    x = b.call(scale, &[&x], Attrs::scalar(1.0), c)?;
                }
                b.call_into(copy, &[&x], &[out], Attrs::default(), d2h)?;
            }
            Ok(())
        })?;
        vm.sync()
    };
    type Stage<'a> = (&'a dyn Fn() -> Result<()>, Vec<Duration>);
    // Both copy stages at once, on independent tensors and with no compute: what the copy
    // engines and the bus give when the two directions share them (not part of the ideal).
    let both_ways = || {
        vm.run(|b| -> Result<()> {
            for ((h, d), (other, out)) in hosts.iter().zip(&devs).zip(others.iter().zip(&outs)) {
                b.call_into(copy, &[h], &[d], Attrs::default(), h2d)?;
                b.call_into(copy, &[other], &[out], Attrs::default(), d2h)?;
            }
            Ok(())
        })?;
        vm.sync()
    };
    let mut runs: [Stage<'_>; 5] = [
        (&h2d_only, Vec::new()),
        (&compute_only, Vec::new()),
        (&d2h_only, Vec::new()),
        (&both_ways, Vec::new()),
        (&pipelined, Vec::new()),
    ];
    for (f, _) in &runs {
        f()?; // warm-up
    }
    for _ in 0..ROUNDS {
        for (f, times) in &mut runs {
            times.push(timed(f)?.wall);
        }
    }
    let mut med = runs.map(|(_, mut t)| {
        t.sort();
        t[t.len() / 2]
    });
    let (both_ways, pipelined) = (med[3], med[4]);
    med[3] = Duration::ZERO;
    med[4] = Duration::ZERO;
    let ideal = med.into_iter().max().unwrap_or_default();
    let ratio = Ratio {
        vm: pipelined,
        reference: ideal,
        ratio: ideal.as_secs_f64() / pipelined.as_secs_f64(),
        cpu: None,
        roles: None,
        reference_roles: None,
    };
    Ok((ratio, both_ways))
}

fn mlp(vm: &VirtualMachine, gpu: DeviceId, steps: usize, w: usize) -> Result<Ratio> {
    let s = vm.compute_stream(gpu)?;
    let (matmul, relu, sum) = (vm.op("matmul")?, vm.op("relu")?, vm.op("sum")?);
    let init: Vec<f32> = (0..w * w).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let x = vm.from_slice(&init, &[w, w], gpu)?;
    let w1 = vm.from_slice(&init, &[w, w], gpu)?;
    let w2 = vm.from_slice(&init, &[w, w], gpu)?;
    vm.sync()?;
    let through_vm = || {
        vm.run(|b| -> Result<()> {
            for _ in 0..steps {
                let h = b.call(matmul, &[&x, &w1], Attrs::default(), s)?;
                let r = b.call(relu, &[&h], Attrs::default(), s)?;
                let y = b.call(matmul, &[&r, &w2], Attrs::default(), s)?;
                b.call(sum, &[&y], Attrs::default(), s)?;
            }
            Ok(())
        })?;
        vm.sync()
    };
    let (through_vm, plain) = compare(through_vm, || plain::mlp(gpu, steps, w))?;
    Ok(Ratio::slower(through_vm, plain))
}

/// The reference loops: the same kernels, called directly inside one launch on one stream,
/// with no VM in between.
#[cfg(feature = "cuda")]
mod plain {
    use std::sync::Arc;

    use super::*;
    use crate::alloc::{HostAllocator, Storage};
    use crate::ep::Device;
    use crate::framework::{KernelCtx, OpKernel, TensorMeta, TensorView, TensorViewMut};
    use crate::kernels::cuda::{CudaSum, CUDA_MATMUL, ELEMENTWISE};
    use crate::vm::Error;

    fn kernel(name: &str) -> &'static dyn OpKernel {
        ELEMENTWISE.iter().find(|e| e.name == name).expect("a built-in elementwise op")
    }

    fn run1(
        k: &dyn OpKernel,
        attrs: Attrs,
        ins: &[(&TensorMeta, &Storage)],
        out: (&TensorMeta, &mut Storage),
    ) -> std::result::Result<(), String> {
        let inputs: Vec<TensorView<'_>> = ins.iter().map(|(meta, data)| TensorView { meta, data }).collect();
        let mut outputs = [TensorViewMut { meta: out.0, data: out.1 }];
        k.compute(&mut KernelCtx { attrs, inputs: &inputs, outputs: &mut outputs })
    }

    /// A device, one stream on it, and an allocator of its memory.
    type Setup = (Arc<dyn Device>, Arc<dyn crate::ep::Stream>, Arc<HostAllocator>);

    fn setup(gpu: DeviceId) -> Result<Setup> {
        let dev = crate::ep::cuda::open(gpu.index)?;
        let stream = dev.create_stream(StreamType::Compute)?;
        let alloc = HostAllocator::with_device_memory("bench", dev.memory());
        Ok((dev, stream, alloc))
    }

    fn kernel_err(e: String) -> Error {
        Error::Kernel { instr: 0, op: "bench".into(), stream: "plain".into(), message: e }
    }

    pub(super) fn chain(gpu: DeviceId, n: usize) -> Result<()> {
        let (_dev, stream, alloc) = setup(gpu)?;
        let meta = TensorMeta::new(&[1], DType::F32, gpu);
        let mut a = alloc.alloc_for(gpu, 4)?;
        let mut b = alloc.alloc_for(gpu, 4)?;
        let scale = kernel("scale");
        let result = Arc::new(parking_lot::Mutex::new(Ok(())));
        let r = result.clone();
        let mut go = move || -> std::result::Result<(), String> {
            run1(kernel("fill"), Attrs::scalar(1.0), &[], (&meta, &mut a))?;
            for _ in 0..n {
                run1(scale, Attrs::scalar(1.0), &[(&meta, &a)], (&meta, &mut b))?;
                std::mem::swap(&mut a, &mut b);
            }
            Ok(())
        };
        stream.launch(Box::new(move || *r.lock() = go()))?;
        stream.synchronize()?;
        let r = std::mem::replace(&mut *result.lock(), Ok(()));
        r.map_err(kernel_err)
    }

    pub(super) fn mlp(gpu: DeviceId, steps: usize, w: usize) -> Result<()> {
        let (_dev, stream, alloc) = setup(gpu)?;
        let m = TensorMeta::new(&[w, w], DType::F32, gpu);
        let scalar = TensorMeta::new(&[], DType::F32, gpu);
        let bytes = w * w * 4;
        let mut t: Vec<Storage> =
            (0..6).map(|_| alloc.alloc_for(gpu, bytes)).collect::<std::result::Result<_, _>>()?;
        let result = Arc::new(parking_lot::Mutex::new(Ok(())));
        let r = result.clone();
        let mut go = move || -> std::result::Result<(), String> {
            let [x, w1, w2, h, y, s] = &mut t[..] else { unreachable!("six buffers") };
            for buf in [&mut *x, &mut *w1, &mut *w2] {
                run1(kernel("fill"), Attrs::scalar(0.01), &[], (&m, buf))?;
            }
            for _ in 0..steps {
                run1(&CUDA_MATMUL, Attrs::default(), &[(&m, x), (&m, w1)], (&m, h))?;
                run1(kernel("relu"), Attrs::default(), &[(&m, h)], (&m, y))?;
                run1(&CUDA_MATMUL, Attrs::default(), &[(&m, y), (&m, w2)], (&m, h))?;
                run1(&CudaSum, Attrs::default(), &[(&m, h)], (&scalar, s))?;
            }
            Ok(())
        };
        stream.launch(Box::new(move || *r.lock() = go()))?;
        stream.synchronize()?;
        let r = std::mem::replace(&mut *result.lock(), Ok(()));
        r.map_err(kernel_err)
    }
}

/// Without the `cuda` feature `run` skips before calling these.
#[cfg(not(feature = "cuda"))]
mod plain {
    use super::*;

    pub(super) fn chain(gpu: DeviceId, _n: usize) -> Result<()> {
        Err(crate::ep::cuda::available(gpu.index).expect_err("no cuda feature").into())
    }

    pub(super) fn mlp(gpu: DeviceId, _steps: usize, _w: usize) -> Result<()> {
        chain(gpu, 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn without_a_gpu_the_report_says_why() {
        let opts = CudaBenchOptions { chain: 10, chunks: 2, chunk_elems: 16, rounds: 1, steps: 1, width: 4 };
        let r = run(&opts, &Config::default()).unwrap();
        match crate::ep::cuda::available(0) {
            Err(e) => {
                assert_eq!(r.skipped, Some(e.to_string()));
                assert!(r.to_string().starts_with("cuda benchmarks skipped: cuda:0 is not available"));
                let json = r.to_json();
                assert_eq!(json["skipped"], serde_json::json!(e.to_string()));
                assert!(json["overhead"].is_null() && json["mlp_steps"] == serde_json::json!([]));
            }
            Ok(()) => {
                assert!(r.skipped.is_none());
                assert!(
                    r.overhead.is_some() && r.eager_chain.is_some() && r.overlap.is_some() && r.mlp.is_some()
                );
                assert_eq!(r.mlp_steps.len(), 2);
                assert!(r.mlp_steps.iter().all(|m| m.last_loss.is_finite() && m.step_us > 0.0));
            }
        }
    }
}
