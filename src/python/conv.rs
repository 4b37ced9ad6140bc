//! Products, convolution, pooling and attention from Python, with PyTorch's names,
//! arguments and defaults: the methods `mm`, `bmm`, `addmm`, `baddbmm`, `dot`, `outer` of
//! `eagervm.Array` (`matmul` and `@` are in `python::methods`), and the module functions
//! `eagervm.{matmul, mm, bmm, addmm, baddbmm, dot, outer, conv2d, max_pool2d}` and those
//! `eagervm.nn.functional` re-exports (`linear`, `conv2d`, `max_pool2d`, `avg_pool2d`,
//! `adaptive_avg_pool2d`, `scaled_dot_product_attention`). Each is one call of
//! [`eager::Array`](crate::eager::Array)'s (`eager::products`, `eager::nn`).

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyString, PyTuple};

use super::args::{int_of, is_int, type_name};
use super::array::PyArr;
use super::convert::number;
use super::issue::issued;
use crate::eager::{Array, Conv2dOptions, Padding, PoolOptions};
use crate::framework::Scalar;

/// An `eagervm.Array` result.
fn wrap(py: Python<'_>, cx: &Array, r: crate::Result<Array>) -> PyResult<PyArr> {
    Ok(PyArr { a: issued(py, cx.context(), r)? })
}

/// A size argument `what` of `op`: an int `n` (`(n, n)`) or a pair of ints; each at least
/// `min`.
fn pair(op: &str, what: &str, v: &Bound<'_, PyAny>, min: i64) -> PyResult<(usize, usize)> {
    let (a, b) = if is_int(v) {
        let n = int_of(op, what, v)?;
        (n, n)
    } else {
        let items: Vec<Bound<'_, PyAny>> = match v.try_iter() {
            Ok(it) => it.collect::<PyResult<_>>()?,
            Err(_) => {
                return Err(PyTypeError::new_err(format!(
                    "{op}(): argument '{what}' must be an int or a pair of ints, not {}",
                    type_name(v)
                )))
            }
        };
        match items.as_slice() {
            [n] => {
                let n = int_of(op, what, n)?;
                (n, n)
            }
            [a, b] => (int_of(op, what, a)?, int_of(op, what, b)?),
            _ => {
                return Err(PyValueError::new_err(format!(
                    "{op}(): argument '{what}' must be an int or a pair of ints, got {} values",
                    items.len()
                )))
            }
        }
    };
    let check = |n: i64| {
        if n < min {
            Err(PyValueError::new_err(format!("{op}(): argument '{what}' must be at least {min}, got {n}")))
        } else {
            usize::try_from(n).map_err(|_| PyValueError::new_err(format!("{op}(): '{what}' is out of range")))
        }
    };
    Ok((check(a)?, check(b)?))
}

/// `beta` or `alpha` of `addmm` and `baddbmm`.
fn coefficient(op: &str, v: &Bound<'_, PyAny>) -> PyResult<Scalar> {
    number(op, v)
}

#[pymethods]
impl PyArr {
    /// The product of two matrices, `[m, k] @ [k, n] -> [m, n]` (other ranks refused).
    fn mm(&self, py: Python<'_>, mat2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        wrap(py, &self.a, self.a.mm(&mat2.a))
    }

    /// The batched product `[b, m, k] @ [b, k, n] -> [b, m, n]`.
    fn bmm(&self, py: Python<'_>, mat2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        wrap(py, &self.a, self.a.bmm(&mat2.a))
    }

    /// `beta * self + alpha * (mat1 @ mat2)`.
    #[pyo3(signature = (mat1, mat2, *, beta=None, alpha=None))]
    fn addmm(
        &self,
        py: Python<'_>,
        mat1: PyRef<'_, PyArr>,
        mat2: PyRef<'_, PyArr>,
        beta: Option<&Bound<'_, PyAny>>,
        alpha: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let (beta, alpha) = coefficients("addmm", beta, alpha)?;
        wrap(py, &self.a, self.a.addmm(&mat1.a, &mat2.a, beta, alpha))
    }

    /// `beta * self + alpha * (batch1 @ batch2)`, batched.
    #[pyo3(signature = (batch1, batch2, *, beta=None, alpha=None))]
    fn baddbmm(
        &self,
        py: Python<'_>,
        batch1: PyRef<'_, PyArr>,
        batch2: PyRef<'_, PyArr>,
        beta: Option<&Bound<'_, PyAny>>,
        alpha: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let (beta, alpha) = coefficients("baddbmm", beta, alpha)?;
        wrap(py, &self.a, self.a.baddbmm(&batch1.a, &batch2.a, beta, alpha))
    }

    /// The dot product of two vectors, a 0-d array.
    fn dot(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        wrap(py, &self.a, self.a.dot(&other.a))
    }

    /// The outer product of two vectors.
    fn outer(&self, py: Python<'_>, vec2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        wrap(py, &self.a, self.a.outer(&vec2.a))
    }
}

/// `beta` and `alpha`, 1 where not given.
fn coefficients(
    op: &str,
    beta: Option<&Bound<'_, PyAny>>,
    alpha: Option<&Bound<'_, PyAny>>,
) -> PyResult<(Scalar, Scalar)> {
    let get = |v: Option<&Bound<'_, PyAny>>| v.map_or(Ok(Scalar::Int(1)), |v| coefficient(op, v));
    Ok((get(beta)?, get(alpha)?))
}

/// `torch.matmul(input, other)`: PyTorch's product of any ranks.
#[pyfunction]
fn matmul(py: Python<'_>, input: PyRef<'_, PyArr>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.matmul(&other.a))
}

/// `torch.mm(input, mat2)`.
#[pyfunction]
fn mm(py: Python<'_>, input: PyRef<'_, PyArr>, mat2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.mm(&mat2.a))
}

/// `torch.bmm(input, mat2)`.
#[pyfunction]
fn bmm(py: Python<'_>, input: PyRef<'_, PyArr>, mat2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.bmm(&mat2.a))
}

/// `torch.addmm(input, mat1, mat2, *, beta=1, alpha=1)`.
#[pyfunction]
#[pyo3(signature = (input, mat1, mat2, *, beta=None, alpha=None))]
fn addmm(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    mat1: PyRef<'_, PyArr>,
    mat2: PyRef<'_, PyArr>,
    beta: Option<&Bound<'_, PyAny>>,
    alpha: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.addmm(py, mat1, mat2, beta, alpha)
}

/// `torch.baddbmm(input, batch1, batch2, *, beta=1, alpha=1)`.
#[pyfunction]
#[pyo3(signature = (input, batch1, batch2, *, beta=None, alpha=None))]
fn baddbmm(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    batch1: PyRef<'_, PyArr>,
    batch2: PyRef<'_, PyArr>,
    beta: Option<&Bound<'_, PyAny>>,
    alpha: Option<&Bound<'_, PyAny>>,
) -> PyResult<PyArr> {
    input.baddbmm(py, batch1, batch2, beta, alpha)
}

/// `torch.dot(input, tensor)`.
#[pyfunction]
fn dot(py: Python<'_>, input: PyRef<'_, PyArr>, tensor: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.dot(&tensor.a))
}

/// `torch.outer(input, vec2)`.
#[pyfunction]
fn outer(py: Python<'_>, input: PyRef<'_, PyArr>, vec2: PyRef<'_, PyArr>) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.outer(&vec2.a))
}

/// `torch.nn.functional.linear(input, weight, bias=None)`: `input @ weight.T + bias`.
#[pyfunction]
#[pyo3(signature = (input, weight, bias=None))]
fn linear(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    weight: PyRef<'_, PyArr>,
    bias: Option<PyRef<'_, PyArr>>,
) -> PyResult<PyArr> {
    wrap(py, &input.a, input.a.linear(&weight.a, bias.as_ref().map(|b| &b.a)))
}

/// `torch.nn.functional.conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1,
/// groups=1)`; `padding` an int, a pair, `"valid"` or `"same"`.
#[pyfunction]
#[pyo3(signature = (input, weight, bias=None, stride=None, padding=None, dilation=None, groups=1))]
#[allow(clippy::too_many_arguments)]
fn conv2d(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    weight: PyRef<'_, PyArr>,
    bias: Option<PyRef<'_, PyArr>>,
    stride: Option<&Bound<'_, PyAny>>,
    padding: Option<&Bound<'_, PyAny>>,
    dilation: Option<&Bound<'_, PyAny>>,
    groups: i64,
) -> PyResult<PyArr> {
    const OP: &str = "conv2d";
    let stride = stride.map_or(Ok((1, 1)), |s| pair(OP, "stride", s, 1))?;
    let dilation = dilation.map_or(Ok((1, 1)), |d| pair(OP, "dilation", d, 1))?;
    let padding = match padding {
        None => Padding::Explicit(0, 0),
        Some(p) if p.is_instance_of::<PyString>() => match p.extract::<String>()?.as_str() {
            "valid" => Padding::Valid,
            "same" => Padding::Same,
            s => {
                return Err(PyValueError::new_err(format!(
                    "conv2d(): padding must be 'valid', 'same', an int or a pair of ints, got '{s}'"
                )))
            }
        },
        Some(p) => {
            let (h, w) = pair(OP, "padding", p, 0)?;
            Padding::Explicit(h, w)
        }
    };
    if groups < 1 {
        return Err(PyValueError::new_err(format!("conv2d(): groups must be positive, got {groups}")));
    }
    let groups =
        usize::try_from(groups).map_err(|_| PyValueError::new_err("conv2d(): groups is out of range"))?;
    let options = Conv2dOptions { stride, padding, dilation, groups };
    wrap(py, &input.a, input.a.conv2d(&weight.a, bias.as_ref().map(|b| &b.a), options))
}

/// `torch.nn.functional.max_pool2d(input, kernel_size, stride=None, padding=0, dilation=1,
/// ceil_mode=False, return_indices=False)`: the values, or `(values, indices)`.
#[pyfunction]
#[pyo3(signature = (input, kernel_size, stride=None, padding=None, dilation=None, ceil_mode=false, return_indices=false))]
#[allow(clippy::too_many_arguments)]
fn max_pool2d(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    kernel_size: &Bound<'_, PyAny>,
    stride: Option<&Bound<'_, PyAny>>,
    padding: Option<&Bound<'_, PyAny>>,
    dilation: Option<&Bound<'_, PyAny>>,
    ceil_mode: bool,
    return_indices: bool,
) -> PyResult<PyObject> {
    const OP: &str = "max_pool2d";
    let k = pair(OP, "kernel_size", kernel_size, 1)?;
    let options = PoolOptions {
        stride: stride_of(OP, stride)?,
        padding: padding.map_or(Ok((0, 0)), |p| pair(OP, "padding", p, 0))?,
        dilation: Some(dilation.map_or(Ok((1, 1)), |d| pair(OP, "dilation", d, 1))?),
        ceil_mode,
        ..PoolOptions::default()
    };
    if return_indices {
        let (v, i) = issued(py, input.a.context(), input.a.max_pool2d_with_indices(k, options))?;
        let pair = (Py::new(py, PyArr { a: v })?, Py::new(py, PyArr { a: i })?);
        return Ok(PyTuple::new(py, [pair.0.into_any(), pair.1.into_any()])?.into_any().unbind());
    }
    Ok(Py::new(py, wrap(py, &input.a, input.a.max_pool2d(k, options))?)?.into_any())
}

/// A pool's `stride`: `None` (or an empty sequence, as PyTorch takes it) for the kernel
/// size.
fn stride_of(op: &str, stride: Option<&Bound<'_, PyAny>>) -> PyResult<Option<(usize, usize)>> {
    match stride {
        None => Ok(None),
        Some(s) if !is_int(s) && s.len().is_ok_and(|n| n == 0) => Ok(None),
        Some(s) => pair(op, "stride", s, 1).map(Some),
    }
}

/// `torch.nn.functional.avg_pool2d(input, kernel_size, stride=None, padding=0,
/// ceil_mode=False, count_include_pad=True, divisor_override=None)`.
#[pyfunction]
#[pyo3(signature = (input, kernel_size, stride=None, padding=None, ceil_mode=false, count_include_pad=true, divisor_override=None))]
#[allow(clippy::too_many_arguments)]
fn avg_pool2d(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    kernel_size: &Bound<'_, PyAny>,
    stride: Option<&Bound<'_, PyAny>>,
    padding: Option<&Bound<'_, PyAny>>,
    ceil_mode: bool,
    count_include_pad: bool,
    divisor_override: Option<i64>,
) -> PyResult<PyArr> {
    const OP: &str = "avg_pool2d";
    let divisor_override = match divisor_override {
        None => None,
        Some(d) if d > 0 => Some(
            usize::try_from(d)
                .map_err(|_| PyValueError::new_err("avg_pool2d(): divisor_override is out of range"))?,
        ),
        Some(d) => {
            return Err(PyValueError::new_err(format!("avg_pool2d(): divisor must be not zero, got {d}")))
        }
    };
    let options = PoolOptions {
        stride: stride_of(OP, stride)?,
        padding: padding.map_or(Ok((0, 0)), |p| pair(OP, "padding", p, 0))?,
        dilation: None,
        ceil_mode,
        exclude_pad: !count_include_pad,
        divisor_override,
    };
    let k = pair(OP, "kernel_size", kernel_size, 1)?;
    wrap(py, &input.a, input.a.avg_pool2d(k, options))
}

/// `torch.nn.functional.adaptive_avg_pool2d(input, output_size)`: `output_size` an int, or a
/// pair whose `None` keeps the input's size.
#[pyfunction]
fn adaptive_avg_pool2d(
    py: Python<'_>,
    input: PyRef<'_, PyArr>,
    output_size: &Bound<'_, PyAny>,
) -> PyResult<PyArr> {
    const OP: &str = "adaptive_avg_pool2d";
    let shape = input.a.shape();
    let (h, w) = if shape.len() >= 2 { (shape[shape.len() - 2], shape[shape.len() - 1]) } else { (0, 0) };
    let size = if is_int(output_size) {
        pair(OP, "output_size", output_size, 0)?
    } else {
        let items: Vec<Bound<'_, PyAny>> = output_size
            .try_iter()
            .map_err(|_| PyTypeError::new_err("adaptive_avg_pool2d(): output_size must be an int or a pair"))?
            .collect::<PyResult<_>>()?;
        if items.len() != 2 {
            return Err(PyValueError::new_err("adaptive_avg_pool2d(): output_size must have 2 elements"));
        }
        let one = |v: &Bound<'_, PyAny>, keep: usize| -> PyResult<usize> {
            if v.is_none() {
                return Ok(keep);
            }
            let n = int_of(OP, "output_size", v)?;
            usize::try_from(n).map_err(|_| {
                PyValueError::new_err(format!(
                    "adaptive_avg_pool2d(): output_size must be non-negative, got {n}"
                ))
            })
        };
        (one(&items[0], h)?, one(&items[1], w)?)
    };
    wrap(py, &input.a, input.a.adaptive_avg_pool2d(size))
}

/// `torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=None,
/// dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False)`; `dropout_p` other than 0
/// and `enable_gqa=True` are refused.
#[pyfunction]
#[pyo3(signature = (query, key, value, attn_mask=None, dropout_p=0.0, is_causal=false, scale=None, enable_gqa=false))]
#[allow(clippy::too_many_arguments)]
fn scaled_dot_product_attention(
    py: Python<'_>,
    query: PyRef<'_, PyArr>,
    key: PyRef<'_, PyArr>,
    value: PyRef<'_, PyArr>,
    attn_mask: Option<PyRef<'_, PyArr>>,
    dropout_p: f64,
    is_causal: bool,
    scale: Option<f64>,
    enable_gqa: bool,
) -> PyResult<PyArr> {
    if enable_gqa {
        let e = crate::Error::InvalidOperands {
            op: "scaled_dot_product_attention".into(),
            detail: "enable_gqa=True is not supported: repeat the key and value heads first".into(),
        };
        return wrap(py, &query.a, Err(e));
    }
    let r = query.a.scaled_dot_product_attention(
        &key.a,
        &value.a,
        attn_mask.as_ref().map(|m| &m.a),
        dropout_p,
        is_causal,
        scale,
    );
    wrap(py, &query.a, r)
}

/// Add this file's functions to the native module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(matmul, m)?)?;
    m.add_function(wrap_pyfunction!(mm, m)?)?;
    m.add_function(wrap_pyfunction!(bmm, m)?)?;
    m.add_function(wrap_pyfunction!(addmm, m)?)?;
    m.add_function(wrap_pyfunction!(baddbmm, m)?)?;
    m.add_function(wrap_pyfunction!(dot, m)?)?;
    m.add_function(wrap_pyfunction!(outer, m)?)?;
    m.add_function(wrap_pyfunction!(linear, m)?)?;
    m.add_function(wrap_pyfunction!(conv2d, m)?)?;
    m.add_function(wrap_pyfunction!(max_pool2d, m)?)?;
    m.add_function(wrap_pyfunction!(avg_pool2d, m)?)?;
    m.add_function(wrap_pyfunction!(adaptive_avg_pool2d, m)?)?;
    m.add_function(wrap_pyfunction!(scaled_dot_product_attention, m)?)?;
    Ok(())
}
