//! Ops of a tensor and the scalar argument (`attrs.value()`): `add_scalar` (`x + s`),
//! `rsub_scalar` (`s - x`), `mul_scalar` (`x * s`, as `scale`), `div_scalar` (`x / s`) and
//! `rdiv_scalar` (`s / x`).
//!
//! The scalar is converted to the input's compute type first (`dtype::Elem::compute_scalar`):
//! an `Int` exactly for an integer dtype, a `Float` to `f32` for `f16` and `bf16` (PyTorch's
//! CPU kernels keep a scalar operand in the compute type too), then each value is computed
//! as the tensor ops compute it. Each works in place.

use super::dtype::{Arith, Elem, Float, Ring};
use super::elementwise::unary_kernel;
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpecs, TensorMeta};

unary_kernel!(
    /// `add_scalar`: `x + s`; every dtype (integers wrap; `bool` is `or`).
    AddScalarKernel, "add_scalar", all, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Ring::add(x.load(), s))
    }
);

unary_kernel!(
    /// `rsub_scalar`: `s - x`; every dtype but `bool` (integers wrap).
    RsubScalarKernel, "rsub_scalar", numeric, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Arith::sub(s, x.load()))
    }
);

unary_kernel!(
    /// `mul_scalar`: `x * s`; every dtype (integers wrap; `bool` is `and`). The same as
    /// `scale`.
    MulScalarKernel, "mul_scalar", all, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Ring::mul(x.load(), s))
    }
);

unary_kernel!(
    /// `div_scalar`: `x / s`, true division; floating dtypes only.
    DivScalarKernel, "div_scalar", floating, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Float::div(x.load(), s))
    }
);

unary_kernel!(
    /// `rdiv_scalar`: `s / x`, true division; floating dtypes only.
    RdivScalarKernel, "rdiv_scalar", floating, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Float::div(s, x.load()))
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run_with, t_f32, t_i64, tensor, values};
    use crate::vm::f16;

    #[test]
    fn scalar_ops_by_hand() {
        let x = || t_f32(&[3], &[1.0, -2.0, 4.0]);
        let run =
            |k: &dyn OpKernel, s: f64| as_f32(&run_with(k, Attrs::scalar(s), vec![x()], &[]).unwrap()[0]);
        assert_eq!(run(&AddScalarKernel, 0.5), [1.5, -1.5, 4.5]);
        assert_eq!(run(&RsubScalarKernel, 1.0), [0.0, 3.0, -3.0]);
        assert_eq!(run(&MulScalarKernel, -2.0), [-2.0, 4.0, -8.0]);
        assert_eq!(run(&DivScalarKernel, 4.0), [0.25, -0.5, 1.0]);
        assert_eq!(run(&RdivScalarKernel, 8.0), [8.0, -4.0, 2.0]);
    }

    #[test]
    fn integer_scalars_are_exact_and_wrap() {
        let big = (1i64 << 62) + 1;
        let x = t_i64(&[2], &[1, i64::MAX]);
        let out = run_with(&AddScalarKernel, Attrs::integer(big), vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![big + 1, i64::MAX.wrapping_add(big)]);
        let x = tensor(&[2], &[250u8, 3]);
        let out = run_with(&RsubScalarKernel, Attrs::integer(2), vec![x], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), vec![8, 255]);
    }

    #[test]
    fn half_float_scalars_stay_in_f32() {
        // 2049 is not an f16 (it rounds to 2048), but 1 + 2049 computed in f32 is 2050, an f16.
        let x = tensor(&[1], &[f16::ONE]);
        let out = run_with(&AddScalarKernel, Attrs::scalar(2049.0), vec![x], &[]).unwrap();
        assert_eq!(values::<f16>(&out[0]), vec![f16::from_f32(2050.0)]);
    }

    #[test]
    fn division_of_integers_is_refused() {
        let x = t_i64(&[1], &[1]).0;
        for k in [&DivScalarKernel as &dyn OpKernel, &RdivScalarKernel] {
            assert!(infer_err(k, &[&x], &[]).ends_with("gives floats: cast to a floating dtype first"));
        }
        let b = tensor(&[1], &[true]).0;
        assert!(infer_err(&RsubScalarKernel, &[&b], &[]).contains("not supported"));
    }
}
