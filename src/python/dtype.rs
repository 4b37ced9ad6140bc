//! `eagervm.dtype` and `eagervm.device`: PyTorch's dtype and device objects, and the
//! conversions of the arguments that name them (an eagervm dtype, a NumPy dtype or type, a
//! name such as `"float32"`, a Python type; a device object or string).
//!
//! A dtype object compares equal to NumPy's dtype of the same name, where NumPy has one
//! (`eagervm.float32 == np.float32 == np.dtype("float32")`), and hashes as that NumPy dtype
//! does, so either finds the other in a dict. There is one object per dtype, so `is` works
//! as in PyTorch (`x.dtype is eagervm.float32`). `bfloat16` is NumPy's only once `ml_dtypes`
//! is importable (it registers the type with NumPy).

use numpy::{PyArrayDescr, PyArrayDescrMethods};
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::pyclass::CompareOp;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyString, PyType};

use super::errors::bad_device;
use crate::ep::{DeviceId, DeviceType};
use crate::framework::DType;

/// A dtype (`eagervm.float32`, ...): PyTorch's `torch.dtype`.
#[pyclass(frozen, name = "dtype", module = "eagervm")]
pub(crate) struct PyDType {
    pub(crate) d: DType,
}

/// The one object of each dtype, in `DType::ALL`'s order.
static DTYPES: GILOnceCell<[Py<PyDType>; 8]> = GILOnceCell::new();

/// The object of `d`.
pub(crate) fn dtype_object(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyDType>> {
    let all = DTYPES.get_or_try_init(py, || -> PyResult<[Py<PyDType>; 8]> {
        let mut v = Vec::with_capacity(8);
        for d in DType::ALL {
            v.push(Py::new(py, PyDType { d })?);
        }
        Ok(v.try_into().unwrap_or_else(|_| unreachable!("eight dtypes")))
    })?;
    let i = DType::ALL.iter().position(|&x| x == d).unwrap_or_else(|| unreachable!("every dtype is in ALL"));
    Ok(all[i].bind(py).clone())
}

/// The NumPy dtype of `d`, or `None` for `bfloat16` without `ml_dtypes`.
pub(crate) fn numpy_descr(py: Python<'_>, d: DType) -> Option<Bound<'_, PyArrayDescr>> {
    if d == DType::BF16 && !has_bfloat16(py) {
        return None;
    }
    // NumPy names every dtype as PyTorch does.
    PyArrayDescr::new(py, d.torch_name()).ok()
}

/// Whether NumPy knows `bfloat16` (`ml_dtypes` imported, or importable now).
pub(crate) fn has_bfloat16(py: Python<'_>) -> bool {
    static LOADED: GILOnceCell<bool> = GILOnceCell::new();
    *LOADED.get_or_init(py, || py.import("ml_dtypes").is_ok())
}

/// The error for a `bfloat16` array where NumPy has no such type.
pub(crate) fn no_bfloat16() -> PyErr {
    PyTypeError::new_err(
        "NumPy has no bfloat16 without the ml_dtypes package (pip install ml_dtypes); or convert with .float() first",
    )
}

/// The eagervm dtype of a NumPy dtype (in either byte order), if it is one of ours.
pub(crate) fn from_descr(py: Python<'_>, descr: &Bound<'_, PyArrayDescr>) -> Option<DType> {
    let native;
    let descr = if descr.is_native_byteorder() == Some(false) {
        native = descr.call_method1("newbyteorder", ("=",)).ok()?.downcast_into::<PyArrayDescr>().ok()?;
        &native
    } else {
        descr
    };
    macro_rules! is {
        ($t:ty) => {
            descr.is_equiv_to(&numpy::dtype::<$t>(py))
        };
    }
    Some(if is!(f32) {
        DType::F32
    } else if is!(i64) {
        DType::I64
    } else if is!(f64) {
        DType::F64
    } else if is!(i32) {
        DType::I32
    } else if is!(bool) {
        DType::Bool
    } else if is!(u8) {
        DType::U8
    } else if is!(half::f16) {
        DType::F16
    } else if descr.typeobj().name().is_ok_and(|n| n == "bfloat16") && descr.itemsize() == 2 {
        DType::BF16
    } else {
        return None;
    })
}

/// The error for a NumPy dtype that has no eagervm dtype.
pub(crate) fn unsupported_descr(descr: &Bound<'_, PyArrayDescr>) -> PyErr {
    PyTypeError::new_err(format!(
        "eagervm has no dtype for NumPy's {descr}: its dtypes are bool, uint8, int32, int64, float16, bfloat16, float32 and float64"
    ))
}

/// A dtype argument: an eagervm dtype, a name (`"float32"`, PyTorch's aliases `"float"`,
/// `"long"`, ...), a NumPy dtype or scalar type, or a Python type (`float` is float64, `int`
/// int64, `bool` bool, as in PyTorch).
pub(crate) fn dtype_arg(v: &Bound<'_, PyAny>) -> PyResult<DType> {
    let py = v.py();
    if let Ok(d) = v.downcast::<PyDType>() {
        return Ok(d.get().d);
    }
    if let Ok(s) = v.downcast::<PyString>() {
        if let Some(d) = DType::from_name(&s.to_cow()?) {
            return Ok(d);
        }
    }
    let descr = PyArrayDescr::new(py, v).map_err(|_| {
        PyTypeError::new_err(format!(
            "dtype must be an eagervm dtype (eagervm.float32, ...), a NumPy dtype or a dtype name, not {}",
            v.repr().map(|r| r.to_string()).unwrap_or_else(|_| "?".into())
        ))
    })?;
    from_descr(py, &descr).ok_or_else(|| unsupported_descr(&descr))
}

/// An optional dtype argument (`None` is none).
pub(crate) fn opt_dtype(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DType>> {
    match v {
        Some(v) if !v.is_none() => dtype_arg(v).map(Some),
        _ => Ok(None),
    }
}

#[pymethods]
impl PyDType {
    fn __repr__(&self) -> String {
        format!("eagervm.{}", self.d.torch_name())
    }

    /// Equal to the same dtype, to NumPy's dtype of that name, and to anything `numpy.dtype`
    /// turns into it (`np.float32`, `"float32"`).
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<PyObject> {
        let py = other.py();
        let same = if let Ok(o) = other.downcast::<PyDType>() {
            Some(o.get().d == self.d)
        } else if other.is_none() {
            None
        } else {
            // Not a dtype NumPy knows: not equal, as NumPy's dtypes answer.
            PyArrayDescr::new(py, other).ok().map(|d| from_descr(py, &d) == Some(self.d))
        };
        Ok(match (op, same) {
            (CompareOp::Eq, Some(s)) => s.into_pyobject(py)?.to_owned().into_any().unbind(),
            (CompareOp::Ne, Some(s)) => (!s).into_pyobject(py)?.to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        })
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        match numpy_descr(py, self.d) {
            Some(d) => d.hash(),
            None => PyString::new(py, self.d.torch_name()).hash(),
        }
    }

    /// Whether the dtype is a floating-point type.
    #[getter]
    fn is_floating_point(&self) -> bool {
        self.d.is_floating()
    }

    /// Always false: eagervm has no complex dtypes.
    #[getter]
    fn is_complex(&self) -> bool {
        false
    }

    /// Whether the dtype holds negative values (every dtype but `bool` and `uint8`).
    #[getter]
    fn is_signed(&self) -> bool {
        !matches!(self.d, DType::Bool | DType::U8)
    }

    /// Bytes per element.
    #[getter]
    fn itemsize(&self) -> usize {
        self.d.size()
    }

    /// The NumPy dtype of the same name (`numpy.dtype(eagervm.float32)`).
    #[getter]
    fn numpy_dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyArrayDescr>> {
        numpy_descr(py, self.d).ok_or_else(no_bfloat16)
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyAny>, (&'static str,))> {
        Ok((py.import("eagervm")?.getattr("_dtype_named")?, (self.d.torch_name(),)))
    }
}

/// A device (`eagervm.device("mock:0")`): PyTorch's `torch.device`, with eagervm's device
/// strings (`cpu:0`, `mock:N`, `cuda:N`; `"cpu"` is `cpu:0`, `"cuda"` `cuda:0`).
#[pyclass(frozen, name = "device", module = "eagervm")]
#[derive(Clone, Copy)]
pub(crate) struct PyDevice {
    pub(crate) d: DeviceId,
}

/// A device argument: an `eagervm.device`, a device string, or an integer (CUDA's device
/// of that index, as in PyTorch).
pub(crate) fn device_arg(v: &Bound<'_, PyAny>) -> PyResult<DeviceId> {
    if let Ok(d) = v.downcast::<PyDevice>() {
        return Ok(d.get().d);
    }
    if let Ok(s) = v.downcast::<PyString>() {
        return parse_device(&s.to_cow()?);
    }
    if let Ok(i) = v.extract::<u16>() {
        return Ok(DeviceId::cuda(i));
    }
    Err(PyTypeError::new_err(format!(
        "device must be an eagervm.device, a string such as \"cpu\" or \"mock:0\", or a CUDA device index, not {}",
        v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
    )))
}

/// An optional device argument (`None` is none).
pub(crate) fn opt_device(v: Option<&Bound<'_, PyAny>>) -> PyResult<Option<DeviceId>> {
    match v {
        Some(v) if !v.is_none() => device_arg(v).map(Some),
        _ => Ok(None),
    }
}

/// A device string (`"cpu:0"`, `"mock:1"`, `"cuda:0"`; `"cpu"` is `"cpu:0"`).
pub(crate) fn parse_device(s: &str) -> PyResult<DeviceId> {
    s.parse().map_err(bad_device)
}

#[pymethods]
impl PyDevice {
    #[new]
    #[pyo3(signature = (r#type, index=None))]
    fn new(r#type: &Bound<'_, PyAny>, index: Option<u16>) -> PyResult<Self> {
        let d = device_arg(r#type)?;
        Ok(PyDevice {
            d: match index {
                Some(i) => DeviceId { index: i, ..d },
                None => d,
            },
        })
    }

    /// `"cpu"`, `"mock"` or `"cuda"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        match self.d.ty {
            DeviceType::Cpu => "cpu",
            DeviceType::Mock => "mock",
            DeviceType::Cuda => "cuda",
        }
    }

    /// The device's index.
    #[getter]
    fn index(&self) -> u16 {
        self.d.index
    }

    fn __str__(&self) -> String {
        self.d.to_string()
    }

    fn __repr__(&self) -> String {
        format!("device(type='{}', index={})", self.r#type(), self.d.index)
    }

    /// Equal to the same device and to a string naming it (`x.device == "cpu:0"`).
    fn __richcmp__(&self, other: &Bound<'_, PyAny>, op: CompareOp) -> PyResult<PyObject> {
        let py = other.py();
        let same = if let Ok(o) = other.downcast::<PyDevice>() {
            Some(o.get().d == self.d)
        } else if let Ok(s) = other.downcast::<PyString>() {
            Some(s.to_cow().ok().and_then(|s| s.parse::<DeviceId>().ok()) == Some(self.d))
        } else {
            None
        };
        Ok(match (op, same) {
            (CompareOp::Eq, Some(s)) => s.into_pyobject(py)?.to_owned().into_any().unbind(),
            (CompareOp::Ne, Some(s)) => (!s).into_pyobject(py)?.to_owned().into_any().unbind(),
            _ => py.NotImplemented(),
        })
    }

    fn __hash__(&self, py: Python<'_>) -> PyResult<isize> {
        PyString::new(py, &self.d.to_string()).hash()
    }

    fn __reduce__<'py>(&self, py: Python<'py>) -> PyResult<(Bound<'py, PyType>, (String,))> {
        Ok((py.get_type::<PyDevice>(), (self.d.to_string(),)))
    }
}
