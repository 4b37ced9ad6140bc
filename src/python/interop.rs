//! Values between Python and the VM: NumPy arrays of every eagervm dtype to arrays and
//! back, Python numbers to scalars and back, and `eagervm.tensor`'s data (nested
//! sequences, NumPy arrays, numbers) with PyTorch's dtype inference.
//!
//! Each dtype goes to and from NumPy's of the same name; `bfloat16` is NumPy's through the
//! `ml_dtypes` package, where it is installed (`python::dtype`). The copies in and out are
//! the only ones: a NumPy array is written into the instruction that writes the VM array
//! (so the NumPy array may change once the call returns), and a read builds its NumPy
//! array over the bytes read.

use numpy::{
    PyArray1, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt};

use super::args::type_name;
use super::array::PyArr;
use super::dtype::{from_descr, has_bfloat16, no_bfloat16, unsupported_descr};
use super::issue::{issued, read};
use crate::eager::{Array, Context, DEFAULT_FLOAT};
use crate::ep::DeviceId;
use crate::framework::{bf16, f16, Attrs, DType, Element, Scalar};
use crate::Error;

/// `data` as a NumPy array (`TypeError` for anything else).
pub(crate) fn ndarray<'a, 'py>(data: &'a Bound<'py, PyAny>) -> PyResult<&'a Bound<'py, PyUntypedArray>> {
    data.downcast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a numpy.ndarray, got {}; wrap it with numpy.asarray(...), or use eagervm.tensor(...)",
            type_name(data)
        ))
    })
}

/// The eagervm dtype of a NumPy array (`TypeError` for one eagervm has not).
pub(crate) fn dtype_of(arr: &Bound<'_, PyUntypedArray>) -> PyResult<DType> {
    let descr = arr.dtype();
    from_descr(arr.py(), &descr).ok_or_else(|| unsupported_descr(&descr))
}

/// A new array of `cx` holding a copy of `data` (a NumPy array of any eagervm dtype, in
/// any layout: one that is not C-contiguous is made so first), on `device`: written on the
/// host, then copied to `device` on its host-to-device stream.
pub(crate) fn from_ndarray(
    py: Python<'_>,
    cx: &Context,
    data: &Bound<'_, PyAny>,
    device: DeviceId,
) -> PyResult<Array> {
    let arr = ndarray(data)?;
    let dtype = dtype_of(arr)?;
    let contiguous;
    let arr = if arr.is_c_contiguous() && arr.dtype().is_native_byteorder().unwrap_or(true) {
        arr
    } else {
        // `astype` keeps a 0-d array 0-d (`ascontiguousarray` makes it 1-d).
        let native = arr.dtype().call_method1("newbyteorder", ("=",))?;
        let kw = pyo3::types::PyDict::new(py);
        kw.set_item("order", "C")?;
        contiguous = arr.call_method("astype", (native,), Some(&kw))?;
        ndarray(&contiguous)?
    };
    let shape = arr.shape().to_vec();
    macro_rules! write {
        ($t:ty) => {{
            let a = arr.downcast::<PyArrayDyn<$t>>()?.readonly();
            let slice = a.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
            // The data is copied into the write instruction: the NumPy array may change
            // once this returns.
            issued(py, cx, cx.from_slice(slice, &shape, device))
        }};
    }
    match dtype {
        DType::Bool => write!(bool),
        DType::U8 => write!(u8),
        DType::I32 => write!(i32),
        DType::I64 => write!(i64),
        DType::F16 => write!(f16),
        DType::BF16 => write!(bf16),
        DType::F32 => write!(f32),
        DType::F64 => write!(f64),
    }
}

/// `a`'s values as a new NumPy array of its dtype (waits for them; raises the error the
/// array carries). An array on a device is copied to the host first.
pub(crate) fn to_ndarray<'py>(py: Python<'py>, a: &Array) -> PyResult<Bound<'py, PyAny>> {
    if a.dtype() == DType::BF16 && !has_bfloat16(py) {
        return Err(no_bfloat16());
    }
    let bytes = read(py, a)?;
    let shape = a.shape().to_vec();
    let id = a.id();
    macro_rules! values {
        ($t:ty) => {{
            let v = <$t as Element>::try_from_bytes(&bytes).map_err(|e| {
                super::errors::to_py(Error::Access {
                    tensor: id,
                    detail: format!("out of memory for {} bytes of values ({e})", bytes.len()),
                })
            })?;
            PyArray1::from_vec(py, v).reshape(shape)?.into_any()
        }};
    }
    Ok(match a.dtype() {
        DType::Bool => values!(bool),
        DType::U8 => values!(u8),
        DType::I32 => values!(i32),
        DType::I64 => values!(i64),
        DType::F16 => values!(f16),
        DType::BF16 => values!(bf16),
        DType::F32 => values!(f32),
        DType::F64 => values!(f64),
    })
}

/// The one element of a one-element array, as a Python `bool`, `int` or `float`.
pub(crate) fn item(py: Python<'_>, a: &Array) -> PyResult<PyObject> {
    if a.numel() != 1 {
        return Err(super::errors::to_py(Error::Access {
            tensor: a.id(),
            detail: format!(
                "has {} elements; item reads a one-element array (shape {:?})",
                a.numel(),
                a.shape()
            ),
        }));
    }
    let b = read(py, a)?;
    let value = |n: usize| -> PyResult<&[u8]> {
        b.get(..n)
            .ok_or_else(|| PyValueError::new_err(format!("read {} bytes of a {n}-byte element", b.len())))
    };
    macro_rules! num {
        ($t:ty) => {
            <$t>::from_ne_bytes(value(std::mem::size_of::<$t>())?.try_into().expect("the element's bytes"))
        };
    }
    Ok(match a.dtype() {
        DType::Bool => (value(1)?[0] != 0).into_pyobject(py)?.to_owned().into_any().unbind(),
        DType::U8 => i64::from(value(1)?[0]).into_pyobject(py)?.into_any().unbind(),
        DType::I32 => i64::from(num!(i32)).into_pyobject(py)?.into_any().unbind(),
        DType::I64 => num!(i64).into_pyobject(py)?.into_any().unbind(),
        DType::F16 => f64::from(num!(f16)).into_pyobject(py)?.into_any().unbind(),
        DType::BF16 => f64::from(num!(bf16)).into_pyobject(py)?.into_any().unbind(),
        DType::F32 => f64::from(num!(f32)).into_pyobject(py)?.into_any().unbind(),
        DType::F64 => num!(f64).into_pyobject(py)?.into_any().unbind(),
    })
}

/// `v` as a scalar operand, if it is a number: a Python `bool`, `int` or `float`, or a
/// NumPy scalar of a bool, integer or floating type. An `int` beyond 64 bits is a
/// `ValueError` (PyTorch cannot hold it either).
pub(crate) fn scalar_of(v: &Bound<'_, PyAny>) -> PyResult<Option<Scalar>> {
    if v.is_instance_of::<PyBool>() {
        return Ok(Some(Scalar::Bool(v.is_truthy()?)));
    }
    if v.is_instance_of::<PyInt>() {
        return match v.extract::<i64>() {
            Ok(i) => Ok(Some(Scalar::Int(i))),
            Err(_) => Err(PyValueError::new_err(format!("the integer {v} does not fit in 64 bits"))),
        };
    }
    if v.is_instance_of::<PyFloat>() {
        return Ok(Some(Scalar::Float(v.extract::<f64>()?)));
    }
    if v.is_instance_of::<PyArr>() {
        return Ok(None);
    }
    // A NumPy scalar (`np.float32(2)`, `np.int64(3)`, `np.bool_(True)`), by its dtype's kind.
    let np = match v.py().import("numpy") {
        Ok(np) => np,
        Err(_) => return Ok(None),
    };
    if !v.is_instance(&np.getattr("generic")?)? {
        return Ok(None);
    }
    let kind: String = v.getattr("dtype")?.getattr("kind")?.extract()?;
    Ok(match kind.as_str() {
        "b" => Some(Scalar::Bool(v.is_truthy()?)),
        "i" | "u" => scalar_of(&v.call_method0("item")?)?,
        "f" => Some(Scalar::Float(v.call_method1("__float__", ())?.extract()?)),
        _ => None,
    })
}

/// `eagervm.tensor(data, dtype, device)` on `cx`: a new array holding a copy of `data`.
/// An eagervm array or a NumPy array keeps its dtype; other data (numbers, nested
/// sequences) goes through `numpy.asarray` and takes PyTorch's dtype: `bool` for booleans,
/// `int64` for integers, the default float dtype (`float32`) where a float is among them.
/// `dtype` converts the values on the VM afterwards (`Array::to_dtype`).
pub(crate) fn tensor(
    py: Python<'_>,
    cx: &Context,
    data: &Bound<'_, PyAny>,
    dtype: Option<DType>,
    device: Option<DeviceId>,
) -> PyResult<Array> {
    let a = if let Ok(src) = data.downcast::<PyArr>() {
        let src = &src.get().a;
        let device = device.unwrap_or_else(|| src.device());
        if src.context().same(cx) {
            // A copy, as PyTorch's `tensor(t)` (which warns to use `clone()`).
            let c = issued(py, cx, src.copy())?;
            issued(py, cx, c.to(device))?
        } else {
            from_ndarray(py, cx, &to_ndarray(py, src)?, device)?
        }
    } else if data.downcast::<PyUntypedArray>().is_ok() {
        from_ndarray(py, cx, data, device.unwrap_or(DeviceId::CPU))?
    } else if data.is_instance(&py.import("numpy")?.getattr("generic")?)? {
        // A NumPy scalar keeps its dtype, as a NumPy array does.
        let arr = py.import("numpy")?.getattr("asarray")?.call1((data,))?;
        from_ndarray(py, cx, &arr, device.unwrap_or(DeviceId::CPU))?
    } else {
        let np = py.import("numpy")?;
        let arr = np.getattr("asarray")?.call1((data,)).map_err(|e| {
            PyTypeError::new_err(format!("eagervm.tensor could not read {}: {e}", type_name(data)))
        })?;
        let descr = ndarray(&arr)?.dtype();
        let arr = if dtype.is_none() && descr.kind() == b'f' && from_descr(py, &descr) != Some(DEFAULT_FLOAT)
        {
            // Python floats are float64 to NumPy, the default float dtype to PyTorch.
            arr.call_method1("astype", (DEFAULT_FLOAT.torch_name(),))?
        } else if descr.kind() == b'O' || descr.kind() == b'U' || descr.kind() == b'S' {
            return Err(PyTypeError::new_err(format!(
                "eagervm.tensor takes numbers, nested sequences of numbers and arrays, not {} (NumPy read it as {descr})",
                type_name(data)
            )));
        } else {
            arr
        };
        from_ndarray(py, cx, &arr, device.unwrap_or(DeviceId::CPU))?
    };
    match dtype {
        Some(d) if d != a.dtype() => issued(py, cx, a.to_dtype(d)),
        _ => Ok(a),
    }
}

/// The attributes of a call given `scalar` (a Python number, or `None`).
pub(crate) fn scalar_attrs(scalar: Option<&Bound<'_, PyAny>>) -> PyResult<Attrs> {
    match scalar {
        None => Ok(Attrs::default()),
        Some(v) if v.is_none() => Ok(Attrs::default()),
        Some(v) => match scalar_of(v)? {
            Some(s) => Ok(Attrs::of(s)),
            None => Err(PyTypeError::new_err(format!("scalar must be a number, not {}", type_name(v)))),
        },
    }
}
