//! Elementwise arithmetic: `add`, `sub`, `mul`, `div`, `relu`, `relu_grad`, `add_bias`,
//! `scale`.
//!
//! Binary ops broadcast their inputs (NumPy's rule) and take one dtype for both; each works
//! in place (the output exactly an input). `f16` and `bf16` compute in `f32` and round once
//! on store; integers wrap.

use super::dtype::{dispatch, zero, Arith, Elem, Float, Ring};
use super::loops::{input, zip};
use super::{broadcast_shapes, check_dtype, common_dtype, expect_inputs, refusal, spec_of, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// Two inputs of one dtype that `dtypes` admits; the output has their broadcast shape and
/// the dtype `out` gives (their own for arithmetic, `bool` for comparisons).
pub(super) fn infer_binary(
    op: &str,
    inputs: &[&TensorMeta],
    outputs: &mut OutSpecs,
    dtypes: Dtypes,
    out: impl Fn(DType) -> DType,
) -> Result<(), String> {
    expect_inputs(inputs, 2)?;
    let dtype = common_dtype(inputs)?;
    check_dtype(op, dtype, dtypes)?;
    let shape = broadcast_shapes(inputs[0], inputs[1])?;
    outputs.push(OutSpec { shape, dtype: out(dtype) });
    Ok(())
}

/// One input of a dtype that `dtypes` admits; the output is like it.
pub(super) fn infer_unary(
    op: &str,
    inputs: &[&TensorMeta],
    outputs: &mut OutSpecs,
    dtypes: Dtypes,
) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    check_dtype(op, inputs[0].dtype, dtypes)?;
    outputs.push(spec_of(inputs[0]));
    Ok(())
}

/// The dtype of input 0 of a call.
pub(super) fn input_dtype(ctx: &KernelCtx<'_, '_>) -> Result<DType, String> {
    Ok(input(ctx, 0)?.meta.dtype)
}

/// Defines an elementwise kernel over two inputs of one dtype, broadcast, writing that
/// dtype: `binary_kernel!(doc, Name, "op", dtypes, T => |a: T, b: T| -> T)`, where `dtypes`
/// is a group of `dtype::dispatch` (`all`, `numeric`, `floating`) and `T` the stored type.
macro_rules! binary_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $group:ident, $t:ident => $f:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [$crate::vm::DType] {
                $crate::kernels::dtype::group!($group).list()
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_binary($op, inputs, outputs, $crate::kernels::dtype::group!($group), |d| d)
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
                dispatch!(dtype, $group, $t => zip::<$t, $t, $t>(ctx, $f),
                    Err(refusal($op, dtype, $crate::kernels::dtype::group!($group))))
            }
        }
    };
}

/// Defines an elementwise kernel over one input, writing its dtype:
/// `unary_kernel!(doc, Name, "op", dtypes, |ctx| T => |x: T| -> T)`; the closure is built
/// once per call from the call's context (for a scalar argument).
macro_rules! unary_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $group:ident, |$ctx:ident| $t:ident => $f:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [$crate::vm::DType] {
                $crate::kernels::dtype::group!($group).list()
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                $crate::kernels::elementwise::infer_unary($op, inputs, outputs, $crate::kernels::dtype::group!($group))
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

            fn compute(&self, $ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                let dtype = $crate::kernels::elementwise::input_dtype($ctx)?;
                $crate::kernels::dtype::dispatch!(dtype, $group,
                    $t => { let f = $f; $crate::kernels::loops::map::<$t, $t>($ctx, f) },
                    Err($crate::kernels::refusal($op, dtype, $crate::kernels::dtype::group!($group))))
            }
        }
    };
}
pub(super) use {binary_kernel, unary_kernel};

binary_kernel!(
    /// `add`: `a + b`, broadcast; every dtype (integers wrap; `bool` is `or`).
    AddKernel, "add", all, T => |a: T, b: T| T::store(Ring::add(a.load(), b.load()))
);

binary_kernel!(
    /// `sub`: `a - b`, broadcast; every dtype but `bool` (integers wrap).
    SubKernel, "sub", numeric, T => |a: T, b: T| T::store(Arith::sub(a.load(), b.load()))
);

binary_kernel!(
    /// `mul`: `a * b`, broadcast; every dtype (integers wrap; `bool` is `and`).
    MulKernel, "mul", all, T => |a: T, b: T| T::store(Ring::mul(a.load(), b.load()))
);

binary_kernel!(
    /// `div`: `a / b`, true division, broadcast; floating dtypes only (PyTorch gives floats
    /// for integers, which the front end gets by casting first).
    DivKernel, "div", floating, T => |a: T, b: T| T::store(Float::div(a.load(), b.load()))
);

binary_kernel!(
    /// `relu_grad`: inputs `dy` (the gradient of `relu(x)`) and `x`, broadcast; the output
    /// is the gradient with respect to `x`: `dy` where `x > 0`, 0 elsewhere (at `x == 0`,
    /// and where `x` is NaN, the gradient is 0). Numeric dtypes.
    ReluGradKernel, "relu_grad", numeric,
    T => |dy: T, x: T| if x.load() > zero::<T>() { dy } else { T::store(zero::<T>()) }
);

unary_kernel!(
    /// `relu`: `max(x, 0)`; numeric dtypes. Negative values become 0; NaN stays NaN (as in
    /// the usual frameworks) and `-0.0` stays `-0.0`.
    ReluKernel, "relu", numeric, |ctx| T => |x: T| {
        let v = x.load();
        if v < zero::<T>() { T::store(zero::<T>()) } else { x }
    }
);

unary_kernel!(
    /// `scale`: `x * attrs.value()`, every dtype (as `mul_scalar`). The scalar is converted
    /// to the compute type first (`dtype::Elem::compute_scalar`): an `Int` exactly, a `Float`
    /// truncated toward zero for an integer tensor, rounded to `f32` for `f16` and `bf16`.
    ScaleKernel, "scale", all, |ctx| T => {
        let s = T::compute_scalar(ctx.attrs.value());
        move |x: T| T::store(Ring::mul(x.load(), s))
    }
);

/// `add_bias`: inputs `x: [n, k]` and `b: [k]` of one dtype; output `[n, k]` with
/// `out[i][j] = x[i][j] + b[j]` (`add` with the bias broadcast over the rows, kept for the
/// shape check and recorded traces). Every dtype, in place.
#[derive(Debug, Clone, Copy, Default)]
pub struct AddBiasKernel;

impl OpKernel for AddBiasKernel {
    fn name(&self) -> &'static str {
        "add_bias"
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
        expect_inputs(inputs, 2)?;
        common_dtype(inputs)?;
        bias_dims(inputs[0], inputs[1])?;
        outputs.push(spec_of(inputs[0]));
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
        if let [x, b] = ctx.inputs {
            bias_dims(x.meta, b.meta)?;
        }
        AddKernel.compute(ctx)
    }
}

/// `(n, k)` of a 2-D operand, or an error naming input `i`.
pub(super) fn rows_cols(m: &TensorMeta, i: usize) -> Result<(usize, usize), String> {
    match m.shape.as_slice() {
        &[n, k] => Ok((n, k)),
        _ => Err(format!("input {i} is {}: expected a 2-D input [n, k]", m.describe())),
    }
}

/// Check that `x` is `[n, k]` and `b` is `[k]`.
fn bias_dims(x: &TensorMeta, b: &TensorMeta) -> Result<(), String> {
    let (_, k) = rows_cols(x, 0)?;
    if b.shape.as_slice() != [k] {
        return Err(format!(
            "input 0 is {} and input 1 is {}: the bias must be 1-D with {k} elements",
            x.describe(),
            b.describe()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, as_i64, compute_raw, infer_err, run, t_f32, t_i64, tensor, values,
    };
    use crate::vm::{bf16, f16};

    #[test]
    fn add_mul_values_both_dtypes() {
        let a = || t_f32(&[2, 2], &[1.0, -2.0, 0.5, 4.0]);
        let b = || t_f32(&[2, 2], &[3.0, 2.0, 0.25, -1.0]);
        let out = run(&AddKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![4.0, 0.0, 0.75, 3.0]);
        let out = run(&MulKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![3.0, -4.0, 0.125, -4.0]);

        let a = || t_i64(&[3], &[1, -2, i64::MAX]);
        let b = || t_i64(&[3], &[5, 3, 2]);
        let out = run(&AddKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![6, 1, i64::MIN + 1]);
        let out = run(&MulKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![5, -6, -2]);
    }

    #[test]
    fn bool_add_is_or_and_mul_is_and() {
        let a = || tensor(&[4], &[false, false, true, true]);
        let b = || tensor(&[4], &[false, true, false, true]);
        let out = run(&AddKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), vec![0, 1, 1, 1]);
        let out = run(&MulKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), vec![0, 0, 0, 1]);
        let err = run(&SubKernel, 0.0, vec![a(), b()], &[]).unwrap_err();
        assert_eq!(err, "sub of bool tensors is not supported: cast to a numeric dtype first");
    }

    #[test]
    fn half_floats_compute_in_f32_and_round_once() {
        // 1 + 2^-11 is not an f16: the sum of 1 and 2^-11 rounds (to even) to 1.
        let a = tensor(&[2], &[f16::ONE, f16::from_f32(2048.0)]);
        let b = tensor(&[2], &[f16::from_f32(2f32.powi(-11)), f16::ONE]);
        let out = run(&AddKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(values::<f16>(&out[0]), vec![f16::ONE, f16::from_f32(2048.0)]);
        let a = tensor(&[1], &[bf16::from_f32(3.0)]);
        let b = tensor(&[1], &[bf16::from_f32(7.0)]);
        let out = run(&DivKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(values::<bf16>(&out[0]), vec![bf16::from_f32(3.0 / 7.0)]);
    }

    #[test]
    fn div_refuses_integers() {
        let a = t_i64(&[1], &[1]).0;
        assert_eq!(
            infer_err(&DivKernel, &[&a, &a], &[]),
            "div of i64 tensors gives floats: cast to a floating dtype first"
        );
    }

    #[test]
    fn binary_ops_broadcast() {
        let a = t_f32(&[2, 1], &[1.0, 2.0]);
        let b = t_f32(&[3], &[10.0, 20.0, 30.0]);
        let out = run(&SubKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3]);
        assert_eq!(as_f32(&out[0]), vec![-9.0, -19.0, -29.0, -8.0, -18.0, -28.0]);
        let out = run(&MulKernel, 0.0, vec![t_i64(&[], &[3]), t_i64(&[2], &[4, 5])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![12, 15]);
    }

    #[test]
    fn in_place_add_reads_before_it_writes() {
        let x = t_f32(&[4], &[1.0, 2.0, 3.0, 4.0]);
        let y = t_f32(&[4], &[10.0, 20.0, 30.0, 40.0]);
        compute_raw(&AddKernel, Attrs::default(), &[(&x.0, &x.1), (&y.0, &y.1)], (&x.0, &x.1)).unwrap();
        assert_eq!(as_f32(&x), [11.0, 22.0, 33.0, 44.0]);
        // x + x into x.
        compute_raw(&AddKernel, Attrs::default(), &[(&x.0, &x.1), (&x.0, &x.1)], (&x.0, &x.1)).unwrap();
        assert_eq!(as_f32(&x), [22.0, 44.0, 66.0, 88.0]);
        // The reversed x added to x, into x: read from a copy made first.
        let rev = x.0.with_layout(&[4], &[-1], 3);
        compute_raw(&AddKernel, Attrs::default(), &[(&x.0, &x.1), (&rev, &x.1)], (&x.0, &x.1)).unwrap();
        assert_eq!(as_f32(&x), [110.0; 4]);
    }

    #[test]
    fn binary_infer_errors() {
        let f23 = t_f32(&[2, 3], &[0.0; 6]).0;
        let f32_ = t_f32(&[3, 2], &[0.0; 6]).0;
        let i23 = t_i64(&[2, 3], &[0; 6]).0;
        for k in [&AddKernel as &dyn OpKernel, &MulKernel, &SubKernel, &ReluGradKernel] {
            assert_eq!(infer_err(k, &[&f23], &[]), "expected 2 inputs, got 1");
            assert_eq!(
                infer_err(k, &[&f23, &i23], &[]),
                "input 1 is i64 but input 0 is f32: cast to one dtype first"
            );
            assert_eq!(
                infer_err(k, &[&i23, &f23], &[]),
                "input 1 is f32 but input 0 is i64: cast to one dtype first"
            );
            assert!(infer_err(k, &[&f23, &f32_], &[]).contains("the shapes do not broadcast"));
        }
    }

    #[test]
    fn scale_negative_and_fractional() {
        let x = || t_f32(&[3], &[1.0, -2.0, 4.0]);
        let out = run(&ScaleKernel, -0.5, vec![x()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![-0.5, 1.0, -2.0]);
        let x = || t_i64(&[3], &[1, -2, i64::MAX]);
        let out = run(&ScaleKernel, -3.0, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![-3, 6, i64::MAX.wrapping_mul(-3)]);
        // i64 multiplies by the scalar truncated toward zero.
        let out = run(&ScaleKernel, 2.9, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![2, -4, -2]);
        let out = run(&ScaleKernel, -0.5, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0; 3]);
    }

    #[test]
    fn relu_both_dtypes() {
        let x = t_f32(&[6], &[-1.0, 0.0, 2.5, f32::NEG_INFINITY, f32::NAN, -0.0]);
        let out = as_f32(&run(&ReluKernel, 0.0, vec![x], &[]).unwrap()[0]);
        assert_eq!(&out[..4], &[0.0, 0.0, 2.5, 0.0]);
        assert!(out[4].is_nan());
        assert_eq!(out[5].to_bits(), (-0.0f32).to_bits());
        let x = t_i64(&[4], &[-5, 0, 3, i64::MIN]);
        let out = run(&ReluKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0, 0, 3, 0]);
        let b = tensor(&[1], &[true]).0;
        assert_eq!(
            infer_err(&ReluKernel, &[&b], &[]),
            "relu of bool tensors is not supported: cast to a numeric dtype first"
        );
    }

    #[test]
    fn relu_grad_passes_dy_where_x_is_positive() {
        let dy = t_f32(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let x = t_f32(&[5], &[0.5, -1.0, 0.0, f32::NAN, 1e-30]);
        let out = run(&ReluGradKernel, 0.0, vec![dy, x], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![1.0, 0.0, 0.0, 0.0, 5.0]);
        let dy = t_i64(&[3], &[7, 8, 9]);
        let x = t_i64(&[3], &[-1, 0, 2]);
        let out = run(&ReluGradKernel, 0.0, vec![dy, x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0, 0, 9]);
    }

    #[test]
    fn unary_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        for k in [&ScaleKernel as &dyn OpKernel, &ReluKernel] {
            assert_eq!(infer_err(k, &[], &[]), "expected 1 input, got 0");
            assert_eq!(infer_err(k, &[&x, &x], &[]), "expected 1 input, got 2");
        }
    }

    #[test]
    fn add_bias_broadcasts_over_rows() {
        let x = t_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t_f32(&[3], &[10.0, -1.0, 0.5]);
        let out = run(&AddBiasKernel, 0.0, vec![x, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3]);
        assert_eq!(as_f32(&out[0]), vec![11.0, 1.0, 3.5, 14.0, 4.0, 6.5]);
        let x = t_i64(&[3, 1], &[1, 2, i64::MAX]);
        let b = t_i64(&[1], &[1]);
        let out = run(&AddBiasKernel, 0.0, vec![x, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![2, 3, i64::MIN]);
        let out = run(&AddBiasKernel, 0.0, vec![t_f32(&[2, 0], &[]), t_f32(&[0], &[])], &[]).unwrap();
        assert!(as_f32(&out[0]).is_empty());
    }

    #[test]
    fn add_bias_infer_errors() {
        let x = t_f32(&[2, 3], &[0.0; 6]).0;
        let b2 = t_f32(&[2], &[0.0; 2]).0;
        let b13 = t_f32(&[1, 3], &[0.0; 3]).0;
        let bi = t_i64(&[3], &[0; 3]).0;
        let k = &AddBiasKernel;
        assert_eq!(
            infer_err(k, &[&x, &b2], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[2]: the bias must be 1-D with 3 elements"
        );
        assert!(infer_err(k, &[&x, &b13], &[]).contains("the bias must be 1-D"));
        assert_eq!(
            infer_err(k, &[&x, &bi], &[]),
            "input 1 is i64 but input 0 is f32: cast to one dtype first"
        );
        assert_eq!(infer_err(k, &[&b2, &b2], &[]), "input 0 is f32[2]: expected a 2-D input [n, k]");
    }

    #[test]
    fn compute_refuses_bad_operands_without_panicking() {
        let f2 = t_f32(&[2], &[1.0, 2.0]);
        let i2 = t_i64(&[2], &[1, 2]);
        let f3 = t_f32(&[3], &[0.0; 3]);
        let none = Attrs::default();
        let err = compute_raw(&AddKernel, none, &[(&f2.0, &f2.1), (&i2.0, &i2.1)], (&f3.0, &f3.1));
        assert_eq!(err.unwrap_err(), "input 1 is i64 but the kernel ran for f32");
        let err = compute_raw(&ReluKernel, none, &[(&f2.0, &f2.1)], (&f3.0, &f3.1));
        assert_eq!(
            err.unwrap_err(),
            "input 0 is f32[2] but the output is [3]: it does not broadcast to the output's shape"
        );
        let err = compute_raw(&AddKernel, none, &[(&f2.0, &f2.1)], (&f3.0, &f3.1));
        assert_eq!(err.unwrap_err(), "expected 2 inputs, got 1");
        // Storage shorter than the shape.
        let long = f3.0.with_layout(&[100], &[1], 0);
        let err = compute_raw(&ReluKernel, none, &[(&long, &f3.1)], (&long, &f3.1)).unwrap_err();
        assert!(err.starts_with("output 0 (f32[100]): "), "{err}");
        assert!(err.contains("outside a storage of 3 elements"), "{err}");
        // A storage of another dtype's size that ends mid-element.
        let odd = tensor(&[3], &[1u8, 2, 3]);
        let as_f32_meta = TensorMeta { dtype: DType::F32, ..f3.0.with_layout(&[1], &[1], 0) };
        let err = compute_raw(&ReluKernel, none, &[(&as_f32_meta, &odd.1)], (&f3.0, &f3.1)).unwrap_err();
        assert!(err.contains("outside a storage of 0 elements"), "{err}");
    }
}
