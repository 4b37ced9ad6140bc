//! Reductions, scans and normalisations of `eagervm.Array` (`x.sum(dim=1, keepdim=True)`,
//! `x.max(dim=0)`, `x.softmax(-1)`, ...), with PyTorch's arguments: `dim` an int, a tuple or
//! list of ints, or None (every dimension); `keepdim`; `dtype=` converting the input first.
//! A dimension out of range is an `IndexError` (`OutOfRangeError`), one given twice an
//! `InvalidOperandsError`. `x.max(dim)` and `x.min(dim)` return `(values, indices)` as
//! `eagervm.return_types.max` / `.min` (named tuples, as PyTorch's `torch.return_types`).
//! The module functions (`eagervm.sum`, ...) and `eagervm.nn.functional` call these methods
//! (`python/eagervm/_reduce.py`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyFloat;

use super::args::{dim, int_of, is_int, type_name};
use super::array::PyArr;
use super::dtype::opt_dtype;
use super::issue::issued;
use crate::eager::{Array, Reduction};
use crate::Result;

/// `dim=` of reduction `op`: None (every dimension), an int, or a sequence of ints, each
/// checked to be in range.
fn dims_of(op: &str, v: Option<&Bound<'_, PyAny>>, rank: usize) -> PyResult<Option<Vec<isize>>> {
    let Some(v) = v.filter(|v| !v.is_none()) else {
        return Ok(None);
    };
    let items: Vec<Bound<'_, PyAny>> = if is_int(v) {
        vec![v.clone()]
    } else {
        let it = v.try_iter().map_err(|_| {
            PyTypeError::new_err(format!(
                "{op}(): argument 'dim' must be an int or a tuple of ints, not {}",
                type_name(v)
            ))
        })?;
        it.collect::<PyResult<_>>()?
    };
    let mut dims = Vec::with_capacity(items.len());
    for item in &items {
        let d = int_of(op, "dim", item)?;
        let d = isize::try_from(d)
            .map_err(|_| PyValueError::new_err(format!("{op}(): dim {d} is out of range")))?;
        dim(op, d, rank)?;
        dims.push(d);
    }
    Ok(Some(dims))
}

/// `dim=` that must be one int.
fn one_dim(op: &str, v: &Bound<'_, PyAny>, rank: usize) -> PyResult<isize> {
    let d = int_of(op, "dim", v)?;
    let d =
        isize::try_from(d).map_err(|_| PyValueError::new_err(format!("{op}(): dim {d} is out of range")))?;
    dim(op, d, rank)?;
    Ok(d)
}

/// The input of a call with `dtype=`: converted to it first, as PyTorch does.
fn with_dtype(py: Python<'_>, a: &Array, dtype: Option<&Bound<'_, PyAny>>) -> PyResult<Array> {
    match opt_dtype(dtype)? {
        Some(d) => issued(py, a.context(), a.to_dtype(d)),
        None => Ok(a.clone()),
    }
}

/// A result as an array.
fn arr(py: Python<'_>, a: &Array, r: Result<Array>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, a.context(), r)? })
}

/// `(values, indices)` as `eagervm.return_types.<name>`.
fn pair(py: Python<'_>, name: &str, (v, i): (Array, Array)) -> PyResult<PyObject> {
    let cls = py.import("eagervm.return_types")?.getattr(name)?;
    Ok(cls.call1((PyArr { a: v }, PyArr { a: i }))?.unbind())
}

/// The reduction `"none"`, `"mean"` or `"sum"`.
pub(crate) fn reduction_of(name: &str) -> PyResult<Reduction> {
    Reduction::from_name(name).map_err(|_| {
        PyValueError::new_err(format!("{name} is not a valid value for reduction: 'none', 'mean' or 'sum'"))
    })
}

/// `p` of `norm`: a number, `inf`, or `'fro'` (2 for vectors).
fn order_of(p: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    match p {
        None => Ok(2.0),
        Some(p) if p.is_none() => Ok(2.0),
        Some(p) => match p.extract::<String>() {
            Ok(s) if s == "fro" => Ok(2.0),
            Ok(s) => Err(PyValueError::new_err(format!("norm(): p must be a number or 'fro', not {s:?}"))),
            Err(_) => p.extract::<f64>().map_err(|_| {
                PyTypeError::new_err(format!("norm(): p must be a number, not {}", type_name(p)))
            }),
        },
    }
}

/// `correction` of `var` and `std` from PyTorch's `unbiased` and `correction`.
fn correction_of(unbiased: Option<bool>, correction: Option<&Bound<'_, PyAny>>) -> PyResult<f64> {
    match (unbiased, correction.filter(|c| !c.is_none())) {
        (Some(_), Some(_)) => Err(PyValueError::new_err("var(): give unbiased or correction, not both")),
        (Some(u), None) => Ok(if u { 1.0 } else { 0.0 }),
        (None, Some(c)) => {
            if c.is_instance_of::<PyFloat>() {
                c.extract::<f64>()
            } else {
                Ok(int_of("var", "correction", c)? as f64)
            }
        }
        (None, None) => Ok(1.0),
    }
}

#[pymethods]
impl PyArr {
    /// The mean along `dim` (every dimension for None); floating arrays, or any with
    /// `dtype=` (converted first).
    #[pyo3(signature = (dim=None, keepdim=false, *, dtype=None))]
    fn mean(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let dims = dims_of("mean", dim, x.ndim())?;
        arr(py, &x, x.mean_dim(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// The product along `dim` (an int; every element for None); int64 for bool and
    /// integer arrays.
    #[pyo3(signature = (dim=None, keepdim=false, *, dtype=None))]
    fn prod(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        match dim.filter(|d| !d.is_none()) {
            None => arr(py, &x, x.prod()),
            Some(d) => {
                let d = one_dim("prod", d, x.ndim())?;
                arr(py, &x, x.prod_dim(d, keepdim))
            }
        }
    }

    /// The largest elements along `dim` (an int or a tuple; every dimension for `()`).
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn amax(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let dims = dims_of("amax", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.amax(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// The smallest elements along `dim`.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn amin(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let dims = dims_of("amin", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.amin(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// `max()`: the largest element; `max(dim, keepdim=False)`: `(values, indices)` along
    /// `dim`.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn max(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyObject> {
        extreme(py, self, "max", dim, keepdim)
    }

    /// `min()`: the smallest element; `min(dim, keepdim=False)`: `(values, indices)`.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn min(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyObject> {
        extreme(py, self, "min", dim, keepdim)
    }

    /// The int64 index of the first largest element along `dim`, or in the flattened
    /// array for None.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn argmax(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let d = dim.filter(|d| !d.is_none()).map(|d| one_dim("argmax", d, self.a.ndim())).transpose()?;
        arr(py, &self.a, self.a.argmax(d, keepdim))
    }

    /// The int64 index of the first smallest element (as `argmax`).
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn argmin(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let d = dim.filter(|d| !d.is_none()).map(|d| one_dim("argmin", d, self.a.ndim())).transpose()?;
        arr(py, &self.a, self.a.argmin(d, keepdim))
    }

    /// Whether every element along `dim` is nonzero (bool; uint8 for uint8).
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn all(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let dims = dims_of("all", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.all_dim(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// Whether some element along `dim` is nonzero.
    #[pyo3(signature = (dim=None, keepdim=false))]
    fn any(&self, py: Python<'_>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<PyArr> {
        let dims = dims_of("any", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.any_dim(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// The variance along `dim` with `correction` (default 1; `unbiased=False` is 0).
    #[pyo3(signature = (dim=None, unbiased=None, keepdim=false, *, correction=None))]
    fn var(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        unbiased: Option<bool>,
        keepdim: bool,
        correction: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let c = correction_of(unbiased, correction)?;
        let dims = dims_of("var", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.var(dims.as_deref(), c, keepdim))
    }

    /// The standard deviation along `dim` (as `var`).
    #[pyo3(signature = (dim=None, unbiased=None, keepdim=false, *, correction=None))]
    fn std(
        &self,
        py: Python<'_>,
        dim: Option<&Bound<'_, PyAny>>,
        unbiased: Option<bool>,
        keepdim: bool,
        correction: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let c = correction_of(unbiased, correction)?;
        let dims = dims_of("std", dim, self.a.ndim())?;
        arr(py, &self.a, self.a.std(dims.as_deref(), c, keepdim))
    }

    /// `log(sum(exp(x)))` along `dim`, stably.
    #[pyo3(signature = (dim, keepdim=false))]
    fn logsumexp(&self, py: Python<'_>, dim: &Bound<'_, PyAny>, keepdim: bool) -> PyResult<PyArr> {
        let dims = dims_of("logsumexp", Some(dim), self.a.ndim())?;
        arr(py, &self.a, self.a.logsumexp(dims.as_deref().unwrap_or(&[]), keepdim))
    }

    /// The vector `p`-norm along `dim` (of the flattened array for None); `p` a number,
    /// `inf`, `-inf` or `'fro'` (2).
    #[pyo3(signature = (p=None, dim=None, keepdim=false, dtype=None))]
    fn norm(
        &self,
        py: Python<'_>,
        p: Option<&Bound<'_, PyAny>>,
        dim: Option<&Bound<'_, PyAny>>,
        keepdim: bool,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let p = order_of(p)?;
        let dims = dims_of("norm", dim, x.ndim())?;
        arr(py, &x, x.norm(p, dims.as_deref(), keepdim))
    }

    /// The running sums along `dim` (int64 for bool and integer arrays).
    #[pyo3(signature = (dim, *, dtype=None))]
    fn cumsum(
        &self,
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let d = one_dim("cumsum", dim, x.ndim())?;
        arr(py, &x, x.cumsum(d))
    }

    /// The running products along `dim`.
    #[pyo3(signature = (dim, *, dtype=None))]
    fn cumprod(
        &self,
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let d = one_dim("cumprod", dim, x.ndim())?;
        arr(py, &x, x.cumprod(d))
    }

    /// `exp(x) / sum(exp(x))` along `dim`, stably (`dtype=` converts first).
    #[pyo3(signature = (dim, dtype=None))]
    fn softmax(
        &self,
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let d = one_dim("softmax", dim, x.ndim())?;
        arr(py, &x, x.softmax(d))
    }

    /// `log(softmax(x))` along `dim`, stably (`dtype=` converts first).
    #[pyo3(signature = (dim, dtype=None))]
    fn log_softmax(
        &self,
        py: Python<'_>,
        dim: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let x = with_dtype(py, &self.a, dtype)?;
        let d = one_dim("log_softmax", dim, x.ndim())?;
        arr(py, &x, x.log_softmax(d))
    }

    /// `layer_norm` over the last `len(normalized_shape)` dimensions (what
    /// `eagervm.nn.functional.layer_norm` calls).
    #[pyo3(signature = (normalized_shape, weight=None, bias=None, eps=1e-5))]
    fn _layer_norm(
        &self,
        py: Python<'_>,
        normalized_shape: Vec<usize>,
        weight: Option<PyRef<'_, PyArr>>,
        bias: Option<PyRef<'_, PyArr>>,
        eps: f64,
    ) -> PyResult<PyArr> {
        let r = self.a.layer_norm(
            &normalized_shape,
            weight.as_ref().map(|w| &w.a),
            bias.as_ref().map(|b| &b.a),
            eps,
        );
        arr(py, &self.a, r)
    }

    /// `nll_loss` with these log-probabilities (what `eagervm.nn.functional.nll_loss`
    /// calls).
    #[pyo3(signature = (target, weight=None, ignore_index=-100, reduction="mean"))]
    fn _nll_loss(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyArr>,
        weight: Option<PyRef<'_, PyArr>>,
        ignore_index: i64,
        reduction: &str,
    ) -> PyResult<PyArr> {
        let red = reduction_of(reduction)?;
        arr(py, &self.a, self.a.nll_loss(&target.a, weight.as_ref().map(|w| &w.a), ignore_index, red))
    }

    /// `cross_entropy` with these logits (what `eagervm.nn.functional.cross_entropy`
    /// calls).
    #[pyo3(signature = (target, weight=None, ignore_index=-100, reduction="mean", label_smoothing=0.0))]
    fn _cross_entropy(
        &self,
        py: Python<'_>,
        target: PyRef<'_, PyArr>,
        weight: Option<PyRef<'_, PyArr>>,
        ignore_index: i64,
        reduction: &str,
        label_smoothing: f64,
    ) -> PyResult<PyArr> {
        let red = reduction_of(reduction)?;
        let w = weight.as_ref().map(|w| &w.a);
        arr(py, &self.a, self.a.cross_entropy(&target.a, w, ignore_index, red, label_smoothing))
    }

    /// `mse_loss` against `target` (what `eagervm.nn.functional.mse_loss` calls).
    #[pyo3(signature = (target, reduction="mean"))]
    fn _mse_loss(&self, py: Python<'_>, target: PyRef<'_, PyArr>, reduction: &str) -> PyResult<PyArr> {
        let red = reduction_of(reduction)?;
        arr(py, &self.a, self.a.mse_loss(&target.a, red))
    }
}

/// `x.max(...)` and `x.min(...)`.
fn extreme(
    py: Python<'_>,
    me: &PyArr,
    op: &str,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
) -> PyResult<PyObject> {
    let a = &me.a;
    let Some(d) = dim.filter(|d| !d.is_none()) else {
        let r = if op == "max" { a.max() } else { a.min() };
        return Ok(Py::new(py, arr(py, a, r)?)?.into_any());
    };
    if d.is_instance_of::<PyArr>() {
        return Err(PyTypeError::new_err(format!(
            "{op}(other) (the elementwise {op}imum of two arrays) is not supported: {op}(dim) reduces"
        )));
    }
    let d = one_dim(op, d, a.ndim())?;
    let r = if op == "max" { a.max_dim(d, keepdim) } else { a.min_dim(d, keepdim) };
    pair(py, op, issued(py, a.context(), r)?)
}

/// `x.sum(dim=None, keepdim=False, *, dtype=None)`: the whole-tensor `sum` op for no dims
/// and no keepdim (as traces record it), the sums along dims otherwise.
pub(crate) fn sum(
    py: Python<'_>,
    me: &PyArr,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    let x = with_dtype(py, &me.a, dtype)?;
    let dims = dims_of("sum", dim, x.ndim())?;
    match dims {
        None if !keepdim => arr(py, &x, x.sum()),
        dims => arr(py, &x, x.sum_dim(dims.as_deref().unwrap_or(&[]), keepdim)),
    }
}

// ---- Module functions (`eagervm.sum(x, dim=1)`, ...): the methods above, by function.

/// `eagervm.sum(input, dim=None, keepdim=False, *, dtype=None)`.
#[pyfunction]
#[pyo3(name = "sum", signature = (input, dim=None, keepdim=false, *, dtype=None))]
fn sum_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    sum(py, &input, dim, keepdim, dtype)
}

/// `eagervm.mean(input, dim=None, keepdim=False, *, dtype=None)`.
#[pyfunction]
#[pyo3(name = "mean", signature = (input, dim=None, keepdim=false, *, dtype=None))]
fn mean_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.mean(py, dim, keepdim, dtype)
}

/// `eagervm.prod(input, dim=None, keepdim=False, *, dtype=None)`.
#[pyfunction]
#[pyo3(name = "prod", signature = (input, dim=None, keepdim=false, *, dtype=None))]
fn prod_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.prod(py, dim, keepdim, dtype)
}

/// Module functions of the form `f(input, dim=..., keepdim=False)`.
macro_rules! dim_keepdim_fn {
    ($($(#[$doc:meta])* $f:ident => $name:literal, $default:expr, $ret:ty;)*) => {$(
        $(#[$doc])*
        #[pyfunction]
        #[pyo3(name = $name, signature = (input, dim=$default, keepdim=false))]
        fn $f(py: Python<'_>, input: PyRef<'_, PyArr>, dim: Option<&Bound<'_, PyAny>>, keepdim: bool) -> PyResult<$ret> {
            input.$f(py, dim, keepdim)
        }
    )*};
}

dim_keepdim_fn! {
    /// `eagervm.amax(input, dim=(), keepdim=False)`.
    amax => "amax", None, PyArr;
    /// `eagervm.amin(input, dim=(), keepdim=False)`.
    amin => "amin", None, PyArr;
    /// `eagervm.max(input)` or `eagervm.max(input, dim, keepdim=False)`.
    max => "max", None, PyObject;
    /// `eagervm.min(input)` or `eagervm.min(input, dim, keepdim=False)`.
    min => "min", None, PyObject;
    /// `eagervm.argmax(input, dim=None, keepdim=False)`.
    argmax => "argmax", None, PyArr;
    /// `eagervm.argmin(input, dim=None, keepdim=False)`.
    argmin => "argmin", None, PyArr;
    /// `eagervm.all(input, dim=None, keepdim=False)`.
    all => "all", None, PyArr;
    /// `eagervm.any(input, dim=None, keepdim=False)`.
    any => "any", None, PyArr;
}

/// `eagervm.var(input, dim=None, unbiased=None, keepdim=False, *, correction=None)`.
#[pyfunction]
#[pyo3(name = "var", signature = (input, dim=None, unbiased=None, keepdim=false, *, correction=None))]
fn var_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: Option<&Bound<'_, PyAny>>,
    unbiased: Option<bool>,
    keepdim: bool,
    correction: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.var(py, dim, unbiased, keepdim, correction)
}

/// `eagervm.std(input, dim=None, unbiased=None, keepdim=False, *, correction=None)`.
#[pyfunction]
#[pyo3(name = "std", signature = (input, dim=None, unbiased=None, keepdim=false, *, correction=None))]
fn std_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: Option<&Bound<'_, PyAny>>,
    unbiased: Option<bool>,
    keepdim: bool,
    correction: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.std(py, dim, unbiased, keepdim, correction)
}

/// `eagervm.logsumexp(input, dim, keepdim=False)`.
#[pyfunction]
#[pyo3(name = "logsumexp", signature = (input, dim, keepdim=false))]
fn logsumexp_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: &Bound<'_, PyAny>,
    keepdim: bool,
) -> PyResult<PyArr> {
    input.logsumexp(py, dim, keepdim)
}

/// `eagervm.norm(input, p='fro', dim=None, keepdim=False, dtype=None)`.
#[pyfunction]
#[pyo3(name = "norm", signature = (input, p=None, dim=None, keepdim=false, dtype=None))]
fn norm_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    p: Option<&Bound<'_, PyAny>>,
    dim: Option<&Bound<'_, PyAny>>,
    keepdim: bool,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.norm(py, p, dim, keepdim, dtype)
}

/// `eagervm.cumsum(input, dim, *, dtype=None)`.
#[pyfunction]
#[pyo3(name = "cumsum", signature = (input, dim, *, dtype=None))]
fn cumsum_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.cumsum(py, dim, dtype)
}

/// `eagervm.cumprod(input, dim, *, dtype=None)`.
#[pyfunction]
#[pyo3(name = "cumprod", signature = (input, dim, *, dtype=None))]
fn cumprod_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.cumprod(py, dim, dtype)
}

/// `eagervm.softmax(input, dim, dtype=None)`.
#[pyfunction]
#[pyo3(name = "softmax", signature = (input, dim, dtype=None))]
fn softmax_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.softmax(py, dim, dtype)
}

/// `eagervm.log_softmax(input, dim, dtype=None)`.
#[pyfunction]
#[pyo3(name = "log_softmax", signature = (input, dim, dtype=None))]
fn log_softmax_fn(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    dim: &Bound<'_, PyAny>,
    dtype: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.log_softmax(py, dim, dtype)
}

/// Add the module functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(sum_fn, m)?)?;
    m.add_function(wrap_pyfunction!(mean_fn, m)?)?;
    m.add_function(wrap_pyfunction!(prod_fn, m)?)?;
    m.add_function(wrap_pyfunction!(amax, m)?)?;
    m.add_function(wrap_pyfunction!(amin, m)?)?;
    m.add_function(wrap_pyfunction!(max, m)?)?;
    m.add_function(wrap_pyfunction!(min, m)?)?;
    m.add_function(wrap_pyfunction!(argmax, m)?)?;
    m.add_function(wrap_pyfunction!(argmin, m)?)?;
    m.add_function(wrap_pyfunction!(all, m)?)?;
    m.add_function(wrap_pyfunction!(any, m)?)?;
    m.add_function(wrap_pyfunction!(var_fn, m)?)?;
    m.add_function(wrap_pyfunction!(std_fn, m)?)?;
    m.add_function(wrap_pyfunction!(logsumexp_fn, m)?)?;
    m.add_function(wrap_pyfunction!(norm_fn, m)?)?;
    m.add_function(wrap_pyfunction!(cumsum_fn, m)?)?;
    m.add_function(wrap_pyfunction!(cumprod_fn, m)?)?;
    m.add_function(wrap_pyfunction!(softmax_fn, m)?)?;
    m.add_function(wrap_pyfunction!(log_softmax_fn, m)?)?;
    Ok(())
}
