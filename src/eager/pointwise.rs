//! Pointwise math of [`Array`]s under PyTorch's names: unary math (`exp`, `log`, `sigmoid`,
//! `gelu`, `floor`, `isnan`, ...), binary math (`pow`, `maximum`, `remainder`, `div` with a
//! rounding mode, `logical_and`, ...), ternary ops and clamps (`where_cond`, `clamp`,
//! `lerp`, `addcmul`, `addcdiv`), and the structured tensors `tril`, `triu`, `one_hot`,
//! `Context::linspace` and `Context::eye` (`docs/ops.md`, "Pointwise math").
//!
//! Dtypes follow PyTorch: the floating ops give the default float dtype (`f32`) for a
//! `bool` or integer array (`exp` of `i64` is `f32`); the binary and ternary ops compute in
//! the operands' result type (`eager::promote`), a number taking part as a scalar; the
//! in-place forms (`exp_`, `pow_`, `clamp_`, ...) keep the array's dtype and shape and
//! refuse a result that cannot be cast back, as PyTorch does. A number where an op takes
//! a tensor operand (`x.remainder(3)`, `where_cond(&c, 0.0)`) becomes a 0-d array of the
//! computing dtype, as PyTorch wraps it.

use super::promote::{can_cast, result_type, Operand, DEFAULT_FLOAT};
use super::{Array, Context, Rhs};
use crate::ep::DeviceId;
use crate::framework::{Attrs, DType, Op, Scalar};
use crate::vm::{Error, Result};

/// How `div` rounds its quotient (PyTorch's `rounding_mode`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RoundingMode {
    /// Toward minus infinity (`"floor"`, Python's `//`).
    Floor,
    /// Toward zero (`"trunc"`).
    Trunc,
}

fn refused(op: &str, detail: String) -> Error {
    Error::InvalidOperands { op: op.into(), detail }
}

/// `attrs` with the parameter list `ints`, `scalars`.
fn with_params(op: &str, attrs: Attrs, ints: &[i64], scalars: &[Scalar]) -> Result<Attrs> {
    attrs.with_params(ints, scalars).map_err(|e| refused(op, e.to_string()))
}

/// `s` in the kind of `dt`: a float for a floating dtype, an integer (truncated toward
/// zero) for an integer one, a boolean for `bool`.
fn scalar_in(s: Scalar, dt: DType) -> Scalar {
    if dt.is_floating() {
        Scalar::Float(s.as_f64())
    } else if dt == DType::Bool {
        Scalar::Bool(s.as_bool())
    } else {
        Scalar::Int(s.as_i64())
    }
}

fn operand_of(r: &Rhs<'_>) -> Operand {
    match r {
        Rhs::Array(a) => Operand::Tensor { dtype: a.dtype(), rank: a.ndim() },
        Rhs::Scalar(s) => Operand::Scalar(*s),
    }
}

/// The floating dtype a floating op computes `dt` in: `dt` itself, or the default float.
fn floating(dt: DType) -> DType {
    if dt.is_floating() {
        dt
    } else {
        DEFAULT_FLOAT
    }
}

impl Array {
    fn pw_ops(&self) -> &super::context::Ops {
        self.cx.ops()
    }

    /// `op` of this array converted to `dt`, a new array.
    fn unary_in(&self, op: Op, dt: DType, attrs: Attrs) -> Result<Array> {
        let x = self.to_dtype(dt)?;
        x.call(op, &[&x], attrs)
    }

    /// `op` of this array written into it: in place where the result has its dtype, else
    /// through a new array cast back (refused where it cannot be).
    fn unary_into_self(&mut self, name: &str, op: Op, dt: DType, attrs: Attrs) -> Result<&mut Self> {
        if dt == self.dtype() {
            self.call_into(op, &[self], self, attrs)?;
            return Ok(self);
        }
        self.check_cast(name, dt)?;
        let r = self.unary_in(op, dt, attrs)?;
        self.copy_(&r)
    }

    /// Refuse an in-place result of `dt` that cannot be cast to this array's dtype.
    fn check_cast(&self, name: &str, dt: DType) -> Result<()> {
        if can_cast(dt, self.dtype()) {
            Ok(())
        } else {
            Err(refused(
                name,
                format!("the result type {dt} cannot be cast to the array's dtype {}", self.dtype()),
            ))
        }
    }

    /// Refuse an in-place result of `shape` other than this array's.
    fn check_shape(&self, name: &str, shape: &[usize]) -> Result<()> {
        if shape == self.shape() {
            Ok(())
        } else {
            Err(refused(
                name,
                format!("the array's shape {:?} does not match the broadcast shape {shape:?}", self.shape()),
            ))
        }
    }

    /// `rhs` as an array of `dt` on this array's device (a number as a 0-d array).
    fn operand_as(&self, rhs: Rhs<'_>, dt: DType) -> Result<Array> {
        match rhs {
            Rhs::Array(a) => a.to_dtype(dt),
            Rhs::Scalar(s) => self.cx.full(&[], scalar_in(s, dt), dt, self.device()),
        }
    }

    /// The result type of this array with `others` (PyTorch's `result_type`).
    fn result_with(&self, others: &[Rhs<'_>]) -> DType {
        let mut ops = vec![Operand::Tensor { dtype: self.dtype(), rank: self.ndim() }];
        ops.extend(others.iter().map(operand_of));
        result_type(&ops).expect("at least one operand")
    }

    /// `op(self, rhs)` computed in `dt`.
    fn binary_in(&self, op: Op, rhs: Rhs<'_>, dt: DType, attrs: Attrs) -> Result<Array> {
        let x = self.to_dtype(dt)?;
        let y = self.operand_as(rhs, dt)?;
        x.call(op, &[&x, &y], attrs)
    }

    /// `op(self, rhs)` computed in `dt`, written into this array.
    fn binary_into_self(&mut self, name: &str, op: Op, rhs: Rhs<'_>, dt: DType) -> Result<&mut Self> {
        self.check_cast(name, dt)?;
        if let Rhs::Array(o) = rhs {
            let shape = super::layout::broadcast_shapes(name, self.shape(), o.shape())?;
            self.check_shape(name, &shape)?;
        }
        if dt == self.dtype() {
            let y = self.operand_as(rhs, dt)?;
            self.call_into(op, &[self, &y], self, Attrs::default())?;
            return Ok(self);
        }
        let r = self.binary_in(op, rhs, dt, Attrs::default())?;
        self.copy_(&r)
    }
}

/// Defines the floating unary methods: `name` (a new array, `f32` for a `bool` or integer
/// array) and `name_` (in place; refused for a `bool` or integer array).
macro_rules! float_unary {
    ($($(#[$doc:meta])* $name:ident, $name_:ident, $field:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Array> {
                self.unary_in(self.pw_ops().$field, floating(self.dtype()), Attrs::default())
            }
            #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") in place.")]
            pub fn $name_(&mut self) -> Result<&mut Self> {
                let op = self.pw_ops().$field;
                self.unary_into_self(stringify!($name_), op, floating(self.dtype()), Attrs::default())
            }
        )*}
    };
}

float_unary! {
    /// `e^x` elementwise.
    exp, exp_, exp;
    /// `2^x` elementwise.
    exp2, exp2_, exp2;
    /// The natural logarithm elementwise (NaN below 0, `-inf` at 0).
    log, log_, log;
    /// The base-2 logarithm elementwise.
    log2, log2_, log2;
    /// `log(1 + x)` elementwise, accurate near 0.
    log1p, log1p_, log1p;
    /// `e^x - 1` elementwise, accurate near 0.
    expm1, expm1_, expm1;
    /// The square root elementwise.
    sqrt, sqrt_, sqrt;
    /// `1 / sqrt(x)` elementwise.
    rsqrt, rsqrt_, rsqrt;
    /// `1 / x` elementwise.
    reciprocal, reciprocal_, reciprocal;
    /// The sine elementwise.
    sin, sin_, sin;
    /// The cosine elementwise.
    cos, cos_, cos;
    /// The hyperbolic tangent elementwise.
    tanh, tanh_, tanh;
    /// `1 / (1 + e^-x)` elementwise.
    sigmoid, sigmoid_, sigmoid;
    /// `x * sigmoid(x)` elementwise (PyTorch's `nn.functional.silu`).
    silu, silu_, silu;
    /// The error function elementwise.
    erf, erf_, erf;
}

/// Defines the numeric unary methods `name` and `name_`, computing in the array's dtype
/// (refused for `bool` by the kernel).
macro_rules! same_unary {
    ($($(#[$doc:meta])* $name:ident, $name_:ident, $field:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Array> {
                self.call(self.pw_ops().$field, &[self], Attrs::default())
            }
            #[doc = concat!("[`", stringify!($name), "`](Self::", stringify!($name), ") in place.")]
            pub fn $name_(&mut self) -> Result<&mut Self> {
                self.call_into(self.pw_ops().$field, &[self], self, Attrs::default())?;
                Ok(self)
            }
        )*}
    };
}

same_unary! {
    /// `|x|` elementwise (integers wrap at the minimum; refused for `bool`).
    abs, abs_, abs;
    /// Rounded toward minus infinity (integers as they are).
    floor, floor_, floor;
    /// Rounded toward plus infinity (integers as they are).
    ceil, ceil_, ceil;
    /// Rounded to the nearest integer, halves to even (integers as they are).
    round, round_, round;
}

/// Defines the predicates: a `bool` array of the same shape.
macro_rules! predicate {
    ($($(#[$doc:meta])* $name:ident, $field:ident;)*) => {
        impl Array {$(
            $(#[$doc])*
            pub fn $name(&self) -> Result<Array> {
                self.call(self.pw_ops().$field, &[self], Attrs::default())
            }
        )*}
    };
}

predicate! {
    /// Whether each element is a NaN.
    isnan, isnan;
    /// Whether each element is `+inf` or `-inf`.
    isinf, isinf;
    /// Whether each element is finite (not infinite, not NaN).
    isfinite, isfinite;
    /// Whether each element is zero (a NaN is not), as a `bool` array.
    logical_not, logical_not;
}

impl Array {
    /// [`neg`](Self::neg) in place (refused for `bool`): `mul_scalar` by -1, as `neg`
    /// computes it (exact for floats, wrapping for integers), so that it runs on CUDA too.
    pub fn neg_(&mut self) -> Result<&mut Self> {
        if self.dtype() == DType::Bool {
            return Err(refused(
                "neg_",
                "negation of a bool tensor is not supported; use logical_not".into(),
            ));
        }
        let minus_one = if self.dtype().is_floating() { Scalar::Float(-1.0) } else { Scalar::Int(-1) };
        self.call_into(self.pw_ops().mul_scalar, &[self], self, Attrs::of(minus_one))?;
        Ok(self)
    }

    /// -1, 0 or 1 elementwise (0 for a NaN, as PyTorch); a `bool` array is its own sign.
    pub fn sign(&self) -> Result<Array> {
        if self.dtype() == DType::Bool {
            return self.copy();
        }
        self.call(self.pw_ops().sign, &[self], Attrs::default())
    }
    /// [`sign`](Self::sign) in place.
    pub fn sign_(&mut self) -> Result<&mut Self> {
        if self.dtype() == DType::Bool {
            return Ok(self);
        }
        self.call_into(self.pw_ops().sign, &[self], self, Attrs::default())?;
        Ok(self)
    }

    /// Rounded to `decimals` decimal places, halves to even (PyTorch's
    /// `round(decimals=)`: `round(x * 10^d) / 10^d` in the compute type; floating arrays
    /// only where `decimals` is not 0).
    pub fn round_decimals(&self, decimals: i64) -> Result<Array> {
        let attrs = with_params("round", Attrs::default(), &[decimals], &[])?;
        self.call(self.pw_ops().round, &[self], attrs)
    }
    /// [`round_decimals`](Self::round_decimals) in place.
    pub fn round_decimals_(&mut self, decimals: i64) -> Result<&mut Self> {
        let attrs = with_params("round_", Attrs::default(), &[decimals], &[])?;
        self.call_into(self.pw_ops().round, &[self], self, attrs)?;
        Ok(self)
    }

    /// The Gaussian error linear unit: `x * Φ(x)` with `approximate` `"none"` (the erf
    /// form) or `"tanh"` (PyTorch's approximation); `f32` for a `bool` or integer array.
    pub fn gelu(&self, approximate: &str) -> Result<Array> {
        let attrs = gelu_attrs(approximate)?;
        self.unary_in(self.pw_ops().gelu, floating(self.dtype()), attrs)
    }
    /// [`gelu`](Self::gelu) in place.
    pub fn gelu_(&mut self, approximate: &str) -> Result<&mut Self> {
        let attrs = gelu_attrs(approximate)?;
        let op = self.pw_ops().gelu;
        self.unary_into_self("gelu_", op, floating(self.dtype()), attrs)
    }

    /// [`logical_not`](Self::logical_not) written into this array (0 or 1 in its dtype).
    pub fn logical_not_(&mut self) -> Result<&mut Self> {
        let r = self.logical_not()?;
        self.copy_(&r)
    }

    // ---- Binary math.

    /// `self ** exponent` elementwise (an array, broadcast, or a number). Integers raise
    /// exactly (wrapping); an integer array to a negative integer number is refused, as
    /// PyTorch refuses it (an array of negative exponents gives 0, or ±1 for a base of ±1).
    pub fn pow<'a>(&self, exponent: impl Into<Rhs<'a>>) -> Result<Array> {
        let e = exponent.into();
        let dt = self.result_with(&[e]);
        match e {
            Rhs::Scalar(s) => {
                check_int_pow(dt, s)?;
                self.unary_in(self.pw_ops().pow_scalar, dt, Attrs::of(scalar_in(s, dt)))
            }
            Rhs::Array(_) => self.binary_in(self.pw_ops().pow, e, dt, Attrs::default()),
        }
    }
    /// [`pow`](Self::pow) in place.
    pub fn pow_<'a>(&mut self, exponent: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        let e = exponent.into();
        let dt = self.result_with(&[e]);
        match e {
            Rhs::Scalar(s) => {
                check_int_pow(dt, s)?;
                let op = self.pw_ops().pow_scalar;
                self.unary_into_self("pow_", op, dt, Attrs::of(scalar_in(s, dt)))
            }
            Rhs::Array(_) => {
                let op = self.pw_ops().pow;
                self.binary_into_self("pow_", op, e, dt)
            }
        }
    }
    /// `base ** self` elementwise, for a number `base` (PyTorch's `torch.pow(2, x)`).
    pub fn rpow(&self, base: impl Into<Scalar>) -> Result<Array> {
        let b = base.into();
        let dt = self.result_with(&[Rhs::Scalar(b)]);
        let x = self.cx.full(&[], scalar_in(b, dt), dt, self.device())?;
        x.binary_in(self.pw_ops().pow, Rhs::Array(self), dt, Attrs::default())
    }

    /// The larger of `self` and `other` elementwise (broadcast, promoted); a NaN where
    /// either is one.
    pub fn maximum(&self, other: &Array) -> Result<Array> {
        let dt = self.result_with(&[Rhs::Array(other)]);
        self.binary_in(self.pw_ops().maximum, Rhs::Array(other), dt, Attrs::default())
    }
    /// The smaller of `self` and `other` elementwise; a NaN where either is one.
    pub fn minimum(&self, other: &Array) -> Result<Array> {
        let dt = self.result_with(&[Rhs::Array(other)]);
        self.binary_in(self.pw_ops().minimum, Rhs::Array(other), dt, Attrs::default())
    }

    /// `atan2(self, other)` elementwise: the angle of the point `(other, self)`; `f32` for
    /// `bool` and integers.
    pub fn atan2(&self, other: &Array) -> Result<Array> {
        let dt = floating(self.result_with(&[Rhs::Array(other)]));
        self.binary_in(self.pw_ops().atan2, Rhs::Array(other), dt, Attrs::default())
    }
    /// [`atan2`](Self::atan2) in place.
    pub fn atan2_(&mut self, other: &Array) -> Result<&mut Self> {
        let dt = floating(self.result_with(&[Rhs::Array(other)]));
        let op = self.pw_ops().atan2;
        self.binary_into_self("atan2_", op, Rhs::Array(other), dt)
    }

    /// `self - other * floor(self / other)`, of the sign of `other` (Python's `%`,
    /// PyTorch's `remainder`). An integer division by zero fails the kernel: the result
    /// carries `Error::Kernel`, returned when it is read.
    pub fn remainder<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        self.binary_in(self.pw_ops().remainder, o, dt, Attrs::default())
    }
    /// [`remainder`](Self::remainder) in place.
    pub fn remainder_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        let op = self.pw_ops().remainder;
        self.binary_into_self("remainder_", op, o, dt)
    }
    /// `self - other * trunc(self / other)`, of the sign of `self` (C's `fmod`); an
    /// integer division by zero fails the kernel.
    pub fn fmod<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        self.binary_in(self.pw_ops().fmod, o, dt, Attrs::default())
    }
    /// [`fmod`](Self::fmod) in place.
    pub fn fmod_<'a>(&mut self, other: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        let op = self.pw_ops().fmod;
        self.binary_into_self("fmod_", op, o, dt)
    }

    /// `self / other` rounded as `mode` says (PyTorch's `div(other, rounding_mode=)`), in
    /// the operands' result type: integers divide as integers (an integer division by
    /// zero fails the kernel: the result carries `Error::Kernel`), floats as PyTorch's
    /// `floor_divide` and `trunc(a / b)`.
    pub fn div_rounded<'a>(&self, other: impl Into<Rhs<'a>>, mode: RoundingMode) -> Result<Array> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        self.binary_in(self.div_op(mode), o, dt, Attrs::default())
    }
    /// [`div_rounded`](Self::div_rounded) in place.
    pub fn div_rounded_<'a>(&mut self, other: impl Into<Rhs<'a>>, mode: RoundingMode) -> Result<&mut Self> {
        let o = other.into();
        let dt = self.result_with(&[o]);
        let op = self.div_op(mode);
        self.binary_into_self("div_", op, o, dt)
    }
    /// `div_rounded(other, RoundingMode::Floor)` (PyTorch's `floor_divide`, Python's `//`).
    pub fn floor_divide<'a>(&self, other: impl Into<Rhs<'a>>) -> Result<Array> {
        self.div_rounded(other, RoundingMode::Floor)
    }

    fn div_op(&self, mode: RoundingMode) -> Op {
        match mode {
            RoundingMode::Floor => self.pw_ops().div_floor,
            RoundingMode::Trunc => self.pw_ops().div_trunc,
        }
    }

    /// `self + alpha * other` (PyTorch's `add(other, alpha=)`): `other * alpha`, then the
    /// sum (two ops). `alpha` must be an integer or boolean where the result is integral.
    pub fn add_alpha<'a>(&self, other: impl Into<Rhs<'a>>, alpha: impl Into<Scalar>) -> Result<Array> {
        let scaled = self.scaled("add", other.into(), alpha.into())?;
        self.add(scaled.as_rhs())
    }
    /// `self - alpha * other` (PyTorch's `sub(other, alpha=)`).
    pub fn sub_alpha<'a>(&self, other: impl Into<Rhs<'a>>, alpha: impl Into<Scalar>) -> Result<Array> {
        let scaled = self.scaled("sub", other.into(), alpha.into())?;
        self.sub(scaled.as_rhs())
    }
    /// [`add_alpha`](Self::add_alpha) in place.
    pub fn add_alpha_<'a>(
        &mut self,
        other: impl Into<Rhs<'a>>,
        alpha: impl Into<Scalar>,
    ) -> Result<&mut Self> {
        let scaled = self.scaled("add_", other.into(), alpha.into())?;
        self.add_(scaled.as_rhs())
    }
    /// [`sub_alpha`](Self::sub_alpha) in place.
    pub fn sub_alpha_<'a>(
        &mut self,
        other: impl Into<Rhs<'a>>,
        alpha: impl Into<Scalar>,
    ) -> Result<&mut Self> {
        let scaled = self.scaled("sub_", other.into(), alpha.into())?;
        self.sub_(scaled.as_rhs())
    }

    /// `other * alpha`, checked as PyTorch checks `alpha`.
    fn scaled(&self, name: &str, other: Rhs<'_>, alpha: Scalar) -> Result<Scaled> {
        let dt = self.result_with(&[other]);
        if !dt.is_floating() && matches!(alpha, Scalar::Float(_)) {
            return Err(refused(
                name,
                format!(
                    "for {dt} results, alpha must not be a floating point number (got {})",
                    alpha.as_f64()
                ),
            ));
        }
        Ok(match other {
            Rhs::Array(a) => {
                Scaled::Array(if matches!(alpha, Scalar::Int(1)) { a.clone() } else { a.mul(alpha)? })
            }
            Rhs::Scalar(s) => Scaled::Scalar(match (s, alpha) {
                (Scalar::Float(_), _) | (_, Scalar::Float(_)) => Scalar::Float(s.as_f64() * alpha.as_f64()),
                (Scalar::Bool(a), Scalar::Bool(b)) => Scalar::Bool(a && b),
                _ => Scalar::Int(s.as_i64().wrapping_mul(alpha.as_i64())),
            }),
        })
    }

    /// Whether both elements are nonzero, as a `bool` array (broadcast; any dtypes).
    pub fn logical_and(&self, other: &Array) -> Result<Array> {
        self.logical(self.pw_ops().logical_and, other)
    }
    /// Whether either element is nonzero.
    pub fn logical_or(&self, other: &Array) -> Result<Array> {
        self.logical(self.pw_ops().logical_or, other)
    }
    /// Whether exactly one element is nonzero.
    pub fn logical_xor(&self, other: &Array) -> Result<Array> {
        self.logical(self.pw_ops().logical_xor, other)
    }

    fn logical(&self, op: Op, other: &Array) -> Result<Array> {
        // Promotion never narrows, so each operand's truth values survive the cast.
        let dt = self.result_with(&[Rhs::Array(other)]);
        self.binary_in(op, Rhs::Array(other), dt, Attrs::default())
    }

    // ---- Ternary ops and clamps.

    /// `self` where `cond` (a `bool` array) is true, `other` elsewhere, broadcast together
    /// (PyTorch's `x.where(cond, other)`, `torch.where(cond, x, other)`).
    pub fn where_cond<'a>(&self, cond: &Array, other: impl Into<Rhs<'a>>) -> Result<Array> {
        where_of(cond, Rhs::Array(self), other.into())
    }

    /// `self` limited to `[min, max]` elementwise (either bound an array, broadcast, or a
    /// number; at least one given): `minimum(maximum(x, min), max)`, so a NaN gives NaN and
    /// `min > max` gives `max`, as PyTorch.
    pub fn clamp(&self, min: Option<Rhs<'_>>, max: Option<Rhs<'_>>) -> Result<Array> {
        let (dt, op, attrs, ins) = self.clamp_call(min, max)?;
        let x = self.to_dtype(dt)?;
        let mut all = vec![&x];
        all.extend(ins.iter());
        x.call(op, &all, attrs)
    }
    /// [`clamp`](Self::clamp) in place.
    pub fn clamp_(&mut self, min: Option<Rhs<'_>>, max: Option<Rhs<'_>>) -> Result<&mut Self> {
        let (dt, op, attrs, ins) = self.clamp_call(min, max)?;
        self.check_cast("clamp_", dt)?;
        let mut shape: crate::vm::Shape = self.shape().into();
        for a in &ins {
            shape = super::layout::broadcast_shapes("clamp_", &shape, a.shape())?;
        }
        self.check_shape("clamp_", &shape)?;
        if dt != self.dtype() {
            let r = self.clamp(min, max)?;
            return self.copy_(&r);
        }
        let mut all = vec![&*self];
        all.extend(ins.iter());
        self.call_into(op, &all, self, attrs)?;
        Ok(self)
    }
    /// `clamp(min, None)`.
    pub fn clamp_min<'a>(&self, min: impl Into<Rhs<'a>>) -> Result<Array> {
        self.clamp(Some(min.into()), None)
    }
    /// `clamp(None, max)`.
    pub fn clamp_max<'a>(&self, max: impl Into<Rhs<'a>>) -> Result<Array> {
        self.clamp(None, Some(max.into()))
    }
    /// [`clamp_min`](Self::clamp_min) in place.
    pub fn clamp_min_<'a>(&mut self, min: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.clamp_(Some(min.into()), None)
    }
    /// [`clamp_max`](Self::clamp_max) in place.
    pub fn clamp_max_<'a>(&mut self, max: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        self.clamp_(None, Some(max.into()))
    }
    /// PyTorch's alias of [`clamp`](Self::clamp).
    pub fn clip(&self, min: Option<Rhs<'_>>, max: Option<Rhs<'_>>) -> Result<Array> {
        self.clamp(min, max)
    }

    /// The dtype, op, attributes and other inputs of a clamp.
    fn clamp_call(
        &self,
        min: Option<Rhs<'_>>,
        max: Option<Rhs<'_>>,
    ) -> Result<(DType, Op, Attrs, Vec<Array>)> {
        let given: Vec<Rhs<'_>> = min.iter().chain(max.iter()).copied().collect();
        if given.is_empty() {
            return Err(refused("clamp", "at least one of min and max must be given".into()));
        }
        let dt = self.result_with(&given);
        let o = self.pw_ops();
        let scalar = |r: &Option<Rhs<'_>>| matches!(r, None | Some(Rhs::Scalar(_)));
        if scalar(&min) && scalar(&max) {
            let s = |r: &Option<Rhs<'_>>| match r {
                Some(Rhs::Scalar(s)) => Some(scalar_in(*s, dt)),
                _ => None,
            };
            let (lo, hi) = (s(&min), s(&max));
            let scalars: Vec<Scalar> = lo.into_iter().chain(hi).collect();
            let attrs = with_params(
                "clamp",
                Attrs::default(),
                &[lo.is_some() as i64, hi.is_some() as i64],
                &scalars,
            )?;
            return Ok((dt, o.clamp_scalar, attrs, vec![]));
        }
        let arr = |r: Option<Rhs<'_>>| r.map(|r| self.operand_as(r, dt)).transpose();
        let (lo, hi) = (arr(min)?, arr(max)?);
        Ok(match (lo, hi) {
            (Some(lo), Some(hi)) => (dt, o.clamp, Attrs::default(), vec![lo, hi]),
            (Some(lo), None) => (dt, o.maximum, Attrs::default(), vec![lo]),
            (None, Some(hi)) => (dt, o.minimum, Attrs::default(), vec![hi]),
            (None, None) => unreachable!("one bound is given"),
        })
    }

    /// `self + weight * (end - self)` elementwise (PyTorch's `lerp`, exact at both ends),
    /// `weight` an array (broadcast) or a number; floating dtypes.
    pub fn lerp<'a>(&self, end: &Array, weight: impl Into<Rhs<'a>>) -> Result<Array> {
        let (dt, op, attrs, ins) = self.lerp_call(end, weight.into())?;
        let x = self.to_dtype(dt)?;
        let mut all = vec![&x];
        all.extend(ins.iter());
        x.call(op, &all, attrs)
    }
    /// [`lerp`](Self::lerp) in place.
    pub fn lerp_<'a>(&mut self, end: &Array, weight: impl Into<Rhs<'a>>) -> Result<&mut Self> {
        let w = weight.into();
        let (dt, op, attrs, ins) = self.lerp_call(end, w)?;
        self.ternary_into_self("lerp_", dt, op, attrs, &ins, |x| x.lerp(end, w))
    }

    fn lerp_call(&self, end: &Array, w: Rhs<'_>) -> Result<(DType, Op, Attrs, Vec<Array>)> {
        // A number weight does not take part in the dtype: PyTorch refuses an integer
        // `lerp` whatever the weight.
        let dt = match w {
            Rhs::Array(_) => self.result_with(&[Rhs::Array(end), w]),
            Rhs::Scalar(_) => self.result_with(&[Rhs::Array(end)]),
        };
        if !dt.is_floating() {
            return Err(refused(
                "lerp",
                format!("lerp computes on floating dtypes, not {dt}: cast to one first"),
            ));
        }
        let e = end.to_dtype(dt)?;
        Ok(match w {
            Rhs::Scalar(s) => (dt, self.pw_ops().lerp_scalar, Attrs::of(Scalar::Float(s.as_f64())), vec![e]),
            Rhs::Array(wa) => (dt, self.pw_ops().lerp, Attrs::default(), vec![e, wa.to_dtype(dt)?]),
        })
    }

    /// `self + value * t1 * t2` elementwise, broadcast (PyTorch's `addcmul`); `value` must
    /// not be a float where the result is integral.
    pub fn addcmul(&self, t1: &Array, t2: &Array, value: impl Into<Scalar>) -> Result<Array> {
        self.addc("addcmul", self.pw_ops().addcmul, t1, t2, value.into(), false)
    }
    /// `self + value * t1 / t2` elementwise, broadcast (PyTorch's `addcdiv`); floating
    /// dtypes only (PyTorch refuses integer division here).
    pub fn addcdiv(&self, t1: &Array, t2: &Array, value: impl Into<Scalar>) -> Result<Array> {
        self.addc("addcdiv", self.pw_ops().addcdiv, t1, t2, value.into(), true)
    }
    /// [`addcmul`](Self::addcmul) in place.
    pub fn addcmul_(&mut self, t1: &Array, t2: &Array, value: impl Into<Scalar>) -> Result<&mut Self> {
        let v = value.into();
        let (dt, attrs) = self.addc_check("addcmul_", t1, t2, v, false)?;
        let (a, b) = (t1.to_dtype(dt)?, t2.to_dtype(dt)?);
        let op = self.pw_ops().addcmul;
        self.ternary_into_self("addcmul_", dt, op, attrs, &[a, b], |x| x.addcmul(t1, t2, v))
    }
    /// [`addcdiv`](Self::addcdiv) in place.
    pub fn addcdiv_(&mut self, t1: &Array, t2: &Array, value: impl Into<Scalar>) -> Result<&mut Self> {
        let v = value.into();
        let (dt, attrs) = self.addc_check("addcdiv_", t1, t2, v, true)?;
        let (a, b) = (t1.to_dtype(dt)?, t2.to_dtype(dt)?);
        let op = self.pw_ops().addcdiv;
        self.ternary_into_self("addcdiv_", dt, op, attrs, &[a, b], |x| x.addcdiv(t1, t2, v))
    }

    fn addc_check(&self, name: &str, t1: &Array, t2: &Array, v: Scalar, div: bool) -> Result<(DType, Attrs)> {
        let dt = self.result_with(&[Rhs::Array(t1), Rhs::Array(t2)]);
        if div && !dt.is_floating() {
            return Err(refused(
                name,
                format!(
                    "integer division with addcdiv is not supported ({dt}): cast to a floating dtype first"
                ),
            ));
        }
        if !dt.is_floating() && matches!(v, Scalar::Float(_)) {
            return Err(refused(name, format!("for {dt} inputs, value must not be a floating point number")));
        }
        Ok((dt, Attrs::of(scalar_in(v, dt))))
    }

    fn addc(&self, name: &str, op: Op, t1: &Array, t2: &Array, v: Scalar, div: bool) -> Result<Array> {
        let (dt, attrs) = self.addc_check(name, t1, t2, v, div)?;
        let (x, a, b) = (self.to_dtype(dt)?, t1.to_dtype(dt)?, t2.to_dtype(dt)?);
        x.call(op, &[&x, &a, &b], attrs)
    }

    /// A ternary op written into this array: in place where the dtype and shape allow,
    /// else `compute` cast back.
    fn ternary_into_self(
        &mut self,
        name: &str,
        dt: DType,
        op: Op,
        attrs: Attrs,
        ins: &[Array],
        compute: impl FnOnce(&Array) -> Result<Array>,
    ) -> Result<&mut Self> {
        self.check_cast(name, dt)?;
        let mut shape: crate::vm::Shape = self.shape().into();
        for a in ins {
            shape = super::layout::broadcast_shapes(name, &shape, a.shape())?;
        }
        self.check_shape(name, &shape)?;
        if dt != self.dtype() {
            let r = compute(self)?;
            return self.copy_(&r);
        }
        let mut all = vec![&*self];
        all.extend(ins.iter());
        self.call_into(op, &all, self, attrs)?;
        Ok(self)
    }

    // ---- Structured arrays.

    /// The lower triangle of each matrix (the last two dimensions): elements above
    /// diagonal `diagonal` (0 the main one, positive above it) zeroed (PyTorch's `tril`).
    pub fn tril(&self, diagonal: i64) -> Result<Array> {
        let attrs = with_params("tril", Attrs::default(), &[diagonal], &[])?;
        self.call(self.pw_ops().tril, &[self], attrs)
    }
    /// [`tril`](Self::tril) in place.
    pub fn tril_(&mut self, diagonal: i64) -> Result<&mut Self> {
        let attrs = with_params("tril_", Attrs::default(), &[diagonal], &[])?;
        self.call_into(self.pw_ops().tril, &[self], self, attrs)?;
        Ok(self)
    }
    /// The upper triangle of each matrix: elements below diagonal `diagonal` zeroed.
    pub fn triu(&self, diagonal: i64) -> Result<Array> {
        let attrs = with_params("triu", Attrs::default(), &[diagonal], &[])?;
        self.call(self.pw_ops().triu, &[self], attrs)
    }
    /// [`triu`](Self::triu) in place.
    pub fn triu_(&mut self, diagonal: i64) -> Result<&mut Self> {
        let attrs = with_params("triu_", Attrs::default(), &[diagonal], &[])?;
        self.call_into(self.pw_ops().triu, &[self], self, attrs)?;
        Ok(self)
    }

    /// Class indices (an `i64` array) as one-hot rows: `i64` of this shape plus a last
    /// dimension of `num_classes` (PyTorch's `nn.functional.one_hot`). A negative
    /// `num_classes` takes one more than the largest index, which reads the array: this
    /// waits for its value. An index outside `0..num_classes` fails the kernel.
    pub fn one_hot(&self, num_classes: i64) -> Result<Array> {
        if self.dtype() != DType::I64 {
            return Err(refused(
                "one_hot",
                format!("one_hot takes an i64 array of class indices, not {}", self.dtype()),
            ));
        }
        let c = if num_classes < 0 {
            if self.numel() == 0 {
                return Err(refused(
                    "one_hot",
                    "can not infer the number of classes of an empty array: give num_classes".into(),
                ));
            }
            self.to_vec::<i64>()?.into_iter().max().unwrap_or(0).saturating_add(1)
        } else {
            num_classes
        };
        let attrs = with_params("one_hot", Attrs::default(), &[c], &[])?;
        self.call(self.pw_ops().one_hot, &[self], attrs)
    }
}

/// An array in place of a number operand.
enum Scaled {
    Array(Array),
    Scalar(Scalar),
}

impl Scaled {
    fn as_rhs(&self) -> Rhs<'_> {
        match self {
            Scaled::Array(a) => Rhs::Array(a),
            Scaled::Scalar(s) => Rhs::Scalar(*s),
        }
    }
}

fn gelu_attrs(approximate: &str) -> Result<Attrs> {
    let flag = match approximate {
        "none" => 0,
        "tanh" => 1,
        other => {
            return Err(refused("gelu", format!("approximate must be 'none' or 'tanh', not {other:?}")));
        }
    };
    with_params("gelu", Attrs::default(), &[flag], &[])
}

fn check_int_pow(dt: DType, s: Scalar) -> Result<()> {
    if !dt.is_floating() && matches!(s, Scalar::Int(e) if e < 0) {
        return Err(refused("pow", "integers to negative integer powers are not allowed".into()));
    }
    Ok(())
}

/// `x` where `cond` (a `bool` array) is true, `y` elsewhere, all three broadcast together,
/// in the result type of `x` and `y` (either a number, made a 0-d array on `cond`'s
/// device): PyTorch's `torch.where(cond, x, y)`.
pub fn where_of(cond: &Array, x: Rhs<'_>, y: Rhs<'_>) -> Result<Array> {
    let dt = result_type(&[operand_of(&x), operand_of(&y)]).expect("two operands");
    let (a, b) = (cond.operand_as(x, dt)?, cond.operand_as(y, dt)?);
    cond.call(cond.pw_ops().where_, &[cond, &a, &b], Attrs::default())
}

impl Context {
    /// `steps` values from `start` to `end`, evenly spaced, as `dtype` on `device`
    /// (PyTorch's `linspace`: step `(end - start) / (steps - 1)`, the first half counted
    /// from `start` and the second from `end`, so both ends are exact). Computed on the
    /// host in `f64`, then converted (an integer dtype truncates toward zero) and copied.
    pub fn linspace(
        &self,
        start: f64,
        end: f64,
        steps: usize,
        dtype: DType,
        device: DeviceId,
    ) -> Result<Array> {
        let step = if steps > 1 { (end - start) / (steps - 1) as f64 } else { 0.0 };
        let half = steps / 2;
        let vals: Vec<f64> = (0..steps)
            .map(|i| if i < half { start + step * i as f64 } else { end - step * (steps - 1 - i) as f64 })
            .collect();
        self.from_slice(&vals, &[steps], DeviceId::CPU)?.to_dtype(dtype)?.to(device)
    }

    /// A `[n, m]` array with ones on the diagonal and zeros elsewhere (PyTorch's `eye`):
    /// zeros, then the diagonal view filled.
    pub fn eye(&self, n: usize, m: usize, dtype: DType, device: DeviceId) -> Result<Array> {
        let a = self.zeros(&[n, m], dtype, device)?;
        if n > 0 && m > 0 {
            a.diagonal(0, 0, 1)?.fill_(Scalar::Int(1))?;
        }
        Ok(a)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::mock::MockConfig;
    use crate::prelude::*;

    fn vm() -> VirtualMachine {
        VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
    }

    const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

    #[test]
    fn floating_ops_promote_integers_to_f32() {
        let vm = vm();
        let cx = Context::new(&vm);
        for d in DEVICES {
            let x = cx.from_slice(&[0i64, 1, 2], &[3], d).unwrap();
            let e = x.exp().unwrap();
            assert_eq!(e.dtype(), DType::F32);
            assert_eq!(e.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap(), [1.0, 1f32.exp(), 2f32.exp()]);
            let mut y = x.clone();
            let err = y.exp_().unwrap_err();
            assert!(err.to_string().contains("cannot be cast"), "{err}");
            let g = x.gelu("tanh").unwrap();
            assert_eq!(g.dtype(), DType::F32);
            assert!(x.gelu("fast").is_err());
            // A float array keeps its dtype, in place through a view too.
            let mut f = cx.from_slice(&[1.0f64, 4.0, 9.0], &[3], d).unwrap();
            f.sqrt_().unwrap();
            assert_eq!(f.to(DeviceId::CPU).unwrap().to_vec::<f64>().unwrap(), [1.0, 2.0, 3.0]);
        }
    }

    #[test]
    fn binary_ops_promote_and_wrap_numbers() {
        let vm = vm();
        let cx = Context::new(&vm);
        let x = cx.from_slice(&[-7i64, -1, 5, 7], &[4], DeviceId::CPU).unwrap();
        assert_eq!(x.remainder(3).unwrap().to_vec::<i64>().unwrap(), [2, 2, 2, 1]);
        assert_eq!(x.fmod(3).unwrap().to_vec::<i64>().unwrap(), [-1, -1, 2, 1]);
        assert_eq!(x.floor_divide(2).unwrap().to_vec::<i64>().unwrap(), [-4, -1, 2, 3]);
        assert_eq!(x.div_rounded(2, RoundingMode::Trunc).unwrap().to_vec::<i64>().unwrap(), [-3, 0, 2, 3]);
        let f = x.remainder(2.5).unwrap();
        assert_eq!(f.dtype(), DType::F32);
        assert_eq!(f.to_vec::<f32>().unwrap(), [0.5, 1.5, 0.0, 2.0]);
        assert_eq!(x.pow(2).unwrap().to_vec::<i64>().unwrap(), [49, 1, 25, 49]);
        assert!(x.pow(-1).unwrap_err().to_string().contains("negative integer powers"));
        assert_eq!(x.rpow(2).unwrap().to_vec::<i64>().unwrap(), [0, 0, 32, 128]);
        assert_eq!(x.add_alpha(&x, 2).unwrap().to_vec::<i64>().unwrap(), [-21, -3, 15, 21]);
        assert!(x.add_alpha(&x, 0.5).is_err());
        // Integer division by zero: the result carries the kernel's error.
        let z = cx.from_slice(&[1i64, 0, 1, 1], &[4], DeviceId::CPU).unwrap();
        let err = x.floor_divide(&z).unwrap().to_vec::<i64>().unwrap_err();
        assert!(err.to_string().contains("integer division by zero"), "{err}");
        let b = cx.from_slice(&[true, false, true, false], &[4], DeviceId::CPU).unwrap();
        assert_eq!(x.logical_and(&b).unwrap().to_vec::<bool>().unwrap(), [true, false, true, false]);
    }

    #[test]
    fn ternary_ops_and_clamps() {
        let vm = vm();
        let cx = Context::new(&vm);
        for d in DEVICES {
            let x = cx.from_slice(&[-2.0f32, 0.5, 3.0, f32::NAN], &[4], d).unwrap();
            let c = x.clamp(Some(Rhs::from(0.0)), Some(Rhs::from(1.0))).unwrap();
            let v = c.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(&v[..3], &[0.0, 0.5, 1.0]);
            assert!(v[3].is_nan());
            let lo = cx.from_slice(&[0.0f32, 1.0, 0.0, 0.0], &[4], d).unwrap();
            let v = x.clamp_min(&lo).unwrap().to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap();
            assert_eq!(&v[..3], &[0.0, 1.0, 3.0]);
            let cond = x.gt(0.0).unwrap();
            let w = where_of(&cond, Rhs::Array(&x), Rhs::from(-1.0)).unwrap();
            assert_eq!(w.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap()[..3], [-1.0, 0.5, 3.0]);
            let mut y = x.copy().unwrap();
            y.addcmul_(&lo, &lo, 2.0).unwrap();
            assert_eq!(y.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap()[..3], [-2.0, 2.5, 3.0]);
            let l = lo.lerp(&x, 0.5).unwrap();
            assert_eq!(l.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap()[..3], [-1.0, 0.75, 1.5]);
        }
        let i = cx.from_slice(&[1i64, 5, 9], &[3], DeviceId::CPU).unwrap();
        assert_eq!(
            i.clamp(Some(Rhs::from(2)), Some(Rhs::from(6))).unwrap().to_vec::<i64>().unwrap(),
            [2, 5, 6]
        );
        assert_eq!(i.clamp_min(2.5).unwrap().dtype(), DType::F32);
        assert!(i.clamp(None, None).is_err());
        assert!(i.addcdiv(&i, &i, 1).is_err());
    }

    #[test]
    fn structured_arrays() {
        let vm = vm();
        let cx = Context::new(&vm);
        let e = cx.eye(2, 3, DType::I64, DeviceId::mock(0)).unwrap();
        assert_eq!(e.to(DeviceId::CPU).unwrap().to_vec::<i64>().unwrap(), [1, 0, 0, 0, 1, 0]);
        let l = cx.linspace(-1.0, 1.0, 5, DType::F32, DeviceId::CPU).unwrap();
        assert_eq!(l.to_vec::<f32>().unwrap(), [-1.0, -0.5, 0.0, 0.5, 1.0]);
        let m = cx.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], DeviceId::CPU).unwrap();
        assert_eq!(m.tril(0).unwrap().to_vec::<f32>().unwrap(), [1.0, 0.0, 3.0, 4.0]);
        assert_eq!(m.triu(1).unwrap().to_vec::<f32>().unwrap(), [0.0, 2.0, 0.0, 0.0]);
        let idx = cx.from_slice(&[2i64, 0], &[2], DeviceId::CPU).unwrap();
        let oh = idx.one_hot(-1).unwrap();
        assert_eq!(oh.shape(), &[2, 3]);
        assert_eq!(oh.to_vec::<i64>().unwrap(), [0, 0, 1, 1, 0, 0]);
        assert!(m.one_hot(2).is_err());
    }
}
