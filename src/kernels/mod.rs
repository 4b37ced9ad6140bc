//! Built-in kernels, so that real programs and traces do real work.
//!
//! | op | inputs | output | notes |
//! | --- | --- | --- | --- |
//! | `fill` | none | given by the caller | every element set to `attrs.scalar` |
//! | `copy` | `x` | like `x` | may cross devices |
//! | `add`, `mul` | `a`, `b` of one shape | like `a` | no broadcasting |
//! | `scale` | `x` | like `x` | `x * attrs.scalar` |
//! | `relu` | `x` | like `x` | `max(x, 0)`; NaN stays NaN |
//! | `sum` | `x` | scalar `[]` | in index order up to 4096 elements, 32 partial sums above ([`sum_f32`]) |
//! | `matmul` | `[m, k]`, `[k, n]` | `[m, n]` | `a b`; with `attrs.transpose_a`, `a: [k, m]` and `aᵀ b`; with `attrs.transpose_b`, `b: [n, k]` and `a bᵀ` (not both); the `gemm` crate above 64³ multiply-adds (`f32`), plain loops below and for `i64` |
//! | `sub` | `a`, `b` of one shape | like `a` | `a - b`; no broadcasting |
//! | `relu_grad` | `dy`, `x` of one shape | like `x` | `dy` where `x > 0`, else 0 |
//! | `add_bias` | `x: [n, k]`, `b: [k]` | `[n, k]` | `x[i][j] + b[j]` |
//! | `sum_rows` | `x: [n, k]` | `[k]` | column sums: `sum over i of x[i][j]` |
//! | `matmul_tn` | `a: [k, m]`, `b: [k, n]` | `[m, n]` | `aᵀ b`: `matmul` with `transpose_a`, kept for recorded traces |
//! | `matmul_nt` | `a: [m, k]`, `b: [n, k]` | `[m, n]` | `a bᵀ`: `matmul` with `transpose_b`, kept for recorded traces |
//! | `noop` | any | given by the caller | does nothing (measures VM overhead) |
//! | `fail` | any | given by the caller | returns an error (tests error propagation) |
//! | `panic` | any | given by the caller | panics (tests panic containment) |
//!
//! Every op works on `f32` and `i64`; all inputs of a call must share one dtype.
//! Integer arithmetic wraps; `f32` arithmetic runs in `f32` in a fixed order, so results
//! are bit-for-bit reproducible. Ops whose outputs follow from their inputs ignore the
//! outputs the caller gave: the builder compares those with the inferred specs.
//!
//! Kernels never panic on operands that passed [`OpKernel::infer`]; `compute` checks again
//! what it indexes by (dtype, element counts) and returns an error instead of panicking if
//! a caller skipped inference. Only `panic` panics, on purpose.
//!
//! Each kernel is a unit struct, so `&FillKernel` is a `&'static dyn OpKernel` for free.
//! The same code serves the CPU and the mock device (which runs host code over its own host
//! memory); the CUDA backend registers its own kernels under the same names (`kernels::cuda`, feature `cuda`).

pub mod collective;
#[cfg(feature = "cuda")]
pub mod cuda;
mod diag;
mod elementwise;
mod gemm;
mod matmul;
mod matmul_t;
mod nn;
mod reduce;

pub use diag::{FailKernel, NoopKernel, PanicKernel};
pub use elementwise::{AddKernel, CopyKernel, FillKernel, MulKernel, ReluKernel, ScaleKernel};
pub use gemm::{
    kernel_threads, set_kernel_threads, KERNEL_THREADS_ENV, PARALLEL_MIN_MACS, SEQUENTIAL_MAX_MACS,
};
pub use matmul::MatmulKernel;
pub use matmul_t::{MatmulNtKernel, MatmulTnKernel};
pub use nn::{AddBiasKernel, ReluGradKernel, SubKernel, SumRowsKernel};
pub use reduce::{sum_f32, SumKernel, SEQUENTIAL_SUM_MAX};

use crate::alloc::Storage;
use crate::vm::{DType, Element, KernelCtx, OpKernel, OutSpec, TensorMeta};

/// Every built-in kernel of the CPU and the mock device, in the order of the table in the
/// module docs; the op registry (`framework::op`) registers them for both.
pub static BUILTINS: &[&dyn OpKernel] = &[
    &FillKernel,
    &CopyKernel,
    &AddKernel,
    &MulKernel,
    &ScaleKernel,
    &ReluKernel,
    &SumKernel,
    &MatmulKernel,
    &SubKernel,
    &ReluGradKernel,
    &AddBiasKernel,
    &SumRowsKernel,
    &MatmulTnKernel,
    &MatmulNtKernel,
    &NoopKernel,
    &FailKernel,
    &PanicKernel,
];

/// An element type the built-in kernels compute on: the arithmetic they need, with the
/// wrapping/rounding rules of the module docs, and the typed views of a [`Storage`].
trait Num: Element + PartialOrd {
    /// The additive identity.
    const ZERO: Self;
    /// `attrs.scalar` converted to this type (`as` casts: `f32` rounds, `i64` truncates
    /// toward zero and saturates, NaN becomes 0).
    fn from_scalar(v: f64) -> Self;
    /// Addition (wrapping for integers).
    fn plus(self, other: Self) -> Self;
    /// Multiplication (wrapping for integers).
    fn times(self, other: Self) -> Self;
    /// Subtraction (wrapping for integers).
    fn minus(self, other: Self) -> Self;
    /// The storage's bytes as elements.
    fn view(s: &Storage) -> &[Self];
    /// The storage's bytes as elements, writable.
    ///
    /// # Safety
    /// As [`Storage::bytes_mut`]: the caller's instruction writes the storage, and no other
    /// reference to its bytes is alive meanwhile.
    #[allow(clippy::mut_from_ref)]
    unsafe fn view_mut(s: &Storage) -> &mut [Self];
    /// A product's operands as `f32` slices, when `Self` is `f32` (those products may go to
    /// the `gemm` crate; `gemm::product`).
    /// The sum of `x`, in the `sum` kernel's order (`reduce::sum_f32` for `f32`).
    fn sum(x: &[Self]) -> Self;
    fn as_f32_operands<'x>(
        _a: &'x [Self],
        _b: &'x [Self],
        _out: &'x mut [Self],
    ) -> Option<gemm::F32Operands<'x>> {
        None
    }
}

impl Num for f32 {
    const ZERO: Self = 0.0;
    fn from_scalar(v: f64) -> Self {
        v as f32
    }
    fn plus(self, other: Self) -> Self {
        self + other
    }
    fn times(self, other: Self) -> Self {
        self * other
    }
    fn minus(self, other: Self) -> Self {
        self - other
    }
    fn view(s: &Storage) -> &[Self] {
        s.as_f32()
    }
    unsafe fn view_mut(s: &Storage) -> &mut [Self] {
        // SAFETY: the caller's contract; `f32` is plain old data of alignment 4, within the
        // storage's (at least 8).
        let bytes = unsafe { s.bytes_mut() };
        let n = bytes.len() / 4;
        // SAFETY: as above: `n` whole elements of the block, suitably aligned.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<f32>(), n) }
    }
    fn sum(x: &[f32]) -> f32 {
        reduce::sum_f32(x)
    }
    fn as_f32_operands<'x>(a: &'x [f32], b: &'x [f32], out: &'x mut [f32]) -> Option<gemm::F32Operands<'x>> {
        Some((a, b, out))
    }
}

impl Num for i64 {
    const ZERO: Self = 0;
    fn from_scalar(v: f64) -> Self {
        v as i64
    }
    fn plus(self, other: Self) -> Self {
        self.wrapping_add(other)
    }
    fn times(self, other: Self) -> Self {
        self.wrapping_mul(other)
    }
    fn minus(self, other: Self) -> Self {
        self.wrapping_sub(other)
    }
    fn view(s: &Storage) -> &[Self] {
        s.as_i64()
    }
    unsafe fn view_mut(s: &Storage) -> &mut [Self] {
        // SAFETY: the caller's contract; `i64` is plain old data of alignment 8, within the
        // storage's (at least 8).
        let bytes = unsafe { s.bytes_mut() };
        let n = bytes.len() / 8;
        // SAFETY: as above: `n` whole elements of the block, suitably aligned.
        unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<i64>(), n) }
    }
    fn sum(x: &[i64]) -> i64 {
        x.iter().fold(0, |acc, &v| acc.wrapping_add(v))
    }
}

/// Run `$body` with `$T` bound to the element type of `$dtype`, so that one generic body
/// serves every dtype.
macro_rules! with_num {
    ($dtype:expr, $T:ident => $body:expr) => {
        match $dtype {
            $crate::vm::DType::F32 => {
                type $T = f32;
                $body
            }
            $crate::vm::DType::I64 => {
                type $T = i64;
                $body
            }
            other => return Err(format!("this kernel computes on f32 and i64, not {other}")),
        }
    };
}
use with_num;

// ---- inference helpers --------------------------------------------------------------

/// Refuse a call with other than `n` inputs.
fn expect_inputs(inputs: &[&TensorMeta], n: usize) -> Result<(), String> {
    if inputs.len() == n {
        Ok(())
    } else {
        let s = if n == 1 { "" } else { "s" };
        Err(format!("expected {n} input{s}, got {}", inputs.len()))
    }
}

/// The dtype shared by all inputs (at least one), or an error naming the first that
/// differs from input 0.
fn common_dtype(inputs: &[&TensorMeta]) -> Result<DType, String> {
    let first = inputs.first().ok_or("expected at least one input, got none")?.dtype;
    match inputs.iter().position(|m| m.dtype != first) {
        None => Ok(first),
        Some(i) => Err(format!("input {i} is {} but input 0 is {first}", inputs[i].dtype)),
    }
}

/// The output spec that copies `meta`'s shape and dtype.
fn spec_of(meta: &TensorMeta) -> OutSpec {
    OutSpec { shape: meta.shape.clone(), dtype: meta.dtype }
}

// ---- compute helpers ----------------------------------------------------------------

/// The dtype of input `i`.
fn input_dtype(ctx: &KernelCtx<'_, '_>, i: usize) -> Result<DType, String> {
    Ok(ctx.inputs.get(i).ok_or_else(|| format!("missing input {i}"))?.meta.dtype)
}

/// The dtype of output `i`.
fn output_dtype(ctx: &KernelCtx<'_, '_>, i: usize) -> Result<DType, String> {
    Ok(ctx.outputs.get(i).ok_or_else(|| format!("missing output {i}"))?.meta.dtype)
}

/// Check that an operand's storage is a `T` buffer that holds its shape, and cut the view
/// to exactly its element count.
/// `kind` and `i` name the operand, as ("input", 1), in the error only: nothing is
/// formatted on the way through.
///
/// Always inlined, its failures out of line: called, it took the operand's name as a tuple
/// through memory written in words and read back in a wider load, a store-forwarding stall
/// on every operand of every call (`docs/performance.md`, "The call path", has the
/// measurement).
#[inline(always)]
fn fit<T: Num>(
    kind: &'static str,
    i: usize,
    meta: &TensorMeta,
    view: &[T],
) -> Result<std::ops::Range<usize>, String> {
    if meta.dtype != T::DTYPE {
        return Err(unfit_dtype(kind, i, meta, T::DTYPE));
    }
    let n = meta.numel();
    if !meta.is_contiguous() {
        return Err(unfit_layout(kind, i, meta));
    }
    let end = meta.offset.saturating_add(n);
    if view.len() < end {
        return Err(unfit_len(kind, i, meta, view.len()));
    }
    Ok(meta.offset..end)
}

#[cold]
#[inline(never)]
fn unfit_layout(kind: &str, i: usize, meta: &TensorMeta) -> String {
    format!("{kind} {i} ({}) is not contiguous: this kernel takes contiguous operands", meta.describe())
}

#[cold]
#[inline(never)]
fn unfit_dtype(kind: &str, i: usize, meta: &TensorMeta, want: DType) -> String {
    format!("{kind} {i} is {} but the kernel ran for {want}", meta.dtype)
}

#[cold]
#[inline(never)]
fn unfit_len(kind: &str, i: usize, meta: &TensorMeta, len: usize) -> String {
    format!("{kind} {i} ({}) has storage for only {len} elements", meta.describe())
}

/// Input `i` as exactly its elements.
fn input<'t, T: Num>(ctx: &KernelCtx<'_, 't>, i: usize) -> Result<&'t [T], String> {
    let t = ctx.inputs.get(i).ok_or_else(|| format!("missing input {i}"))?;
    let view = T::view(t.data);
    let range = fit("input", i, t.meta, view)?;
    Ok(&view[range])
}

/// Output `i` as exactly its elements, writable, with its meta.
fn output<'c, T: Num>(
    ctx: &'c mut KernelCtx<'_, '_>,
    i: usize,
) -> Result<(&'c TensorMeta, &'c mut [T]), String> {
    let t = ctx.outputs.get_mut(i).ok_or_else(|| format!("missing output {i}"))?;
    let meta: &TensorMeta = t.meta;
    // SAFETY: the call's instruction holds the write access to the output's storage, which
    // no input shares: these kernels do not work in place (`OpKernel::in_place`), so the
    // builder refuses such a call.
    let view = unsafe { T::view_mut(t.data) };
    let range = fit("output", i, meta, view)?;
    Ok((meta, &mut view[range]))
}

#[cfg(test)]
mod testing;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_have_distinct_names() {
        let mut names: Vec<&str> = BUILTINS.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUILTINS.len());
        for k in BUILTINS {
            assert_eq!(k.cross_device(), k.name() == "copy", "{}", k.name());
        }
    }

    /// `matmul`'s transpose flags compute what `matmul_tn` and `matmul_nt` compute, bit for
    /// bit; both flags at once are refused by `infer`; and the flags are part of the call's
    /// signature (other flags, other shapes accepted).
    #[test]
    fn matmul_flags_are_the_transposed_products() {
        use crate::vm::Attrs;
        use testing::{as_f32, run, run_with, t_f32};
        let vals = |n: usize| (0..n).map(|i| (i as f32 * 0.37).sin()).collect::<Vec<_>>();
        let bits = |v: Vec<f32>| v.into_iter().map(f32::to_bits).collect::<Vec<_>>();
        let tn_ops = || vec![t_f32(&[3, 2], &vals(6)), t_f32(&[3, 4], &vals(12))];
        let tn = run(&MatmulTnKernel, 0.0, tn_ops(), &[]).unwrap();
        let flag = run_with(&MatmulKernel, Attrs::transposed(true, false), tn_ops(), &[]).unwrap();
        assert_eq!(flag[0].0.shape.as_slice(), &[2, 4]);
        assert_eq!(bits(as_f32(&flag[0])), bits(as_f32(&tn[0])));
        let nt_ops = || vec![t_f32(&[2, 3], &vals(6)), t_f32(&[4, 3], &vals(12))];
        let nt = run(&MatmulNtKernel, 0.0, nt_ops(), &[]).unwrap();
        let flag = run_with(&MatmulKernel, Attrs::transposed(false, true), nt_ops(), &[]).unwrap();
        assert_eq!(bits(as_f32(&flag[0])), bits(as_f32(&nt[0])));
        // Without the flag the same operands do not fit.
        assert!(run(&MatmulKernel, 0.0, nt_ops(), &[]).is_err());
        let both = run_with(&MatmulKernel, Attrs::transposed(true, true), tn_ops(), &[]);
        assert!(both.unwrap_err().contains("transpose_a and transpose_b both set"));
    }

    #[test]
    fn common_dtype_names_the_first_mismatch() {
        use crate::ep::DeviceId;
        let f = TensorMeta::new(&[1], DType::F32, DeviceId::CPU);
        let i = TensorMeta::new(&[1], DType::I64, DeviceId::CPU);
        assert_eq!(common_dtype(&[&f, &f]), Ok(DType::F32));
        assert_eq!(common_dtype(&[&f, &f, &i, &f]), Err("input 2 is i64 but input 0 is f32".into()));
        assert!(common_dtype(&[]).is_err());
    }
}
