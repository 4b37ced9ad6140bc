//! Ops of three operands, broadcast together (NumPy's rule over all three): `where`,
//! `clamp` (tensor bounds), `lerp`, `addcmul`, `addcdiv`; and the scalar forms
//! `clamp_scalar` (bounds in the parameter list) and `lerp_scalar` (the weight in the
//! scalar argument).
//!
//! Each but `where` works in place (the output exactly input 0).

use super::dtype::{dispatch, group, Bool8, Elem, Float as _, Ring as _};
use super::elementwise::{infer_binary, input_dtype};
use super::loops::{map, zip};
use super::pointwise::{maximum, minimum, zip3, Real};
use super::{check_dtype, common_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Scalar, Shape, TensorMeta};

/// The shape `inputs` broadcast to together, or an error naming the two that do not.
fn broadcast_all(inputs: &[&TensorMeta]) -> Result<Shape, String> {
    let rank = inputs.iter().map(|m| m.shape.len()).max().unwrap_or(0);
    let mut shape = Shape::from_elem(1, rank);
    let mut from = vec![None::<usize>; rank];
    for (i, m) in inputs.iter().enumerate() {
        for (j, &d) in m.shape.iter().enumerate() {
            let at = rank - m.shape.len() + j;
            if d == 1 {
                continue;
            }
            match from[at] {
                Some(k) if shape[at] != d => {
                    return Err(format!(
                        "input {k} is {} and input {i} is {}: the shapes do not broadcast (dimension {at} \
                         of the result: {} against {d})",
                        inputs[k].describe(),
                        m.describe(),
                        shape[at]
                    ))
                }
                Some(_) => {}
                None => {
                    shape[at] = d;
                    from[at] = Some(i);
                }
            }
        }
    }
    Ok(shape)
}

/// Three inputs of one dtype that `dtypes` admits; the output has their broadcast shape
/// and dtype.
fn infer_ternary(
    op: &str,
    inputs: &[&TensorMeta],
    outputs: &mut OutSpecs,
    dtypes: Dtypes,
) -> Result<(), String> {
    expect_inputs(inputs, 3)?;
    let dtype = common_dtype(inputs)?;
    check_dtype(op, dtype, dtypes)?;
    outputs.push(OutSpec { shape: broadcast_all(inputs)?, dtype });
    Ok(())
}

/// `where`: inputs `cond` (`bool`), `x` and `y` (one dtype, any), broadcast together; the
/// output holds `x` where `cond` is true and `y` elsewhere.
#[derive(Debug, Clone, Copy, Default)]
pub struct WhereKernel;

impl OpKernel for WhereKernel {
    fn name(&self) -> &'static str {
        "where"
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
        expect_inputs(inputs, 3)?;
        if inputs[0].dtype != DType::Bool {
            return Err(format!(
                "input 0 (the condition) is {}: where takes a bool condition",
                inputs[0].dtype
            ));
        }
        let dtype = common_dtype(&inputs[1..]).map_err(|_| {
            format!(
                "input 2 is {} but input 1 is {}: cast to one dtype first",
                inputs[2].dtype, inputs[1].dtype
            )
        })?;
        outputs.push(OutSpec { shape: broadcast_all(inputs)?, dtype });
        Ok(())
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
        let dtype = super::loops::input(ctx, 1)?.meta.dtype;
        dispatch!(dtype, all, T => zip3::<T, Bool8, T, T>(ctx, |c: Bool8, x: T, y: T| if c.0 != 0 { x } else { y }),
            Err(refusal("where", dtype, Dtypes::All)))
    }
}

/// Defines a kernel of three inputs of one dtype of `$group`, broadcast, writing that
/// dtype: `$f` of the compute-type values, with `$s` the scalar argument in the compute
/// type.
macro_rules! ternary {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $group:ident, |$a:ident, $b:ident, $c:ident, $s:ident| $f:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                group!($group).list()
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_ternary($op, inputs, outputs, group!($group))
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
                let value = ctx.attrs.value();
                dispatch!(dtype, $group, T => {
                    let $s = T::compute_scalar(value);
                    zip3::<T, T, T, T>(ctx, move |x: T, y: T, z: T| {
                        let ($a, $b, $c) = (x.load(), y.load(), z.load());
                        T::store($f)
                    })
                }, Err(refusal($op, dtype, group!($group))))
            }
        }
    };
}

ternary!(
    /// `clamp`: inputs `x`, `min`, `max` of one numeric dtype, broadcast:
    /// `minimum(maximum(x, min), max)`, so a NaN in any of them gives NaN and `min > max`
    /// gives `max` (as PyTorch).
    ClampKernel, "clamp", numeric, |x, lo, hi, _s| minimum(maximum(x, lo), hi)
);
ternary!(
    /// `lerp`: inputs `start`, `end`, `weight` of one floating dtype, broadcast: PyTorch's
    /// formula, `start + w (end - start)` where `|w| < 0.5`, else `end - (end - start)(1 - w)`.
    LerpKernel, "lerp", floating, |a, b, w, _s| lerp(a, b, w)
);
ternary!(
    /// `addcmul`: inputs `x`, `t1`, `t2` of one numeric dtype, broadcast, and the scalar
    /// argument `value`: `x + value * t1 * t2` (integers wrap).
    AddcmulKernel, "addcmul", numeric, |x, t1, t2, v| x.add(v.mul(t1).mul(t2))
);
ternary!(
    /// `addcdiv`: inputs `x`, `t1`, `t2` of one floating dtype, broadcast, and the scalar
    /// argument `value`: `x + value * t1 / t2`.
    AddcdivKernel, "addcdiv", floating, |x, t1, t2, v| x.add(v.mul(t1).div(t2))
);

/// PyTorch's `lerp`, exact at both ends.
#[inline(always)]
fn lerp<R: Real + PartialOrd>(a: R, b: R, w: R) -> R {
    let half = R::of(0.5);
    let small = w < half && w > R::of(-0.5);
    let d = b.sub(a);
    if small {
        a.add(w.mul(d))
    } else {
        b.sub(d.mul(R::of(1.0).sub(w)))
    }
}

/// `lerp_scalar`: inputs `start` and `end` of one floating dtype, broadcast, and the
/// scalar argument `weight` (in the compute type): `lerp` with a constant weight.
#[derive(Debug, Clone, Copy, Default)]
pub struct LerpScalarKernel;

impl OpKernel for LerpScalarKernel {
    fn name(&self) -> &'static str {
        "lerp_scalar"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Floating.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        infer_binary("lerp_scalar", inputs, outputs, Dtypes::Floating, |d| d)
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
        let value = ctx.attrs.value();
        dispatch!(dtype, floating, T => {
            let w = T::compute_scalar(value);
            zip::<T, T, T>(ctx, move |x: T, y: T| T::store(lerp(x.load(), y.load(), w)))
        }, Err(refusal("lerp_scalar", dtype, Dtypes::Floating)))
    }
}

/// `clamp_scalar`: input `x` of a numeric dtype; the parameter list has integers
/// `[has_min, has_max]` (each 0 or 1) and scalars `[min, max]` (one scalar where only one
/// bound is given; each converted to the compute type). `minimum(maximum(x, min), max)`
/// with the absent bound left out: a NaN `x` or bound gives NaN, and `min > max` gives
/// `max`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ClampScalarKernel;

/// The bounds of a `clamp_scalar` call.
fn bounds(attrs: &Attrs) -> Result<(Option<Scalar>, Option<Scalar>), String> {
    let p = attrs.params();
    let (has_min, has_max) = (p.int_or(0, 0) != 0, p.int_or(1, 0) != 0);
    let mut s = p.scalars().iter().copied();
    let lo = if has_min { Some(s.next().ok_or("clamp_scalar: the parameter list lacks min")?) } else { None };
    let hi = if has_max { Some(s.next().ok_or("clamp_scalar: the parameter list lacks max")?) } else { None };
    if lo.is_none() && hi.is_none() {
        return Err("clamp_scalar: at least one of min and max must be given".into());
    }
    Ok((lo, hi))
}

impl OpKernel for ClampScalarKernel {
    fn name(&self) -> &'static str {
        "clamp_scalar"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Numeric.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        check_dtype("clamp_scalar", inputs[0].dtype, Dtypes::Numeric)?;
        bounds(attrs)?;
        outputs.push(OutSpec { shape: inputs[0].shape.clone(), dtype: inputs[0].dtype });
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
        let (lo, hi) = bounds(&ctx.attrs)?;
        dispatch!(dtype, numeric, T => {
            let lo = lo.map(T::compute_scalar);
            let hi = hi.map(T::compute_scalar);
            match (lo, hi) {
                (Some(lo), Some(hi)) => map::<T, T>(ctx, move |x: T| T::store(minimum(maximum(x.load(), lo), hi))),
                (Some(lo), None) => map::<T, T>(ctx, move |x: T| T::store(maximum(x.load(), lo))),
                (None, Some(hi)) => map::<T, T>(ctx, move |x: T| T::store(minimum(x.load(), hi))),
                (None, None) => Err("clamp_scalar: at least one of min and max must be given".into()),
            }
        }, Err(refusal("clamp_scalar", dtype, Dtypes::Numeric)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, as_i64, compute_raw, infer_err, run, run_with, t_f32, t_i64, tensor,
    };

    #[test]
    fn where_broadcasts_all_three() {
        let c = tensor(&[2, 1], &[true, false]);
        let x = t_f32(&[3], &[1.0, 2.0, 3.0]);
        let y = t_f32(&[], &[-1.0]);
        let out = run(&WhereKernel, 0.0, vec![c, x, y], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3]);
        assert_eq!(as_f32(&out[0]), [1.0, 2.0, 3.0, -1.0, -1.0, -1.0]);
        let c = tensor(&[2], &[true, false]).0;
        let f = t_f32(&[2], &[0.0; 2]).0;
        let i = t_i64(&[2], &[0; 2]).0;
        assert!(infer_err(&WhereKernel, &[&f, &f, &f], &[]).contains("bool condition"));
        assert!(infer_err(&WhereKernel, &[&c, &f, &i], &[]).contains("cast to one dtype"));
        let f3 = t_f32(&[3], &[0.0; 3]).0;
        assert!(infer_err(&WhereKernel, &[&c, &f, &f3], &[]).contains("do not broadcast"));
    }

    #[test]
    fn clamp_with_tensor_and_scalar_bounds() {
        let x = || t_f32(&[5], &[-2.0, 0.5, 3.0, f32::NAN, 1.0]);
        let lo = t_f32(&[5], &[0.0, 0.0, 0.0, 0.0, f32::NAN]);
        let hi = t_f32(&[], &[1.0]);
        let out = as_f32(&run(&ClampKernel, 0.0, vec![x(), lo, hi], &[]).unwrap()[0]);
        assert_eq!(&out[..3], &[0.0, 0.5, 1.0]);
        assert!(out[3].is_nan() && out[4].is_nan());
        let both = Attrs::default().with_params(&[1, 1], &[Scalar::Float(0.0), Scalar::Float(1.0)]).unwrap();
        let out = as_f32(&run_with(&ClampScalarKernel, both, vec![x()], &[]).unwrap()[0]);
        assert_eq!(&out[..3], &[0.0, 0.5, 1.0]);
        assert!(out[3].is_nan());
        let max_only = Attrs::default().with_params(&[0, 1], &[Scalar::Int(1)]).unwrap();
        let out = run_with(&ClampScalarKernel, max_only, vec![t_i64(&[3], &[-5, 1, 9])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), [-5, 1, 1]);
        let inverted = Attrs::default().with_params(&[1, 1], &[Scalar::Int(5), Scalar::Int(2)]).unwrap();
        let out = run_with(&ClampScalarKernel, inverted, vec![t_i64(&[2], &[0, 9])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), [2, 2]);
        let mut specs = OutSpecs::new();
        let none = ClampScalarKernel.infer(&[&t_i64(&[1], &[0]).0], &[], &Attrs::default(), &mut specs);
        assert!(none.unwrap_err().contains("at least one"));
    }

    /// `clamp_scalar` takes no parameterless probe (`framework::ops_table`): its declared
    /// dtypes are checked here.
    #[test]
    fn clamp_scalar_accepts_the_dtypes_it_declares() {
        let attrs = Attrs::default().with_params(&[1, 0], &[Scalar::Int(0)]).unwrap();
        for d in DType::ALL {
            let x = TensorMeta::new(&[2], d, crate::ep::DeviceId::CPU);
            let mut specs = OutSpecs::new();
            let ok = ClampScalarKernel.infer(&[&x], &[], &attrs, &mut specs).is_ok();
            assert_eq!(ok, ClampScalarKernel.dtypes().contains(&d), "{d}");
        }
    }

    #[test]
    fn lerp_addcmul_addcdiv() {
        let a = || t_f32(&[3], &[0.0, 1.0, -2.0]);
        let b = || t_f32(&[3], &[10.0, 3.0, 2.0]);
        let w = t_f32(&[3], &[0.25, 1.0, 0.5]);
        let out = as_f32(&run(&LerpKernel, 0.0, vec![a(), b(), w], &[]).unwrap()[0]);
        assert_eq!(out, [2.5, 3.0, 0.0]);
        let out = as_f32(&run(&LerpScalarKernel, 0.75, vec![a(), b()], &[]).unwrap()[0]);
        assert_eq!(out, [7.5, 2.5, 1.0]);
        let out = as_f32(&run(&AddcmulKernel, 0.5, vec![a(), b(), b()], &[]).unwrap()[0]);
        assert_eq!(out, [50.0, 5.5, 0.0]);
        let out = as_f32(&run(&AddcdivKernel, 2.0, vec![a(), a(), b()], &[]).unwrap()[0]);
        assert_eq!(out, [0.0, 1.0 + 2.0 / 3.0, -4.0]);
        let i = || t_i64(&[2], &[3, -4]);
        let out = run_with(&AddcmulKernel, Attrs::integer(2), vec![i(), i(), i()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), [21, 28]);
        assert!(infer_err(&AddcdivKernel, &[&i().0, &i().0, &i().0], &[]).contains("floating"));
    }

    #[test]
    fn in_place_strided_and_empty() {
        // addcmul into x, with t1 a transposed view and t2 broadcast.
        let x = t_f32(&[2, 2], &[1.0, 1.0, 1.0, 1.0]);
        let t = t_f32(&[2, 2], &[1.0, 2.0, 3.0, 4.0]);
        let tt = t.0.with_layout(&[2, 2], &[1, 2], 0);
        let s = t_f32(&[2], &[10.0, 100.0]);
        compute_raw(
            &AddcmulKernel,
            Attrs::scalar(1.0),
            &[(&x.0, &x.1), (&tt, &t.1), (&s.0, &s.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        assert_eq!(as_f32(&x), [11.0, 301.0, 21.0, 401.0]);
        // clamp of x by its own reversal, into x: the reversal is read from a copy.
        let x = t_f32(&[3], &[0.0, 5.0, 10.0]);
        let rev = x.0.with_layout(&[3], &[-1], 2);
        let hi = t_f32(&[], &[100.0]);
        compute_raw(
            &ClampKernel,
            Attrs::default(),
            &[(&x.0, &x.1), (&rev, &x.1), (&hi.0, &hi.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        assert_eq!(as_f32(&x), [10.0, 5.0, 10.0]);
        let out = run(
            &WhereKernel,
            0.0,
            vec![tensor::<bool>(&[0], &[]), t_f32(&[1], &[1.0]), t_f32(&[0], &[])],
            &[],
        )
        .unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0]);
    }
}
