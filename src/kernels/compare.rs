//! Comparisons, with a `bool` output: `eq`, `ne`, `lt`, `le`, `gt`, `ge` of two tensors
//! (one dtype, broadcast) and `eq_scalar` ... `ge_scalar` of a tensor and the scalar
//! argument. Every dtype; IEEE semantics (a NaN compares false, except under `ne`); `false`
//! is less than `true`.
//!
//! A scalar is compared in the tensor's type when the tensor is floating (converted to its
//! dtype by the conversion rule, as PyTorch converts it, then compared in the compute
//! type). Against an integral tensor (`bool` and the integers), an `Int` or `Bool` scalar is
//! compared exactly, as an `i64`, and a `Float` one in `f64` (so `[2] < 2.5` is `true`).

use super::dtype::{dispatch, float_of, int_of, Bool8, Elem};
use super::elementwise::{infer_binary, infer_unary, input_dtype};
use super::loops::{map, zip};
use super::{refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, Scalar, TensorMeta};

/// Defines the comparison `$op` of two tensors and `$op_scalar` of a tensor and a scalar.
macro_rules! comparison {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $(#[$sdoc:meta])* $skernel:ident, $sop:literal, $cmp:tt) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                &DType::ALL
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_binary($op, inputs, outputs, Dtypes::All, |_| DType::Bool)
            }

            fn strided(&self) -> bool {
                true
            }


            fn pointwise(&self) -> bool {

                true

            }

            fn in_place(&self) -> bool {
                true
            }

            fn writes_outputs(&self) -> bool {
                true
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                let dtype = input_dtype(ctx)?;
                dispatch!(dtype, all, T => zip::<Bool8, T, T>(ctx, |a: T, b: T| Bool8::of(a.load() $cmp b.load())),
                    Err(refusal($op, dtype, Dtypes::All)))
            }
        }

        $(#[$sdoc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $skernel;

        impl OpKernel for $skernel {
            fn name(&self) -> &'static str {
                $sop
            }

            fn dtypes(&self) -> &'static [DType] {
                &DType::ALL
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_unary($sop, inputs, outputs, Dtypes::All)?;
                outputs[0].dtype = DType::Bool;
                Ok(())
            }

            fn strided(&self) -> bool {
                true
            }


            fn pointwise(&self) -> bool {

                true

            }

            fn in_place(&self) -> bool {
                true
            }

            fn writes_outputs(&self) -> bool {
                true
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                let dtype = input_dtype(ctx)?;
                let s = ctx.attrs.value();
                dispatch!(dtype, all, T => {
                    if T::DTYPE.is_floating() {
                        let v = T::narrow(s.into()).load();
                        map::<Bool8, T>(ctx, |x: T| Bool8::of(x.load() $cmp v))
                    } else if let Scalar::Float(f) = s {
                        map::<Bool8, T>(ctx, |x: T| Bool8::of(float_of(x) $cmp f))
                    } else {
                        let v = s.as_i64();
                        map::<Bool8, T>(ctx, |x: T| Bool8::of(int_of(x) $cmp v))
                    }
                }, Err(refusal($sop, dtype, Dtypes::All)))
            }
        }
    };
}

comparison!(
    /// `eq`: `a == b`, broadcast, as `bool`.
    EqKernel, "eq",
    /// `eq_scalar`: `x == s`, as `bool`.
    EqScalarKernel, "eq_scalar", ==
);
comparison!(
    /// `ne`: `a != b`, broadcast, as `bool` (`true` where either is NaN).
    NeKernel, "ne",
    /// `ne_scalar`: `x != s`, as `bool`.
    NeScalarKernel, "ne_scalar", !=
);
comparison!(
    /// `lt`: `a < b`, broadcast, as `bool`.
    LtKernel, "lt",
    /// `lt_scalar`: `x < s`, as `bool`.
    LtScalarKernel, "lt_scalar", <
);
comparison!(
    /// `le`: `a <= b`, broadcast, as `bool`.
    LeKernel, "le",
    /// `le_scalar`: `x <= s`, as `bool`.
    LeScalarKernel, "le_scalar", <=
);
comparison!(
    /// `gt`: `a > b`, broadcast, as `bool`.
    GtKernel, "gt",
    /// `gt_scalar`: `x > s`, as `bool`.
    GtScalarKernel, "gt_scalar", >
);
comparison!(
    /// `ge`: `a >= b`, broadcast, as `bool`.
    GeKernel, "ge",
    /// `ge_scalar`: `x >= s`, as `bool`.
    GeScalarKernel, "ge_scalar", >=
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{run, run_with, t_f32, t_i64, tensor, values};
    use crate::vm::f16;

    #[test]
    fn comparisons_follow_ieee() {
        let a = || t_f32(&[4], &[1.0, f32::NAN, -0.0, 2.0]);
        let b = || t_f32(&[4], &[1.0, f32::NAN, 0.0, 1.0]);
        let cmp = |k: &dyn OpKernel| {
            let out = run(k, 0.0, vec![a(), b()], &[]).unwrap();
            assert_eq!(out[0].0.dtype, DType::Bool);
            values::<u8>(&out[0])
        };
        assert_eq!(cmp(&EqKernel), [1, 0, 1, 0]);
        assert_eq!(cmp(&NeKernel), [0, 1, 0, 1]);
        assert_eq!(cmp(&LtKernel), [0, 0, 0, 0]);
        assert_eq!(cmp(&LeKernel), [1, 0, 1, 0]);
        assert_eq!(cmp(&GtKernel), [0, 0, 0, 1]);
        assert_eq!(cmp(&GeKernel), [1, 0, 1, 1]);
    }

    #[test]
    fn scalars_against_integers_compare_exactly() {
        let x = || t_i64(&[3], &[2, 3, i64::MAX]);
        let cmp = |k: &dyn OpKernel, a: Attrs| values::<u8>(&run_with(k, a, vec![x()], &[]).unwrap()[0]);
        // A float scalar: in f64.
        assert_eq!(cmp(&LtScalarKernel, Attrs::scalar(2.5)), [1, 0, 0]);
        // An integer scalar: exactly, beyond f64's 53 bits.
        assert_eq!(cmp(&EqScalarKernel, Attrs::integer(i64::MAX)), [0, 0, 1]);
        assert_eq!(cmp(&LtScalarKernel, Attrs::integer(i64::MAX)), [1, 1, 0]);
        // Against u8, a scalar out of its range is not wrapped.
        let u = tensor(&[2], &[0u8, 255]);
        let out = run_with(&LtScalarKernel, Attrs::integer(256), vec![u], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), [1, 1]);
        let b = tensor(&[2], &[false, true]);
        let out = run_with(&EqScalarKernel, Attrs::integer(2), vec![b], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), [0, 0]);
    }

    #[test]
    fn scalars_against_floats_convert_to_the_dtype() {
        // 0.1 as f16 is 0.0999755859375: equal to an f16 0.1, though not to 0.1.
        let x = tensor(&[1], &[f16::from_f64(0.1)]);
        let out = run_with(&EqScalarKernel, Attrs::scalar(0.1), vec![x], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), [1]);
        let x = t_f32(&[2], &[f32::NAN, 1.0]);
        let out = run_with(&NeScalarKernel, Attrs::scalar(f64::NAN), vec![x], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), [1, 1]);
    }

    #[test]
    fn comparisons_broadcast_and_need_one_dtype() {
        let a = t_i64(&[2, 1], &[1, 5]);
        let b = t_i64(&[3], &[0, 1, 9]);
        let out = run(&GtKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3]);
        assert_eq!(values::<u8>(&out[0]), [1, 0, 0, 1, 1, 0]);
        let err = run(&EqKernel, 0.0, vec![t_f32(&[1], &[0.0]), t_i64(&[1], &[0])], &[]).unwrap_err();
        assert_eq!(err, "input 1 is i64 but input 0 is f32: cast to one dtype first");
    }
}
