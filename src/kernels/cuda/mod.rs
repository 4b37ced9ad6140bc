//! Kernels for CUDA devices: the same op names and rules as the CPU kernels, on every
//! dtype, over operands of any layout (strides, offsets, broadcast inputs), in place where
//! the CPU kernels are.
//!
//! | part | what |
//! | --- | --- |
//! | [`ops`] | the elementwise ops, one line each: what they compute, which dtypes they take, their kernels' names |
//! | [`source`] | the CUDA C of every kernel, generated from [`ops`] per dtype, compiled once per process by NVRTC |
//! | [`layout`] | the index space and strides a kernel takes, simplified on the host |
//! | [`launch`] | device operands, temporaries, staging, the elementwise launch |
//! | [`elementwise`] | the elementwise ops' kernels (`fill`, `cast`, arithmetic, comparisons, `masked_fill`, ...) |
//! | [`copy`] | `copy` between host and device and within the device |
//! | [`reduce`] | `sum` and `sum_rows` in a fixed order |
//! | [`reduce_dims`] | the reductions along dims (`sum` with dims, `mean`, `max`, `argmax`, `var`, ...) in a fixed order |
//! | [`normalize`] | `softmax`, `log_softmax`, `layer_norm`, `cumsum`, `cumprod` |
//! | [`gemm`], [`matmul`] | `matmul`, `matmul_tn`, `matmul_nt`: cuBLAS from the strides, integer products by kernel |
//! | [`infer`] | the shape and dtype rules |
//! | [`nn`], [`nn_source`] | `bmm`, `conv2d`, the pools, `nll_loss`, `scaled_dot_product_attention` and their kernels' CUDA C |
//! | [`host`] | gathers and scatters of host tensors for the copies |
//! | [`index`] | `tril`, `triu`, `one_hot`, `cat`, `index_select`, `gather`, `scatter`, `index_add`, `index`, `index_put`, `nonzero` |
//!
//! Every kernel enqueues its work on the CUDA stream whose launch is running on the calling
//! thread ([`crate::ep::cuda::with_current`]) and returns; the VM records an event behind it.
//! Every kernel takes operands of any layout (`OpKernel::strided`), so the builder never
//! makes contiguous copies for them.
//!
//! # Adding an elementwise op
//!
//! Add one line to [`ops::ELEMENTWISE`] with an existing [`ops::Kind`] (for example
//! `Op { name: "sub", kind: Kind::Binary(Arith::Sub) }`); a new kind needs its dtype rule
//! in [`ops::Kind::takes`], its C body in `source::elementwise` and its shape rule in
//! [`infer::elementwise`]. The unit tests then check that every dtype the op takes has a
//! compiled kernel, and the NVRTC test that the source compiles.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaFunction;

use crate::ep::cuda::{with_current, CudaEpStream};
use crate::vm::OpKernel;

/// The parts of a CUDA kernel's `OpKernel` that are its CPU kernel's: the name, the dtypes
/// and the shape rule (so that the two devices cannot disagree on them), and every layout
/// (`strided`). `like_cpu!(kernel PATH)` names a CPU kernel; `like_cpu!(twin)` takes the
/// kernel's [`CpuTwin`], for a type that stands for several ops.
macro_rules! like_cpu {
    (kernel $cpu:path) => {
        like_cpu!(@methods self, (&$cpu as &dyn $crate::vm::OpKernel));
    };
    (twin) => {
        like_cpu!(@methods self, $crate::kernels::cuda::CpuTwin::cpu_twin(self));
    };
    // `$me` is the receiver's name, given by the caller so that the bodies below can name it.
    (@methods $me:ident, $cpu:expr) => {
        fn name(&$me) -> &'static str {
            $cpu.name()
        }

        fn dtypes(&$me) -> &'static [$crate::vm::DType] {
            $cpu.dtypes()
        }

        fn infer(
            &$me,
            inputs: &[&$crate::vm::TensorMeta],
            given: &[&$crate::vm::TensorMeta],
            attrs: &$crate::vm::Attrs,
            out: &mut $crate::vm::OutSpecs,
        ) -> Result<(), String> {
            $cpu.infer(inputs, given, attrs, out)
        }

        fn strided(&$me) -> bool {
            true
        }

        fn pointwise(&$me) -> bool {
            $cpu.pointwise()
        }
    };
}

/// The CPU kernel a CUDA kernel of several ops computes like, for the op it stands for.
pub(crate) trait CpuTwin {
    /// That CPU kernel.
    fn cpu_twin(&self) -> &'static dyn OpKernel;
}

pub mod copy;
pub mod elementwise;
pub mod gemm;
pub mod host;
pub mod index;
pub mod infer;
pub mod launch;
pub mod layout;
pub mod matmul;
pub mod nn;
pub mod nn_source;
pub mod normalize;
pub mod ops;
pub mod reduce;
pub mod reduce_dims;
pub mod source;

pub use copy::CudaCopy;
pub use index::{
    CudaCat, CudaGather, CudaIndex, CudaIndexAdd, CudaIndexPut, CudaIndexSelect, CudaNonzero, CudaOneHot,
    CudaScatter, CudaTril, CudaTriu,
};
pub use matmul::{CudaGemm, CUDA_MATMUL, CUDA_MATMUL_NT, CUDA_MATMUL_TN};
pub use normalize::{CudaAlong, CudaLayerNorm, ALONG};
pub use ops::ELEMENTWISE;
pub use reduce::{CudaSum, CudaSumRows};
pub use reduce_dims::{CudaReduce, REDUCTIONS};

/// The NVRTC options every compilation of a module of [`source::source`] uses: NVRTC's
/// defaults (IEEE division and square root, denormals kept, FMA contraction allowed, which
/// no kernel's single operations can use) and its default virtual architecture.
pub fn compile_options(module: &str) -> cudarc::nvrtc::CompileOptions {
    cudarc::nvrtc::CompileOptions { name: Some(format!("eagervm_{module}.cu")), ..Default::default() }
}

/// Compile module `i` of the generated source with NVRTC: its PTX, or the compiler's log.
pub fn compile(i: usize) -> Result<cudarc::nvrtc::Ptx, String> {
    let m = source::source().modules.get(i).ok_or_else(|| format!("no kernel module {i}"))?;
    cudarc::nvrtc::compile_ptx_with_opts(&m.text, compile_options(&m.name))
        .map_err(|e| format!("NVRTC, module {}: {e}", m.name))
}

/// The PTX of module `i`, compiled once per process.
fn ptx(i: usize) -> Result<cudarc::nvrtc::Ptx, String> {
    static PTX: OnceLock<Vec<OnceLock<Result<String, String>>>> = OnceLock::new();
    let all = PTX.get_or_init(|| source::source().modules.iter().map(|_| OnceLock::new()).collect());
    let slot = all.get(i).ok_or_else(|| format!("no kernel module {i}"))?;
    slot.get_or_init(|| compile(i).map(|p| p.to_src())).clone().map(cudarc::nvrtc::Ptx::from_src)
}

/// The loaded kernels of one module, by symbol.
type Functions = HashMap<&'static str, CudaFunction>;

/// A device's kernel modules, each loaded on first use of one of its kernels.
struct Modules {
    loaded: Vec<OnceLock<Result<Functions, String>>>,
}

/// The kernel modules of the device `stream` belongs to.
fn modules(stream: &CudaEpStream) -> Result<Arc<Modules>, String> {
    let slot = stream.shared.kernels.get_or_init(|| {
        let loaded = source::source().modules.iter().map(|_| OnceLock::new()).collect();
        Ok(Arc::new(Modules { loaded }) as Arc<dyn std::any::Any + Send + Sync>)
    });
    match slot {
        Ok(m) => m.clone().downcast::<Modules>().map_err(|_| "kernel cache holds another type".to_string()),
        Err(e) => Err(e.clone()),
    }
}

/// The kernel `symbol` of the generated source, on the device of `stream`; its module is
/// compiled (once per process) and loaded (once per device) on first use.
pub(crate) fn function(stream: &CudaEpStream, symbol: &str) -> Result<CudaFunction, String> {
    let src = source::source();
    let i = src.module_of(symbol).ok_or_else(|| format!("no compiled kernel `{symbol}`"))?;
    let all = modules(stream)?;
    let slot = all.loaded.get(i).ok_or_else(|| format!("no kernel module {i}"))?;
    let functions = slot
        .get_or_init(|| {
            let m = stream.context().load_module(ptx(i)?).map_err(|e| format!("loading kernels: {e}"))?;
            let mut functions = HashMap::new();
            for sym in &src.modules[i].symbols {
                let f = m.load_function(sym).map_err(|e| format!("kernel {sym}: {e}"))?;
                functions.insert(sym.as_str(), f);
            }
            Ok(functions)
        })
        .as_ref()
        .map_err(Clone::clone)?;
    functions.get(symbol).cloned().ok_or_else(|| format!("no compiled kernel `{symbol}`"))
}

/// Run `f` with the current CUDA stream, labelled with `op`; an error outside a launch.
fn on_stream<R>(op: &'static str, f: impl FnOnce(&CudaEpStream) -> Result<R, String>) -> Result<R, String> {
    with_current(|s| {
        let s = s.ok_or_else(|| format!("`{op}` ran outside a CUDA stream launch"))?;
        s.set_label(op);
        f(s)
    })
}

/// The CUDA kernels, plus the diagnostic kernels that touch no memory; the op registry
/// (`framework::op`) registers them for `cuda` devices.
pub fn kernels() -> impl Iterator<Item = &'static dyn OpKernel> {
    let ew = ELEMENTWISE.iter().map(|e| e as &'static dyn OpKernel);
    let reductions = REDUCTIONS.iter().map(|k| k as &'static dyn OpKernel);
    let along =
        ALONG.iter().map(|k| k as &'static dyn OpKernel).chain([&CudaLayerNorm as &'static dyn OpKernel]);
    let others: [&'static dyn OpKernel; 28] = [
        &nn::CudaBmm,
        &nn::CudaNllLoss,
        &nn::CudaAttention,
        &nn::CudaConv2d,
        &nn::CUDA_MAX_POOL2D,
        &nn::CUDA_MAX_POOL2D_WITH_INDICES,
        &nn::CUDA_AVG_POOL2D,
        &nn::CUDA_ADAPTIVE_AVG_POOL2D,
        &CudaTril,
        &CudaTriu,
        &CudaOneHot,
        &CudaCat,
        &CudaIndexSelect,
        &CudaGather,
        &CudaScatter,
        &CudaIndexAdd,
        &CudaIndex,
        &CudaIndexPut,
        &CudaNonzero,
        &CudaSum,
        &CudaSumRows,
        &CUDA_MATMUL,
        &CUDA_MATMUL_TN,
        &CUDA_MATMUL_NT,
        &CudaCopy,
        &super::NoopKernel,
        &super::FailKernel,
        &super::PanicKernel,
    ];
    ew.chain(others).chain(reductions).chain(along)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::{Attrs, DType, OutSpecs, TensorMeta};

    /// Ops registered on the CPU that have no CUDA kernel yet (`docs/ops.md`'s generated
    /// table: "—" under `cuda`). None: every op, the diagnostic `noop`, `fail` and `panic`
    /// included, runs on CUDA too.
    const CPU_ONLY: &[&str] = &[];

    #[test]
    fn every_cpu_op_has_a_cuda_kernel_unless_allowed() {
        let cuda: Vec<&'static dyn OpKernel> = kernels().collect();
        let mut missing = Vec::new();
        for cpu in crate::kernels::BUILTINS {
            let name = cpu.name();
            match cuda.iter().find(|k| k.name() == name) {
                Some(k) => {
                    assert!(
                        !CPU_ONLY.contains(&name),
                        "{name} is allowed to be CPU-only but has a CUDA kernel"
                    );
                    assert_eq!(k.cross_device(), cpu.cross_device(), "{name}");
                    // The outputs' layout is the op's, not the device's.
                    assert_eq!(k.pointwise(), cpu.pointwise(), "{name}: pointwise");
                }
                None if CPU_ONLY.contains(&name) => {}
                None => missing.push(name),
            }
        }
        assert!(missing.is_empty(), "ops on the CPU without a CUDA kernel: {missing:?}");
        let mut names: Vec<&str> = cuda.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), cuda.len(), "one CUDA kernel per op");
        // The CUDA kernels take every layout, so the builder makes no copies for them.
        for k in &cuda {
            let diag = ["noop", "fail", "panic"].contains(&k.name());
            assert!(k.strided() || diag, "{} is not strided", k.name());
        }
    }

    /// Where the CPU kernels accept a call, the CUDA kernels accept it too and infer the
    /// same outputs (they accept more: broadcasting, every dtype).
    #[test]
    fn shape_rules_agree_with_the_cpus() {
        let cuda = crate::ep::DeviceId::cuda(0);
        let metas: Vec<TensorMeta> = [
            (&[2, 3][..], DType::F32),
            (&[3, 2], DType::F32),
            (&[3], DType::F32),
            (&[2], DType::F32),
            (&[2, 2], DType::F32),
            (&[0, 3], DType::F32),
            (&[2, 3], DType::I64),
            (&[3], DType::I64),
            (&[], DType::F32),
        ]
        .iter()
        .map(|(shape, dtype)| TensorMeta::new(shape, *dtype, cuda))
        .collect();
        let mut calls: Vec<Vec<&TensorMeta>> = vec![vec![]];
        calls.extend(metas.iter().map(|m| vec![m]));
        for a in &metas {
            calls.extend(metas.iter().map(|b| vec![a, b]));
        }
        let given = TensorMeta::new(&[2, 3], DType::F32, cuda);
        let mut compared = 0;
        for gpu in kernels() {
            let name = gpu.name();
            let Some(&cpu) = crate::kernels::BUILTINS.iter().find(|k| k.name() == name) else { continue };
            for attrs in [Attrs::default(), Attrs::transposed(true, false), Attrs::transposed(false, true)] {
                for inputs in &calls {
                    let infer = |k: &dyn OpKernel| {
                        let mut out = OutSpecs::new();
                        k.infer(inputs, &[&given], &attrs, &mut out).map(|()| out)
                    };
                    if let Ok(want) = infer(cpu) {
                        assert_eq!(infer(gpu), Ok(want), "{name} on {inputs:?} with {attrs:?}");
                        compared += 1;
                    }
                }
            }
        }
        assert!(compared > 100, "only {compared} calls compared");
    }

    #[test]
    fn kernels_refuse_to_run_outside_a_cuda_launch() {
        let e = on_stream("add", |_| Ok(())).unwrap_err();
        assert!(e.contains("outside a CUDA stream launch"), "{e}");
    }

    /// Every module of the generated source compiles with NVRTC, and its PTX has every
    /// kernel the module loads. Needs NVRTC (`libnvrtc.so.13` or another name cudarc looks
    /// for) and no GPU: `LD_LIBRARY_PATH=<dir of libnvrtc> cargo test --release --lib
    /// kernels::cuda::tests::the_generated_source_compiles -- --ignored` (.ci/run does).
    #[test]
    #[ignore = "needs libnvrtc"]
    fn the_generated_source_compiles_with_nvrtc() {
        let src = source::source();
        let (mut total, mut slowest) = (0.0f64, (0.0f64, ""));
        for (i, m) in src.modules.iter().enumerate() {
            let start = std::time::Instant::now();
            let ptx = compile(i).unwrap_or_else(|e| panic!("{e}"));
            let took = start.elapsed().as_secs_f64();
            let ptx = ptx.to_src();
            for symbol in &m.symbols {
                assert!(
                    ptx.contains(&format!(".entry {symbol}(")),
                    "no kernel {symbol} in the PTX of {}",
                    m.name
                );
            }
            println!(
                "module {:>4}: {:3} kernels, {:3} KiB of CUDA C, {:4} KiB of PTX, {took:.2} s",
                m.name,
                m.symbols.len(),
                m.text.len() / 1024,
                ptx.len() / 1024
            );
            total += took;
            if took > slowest.0 {
                slowest = (took, m.name.as_str());
            }
        }
        println!(
            "NVRTC compiled {} kernels in {} modules in {total:.2} s (slowest: {} in {:.2} s)",
            src.symbols().count(),
            src.modules.len(),
            slowest.1,
            slowest.0
        );
    }
}
