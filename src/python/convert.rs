//! Arrays converted: PyTorch's `to(...)` (a device, a dtype, both, another array's), the
//! shorthands (`float()`, `long()`, `cpu()`, ...), and the values of one-element arrays and
//! numbers that methods take (`fill_`, `masked_fill`, `bool(x)`, `float(x)`).

use pyo3::exceptions::{PyRuntimeError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::array::PyArr;
use super::dtype::{device_arg, dtype_arg, opt_device, opt_dtype, PyDevice};
use super::interop::item;
use super::issue::issued;
use crate::eager::Array;
use crate::ep::DeviceId;
use crate::framework::{DType, Scalar};

/// `to(*args, device=None, dtype=None, copy=False)`: positional arguments are an array (its
/// device and dtype), a device (a string, an `eagervm.device`, a CUDA index) or a dtype.
pub(crate) fn to(
    slf: &Bound<'_, PyArr>,
    args: &Bound<'_, PyTuple>,
    device: Option<&Bound<'_, PyAny>>,
    dtype: Option<&Bound<'_, PyAny>>,
    copy: bool,
) -> PyResult<Py<PyArr>> {
    let mut dev = opt_device(device)?;
    let mut dt = opt_dtype(dtype)?;
    for arg in args.iter() {
        if let Ok(o) = arg.downcast::<PyArr>() {
            dev = Some(o.get().a.device());
            dt = Some(o.get().a.dtype());
        } else if arg.is_instance_of::<PyString>()
            || arg.is_instance_of::<PyDevice>()
            || super::args::is_int(&arg)
        {
            dev = Some(device_arg(&arg)?);
        } else if !arg.is_none() {
            dt = Some(dtype_arg(&arg)?);
        }
    }
    moved(slf, dev, dt, copy)
}

/// `slf` converted to `dtype` (itself if it has that dtype already, as in PyTorch).
pub(crate) fn cast(slf: &Bound<'_, PyArr>, dtype: DType) -> PyResult<Py<PyArr>> {
    let me = slf.get();
    if me.a.dtype() == dtype {
        return Ok(slf.clone().unbind());
    }
    let a = issued(slf.py(), me.a.context(), me.a.to_dtype(dtype))?;
    Py::new(slf.py(), PyArr { a })
}

/// `slf` on `device` and of `dtype` (itself if nothing changes and `copy` is false).
pub(crate) fn moved(
    slf: &Bound<'_, PyArr>,
    device: Option<DeviceId>,
    dtype: Option<DType>,
    copy: bool,
) -> PyResult<Py<PyArr>> {
    let (py, me) = (slf.py(), slf.get());
    let cx = me.a.context();
    let mut a = me.a.clone();
    let mut changed = false;
    if let Some(d) = dtype.filter(|&d| d != a.dtype()) {
        a = issued(py, cx, a.to_dtype(d))?;
        changed = true;
    }
    if let Some(d) = device.filter(|&d| d != a.device()) {
        a = issued(py, cx, a.to(d))?;
        changed = true;
    }
    if !changed {
        if !copy {
            return Ok(slf.clone().unbind());
        }
        a = issued(py, cx, a.copy())?;
    }
    Py::new(py, PyArr { a })
}

/// The one element, for `__bool__`, `__int__` and `__float__` (PyTorch's rule: an
/// array of one element only).
pub(crate) fn only_value(py: Python<'_>, a: &Array, what: &str) -> PyResult<PyObject> {
    if a.numel() != 1 {
        return Err(PyRuntimeError::new_err(format!(
            "{what} of an array of {} elements is ambiguous (it has a value only with one element)",
            a.numel()
        )));
    }
    item(py, a)
}

/// A number argument of `op`.
pub(crate) fn number(op: &str, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    super::interop::scalar_of(v)?.ok_or_else(|| {
        PyTypeError::new_err(format!("{op}(): value must be a number, not {}", super::args::type_name(v)))
    })
}

/// The value of `masked_fill`: a number, or a 0-d array (read: PyTorch takes one too).
pub(crate) fn fill_value(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    if let Ok(a) = v.downcast::<PyArr>() {
        if a.get().a.ndim() == 0 {
            let x = item(py, &a.get().a)?;
            return number("masked_fill", x.bind(py));
        }
    }
    number("masked_fill", v)
}
