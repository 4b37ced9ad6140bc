//! GPU benchmarks: what the VM costs over a plain loop on one CUDA stream, and how well it
//! overlaps copies with compute.
//!
//! - **(a) overhead**: a chain of `n` tiny `scale` kernels (one element) through the VM,
//!   against the same kernels launched in a plain loop on one stream; reported as the ratio
//!   of host time per kernel (target ≤ 1.10).
//! - **(b) overlap**: `chunks` chunks, each copied in on the H2D stream, scaled `rounds`
//!   times on the compute stream and copied out on the D2H stream, all through the VM;
//!   reported as ideal / measured, where ideal is the time of the busiest of the three
//!   stages run alone (target ≥ 0.9).
//! - **(c) MLP step**: `x·W1 → relu → ·W2 → sum`, `steps` times, through the VM against a
//!   plain loop of the same kernels on one stream.
//!
//! Without a usable GPU, [`run`] returns a report whose `skipped` says why.

use std::time::{Duration, Instant};

use crate::ep::{DeviceId, StreamType};
use crate::error::Result;
use crate::framework::{Attrs, DType, Tensor};
use crate::vm::{Config, VirtualMachine};

/// Sizes of the three benchmarks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CudaBenchOptions {
    /// Kernels in the overhead chain (a).
    pub chain: usize,
    /// Chunks in the overlap pipeline (b).
    pub chunks: usize,
    /// `f32` elements per chunk.
    pub chunk_elems: usize,
    /// Compute kernels per chunk.
    pub rounds: usize,
    /// MLP steps (c).
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
    /// Time through the VM.
    pub vm: Duration,
    /// Time of the reference (plain loop, or ideal overlap).
    pub reference: Duration,
    /// The reported ratio (see the module docs for each benchmark's direction).
    pub ratio: f64,
}

/// The results, or why there are none.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaBenchReport {
    /// Why nothing ran (no GPU, no driver, no `cuda` feature), if so.
    pub skipped: Option<String>,
    /// (a): VM time per kernel / plain time per kernel.
    pub overhead: Option<Ratio>,
    /// (b): ideal overlapped time / VM time.
    pub overlap: Option<Ratio>,
    /// (c): VM time / plain time.
    pub mlp: Option<Ratio>,
}

impl std::fmt::Display for CudaBenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "cuda benchmarks skipped: {why}");
        }
        let line = |f: &mut std::fmt::Formatter<'_>, name: &str, r: &Option<Ratio>, target: &str| match r {
            Some(r) => writeln!(
                f,
                "{name:<10} vm {:>10.3?}  reference {:>10.3?}  ratio {:.3} (target {target})",
                r.vm, r.reference, r.ratio
            ),
            None => writeln!(f, "{name:<10} not run"),
        };
        line(f, "overhead", &self.overhead, "<= 1.10")?;
        line(f, "overlap", &self.overlap, ">= 0.90")?;
        line(f, "mlp", &self.mlp, "<= 1.10")
    }
}

/// Run the three benchmarks on `cuda:0`, or report why they were skipped.
pub fn run(opts: &CudaBenchOptions) -> Result<CudaBenchReport> {
    let skipped =
        |why: String| CudaBenchReport { skipped: Some(why), overhead: None, overlap: None, mlp: None };
    if let Err(e) = crate::ep::cuda::available(0) {
        return Ok(skipped(e.to_string()));
    }
    let vm = VirtualMachine::new(Config::default().with_cuda_devices(1))?;
    let gpu = DeviceId::cuda(0);
    Ok(CudaBenchReport {
        skipped: None,
        overhead: Some(overhead(&vm, gpu, opts.chain)?),
        overlap: Some(overlap(&vm, gpu, opts)?),
        mlp: Some(mlp(&vm, gpu, opts.steps, opts.width)?),
    })
}

/// Time `f`, after one warm-up call.
fn timed(mut f: impl FnMut() -> Result<()>) -> Result<Duration> {
    f()?;
    let t = Instant::now();
    f()?;
    Ok(t.elapsed())
}

fn overhead(vm: &VirtualMachine, gpu: DeviceId, n: usize) -> Result<Ratio> {
    let s = vm.compute_stream(gpu)?;
    let scale = vm.op("scale")?;
    let x0 = vm.from_slice(&[1.0f32], &[1], gpu)?;
    vm.sync()?;
    let through_vm = timed(|| {
        let mut x = x0.clone();
        vm.run(|b| -> Result<()> {
            for _ in 0..n {
                x = b.call(scale, &[&x], Attrs::scalar(1.0), s)?;
            }
            Ok(())
        })?;
        drop(x);
        vm.sync()
    })?;
    let plain = timed(|| plain::chain(gpu, n))?;
    Ok(Ratio { vm: through_vm, reference: plain, ratio: through_vm.as_secs_f64() / plain.as_secs_f64() })
}

fn overlap(vm: &VirtualMachine, gpu: DeviceId, o: &CudaBenchOptions) -> Result<Ratio> {
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
    vm.sync()?;
    // Each stage alone, every chunk: the stage's total time.
    let h2d_only = timed(|| {
        vm.run(|b| {
            hosts
                .iter()
                .zip(&devs)
                .try_for_each(|(h, d)| b.call_into(copy, &[h], &[d], Attrs::default(), h2d))
        })?;
        vm.sync()
    })?;
    let compute_only = timed(|| {
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
    })?;
    let d2h_only = timed(|| {
        vm.run(|b| {
            devs.iter().zip(&outs).try_for_each(|(d, h)| b.call_into(copy, &[d], &[h], Attrs::default(), d2h))
        })?;
        vm.sync()
    })?;
    let ideal = h2d_only.max(compute_only).max(d2h_only);
    let pipelined = timed(|| {
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
    })?;
    Ok(Ratio { vm: pipelined, reference: ideal, ratio: ideal.as_secs_f64() / pipelined.as_secs_f64() })
}

fn mlp(vm: &VirtualMachine, gpu: DeviceId, steps: usize, w: usize) -> Result<Ratio> {
    let s = vm.compute_stream(gpu)?;
    let (matmul, relu, sum) = (vm.op("matmul")?, vm.op("relu")?, vm.op("sum")?);
    let init: Vec<f32> = (0..w * w).map(|i| ((i % 7) as f32 - 3.0) * 0.01).collect();
    let x = vm.from_slice(&init, &[w, w], gpu)?;
    let w1 = vm.from_slice(&init, &[w, w], gpu)?;
    let w2 = vm.from_slice(&init, &[w, w], gpu)?;
    vm.sync()?;
    let through_vm = timed(|| {
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
    })?;
    let plain = timed(|| plain::mlp(gpu, steps, w))?;
    Ok(Ratio { vm: through_vm, reference: plain, ratio: through_vm.as_secs_f64() / plain.as_secs_f64() })
}

/// The reference loops: the same kernels, called directly inside one launch on one stream,
/// with no VM in between.
#[cfg(feature = "cuda")]
mod plain {
    use std::sync::Arc;

    use super::*;
    use crate::alloc::{HostAllocator, Storage};
    use crate::ep::Device;
    use crate::error::Error;
    use crate::framework::{KernelCtx, OpKernel, TensorMeta, TensorView, TensorViewMut};
    use crate::kernels::cuda::{CudaSum, CUDA_MATMUL, ELEMENTWISE};

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
        let r =
            run(&CudaBenchOptions { chain: 10, chunks: 2, chunk_elems: 16, rounds: 1, steps: 1, width: 4 })
                .unwrap();
        match crate::ep::cuda::available(0) {
            Err(e) => {
                assert_eq!(r.skipped, Some(e.to_string()));
                assert!(r.to_string().starts_with("cuda benchmarks skipped: cuda:0 is not available"));
            }
            Ok(()) => {
                assert!(r.skipped.is_none());
                assert!(r.overhead.is_some() && r.overlap.is_some() && r.mlp.is_some());
            }
        }
    }
}
