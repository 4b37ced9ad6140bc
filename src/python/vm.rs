//! `eagervm.VM`: a VM with its configuration and its one eager context (`python::issue`),
//! the creation of its arrays (`python::creation`), and the calls that wait for it (sync,
//! profiling, recording). `with vm:` makes it the default VM of the thread
//! (`python::default_vm`).

use std::time::Duration;

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyInt, PyTuple};

use super::array::PyArr;
use super::creation;
use super::default_vm;
use super::dtype::{opt_device, opt_dtype};
use super::errors::IntoPy;
use super::interop::scalar_attrs;
use super::issue::{flush, issued};
use super::program::{Program, PyStream};
use super::trace::{PyProfile, PyRecorder};
use super::wait::wait;
use crate::eager::{Array, Context, ContextOptions};
use crate::ep::{DeviceId, StreamType};
use crate::framework::OutSpec;
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
pub(crate) fn stream_type(s: &str) -> PyResult<StreamType> {
    StreamType::ALL.into_iter().find(|t| t.name() == s).ok_or_else(|| {
        let names: Vec<_> = StreamType::ALL.iter().map(|t| t.name()).collect();
        PyValueError::new_err(format!("unknown stream type {s:?} (expected one of {})", names.join(", ")))
    })
}

/// An eager-execution virtual machine (`docs/python.md`).
#[pyclass(frozen, name = "VM", module = "eagervm")]
pub(crate) struct PyVm {
    pub(crate) cx: Context,
}

impl PyVm {
    /// `a` as a Python array.
    pub(crate) fn wrap(a: Array) -> PyArr {
        PyArr { a }
    }
}

#[pymethods]
impl PyVm {
    /// Start a VM. Every `Config` field has a keyword; one left `None` keeps the value of
    /// `Config::try_from_env()` (the defaults with the `EAGERVM_*` variables applied); a bad
    /// variable raises `ConfigError` naming it.
    #[new]
    #[pyo3(signature = (*, mock_devices=None, cuda_devices=None, sync=None, threads=None, high_water=None,
        low_water=None, batch_size=None, spin=None, yields=None, event_interval=None, check_data=None, profile=None,
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
        check_data: Option<bool>,
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
        if let Some(v) = check_data {
            c.check_data = v;
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
            None => ContextOptions::default().flush_every,
        };
        // Starting a VM opens devices (CUDA's driver may take a while): without the GIL.
        let vm = py.allow_threads(|| VirtualMachine::new(c)).py_err()?;
        // The context keeps the VM running; this handle of it may go.
        Ok(PyVm { cx: Context::deferring_flushes(&vm, ContextOptions { flush_every }) })
    }

    fn __repr__(&self) -> String {
        let c = self.cx.vm().config();
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
        let c = self.cx.vm().config();
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
        d.set_item("check_data", c.check_data)?;
        d.set_item("profile", c.profile)?;
        d.set_item("max_tensor_bytes", c.max_tensor_bytes)?;
        d.set_item("mock_launch_delay_us", c.mock.launch_delay.as_micros() as u64)?;
        d.set_item("mock_jitter_us", c.mock.jitter.as_micros() as u64)?;
        d.set_item("mock_seed", c.mock.seed)?;
        d.set_item("fault_skip_stream_wait_every", c.fault.skip_stream_wait_every)?;
        d.set_item("fault_refuse_watcher_threads", c.fault.refuse_watcher_threads)?;
        d.set_item("fault_fail_alloc_one_in", c.fault.fail_alloc_one_in)?;
        d.set_item("fault_fail_alloc_seed", c.fault.fail_alloc_seed)?;
        d.set_item("flush_every", self.cx.options().flush_every)?;
        Ok(d)
    }

    /// A new array holding a copy of `data`, a NumPy array of any eagervm dtype (one that
    /// is not C-contiguous is copied as it reads), on `device`, converted to `dtype`.
    #[pyo3(signature = (data, device=None, dtype=None))]
    fn array(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        device: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
        let a = super::interop::from_ndarray(py, &self.cx, data, device)?;
        match opt_dtype(dtype)? {
            Some(d) if d != a.dtype() => Ok(PyArr { a: issued(py, &self.cx, a.to_dtype(d))? }),
            _ => Ok(PyArr { a }),
        }
    }

    /// PyTorch's `tensor(data, dtype=None, device=None)`: a copy of `data` (numbers,
    /// nested sequences, NumPy or eagervm arrays), with PyTorch's dtype inference.
    #[pyo3(signature = (data, dtype=None, device=None))]
    fn tensor(
        &self,
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        let a = super::interop::tensor(py, &self.cx, data, opt_dtype(dtype)?, opt_device(device)?)?;
        Ok(PyArr { a })
    }

    /// PyTorch's `from_numpy(ndarray)`: an array over the NumPy array's memory where the VM
    /// can use it as it is (DLPack), else over a copy.
    #[pyo3(name = "from_numpy")]
    fn import_numpy(&self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<PyArr> {
        creation::from_numpy(py, &self.cx, data).map(Self::wrap)
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
        device: Option<&Bound<'_, PyAny>>,
        copy: Option<bool>,
    ) -> PyResult<PyArr> {
        super::dlpack::import(py, &self.cx, x, opt_device(device)?, copy).map(Self::wrap)
    }

    /// PyTorch's `zeros(*size, dtype=None, device=None)`.
    #[pyo3(signature = (*size, dtype=None, device=None))]
    fn zeros(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyTuple>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        creation::filled(py, &self.cx, "zeros", size, 0, dtype, device).map(Self::wrap)
    }

    /// PyTorch's `ones(*size, dtype=None, device=None)`.
    #[pyo3(signature = (*size, dtype=None, device=None))]
    fn ones(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyTuple>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        creation::filled(py, &self.cx, "ones", size, 1, dtype, device).map(Self::wrap)
    }

    /// PyTorch's `empty(*size, dtype=None, device=None)`: an array nothing has written
    /// (reading it before a write raises `UninitializedError`).
    #[pyo3(signature = (*size, dtype=None, device=None))]
    fn empty(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyTuple>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        creation::empty(py, &self.cx, size, dtype, device).map(Self::wrap)
    }

    /// PyTorch's `full(size, fill_value, dtype=None, device=None)`: the dtype, if not
    /// given, is the value's (bool, int64, or the default float dtype).
    #[pyo3(signature = (size, fill_value, dtype=None, device=None))]
    fn full(
        &self,
        py: Python<'_>,
        size: &Bound<'_, PyAny>,
        fill_value: &Bound<'_, PyAny>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        creation::full(py, &self.cx, size, fill_value, dtype, device).map(Self::wrap)
    }

    /// PyTorch's `arange(end)` and `arange(start, end, step=1)`: int64 for integer bounds
    /// and step, the default float dtype if any is a float.
    #[pyo3(signature = (start, end=None, step=None, *, dtype=None, device=None))]
    #[allow(clippy::too_many_arguments)]
    fn arange(
        &self,
        py: Python<'_>,
        start: &Bound<'_, PyAny>,
        end: Option<&Bound<'_, PyAny>>,
        step: Option<&Bound<'_, PyAny>>,
        dtype: Option<&Bound<'_, PyAny>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<PyArr> {
        creation::arange(py, &self.cx, start, end, step, dtype, device).map(Self::wrap)
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
        scalar: Option<&Bound<'_, PyAny>>,
        outputs: Option<Vec<(Bound<'_, PyAny>, Bound<'_, PyAny>)>>,
        device: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<Vec<PyArr>> {
        let device = match opt_device(device)? {
            Some(d) => d,
            None => inputs.first().map_or(DeviceId::CPU, |a| a.a.device()),
        };
        let attrs = scalar_attrs(scalar)?;
        let given = outputs
            .unwrap_or_default()
            .iter()
            .map(|(shape, dtype)| {
                Ok(OutSpec {
                    shape: super::args::size_obj("call", "outputs", shape)?.as_slice().into(),
                    dtype: super::dtype::dtype_arg(dtype)?,
                })
            })
            .collect::<PyResult<Vec<OutSpec>>>()?;
        let ins: Vec<&Array> = inputs.iter().map(|a| &a.a).collect();
        let outs = issued(py, &self.cx, self.cx.call(op, &ins, attrs, &given, device))?;
        Ok(outs.into_iter().map(Self::wrap).collect())
    }

    /// Hand every call made so far to the VM now (it runs them asynchronously).
    fn flush(&self, py: Python<'_>) {
        flush(py, &self.cx);
    }

    /// Wait until everything submitted so far has run; raise `FailedError` if any
    /// instruction failed since the last sync.
    fn sync(&self, py: Python<'_>) -> PyResult<()> {
        flush(py, &self.cx);
        let cx = self.cx.clone();
        wait(py, move || cx.vm().sync())?.py_err()
    }

    /// Instructions submitted and not yet retired.
    #[getter]
    fn in_flight(&self) -> usize {
        self.cx.vm().in_flight()
    }

    /// The names of the registered ops.
    fn op_names(&self) -> Vec<&'static str> {
        self.cx.vm().op_names()
    }

    /// The stream of type `type` (`"compute"`, `"h2d"`, `"d2h"`) on `device`.
    #[pyo3(signature = (device=None, r#type="compute"))]
    fn stream(&self, device: Option<&Bound<'_, PyAny>>, r#type: &str) -> PyResult<PyStream> {
        let device = opt_device(device)?.unwrap_or(DeviceId::CPU);
        let id = self.cx.vm().stream(device, stream_type(r#type)?).py_err()?;
        PyStream::of(&self.cx, id)
    }

    /// Every stream of the VM.
    fn streams(&self) -> PyResult<Vec<PyStream>> {
        self.cx.vm().streams().into_iter().map(|s| PyStream::of(&self.cx, s.0)).collect()
    }

    /// A program: the instruction-list API with explicit streams, as a context manager.
    fn program(&self) -> Program {
        Program::new(self.cx.clone())
    }

    /// Open a profiling session (`stop_profiling` returns its timeline).
    fn start_profiling(&self, py: Python<'_>) -> PyResult<()> {
        flush(py, &self.cx);
        let cx = self.cx.clone();
        wait(py, move || cx.vm().start_profiling())?.py_err()
    }

    /// Whether a profiling session is open.
    #[getter]
    fn is_profiling(&self) -> bool {
        self.cx.vm().is_profiling()
    }

    /// Close the profiling session (after everything submitted has run) and return its
    /// timeline.
    fn stop_profiling(&self, py: Python<'_>) -> PyResult<PyProfile> {
        flush(py, &self.cx);
        let cx = self.cx.clone();
        let p = wait(py, move || cx.vm().stop_profiling())?.py_err()?;
        Ok(PyProfile::new(p))
    }

    /// Start recording everything the VM receives from now on to the trace file `path`.
    fn record(&self, py: Python<'_>, path: std::path::PathBuf) -> PyResult<PyRecorder> {
        // What was built before is not part of the recording.
        flush(py, &self.cx);
        PyRecorder::start(&self.cx, &path)
    }

    /// `with vm:` makes this VM the one the module-level functions (`eagervm.zeros`, ...)
    /// use in this thread, until the block ends (blocks nest).
    fn __enter__<'py>(slf: &Bound<'py, Self>) -> Bound<'py, Self> {
        default_vm::push(slf.clone().into_any().unbind());
        slf.clone()
    }

    #[pyo3(signature = (*_args))]
    fn __exit__(slf: &Bound<'_, Self>, _args: &Bound<'_, PyTuple>) -> bool {
        default_vm::pop(slf.as_any());
        false
    }
}

/// The VM the module's functions use now, on this thread: the innermost `with vm:`
/// block's, else the process's default, made on first use with `VM()`'s defaults
/// (`python::default_vm`).
#[pyfunction(name = "default_vm")]
pub(crate) fn current_vm(py: Python<'_>) -> PyResult<Py<PyVm>> {
    let vm = default_vm::current(py, || Ok(py.get_type::<PyVm>().call0()?.unbind()))?;
    Ok(vm.into_bound(py).downcast_into::<PyVm>()?.unbind())
}

/// Make `vm` the process's default VM (`None`: the one made on first use, again), for
/// every thread outside its `with` blocks.
#[pyfunction]
#[pyo3(signature = (vm))]
pub(crate) fn set_default_vm(vm: Option<Py<PyVm>>) {
    default_vm::set(vm.map(Py::into_any));
}
