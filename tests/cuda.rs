//! The CUDA backend. Without a usable GPU (no `cuda` feature, no driver, no device) each GPU
//! test prints `skipped: <reason>` and returns; the paths that need no GPU (the typed
//! absent-driver error, the CPU paths beside it) always run. The caching allocator's
//! bookkeeping is tested on host memory in `src/alloc/device.rs`.

use std::sync::Mutex;

use eagervm::ep::cuda::{CudaUnavailable, ENV_DRIVER_LIB};
use eagervm::ep::EpError;
use eagervm::prelude::*;

/// Tests here change the driver-library variable; they run one at a time.
static ENV: Mutex<()> = Mutex::new(());

fn lock() -> std::sync::MutexGuard<'static, ()> {
    ENV.lock().unwrap_or_else(|p| p.into_inner())
}

/// A VM with `cuda:0`, or `None` after printing why not.
fn gpu_vm() -> Option<VirtualMachine> {
    match VirtualMachine::new(Config::default().with_cuda_devices(1)) {
        Ok(vm) => Some(vm),
        Err(Error::Device(e @ EpError::CudaUnavailable { .. })) => {
            println!("skipped: {e}");
            None
        }
        Err(e) => panic!("unexpected error opening cuda:0: {e}"),
    }
}

#[test]
fn absent_driver_is_a_typed_error_and_cpu_paths_run() {
    let _g = lock();
    std::env::set_var(ENV_DRIVER_LIB, "libeagervm-no-such-driver.so.1");
    let r = VirtualMachine::new(Config::default().with_cuda_devices(1));
    std::env::remove_var(ENV_DRIVER_LIB);
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
    // Asking for a tensor on a CUDA device the VM does not have is an error, not a panic.
    assert!(vm.empty(&[2], DType::F32, DeviceId::cuda(0)).is_err());
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
fn kernels_equal_the_cpu_kernels() {
    let _g = lock();
    let Some(vm) = gpu_vm() else { return };
    let n = 10_007;
    let (a, b) = (data(n, 1), data(n, 2));
    // Elementwise ops: bit-for-bit.
    for (op, ins, attrs) in [
        ("add", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        ("mul", vec![(a.clone(), vec![n]), (b.clone(), vec![n])], Attrs::default()),
        ("scale", vec![(a.clone(), vec![n])], Attrs::scalar(-1.5)),
        ("relu", vec![(a.clone(), vec![n])], Attrs::default()),
        ("copy", vec![(a.clone(), vec![n])], Attrs::default()),
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
    vm.sync().unwrap();
}

#[test]
fn cross_stream_program_matches_sequential_result() {
    let _g = lock();
    let Some(vm) = gpu_vm() else { return };
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
fn out_of_memory_fails_the_instruction_and_the_vm_goes_on() {
    let _g = lock();
    let Some(vm) = gpu_vm() else { return };
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
    let r = eagervm::bench::cuda::run(&opts).unwrap();
    println!("{r}");
    if let Some(why) = &r.skipped {
        println!("skipped: {why}");
        assert!(eagervm::ep::cuda::available(0).is_err());
    } else {
        for ratio in [r.overhead, r.overlap, r.mlp] {
            assert!(ratio.is_some_and(|x| x.ratio.is_finite() && x.ratio > 0.0));
        }
    }
}
