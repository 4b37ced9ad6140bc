//! `matmul`, `matmul_tn` and `matmul_nt` on CUDA.
//!
//! Floats go to cuBLAS, with the transpose flags and leading dimensions that
//! [`gemm::gemm_args`](super::gemm::gemm_args) takes from the operands' strides (so a
//! transposed view, `w.t()`, is read as it lies): `cublasSgemm` for `f32`, `cublasDgemm` for
//! `f64`, and `cublasGemmEx` with `CUBLAS_COMPUTE_32F` for `f16` and `bf16` (products and
//! sums in `f32`, each result rounded once to the dtype), all in cuBLAS's default math
//! mode (no TF32). An operand whose layout cuBLAS cannot read (no stride of 1, a broadcast,
//! a negative stride) is copied to a contiguous temporary first; an output it cannot write
//! is computed into one and copied. The integer dtypes use the generated `matmul_<dtype>`
//! kernel (one thread per output element, products added in increasing `p`, wrapping),
//! which reads any strides. `bool` is refused.

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::PushKernelArg;

use super::gemm::{gemm_args, Input, Product, Trans, Unfit};
use super::infer;
use super::launch::{contiguous_temp, copy_elements, device_operand, launch_config, launch_ew, stage, Dev};
use super::{function, on_stream};
use crate::ep::cuda::CudaEpStream;
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// `matmul`, `matmul_tn` or `matmul_nt` on CUDA (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct CudaGemm(pub Product);

/// `matmul` on CUDA.
pub static CUDA_MATMUL: CudaGemm = CudaGemm(Product::Nn);
/// `matmul_tn` on CUDA.
pub static CUDA_MATMUL_TN: CudaGemm = CudaGemm(Product::Tn);
/// `matmul_nt` on CUDA.
pub static CUDA_MATMUL_NT: CudaGemm = CudaGemm(Product::Nt);

fn cublas_op(t: Trans) -> cublasOperation_t {
    match t {
        Trans::N => cublasOperation_t::CUBLAS_OP_N,
        Trans::T => cublasOperation_t::CUBLAS_OP_T,
    }
}

/// A matrix's `[row, column]` strides.
fn strides2(d: &Dev<'_>) -> [isize; 2] {
    [d.meta.strides[0], d.meta.strides[1]]
}

impl OpKernel for CudaGemm {
    fn name(&self) -> &'static str {
        self.0.op()
    }

    fn dtypes(&self) -> &'static [DType] {
        crate::kernels::Dtypes::Numeric.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _: &[&TensorMeta],
        attrs: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        infer::matmul(self.0, inputs, attrs, out)
    }

    fn strided(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let product = infer::product(self.0, &ctx.attrs)?;
        let op = self.0.op();
        let [a, b] = ctx.inputs else { return Err(format!("expected 2 inputs, got {}", ctx.inputs.len())) };
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let (m, n, k) = product.dims(&a.meta.shape, &b.meta.shape)?;
        let d = a.meta.dtype;
        if out.meta.shape.as_slice() != [m, n] || b.meta.dtype != d || out.meta.dtype != d || d == DType::Bool
        {
            return Err(format!(
                "{op} of {} and {} into {}: expected two matrices of one numeric dtype and an output {d}[{m}, {n}]",
                a.meta.describe(),
                b.meta.describe(),
                out.meta.describe()
            ));
        }
        on_stream(op, |s| {
            let mut ad = device_operand(s, "input 0", a.meta, a.data)?;
            let mut bd = device_operand(s, "input 1", b.meta, b.data)?;
            let cd = device_operand(s, "output 0", out.meta, out.data)?;
            if m == 0 || n == 0 {
                return Ok(());
            }
            if k == 0 {
                // An empty sum: zeros (all-zero bits in every dtype).
                return launch_ew(s, op, &format!("fill_{}", d.size()), &cd, &[], 0);
            }
            if !d.is_floating() {
                return int_matmul(s, product, (m, n, k), &cd, &ad, &bd);
            }
            let mut ctemp = None;
            let g = loop {
                let c = ctemp.as_ref().unwrap_or(&cd);
                match gemm_args(product, (m, n, k), strides2(&ad), strides2(&bd), strides2(c)) {
                    Ok(g) => break g,
                    Err(Unfit::A) => ad = stage(s, op, &ad)?,
                    Err(Unfit::B) => bd = stage(s, op, &bd)?,
                    Err(Unfit::C) if ctemp.is_none() => ctemp = Some(contiguous_temp(s, &[m, n], d)?),
                    Err(Unfit::C) => {
                        return Err(format!("{op}: a contiguous [{m}, {n}] output did not fit cuBLAS"))
                    }
                }
            };
            let c = ctemp.as_ref().unwrap_or(&cd);
            let operand = |i: Input| if i == Input::First { ad.addr() } else { bd.addr() };
            blas_gemm(s, d, &g, operand(g.a), operand(g.b), c.addr())?;
            match &ctemp {
                Some(t) => copy_elements(s, op, &cd, t),
                None => Ok(()),
            }
        })
    }
}

/// The cuBLAS handle of `s`: bound to its stream, in the default math mode (no TF32) with
/// reduced-precision reductions disallowed, so that a 16-bit product with `f32` compute
/// never sums partial results in 16 bits (cuBLAS may otherwise split `k` and add the
/// parts in the output type).
pub(super) fn handle(s: &CudaEpStream) -> Result<cudarc::cublas::CudaBlas, String> {
    use cudarc::cublas::sys::{cublasMath_t, cublasSetMathMode};
    let blas = cudarc::cublas::CudaBlas::new(s.cuda_stream().clone()).map_err(|e| format!("cuBLAS: {e}"))?;
    let mode = cublasMath_t::CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION;
    // SAFETY: the handle was just created and is live; setting its math mode has no other
    // precondition.
    unsafe { cublasSetMathMode(*blas.handle(), mode) }
        .result()
        .map_err(|e| format!("cublasSetMathMode: {e}"))?;
    Ok(blas)
}

/// One cuBLAS product `C = op(A) op(B)` with the arguments `g`, on dtype `d`.
fn blas_gemm(
    s: &CudaEpStream,
    d: DType,
    g: &super::gemm::GemmArgs,
    a: u64,
    b: u64,
    c: u64,
) -> Result<(), String> {
    let int = |v: usize| i32::try_from(v).map_err(|_| format!("size {v} exceeds cuBLAS's 32-bit sizes"));
    let (m, n, k, lda, ldb, ldc) = (int(g.m)?, int(g.n)?, int(g.k)?, int(g.lda)?, int(g.ldb)?, int(g.ldc)?);
    let (ta, tb) = (cublas_op(g.transa), cublas_op(g.transb));
    let blas = s.blas.get_or_init(|| handle(s)).as_ref().map_err(Clone::clone)?;
    let h = *blas.handle();
    // Why the three calls below are sound: the handle is bound to this stream; `a`, `b`
    // and `c` are the addresses of live device operands of this device whose layouts were checked against
    // their storages (or contiguous temporaries made for them), and `gemm_args` derived the
    // flags, sizes and leading dimensions from those layouts, so cuBLAS reads and writes
    // only their elements (see `gemm`'s docs and tests); they stay alive until the
    // instruction retires, or this stream is past the work (temporaries). `alpha` and `beta`
    // are host scalars of the compute type (cuBLAS's default pointer mode).
    match d {
        DType::F32 => {
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: see above; `f32` operands and scalars.
            unsafe {
                cudarc::cublas::result::sgemm(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &alpha,
                    a as *const f32,
                    lda,
                    b as *const f32,
                    ldb,
                    &beta,
                    c as *mut f32,
                    ldc,
                )
            }
            .map_err(|e| format!("cublasSgemm: {e}"))
        }
        DType::F64 => {
            let (alpha, beta) = (1.0f64, 0.0f64);
            // SAFETY: see above; `f64` operands and scalars.
            unsafe {
                cudarc::cublas::result::dgemm(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    &alpha,
                    a as *const f64,
                    lda,
                    b as *const f64,
                    ldb,
                    &beta,
                    c as *mut f64,
                    ldc,
                )
            }
            .map_err(|e| format!("cublasDgemm: {e}"))
        }
        DType::F16 | DType::BF16 => {
            let t = if d == DType::F16 { cudaDataType::CUDA_R_16F } else { cudaDataType::CUDA_R_16BF };
            let (alpha, beta) = (1.0f32, 0.0f32);
            // SAFETY: see above; 16-bit operands of type `t`, `f32` scalars for
            // `CUBLAS_COMPUTE_32F`.
            unsafe {
                cudarc::cublas::result::gemm_ex(
                    h,
                    ta,
                    tb,
                    m,
                    n,
                    k,
                    (&alpha as *const f32).cast(),
                    a as *const std::ffi::c_void,
                    t,
                    lda,
                    b as *const std::ffi::c_void,
                    t,
                    ldb,
                    (&beta as *const f32).cast(),
                    c as *mut std::ffi::c_void,
                    t,
                    ldc,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
            }
            .map_err(|e| format!("cublasGemmEx: {e}"))
        }
        other => Err(format!("{other} products do not go through cuBLAS")),
    }
}

/// An integer product with the `matmul_<dtype>` kernel, reading every operand through its
/// strides.
fn int_matmul(
    s: &CudaEpStream,
    product: Product,
    (m, n, k): (usize, usize, usize),
    c: &Dev<'_>,
    a: &Dev<'_>,
    b: &Dev<'_>,
) -> Result<(), String> {
    let d = c.meta.dtype;
    let (l, r) = product.logical(strides2(a), strides2(b));
    let sc = strides2(c);
    let f = function(s, &format!("matmul_{d}"))?;
    let (pc, pa, pb) = (c.addr(), a.addr(), b.addr());
    let (m64, n64, k64) = (m as u64, n as u64, k as u64);
    let st = |x: isize| x as i64;
    let (l0, l1, r0, r1, c0, c1) = (st(l[0]), st(l[1]), st(r[0]), st(r[1]), st(sc[0]), st(sc[1]));
    let mut args = s.cuda_stream().launch_builder(&f);
    args.arg(&pc).arg(&pa).arg(&pb).arg(&m64).arg(&n64).arg(&k64);
    args.arg(&l0).arg(&l1).arg(&r0).arg(&r1).arg(&c0).arg(&c1);
    // SAFETY: `matmul_<d>` takes (T*, const T*, const T*, u64 ×3, i64 ×6), matching these
    // arguments. `(l0, l1)` are the strides of `op(a)` (`m × k`) and `(r0, r1)` of `op(b)`
    // (`k × n`), the inputs' own strides swapped for a transposed product, so every element
    // read is one of the inputs'; `c`'s elements are `[m, n]` with its strides. All three
    // layouts were checked against their live storages.
    unsafe { args.launch(launch_config(m * n)) }.map(|_| ()).map_err(|e| format!("launching matmul_{d}: {e}"))
}
