//! `eagervm.VM`, `eagervm.Stream` and `eagervm.Program`: the VM with its configuration,
//! its streams, and the instruction-list API (explicit streams) over the open builder.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt};

use super::array::{call1, from_numpy, parse_device, vm_dtype, PyArr};
use super::errors::IntoPy;
use super::shared::Shared;
use super::trace::{PyProfile, PyRecorder};
use super::wait::wait;
use crate::ep::{DeviceId, StreamType};
use crate::framework::{Attrs, Tensor};
use crate::vm::StreamId;
use crate::vm::ThreadTopology;
use crate::{Config, VirtualMachine};

/// A non-negative integer argument no larger than `max`: `TypeError` for a non-integer,
/// `ValueError` for one out of range.
fn uint(name: &str, v: &Bound<'_, PyAny>, max: u64) -> PyResult<u64> {
    if !v.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "{name} must be an int, not {}",
            v.get_type().name().map(|n| n.to_string()).unwrap_or_else(|_| "?".into())
        )));
    }
    match v.extract::<u64>() {
        Ok(n) if n <= max => Ok(n),
        _ => Err(PyValueError::new_err(format!("{name} must be an integer from 0 to {max}, got {v}"))),
    }
}

/// The thread topology named `s`.
fn topology(s: &str) -> PyResult<ThreadTopology> {
    match s {
        "per_stream" => Ok(ThreadTopology::PerStream),
        "per_device" => Ok(ThreadTopology::PerDevice),
        "single" => Ok(ThreadTopology::Single),
        _ => Err(PyValueError::new_err(format!(
            "threads must be \"per_stream\", \"per_device\" or \"single\", not {s:?}"
        ))),
    }
}

/// A stream type by name.
fn stream_type(s: &str) -> PyResult<StreamType> {
    StreamType::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
        let names: Vec<_> = StreamType::ALL.iter().map(|t| t.name()).collect();
        PyValueError::new_err(format!("unknown stream type {s:?} (expected one of {})", names.join(", ")))
    })
}

/// An eager-execution virtual machine (`docs/python.md`).
#[pyclass(frozen, name = "VM", module = "eagervm")]
pub(crate) struct PyVm {
    shared: Arc<Shared>,
}

impl PyVm {
    fn arr(&self, t: Tensor) -> PyArr {
        PyArr { shared: self.shared.clone(), t }
    }

    fn stream_obj(&self, id: StreamId) -> PyResult<PyStream> {
        let (_, device, ty, name) = self
            .shared
            .vm()
            .streams()
            .into_iter()
            .find(|s| s.0 == id)
            .ok_or_else(|| PyValueError::new_err("no such stream"))?;
        Ok(PyStream { owner: Arc::as_ptr(&self.shared) as usize, id, device, ty, name })
    }

    /// `fill` of a new array on `device`'s compute stream.
    fn filled(
        &self,
        py: Python<'_>,
        shape: Vec<usize>,
        value: f64,
        dtype: &Bound<'_, PyAny>,
        device: &str,
    ) -> PyResult<PyArr> {
        let dtype = vm_dtype(py, dtype)?;
        let device = parse_device(device)?;
        let vm = self.shared.vm();
        let t = vm.empty(&shape, dtype, device).py_err()?;
        let s = vm.compute_stream(device).py_err()?;
        let fill = self.shared.ops.fill;
        self.shared.with_builder(py, |b| b.call_into(fill, &[], &[&t], Attrs::scalar(value), s)).py_err()?;
        Ok(self.arr(t))
    }
}

#[pymethods]
impl PyVm {
    /// Start a VM. Every `Config` field has a keyword; one left `None` keeps the value of
    /// `Config::try_from_env()` (the defaults with the `EAGERVM_*` variables applied); a bad
    /// variable raises `ConfigError` naming it.
    #[new]
    #[pyo3(signature = (*, mock_devices=None, cuda_devices=None, sync=None, threads=None, high_water=None,
        low_water=None, batch_size=None, spin=None, yields=None, event_interval=None, profile=None,
        max_tensor_bytes=None, mock_launch_delay_us=None, mock_jitter_us=None, mock_seed=None,
        fault_skip_stream_wait_every=None, fault_refuse_watcher_threads=None, fault_fail_alloc_one_in=None,
        fault_fail_alloc_seed=None, flush_every=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        mock_devices: Option<&Bound<'_, PyAny>>,
        cuda_devices: Option<&Bound<'_, PyAny>>,
        sync: Option<bool>,
        threads: Option<&str>,
        high_water: Option<&Bound<'_, PyAny>>,
        low_water: Option<&Bound<'_, PyAny>>,
        batch_size: Option<&Bound<'_, PyAny>>,
        spin: Option<&Bound<'_, PyAny>>,
        yields: Option<&Bound<'_, PyAny>>,
        event_interval: Option<&Bound<'_, PyAny>>,
        profile: Option<bool>,
        max_tensor_bytes: Option<&Bound<'_, PyAny>>,
        mock_launch_delay_us: Option<&Bound<'_, PyAny>>,
        mock_jitter_us: Option<&Bound<'_, PyAny>>,
        mock_seed: Option<&Bound<'_, PyAny>>,
        fault_skip_stream_wait_every: Option<&Bound<'_, PyAny>>,
        fault_refuse_watcher_threads: Option<bool>,
        fault_fail_alloc_one_in: Option<&Bound<'_, PyAny>>,
        fault_fail_alloc_seed: Option<&Bound<'_, PyAny>>,
        flush_every: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Self> {
        let mut c = Config::try_from_env().py_err()?;
        let u16max = u16::MAX as u64;
        let u32max = u32::MAX as u64;
        let usize_max = usize::MAX as u64;
        if let Some(v) = mock_devices {
            c.mock_devices = uint("mock_devices", v, u16max)? as u16;
        }
        if let Some(v) = cuda_devices {
            c.cuda_devices = uint("cuda_devices", v, u16max)? as u16;
        }
        if let Some(v) = sync {
            c.synchronous = v;
        }
        if let Some(v) = threads {
            c.threads = topology(v)?;
        }
        if let Some(v) = high_water {
            c.high_water = uint("high_water", v, usize_max)? as usize;
        }
        if let Some(v) = low_water {
            c.low_water = uint("low_water", v, usize_max)? as usize;
        }
        if let Some(v) = batch_size {
            c.batch_size = uint("batch_size", v, usize_max)? as usize;
        }
        if let Some(v) = spin {
            c.spin = uint("spin", v, u32max)? as u32;
        }
        if let Some(v) = yields {
            c.yields = uint("yields", v, u32max)? as u32;
        }
        if let Some(v) = event_interval {
            c.event_interval = uint("event_interval", v, u32max)? as u32;
        }
        if let Some(v) = profile {
            c.profile = v;
        }
        if let Some(v) = max_tensor_bytes {
            c.max_tensor_bytes = uint("max_tensor_bytes", v, u64::MAX)?;
        }
        if let Some(v) = mock_launch_delay_us {
            c.mock.launch_delay = Duration::from_micros(uint("mock_launch_delay_us", v, u64::MAX)?);
        }
        if let Some(v) = mock_jitter_us {
            c.mock.jitter = Duration::from_micros(uint("mock_jitter_us", v, u64::MAX)?);
        }
        if let Some(v) = mock_seed {
            c.mock.seed = uint("mock_seed", v, u64::MAX)?;
        }
        if let Some(v) = fault_skip_stream_wait_every {
            c.fault.skip_stream_wait_every = uint("fault_skip_stream_wait_every", v, u64::MAX)?;
        }
        if let Some(v) = fault_refuse_watcher_threads {
            c.fault.refuse_watcher_threads = v;
        }
        if let Some(v) = fault_fail_alloc_one_in {
            c.fault.fail_alloc_one_in = uint("fault_fail_alloc_one_in", v, u64::MAX)?;
        }
        if let Some(v) = fault_fail_alloc_seed {
            c.fault.fail_alloc_seed = uint("fault_fail_alloc_seed", v, u64::MAX)?;
        }
        let flush_every = match flush_every {
            Some(v) => uint("flush_every", v, usize_max)?.max(1) as usize,
            None => DEFAULT_FLUSH_EVERY,
        };
        // Starting a VM opens devices (CUDA's driver may take a while): without the GIL.
        let vm = py.allow_threads(|| VirtualMachine::new(c)).py_err()?;
        Ok(PyVm { shared: Arc::new(Shared::new(vm, flush_every).py_err()?) })
    }

    fn __repr__(&self) -> String {
        let c = self.shared.vm().config();
        format!(
            "VM(mock_devices={}, cuda_devices={}, sync={})",
            c.mock_devices,
            c.cuda_devices,
            if c.synchronous { "True" } else { "False" }
        )
    }

    /// The configuration the VM runs with, as a dict.
    #[getter]
    fn config<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let c = self.shared.vm().config();
        let d = PyDict::new(py);
        d.set_item("mock_devices", c.mock_devices)?;
        d.set_item("cuda_devices", c.cuda_devices)?;
        d.set_item("sync", c.synchronous)?;
        d.set_item(
            "threads",
            match c.threads {
                ThreadTopology::PerStream => "per_stream",
                ThreadTopology::PerDevice => "per_device",
                ThreadTopology::Single => "single",
            },
        )?;
        d.set_item("high_water", c.high_water)?;
        d.set_item("low_water", c.low_water)?;
        d.set_item("batch_size", c.batch_size)?;
        d.set_item("spin", c.spin)?;
        d.set_item("yields", c.yields)?;
        d.set_item("event_interval", c.event_interval)?;
        d.set_item("profile", c.profile)?;
        d.set_item("max_tensor_bytes", c.max_tensor_bytes)?;
        d.set_item("mock_launch_delay_us", c.mock.launch_delay.as_micros() as u64)?;
        d.set_item("mock_jitter_us", c.mock.jitter.as_micros() as u64)?;
        d.set_item("mock_seed", c.mock.seed)?;
        d.set_item("fault_skip_stream_wait_every", c.fault.skip_stream_wait_every)?;
        d.set_item("fault_refuse_watcher_threads", c.fault.refuse_watcher_threads)?;
        d.set_item("fault_fail_alloc_one_in", c.fault.fail_alloc_one_in)?;
        d.set_item("fault_fail_alloc_seed", c.fault.fail_alloc_seed)?;
        d.set_item("flush_every", self.shared.flush_every())?;
        Ok(d)
    }

    /// A new array holding a copy of `data` (a C-contiguous float32 or int64 NumPy
    /// array), on `device`.
    #[pyo3(signature = (data, device="cpu:0"))]
    fn array(&self, py: Python<'_>, data: &Bound<'_, PyAny>, device: &str) -> PyResult<PyArr> {
        let device = parse_device(device)?;
        from_numpy(py, &self.shared, data, device)
    }

    /// A VM array over `x`'s memory, any DLPack producer of host memory (a NumPy array, a
    /// PyTorch CPU tensor, ...), without a copy where the VM can use it as it is
    /// (`docs/python.md`, "DLPack"); `device` other than the host, a strided, misaligned or
    /// read-only producer, or `copy=True` make one copy.
    #[pyo3(name = "from_dlpack", signature = (x, device=None, copy=None))]
    fn import_dlpack(
        &self,
        py: Python<'_>,
        x: &Bound<'_, PyAny>,
        device: Option<&str>,
        copy: Option<bool>,
    ) -> PyResult<PyArr> {
        let device = device.map(parse_device).transpose()?;
        let t = super::dlpack::import(py, &self.shared, x, device, copy)?;
        Ok(PyArr { shared: self.shared.clone(), t })
    }

    /// A new array of `shape` filled with zeros.
    #[pyo3(signature = (shape, dtype=None, device="cpu:0"))]
    fn zeros(
        &self,
        py: Python<'_>,
        shape: Vec<usize>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: &str,
    ) -> PyResult<PyArr> {
        let f32_ = numpy::dtype::<f32>(py).into_any();
        self.filled(py, shape, 0.0, dtype.unwrap_or(&f32_), device)
    }

    /// A new array of `shape` filled with `value`.
    #[pyo3(signature = (shape, value, dtype=None, device="cpu:0"))]
    fn full(
        &self,
        py: Python<'_>,
        shape: Vec<usize>,
        value: f64,
        dtype: Option<&Bound<'_, PyAny>>,
        device: &str,
    ) -> PyResult<PyArr> {
        let f32_ = numpy::dtype::<f32>(py).into_any();
        self.filled(py, shape, value, dtype.unwrap_or(&f32_), device)
    }

    /// A new array with no value yet (for `Program.call_into` and `Program.write`).
    #[pyo3(signature = (shape, dtype=None, device="cpu:0"))]
    fn empty(
        &self,
        py: Python<'_>,
        shape: Vec<usize>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: &str,
    ) -> PyResult<PyArr> {
        let dtype = match dtype {
            Some(d) => vm_dtype(py, d)?,
            None => crate::framework::DType::F32,
        };
        let t = self.shared.vm().empty(&shape, dtype, parse_device(device)?).py_err()?;
        Ok(self.arr(t))
    }

    /// Call any registered op by name on `device`'s compute stream (default: the first
    /// input's device). `outputs` gives the `(shape, dtype)` of each output for ops whose
    /// outputs the caller chooses (`fill`, `noop`, `fail`); otherwise the op makes them.
    #[pyo3(signature = (op, inputs, scalar=None, outputs=None, device=None))]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        scalar: Option<f64>,
        outputs: Option<Vec<(Vec<usize>, Bound<'_, PyAny>)>>,
        device: Option<&str>,
    ) -> PyResult<Vec<PyArr>> {
        let device = match device {
            Some(d) => parse_device(d)?,
            None => inputs.first().map_or(DeviceId::CPU, |a| a.t.device()),
        };
        let vm = self.shared.vm();
        let op = vm.op(op).py_err()?;
        let stream = vm.compute_stream(device).py_err()?;
        let attrs = scalar.map_or_else(Attrs::default, Attrs::scalar);
        let ins: Vec<&Tensor> = inputs.iter().map(|a| &a.t).collect();
        match outputs {
            None => {
                let outs =
                    self.shared.with_builder(py, |b| b.call_multi(op, &ins, attrs, stream)).py_err()?;
                Ok(outs.into_iter().map(|t| self.arr(t)).collect())
            }
            Some(specs) => {
                let mut outs = Vec::with_capacity(specs.len());
                for (shape, dtype) in &specs {
                    outs.push(vm.empty(shape, vm_dtype(py, dtype)?, device).py_err()?);
                }
                let refs: Vec<&Tensor> = outs.iter().collect();
                self.shared.with_builder(py, |b| b.call_into(op, &ins, &refs, attrs, stream)).py_err()?;
                Ok(outs.into_iter().map(|t| self.arr(t)).collect())
            }
        }
    }

    /// Hand every call made so far to the VM now (it runs them asynchronously).
    fn flush(&self, py: Python<'_>) {
        self.shared.flush(py);
    }

    /// Wait until everything submitted so far has run; raise `FailedError` if any
    /// instruction failed since the last sync.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.flush(py);
        let shared = self.shared.clone();
        wait(py, move || shared.vm().sync())?.py_err()
    }

    /// Instructions submitted and not yet retired.
    #[getter]
    fn in_flight(&self) -> usize {
        self.shared.vm().in_flight()
    }

    /// The names of the registered ops.
    fn op_names(&self) -> Vec<&'static str> {
        self.shared.vm().op_names()
    }

    /// The stream of type `type` (`"compute"`, `"h2d"`, `"d2h"`) on `device`.
    #[pyo3(signature = (device="cpu:0", r#type="compute"))]
    fn stream(&self, device: &str, r#type: &str) -> PyResult<PyStream> {
        let id = self.shared.vm().stream(parse_device(device)?, stream_type(r#type)?).py_err()?;
        self.stream_obj(id)
    }

    /// Every stream of the VM.
    fn streams(&self) -> PyResult<Vec<PyStream>> {
        self.shared.vm().streams().into_iter().map(|s| self.stream_obj(s.0)).collect()
    }

    /// A program: the instruction-list API with explicit streams, as a context manager.
    fn program(&self) -> Program {
        Program { shared: self.shared.clone(), closed: AtomicBool::new(false) }
    }

    /// Open a profiling session (`stop_profiling` returns its timeline).
    fn start_profiling(&self, py: Python<'_>) -> PyResult<()> {
        self.shared.flush(py);
        let shared = self.shared.clone();
        wait(py, move || shared.vm().start_profiling())?.py_err()
    }

    /// Whether a profiling session is open.
    #[getter]
    fn is_profiling(&self) -> bool {
        self.shared.vm().is_profiling()
    }

    /// Close the profiling session (after everything submitted has run) and return its
    /// timeline.
    fn stop_profiling(&self, py: Python<'_>) -> PyResult<PyProfile> {
        self.shared.flush(py);
        let shared = self.shared.clone();
        let p = wait(py, move || shared.vm().stop_profiling())?.py_err()?;
        Ok(PyProfile::new(p))
    }

    /// Start recording everything the VM receives from now on to the trace file `path`.
    fn record(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyRecorder> {
        // What was built before is not part of the recording.
        self.shared.flush(py);
        PyRecorder::start(&self.shared, &path)
    }
}

/// The calls an eager front end batches before handing them to the VM, by default (as the
/// Rust `eager::Context`'s default, `ContextOptions::flush_every`).
const DEFAULT_FLUSH_EVERY: usize = 128;

/// A stream of a VM: a device and a stream type.
#[pyclass(frozen, name = "Stream", module = "eagervm")]
pub(crate) struct PyStream {
    /// The `Shared` of the VM it belongs to, as an address (to refuse a stream of another VM).
    owner: usize,
    id: StreamId,
    device: DeviceId,
    ty: StreamType,
    name: String,
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

/// The instruction-list API: calls on explicit streams, through the VM's open builder (the
/// same one the eager methods use, so all calls reach the VM in the order they were made).
/// As a context manager its exit hands what was built to the VM, as the end of a
/// `VirtualMachine::run` closure does; calls after the exit raise `RuntimeError`.
#[pyclass(frozen, name = "Program", module = "eagervm")]
pub(crate) struct Program {
    shared: Arc<Shared>,
    closed: AtomicBool,
}

impl Program {
    fn check(&self, stream: &PyStream) -> PyResult<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(PyRuntimeError::new_err("the program is closed (its `with` block has ended)"));
        }
        if stream.owner != Arc::as_ptr(&self.shared) as usize {
            return Err(PyValueError::new_err(format!("{} is a stream of another VM", stream.name)));
        }
        Ok(())
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
        self.shared.flush(py);
    }

    /// Call a single-output op on `stream`, creating its output.
    #[pyo3(signature = (op, inputs, stream, scalar=None))]
    fn call(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        stream: PyRef<'_, PyStream>,
        scalar: Option<f64>,
    ) -> PyResult<PyArr> {
        self.check(&stream)?;
        let op = self.shared.vm().op(op).py_err()?;
        let ins: Vec<&Tensor> = inputs.iter().map(|a| &a.t).collect();
        call1(py, &self.shared, op, &ins, scalar.map_or_else(Attrs::default, Attrs::scalar), stream.id)
    }

    /// Call an op on `stream`, creating its outputs; returns them in order.
    #[pyo3(signature = (op, inputs, stream, scalar=None))]
    fn call_multi(
        &self,
        py: Python<'_>,
        op: &str,
        inputs: Vec<PyRef<'_, PyArr>>,
        stream: PyRef<'_, PyStream>,
        scalar: Option<f64>,
    ) -> PyResult<Vec<PyArr>> {
        self.check(&stream)?;
        let op = self.shared.vm().op(op).py_err()?;
        let ins: Vec<&Tensor> = inputs.iter().map(|a| &a.t).collect();
        let attrs = scalar.map_or_else(Attrs::default, Attrs::scalar);
        let outs = self.shared.with_builder(py, |b| b.call_multi(op, &ins, attrs, stream.id)).py_err()?;
        Ok(outs.into_iter().map(|t| PyArr { shared: self.shared.clone(), t }).collect())
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
        scalar: Option<f64>,
    ) -> PyResult<()> {
        self.check(&stream)?;
        let op = self.shared.vm().op(op).py_err()?;
        let ins: Vec<&Tensor> = inputs.iter().map(|a| &a.t).collect();
        let outs: Vec<&Tensor> = outputs.iter().map(|a| &a.t).collect();
        let attrs = scalar.map_or_else(Attrs::default, Attrs::scalar);
        self.shared.with_builder(py, |b| b.call_into(op, &ins, &outs, attrs, stream.id)).py_err()
    }

    /// Overwrite the host array `array` with `data` (a NumPy array of its dtype and
    /// element count; copied).
    fn write(&self, py: Python<'_>, array: PyRef<'_, PyArr>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if self.closed.load(Ordering::Relaxed) {
            return Err(PyRuntimeError::new_err("the program is closed (its `with` block has ended)"));
        }
        let arr = data.downcast::<numpy::PyUntypedArray>().map_err(|_| {
            PyTypeError::new_err("write takes a numpy.ndarray; wrap it with numpy.asarray(...)")
        })?;
        use numpy::PyArrayMethods;
        match vm_dtype(py, numpy::PyUntypedArrayMethods::dtype(arr).as_any())? {
            crate::framework::DType::F32 => {
                let a = arr.downcast::<numpy::PyArrayDyn<f32>>()?.readonly();
                let s = a.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
                self.shared.with_builder(py, |b| b.write(&array.t, s)).py_err()
            }
            crate::framework::DType::I64 => {
                let a = arr.downcast::<numpy::PyArrayDyn<i64>>()?.readonly();
                let s = a.as_slice().map_err(|e| PyValueError::new_err(e.to_string()))?;
                self.shared.with_builder(py, |b| b.write(&array.t, s)).py_err()
            }
            other => Err(super::array::unconverted(other)),
        }
    }
}
