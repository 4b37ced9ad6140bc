//! `eagervm.Stream` and `eagervm.Program`: the instruction-list API, calls on explicit
//! streams, built through the VM's one context ([`Context::build`]), so that they and the
//! eager calls reach the VM in the order Python made them.

use std::sync::atomic::{AtomicBool, Ordering};

use numpy::{PyArrayDyn, PyArrayMethods, PyUntypedArrayMethods};
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use super::array::PyArr;
use super::interop::{dtype_of, ndarray, scalar_attrs};
use super::issue::{flush, issued};
use crate::eager::{Array, Context};
use crate::ep::{DeviceId, StreamType};
use crate::framework::{bf16, f16, DType, Tensor};
use crate::vm::StreamId;

/// A stream of a VM: a device and a stream type.
#[pyclass(frozen, name = "Stream", module = "eagervm")]
pub(crate) struct PyStream {
    /// The context of the VM it belongs to (to refuse a stream of another VM).
    cx: Context,
    id: StreamId,
    device: DeviceId,
    ty: StreamType,
    name: String,
}

impl PyStream {
    /// The stream `id` of `cx`'s VM.
    pub(crate) fn of(cx: &Context, id: StreamId) -> PyResult<PyStream> {
        let (_, device, ty, name) = cx
            .vm()
            .streams()
            .into_iter()
            .find(|s| s.0 == id)
            .ok_or_else(|| PyValueError::new_err("no such stream"))?;
        Ok(PyStream { cx: cx.clone(), id, device, ty, name })
    }
}

#[pymethods]
impl PyStream {
    /// The stream's device.
    #[getter]
    fn device(&self) -> String {
        self.device.to_string()
    }
    /// `"compute"`, `"h2d"` or `"d2h"`.
    #[getter]
    fn r#type(&self) -> &'static str {
        self.ty.name()
    }
    /// The stream's name (`"mock:0:compute"`, ...).
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }
    /// The stream's index in the VM's stream table.
    #[getter]
    fn index(&self) -> usize {
        self.id.index()
    }
    fn __repr__(&self) -> String {
        format!("Stream({})", self.name)
    }
}

/// The instruction-list API: calls on explicit streams, through the VM's context (the
/// same open builder the eager methods use, so all calls reach the VM in the order they
/// were made). As a context manager its exit hands what was built to the VM, as the end of
/// a `VirtualMachine::run` closure does; calls after the exit raise `RuntimeError`.
#[pyclass(frozen, name = "Program", module = "eagervm")]
pub(crate) struct Program {
    cx: Context,
    closed: AtomicBool,
}

impl Program {
    pub(crate) fn new(cx: Context) -> Program {
        Program { cx, closed: AtomicBool::new(false) }
    }

    fn check_open(&self) -> PyResult<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(PyRuntimeError::new_err("the program is closed (its `with` block has ended)"));
        }
        Ok(())
    }

    fn check(&self, stream: &PyStream) -> PyResult<()> {
        self.check_open()?;
        if !stream.cx.same(&self.cx) {
            return Err(PyValueError::new_err(format!("{} is a stream of another VM", stream.name)));
        }
        Ok(())
    }

    /// Build `f`'s call on the context, which flushes the contexts of `inputs` first.
    fn build<R>(
        &self,
        py: Python<'_>,
        inputs: &[PyRef<'_, PyArr>],
        f: impl FnOnce(&mut crate::framework::InstructionsBuilder<'static>, &[&Tensor]) -> crate::Result<R>,
    ) -> PyResult<R> {
        let arrays: Vec<&Array> = inputs.iter().map(|a| &a.a).collect();
        let ins: Vec<&Tensor> = arrays.iter().map(|a| a.tensor_unflushed()).collect();
        issued(py, &self.cx, self.cx.build(&arrays, |b| f(b, &ins)))
    }
}

#[pymethods]
impl Program {
    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(&self, py: Python<'_>, _args: &Bound<'_, pyo3::types::PyTuple>) -> bool {
        self.close(py);
        false
    }

    /// Hand what was built to the VM and close the program.
    fn close(&self, py: Python<'_>) {
        self.closed.store(true, Ordering::Relaxed);
        flush(py, &self.cx);
    }

    /// Call a single-output op on `stream`, creating its output.
    #[pyo3(signature = (op, inputs, stream, scalar=None))]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        stream: PyRef<'_, PyStream>,
        scalar: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        self.check(&stream)?;
        let op = issued(py, &self.cx, self.cx.vm().op(op))?;
        let attrs = scalar_attrs(scalar)?;
        let t = self.build(py, &inputs, |b, ins| b.call(op, ins, attrs, stream.id))?;
        Ok(PyArr { a: self.cx.wrap(t) })
    }

    /// Call an op on `stream`, creating its outputs; returns them in order.
    #[pyo3(signature = (op, inputs, stream, scalar=None))]
    fn call_multi(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        stream: PyRef<'_, PyStream>,
        scalar: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<PyArr>> {
        self.check(&stream)?;
        let op = issued(py, &self.cx, self.cx.vm().op(op))?;
        let attrs = scalar_attrs(scalar)?;
        let outs = self.build(py, &inputs, |b, ins| b.call_multi(op, ins, attrs, stream.id))?;
        Ok(outs.into_iter().map(|t| PyArr { a: self.cx.wrap(t) }).collect())
    }

    /// Call an op on `stream`, writing into the given `outputs` (of the shapes and dtypes
    /// the op makes, on the stream's device; `VM.empty` makes them).
    #[pyo3(signature = (op, inputs, outputs, stream, scalar=None))]
    fn call_into(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        outputs: Vec<PyRef<'_, PyArr>>,
        stream: PyRef<'_, PyStream>,
        scalar: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        self.check(&stream)?;
        let op = issued(py, &self.cx, self.cx.vm().op(op))?;
        let attrs = scalar_attrs(scalar)?;
        let outs: Vec<&Tensor> = outputs.iter().map(|a| a.a.tensor_unflushed()).collect();
        self.build(py, &inputs, |b, ins| b.call_into(op, ins, &outs, attrs, stream.id))
    }

    /// Overwrite the host array `array` with `data` (a NumPy array of its dtype and
    /// element count; copied).
    fn write(&self, py: Python<'_>, array: PyRef<'_, PyArr>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        self.check_open()?;
        let arr = ndarray(data)?;
        let dtype = dtype_of(arr)?;
        let contiguous;
        let arr = if arr.is_c_contiguous() {
            arr
        } else {
            contiguous = arr.call_method0("copy")?;
            ndarray(&contiguous)?
        };
        let t = array.a.tensor_unflushed();
        macro_rules! write {
            ($t:ty) => {{
                let a = arr.downcast::<PyArrayDyn<$t>>()?.readonly();
                let s = a.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
                issued(py, &self.cx, self.cx.build(&[&array.a], |b| b.write(t, s)))
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
}
