//! Indexing and joining from Python, with PyTorch's names and arguments: the methods
//! `index_select`, `gather`, `scatter`, `scatter_add`, `index_add` (and their in-place
//! forms), `index_copy`, `index_fill`, `take`, `nonzero`, `masked_select`, `index_put`,
//! `flip`, `roll`, `repeat` and `tile` of `eagervm.Array`, the module functions of the same
//! names, `eagervm.cat` (`concat`, `concatenate`) and `stack`, advanced indexing's keys
//! (`x[idx]`, `x[mask]`), and `eagervm.nn.functional.embedding` and `pad`, each one call of
//! the eager front end (`eager::select`, `eager::advanced`, `eager::pad`).
//!
//! A dimension out of range raises `OutOfRangeError` (an `IndexError`, as PyTorch); an
//! index out of range fails the op when it runs, raising `KernelError` from the next read
//! of its result.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::args::{dim, type_name};
use super::array::PyArr;
use super::convert;
use super::issue::issued;
use pyo3::types::{PyList, PyTuple};

use crate::eager::{self, Array, Indexer, Rhs, ScatterReduce};
use crate::framework::DType;
use crate::framework::Scalar;

/// `v` as an array (argument `what` of `op`), or PyTorch's `TypeError`.
fn array_arg<'a>(op: &str, what: &str, v: &'a Bound<'_, PyAny>) -> PyResult<&'a Array> {
    match v.downcast::<PyArr>() {
        Ok(a) => Ok(&a.get().a),
        Err(_) => Err(PyTypeError::new_err(format!(
            "{op}(): argument '{what}' must be an eagervm array, not {}",
            type_name(v)
        ))),
    }
}

/// The arrays of a sequence (`cat`, `stack`).
fn arrays_of(op: &str, tensors: &Bound<'_, PyAny>) -> PyResult<Vec<Array>> {
    if tensors.is_instance_of::<PyArr>() {
        return Err(PyTypeError::new_err(format!(
            "{op}(): argument 'tensors' must be a sequence of arrays, not an array"
        )));
    }
    let it = tensors.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "{op}(): argument 'tensors' must be a sequence of arrays, not {}",
            type_name(tensors)
        ))
    })?;
    it.map(|v| {
        let v = v?;
        array_arg(op, "tensors", &v).cloned()
    })
    .collect()
}

/// `reduce=` of `scatter`.
fn reduce_arg(reduce: Option<&str>) -> PyResult<Option<ScatterReduce>> {
    match reduce {
        None => Ok(None),
        Some(r) => ScatterReduce::from_name(r).map(Some).ok_or_else(|| {
            PyValueError::new_err(format!(
                "scatter(): reduce argument must be either add or multiply, not {r:?}"
            ))
        }),
    }
}

/// The source of `scatter`: `src` (an array) or `value` (a number), whichever is given.
fn scatter_source<'a>(
    py: Python<'_>,
    src: Option<&'a Bound<'_, PyAny>>,
    value: Option<&'a Bound<'_, PyAny>>,
) -> PyResult<Rhs<'a>> {
    match (src, value) {
        (Some(s), None) | (None, Some(s)) => {
            if let Ok(a) = s.downcast::<PyArr>() {
                Ok(Rhs::Array(&a.get().a))
            } else {
                Ok(Rhs::Scalar(convert::fill_value(py, s)?))
            }
        }
        (Some(_), Some(_)) => Err(PyTypeError::new_err("scatter(): give src or value, not both")),
        (None, None) => Err(PyTypeError::new_err("scatter(): missing argument 'src' (or 'value')")),
    }
}

fn scalar_arg(py: Python<'_>, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    convert::fill_value(py, v)
}

pub(crate) fn do_index_select(py: Python<'_>, x: &Array, d: isize, index: &Array) -> PyResult<PyArr> {
    dim("index_select", d, x.ndim())?;
    Ok(PyArr { a: issued(py, x.context(), x.index_select(d, index))? })
}

pub(crate) fn do_gather(py: Python<'_>, x: &Array, d: isize, index: &Array) -> PyResult<PyArr> {
    dim("gather", d, x.ndim())?;
    Ok(PyArr { a: issued(py, x.context(), x.gather(d, index))? })
}

fn do_scatter(
    py: Python<'_>,
    x: &Array,
    d: isize,
    index: &Array,
    src: Rhs<'_>,
    reduce: Option<ScatterReduce>,
) -> PyResult<PyArr> {
    dim("scatter", d, x.ndim())?;
    Ok(PyArr { a: issued(py, x.context(), x.scatter_reduce_with(d, index, src, reduce))? })
}

fn do_index_add(
    py: Python<'_>,
    x: &Array,
    d: isize,
    index: &Array,
    source: &Array,
    alpha: Scalar,
) -> PyResult<PyArr> {
    dim("index_add", d, x.ndim())?;
    Ok(PyArr { a: issued(py, x.context(), x.index_add(d, index, source, alpha))? })
}

#[pymethods]
impl PyArr {
    /// The slices of this array at `index` (an int64 array, 0-d or 1-D) along `dim`.
    fn index_select(&self, py: Python<'_>, dim: isize, index: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        do_index_select(py, &self.a, dim, &index.a)
    }

    /// The elements picked along `dim` by `index` (of this array's rank): `take_along_axis`.
    fn gather(&self, py: Python<'_>, dim: isize, index: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        do_gather(py, &self.a, dim, &index.a)
    }

    /// A copy with `src` (an array of this dtype, or a number: `value`) written along `dim`
    /// at `index`; `reduce="add"` or `"multiply"` combines instead of overwriting.
    #[pyo3(signature = (dim, index, src=None, value=None, *, reduce=None))]
    fn scatter(
        &self,
        py: Python<'_>,
        dim: isize,
        index: PyRef<'_, PyArr>,
        src: Option<&Bound<'_, PyAny>>,
        value: Option<&Bound<'_, PyAny>>,
        reduce: Option<&str>,
    ) -> PyResult<PyArr> {
        let s = scatter_source(py, src, value)?;
        do_scatter(py, &self.a, dim, &index.a, s, reduce_arg(reduce)?)
    }

    /// `scatter` in place; returns this array.
    #[pyo3(signature = (dim, index, src=None, value=None, *, reduce=None))]
    fn scatter_<'py>(
        slf: &Bound<'py, Self>,
        dim: isize,
        index: PyRef<'py, PyArr>,
        src: Option<&Bound<'py, PyAny>>,
        value: Option<&Bound<'py, PyAny>>,
        reduce: Option<&str>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        let s = scatter_source(py, src, value)?;
        let reduce = reduce_arg(reduce)?;
        super::args::dim("scatter_", dim, me.a.ndim())?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.scatter_reduce_with_(dim, &index.a, s, reduce).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// A copy with `src`'s values added along `dim` at `index` (repeated indices add up, in
    /// a fixed order).
    fn scatter_add(
        &self,
        py: Python<'_>,
        dim: isize,
        index: PyRef<'_, PyArr>,
        src: PyRef<'_, PyArr>,
    ) -> PyResult<PyArr> {
        do_scatter(py, &self.a, dim, &index.a, Rhs::Array(&src.a), Some(ScatterReduce::Add))
    }

    /// `scatter_add` in place; returns this array.
    fn scatter_add_<'py>(
        slf: &Bound<'py, Self>,
        dim: isize,
        index: PyRef<'py, PyArr>,
        src: PyRef<'py, PyArr>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        super::args::dim("scatter_add_", dim, me.a.ndim())?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.scatter_add_(dim, &index.a, &src.a).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// A copy with `alpha * source`'s slices along `dim` added at `index` (int64, 1-D).
    #[pyo3(signature = (dim, index, source, *, alpha=None))]
    fn index_add(
        &self,
        py: Python<'_>,
        dim: isize,
        index: PyRef<'_, PyArr>,
        source: PyRef<'_, PyArr>,
        alpha: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let alpha = alpha.map(|v| scalar_arg(py, v)).transpose()?.unwrap_or(Scalar::Int(1));
        do_index_add(py, &self.a, dim, &index.a, &source.a, alpha)
    }

    /// `index_add` in place; returns this array.
    #[pyo3(signature = (dim, index, source, *, alpha=None))]
    fn index_add_<'py>(
        slf: &Bound<'py, Self>,
        dim: isize,
        index: PyRef<'py, PyArr>,
        source: PyRef<'py, PyArr>,
        alpha: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        let alpha = alpha.map(|v| scalar_arg(py, v)).transpose()?.unwrap_or(Scalar::Int(1));
        super::args::dim("index_add_", dim, me.a.ndim())?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.index_add_(dim, &index.a, &source.a, alpha).map(|_| ()))?;
        Ok(slf.clone())
    }
}

/// `torch.cat(tensors, dim=0)`: the arrays joined along `dim`, dtypes promoted.
#[pyfunction]
#[pyo3(signature = (tensors, dim=0))]
fn cat(py: Python<'_>, tensors: &Bound<'_, PyAny>, dim: isize) -> PyResult<PyArr> {
    let arrays = arrays_of("cat", tensors)?;
    let refs: Vec<&Array> = arrays.iter().collect();
    let Some(first) = refs.first() else {
        return Err(PyValueError::new_err("cat(): expected a non-empty list of arrays"));
    };
    if let Some(a) = refs.iter().find(|a| a.shape() != [0]) {
        super::args::dim("cat", dim, a.ndim())?;
    }
    Ok(PyArr { a: issued(py, first.context(), eager::cat(&refs, dim))? })
}

/// `torch.stack(tensors, dim=0)`: the arrays, of one shape, joined along a new `dim`.
#[pyfunction]
#[pyo3(signature = (tensors, dim=0))]
fn stack(py: Python<'_>, tensors: &Bound<'_, PyAny>, dim: isize) -> PyResult<PyArr> {
    let arrays = arrays_of("stack", tensors)?;
    let refs: Vec<&Array> = arrays.iter().collect();
    let Some(first) = refs.first() else {
        return Err(PyValueError::new_err("stack(): expected a non-empty list of arrays"));
    };
    super::args::dim("stack", dim, first.ndim() + 1)?;
    Ok(PyArr { a: issued(py, first.context(), eager::stack(&refs, dim))? })
}

/// `torch.index_select(input, dim, index)`.
#[pyfunction]
#[pyo3(name = "index_select")]
fn index_select_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
) -> PyResult<PyArr> {
    do_index_select(py, &input.a, dim, &index.a)
}

/// `torch.gather(input, dim, index)`.
#[pyfunction]
#[pyo3(name = "gather")]
fn gather_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
) -> PyResult<PyArr> {
    do_gather(py, &input.a, dim, &index.a)
}

/// `torch.scatter(input, dim, index, src|value, *, reduce=None)`.
#[pyfunction]
#[pyo3(name = "scatter", signature = (input, dim, index, src=None, value=None, *, reduce=None))]
fn scatter_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
    src: Option<&Bound<'_, PyAny>>,
    value: Option<&Bound<'_, PyAny>>,
    reduce: Option<&str>,
) -> PyResult<PyArr> {
    let s = scatter_source(py, src, value)?;
    do_scatter(py, &input.a, dim, &index.a, s, reduce_arg(reduce)?)
}

/// `torch.scatter_add(input, dim, index, src)`.
#[pyfunction]
#[pyo3(name = "scatter_add")]
fn scatter_add_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
    src: PyRef<'_, PyArr>,
) -> PyResult<PyArr> {
    do_scatter(py, &input.a, dim, &index.a, Rhs::Array(&src.a), Some(ScatterReduce::Add))
}

/// `torch.index_add(input, dim, index, source, *, alpha=1)`.
#[pyfunction]
#[pyo3(name = "index_add", signature = (input, dim, index, source, *, alpha=None))]
fn index_add_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
    source: PyRef<'_, PyArr>,
    alpha: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let alpha = alpha.map(|v| scalar_arg(py, v)).transpose()?.unwrap_or(Scalar::Int(1));
    do_index_add(py, &input.a, dim, &index.a, &source.a, alpha)
}

/// `torch.nn.functional.embedding(input, weight, padding_idx=None)`: the rows of `weight`
/// at the indices of `input`, of shape `[*input.shape, embedding_dim]`.
// PyTorch's signature, every argument of it.
#[allow(clippy::too_many_arguments)]
#[pyfunction]
#[pyo3(signature = (input, weight, padding_idx=None, max_norm=None, norm_type=2.0, scale_grad_by_freq=false, sparse=false))]
fn embedding(
    py: Python<'_>,
    input: &Bound<'_, PyAny>,
    weight: PyRef<'_, PyArr>,
    padding_idx: Option<i64>,
    max_norm: Option<f64>,
    norm_type: f64,
    scale_grad_by_freq: bool,
    sparse: bool,
) -> PyResult<PyArr> {
    let _ = (norm_type, scale_grad_by_freq, sparse);
    if max_norm.is_some() {
        return Err(PyValueError::new_err(
            "embedding(): max_norm (renormalising the weight's rows in place) is not supported",
        ));
    }
    let input = array_arg("embedding", "input", input)?;
    Ok(PyArr { a: issued(py, input.context(), eager::embedding(input, &weight.a, padding_idx))? })
}

/// Whether `v` is an index array of `x[...]`: an eagervm array, a list, or a NumPy array.
fn is_index_array(v: &Bound<'_, PyAny>) -> PyResult<bool> {
    if v.is_instance_of::<PyArr>() || v.is_instance_of::<PyList>() {
        return Ok(true);
    }
    match v.py().import("numpy") {
        Ok(np) => v.is_instance(&np.getattr("ndarray")?),
        Err(_) => Ok(false),
    }
}

/// The indices of `x[key]` when the key holds an index array (advanced indexing), else
/// `None` (basic indexing, a view: `python::views`). Lists and NumPy arrays become arrays
/// on `x`'s device (an empty list an `int64` one, as PyTorch takes it).
pub(crate) fn advanced_key(
    py: Python<'_>,
    x: &Array,
    key: &Bound<'_, PyAny>,
) -> PyResult<Option<Vec<Indexer>>> {
    let items: Vec<Bound<'_, PyAny>> = match key.downcast::<PyTuple>() {
        Ok(t) => t.iter().collect(),
        Err(_) => vec![key.clone()],
    };
    let mut any = false;
    for v in &items {
        any |= is_index_array(v)?;
    }
    if !any {
        return Ok(None);
    }
    let cx = x.context();
    items
        .iter()
        .map(|v| {
            if let Ok(a) = v.downcast::<PyArr>() {
                return Ok(Indexer::Array(a.get().a.clone()));
            }
            if is_index_array(v)? {
                let mut a = super::interop::tensor(py, cx, v, None, Some(x.device()))?;
                if a.numel() == 0 && a.dtype() != DType::Bool {
                    a = issued(py, cx, a.to_dtype(DType::I64))?;
                }
                return Ok(Indexer::Array(a));
            }
            Ok(Indexer::Basic(super::args::one_index(v)?))
        })
        .collect::<PyResult<_>>()
        .map(Some)
}

/// The indices of `index_put_`'s tuple of index arrays (`None` for a full slice).
fn index_arrays(py: Python<'_>, x: &Array, indices: &Bound<'_, PyAny>) -> PyResult<Vec<Indexer>> {
    let it = indices.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "index_put_(): argument 'indices' must be a tuple of arrays, not {}",
            type_name(indices)
        ))
    })?;
    it.map(|v| {
        let v = v?;
        if v.is_none() {
            return Ok(Indexer::Basic(crate::eager::TensorIndex::full()));
        }
        let a = match v.downcast::<PyArr>() {
            Ok(a) => a.get().a.clone(),
            Err(_) => super::interop::tensor(py, x.context(), &v, None, Some(x.device()))?,
        };
        Ok(Indexer::Array(a))
    })
    .collect()
}

#[pymethods]
impl PyArr {
    /// The indices of the nonzero elements: `int64[n, ndim]`, or (`as_tuple=True`) a tuple
    /// of one `int64[n]` per dimension. Reads the count first (a sync point).
    #[pyo3(signature = (*, as_tuple=false))]
    fn nonzero<'py>(&self, py: Python<'py>, as_tuple: bool) -> PyResult<Bound<'py, PyAny>> {
        nonzero_of(py, &self.a, as_tuple)
    }

    /// The elements where `mask` (bool, broadcast) is true, 1-D. Reads the mask's count
    /// first (a sync point).
    fn masked_select(&self, py: Python<'_>, mask: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.masked_select(&mask.a))? })
    }

    /// `self[indices] = values` (`indices` a tuple of index arrays, `None` for a whole
    /// dimension), or added there with `accumulate=True`; returns this array.
    #[pyo3(signature = (indices, values, accumulate=false))]
    fn index_put_<'py>(
        slf: &Bound<'py, Self>,
        indices: &Bound<'py, PyAny>,
        values: &Bound<'py, PyAny>,
        accumulate: bool,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        put(py, &me.a, indices, values, accumulate)?;
        Ok(slf.clone())
    }

    /// `index_put_` on a copy of this array.
    #[pyo3(signature = (indices, values, accumulate=false))]
    fn index_put(
        &self,
        py: Python<'_>,
        indices: &Bound<'_, PyAny>,
        values: &Bound<'_, PyAny>,
        accumulate: bool,
    ) -> PyResult<PyArr> {
        let copy = issued(py, self.a.context(), self.a.copy())?;
        put(py, &copy, indices, values, accumulate)?;
        Ok(PyArr { a: copy })
    }
}

fn put(
    py: Python<'_>,
    x: &Array,
    indices: &Bound<'_, PyAny>,
    values: &Bound<'_, PyAny>,
    accumulate: bool,
) -> PyResult<()> {
    let items = index_arrays(py, x, indices)?;
    let made;
    let rhs = match values.downcast::<PyArr>() {
        Ok(v) => Rhs::Array(&v.get().a),
        Err(_) => match super::interop::scalar_of(values)? {
            Some(s) => Rhs::Scalar(s),
            None => {
                made = super::interop::tensor(py, x.context(), values, None, Some(x.device()))?;
                Rhs::Array(&made)
            }
        },
    };
    issued(py, x.context(), x.index_put_with_(&items, rhs, accumulate))
}

fn nonzero_of<'py>(py: Python<'py>, x: &Array, as_tuple: bool) -> PyResult<Bound<'py, PyAny>> {
    let nz = issued(py, x.context(), x.nonzero())?;
    if !as_tuple {
        return Ok(Bound::new(py, PyArr { a: nz })?.into_any());
    }
    let cols: Vec<PyArr> = (0..x.ndim())
        .map(|j| issued(py, x.context(), nz.select(1, j as isize)).map(|a| PyArr { a }))
        .collect::<PyResult<_>>()?;
    Ok(PyTuple::new(py, cols)?.into_any())
}

/// `torch.nonzero(input, *, as_tuple=False)`.
#[pyfunction]
#[pyo3(name = "nonzero", signature = (input, *, as_tuple=false))]
fn nonzero_fn<'py>(py: Python<'py>, input: PyRef<'py, PyArr>, as_tuple: bool) -> PyResult<Bound<'py, PyAny>> {
    nonzero_of(py, &input.a, as_tuple)
}

/// `torch.masked_select(input, mask)`.
#[pyfunction]
#[pyo3(name = "masked_select")]
fn masked_select_fn(py: Python<'_>, input: PyRef<'_, PyArr>, mask: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, input.a.context(), input.a.masked_select(&mask.a))? })
}

/// An int or a sequence of ints (`roll`'s shifts and dims, `flip`'s and `tile`'s dims).
fn ints_arg(op: &str, what: &str, v: &Bound<'_, PyAny>) -> PyResult<Vec<i64>> {
    if super::args::is_int(v) {
        return Ok(vec![super::args::int_of(op, what, v)?]);
    }
    Ok(super::args::isizes_of(op, what, &PyTuple::new(v.py(), [v])?)?.into_iter().map(|d| d as i64).collect())
}

fn flip_of(py: Python<'_>, x: &Array, dims: &[isize]) -> PyResult<PyArr> {
    for &d in dims {
        dim("flip", d, x.ndim())?;
    }
    Ok(PyArr { a: issued(py, x.context(), x.flip(dims))? })
}

fn roll_of(
    py: Python<'_>,
    x: &Array,
    shifts: &Bound<'_, PyAny>,
    dims: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let shifts = ints_arg("roll", "shifts", shifts)?;
    let dims: Vec<isize> = match dims.filter(|d| !d.is_none()) {
        None => vec![],
        Some(d) => ints_arg("roll", "dims", d)?.into_iter().map(|d| d as isize).collect(),
    };
    for &d in &dims {
        dim("roll", d, x.ndim())?;
    }
    Ok(PyArr { a: issued(py, x.context(), x.roll(&shifts, &dims))? })
}

fn tile_of(py: Python<'_>, x: &Array, dims: &[usize]) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, x.context(), x.tile(dims))? })
}

#[pymethods]
impl PyArr {
    /// A copy with the elements reversed along `dims` (`flip(0, 1)` or `flip((0, 1))`).
    #[pyo3(signature = (*dims))]
    fn flip(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        let dims = super::args::isizes_of("flip", "dims", dims)?;
        flip_of(py, &self.a, &dims)
    }

    /// A copy with the elements shifted along `dims` (wrapping around); without `dims`,
    /// of the flattened array.
    #[pyo3(signature = (shifts, dims=None))]
    fn roll(
        &self,
        py: Python<'_>,
        shifts: &Bound<'_, PyAny>,
        dims: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        roll_of(py, &self.a, shifts, dims)
    }

    /// This array repeated `sizes[i]` times along each dimension (`repeat(2, 3)` or
    /// `repeat((2, 3))`).
    #[pyo3(signature = (*sizes))]
    fn repeat(&self, py: Python<'_>, sizes: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        let sizes = super::args::size_of("repeat", "sizes", sizes)?;
        Ok(PyArr { a: issued(py, self.a.context(), self.a.repeat(&sizes))? })
    }

    /// `repeat` with `dims` padded with leading ones to this array's rank.
    #[pyo3(signature = (*dims))]
    fn tile(&self, py: Python<'_>, dims: &Bound<'_, PyTuple>) -> PyResult<PyArr> {
        let dims = super::args::size_of("tile", "dims", dims)?;
        tile_of(py, &self.a, &dims)
    }
}

#[pymethods]
impl PyArr {
    /// A copy with `source`'s slices along `dim` written at `index` (int64, 1-D).
    fn index_copy(
        &self,
        py: Python<'_>,
        dim: isize,
        index: PyRef<'_, PyArr>,
        source: PyRef<'_, PyArr>,
    ) -> PyResult<PyArr> {
        super::args::dim("index_copy", dim, self.a.ndim())?;
        Ok(PyArr { a: issued(py, self.a.context(), self.a.index_copy(dim, &index.a, &source.a))? })
    }

    /// `index_copy` in place; returns this array.
    fn index_copy_<'py>(
        slf: &Bound<'py, Self>,
        dim: isize,
        index: PyRef<'py, PyArr>,
        source: PyRef<'py, PyArr>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        super::args::dim("index_copy_", dim, me.a.ndim())?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.index_copy_(dim, &index.a, &source.a).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// A copy with the slices of `dim` at `index` set to `value`.
    fn index_fill(
        &self,
        py: Python<'_>,
        dim: isize,
        index: PyRef<'_, PyArr>,
        value: &Bound<'_, PyAny>,
    ) -> PyResult<PyArr> {
        super::args::dim("index_fill", dim, self.a.ndim())?;
        let v = scalar_arg(py, value)?;
        Ok(PyArr { a: issued(py, self.a.context(), self.a.index_fill(dim, &index.a, v))? })
    }

    /// `index_fill` in place; returns this array.
    fn index_fill_<'py>(
        slf: &Bound<'py, Self>,
        dim: isize,
        index: PyRef<'py, PyArr>,
        value: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, Self>> {
        let (py, me) = (slf.py(), slf.get());
        super::args::dim("index_fill_", dim, me.a.ndim())?;
        let v = scalar_arg(py, value)?;
        let mut a = me.a.clone();
        issued(py, me.a.context(), a.index_fill_(dim, &index.a, v).map(|_| ()))?;
        Ok(slf.clone())
    }

    /// The elements of the flattened array at `index`, in `index`'s shape.
    fn take(&self, py: Python<'_>, index: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        Ok(PyArr { a: issued(py, self.a.context(), self.a.take(&index.a))? })
    }
}

/// `torch.index_copy(input, dim, index, source)`.
#[pyfunction]
#[pyo3(name = "index_copy")]
fn index_copy_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
    source: PyRef<'_, PyArr>,
) -> PyResult<PyArr> {
    super::args::dim("index_copy", dim, input.a.ndim())?;
    Ok(PyArr { a: issued(py, input.a.context(), input.a.index_copy(dim, &index.a, &source.a))? })
}

/// `torch.index_fill(input, dim, index, value)`.
#[pyfunction]
#[pyo3(name = "index_fill")]
fn index_fill_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: isize,
    index: PyRef<'_, PyArr>,
    value: &Bound<'_, PyAny>,
) -> PyResult<PyArr> {
    super::args::dim("index_fill", dim, input.a.ndim())?;
    let v = scalar_arg(py, value)?;
    Ok(PyArr { a: issued(py, input.a.context(), input.a.index_fill(dim, &index.a, v))? })
}

/// `torch.take(input, index)`.
#[pyfunction]
#[pyo3(name = "take")]
fn take_fn(py: Python<'_>, input: PyRef<'_, PyArr>, index: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, input.a.context(), input.a.take(&index.a))? })
}

/// `torch.flip(input, dims)`.
#[pyfunction]
#[pyo3(name = "flip")]
fn flip_fn(py: Python<'_>, input: PyRef<'_, PyArr>, dims: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    let dims: Vec<isize> = ints_arg("flip", "dims", dims)?.into_iter().map(|d| d as isize).collect();
    flip_of(py, &input.a, &dims)
}

/// `torch.roll(input, shifts, dims=None)`.
#[pyfunction]
#[pyo3(name = "roll", signature = (input, shifts, dims=None))]
fn roll_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    shifts: &Bound<'_, PyAny>,
    dims: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    roll_of(py, &input.a, shifts, dims)
}

/// `torch.tile(input, dims)`.
#[pyfunction]
#[pyo3(name = "tile")]
fn tile_fn(py: Python<'_>, input: PyRef<'_, PyArr>, dims: &Bound<'_, PyAny>) -> PyResult<PyArr> {
    let dims = super::args::size_obj("tile", "dims", dims)?;
    tile_of(py, &input.a, &dims)
}

/// `torch.nn.functional.pad(input, pad, mode="constant", value=None)`.
#[pyfunction]
#[pyo3(signature = (input, pad, mode="constant", value=None))]
fn pad(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    pad: &Bound<'_, PyAny>,
    mode: &str,
    value: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let pads = ints_arg("pad", "pad", pad)?;
    let mode = eager::PadMode::from_name(mode).ok_or_else(|| {
        PyValueError::new_err(format!(
            "pad(): mode must be one of 'constant', 'reflect', 'replicate' or 'circular', not {mode:?}"
        ))
    })?;
    let value = value.filter(|v| !v.is_none());
    if mode != eager::PadMode::Constant && value.is_some() {
        return Err(PyValueError::new_err("pad(): a padding mode other than constant does not take a value"));
    }
    let value = value.map(|v| scalar_arg(py, v)).transpose()?.unwrap_or(Scalar::Int(0));
    Ok(PyArr { a: issued(py, input.a.context(), input.a.pad(&pads, mode, value))? })
}

/// Add the module functions of this file to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(cat, m)?)?;
    m.add_function(wrap_pyfunction!(stack, m)?)?;
    m.add_function(wrap_pyfunction!(index_select_fn, m)?)?;
    m.add_function(wrap_pyfunction!(gather_fn, m)?)?;
    m.add_function(wrap_pyfunction!(scatter_fn, m)?)?;
    m.add_function(wrap_pyfunction!(scatter_add_fn, m)?)?;
    m.add_function(wrap_pyfunction!(index_add_fn, m)?)?;
    m.add_function(wrap_pyfunction!(embedding, m)?)?;
    m.add_function(wrap_pyfunction!(nonzero_fn, m)?)?;
    m.add_function(wrap_pyfunction!(masked_select_fn, m)?)?;
    m.add_function(wrap_pyfunction!(flip_fn, m)?)?;
    m.add_function(wrap_pyfunction!(roll_fn, m)?)?;
    m.add_function(wrap_pyfunction!(tile_fn, m)?)?;
    m.add_function(wrap_pyfunction!(pad, m)?)?;
    m.add_function(wrap_pyfunction!(index_copy_fn, m)?)?;
    m.add_function(wrap_pyfunction!(index_fill_fn, m)?)?;
    m.add_function(wrap_pyfunction!(take_fn, m)?)?;
    Ok(())
}
