//! Unary math: `exp`, `exp2`, `log`, `log2`, `log1p`, `expm1`, `sqrt`, `rsqrt`,
//! `reciprocal`, `sin`, `cos`, `tanh`, `sigmoid`, `silu`, `gelu`, `erf` (floating dtypes);
//! `neg`, `abs`, `sign`, `floor`, `ceil`, `round` (numeric dtypes); `isnan`, `isinf`,
//! `isfinite`, `logical_not` (every dtype, a `bool` output).
//!
//! Each works in place (the output exactly the input) but the four with a `bool` output.
//! The floating ops take floating inputs only: the front ends convert a `bool` or integer
//! input to the default float dtype first, as PyTorch's `torch.exp(int_tensor)` does.

use super::dtype::{dispatch, float_of, Bool8, Elem, Float, Ring};
use super::elementwise::{input_dtype, unary_kernel};
use super::loops::map;
use super::pointwise::{Num, Real};
use super::{check_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

fn exp<R: Real>(x: R) -> R {
    x.exp()
}
fn exp2<R: Real>(x: R) -> R {
    x.exp2()
}
fn log<R: Real>(x: R) -> R {
    x.ln()
}
fn log2<R: Real>(x: R) -> R {
    x.log2()
}
fn log1p<R: Real>(x: R) -> R {
    x.ln_1p()
}
fn expm1<R: Real>(x: R) -> R {
    x.exp_m1()
}
fn sqrt<R: Real>(x: R) -> R {
    x.sqrt()
}
fn rsqrt<R: Real>(x: R) -> R {
    x.sqrt().recip()
}
fn reciprocal<R: Real>(x: R) -> R {
    x.recip()
}
fn sin<R: Real>(x: R) -> R {
    x.sin()
}
fn cos<R: Real>(x: R) -> R {
    x.cos()
}
fn tanh<R: Real>(x: R) -> R {
    x.tanh()
}
fn erf<R: Real>(x: R) -> R {
    x.erf()
}
/// `1 / (1 + exp(-x))`, as PyTorch computes it.
fn sigmoid<R: Real>(x: R) -> R {
    R::of(1.0).add(x.mul(R::of(-1.0)).exp()).recip()
}
/// `x / (1 + exp(-x))`, as PyTorch computes it.
fn silu<R: Real>(x: R) -> R {
    x.div(R::of(1.0).add(x.mul(R::of(-1.0)).exp()))
}
/// `x Φ(x)`, PyTorch's exact form `x / 2 * (1 + erf(x / sqrt(2)))` written as
/// `x / 2 * erfc(-x / sqrt(2))`: the same function without the cancellation of `1 + erf` for
/// negative `x`, where `erf` is near -1 and one unit in its last place is a large part of
/// the sum (so that the result is accurate to a few units in the last place everywhere,
/// and two libraries' `erf`s cannot give different results there).
fn gelu_erf<R: Real>(x: R) -> R {
    x.mul(R::of(0.5)).mul(x.mul(R::of(-std::f64::consts::FRAC_1_SQRT_2)).erfc())
}
/// PyTorch's `approximate="tanh"`: `x / 2 * (1 + tanh(u))` with
/// `u = sqrt(2 / pi) * (x + 0.044715 x³)`, written as `x / (1 + exp(-2u))` (the same
/// function, since `(1 + tanh(u)) / 2` is the logistic function of `2u`), for the reason
/// `gelu_erf` gives.
fn gelu_tanh<R: Real>(x: R) -> R {
    let two_beta = R::of(std::f64::consts::SQRT_2 * std::f64::consts::FRAC_2_SQRT_PI);
    let kappa = R::of(0.044715);
    let cube = x.mul(x).mul(x);
    let minus_two_u = two_beta.mul(x.add(kappa.mul(cube))).mul(R::of(-1.0));
    x.div(R::of(1.0).add(minus_two_u.exp()))
}

/// Defines a floating unary kernel computing `$f` in the compute type.
macro_rules! float_unary {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $f:path) => {
        unary_kernel!($(#[$doc])* $kernel, $op, floating, |ctx| T => |x: T| T::store($f(x.load())));
    };
}

float_unary!(
    /// `exp`: `e^x`; floating dtypes.
    ExpKernel, "exp", exp
);
float_unary!(
    /// `exp2`: `2^x`; floating dtypes.
    Exp2Kernel, "exp2", exp2
);
float_unary!(
    /// `log`: the natural logarithm (NaN below 0, `-inf` at 0); floating dtypes.
    LogKernel, "log", log
);
float_unary!(
    /// `log2`: the base-2 logarithm; floating dtypes.
    Log2Kernel, "log2", log2
);
float_unary!(
    /// `log1p`: `log(1 + x)`, accurate near 0; floating dtypes.
    Log1pKernel, "log1p", log1p
);
float_unary!(
    /// `expm1`: `e^x - 1`, accurate near 0; floating dtypes.
    Expm1Kernel, "expm1", expm1
);
float_unary!(
    /// `sqrt`: the square root (NaN below 0, `-0.0` for `-0.0`); floating dtypes.
    SqrtKernel, "sqrt", sqrt
);
float_unary!(
    /// `rsqrt`: `1 / sqrt(x)`; floating dtypes.
    RsqrtKernel, "rsqrt", rsqrt
);
float_unary!(
    /// `reciprocal`: `1 / x`; floating dtypes.
    ReciprocalKernel, "reciprocal", reciprocal
);
float_unary!(
    /// `sin`; floating dtypes.
    SinKernel, "sin", sin
);
float_unary!(
    /// `cos`; floating dtypes.
    CosKernel, "cos", cos
);
float_unary!(
    /// `tanh`; floating dtypes.
    TanhKernel, "tanh", tanh
);
float_unary!(
    /// `erf`: the error function (`libm`'s); floating dtypes.
    ErfKernel, "erf", erf
);
float_unary!(
    /// `sigmoid`: `1 / (1 + exp(-x))`; floating dtypes.
    SigmoidKernel, "sigmoid", sigmoid
);
float_unary!(
    /// `silu`: `x / (1 + exp(-x))` (`x * sigmoid(x)`); floating dtypes.
    SiluKernel, "silu", silu
);

unary_kernel!(
    /// `gelu`: `x * Φ(x)`; with integer parameter 0 set to 1, PyTorch's
    /// `approximate="tanh"` form; floating dtypes.
    GeluKernel, "gelu", floating, |ctx| T => {
        let tanh_form = ctx.attrs.params().int_or(0, 0) != 0;
        move |x: T| T::store(if tanh_form { gelu_tanh(x.load()) } else { gelu_erf(x.load()) })
    }
);

/// Defines a numeric unary kernel computing `Num::$f` in the compute type.
macro_rules! num_unary {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $f:ident) => {
        unary_kernel!($(#[$doc])* $kernel, $op, numeric, |ctx| T => |x: T| T::store(Num::$f(x.load())));
    };
}

num_unary!(
    /// `neg`: `-x`; numeric dtypes (integers wrap: `-(-128)`... `-i64::MIN` is itself, and a
    /// `u8` 1 gives 255, as PyTorch).
    NegKernel, "neg", neg
);
num_unary!(
    /// `abs`: `|x|`; numeric dtypes (`abs(i64::MIN)` is itself; `u8` as it is).
    AbsKernel, "abs", abs
);
num_unary!(
    /// `sign`: -1, 0 or 1; numeric dtypes. A NaN gives 0, as PyTorch's `(0 < x) - (x < 0)`.
    SignKernel, "sign", sign
);
num_unary!(
    /// `floor`; numeric dtypes (integers as they are).
    FloorKernel, "floor", floor
);
num_unary!(
    /// `ceil`; numeric dtypes (integers as they are).
    CeilKernel, "ceil", ceil
);

/// `round`: to the nearest integer, halves to even; numeric dtypes (integers as they are).
/// Integer parameter 0, `decimals` (default 0), rounds to that many decimal places as
/// PyTorch does, in the compute type: `round(x * 10^d) / 10^d`, or for `d < 0`
/// `round(x / 10^-d) * 10^-d`; floating dtypes only where it is not 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct RoundKernel;

impl OpKernel for RoundKernel {
    fn name(&self) -> &'static str {
        "round"
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
        let dtype = inputs[0].dtype;
        check_dtype("round", dtype, Dtypes::Numeric)?;
        let decimals = attrs.params().int_or(0, 0);
        if decimals != 0 && !dtype.is_floating() {
            return Err(format!(
                "round with decimals={decimals} of {dtype} tensors is not supported: cast to a floating dtype first"
            ));
        }
        outputs.push(OutSpec { shape: inputs[0].shape.clone(), dtype });
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
        let decimals = ctx.attrs.params().int_or(0, 0);
        if decimals == 0 {
            return dispatch!(dtype, numeric, T => map::<T, T>(ctx, |x: T| T::store(Num::round_even(x.load()))),
                Err(refusal("round", dtype, Dtypes::Numeric)));
        }
        let p = 10f64.powi(decimals.unsigned_abs().min(400) as i32);
        dispatch!(dtype, floating, T => {
            let p = <<T as Elem>::C as Real>::of(p);
            if decimals > 0 {
                map::<T, T>(ctx, move |x: T| T::store(Num::round_even(x.load().mul(p)).div(p)))
            } else {
                map::<T, T>(ctx, move |x: T| T::store(Num::round_even(x.load().div(p)).mul(p)))
            }
        }, Err(format!("round with decimals={decimals} of {dtype} tensors is not supported: cast to a floating dtype first")))
    }
}

/// Defines a kernel of one input of any dtype and a `bool` output, `pred` of the value
/// widened to `f64` (exact for every dtype but an `i64` beyond 2^53, which no predicate
/// here tells from its neighbours).
macro_rules! predicate {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, |$v:ident| $pred:expr) => {
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
                expect_inputs(inputs, 1)?;
                outputs.push(OutSpec { shape: inputs[0].shape.clone(), dtype: DType::Bool });
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
                let dtype = input_dtype(ctx)?;
                dispatch!(dtype, all, T => map::<Bool8, T>(ctx, |x: T| {
                    let $v = float_of(x);
                    Bool8::of($pred)
                }), Err(refusal($op, dtype, Dtypes::All)))
            }
        }
    };
}

predicate!(
    /// `isnan`: whether each element is a NaN (never for `bool` and integers).
    IsnanKernel, "isnan", |v| v.is_nan()
);
predicate!(
    /// `isinf`: whether each element is `+inf` or `-inf`.
    IsinfKernel, "isinf", |v| v.is_infinite()
);
predicate!(
    /// `isfinite`: whether each element is neither infinite nor a NaN.
    IsfiniteKernel, "isfinite", |v| v.is_finite()
);
predicate!(
    /// `logical_not`: whether each element is zero (`false`, 0, `±0.0`; a NaN is nonzero).
    LogicalNotKernel, "logical_not", |v| v == 0.0
);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, compute_raw, infer_err, run, run_with, t_f32, t_i64, tensor, values,
    };
    use crate::vm::{bf16, f16};

    fn f32_ref(f: fn(f64) -> f64, x: &[f32]) -> Vec<f32> {
        x.iter().map(|&v| f(v as f64) as f32).collect()
    }

    fn close(a: &[f32], b: &[f32], rel: f32) {
        assert_eq!(a.len(), b.len());
        for (x, y) in a.iter().zip(b) {
            if x.is_nan() || y.is_nan() {
                assert!(x.is_nan() && y.is_nan(), "{a:?} against {b:?}");
            } else if x.is_infinite() || y.is_infinite() {
                assert_eq!(x, y, "{a:?} against {b:?}");
            } else {
                assert!((x - y).abs() <= rel * y.abs().max(1e-30) + 1e-37, "{x} against {y}: {a:?} {b:?}");
            }
        }
    }

    #[test]
    fn float_ops_match_f64_references() {
        let xs = [-3.5f32, -1.0, -0.0, 0.0, 0.25, 1.0, 2.5, 20.0, f32::INFINITY, f32::NEG_INFINITY, f32::NAN];
        type Case<'a> = (&'a dyn OpKernel, fn(f64) -> f64);
        let cases: [Case<'_>; 15] = [
            (&ExpKernel, f64::exp),
            (&Exp2Kernel, f64::exp2),
            (&LogKernel, f64::ln),
            (&Log2Kernel, f64::log2),
            (&Log1pKernel, f64::ln_1p),
            (&Expm1Kernel, f64::exp_m1),
            (&SqrtKernel, f64::sqrt),
            (&RsqrtKernel, |x| 1.0 / x.sqrt()),
            (&ReciprocalKernel, |x| 1.0 / x),
            (&SinKernel, f64::sin),
            (&CosKernel, f64::cos),
            (&TanhKernel, f64::tanh),
            (&ErfKernel, libm::erf),
            (&SigmoidKernel, |x| 1.0 / (1.0 + (-x).exp())),
            (&SiluKernel, |x| x / (1.0 + (-x).exp())),
        ];
        for (k, f) in cases {
            let out = run(k, 0.0, vec![t_f32(&[xs.len()], &xs)], &[]).unwrap();
            close(&as_f32(&out[0]), &f32_ref(f, &xs), 4e-7);
            // f64 through the same kernel.
            let x64: Vec<f64> = xs.iter().map(|&v| v as f64).collect();
            let out = run(k, 0.0, vec![tensor(&[xs.len()], &x64)], &[]).unwrap();
            let got: Vec<f32> = values::<f64>(&out[0]).iter().map(|&v| v as f32).collect();
            close(&got, &f32_ref(f, &xs), 1e-7);
        }
    }

    #[test]
    fn gelu_both_forms() {
        let xs = [-3.0f32, -0.5, 0.0, 0.5, 1.0, 3.0, f32::NAN, f32::INFINITY, f32::NEG_INFINITY];
        let exact = |x: f64| x * 0.5 * (1.0 + libm::erf(x / 2f64.sqrt()));
        let approx = |x: f64| {
            0.5 * x * (1.0 + ((2.0 / std::f64::consts::PI).sqrt() * (x + 0.044715 * x * x * x)).tanh())
        };
        let out = run(&GeluKernel, 0.0, vec![t_f32(&[9], &xs)], &[]).unwrap();
        let mut want = f32_ref(exact, &xs);
        want[8] = f32::NAN; // -inf * 0
        close(&as_f32(&out[0]), &want, 4e-6);
        let tanh = Attrs::default().with_params(&[1], &[]).unwrap();
        let out = run_with(&GeluKernel, tanh, vec![t_f32(&[9], &xs)], &[]).unwrap();
        let mut want = f32_ref(approx, &xs);
        want[8] = f32::NAN;
        // 1 + tanh(...) cancels near x = -3: a few ulps of tanh are 1e-5 of the result.
        close(&as_f32(&out[0]), &want, 2e-5);
    }

    #[test]
    fn half_floats_round_once() {
        let x = tensor(&[3], &[f16::from_f32(0.5), f16::from_f32(-2.0), f16::from_f32(10.0)]);
        let out = run(&ExpKernel, 0.0, vec![x], &[]).unwrap();
        let want: Vec<f16> = [0.5f32, -2.0, 10.0].iter().map(|v| f16::from_f32(v.exp())).collect();
        assert_eq!(values::<f16>(&out[0]), want);
        let x = tensor(&[2], &[bf16::from_f32(0.3), bf16::from_f32(-7.0)]);
        let out = run(&SigmoidKernel, 0.0, vec![x], &[]).unwrap();
        let want: Vec<bf16> = [bf16::from_f32(0.3), bf16::from_f32(-7.0)]
            .iter()
            .map(|v| bf16::from_f32(1.0 / (1.0 + (-v.to_f32()).exp())))
            .collect();
        assert_eq!(values::<bf16>(&out[0]), want);
    }

    #[test]
    fn float_ops_refuse_integers() {
        let i = t_i64(&[1], &[1]).0;
        assert_eq!(
            infer_err(&ExpKernel, &[&i], &[]),
            "exp computes on floating dtypes, not i64: cast to one first"
        );
    }

    #[test]
    fn numeric_ops() {
        let xs = [-2.5f32, -1.5, -0.5, -0.0, 0.5, 1.5, 2.5, 2.7, f32::NAN, f32::NEG_INFINITY];
        let ops = |k: &dyn OpKernel| as_f32(&run(k, 0.0, vec![t_f32(&[10], &xs)], &[]).unwrap()[0]);
        let r = ops(&RoundKernel);
        assert_eq!(&r[..8], &[-2.0, -2.0, -0.0, -0.0, 0.0, 2.0, 2.0, 3.0]);
        assert!(r[8].is_nan());
        assert_eq!(&ops(&FloorKernel)[..8], &[-3.0, -2.0, -1.0, -0.0, 0.0, 1.0, 2.0, 2.0]);
        assert_eq!(&ops(&CeilKernel)[..8], &[-2.0, -1.0, -0.0, -0.0, 1.0, 2.0, 3.0, 3.0]);
        let s = ops(&SignKernel);
        assert_eq!(s, [-1.0, -1.0, -1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0, -1.0]);
        assert_eq!(ops(&AbsKernel)[9], f32::INFINITY);
        assert_eq!(ops(&NegKernel)[3].to_bits(), 0);
        let i = || t_i64(&[4], &[-5, 0, 7, i64::MIN]);
        let run_i = |k: &dyn OpKernel| values::<i64>(&run(k, 0.0, vec![i()], &[]).unwrap()[0]);
        assert_eq!(run_i(&NegKernel), [5, 0, -7, i64::MIN]);
        assert_eq!(run_i(&AbsKernel), [5, 0, 7, i64::MIN]);
        assert_eq!(run_i(&SignKernel), [-1, 0, 1, -1]);
        assert_eq!(run_i(&FloorKernel), [-5, 0, 7, i64::MIN]);
        let u = tensor(&[3], &[0u8, 1, 200]);
        assert_eq!(values::<u8>(&run(&NegKernel, 0.0, vec![u], &[]).unwrap()[0]), [0, 255, 56]);
        let b = tensor(&[1], &[true]).0;
        assert!(infer_err(&NegKernel, &[&b], &[]).contains("not supported"));
    }

    #[test]
    fn round_with_decimals() {
        let xs = [1.2345f32, -1.2355, 1250.0, 0.125];
        let two = Attrs::default().with_params(&[2], &[]).unwrap();
        let out = run_with(&RoundKernel, two, vec![t_f32(&[4], &xs)], &[]).unwrap();
        let want: Vec<f32> = xs.iter().map(|&x| (x * 100.0).round_ties_even() / 100.0).collect();
        assert_eq!(as_f32(&out[0]), want);
        let minus = Attrs::default().with_params(&[-2], &[]).unwrap();
        let out = run_with(&RoundKernel, minus, vec![t_f32(&[4], &xs)], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [0.0, -0.0, 1200.0, 0.0]);
        let i = t_i64(&[1], &[1]);
        let mut specs = OutSpecs::new();
        let err = RoundKernel.infer(&[&i.0], &[], &two, &mut specs).unwrap_err();
        assert!(err.contains("cast to a floating dtype"), "{err}");
    }

    #[test]
    fn predicates_of_every_dtype() {
        let xs = [1.0f32, f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0];
        let p = |k: &dyn OpKernel| values::<u8>(&run(k, 0.0, vec![t_f32(&[6], &xs)], &[]).unwrap()[0]);
        assert_eq!(p(&IsnanKernel), [0, 1, 0, 0, 0, 0]);
        assert_eq!(p(&IsinfKernel), [0, 0, 1, 1, 0, 0]);
        assert_eq!(p(&IsfiniteKernel), [1, 0, 0, 0, 1, 1]);
        assert_eq!(p(&LogicalNotKernel), [0, 0, 0, 0, 1, 1]);
        let i = t_i64(&[3], &[0, i64::MAX, -1]);
        let out = run(&LogicalNotKernel, 0.0, vec![i], &[]).unwrap();
        assert_eq!(out[0].0.dtype, DType::Bool);
        assert_eq!(values::<u8>(&out[0]), [1, 0, 0]);
        let out = run(&IsfiniteKernel, 0.0, vec![tensor(&[2], &[true, false])], &[]).unwrap();
        assert_eq!(values::<u8>(&out[0]), [1, 1]);
    }

    #[test]
    fn strided_and_in_place() {
        // A transposed view read into a new tensor, then exp in place.
        let x = t_f32(&[2, 3], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let xt = x.0.with_layout(&[3, 2], &[1, 3], 0);
        let out = t_f32(&[3, 2], &[0.0; 6]);
        compute_raw(&NegKernel, Attrs::default(), &[(&xt, &x.1)], (&out.0, &out.1)).unwrap();
        assert_eq!(as_f32(&out), [-0.0, -3.0, -1.0, -4.0, -2.0, -5.0]);
        compute_raw(&ExpKernel, Attrs::default(), &[(&x.0, &x.1)], (&x.0, &x.1)).unwrap();
        assert_eq!(as_f32(&x), [0f32, 1.0, 2.0, 3.0, 4.0, 5.0].map(crate::kernels::vmath::exp_f32));
        // 0-d and empty.
        let out = run(&SqrtKernel, 0.0, vec![t_f32(&[], &[4.0])], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [2.0]);
        let out = run(&SqrtKernel, 0.0, vec![t_f32(&[0, 3], &[])], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0, 3]);
    }
}
