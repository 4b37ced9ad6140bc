//! Arguments from Python: integers, sizes, dimensions and indices, checked as PyTorch
//! checks them, with the errors it raises: a `TypeError` for an argument of the wrong type,
//! a `ValueError` naming the argument for a negative size or one too large to be one, and
//! an `IndexError` (`eagervm.OutOfRangeError`) for a dimension or an index out of range.

use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyEllipsis, PyFloat, PyInt, PySlice, PyTuple};

use super::array::PyArr;
use super::errors::out_of_range;
use crate::eager::layout;
use crate::eager::TensorIndex;
use crate::Error;

/// The name of `v`'s type, for messages.
pub(crate) fn type_name(v: &Bound<'_, PyAny>) -> String {
    v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
}

/// Whether `v` is an integer to Python (an `int`, or an object with `__index__` such as
/// NumPy's integers), and not an eagervm array.
pub(crate) fn is_int(v: &Bound<'_, PyAny>) -> bool {
    v.is_instance_of::<PyInt>()
        || (!v.is_instance_of::<PyFloat>()
            && !v.is_instance_of::<PyArr>()
            && v.hasattr("__index__").unwrap_or(false))
}

/// Integer argument `what` of `op`: `TypeError` for a non-integer, `ValueError` naming it
/// for one beyond 64 bits.
pub(crate) fn int_of(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<i64> {
    if !is_int(v) {
        return Err(PyTypeError::new_err(format!(
            "{op}(): argument '{what}' must be an int, not {}",
            type_name(v)
        )));
    }
    let i = if v.is_instance_of::<PyInt>() { v.clone() } else { v.call_method0("__index__")? };
    i.extract::<i64>()
        .map_err(|_| PyValueError::new_err(format!("{op}(): argument '{what}' is out of range: {i}")))
}

/// `int_of` as an `isize`.
pub(crate) fn isize_of(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<isize> {
    let i = int_of(op, what, v)?;
    isize::try_from(i)
        .map_err(|_| PyValueError::new_err(format!("{op}(): argument '{what}' is out of range: {i}")))
}

/// The integers of `args`, as PyTorch takes a size or a list of dimensions: several
/// integers (`zeros(2, 3)`), or one sequence of them (`zeros((2, 3))`, `zeros([2, 3])`).
fn ints_of(op: &str, what: &str, args: &Bound<'_, PyTuple>) -> PyResult<Vec<i64>> {
    let items: Vec<Bound<'_, PyAny>> = if args.len() == 1 && !is_int(&args.get_item(0)?) {
        let seq = args.get_item(0)?;
        let it = seq.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "{op}(): argument '{what}' must be a sequence of ints, not {}",
                type_name(&seq)
            ))
        })?;
        it.collect::<PyResult<_>>()?
    } else {
        args.iter().collect()
    };
    items
        .iter()
        .map(|v| {
            if !is_int(v) {
                return Err(PyTypeError::new_err(format!(
                    "{op}(): argument '{what}' must be a sequence of ints, but found an element of type {}",
                    type_name(v)
                )));
            }
            int_of(op, what, v)
        })
        .collect()
}

/// A size (`zeros(2, 3)`, `zeros((2, 3))`): `ValueError` naming the argument for a
/// negative size or one that no tensor can have.
pub(crate) fn size_of(op: &str, what: &str, args: &Bound<'_, PyTuple>) -> PyResult<Vec<usize>> {
    let ints = ints_of(op, what, args)?;
    sizes_checked(op, what, &ints)
}

/// A size given as one object (`full(size, value)`, `broadcast_to(shape)`).
pub(crate) fn size_obj(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<usize>> {
    size_of(op, what, &PyTuple::new(v.py(), [v])?)
}

fn sizes_checked(op: &str, what: &str, ints: &[i64]) -> PyResult<Vec<usize>> {
    ints.iter()
        .map(|&d| {
            if d < 0 {
                Err(PyValueError::new_err(format!(
                    "{op}(): argument '{what}' has a negative size {d}, in {ints:?}"
                )))
            } else if d > isize::MAX as i64 {
                Err(PyValueError::new_err(format!(
                    "{op}(): argument '{what}' has a size {d} too large, in {ints:?}"
                )))
            } else {
                Ok(d as usize)
            }
        })
        .collect()
}

/// A shape that may hold one `-1` (`view`, `reshape`), or dimensions (`permute`): integers
/// as `ints_of` takes them, within `isize`.
pub(crate) fn isizes_of(op: &str, what: &str, args: &Bound<'_, PyTuple>) -> PyResult<Vec<isize>> {
    ints_of(op, what, args)?
        .into_iter()
        .map(|d| {
            isize::try_from(d)
                .map_err(|_| PyValueError::new_err(format!("{op}(): argument '{what}' is out of range: {d}")))
        })
        .collect()
}

/// Dimension `d` of a tensor of `rank` dimensions, as the eager layer checks it (a 0-d
/// tensor takes `0` and `-1`): `OutOfRangeError` if out of range. Returns it counted from
/// the front.
pub(crate) fn dim(op: &str, d: isize, rank: usize) -> PyResult<usize> {
    layout::dim(op, d, rank).map_err(out_of_range)
}

/// Dimension `d` of a tensor that must have one (`select`, `narrow`, `split`, ...).
pub(crate) fn dim_exact(op: &str, d: isize, rank: usize) -> PyResult<usize> {
    if rank == 0 {
        return Err(out_of_range(Error::InvalidOperands {
            op: op.into(),
            detail: format!("dimension {d} of a 0-d tensor: it has no dimensions"),
        }));
    }
    dim(op, d, rank)
}

/// Index `i` of a dimension of `size` elements (negative from the end): `OutOfRangeError`
/// if out of range, as PyTorch raises `IndexError`.
pub(crate) fn index_in(op: &str, i: isize, d: usize, shape: &[usize]) -> PyResult<()> {
    let size = shape[d] as isize;
    if i < -size || i >= size {
        return Err(out_of_range(Error::InvalidOperands {
            op: op.into(),
            detail: format!("index {i} is out of range for dimension {d} of size {size} (shape {shape:?})"),
        }));
    }
    Ok(())
}

/// An end of a slice, clamped into `isize` (Python's slices take any integer).
fn slice_end(v: &Bound<'_, PyAny>) -> PyResult<Option<isize>> {
    if v.is_none() {
        return Ok(None);
    }
    if !is_int(v) {
        return Err(PyTypeError::new_err(format!(
            "slice indices must be integers or None, not {}",
            type_name(v)
        )));
    }
    let i = if v.is_instance_of::<PyInt>() { v.clone() } else { v.call_method0("__index__")? };
    Ok(Some(match i.extract::<isize>() {
        Ok(i) => i,
        Err(_) if i.lt(0)? => isize::MIN / 2,
        Err(_) => isize::MAX / 2,
    }))
}

/// One index of `x[...]`.
pub(crate) fn one_index(v: &Bound<'_, PyAny>) -> PyResult<TensorIndex> {
    if v.is_none() {
        return Ok(TensorIndex::NewAxis);
    }
    if v.is_instance_of::<PyEllipsis>() {
        return Ok(TensorIndex::Ellipsis);
    }
    if let Ok(s) = v.downcast::<PySlice>() {
        let py = v.py();
        let step = slice_end(&s.getattr(intern!(py, "step"))?)?.unwrap_or(1);
        return Ok(TensorIndex::Slice {
            start: slice_end(&s.getattr(intern!(py, "start"))?)?,
            end: slice_end(&s.getattr(intern!(py, "stop"))?)?,
            step,
        });
    }
    if is_int(v) && !v.is_instance_of::<PyBool>() {
        return Ok(TensorIndex::At(isize_of("index", "index", v)?));
    }
    if v.is_instance_of::<PyBool>() {
        return Err(PyIndexError::new_err(
            "a bool index (x[True], x[False]) is not supported: use None for a new dimension",
        ));
    }
    Err(PyIndexError::new_err(format!(
        "eagervm indexes with integers, slices, None, ... and index arrays (int64 or bool eagervm arrays, lists, NumPy arrays), not {}",
        type_name(v)
    )))
}

/// The indices of `x[key]` for an array of `shape`, checked as PyTorch checks them: too
/// many indices, or an integer index out of range, is an `IndexError`
/// (`OutOfRangeError`); the eager layer checks the rest (`Array::index`).
pub(crate) fn indices(key: &Bound<'_, PyAny>, shape: &[usize]) -> PyResult<Vec<TensorIndex>> {
    let list: Vec<TensorIndex> = match key.downcast::<PyTuple>() {
        Ok(t) => t.iter().map(|v| one_index(&v)).collect::<PyResult<_>>()?,
        Err(_) => vec![one_index(key)?],
    };
    if list.iter().filter(|i| **i == TensorIndex::Ellipsis).count() > 1 {
        return Err(PyIndexError::new_err("an index can only have a single ellipsis ('...')"));
    }
    let consuming =
        list.iter().filter(|i| matches!(i, TensorIndex::At(_) | TensorIndex::Slice { .. })).count();
    if consuming > shape.len() {
        return Err(out_of_range(Error::InvalidOperands {
            op: "index".into(),
            detail: format!("too many indices for a tensor of {} dimensions: {consuming} given", shape.len()),
        }));
    }
    // The dimension of the array each index applies to.
    let mut d = 0usize;
    for i in &list {
        match *i {
            TensorIndex::At(k) => {
                index_in("index", k, d, shape)?;
                d += 1;
            }
            TensorIndex::Slice { .. } => d += 1,
            TensorIndex::NewAxis => {}
            TensorIndex::Ellipsis => d += shape.len() - consuming,
        }
    }
    Ok(list)
}
