//! Binary math, two inputs of one dtype broadcast (NumPy's rule): `pow`, `maximum`,
//! `minimum`, `atan2`, `div_floor` and `div_trunc` (`div` with PyTorch's `rounding_mode`),
//! `remainder`, `fmod`, and `logical_and`, `logical_or`, `logical_xor` (a `bool` output);
//! and `pow_scalar`, a tensor to the power of the scalar argument.
//!
//! Integer division by zero (`div_floor`, `div_trunc`, `remainder`, `fmod` of `u8`, `i32`,
//! `i64`) fails the kernel with a message naming the op (`Error::Kernel`, raised when the
//! result is read), as PyTorch raises `ZeroDivisionError` on the CPU; floats divide by
//! IEEE's rules. Each works in place but the logical ops.

use std::cell::Cell;

use super::dtype::{dispatch, float_of, zero, Bool8, Elem};
use super::elementwise::{binary_kernel, infer_binary, input_dtype, unary_kernel};
use super::loops::zip;
use super::pointwise::{maximum, minimum, Num, Real};
use super::{refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// Defines a kernel of two inputs of one dtype of `$group`, broadcast, writing that dtype:
/// `$f(a, b)` of the compute-type values (`elementwise::binary_kernel!` over the stored ones,
/// each loaded before and stored after).
macro_rules! binary_math {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $group:ident, |$a:ident, $b:ident| $f:expr) => {
        binary_kernel!($(#[$doc])* $kernel, $op, $group, T => |x: T, y: T| {
            let ($a, $b) = (x.load(), y.load());
            T::store($f)
        });
    };
}

binary_math!(
    /// `pow`: `a ** b`; numeric dtypes. Floats by IEEE's `pow`; integers exactly, wrapping,
    /// a negative exponent giving 1 for a base of 1, ±1 for -1 and 0 otherwise (as
    /// PyTorch's integer `pow`).
    PowKernel, "pow", numeric, |a, b| Num::pow(a, b)
);
binary_math!(
    /// `maximum`: the larger of `a` and `b`; a NaN where either is one. Every dtype.
    MaximumKernel, "maximum", all, |a, b| maximum(a, b)
);
binary_math!(
    /// `minimum`: the smaller of `a` and `b`; a NaN where either is one. Every dtype.
    MinimumKernel, "minimum", all, |a, b| minimum(a, b)
);
binary_math!(
    /// `atan2`: the angle of the point `(b, a)`, `atan2(a, b)`; floating dtypes.
    Atan2Kernel, "atan2", floating, |a, b| Real::atan2(a, b)
);

/// Defines a numeric kernel of two inputs that fails on an integer division by zero.
macro_rules! dividing {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $f:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                Dtypes::Numeric.list()
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_binary($op, inputs, outputs, Dtypes::Numeric, |d| d)
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
                let by_zero = Cell::new(false);
                dispatch!(dtype, numeric, T => zip::<T, T, T>(ctx, |x: T, y: T| {
                    match Num::$f(x.load(), y.load()) {
                        Some(v) => T::store(v),
                        None => {
                            by_zero.set(true);
                            T::store(zero::<T>())
                        }
                    }
                }), Err(refusal($op, dtype, Dtypes::Numeric)))?;
                if by_zero.get() {
                    return Err(format!(
                        "{}: integer division by zero (input 1 of {dtype} holds a 0)",
                        $op
                    ));
                }
                Ok(())
            }
        }
    };
}

dividing!(
    /// `div_floor`: `a / b` rounded toward minus infinity (PyTorch's `div` with
    /// `rounding_mode="floor"`, Python's `//`); numeric dtypes. Floats as PyTorch's
    /// `div_floor_floating` (from the exact remainder); integers wrap (`i64::MIN // -1` is
    /// `i64::MIN`) and fail on a division by zero.
    DivFloorKernel, "div_floor", div_floor
);
dividing!(
    /// `div_trunc`: `a / b` rounded toward zero (`rounding_mode="trunc"`); numeric dtypes;
    /// integers fail on a division by zero.
    DivTruncKernel, "div_trunc", div_trunc
);
dividing!(
    /// `remainder`: `a - b * floor(a / b)`, of the sign of `b` (Python's `%`); numeric
    /// dtypes; integers fail on a division by zero, a float remainder by 0 is NaN.
    RemainderKernel, "remainder", remainder
);
dividing!(
    /// `fmod`: `a - b * trunc(a / b)`, of the sign of `a` (C's `fmod`); numeric dtypes;
    /// integers fail on a division by zero, a float `fmod` by 0 is NaN.
    FmodKernel, "fmod", fmod
);

/// Defines a logical kernel: two inputs of one dtype (any), broadcast, a `bool` output of
/// `$f` of their truth values (nonzero is true; a NaN is true).
macro_rules! logical {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, |$a:ident, $b:ident| $f:expr) => {
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

            fn writes_outputs(&self) -> bool {
                true
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                let dtype = input_dtype(ctx)?;
                dispatch!(dtype, all, T => zip::<Bool8, T, T>(ctx, |x: T, y: T| {
                    let ($a, $b) = (float_of(x) != 0.0, float_of(y) != 0.0);
                    Bool8::of($f)
                }), Err(refusal($op, dtype, Dtypes::All)))
            }
        }
    };
}

logical!(
    /// `logical_and`: both nonzero.
    LogicalAndKernel, "logical_and", |a, b| a && b
);
logical!(
    /// `logical_or`: either nonzero.
    LogicalOrKernel, "logical_or", |a, b| a || b
);
logical!(
    /// `logical_xor`: exactly one nonzero.
    LogicalXorKernel, "logical_xor", |a, b| a != b
);

unary_kernel!(
    /// `pow_scalar`: `x ** s` with the scalar argument `s` converted to the compute type
    /// (`dtype::Elem::compute_scalar`); numeric dtypes, as `pow`. (The front ends refuse
    /// an integer tensor to a negative integer power, as PyTorch does.)
    PowScalarKernel, "pow_scalar", numeric, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Num::pow(x.load(), s))
    }
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, as_i64, compute_raw, infer_err, run, run_with, t_f32, t_i64, tensor, values,
    };

    #[test]
    fn pow_of_floats_and_integers() {
        let a = t_f32(&[4], &[2.0, -8.0, 0.0, f32::NAN]);
        let b = t_f32(&[4], &[0.5, 1.0 / 3.0, -1.0, 0.0]);
        let out = as_f32(&run(&PowKernel, 0.0, vec![a, b], &[]).unwrap()[0]);
        assert_eq!(out[0], 2f32.sqrt());
        assert!(out[1].is_nan());
        assert_eq!(out[2], f32::INFINITY);
        assert_eq!(out[3], 1.0, "NaN ** 0 is 1");
        let a = t_i64(&[2, 1], &[3, -2]);
        let b = t_i64(&[3], &[0, 5, 63]);
        let out = run(&PowKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), [1, 243, 3i64.wrapping_pow(63), 1, -32, i64::MIN]);
        let x = t_i64(&[3], &[2, -3, 7]);
        let out = run_with(&PowScalarKernel, Attrs::integer(3), vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), [8, -27, 343]);
    }

    #[test]
    fn maximum_minimum_every_dtype_and_nan() {
        let a = || t_f32(&[4], &[1.0, f32::NAN, 3.0, -0.0]);
        let b = || t_f32(&[4], &[2.0, 0.0, f32::NAN, 5.0]);
        let out = as_f32(&run(&MaximumKernel, 0.0, vec![a(), b()], &[]).unwrap()[0]);
        assert_eq!(out[0], 2.0);
        assert!(out[1].is_nan() && out[2].is_nan());
        let out = as_f32(&run(&MinimumKernel, 0.0, vec![a(), b()], &[]).unwrap()[0]);
        assert_eq!((out[0], out[3]), (1.0, -0.0));
        assert!(out[1].is_nan() && out[2].is_nan());
        let out =
            run(&MaximumKernel, 0.0, vec![tensor(&[2], &[true, false]), tensor(&[2], &[false, false])], &[])
                .unwrap();
        assert_eq!(values::<u8>(&out[0]), [1, 0]);
    }

    #[test]
    fn rounding_divisions_as_python() {
        let a = || t_i64(&[6], &[7, -7, 7, -7, 0, i64::MIN]);
        let b = || t_i64(&[6], &[2, 2, -2, -2, 3, -1]);
        let q = run(&DivFloorKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&q[0]), [3, -4, -4, 3, 0, i64::MIN]);
        let t = run(&DivTruncKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&t[0]), [3, -3, -3, 3, 0, i64::MIN]);
        let r = run(&RemainderKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&r[0]), [1, 1, -1, -1, 0, 0]);
        let f = run(&FmodKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&f[0]), [1, -1, 1, -1, 0, 0]);
        let a = || t_f32(&[5], &[7.5, -7.5, 1.0, -1.0, 0.0]);
        let b = || t_f32(&[5], &[2.0, 2.0, 0.0, 0.0, 0.0]);
        let q = as_f32(&run(&DivFloorKernel, 0.0, vec![a(), b()], &[]).unwrap()[0]);
        assert_eq!(&q[..4], &[3.0, -4.0, f32::INFINITY, f32::NEG_INFINITY]);
        assert!(q[4].is_nan());
        let r = as_f32(&run(&RemainderKernel, 0.0, vec![a(), b()], &[]).unwrap()[0]);
        assert_eq!(&r[..2], &[1.5, 0.5]);
        assert!(r[2].is_nan());
    }

    #[test]
    fn integer_division_by_zero_fails_the_kernel() {
        for k in [&DivFloorKernel as &dyn OpKernel, &DivTruncKernel, &RemainderKernel, &FmodKernel] {
            let err = run(k, 0.0, vec![t_i64(&[3], &[1, 2, 3]), t_i64(&[3], &[1, 0, 1])], &[]).unwrap_err();
            assert_eq!(err, format!("{}: integer division by zero (input 1 of i64 holds a 0)", k.name()));
            let err = run(k, 0.0, vec![tensor(&[1], &[5u8]), tensor(&[1], &[0u8])], &[]).unwrap_err();
            assert!(err.contains("division by zero"), "{err}");
        }
        let b = tensor(&[1], &[true]).0;
        assert!(infer_err(&DivFloorKernel, &[&b, &b], &[]).contains("not supported"));
    }

    #[test]
    fn logical_ops_give_bool() {
        let a = || t_f32(&[4], &[0.0, 0.0, 2.0, f32::NAN]);
        let b = || t_f32(&[4], &[0.0, -1.0, 0.0, 1.0]);
        let v = |k: &dyn OpKernel| {
            let out = run(k, 0.0, vec![a(), b()], &[]).unwrap();
            assert_eq!(out[0].0.dtype, DType::Bool);
            values::<u8>(&out[0])
        };
        assert_eq!(v(&LogicalAndKernel), [0, 0, 0, 1]);
        assert_eq!(v(&LogicalOrKernel), [0, 1, 1, 1]);
        assert_eq!(v(&LogicalXorKernel), [0, 1, 1, 0]);
    }

    #[test]
    fn atan2_and_broadcast_in_place() {
        let y = t_f32(&[2], &[1.0, -1.0]);
        let x = t_f32(&[2, 1], &[1.0, -1.0]);
        let out = as_f32(&run(&Atan2Kernel, 0.0, vec![y, x], &[]).unwrap()[0]);
        let want = [1f32.atan2(1.0), (-1f32).atan2(1.0), 1f32.atan2(-1.0), (-1f32).atan2(-1.0)];
        assert_eq!(out, want);
        // maximum(x, x reversed) into x: the reversed input is staged.
        let x = t_f32(&[4], &[1.0, 5.0, 2.0, 0.0]);
        let rev = x.0.with_layout(&[4], &[-1], 3);
        compute_raw(&MaximumKernel, Attrs::default(), &[(&x.0, &x.1), (&rev, &x.1)], (&x.0, &x.1)).unwrap();
        assert_eq!(as_f32(&x), [1.0, 5.0, 5.0, 1.0]);
    }
}
