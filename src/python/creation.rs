//! New arrays with PyTorch's signatures and dtype rules: `zeros`, `ones`, `empty`, `full`,
//! `arange`, the `*_like` forms and `from_numpy`, on a given context (a `VM`'s methods,
//! and through the default VM the module's functions: `python/eagervm/__init__.py`).
//!
//! Without `dtype`, `zeros`, `ones` and `empty` make the default float dtype (`float32`),
//! `full` takes its value's (bool, int64, or the default float), `arange` int64 for
//! integer bounds and step and the default float if any is a float, as in PyTorch; without
//! `device`, arrays are made on `cpu:0`, the `*_like` forms on their input's device.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::args::{size_obj, size_of, type_name};
use super::array::PyArr;
use super::dtype::{opt_device, opt_dtype};
use super::interop::{dtype_of, from_ndarray, ndarray, scalar_of};
use super::issue::issued;
use crate::eager::promote::scalar_dtype;
use crate::eager::{Array, Context, DEFAULT_FLOAT};
use crate::ep::DeviceId;
use crate::framework::{DType, Scalar};

/// A number argument `what` of `op` (`TypeError` for anything else).
fn number(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    scalar_of(v)?.ok_or_else(|| {
        PyTypeError::new_err(format!("{op}(): argument '{what}' must be a number, not {}", type_name(v)))
    })
}

/// `zeros` and `ones`: `size` filled with `value`.
pub(crate) fn filled(
    py: Python<'_>,
    cx: &Context,
    op: &str,
    size: &Bound<'_, PyTuple>,
    value: i64,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Array> {
    let shape = size_of(op, "size", size)?;
    let dtype = opt_dtype(dtype)?.unwrap_or(DEFAULT_FLOAT);
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    issued(py, cx, cx.full(&shape, Scalar::Int(value), dtype, device))
}

/// `empty`: `size`, unwritten.
pub(crate) fn empty(
    py: Python<'_>,
    cx: &Context,
    size: &Bound<'_, PyTuple>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Array> {
    let shape = size_of("empty", "size", size)?;
    let dtype = opt_dtype(dtype)?.unwrap_or(DEFAULT_FLOAT);
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    issued(py, cx, cx.empty(&shape, dtype, device))
}

/// `full(size, fill_value)`.
pub(crate) fn full(
    py: Python<'_>,
    cx: &Context,
    size: &Bound<'_, PyAny>,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Array> {
    let shape = size_obj("full", "size", size)?;
    let value = number("full", "fill_value", fill_value)?;
    let dtype = opt_dtype(dtype)?.unwrap_or_else(|| scalar_dtype(value));
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    issued(py, cx, cx.full(&shape, value, dtype, device))
}

/// `arange(end)`, `arange(start, end, step)`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn arange(
    py: Python<'_>,
    cx: &Context,
    start: &Bound<'_, PyAny>,
    end: Option<&Bound<'_, PyAny>>,
    step: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<Array> {
    let first = number("arange", "start", start)?;
    let (start, end) = match end.filter(|e| !e.is_none()) {
        Some(e) => (first, number("arange", "end", e)?),
        None => (Scalar::Int(0), first),
    };
    let step = match step.filter(|s| !s.is_none()) {
        Some(s) => number("arange", "step", s)?,
        None => Scalar::Int(1),
    };
    let any_float = [start, end, step].iter().any(|s| s.is_float());
    let dtype = opt_dtype(dtype)?.unwrap_or(if any_float { DEFAULT_FLOAT } else { DType::I64 });
    let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
    issued(py, cx, cx.arange(start.as_f64(), end.as_f64(), step.as_f64(), dtype, device))
}

/// `zeros_like`, `ones_like`, `empty_like` and `full_like` (`value` `None` for `empty`):
/// `input`'s shape, and its dtype and device unless given.
fn like(
    py: Python<'_>,
    input: &Array,
    value: Option<Scalar>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let cx = input.context();
    let dtype = opt_dtype(dtype)?.unwrap_or(input.dtype());
    let device = opt_device(device)?.unwrap_or(input.device());
    let r = match value {
        None => cx.empty(input.shape(), dtype, device),
        Some(v) => cx.full(input.shape(), v, dtype, device),
    };
    Ok(PyArr { a: issued(py, cx, r)? })
}

/// PyTorch's `zeros_like(input, dtype=None, device=None)`, on `input`'s VM.
#[pyfunction]
#[pyo3(signature = (input, *, dtype=None, device=None))]
pub(crate) fn zeros_like(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    like(py, &input.a, Some(Scalar::Int(0)), dtype, device)
}

/// PyTorch's `ones_like(input, dtype=None, device=None)`, on `input`'s VM.
#[pyfunction]
#[pyo3(signature = (input, *, dtype=None, device=None))]
pub(crate) fn ones_like(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    like(py, &input.a, Some(Scalar::Int(1)), dtype, device)
}

/// PyTorch's `empty_like(input, dtype=None, device=None)`, on `input`'s VM.
#[pyfunction]
#[pyo3(signature = (input, *, dtype=None, device=None))]
pub(crate) fn empty_like(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    like(py, &input.a, None, dtype, device)
}

/// PyTorch's `full_like(input, fill_value, dtype=None, device=None)`, on `input`'s VM
/// (the dtype is `input`'s unless given, as in PyTorch).
#[pyfunction]
#[pyo3(signature = (input, fill_value, *, dtype=None, device=None))]
pub(crate) fn full_like(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    fill_value: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
    device: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let v = number("full_like", "fill_value", fill_value)?;
    like(py, &input.a, Some(v), dtype, device)
}

/// `from_numpy(ndarray)`: an array over the NumPy array's memory where the VM can use it
/// as it is (a DLPack import: C-contiguous, 8-byte aligned, writable), else over a copy;
/// NumPy cannot export `bfloat16` through DLPack, so that is always a copy.
pub(crate) fn from_numpy(py: Python<'_>, cx: &Context, data: &Bound<'_, PyAny>) -> PyResult<Array> {
    let arr = ndarray(data)?;
    if dtype_of(arr)? == DType::BF16 {
        return from_ndarray(py, cx, data, DeviceId::CPU);
    }
    super::dlpack::import(py, cx, data, None, None)
}
