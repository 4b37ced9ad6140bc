//! The view methods of `eagervm.Array` and `x[key]`, with PyTorch's arguments: each is one
//! of [`eager::Array`](crate::eager::Array)'s views (no copy, no kernel) or, for
//! `reshape`, `flatten` and `contiguous`, a copy where no view can be had. Dimensions and
//! indices are checked here first, so that one out of range raises PyTorch's `IndexError`
//! (`eagervm.OutOfRangeError`); the eager layer checks the rest (a `ValueError`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyTuple;
use pyo3::BoundObject;

use super::args::{dim, dim_exact, index_in, indices, is_int, isize_of, isizes_of, size_obj};
use super::array::PyArr;
use super::dtype::PyDType;
use super::issue::issued;
use crate::eager::Array;
use crate::Result;

/// `r` as a new Python array, its error raised.
fn done(py: Python<'_>, me: &PyArr, r: Result<Array>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, me.a.context(), r)? })
}

/// Several arrays as a tuple (what PyTorch's `split`, `chunk` and `unbind` return).
fn tuple<'py>(py: Python<'py>, me: &PyArr, r: Result<Vec<Array>>) -> PyResult<Bound<'py, PyTuple>> {
    let parts = issued(py, me.a.context(), r)?;
    PyTuple::new(py, parts.into_iter().map(|a| PyArr { a }))
}

/// A shape for `view` and `reshape` (one size may be `-1`).
fn shape_arg(op: &str, shape: &Bound<'_, PyTuple>) -> PyResult<Vec<isize>> {
    if shape.len() == 1 && shape.get_item(0)?.is_instance_of::<PyDType>() {
        return Err(PyTypeError::new_err(format!(
            "{op}(dtype) (a reinterpretation of the bytes) is not supported; {op} takes a shape"
        )));
    }
    isizes_of(op, "shape", shape)
}

pub(crate) fn view(py: Python<'_>, me: &PyArr, shape: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
    let shape = shape_arg("view", shape)?;
    done(py, me, me.a.view(&shape))
}

pub(crate) fn reshape(py: Python<'_>, me: &PyArr, shape: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
    let shape = shape_arg("reshape", shape)?;
    done(py, me, me.a.reshape(&shape))
}

pub(crate) fn transpose(py: Python<'_>, me: &PyArr, d0: isize, d1: isize) -> PyResult<PyArr> {
    let n = me.a.ndim();
    dim("transpose", d0, n)?;
    dim("transpose", d1, n)?;
    done(py, me, me.a.transpose(d0, d1))
}

pub(crate) fn permute(py: Python<'_>, me: &PyArr, dims: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
    let dims = isizes_of("permute", "dims", dims)?;
    for &d in &dims {
        dim("permute", d, me.a.ndim())?;
    }
    done(py, me, me.a.permute(&dims))
}

pub(crate) fn expand(py: Python<'_>, me: &PyArr, sizes: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
    let sizes = isizes_of("expand", "size", sizes)?;
    done(py, me, me.a.expand(&sizes))
}

pub(crate) fn broadcast_to(py: Python<'_>, me: &PyArr, shape: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    let shape = size_obj("broadcast_to", "size", shape)?;
    done(py, me, me.a.broadcast_to(&shape))
}

/// `squeeze(dim=None)`: every size-1 dimension, or those of `dim` (an int or a sequence).
pub(crate) fn squeeze(py: Python<'_>, me: &PyArr, d: Option<&Bound<'_, PyAny>>) -> PyResult<PyArr> {
    let Some(d) = d.filter(|d| !d.is_none()) else {
        return done(py, me, me.a.squeeze());
    };
    let dims = if is_int(d) {
        vec![isize_of("squeeze", "dim", d)?]
    } else {
        isizes_of("squeeze", "dim", &PyTuple::new(py, [d])?)?
    };
    for &x in &dims {
        dim("squeeze", x, me.a.ndim())?;
    }
    done(py, me, me.a.squeeze_dims(&dims))
}

pub(crate) fn unsqueeze(py: Python<'_>, me: &PyArr, d: isize) -> PyResult<PyArr> {
    dim("unsqueeze", d, me.a.ndim() + 1)?;
    done(py, me, me.a.unsqueeze(d))
}

pub(crate) fn flatten(py: Python<'_>, me: &PyArr, start: isize, end: isize) -> PyResult<PyArr> {
    dim("flatten", start, me.a.ndim())?;
    dim("flatten", end, me.a.ndim())?;
    done(py, me, me.a.flatten(start, end))
}

pub(crate) fn unflatten(py: Python<'_>, me: &PyArr, d: isize, sizes: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    dim_exact("unflatten", d, me.a.ndim())?;
    let sizes = isizes_of("unflatten", "sizes", &PyTuple::new(py, [sizes])?)?;
    done(py, me, me.a.unflatten(d, &sizes))
}

pub(crate) fn narrow(py: Python<'_>, me: &PyArr, d: isize, start: isize, length: i64) -> PyResult<PyArr> {
    dim_exact("narrow", d, me.a.ndim())?;
    let length = usize::try_from(length)
        .map_err(|_| PyValueError::new_err(format!("narrow(): length must be non-negative, not {length}")))?;
    done(py, me, me.a.narrow(d, start, length))
}

pub(crate) fn select(py: Python<'_>, me: &PyArr, d: isize, index: isize) -> PyResult<PyArr> {
    let at = dim_exact("select", d, me.a.ndim())?;
    index_in("select", index, at, me.a.shape())?;
    done(py, me, me.a.select(d, index))
}

/// `split(split_size_or_sections, dim=0)`: pieces of one size (an int), or of the sizes
/// given (a sequence).
pub(crate) fn split<'py>(
    py: Python<'py>,
    me: &PyArr,
    sizes: &Bound<'py, PyAny>,
    d: isize,
) -> PyResult<Bound<'py, PyTuple>> {
    dim_exact("split", d, me.a.ndim())?;
    if is_int(sizes) {
        let n = isize_of("split", "split_size", sizes)?;
        let n = usize::try_from(n).map_err(|_| {
            PyValueError::new_err(format!("split(): split_size must be non-negative, not {n}"))
        })?;
        return tuple(py, me, me.a.split(n, d));
    }
    let sizes = size_obj("split", "split_size_or_sections", sizes)?;
    tuple(py, me, me.a.split_with_sizes(&sizes, d))
}

pub(crate) fn chunk<'py>(
    py: Python<'py>,
    me: &PyArr,
    chunks: i64,
    d: isize,
) -> PyResult<Bound<'py, PyTuple>> {
    dim_exact("chunk", d, me.a.ndim())?;
    let chunks = usize::try_from(chunks)
        .map_err(|_| PyValueError::new_err(format!("chunk(): chunks must be at least 1, not {chunks}")))?;
    tuple(py, me, me.a.chunk(chunks, d))
}

pub(crate) fn unbind<'py>(py: Python<'py>, me: &PyArr, d: isize) -> PyResult<Bound<'py, PyTuple>> {
    dim_exact("unbind", d, me.a.ndim())?;
    tuple(py, me, me.a.unbind(d))
}

pub(crate) fn diagonal(py: Python<'_>, me: &PyArr, offset: isize, d1: isize, d2: isize) -> PyResult<PyArr> {
    dim_exact("diagonal", d1, me.a.ndim())?;
    dim_exact("diagonal", d2, me.a.ndim())?;
    done(py, me, me.a.diagonal(offset, d1, d2))
}

pub(crate) fn as_strided(
    py: Python<'_>,
    me: &PyArr,
    size: &Bound<'_, PyAny>,
    stride: &Bound<'_, PyAny>,
    offset: Option<i64>,
) -> PyResult<PyArr> {
    let size = size_obj("as_strided", "size", size)?;
    let stride = isizes_of("as_strided", "stride", &PyTuple::new(py, [stride])?)?;
    let offset = match offset {
        None => me.a.storage_offset(),
        Some(o) => usize::try_from(o).map_err(|_| {
            PyValueError::new_err(format!("as_strided(): storage_offset must be non-negative, not {o}"))
        })?,
    };
    done(py, me, me.a.as_strided(&size, &stride, offset))
}

/// `x[key]`: a view (`eager::Array::index`), or, for a key with index arrays, a new array
/// (`eager::Array::index_with`).
pub(crate) fn get_item(py: Python<'_>, me: &PyArr, key: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    if let Some(items) = super::select::advanced_key(py, &me.a, key)? {
        return done(py, me, me.a.index_with(&items));
    }
    let idx = indices(key, me.a.shape())?;
    done(py, me, me.a.index(&idx))
}

/// PyTorch's `size(dim)` and `stride(dim)`: one of `values`, by dimension (negative from
/// the end), or all of them as a tuple.
pub(crate) fn per_dim<'py, T: Copy + IntoPyObject<'py>>(
    py: Python<'py>,
    op: &str,
    values: &[T],
    d: Option<isize>,
) -> PyResult<Bound<'py, PyAny>> {
    match d {
        None => Ok(PyTuple::new(py, values.iter().copied())?.into_any()),
        Some(d) => {
            let i = dim_exact(op, d, values.len())?;
            Ok(values[i].into_pyobject(py).map_err(Into::into)?.into_any().into_bound())
        }
    }
}

/// The elements of `a` as nested lists (PyTorch's `tolist()`; a number for a 0-d array).
pub(crate) fn tolist<'py>(py: Python<'py>, a: &Array) -> PyResult<Bound<'py, PyAny>> {
    let a = if a.dtype() == crate::framework::DType::BF16 {
        // Python floats hold every bfloat16 exactly; NumPy needs ml_dtypes for the type.
        issued(py, a.context(), a.to_dtype(crate::framework::DType::F32))?
    } else {
        a.clone()
    };
    super::interop::to_ndarray(py, &a)?.call_method0("tolist")
}
