//! The CUDA backend. The tests that need a GPU are `#[ignore = "needs a GPU"]`: a plain
//! `cargo test` lists them as ignored, and
//! `cargo test --release --test integration cuda:: -- --ignored` runs them where there is
//! one (each fails, naming the reason, where there is none). The paths that need no GPU
//! (the typed absent-driver error, the CPU paths beside it, the benchmark's report of why
//! it cannot run) always run. The caching allocator's bookkeeping is tested on host memory
//! in `src/ep/memory/caching.rs`; the generated kernel source compiles with NVRTC in a unit
//! test of `kernels::cuda` (`#[ignore = "needs libnvrtc"]`).
//!
//! `kernels` holds every op on every dtype and layout against `reference`, a host
//! implementation of the ops' rules, and against the CPU kernels wherever the CPU takes
//! the same call. `reduce` holds the reductions along dims and the ops along one dimension
//! (`softmax`, `layer_norm`, the scans) against the CPU kernels; `nn` the batched products,
//! convolution, pooling, `nll_loss` and attention; `pointwise` the pointwise ops of two and
//! three inputs and the indexing ops; `errors` the errors that depend on data (an index
//! out of range), which fail the call as on the CPU.

mod errors;
mod kernels;
mod nn;
mod pointwise;
mod reduce;
mod reference;

use std::sync::Mutex;

use eagervm::ep::cuda::{CudaUnavailable, ENV_DRIVER_LIB};
use eagervm::ep::EpError;
use eagervm::prelude::*;

/// The tests here that use the GPU run one at a time.
static GPU: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    GPU.lock().unwrap_or_else(|p| p.into_inner())
}

/// A VM with `cuda:0`; the tests that call it are ignored unless asked for, and then fail
/// where there is no GPU, saying why.
fn gpu_vm() -> VirtualMachine {
    match VirtualMachine::new(Config::default().with_cuda_devices(1)) {
        Ok(vm) => vm,
        Err(e) => panic!("this test needs a GPU (cuda:0): {e}"),
    }
}

/// A driver library that exists nowhere.
const NO_DRIVER: &str = "libeagervm-no-such-driver.so.1";

/// Run in a child process whose environment names a driver library that does not exist
/// (changing this process's environment would reach the other tests that open `cuda:0`).
#[test]
fn absent_driver_is_a_typed_error_and_cpu_paths_run() {
    let name = "absent_driver_is_a_typed_error_and_cpu_paths_run";
    if !crate::common::alone(module_path!(), name, &[(ENV_DRIVER_LIB, NO_DRIVER)]) {
        return;
    }
    assert_eq!(std::env::var(ENV_DRIVER_LIB).as_deref(), Ok(NO_DRIVER));
    let r = VirtualMachine::new(Config::default().with_cuda_devices(1));
    match r {
        Err(Error::Device(EpError::CudaUnavailable { device, reason })) => {
            assert_eq!(device, DeviceId::cuda(0));
            assert!(
                matches!(reason, CudaUnavailable::DriverMissing { .. } | CudaUnavailable::NotBuilt),
                "{reason:?}"
            );
        }
        Err(e) => panic!("expected CudaUnavailable, got {e}"),
        Ok(_) => panic!("a VM with cuda:0 opened although the driver library does not exist"),
    }
    // The CPU paths are untouched: a VM without CUDA devices runs as always.
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[1.0f32, -2.0], &[2], DeviceId::CPU).unwrap();
    let relu = vm.op("relu").unwrap();
    let y = vm.run(|b| b.call(relu, &[&x], Attrs::default(), cpu)).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
    // Asking for a tensor or a stream on a CUDA device the VM does not have is an error,
    // not a panic, and it says what `VirtualMachine::new` would have said: the driver
    // library is missing.
    let why = vm.empty(&[2], DType::F32, DeviceId::cuda(0)).unwrap_err().to_string();
    assert!(why.contains(NO_DRIVER) || why.contains("no CUDA backend"), "{why}");
    let why = vm.compute_stream(DeviceId::cuda(0)).unwrap_err().to_string();
    assert!(why.contains(NO_DRIVER) || why.contains("no CUDA backend"), "{why}");
}

#[test]
fn a_device_the_vm_did_not_open_is_refused_saying_why() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(2, Default::default())).unwrap();
    let why = |d: DeviceId| vm.empty(&[2], DType::F32, d).unwrap_err().to_string();
    let mock = why(DeviceId::mock(3));
    assert!(mock.contains("this VM opened 2 mock device(s): mock:0, mock:1"), "{mock}");
    assert!(mock.contains("mock_devices"), "{mock}");
    // A CUDA device: what the machine lacks, if it cannot have one; otherwise how to ask.
    let cuda = why(DeviceId::cuda(0));
    match eagervm::ep::cuda::probe() {
        Err(lacks) => assert!(cuda.ends_with(&format!("is not available: {lacks}")), "{cuda}"),
        Ok(()) => {
            assert!(cuda.contains("this VM opened no cuda device") && cuda.contains("cuda_devices"), "{cuda}")
        }
    }
    assert!(why(DeviceId { ty: eagervm::ep::DeviceType::Cpu, index: 1 }).contains("the host is cpu:0"));
}

#[test]
fn device_strings_name_cuda() {
    assert_eq!("cuda:1".parse::<DeviceId>().unwrap(), DeviceId::cuda(1));
    assert_eq!(DeviceId::cuda(2).to_string(), "cuda:2");
    assert!(!DeviceId::cuda(0).is_host());
}

/// Inputs with negatives, zeros, -0.0 and a spread of magnitudes.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut x = seed.wrapping_mul(2654435761).max(1);
    (0..n)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            match i % 11 {
                0 => 0.0,
                1 => -0.0,
                _ => (x % 2001) as f32 / 100.0 - 10.0,
            }
        })
        .collect()
}

/// Run `op` on the CPU and on `cuda:0`, return both results.
fn both(
    vm: &VirtualMachine,
    op: &str,
    inputs: &[(Vec<f32>, Vec<usize>)],
    attrs: Attrs,
) -> (Vec<f32>, Vec<f32>) {
    let op = vm.op(op).unwrap();
    let mut out = Vec::new();
    for dev in [DeviceId::CPU, DeviceId::cuda(0)] {
        let s = vm.compute_stream(dev).unwrap();
        let ts: Vec<Tensor> = inputs.iter().map(|(d, shape)| vm.from_slice(d, shape, dev).unwrap()).collect();
        let refs: Vec<&Tensor> = ts.iter().collect();
        let y = vm.run(|b| b.call(op, &refs, attrs, s)).unwrap();
        out.push(y.to_vec::<f32>().unwrap());
    }
    let gpu = out.pop().unwrap();
    (out.pop().unwrap(), gpu)
}

#[test]
#[ignore = "needs a GPU"]
fn kernels_equal_the_cpu_kernels() {
    let _g = lock();
    let vm = gpu_vm();
    let n = 10_003;
    let (a, b) = (data(n, 1), data(n, 2));
    // Elementwise ops: bit-for-bit.
    for (op, ins, attrs) in [
        ("add", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        ("mul", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        ("scale", vec![(a.clone(), vec![n])], Attrs::scalar(-1.5)),
        ("relu", vec![(a.clone(), vec![n])], Attrs::default()),
        ("copy", vec![(a.clone(), vec![n])], Attrs::default()),
        ("sub", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        // dy = a, x = b: zeros, -0.0 and negatives in x select 0.
        ("relu_grad", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        // [n / 7, 7]: 10_003 = 1429 * 7.
        ("add_bias", vec![(a.clone(), vec![1429, 7]), (b[..7].to_vec(), vec![7])], Attrs::default()),
        // Column sums in increasing row order, as on the CPU: bit-for-bit too.
        ("sum_rows", vec![(a.clone(), vec![1429, 7])], Attrs::default()),
        ("sum_rows", vec![(a.clone(), vec![7, 1429])], Attrs::default()),
        ("sum_rows", vec![(Vec::new(), vec![0, 5])], Attrs::default()),
    ] {
        let (cpu, gpu) = both(&vm, op, &ins, attrs);
        let same = cpu.iter().zip(&gpu).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{op}: GPU result differs from the CPU's");
    }
    // fill
    let fill = vm.op("fill").unwrap();
    let t = vm.empty(&[5], DType::F32, DeviceId::cuda(0)).unwrap();
    let s = vm.compute_stream(DeviceId::cuda(0)).unwrap();
    vm.run(|b| b.call_into(fill, &[], &[&t], Attrs::scalar(2.5), s)).unwrap();
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![2.5; 5]);
    // sum: |gpu - cpu| <= 1e-5 * sum |x|.
    let (cpu, gpu) = both(&vm, "sum", &[(a.clone(), vec![n])], Attrs::default());
    let bound = 1e-5 * a.iter().map(|x| x.abs()).sum::<f32>();
    assert!((cpu[0] - gpu[0]).abs() <= bound, "sum: cpu {} gpu {}", cpu[0], gpu[0]);
    // matmul: |gpu - cpu| <= 1e-5 * sum_k |a_ik b_kj| per element.
    let (m, k, nn) = (37, 53, 29);
    let (ma, mb) = (data(m * k, 3), data(k * nn, 4));
    let (cpu, gpu) =
        both(&vm, "matmul", &[(ma.clone(), vec![m, k]), (mb.clone(), vec![k, nn])], Attrs::default());
    for i in 0..m {
        for j in 0..nn {
            let mag: f32 = (0..k).map(|p| (ma[i * k + p] * mb[p * nn + j]).abs()).sum();
            let (c, g) = (cpu[i * nn + j], gpu[i * nn + j]);
            assert!((c - g).abs() <= 1e-5 * mag + f32::MIN_POSITIVE, "matmul[{i},{j}]: cpu {c} gpu {g}");
        }
    }
    // matmul_tn (a: [k, m]) and matmul_nt (b: [n, k]): the same tolerance; a wrong
    // transpose flag or leading dimension would be far off.
    for (op, sa, sb) in [("matmul_tn", vec![k, m], vec![k, nn]), ("matmul_nt", vec![m, k], vec![nn, k])] {
        let (ma, mb) = (data(m * k, 5), data(k * nn, 6));
        let (cpu, gpu) = both(&vm, op, &[(ma.clone(), sa), (mb.clone(), sb)], Attrs::default());
        assert_eq!(gpu.len(), m * nn, "{op}");
        for i in 0..m {
            for j in 0..nn {
                let term = |p: usize| {
                    if op == "matmul_tn" {
                        ma[p * m + i] * mb[p * nn + j]
                    } else {
                        ma[i * k + p] * mb[j * k + p]
                    }
                };
                let mag: f32 = (0..k).map(|p| term(p).abs()).sum();
                let (c, g) = (cpu[i * nn + j], gpu[i * nn + j]);
                assert!((c - g).abs() <= 1e-5 * mag + f32::MIN_POSITIVE, "{op}[{i},{j}]: cpu {c} gpu {g}");
            }
        }
    }
    // An empty inner dimension gives zeros.
    for (op, sa, sb) in [("matmul_tn", vec![0, 3], vec![0, 2]), ("matmul_nt", vec![3, 0], vec![2, 0])] {
        let (cpu, gpu) = both(&vm, op, &[(Vec::new(), sa), (Vec::new(), sb)], Attrs::default());
        assert_eq!((cpu, gpu), (vec![0.0; 6], vec![0.0; 6]), "{op}");
    }
    vm.sync().unwrap();
}

/// Relative tolerance of the MLP's losses on CUDA against the CPU's, at every step. Each
/// step's cuBLAS products and `sum` differ from the CPU's by about 1e-6 relative (far
/// inside `docs/cuda.md`'s 1e-5 bounds); 60 steps of SGD on this contracting problem keep
/// the weights within a few times that, so 1e-3 leaves a wide margin, while a wrong
/// gradient (a transposed product, a lost bias gradient) moves the losses by far more.
const MLP_LOSS_REL: f32 = 1e-3;

#[test]
#[ignore = "needs a GPU"]
fn mlp_trains_on_cuda_like_on_the_cpu() {
    let _g = lock();
    let vm = gpu_vm();
    let opts = eagervm::programs::MlpOptions::default();
    let cpu = eagervm::programs::mlp(&vm, &opts).unwrap();
    let gpu =
        eagervm::programs::mlp(&vm, &eagervm::programs::MlpOptions { device: DeviceId::cuda(0), ..opts })
            .unwrap();
    assert_eq!(gpu.device, "cuda:0");
    assert_eq!(gpu.losses.len(), cpu.losses.len());
    assert!(gpu.loss_fell(), "{gpu}: {:?}", gpu.losses);
    for (step, (c, g)) in cpu.losses.iter().zip(&gpu.losses).enumerate() {
        assert!((c - g).abs() <= MLP_LOSS_REL * c.abs(), "step {step}: cpu loss {c}, cuda loss {g}");
    }
    vm.sync().unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn builtin_programs_run_on_cuda() {
    let _g = lock();
    let vm = gpu_vm();
    let on_gpu = eagervm::programs::RunOptions { device: Some(DeviceId::cuda(0)), size: None };
    for p in eagervm::programs::builtin() {
        let r = (p.run)(&vm, &on_gpu).unwrap_or_else(|e| panic!("{} on cuda:0: {e}", p.name));
        assert!(r.ok(), "{} on cuda:0: {r}", p.name);
        assert!(r.to_json().contains("\"device\":\"cuda:0\""), "{}", r.to_json());
        // Deterministic on the GPU too: fixed summation orders, one cuBLAS handle per stream.
        assert_eq!((p.run)(&vm, &on_gpu).unwrap(), r, "{}", p.name);
    }
    // The failure program's poison left the VM working.
    let x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::cuda(0)).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
#[ignore = "needs a GPU"]
fn cross_stream_program_matches_sequential_result() {
    let _g = lock();
    let vm = gpu_vm();
    let gpu = DeviceId::cuda(0);
    let (c, h2d, d2h) = (
        vm.compute_stream(gpu).unwrap(),
        vm.stream(gpu, StreamType::H2D).unwrap(),
        vm.stream(gpu, StreamType::D2H).unwrap(),
    );
    let (copy, add, scale) = (vm.op("copy").unwrap(), vm.op("add").unwrap(), vm.op("scale").unwrap());
    // Reuse tensors and streams so that every soft-sync edge (h2d → compute → d2h, and
    // host reads in between) and stream-ordered reuse of freed blocks is exercised.
    let n = 1 << 16;
    let mut expect = vec![1.0f32; n];
    let mut x = vm.from_slice(&expect, &[n], gpu).unwrap();
    let host = vm.empty(&[n], DType::F32, DeviceId::CPU).unwrap();
    for round in 0..50 {
        let inc: Vec<f32> = (0..n).map(|i| ((i + round) % 5) as f32).collect();
        let src = vm.from_slice(&inc, &[n], DeviceId::CPU).unwrap();
        x = vm
            .run(|b| -> Result<Tensor> {
                let d = b.call(copy, &[&src], Attrs::default(), h2d)?;
                let sum = b.call(add, &[&x, &d], Attrs::default(), c)?;
                let y = b.call(scale, &[&sum], Attrs::scalar(0.5), c)?;
                b.call_into(copy, &[&y], &[&host], Attrs::default(), d2h)?;
                Ok(y)
            })
            .unwrap();
        for (e, i) in expect.iter_mut().zip(&inc) {
            *e = (*e + i) * 0.5;
        }
        if round % 10 == 9 {
            assert_eq!(host.to_vec::<f32>().unwrap(), expect, "round {round}");
        }
    }
    vm.sync().unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn out_of_memory_fails_the_instruction_and_the_vm_goes_on() {
    let _g = lock();
    // The size cap (half the host's memory by default) would refuse 4 TiB before anything
    // ran: raised to its largest, so that the device's allocator is what refuses.
    let mut config = Config::default().with_cuda_devices(1);
    config.max_tensor_bytes = eagervm::vm::bounds::MAX_TENSOR_BYTES;
    let vm = VirtualMachine::new(config).unwrap_or_else(|e| panic!("this test needs a GPU (cuda:0): {e}"));
    let gpu = DeviceId::cuda(0);
    let s = vm.compute_stream(gpu).unwrap();
    let fill = vm.op("fill").unwrap();
    // 2^40 floats: no GPU has 4 TiB.
    let huge = vm.empty(&[1 << 40], DType::F32, gpu).unwrap();
    vm.run(|b| b.call_into(fill, &[], &[&huge], Attrs::scalar(1.0), s)).unwrap();
    match huge.wait() {
        Err(Error::Alloc { source: EpError::OutOfMemory { device, .. }, op, .. }) => {
            assert_eq!(device, gpu);
            assert_eq!(op, "fill");
        }
        other => panic!("expected an out-of-memory error, got {other:?}"),
    }
    assert!(matches!(vm.sync(), Err(Error::Failed { .. })));
    // The VM keeps running.
    let x = vm.from_slice(&[3.0f32], &[1], gpu).unwrap();
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![3.0]);
}

#[test]
#[cfg(feature = "cli")] // `eagervm::bench` is the command line's, built with `cli`
fn benchmarks_report_or_skip() {
    let _g = lock();
    let opts = eagervm::bench::cuda::CudaBenchOptions {
        chain: 1000,
        chunks: 4,
        chunk_elems: 1 << 12,
        rounds: 2,
        steps: 4,
        width: 64,
    };
    let r = eagervm::bench::cuda::run(&opts, &Config::default()).unwrap();
    println!("{r}");
    if let Some(why) = &r.skipped {
        println!("skipped: {why}");
        assert!(eagervm::ep::cuda::available(0).is_err());
    } else {
        for ratio in [r.overhead, r.eager_chain, r.overlap, r.mlp] {
            assert!(ratio.is_some_and(|x| x.ratio.is_finite() && x.ratio > 0.0));
        }
    }
}

/// A CUDA tensor that nothing wrote reads as a host tensor does (`errors` checks
/// the CPU and the mock device): `wait` passes, `to_vec` reports it uninitialized by the
/// access, and neither counts for `sync`.
#[test]
#[ignore = "needs a GPU"]
fn a_cuda_tensor_nothing_wrote_reads_as_a_host_tensor_does() {
    let vm = gpu_vm();
    let t = vm.empty(&[2], DType::F32, DeviceId::cuda(0)).unwrap();
    assert_eq!(t.wait(), Ok(()));
    match t.to_vec::<f32>() {
        Err(Error::Uninitialized { op, tensor, .. }) => assert_eq!((op.as_str(), tensor), ("Access", t.id())),
        other => panic!("expected Uninitialized, got {other:?}"),
    }
    assert_eq!(vm.sync(), Ok(()));
}

/// Device memory that another library owns (a DLPack import, `docs/python.md`), wrapped
/// with `from_device_memory`: the VM reads and writes it in place, gives it back once (its
/// owner dropped behind the `Release`) and refuses an address that is not device memory
/// or not aligned, dropping the owner.
#[cfg(feature = "cuda")]
#[test]
#[ignore = "needs a GPU"]
fn foreign_device_memory_is_used_in_place_and_given_back_once() {
    use cudarc::driver::sys;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    /// Counts its drops; makes no CUDA call (it may be dropped in a host function).
    struct Owner(Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }
    let _g = lock();
    let vm = gpu_vm();
    let ctx = cudarc::driver::CudaContext::new(0).unwrap();
    ctx.bind_to_thread().unwrap();
    let mut ptr: sys::CUdeviceptr = 0;
    // SAFETY: a valid out-pointer; the context is current.
    unsafe { sys::cuMemAlloc_v2(&mut ptr, 64) }.result().unwrap();
    let drops = Arc::new(AtomicUsize::new(0));
    let (cuda, s) = (DeviceId::cuda(0), vm.compute_stream(DeviceId::cuda(0)).unwrap());
    // SAFETY: 64 bytes of device memory of cuda:0, freed below after the owner dropped;
    // nothing else touches them meanwhile.
    let t = unsafe { vm.from_device_memory(ptr, &[4], DType::F32, cuda, Box::new(Owner(drops.clone()))) }
        .unwrap();
    let host = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[4], DeviceId::CPU).unwrap();
    let (copy, relu) = (vm.op("copy").unwrap(), vm.op("relu").unwrap());
    let h2d = vm.stream(cuda, StreamType::H2D).unwrap();
    let y = vm
        .run(|b| {
            b.call_into(copy, &[&host], &[&t], Attrs::default(), h2d)?;
            b.call(relu, &[&t], Attrs::default(), s)
        })
        .unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0, 0.0]);
    vm.sync().unwrap();
    let mut back = [0f32; 4];
    // SAFETY: 16 bytes into a 16-byte buffer; the VM's writes are done (`sync`).
    unsafe { sys::cuMemcpyDtoH_v2(back.as_mut_ptr().cast(), ptr, 16) }.result().unwrap();
    assert_eq!(back, [1.0, -2.0, 3.0, -4.0], "written in place");
    drop(t);
    vm.sync().unwrap();
    assert_eq!(drops.load(Ordering::SeqCst), 1, "given back once, after the release");
    // Refusals drop the owner at once.
    let on_host = Box::new([0u64; 2]);
    let bad = on_host.as_ptr() as u64;
    // SAFETY: refused before use (not device memory).
    let e = unsafe { vm.from_device_memory(bad, &[4], DType::F32, cuda, Box::new(Owner(drops.clone()))) };
    assert!(
        matches!(&e, Err(Error::Device(_)) if e.as_ref().unwrap_err().to_string().contains("not device memory")),
        "{e:?}"
    );
    // SAFETY: refused before use (misaligned).
    let e = unsafe { vm.from_device_memory(ptr + 4, &[2], DType::F32, cuda, Box::new(Owner(drops.clone()))) };
    assert!(matches!(e, Err(Error::Access { .. })), "{e:?}");
    // SAFETY: refused before use (not a CUDA device).
    let e = unsafe {
        vm.from_device_memory(ptr, &[2], DType::F32, DeviceId::CPU, Box::new(Owner(drops.clone())))
    };
    assert!(matches!(e, Err(Error::Device(_))), "{e:?}");
    assert_eq!(drops.load(Ordering::SeqCst), 4);
    ctx.bind_to_thread().unwrap();
    // SAFETY: allocated above; the VM gave it back and nothing uses it.
    unsafe { sys::cuMemFree_v2(ptr) }.result().unwrap();
}
