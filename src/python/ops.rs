//! Arithmetic and comparisons of `eagervm.Array`: the operators (`+ - * / @`, the
//! comparisons, their reflected and in-place forms) and the methods of the same names, each
//! one call of [`eager::Array`](crate::eager::Array)'s (PyTorch's promotion, broadcasting
//! and in-place rules are there), and index assignment (`x[key] = value`).
//!
//! The other operand is an array or a number: a Python `bool`, `int` or `float`, or a NumPy
//! scalar. An operator given anything else returns `NotImplemented`, so Python raises its
//! `TypeError` (or, for `==` and `!=`, compares identities, as for any object); a method
//! raises the `TypeError` itself.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::types::PyFloat;

use super::args::{indices, type_name};
use super::array::PyArr;
use super::interop::scalar_of;
use super::issue::issued;
use crate::eager::{Array, Bin, Rhs};
use crate::framework::Scalar;
use crate::Result;

/// The elementwise op of a Python comparison.
pub(crate) fn compare(op: CompareOp) -> Bin {
    match op {
        CompareOp::Eq => Bin::Eq,
        CompareOp::Ne => Bin::Ne,
        CompareOp::Lt => Bin::Lt,
        CompareOp::Le => Bin::Le,
        CompareOp::Gt => Bin::Gt,
        CompareOp::Ge => Bin::Ge,
    }
}

/// `a b= rhs`, written into `a`'s storage.
fn apply_in_place(a: &Array, b: Bin, rhs: Rhs<'_>) -> Result<()> {
    // A handle of the same array: the in-place forms write its storage, and take `&mut`
    // only to return it.
    a.clone().binary_(b, rhs).map(|_| ())
}

/// `v` as the other operand of an elementwise op, if it is one (module docs).
pub(crate) fn operand<'a>(v: &'a Bound<'_, PyAny>) -> PyResult<Option<Rhs<'a>>> {
    // The common operands first, each by an exact type test (a compare of one word): a
    // `float` (`x * 0.5`), then an array of this very class.
    if v.is_exact_instance_of::<PyFloat>() {
        return Ok(Some(Rhs::Scalar(Scalar::Float(v.downcast_exact::<PyFloat>()?.value()))));
    }
    if let Ok(a) = v.downcast::<PyArr>() {
        return Ok(Some(Rhs::Array(&a.get().a)));
    }
    Ok(scalar_of(v)?.map(Rhs::Scalar))
}

/// `v` as an operand, or the `TypeError` of method `op`.
fn operand_of<'a>(op: &str, v: &'a Bound<'_, PyAny>) -> PyResult<Rhs<'a>> {
    operand(v)?.ok_or_else(|| {
        PyTypeError::new_err(format!(
            "{op}(): argument 'other' must be an eagervm array or a number, not {}",
            type_name(v)
        ))
    })
}

/// A new array as a Python object.
fn object(py: Python<'_>, a: Array) -> PyResult<PyObject> {
    Ok(Py::new(py, PyArr { a })?.into_any())
}

/// The operator `me b other`, or `NotImplemented`.
pub(crate) fn operator(py: Python<'_>, me: &PyArr, b: Bin, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    match operand(other)? {
        Some(rhs) => object(py, issued(py, me.a.context(), me.a.binary(b, rhs))?),
        None => Ok(py.NotImplemented()),
    }
}

/// The reflected operator `other b me` (`other` is not an array), or `NotImplemented`.
pub(crate) fn reflected(py: Python<'_>, me: &PyArr, b: Bin, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
    match scalar_of(other)? {
        Some(s) if !other.is_instance_of::<PyArr>() => {
            object(py, issued(py, me.a.context(), me.a.binary_reflected(b, s))?)
        }
        _ => Ok(py.NotImplemented()),
    }
}

/// The method `me.b(other)`.
pub(crate) fn method(py: Python<'_>, me: &PyArr, b: Bin, other: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    let rhs = operand_of(b.name(), other)?;
    Ok(PyArr { a: issued(py, me.a.context(), me.a.binary(b, rhs))? })
}

/// The in-place operator or method `me.b_(other)`.
pub(crate) fn in_place(py: Python<'_>, me: &PyArr, b: Bin, other: &Bound<'_, PyAny>) -> PyResult<()> {
    let rhs = operand_of(b.name_in_place(), other)?;
    issued(py, me.a.context(), apply_in_place(&me.a, b, rhs))
}

/// `me[key] = value`: the view `me[key]` overwritten with `value` (an array broadcast to
/// it and converted to its dtype, a number, or anything `eagervm.tensor` takes), in `me`'s
/// storage.
pub(crate) fn set_item(
    py: Python<'_>,
    me: &PyArr,
    key: &Bound<'_, PyAny>,
    value: &Bound<'_, PyAny>,
) -> PyResult<()> {
    let cx = me.a.context();
    if let Some(items) = super::select::advanced_key(py, &me.a, key)? {
        let made;
        let rhs = match operand(value)? {
            Some(rhs) => rhs,
            None => {
                made = super::interop::tensor(py, cx, value, None, Some(me.a.device()))?;
                Rhs::Array(&made)
            }
        };
        return issued(py, cx, me.a.index_put_with_(&items, rhs, false));
    }
    let idx = indices(key, me.a.shape())?;
    if let Ok(v) = value.downcast::<PyArr>() {
        // `x[key] op= y` is `x[key] = x[key].__iop__(y)` to Python: the value is then the
        // view itself, already written in place, and a copy onto itself would be a call
        // that does nothing.
        let view = issued(py, cx, me.a.index(&idx))?;
        let v = &v.get().a;
        if v.shares_storage(&view)
            && v.shape() == view.shape()
            && v.strides() == view.strides()
            && v.storage_offset() == view.storage_offset()
            && v.dtype() == view.dtype()
        {
            return Ok(());
        }
    }
    let made;
    let rhs = match operand(value)? {
        Some(rhs) => rhs,
        None => {
            made = super::interop::tensor(py, cx, value, None, Some(me.a.device()))?;
            Rhs::Array(&made)
        }
    };
    issued(py, cx, me.a.index_put_(&idx, rhs))
}
