//! `eagervm.Array`: a handle to a VM tensor, with the eager ops as methods and operators.
//!
//! Each op is one builder call on the compute stream of the array's device, made at once
//! and run later by the VM; it returns the new array at once, or raises the typed error
//! that refused it. Reads and waits (`numpy`, `item`, `wait`) flush the open builder and
//! wait with the GIL released (`wait`). The class is frozen: a `Tensor` handle is `Send`
//! and `Sync`, and the builder it is used with is behind a mutex (`shared`), so arrays can
//! be used from several Python threads.

use std::sync::Arc;

use numpy::{
    PyArrayDescr, PyArrayDescrMethods, PyArrayDyn, PyArrayMethods, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyFloat, PyInt, PyTuple};

use super::errors::{bad_device, IntoPy};
use super::shared::Shared;
use crate::ep::{DeviceId, StreamType};
use crate::framework::virtual_machine::HostAccess;
use crate::framework::{Attrs, DType, Op, Tensor};
use crate::{Error, Result};

/// An eager array of one VM.
#[pyclass(frozen, name = "Array", module = "eagervm")]
pub(crate) struct PyArr {
    pub(crate) shared: Arc<Shared>,
    pub(crate) t: Tensor,
}

/// An array's values, read back.
pub(crate) enum Values {
    F32(Vec<f32>),
    I64(Vec<i64>),
}

impl Values {
    /// A NumPy array of `shape` that owns these values (no copy).
    fn into_numpy<'py>(self, py: Python<'py>, shape: &[usize]) -> PyResult<Bound<'py, PyAny>> {
        Ok(match self {
            Values::F32(v) => numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
            Values::I64(v) => numpy::PyArray1::from_vec(py, v).reshape(shape)?.into_any(),
        })
    }
}

/// The NumPy dtype of `d`.
pub(crate) fn numpy_dtype(py: Python<'_>, d: DType) -> PyResult<Bound<'_, PyArrayDescr>> {
    // NumPy names every dtype as PyTorch does; `bfloat16` exists once `ml_dtypes` is loaded.
    PyArrayDescr::new(py, d.torch_name())
}

/// The error for an array of a dtype the conversions to and from NumPy do not take.
pub(crate) fn unconverted(d: DType) -> PyErr {
    PyTypeError::new_err(format!(
        "arrays of {d} do not convert to or from NumPy; cast with .to(eagervm.float32) first"
    ))
}

/// The VM dtype of a NumPy dtype (or anything `numpy.dtype()` takes: `np.float32`,
/// `"int64"`, ...); a `TypeError` naming the two dtypes the VM has otherwise.
pub(crate) fn vm_dtype(py: Python<'_>, d: &Bound<'_, PyAny>) -> PyResult<DType> {
    let d = PyArrayDescr::new(py, d)?;
    if d.is_equiv_to(&numpy::dtype::<f32>(py)) {
        Ok(DType::F32)
    } else if d.is_equiv_to(&numpy::dtype::<i64>(py)) {
        Ok(DType::I64)
    } else {
        Err(PyTypeError::new_err(format!(
            "eagervm arrays hold float32 or int64, not {d}; convert with .astype(numpy.float32)"
        )))
    }
}

/// A device string (`"cpu:0"`, `"mock:1"`, `"cuda:0"`; `"cpu"` is `"cpu:0"`).
pub(crate) fn parse_device(s: &str) -> PyResult<DeviceId> {
    s.parse().map_err(bad_device)
}

/// Call a single-output `op` on `stream`, through the open builder.
pub(crate) fn call1(
    py: Python<'_>,
    shared: &Arc<Shared>,
    op: Op,
    inputs: &[&Tensor],
    attrs: Attrs,
    stream: crate::vm::StreamId,
) -> PyResult<PyArr> {
    let t = shared.with_builder(py, |b| b.call(op, inputs, attrs, stream)).py_err()?;
    Ok(PyArr { shared: shared.clone(), t })
}

/// A new array holding `data` (a C-contiguous float32 or int64 NumPy array) on `device`: a
/// host write, then a copy on the device's host-to-device stream if it is not the host.
pub(crate) fn from_numpy(
    py: Python<'_>,
    shared: &Arc<Shared>,
    data: &Bound<'_, PyAny>,
    device: DeviceId,
) -> PyResult<PyArr> {
    let arr = data.downcast::<PyUntypedArray>().map_err(|_| {
        PyTypeError::new_err(format!(
            "expected a numpy.ndarray, got {}; wrap it with numpy.asarray(...)",
            data.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        ))
    })?;
    let dtype = vm_dtype(py, arr.dtype().as_any())?;
    if !arr.is_c_contiguous() {
        return Err(PyValueError::new_err("the array is not C-contiguous; pass numpy.ascontiguousarray(x)"));
    }
    let shape = arr.shape().to_vec();
    let vm = shared.vm();
    let host = vm.empty(&shape, dtype, DeviceId::CPU).py_err()?;
    let dst = if device.is_host() { None } else { Some(vm.empty(&shape, dtype, device).py_err()?) };
    let h2d = match device.is_host() {
        true => None,
        false => Some(vm.stream(device, StreamType::H2D).py_err()?),
    };
    let copy = shared.ops.copy;
    // The builder copies the data into the instruction, so the NumPy array may change or
    // go once this returns.
    macro_rules! write {
        ($t:ty) => {{
            let a = arr.downcast::<PyArrayDyn<$t>>()?.readonly();
            let slice = a.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
            shared.with_builder(py, |b| -> Result<()> {
                b.write(&host, slice)?;
                if let (Some(dst), Some(h2d)) = (&dst, h2d) {
                    b.call_into(copy, &[&host], &[dst], Attrs::default(), h2d)?;
                }
                Ok(())
            })
        }};
    }
    match dtype {
        DType::F32 => write!(f32),
        DType::I64 => write!(i64),
        other => return Err(unconverted(other)),
    }
    .py_err()?;
    Ok(PyArr { shared: shared.clone(), t: dst.unwrap_or(host) })
}

impl PyArr {
    fn compute(&self) -> PyResult<crate::vm::StreamId> {
        self.shared.vm().compute_stream(self.t.device()).py_err()
    }

    fn unary(&self, py: Python<'_>, op: Op, attrs: Attrs) -> PyResult<PyArr> {
        call1(py, &self.shared, op, &[&self.t], attrs, self.compute()?)
    }

    fn binary(&self, py: Python<'_>, op: Op, other: &PyArr) -> PyResult<PyArr> {
        call1(py, &self.shared, op, &[&self.t, &other.t], Attrs::default(), self.compute()?)
    }

    /// This array's values (flushes, then waits with the GIL released).
    fn values(&self, py: Python<'_>) -> PyResult<Values> {
        let bytes = self.shared.host_access(py, &self.t, HostAccess::Read)?.py_err()?;
        let t = &self.t;
        Ok(match t.dtype() {
            DType::F32 => Values::F32(t.values_of(&bytes).py_err()?),
            DType::I64 => Values::I64(t.values_of(&bytes).py_err()?),
            other => return Err(unconverted(other)),
        })
    }

    /// An operand of an operator: an array, a Python number (for `*`), or neither.
    fn scalar_of(other: &Bound<'_, PyAny>) -> Option<f64> {
        if other.is_instance_of::<PyFloat>() || other.is_instance_of::<PyInt>() {
            other.extract::<f64>().ok()
        } else {
            None
        }
    }
}

#[pymethods]
impl PyArr {
    /// Dimension sizes.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, self.t.shape())
    }

    /// The NumPy dtype (`float32` or `int64`).
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> Bound<'py, PyArrayDescr> {
        numpy_dtype(py, self.t.dtype()).expect("NumPy has every dtype but bfloat16")
    }

    /// Where the array lives (`"cpu:0"`, `"mock:0"`, ...).
    #[getter]
    fn device(&self) -> String {
        self.t.device().to_string()
    }

    /// Number of dimensions.
    #[getter]
    fn ndim(&self) -> usize {
        self.t.shape().len()
    }

    /// Number of elements.
    #[getter]
    fn size(&self) -> usize {
        self.t.numel()
    }

    /// The tensor's id in its VM (errors and traces name tensors by it).
    #[getter]
    fn id(&self) -> u64 {
        self.t.id()
    }

    fn __repr__(&self) -> String {
        format!(
            "Array(id={}, shape={:?}, dtype={}, device={})",
            self.t.id(),
            self.t.shape(),
            self.t.dtype(),
            self.t.device()
        )
    }

    /// The values as a new NumPy array (waits for them; raises the error the array
    /// carries if an instruction that produced it failed).
    fn numpy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let shape = self.t.shape().to_vec();
        self.values(py)?.into_numpy(py, &shape)
    }

    /// `numpy.asarray(array)`.
    #[pyo3(signature = (dtype=None, copy=None))]
    fn __array__<'py>(
        slf: &Bound<'py, Self>,
        py: Python<'py>,
        dtype: Option<&Bound<'py, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        if copy == Some(false) {
            if !slf.get().t.device().is_host() {
                return Err(PyValueError::new_err(format!(
                    "the array is on {}: NumPy can only view host memory; copy it with .to(\"cpu\")",
                    slf.get().t.device()
                )));
            }
            // A view of the VM's storage, as `numpy.from_dlpack` makes (`docs/python.md`).
            let np = py.import("numpy")?;
            let a = np.getattr("from_dlpack")?.call1((slf,))?;
            return match dtype {
                Some(d) if !a.getattr("dtype")?.eq(d)? => {
                    Err(PyValueError::new_err("a view cannot change the dtype; pass copy=None or copy=True"))
                }
                _ => Ok(a),
            };
        }
        let a = slf.get().numpy(py)?;
        match dtype {
            Some(d) => a.call_method1("astype", (d,)),
            None => Ok(a),
        }
    }

    /// The one element of a one-element array, as a Python number.
    fn item(&self, py: Python<'_>) -> PyResult<PyObject> {
        if self.t.numel() != 1 {
            return Err(super::errors::to_py(Error::Access {
                tensor: self.t.id(),
                detail: format!("has {} elements; item reads a one-element array", self.t.numel()),
            }));
        }
        Ok(match self.values(py)? {
            Values::F32(v) => v[0].into_pyobject(py)?.into_any().unbind(),
            Values::I64(v) => v[0].into_pyobject(py)?.into_any().unbind(),
        })
    }

    /// Wait until the array is computed; raise the error it carries, if any.
    fn wait(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.host_access(py, &self.t, HostAccess::Wait)?.py_err().map(|_| ())
    }

    /// Free the storage now, after every use already made of it; later uses raise
    /// `ReleasedError`.
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.flush(py);
        // The same path as `eager::Array::release`: the VM's release rule orders it after
        // every use already built.
        crate::framework::virtual_machine::release_tensor(self.shared.vm().engine(), &self.t);
        Ok(())
    }

    /// This array on `device`: itself if it is there; otherwise a copy on the
    /// destination's host-to-device stream (to a device) or the source's device-to-host
    /// stream (to the host), as `eager::Array::to`.
    fn to(slf: &Bound<'_, Self>, device: &str) -> PyResult<Py<PyArr>> {
        let py = slf.py();
        let me = slf.get();
        let device = parse_device(device)?;
        let src = me.t.device();
        if src == device {
            return Ok(slf.clone().unbind());
        }
        let vm = me.shared.vm();
        let stream = if device.is_host() {
            vm.stream(src, StreamType::D2H)
        } else {
            vm.stream(device, StreamType::H2D)
        }
        .py_err()?;
        let out = vm.empty(me.t.shape(), me.t.dtype(), device).py_err()?;
        let copy = me.shared.ops.copy;
        me.shared
            .with_builder(py, |b| b.call_into(copy, &[&me.t], &[&out], Attrs::default(), stream))
            .py_err()?;
        Py::new(py, PyArr { shared: me.shared.clone(), t: out })
    }

    /// Matrix product: `[m, k] @ [k, n] -> [m, n]`.
    fn matmul(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.matmul, &other)
    }

    /// `selfᵀ @ other`: `[k, m], [k, n] -> [m, n]`.
    fn matmul_tn(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.matmul_tn, &other)
    }

    /// `self @ otherᵀ`: `[m, k], [n, k] -> [m, n]`.
    fn matmul_nt(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.matmul_nt, &other)
    }

    /// Elementwise sum (same shape and dtype).
    fn add(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.add, &other)
    }

    /// Elementwise difference (same shape and dtype).
    fn sub(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.sub, &other)
    }

    /// Elementwise product (same shape and dtype).
    fn mul(&self, py: Python<'_>, other: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.mul, &other)
    }

    /// `self[i][j] + bias[j]`: a `[k]` bias added to every row of `[n, k]`.
    fn add_bias(&self, py: Python<'_>, bias: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        self.binary(py, self.shared.ops.add_bias, &bias)
    }

    /// `self * factor` (for int64, the factor truncated toward zero).
    fn scale(&self, py: Python<'_>, factor: f64) -> PyResult<PyArr> {
        self.unary(py, self.shared.ops.scale, Attrs::scalar(factor))
    }

    /// `max(self, 0)` elementwise.
    fn relu(&self, py: Python<'_>) -> PyResult<PyArr> {
        self.unary(py, self.shared.ops.relu, Attrs::default())
    }

    /// The gradient of `relu` at `self` given `dy`: `dy` where `self > 0`, else 0.
    fn relu_grad(&self, py: Python<'_>, dy: PyRef<'_, PyArr>) -> PyResult<PyArr> {
        // The kernel takes (dy, x).
        call1(
            py,
            &self.shared,
            self.shared.ops.relu_grad,
            &[&dy.t, &self.t],
            Attrs::default(),
            self.compute()?,
        )
    }

    /// The sum of all elements, as a scalar array (shape `()`).
    fn sum(&self, py: Python<'_>) -> PyResult<PyArr> {
        self.unary(py, self.shared.ops.sum, Attrs::default())
    }

    /// Column sums of `[n, k]`: `[k]`.
    fn sum_rows(&self, py: Python<'_>) -> PyResult<PyArr> {
        self.unary(py, self.shared.ops.sum_rows, Attrs::default())
    }

    fn __add__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match other.downcast::<PyArr>() {
            Ok(o) => {
                Ok(self.binary(py, self.shared.ops.add, o.get())?.into_pyobject(py)?.into_any().unbind())
            }
            Err(_) => Ok(py.NotImplemented()),
        }
    }

    fn __sub__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match other.downcast::<PyArr>() {
            Ok(o) => {
                Ok(self.binary(py, self.shared.ops.sub, o.get())?.into_pyobject(py)?.into_any().unbind())
            }
            Err(_) => Ok(py.NotImplemented()),
        }
    }

    fn __mul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        let r = match other.downcast::<PyArr>() {
            Ok(o) => self.binary(py, self.shared.ops.mul, o.get())?,
            Err(_) => match Self::scalar_of(other) {
                Some(f) => self.unary(py, self.shared.ops.scale, Attrs::scalar(f))?,
                None => return Ok(py.NotImplemented()),
            },
        };
        Ok(r.into_pyobject(py)?.into_any().unbind())
    }

    fn __rmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match Self::scalar_of(other) {
            Some(f) => Ok(self
                .unary(py, self.shared.ops.scale, Attrs::scalar(f))?
                .into_pyobject(py)?
                .into_any()
                .unbind()),
            None => Ok(py.NotImplemented()),
        }
    }

    fn __truediv__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match Self::scalar_of(other) {
            Some(f) if f != 0.0 => Ok(self
                .unary(py, self.shared.ops.scale, Attrs::scalar(1.0 / f))?
                .into_pyobject(py)?
                .into_any()
                .unbind()),
            Some(_) => Err(PyValueError::new_err("division of an eagervm array by zero")),
            None => Ok(py.NotImplemented()),
        }
    }

    fn __neg__(&self, py: Python<'_>) -> PyResult<PyArr> {
        self.unary(py, self.shared.ops.scale, Attrs::scalar(-1.0))
    }

    fn __matmul__(&self, py: Python<'_>, other: &Bound<'_, PyAny>) -> PyResult<PyObject> {
        match other.downcast::<PyArr>() {
            Ok(o) => {
                Ok(self.binary(py, self.shared.ops.matmul, o.get())?.into_pyobject(py)?.into_any().unbind())
            }
            Err(_) => Ok(py.NotImplemented()),
        }
    }

    /// DLPack export (`docs/python.md`, "DLPack"): the array's own storage, lent to the
    /// consumer until the consumer's deleter runs (`python::dlpack`). On the host, once
    /// every instruction issued so far that writes the array has finished; on `cuda:N`, at
    /// once, with the consumer's `stream` made to wait on the device for those writes. A
    /// host copy for an array on `mock:N`, with `copy=True`, or with `dl_device=(1, 0)`.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<&Bound<'py, PyAny>>,
        max_version: Option<&Bound<'py, PyAny>>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyAny>> {
        super::dlpack::export(py, &self.shared, &self.t, stream, max_version, dl_device, copy)
    }

    /// `(2, N)` (DLPack's `kDLCUDA`) for an array on `cuda:N`; `(1, 0)`, the CPU, for every
    /// other array (one on `mock:N` is exported as a host copy).
    fn __dlpack_device__(&self) -> (i32, i32) {
        let d = self.t.device();
        match d.ty {
            crate::ep::DeviceType::Cuda => (super::dlpack::DL_CUDA, i32::from(d.index)),
            _ => (1, 0),
        }
    }
}
