//! Built-in kernels, so that real programs and traces do real work.
//!
//! `docs/ops.md` has the table of ops: inputs, output, dtypes, broadcasting, in place, the
//! conversion and rounding rules and the summation order. In short:
//!
//! - **Layouts.** Every kernel takes operands of any layout (`OpKernel::strided`): strides
//!   in any order, an offset, steps, stride 0 for an expanded input. Each operand is checked
//!   against its storage before anything is read (`iter::Operand`), so a caller that skipped
//!   `infer` gets an error, not a read outside the storage.
//! - **Broadcasting.** Elementwise ops broadcast their inputs to one shape by NumPy's rule.
//! - **Dtypes.** All eight, where PyTorch has the op for them; inputs of one call share one
//!   dtype (the front end inserts `cast`s). `f16` and `bf16` compute in `f32` and round once
//!   on store; integers wrap; `bool` adds as `or` and multiplies as `and`.
//! - **In place.** Elementwise ops, `fill`, `copy`, `masked_fill`, `scatter`, `index_add`
//!   and `index_put` may write an output that is exactly an input (`OpKernel::in_place`);
//!   an input that overlaps the output otherwise is read from a copy made first.
//!
//! The machinery: `kernels::dtype` (stored and compute types, the conversion rule, dispatch
//! over dtypes), `kernels::iter` (operands, broadcasting, the loop plan), `kernels::loops`
//! (the elementwise drivers and inner loops); the ops by concept in the other files. Kernels never panic on
//! operands that passed [`OpKernel::infer`]; only `panic` panics, on purpose.
//!
//! Each kernel is a unit struct, so `&FillKernel` is a `&'static dyn OpKernel` for free.
//! The same code serves the CPU and the mock device (which runs host code over its own host
//! memory); the CUDA backend registers its own kernels under the same names (`kernels::cuda`,
//! feature `cuda`).

mod advanced;
mod attention;
mod binary_math;
mod bmm;
pub mod collective;
mod compare;
mod conv;
mod copy;
mod creation;
#[cfg(feature = "cuda")]
pub mod cuda;
mod diag;
mod dtype;
mod elementwise;
mod gemm;
mod index;
mod iter;
mod loops;
mod loss;
mod masked;
mod matmul;
mod matmul_t;
mod normalize;
mod pointwise;
mod pool;
mod reduce;
mod reduce_dims;
mod scalar;
mod ternary;
mod unary_math;
mod vmath;

pub use advanced::{IndexKernel, IndexPutKernel, NonzeroKernel};
pub use attention::AttentionKernel;
pub use binary_math::{
    Atan2Kernel, DivFloorKernel, DivTruncKernel, FmodKernel, LogicalAndKernel, LogicalOrKernel,
    LogicalXorKernel, MaximumKernel, MinimumKernel, PowKernel, PowScalarKernel, RemainderKernel,
};
pub use bmm::BmmKernel;
pub use compare::{
    EqKernel, EqScalarKernel, GeKernel, GeScalarKernel, GtKernel, GtScalarKernel, LeKernel, LeScalarKernel,
    LtKernel, LtScalarKernel, NeKernel, NeScalarKernel,
};
pub use conv::Conv2dKernel;
pub use copy::{CastKernel, CopyKernel, FillKernel};
pub use creation::{OneHotKernel, TrilKernel, TriuKernel};
pub use diag::{FailKernel, NoopKernel, PanicKernel};
pub use elementwise::{
    AddBiasKernel, AddKernel, DivKernel, MulKernel, ReluGradKernel, ReluKernel, ScaleKernel, SubKernel,
};
pub use gemm::{
    kernel_threads, set_kernel_threads, KERNEL_THREADS_ENV, PARALLEL_MIN_MACS, SEQUENTIAL_MAX_MACS,
};
pub use index::{CatKernel, GatherKernel, IndexAddKernel, IndexSelectKernel, ScatterKernel};
pub use loss::NllLossKernel;
pub use masked::MaskedFillKernel;
pub use matmul::MatmulKernel;
pub use matmul_t::{MatmulNtKernel, MatmulTnKernel};
pub use normalize::{CumprodKernel, CumsumKernel, LayerNormKernel, LogSoftmaxKernel, SoftmaxKernel};
pub use pool::{
    AdaptiveAvgPool2dKernel, AvgPool2dKernel, MaxPool2dKernel, MAX_POOL2D, MAX_POOL2D_WITH_INDICES,
};
pub use reduce::{sum_f32, SumKernel, SumRowsKernel, SEQUENTIAL_SUM_MAX};
pub use reduce_dims::{
    AllKernel, AmaxKernel, AminKernel, AnyKernel, ArgmaxKernel, ArgminKernel, LogsumexpKernel, MaxKernel,
    MeanKernel, MinKernel, NormKernel, ProdKernel, StdKernel, VarKernel,
};
pub use scalar::{AddScalarKernel, DivScalarKernel, MulScalarKernel, RdivScalarKernel, RsubScalarKernel};
pub use ternary::{
    AddcdivKernel, AddcmulKernel, ClampKernel, ClampScalarKernel, LerpKernel, LerpScalarKernel, WhereKernel,
};
pub use unary_math::{
    AbsKernel, CeilKernel, CosKernel, ErfKernel, Exp2Kernel, ExpKernel, Expm1Kernel, FloorKernel, GeluKernel,
    IsfiniteKernel, IsinfKernel, IsnanKernel, Log1pKernel, Log2Kernel, LogKernel, LogicalNotKernel,
    NegKernel, ReciprocalKernel, RoundKernel, RsqrtKernel, SigmoidKernel, SignKernel, SiluKernel, SinKernel,
    SqrtKernel, TanhKernel,
};
pub use vmath::exp_f32;

use crate::vm::{DType, OpKernel, OutSpec, Shape, TensorMeta};

/// Every built-in kernel of the CPU and the mock device, in the order of the table in
/// `docs/ops.md`; the op registry (`framework::op`) registers them for both.
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
    &CastKernel,
    &DivKernel,
    &AddScalarKernel,
    &RsubScalarKernel,
    &MulScalarKernel,
    &DivScalarKernel,
    &RdivScalarKernel,
    &EqKernel,
    &NeKernel,
    &LtKernel,
    &LeKernel,
    &GtKernel,
    &GeKernel,
    &EqScalarKernel,
    &NeScalarKernel,
    &LtScalarKernel,
    &LeScalarKernel,
    &GtScalarKernel,
    &GeScalarKernel,
    &MaskedFillKernel,
    &MeanKernel,
    &ProdKernel,
    &AmaxKernel,
    &AminKernel,
    &MaxKernel,
    &MinKernel,
    &ArgmaxKernel,
    &ArgminKernel,
    &AllKernel,
    &AnyKernel,
    &VarKernel,
    &StdKernel,
    &LogsumexpKernel,
    &NormKernel,
    &CumsumKernel,
    &CumprodKernel,
    &SoftmaxKernel,
    &LogSoftmaxKernel,
    &LayerNormKernel,
    &NllLossKernel,
    &BmmKernel,
    &Conv2dKernel,
    &MAX_POOL2D,
    &MAX_POOL2D_WITH_INDICES,
    &AvgPool2dKernel,
    &AdaptiveAvgPool2dKernel,
    &AttentionKernel,
    // Pointwise math (`docs/ops.md`, "Pointwise math").
    &ExpKernel,
    &Exp2Kernel,
    &LogKernel,
    &Log2Kernel,
    &Log1pKernel,
    &Expm1Kernel,
    &SqrtKernel,
    &RsqrtKernel,
    &ReciprocalKernel,
    &SinKernel,
    &CosKernel,
    &TanhKernel,
    &SigmoidKernel,
    &SiluKernel,
    &GeluKernel,
    &ErfKernel,
    &NegKernel,
    &AbsKernel,
    &SignKernel,
    &FloorKernel,
    &CeilKernel,
    &RoundKernel,
    &IsnanKernel,
    &IsinfKernel,
    &IsfiniteKernel,
    &LogicalNotKernel,
    &PowKernel,
    &PowScalarKernel,
    &MaximumKernel,
    &MinimumKernel,
    &Atan2Kernel,
    &DivFloorKernel,
    &DivTruncKernel,
    &RemainderKernel,
    &FmodKernel,
    &LogicalAndKernel,
    &LogicalOrKernel,
    &LogicalXorKernel,
    &WhereKernel,
    &ClampKernel,
    &ClampScalarKernel,
    &LerpKernel,
    &LerpScalarKernel,
    &AddcmulKernel,
    &AddcdivKernel,
    &TrilKernel,
    &TriuKernel,
    &OneHotKernel,
    &CatKernel,
    &IndexSelectKernel,
    &GatherKernel,
    &ScatterKernel,
    &IndexAddKernel,
    &IndexKernel,
    &IndexPutKernel,
    &NonzeroKernel,
];

/// The dtypes an op computes on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dtypes {
    /// All eight.
    All,
    /// All but `bool`.
    Numeric,
    /// `f16`, `bf16`, `f32`, `f64`.
    Floating,
}

impl Dtypes {
    /// The dtypes of the group, in `DType::ALL`'s order.
    pub(crate) const fn list(self) -> &'static [DType] {
        use DType::*;
        match self {
            Dtypes::All => &DType::ALL,
            Dtypes::Numeric => &[U8, I32, I64, F16, BF16, F32, F64],
            Dtypes::Floating => &[F16, BF16, F32, F64],
        }
    }

    fn admits(self, d: DType) -> bool {
        match self {
            Dtypes::All => true,
            Dtypes::Numeric => d != DType::Bool,
            Dtypes::Floating => d.is_floating(),
        }
    }
}

/// Refuse `op` on `dtype` unless `dtypes` admits it, saying what to do instead.
fn check_dtype(op: &str, dtype: DType, dtypes: Dtypes) -> Result<(), String> {
    if dtypes.admits(dtype) {
        Ok(())
    } else {
        Err(refusal(op, dtype, dtypes))
    }
}

/// Why `op` does not compute on `dtype`.
#[cold]
fn refusal(op: &str, dtype: DType, dtypes: Dtypes) -> String {
    match dtypes {
        Dtypes::Floating if op.starts_with("div") || op.starts_with("rdiv") => {
            format!("{op} of {dtype} tensors gives floats: cast to a floating dtype first")
        }
        Dtypes::Floating => format!("{op} computes on floating dtypes, not {dtype}: cast to one first"),
        _ => format!("{op} of {dtype} tensors is not supported: cast to a numeric dtype first"),
    }
}

// ---- inference helpers --------------------------------------------------------------

/// The message for a call with `got` inputs where `n` were expected.
#[cold]
fn count_error(n: usize, got: usize) -> String {
    let s = if n == 1 { "" } else { "s" };
    format!("expected {n} input{s}, got {got}")
}

/// Refuse a call with other than `n` inputs.
fn expect_inputs(inputs: &[&TensorMeta], n: usize) -> Result<(), String> {
    if inputs.len() == n {
        Ok(())
    } else {
        Err(count_error(n, inputs.len()))
    }
}

/// The dtype shared by all inputs (at least one), or an error naming the first that
/// differs from input 0.
fn common_dtype(inputs: &[&TensorMeta]) -> Result<DType, String> {
    let first = inputs.first().ok_or("expected at least one input, got none")?.dtype;
    match inputs.iter().position(|m| m.dtype != first) {
        None => Ok(first),
        Some(i) => {
            Err(format!("input {i} is {} but input 0 is {first}: cast to one dtype first", inputs[i].dtype))
        }
    }
}

/// The output spec that copies `meta`'s shape and dtype.
fn spec_of(meta: &TensorMeta) -> OutSpec {
    OutSpec { shape: meta.shape.clone(), dtype: meta.dtype }
}

/// The shape inputs 0 and 1 broadcast to (NumPy's rule: aligned at the last dimension,
/// each pair equal or one of them 1), or an error naming both.
fn broadcast_shapes(a: &TensorMeta, b: &TensorMeta) -> Result<Shape, String> {
    if a.shape == b.shape {
        return Ok(a.shape.clone());
    }
    let rank = a.shape.len().max(b.shape.len());
    let dim = |s: &Shape, d: usize| (d + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
    let mut shape = Shape::with_capacity(rank);
    for d in 0..rank {
        let (x, y) = (dim(&a.shape, d), dim(&b.shape, d));
        shape.push(match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => {
                return Err(format!(
                    "input 0 is {} and input 1 is {}: the shapes do not broadcast (dimension {d} of \
                     the result: {x} against {y})",
                    a.describe(),
                    b.describe()
                ))
            }
        });
    }
    Ok(shape)
}

#[cfg(test)]
mod proptests;
#[cfg(test)]
mod reference;
#[cfg(test)]
mod testing;
#[cfg(test)]
mod unzeroed_tests;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_have_distinct_names_and_take_every_layout() {
        let mut names: Vec<&str> = BUILTINS.iter().map(|k| k.name()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), BUILTINS.len());
        let in_place = [
            "fill",
            "copy",
            "add",
            "mul",
            "sub",
            "div",
            "scale",
            "relu",
            "relu_grad",
            "add_bias",
            "add_scalar",
            "rsub_scalar",
            "mul_scalar",
            "div_scalar",
            "rdiv_scalar",
            "masked_fill",
            "eq",
            "ne",
            "lt",
            "le",
            "gt",
            "ge",
            "eq_scalar",
            "ne_scalar",
            "lt_scalar",
            "le_scalar",
            "gt_scalar",
            "ge_scalar",
            // Pointwise math.
            "exp",
            "exp2",
            "log",
            "log2",
            "log1p",
            "expm1",
            "sqrt",
            "rsqrt",
            "reciprocal",
            "sin",
            "cos",
            "tanh",
            "sigmoid",
            "silu",
            "gelu",
            "erf",
            "neg",
            "abs",
            "sign",
            "floor",
            "ceil",
            "round",
            "pow",
            "pow_scalar",
            "maximum",
            "minimum",
            "atan2",
            "div_floor",
            "div_trunc",
            "remainder",
            "fmod",
            "clamp",
            "clamp_scalar",
            "lerp",
            "lerp_scalar",
            "addcmul",
            "addcdiv",
            "tril",
            "triu",
            "scatter",
            "index_add",
            "index_put",
        ];
        for k in BUILTINS {
            assert_eq!(k.cross_device(), k.name() == "copy", "{}", k.name());
            let diag = ["noop", "fail", "panic"].contains(&k.name());
            assert_eq!(k.strided(), !diag, "{}", k.name());
            assert_eq!(k.in_place(), in_place.contains(&k.name()), "{}", k.name());
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
        assert_eq!(
            common_dtype(&[&f, &f, &i, &f]),
            Err("input 2 is i64 but input 0 is f32: cast to one dtype first".into())
        );
        assert!(common_dtype(&[]).is_err());
    }

    #[test]
    fn shapes_broadcast_as_numpy_says() {
        use crate::ep::DeviceId;
        let m = |s: &[usize]| TensorMeta::new(s, DType::F32, DeviceId::CPU);
        let b = |x: &[usize], y: &[usize]| broadcast_shapes(&m(x), &m(y)).map(|s| s.to_vec());
        assert_eq!(b(&[2, 3], &[3]), Ok(vec![2, 3]));
        assert_eq!(b(&[4, 1, 3], &[2, 1]), Ok(vec![4, 2, 3]));
        assert_eq!(b(&[], &[0, 2]), Ok(vec![0, 2]));
        assert_eq!(b(&[1], &[0]), Ok(vec![0]));
        assert_eq!(
            b(&[2, 3], &[3, 2]).unwrap_err(),
            "input 0 is f32[2, 3] and input 1 is f32[3, 2]: the shapes do not broadcast (dimension 0 of \
             the result: 2 against 3)"
        );
    }
}
