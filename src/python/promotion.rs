//! PyTorch's type promotion from Python: `eagervm.result_type`, `promote_types`, `can_cast`
//! and `get_default_dtype`, the rules the eager layer applies to every call
//! (`eager::promote`).

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;

use super::args::type_name;
use super::array::PyArr;
use super::dtype::{dtype_arg, dtype_object, PyDType};
use super::interop::scalar_of;
use crate::eager::promote::{self, Operand};
use crate::eager::DEFAULT_FLOAT;

/// An operand of `result_type`: an array (its dtype and rank) or a number.
fn operand(v: &Bound<'_, PyAny>) -> PyResult<Operand> {
    if let Ok(a) = v.downcast::<PyArr>() {
        let a = &a.get().a;
        return Ok(Operand::Tensor { dtype: a.dtype(), rank: a.ndim() });
    }
    match scalar_of(v)? {
        Some(s) => Ok(Operand::Scalar(s)),
        None => Err(PyTypeError::new_err(format!(
            "result_type() takes eagervm arrays and numbers, not {}",
            type_name(v)
        ))),
    }
}

/// The dtype of an elementwise op's result on `tensor` and `other` (PyTorch's
/// `result_type`: a 0-d array or a number decides it only when of a higher category).
#[pyfunction]
pub(crate) fn result_type<'py>(
    py: Python<'py>,
    tensor: &Bound<'py, PyAny>,
    other: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDType>> {
    let d = promote::result_type(&[operand(tensor)?, operand(other)?]).expect("two operands");
    dtype_object(py, d)
}

/// The smallest dtype both convert to without leaving their category.
#[pyfunction]
pub(crate) fn promote_types<'py>(
    py: Python<'py>,
    type1: &Bound<'py, PyAny>,
    type2: &Bound<'py, PyAny>,
) -> PyResult<Bound<'py, PyDType>> {
    dtype_object(py, crate::framework::promote_types(dtype_arg(type1)?, dtype_arg(type2)?))
}

/// Whether an in-place op may write a result of `from_` into an array of `to` (not a
/// float into an integer array, nor a number into a bool array).
#[pyfunction]
#[pyo3(name = "can_cast")]
pub(crate) fn can_cast(from_: &Bound<'_, PyAny>, to: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(promote::can_cast(dtype_arg(from_)?, dtype_arg(to)?))
}

/// The dtype of Python floats and of `zeros(...)` without a dtype: `eagervm.float32`.
#[pyfunction]
pub(crate) fn get_default_dtype(py: Python<'_>) -> PyResult<Bound<'_, PyDType>> {
    dtype_object(py, DEFAULT_FLOAT)
}
