//! The pointwise math of `eagervm.Array` (`exp`, `sigmoid`, `pow`, `remainder`, `where`,
//! `clamp`, `lerp`, `addcmul`, `tril`, ...), the operators `**`, `%`, `//` and `abs()`,
//! and the module functions `eagervm.<fn>` of the same names, each one call of
//! [`eager::Array`](crate::eager::Array)'s (`eager::pointwise`: PyTorch's promotion,
//! broadcasting and in-place rules are there). [`register`] adds the module functions.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::args::type_name;
use super::array::PyArr;
use super::dtype::{opt_device, opt_dtype};
use super::interop::scalar_of;
use super::issue::issued;
use super::ops::operand;
use super::vm::PyVm;
use crate::eager::promote::{result_type, Operand};
use crate::eager::{where_of, Array, Rhs, RoundingMode, DEFAULT_FLOAT};
use crate::ep::DeviceId;
use crate::framework::Scalar;
use crate::Result;

/// `v` as an operand (an array or a number), or the `TypeError` of `op`'s argument `what`.
fn rhs<'a>(op: &str, what: &str, v: &'a Bound<'_, PyAny>) -> PyResult<Rhs<'a>> {
    operand(v)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{op}(): argument '{what}' must be an eagervm array or a number, not {}",
            type_name(v)
        ))
    })
}

/// `v` as an operand, `None` for Python's `None`.
fn opt_rhs<'a>(op: &str, what: &str, v: Option<&'a Bound<'_, PyAny>>) -> PyResult<Option<Rhs<'a>>> {
    match v {
        Some(v) if !v.is_none() => rhs(op, what, v).map(Some),
        _ => Ok(None),
    }
}

/// `v` as a number, or the `TypeError` of `op`'s argument `what`.
fn number(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    scalar_of(v)?.ok_or_else(|| {
        PyTypeError::new_err(format!("{op}(): argument '{what}' must be a number, not {}", type_name(v)))
    })
}

/// A new array of a call on `me`'s context.
fn ret(py: Python<'_>, me: &Array, r: Result<Array>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, me.context(), r)? })
}

/// An in-place call on `slf`'s array; returns `slf`.
fn in_place<'py>(
    slf: &Bound<'py, PyArr>,
    f: impl FnOnce(&mut Array) -> Result<&mut Array>,
) -> PyResult<Bound<'py, PyArr>> {
    let me = slf.get();
    let mut a = me.a.clone();
    issued(slf.py(), me.a.context(), f(&mut a).map(|_| ()))?;
    Ok(slf.clone())
}

fn rounding(mode: &str) -> PyResult<RoundingMode> {
    match mode {
        "floor" => Ok(RoundingMode::Floor),
        "trunc" => Ok(RoundingMode::Trunc),
        other => Err(PyValueError::new_err(format!(
            "div expected rounding_mode to be one of None, 'trunc', or 'floor' but found '{other}'"
        ))),
    }
}

/// `me.add(other, alpha=)` and `me.sub(other, alpha=)`.
pub(crate) fn with_alpha(
    py: Python<'_>,
    me: &PyArr,
    other: &Bound<'_, PyAny>,
    alpha: &Bound<'_, PyAny>,
    sub: bool,
) -> PyResult<PyArr> {
    let name = if sub { "sub" } else { "add" };
    let (o, alpha) = (rhs(name, "other", other)?, number(name, "alpha", alpha)?);
    let r = if sub { me.a.sub_alpha(o, alpha) } else { me.a.add_alpha(o, alpha) };
    ret(py, &me.a, r)
}

/// `me.add_(other, alpha=)` and `me.sub_(other, alpha=)`.
pub(crate) fn with_alpha_(
    py: Python<'_>,
    me: &PyArr,
    other: &Bound<'_, PyAny>,
    alpha: &Bound<'_, PyAny>,
    sub: bool,
) -> PyResult<()> {
    let name = if sub { "sub_" } else { "add_" };
    let (o, alpha) = (rhs(name, "other", other)?, number(name, "alpha", alpha)?);
    let mut a = me.a.clone();
    let r = if sub { a.sub_alpha_(o, alpha).map(|_| ()) } else { a.add_alpha_(o, alpha).map(|_| ()) };
    issued(py, me.a.context(), r)
}

/// `me.div(other, rounding_mode=mode)`.
pub(crate) fn div_rounded(
    py: Python<'_>,
    me: &PyArr,
    other: &Bound<'_, PyAny>,
    mode: &str,
) -> PyResult<PyArr> {
    let (o, mode) = (rhs("div", "other", other)?, rounding(mode)?);
    ret(py, &me.a, me.a.div_rounded(o, mode))
}

/// `me.div_(other, rounding_mode=mode)`.
pub(crate) fn div_rounded_(py: Python<'_>, me: &PyArr, other: &Bound<'_, PyAny>, mode: &str) -> PyResult<()> {
    let (o, mode) = (rhs("div_", "other", other)?, rounding(mode)?);
    let mut a = me.a.clone();
    issued(py, me.a.context(), a.div_rounded_(o, mode).map(|_| ()))
}

/// `s op x` for a number `s` (`2 % x`, `2 // x`): `s` as a 0-d array of the result type.
fn reflected(
    py: Python<'_>,
    me: &Array,
    s: Scalar,
    f: impl FnOnce(&Array, &Array) -> Result<Array>,
) -> PyResult<PyArr> {
    let dt = result_type(&[Operand::Tensor { dtype: me.dtype(), rank: me.ndim() }, Operand::Scalar(s)])
        .unwrap_or(DEFAULT_FLOAT);
    let r = me.context().full(&[], s, dt, me.device()).and_then(|x| f(&x, me));
    ret(py, me, r)
}

macro_rules! unary_methods {
    ($($name:ident, $name_:ident;)*) => {
        #[pymethods]
        impl PyArr {$(
            #[doc = concat!("PyTorch's `", stringify!($name), "` elementwise (`docs/ops.md`).")]
            fn $name(&self, py: Python<'_>) -> PyResult<PyArr> {
                ret(py, &self.a, self.a.$name())
            }
            #[doc = concat!("`", stringify!($name), "` in place; returns this array.")]
            fn $name_<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
                in_place(slf, |a| a.$name_())
            }
        )*}

        /// The module functions of the unary methods.
        mod unary_fns {
            use super::*;
            $(
                #[doc = concat!("PyTorch's `torch.", stringify!($name), "(input)`.")]
                #[pyfunction]
                pub(crate) fn $name(py: Python<'_>, input: PyRef<'_, PyArr>) -> PyResult<PyArr> {
                    ret(py, &input.a, input.a.$name())
                }
            )*
            pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
                $(m.add_function(wrap_pyfunction!($name, m)?)?;)*
                Ok(())
            }
        }
    };
}

unary_methods! {
    exp, exp_;
    exp2, exp2_;
    log, log_;
    log2, log2_;
    log1p, log1p_;
    expm1, expm1_;
    sqrt, sqrt_;
    rsqrt, rsqrt_;
    reciprocal, reciprocal_;
    sin, sin_;
    cos, cos_;
    tanh, tanh_;
    sigmoid, sigmoid_;
    silu, silu_;
    erf, erf_;
    abs, abs_;
    floor, floor_;
    ceil, ceil_;
    sign, sign_;
    logical_not, logical_not_;
}

#[pymethods]
impl PyArr {
    /// Whether each element is a NaN, a bool array.
    fn isnan(&self, py: Python<'_>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.isnan())
    }
    /// Whether each element is infinite.
    fn isinf(&self, py: Python<'_>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.isinf())
    }
    /// Whether each element is finite.
    fn isfinite(&self, py: Python<'_>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.isfinite())
    }
    /// `neg` in place.
    fn neg_<'py>(slf: &Bound<'py, Self>) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.neg_())
    }
    /// `abs(x)`.
    fn __abs__(&self, py: Python<'_>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.abs())
    }
    /// The absolute value (PyTorch's alias of `abs`).
    fn absolute(&self, py: Python<'_>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.abs())
    }

    /// Rounded to `decimals` decimal places, halves to even.
    #[pyo3(signature = (*, decimals=0))]
    fn round(&self, py: Python<'_>, decimals: i64) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.round_decimals(decimals))
    }
    /// `round` in place.
    #[pyo3(signature = (*, decimals=0))]
    fn round_<'py>(slf: &Bound<'py, Self>, decimals: i64) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.round_decimals_(decimals))
    }
    /// The Gaussian error linear unit (`nn.functional.gelu`): `approximate` `'none'` or
    /// `'tanh'`.
    #[pyo3(signature = (approximate="none"))]
    fn gelu(&self, py: Python<'_>, approximate: &str) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.gelu(approximate))
    }
    /// `gelu` in place.
    #[pyo3(signature = (approximate="none"))]
    fn gelu_<'py>(slf: &Bound<'py, Self>, approximate: &str) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.gelu_(approximate))
    }

    /// `self ** exponent` (an array or a number).
    fn pow(&self, py: Python<'_>, exponent: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let e = rhs("pow", "exponent", exponent)?;
        ret(py, &self.a, self.a.pow(e))
    }
    /// `pow` in place.
    fn pow_<'py>(slf: &Bound<'py, Self>, exponent: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let e = rhs("pow_", "exponent", exponent)?;
        in_place(slf, |a| a.pow_(e))
    }
    fn __pow__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        _modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        match operand(other)? {
            Some(e) => Ok(Py::new(py, ret(py, &self.a, self.a.pow(e))?)?.into_any()),
            None => Ok(py.NotImplemented()),
        }
    }
    fn __rpow__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        _modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyObject> {
        match scalar_of(other)? {
            Some(s) if !other.is_instance_of::<PyArr>() => {
                Ok(Py::new(py, ret(py, &self.a, self.a.rpow(s))?)?.into_any())
            }
            _ => Ok(py.NotImplemented()),
        }
    }
    fn __ipow__(
        &self,
        py: Python<'_>,
        other: &Bound<'_, PyAny>,
        _modulo: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        let e = rhs("pow_", "exponent", other)?;
        let mut a = self.a.clone();
        issued(py, self.a.context(), a.pow_(e).map(|_| ()))
    }

    /// The larger of `self` and `other` elementwise (NaN propagates).
    fn maximum(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.maximum(&other.a))
    }
    /// The smaller of `self` and `other` elementwise (NaN propagates).
    fn minimum(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.minimum(&other.a))
    }
    /// `atan2(self, other)` elementwise.
    fn atan2(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.atan2(&other.a))
    }
    /// `atan2` in place.
    fn atan2_<'py>(slf: &Bound<'py, Self>, other: PyRef<'py, PyArr>) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.atan2_(&other.a))
    }
    /// Python's `%`: the remainder of the sign of `other`.
    fn remainder(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let o = rhs("remainder", "other", other)?;
        ret(py, &self.a, self.a.remainder(o))
    }
    /// `remainder` in place.
    fn remainder_<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let o = rhs("remainder_", "other", other)?;
        in_place(slf, |a| a.remainder_(o))
    }
    /// C's `fmod`: the remainder of the sign of `self`.
    fn fmod(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let o = rhs("fmod", "other", other)?;
        ret(py, &self.a, self.a.fmod(o))
    }
    /// `fmod` in place.
    fn fmod_<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let o = rhs("fmod_", "other", other)?;
        in_place(slf, |a| a.fmod_(o))
    }
    fn __mod__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match operand(other)? {
            Some(o) => Ok(Py::new(py, ret(py, &self.a, self.a.remainder(o))?)?.into_any()),
            None => Ok(py.NotImplemented()),
        }
    }
    fn __rmod__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match scalar_of(other)? {
            Some(s) if !other.is_instance_of::<PyArr>() => {
                Ok(Py::new(py, reflected(py, &self.a, s, |x, me| x.remainder(me))?)?.into_any())
            }
            _ => Ok(py.NotImplemented()),
        }
    }
    fn __imod__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let o = rhs("remainder_", "other", other)?;
        let mut a = self.a.clone();
        issued(py, self.a.context(), a.remainder_(o).map(|_| ()))
    }
    /// Python's `//` (`div` with `rounding_mode="floor"`).
    fn floor_divide(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let o = rhs("floor_divide", "other", other)?;
        ret(py, &self.a, self.a.floor_divide(o))
    }
    /// `floor_divide` in place.
    fn floor_divide_<'py>(slf: &Bound<'py, Self>, other: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let o = rhs("floor_divide_", "other", other)?;
        in_place(slf, |a| a.div_rounded_(o, RoundingMode::Floor))
    }
    fn __floordiv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match operand(other)? {
            Some(o) => Ok(Py::new(py, ret(py, &self.a, self.a.floor_divide(o))?)?.into_any()),
            None => Ok(py.NotImplemented()),
        }
    }
    fn __rfloordiv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match scalar_of(other)? {
            Some(s) if !other.is_instance_of::<PyArr>() => {
                Ok(Py::new(py, reflected(py, &self.a, s, |x, me| x.floor_divide(me))?)?.into_any())
            }
            _ => Ok(py.NotImplemented()),
        }
    }
    fn __ifloordiv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<()> {
        let o = rhs("floor_divide_", "other", other)?;
        let mut a = self.a.clone();
        issued(py, self.a.context(), a.div_rounded_(o, RoundingMode::Floor).map(|_| ()))
    }

    /// Whether both elements are nonzero, a bool array.
    fn logical_and(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.logical_and(&other.a))
    }
    /// Whether either element is nonzero.
    fn logical_or(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.logical_or(&other.a))
    }
    /// Whether exactly one element is nonzero.
    fn logical_xor(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.logical_xor(&other.a))
    }

    /// `self` where `condition` is true, `other` (an array or a number) elsewhere.
    #[pyo3(name = "where")]
    fn where_(
        &self,
        py: Python<'_>,
        condition: PyRef<'_, PyArr>,
        other: &Bound<'_, PyAny>,
    ) -> PyResult<PyArr> {
        let o = rhs("where", "other", other)?;
        ret(py, &self.a, self.a.where_cond(&condition.a, o))
    }

    /// Limited to `[min, max]` (arrays or numbers; at least one given).
    #[pyo3(signature = (min=None, max=None))]
    fn clamp(
        &self,
        py: Python<'_>,
        min: Option<&Bound<'_, PyAny>>,
        max: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let (lo, hi) = (opt_rhs("clamp", "min", min)?, opt_rhs("clamp", "max", max)?);
        ret(py, &self.a, self.a.clamp(lo, hi))
    }
    /// `clamp` in place.
    #[pyo3(signature = (min=None, max=None))]
    fn clamp_<'py>(
        slf: &Bound<'py, Self>,
        min: Option<&Bound<'py, PyAny>>,
        max: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        let (lo, hi) = (opt_rhs("clamp_", "min", min)?, opt_rhs("clamp_", "max", max)?);
        in_place(slf, |a| a.clamp_(lo, hi))
    }
    /// PyTorch's alias of `clamp`.
    #[pyo3(signature = (min=None, max=None))]
    fn clip(
        &self,
        py: Python<'_>,
        min: Option<&Bound<'_, PyAny>>,
        max: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        self.clamp(py, min, max)
    }
    /// PyTorch's alias of `clamp_`.
    #[pyo3(signature = (min=None, max=None))]
    fn clip_<'py>(
        slf: &Bound<'py, Self>,
        min: Option<&Bound<'py, PyAny>>,
        max: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        Self::clamp_(slf, min, max)
    }
    /// `clamp(min=min)`.
    fn clamp_min(&self, py: Python<'_>, min: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let lo = rhs("clamp_min", "min", min)?;
        ret(py, &self.a, self.a.clamp_min(lo))
    }
    /// `clamp(max=max)`.
    fn clamp_max(&self, py: Python<'_>, max: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let hi = rhs("clamp_max", "max", max)?;
        ret(py, &self.a, self.a.clamp_max(hi))
    }
    /// `clamp_min` in place.
    fn clamp_min_<'py>(slf: &Bound<'py, Self>, min: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let lo = rhs("clamp_min_", "min", min)?;
        in_place(slf, |a| a.clamp_min_(lo))
    }
    /// `clamp_max` in place.
    fn clamp_max_<'py>(slf: &Bound<'py, Self>, max: &Bound<'py, PyAny>) -> PyResult<Bound<'py, Self>> {
        let hi = rhs("clamp_max_", "max", max)?;
        in_place(slf, |a| a.clamp_max_(hi))
    }

    /// `self + weight * (end - self)` (`weight` an array or a number).
    fn lerp(&self, py: Python<'_>, end: PyRef<'_, PyArr>, weight: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        let w = rhs("lerp", "weight", weight)?;
        ret(py, &self.a, self.a.lerp(&end.a, w))
    }
    /// `lerp` in place.
    fn lerp_<'py>(
        slf: &Bound<'py, Self>,
        end: PyRef<'py, PyArr>,
        weight: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, Self>> {
        let w = rhs("lerp_", "weight", weight)?;
        in_place(slf, |a| a.lerp_(&end.a, w))
    }
    /// `self + value * tensor1 * tensor2`.
    #[pyo3(signature = (tensor1, tensor2, *, value=None))]
    fn addcmul(
        &self,
        py: Python<'_>,
        tensor1: PyRef<'_, PyArr>,
        tensor2: PyRef<'_, PyArr>,
        value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let v = value.map(|v| number("addcmul", "value", v)).transpose()?.unwrap_or(Scalar::Int(1));
        ret(py, &self.a, self.a.addcmul(&tensor1.a, &tensor2.a, v))
    }
    /// `addcmul` in place.
    #[pyo3(signature = (tensor1, tensor2, *, value=None))]
    fn addcmul_<'py>(
        slf: &Bound<'py, Self>,
        tensor1: PyRef<'py, PyArr>,
        tensor2: PyRef<'py, PyArr>,
        value: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        let v = value.map(|v| number("addcmul_", "value", v)).transpose()?.unwrap_or(Scalar::Int(1));
        in_place(slf, |a| a.addcmul_(&tensor1.a, &tensor2.a, v))
    }
    /// `self + value * tensor1 / tensor2` (floating dtypes).
    #[pyo3(signature = (tensor1, tensor2, *, value=None))]
    fn addcdiv(
        &self,
        py: Python<'_>,
        tensor1: PyRef<'_, PyArr>,
        tensor2: PyRef<'_, PyArr>,
        value: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let v = value.map(|v| number("addcdiv", "value", v)).transpose()?.unwrap_or(Scalar::Int(1));
        ret(py, &self.a, self.a.addcdiv(&tensor1.a, &tensor2.a, v))
    }
    /// `addcdiv` in place.
    #[pyo3(signature = (tensor1, tensor2, *, value=None))]
    fn addcdiv_<'py>(
        slf: &Bound<'py, Self>,
        tensor1: PyRef<'py, PyArr>,
        tensor2: PyRef<'py, PyArr>,
        value: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        let v = value.map(|v| number("addcdiv_", "value", v)).transpose()?.unwrap_or(Scalar::Int(1));
        in_place(slf, |a| a.addcdiv_(&tensor1.a, &tensor2.a, v))
    }

    /// The lower triangle of each matrix (elements above diagonal `diagonal` zeroed).
    #[pyo3(signature = (diagonal=0))]
    fn tril(&self, py: Python<'_>, diagonal: i64) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.tril(diagonal))
    }
    /// `tril` in place.
    #[pyo3(signature = (diagonal=0))]
    fn tril_<'py>(slf: &Bound<'py, Self>, diagonal: i64) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.tril_(diagonal))
    }
    /// The upper triangle of each matrix (elements below diagonal `diagonal` zeroed).
    #[pyo3(signature = (diagonal=0))]
    fn triu(&self, py: Python<'_>, diagonal: i64) -> PyResult<PyArr> {
        ret(py, &self.a, self.a.triu(diagonal))
    }
    /// `triu` in place.
    #[pyo3(signature = (diagonal=0))]
    fn triu_<'py>(slf: &Bound<'py, Self>, diagonal: i64) -> PyResult<Bound<'py, Self>> {
        in_place(slf, |a| a.triu_(diagonal))
    }
}

// ---- Module functions (`eagervm.<fn>`; `nn.functional`'s through `python/eagervm/nn`).

/// `torch.neg(input)`.
#[pyfunction]
fn neg(py: Python<'_>, input: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    ret(py, &input.a, input.a.neg())
}

/// `torch.isnan(input)`.
#[pyfunction]
fn isnan(py: Python<'_>, input: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    ret(py, &input.a, input.a.isnan())
}

/// `torch.isinf(input)`.
#[pyfunction]
fn isinf(py: Python<'_>, input: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    ret(py, &input.a, input.a.isinf())
}

/// `torch.isfinite(input)`.
#[pyfunction]
fn isfinite(py: Python<'_>, input: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    ret(py, &input.a, input.a.isfinite())
}

/// `torch.round(input, *, decimals=0)`.
#[pyfunction]
#[pyo3(signature = (input, *, decimals=0))]
fn round(py: Python<'_>, input: PyRef<'_, PyArr>, decimals: i64) -> PyResult<PyArr> {
    ret(py, &input.a, input.a.round_decimals(decimals))
}

/// `torch.pow(input, exponent)`: either may be a number (not both).
#[pyfunction]
fn pow(py: Python<'_>, input: &Bound<'_, PyAny>, exponent: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    if let Ok(x) = input.downcast::<PyArr>() {
        let x = &x.get().a;
        return ret(py, x, x.pow(rhs("pow", "exponent", exponent)?));
    }
    let base = number("pow", "input", input)?;
    let e = exponent.downcast::<PyArr>().map_err(|_| {
        PyTypeError::new_err(format!(
            "pow(): argument 'exponent' must be an eagervm array, not {}",
            type_name(exponent)
        ))
    })?;
    let e = &e.get().a;
    ret(py, e, e.rpow(base))
}

macro_rules! binary_fns {
    ($($name:ident: |$x:ident, $o:ident| $call:expr;)*) => {$(
        #[doc = concat!("PyTorch's `torch.", stringify!($name), "(input, other)`.")]
        #[pyfunction]
        fn $name(py: Python<'_>, input: PyRef<'_, PyArr>, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
            let $x = &input.a;
            let $o = other;
            ret(py, $x, $call)
        }
    )*};
}

fn array_arg<'a>(op: &str, v: &'a Bound<'_, PyAny>) -> PyResult<&'a Array> {
    v.downcast::<PyArr>().map(|a| &a.get().a).map_err(|_| {
        PyTypeError::new_err(format!(
            "{op}(): argument 'other' must be an eagervm array, not {}",
            type_name(v)
        ))
    })
}

binary_fns! {
    maximum: |x, o| x.maximum(array_arg("maximum", o)?);
    minimum: |x, o| x.minimum(array_arg("minimum", o)?);
    atan2: |x, o| x.atan2(array_arg("atan2", o)?);
    logical_and: |x, o| x.logical_and(array_arg("logical_and", o)?);
    logical_or: |x, o| x.logical_or(array_arg("logical_or", o)?);
    logical_xor: |x, o| x.logical_xor(array_arg("logical_xor", o)?);
    remainder: |x, o| x.remainder(rhs("remainder", "other", o)?);
    fmod: |x, o| x.fmod(rhs("fmod", "other", o)?);
    floor_divide: |x, o| x.floor_divide(rhs("floor_divide", "other", o)?);
}

/// `torch.where(condition, input, other)`: `input` where `condition` is true, `other`
/// elsewhere; either may be a number.
#[pyfunction]
#[pyo3(name = "where")]
fn where_fn(
    py: Python<'_>,
    condition: PyRef<'_, PyArr>,
    input: &Bound<'_, PyAny>,
    other: &Bound<'_, PyAny>,
) -> PyResult<PyArr> {
    let (x, y) = (rhs("where", "input", input)?, rhs("where", "other", other)?);
    ret(py, &condition.a, where_of(&condition.a, x, y))
}

/// `torch.clamp(input, min=None, max=None)`.
#[pyfunction]
#[pyo3(signature = (input, min=None, max=None))]
fn clamp(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    min: Option<&Bound<'_, PyAny>>,
    max: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.clamp(py, min, max)
}

/// `torch.clip(input, min=None, max=None)`, an alias of `clamp`.
#[pyfunction]
#[pyo3(signature = (input, min=None, max=None))]
fn clip(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    min: Option<&Bound<'_, PyAny>>,
    max: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.clamp(py, min, max)
}

/// `torch.lerp(input, end, weight)`.
#[pyfunction]
fn lerp(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    end: PyRef<'_, PyArr>,
    weight: &Bound<'_, PyAny>,
) -> PyResult<PyArr> {
    input.lerp(py, end, weight)
}

/// `torch.addcmul(input, tensor1, tensor2, *, value=1)`.
#[pyfunction]
#[pyo3(signature = (input, tensor1, tensor2, *, value=None))]
fn addcmul(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    tensor1: PyRef<'_, PyArr>,
    tensor2: PyRef<'_, PyArr>,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.addcmul(py, tensor1, tensor2, value)
}

/// `torch.addcdiv(input, tensor1, tensor2, *, value=1)`.
#[pyfunction]
#[pyo3(signature = (input, tensor1, tensor2, *, value=None))]
fn addcdiv(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    tensor1: PyRef<'_, PyArr>,
    tensor2: PyRef<'_, PyArr>,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.addcdiv(py, tensor1, tensor2, value)
}

/// `torch.tril(input, diagonal=0)`.
#[pyfunction]
#[pyo3(signature = (input, diagonal=0))]
fn tril(py: Python<'_>, input: PyRef<'_, PyArr>, diagonal: i64) -> PyResult<PyArr> {
    input.tril(py, diagonal)
}

/// `torch.triu(input, diagonal=0)`.
#[pyfunction]
#[pyo3(signature = (input, diagonal=0))]
fn triu(py: Python<'_>, input: PyRef<'_, PyArr>, diagonal: i64) -> PyResult<PyArr> {
    input.triu(py, diagonal)
}

/// `nn.functional.gelu(input, approximate='none')`.
#[pyfunction]
#[pyo3(signature = (input, approximate="none"))]
fn gelu(py: Python<'_>, input: PyRef<'_, PyArr>, approximate: &str) -> PyResult<PyArr> {
    input.gelu(py, approximate)
}

/// `nn.functional.one_hot(tensor, num_classes=-1)`: a negative `num_classes` reads the
/// array (waits for it) to take one more than its largest index.
#[pyfunction]
#[pyo3(signature = (tensor, num_classes=-1))]
fn one_hot(py: Python<'_>, tensor: PyRef<'_, PyArr>, num_classes: i64) -> PyResult<PyArr> {
    let a = tensor.a.clone();
    let r =
        if num_classes < 0 { py.allow_threads(|| a.one_hot(num_classes)) } else { a.one_hot(num_classes) };
    ret(py, &tensor.a, r)
}

/// The context of `vm`, or of the default VM.
fn vm_context(py: Python<'_>, vm: Option<PyRef<'_, PyVm>>) -> PyResult<crate::eager::Context> {
    match vm {
        Some(vm) => Ok(vm.cx.clone()),
        None => {
            let vm = py.import("eagervm")?.getattr("default_vm")?.call0()?;
            Ok(vm.downcast::<PyVm>()?.get().cx.clone())
        }
    }
}

/// `torch.linspace(start, end, steps, *, dtype=None, device=None)` on `vm` (default: the
/// default VM); `float32` unless `dtype` is given.
#[pyfunction]
#[pyo3(signature = (start, end, steps, *, dtype=None, device=None, vm=None))]
fn linspace(
    py: Python<'_>,
    start: f64,
    end: f64,
    steps: usize,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    vm: Option<PyRef<'_, PyVm>>,
) -> PyResult<PyArr> {
    let cx = vm_context(py, vm)?;
    let dtype = opt_dtype(dtype)?.unwrap_or(DEFAULT_FLOAT);
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    Ok(PyArr { a: issued(py, &cx, cx.linspace(start, end, steps, dtype, device))? })
}

/// `torch.eye(n, m=None, *, dtype=None, device=None)` on `vm` (default: the default VM).
#[pyfunction]
#[pyo3(signature = (n, m=None, *, dtype=None, device=None, vm=None))]
fn eye(
    py: Python<'_>,
    n: usize,
    m: Option<usize>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
    vm: Option<PyRef<'_, PyVm>>,
) -> PyResult<PyArr> {
    let cx = vm_context(py, vm)?;
    let dtype = opt_dtype(dtype)?.unwrap_or(DEFAULT_FLOAT);
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    Ok(PyArr { a: issued(py, &cx, cx.eye(n, m.unwrap_or(n), dtype, device))? })
}

/// Add the module functions of this file to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    unary_fns::register(m)?;
    for f in [
        wrap_pyfunction!(neg, m)?,
        wrap_pyfunction!(isnan, m)?,
        wrap_pyfunction!(isinf, m)?,
        wrap_pyfunction!(isfinite, m)?,
        wrap_pyfunction!(round, m)?,
        wrap_pyfunction!(pow, m)?,
        wrap_pyfunction!(maximum, m)?,
        wrap_pyfunction!(minimum, m)?,
        wrap_pyfunction!(atan2, m)?,
        wrap_pyfunction!(logical_and, m)?,
        wrap_pyfunction!(logical_or, m)?,
        wrap_pyfunction!(logical_xor, m)?,
        wrap_pyfunction!(remainder, m)?,
        wrap_pyfunction!(fmod, m)?,
        wrap_pyfunction!(floor_divide, m)?,
        wrap_pyfunction!(where_fn, m)?,
        wrap_pyfunction!(clamp, m)?,
        wrap_pyfunction!(clip, m)?,
        wrap_pyfunction!(lerp, m)?,
        wrap_pyfunction!(addcmul, m)?,
        wrap_pyfunction!(addcdiv, m)?,
        wrap_pyfunction!(tril, m)?,
        wrap_pyfunction!(triu, m)?,
        wrap_pyfunction!(gelu, m)?,
        wrap_pyfunction!(one_hot, m)?,
        wrap_pyfunction!(linspace, m)?,
        wrap_pyfunction!(eye, m)?,
    ] {
        m.add_function(f)?;
    }
    Ok(())
}
