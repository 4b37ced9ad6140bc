//! Traces and timelines from Python, as the command line has them: record a VM's
//! instruction stream (`VM.record`), replay, validate and analyse a trace file, and take a
//! timeline (`VM.stop_profiling`, `replay(..., timeline=...)`) to write for Perfetto.

use std::path::{Path, PathBuf};

use parking_lot::Mutex;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::array::PyArr;
use super::errors::IntoPy;
use super::issue::flush;
use super::wait::wait;
use crate::eager::Context;
use crate::framework::Tensor;
use crate::profile::Profile;
use crate::trace::{self, DeviceMap, RecordSummary, Recorder, ReplayOptions, ValidateOptions};
use crate::Config;

/// A timeline of a VM's run: per-stream busy time, and a Chrome/Perfetto trace to write.
#[pyclass(frozen, name = "Profile", module = "eagervm")]
pub(crate) struct PyProfile {
    p: Profile,
}

impl PyProfile {
    pub(crate) fn new(p: Profile) -> Self {
        PyProfile { p }
    }
}

#[pymethods]
impl PyProfile {
    /// Write the timeline as Chrome trace-event JSON (open it in ui.perfetto.dev).
    fn write_timeline(&self, py: Python<'_>, path: PathBuf) -> PyResult<()> {
        py.allow_threads(|| self.p.write_chrome_json(path)).py_err()
    }

    /// Instructions recorded in full.
    #[getter]
    fn instructions(&self) -> usize {
        self.p.instructions().len()
    }

    /// Instructions seen only in part (left out of `instructions`).
    #[getter]
    fn incomplete(&self) -> usize {
        self.p.incomplete()
    }

    /// From the first instruction's receipt to the last one's completion, in seconds.
    #[getter]
    fn span(&self) -> f64 {
        self.p.summary().span.as_secs_f64()
    }

    /// Per stream: `{"stream", "instructions", "busy"}` (busy time in seconds).
    fn busy<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let l = PyList::empty(py);
        for s in self.p.summary().streams {
            let d = PyDict::new(py);
            d.set_item("stream", s.name)?;
            d.set_item("instructions", s.instructions)?;
            d.set_item("busy", s.busy.as_secs_f64())?;
            l.append(d)?;
        }
        Ok(l)
    }

    /// The per-stream busy-time table the command line prints.
    fn summary(&self) -> String {
        self.p.summary().to_string()
    }

    fn __repr__(&self) -> String {
        format!("Profile(instructions={})", self.p.instructions().len())
    }
}

/// A recording of a VM's instruction stream to a trace file (`VM.record`).
#[pyclass(frozen, name = "Recorder", module = "eagervm")]
pub(crate) struct PyRecorder {
    cx: Context,
    rec: Mutex<Option<Recorder>>,
}

fn summary_dict<'py>(py: Python<'py>, s: &RecordSummary) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("path", s.path.display().to_string())?;
    d.set_item("instructions", s.instructions)?;
    d.set_item("tensors", s.tensors)?;
    d.set_item("expects", s.expects)?;
    d.set_item("failure", s.failure.clone())?;
    d.set_item("sidecar", s.sidecar.as_ref().map(|p| p.display().to_string()))?;
    Ok(d)
}

impl PyRecorder {
    pub(crate) fn start(cx: &Context, path: &Path) -> PyResult<Self> {
        let rec = Recorder::start(cx.vm(), path).py_err()?;
        Ok(PyRecorder { cx: cx.clone(), rec: Mutex::new(Some(rec)) })
    }
}

#[pymethods]
impl PyRecorder {
    /// Stop recording and end the trace with an `expect` checksum for each of `outputs`
    /// (and an `expect error` for the first failure seen); waits for the VM and the
    /// writer. Returns what was written.
    #[pyo3(signature = (outputs=Vec::new()))]
    fn finish<'py>(&self, py: Python<'py>, outputs: Vec<PyRef<'py, PyArr>>) -> PyResult<Bound<'py, PyDict>> {
        let rec = self
            .rec
            .lock()
            .take()
            .ok_or_else(|| PyRuntimeError::new_err("the recording is finished already"))?;
        let tensors: Vec<Tensor> = outputs.iter().map(|a| a.a.tensor_unflushed().clone()).collect();
        flush(py, &self.cx);
        let cx = self.cx.clone();
        let s = wait(py, move || {
            let refs: Vec<&Tensor> = tensors.iter().collect();
            rec.finish(cx.vm(), &refs, None)
        })?
        .py_err()?;
        summary_dict(py, &s)
    }
}

/// Replay the trace at `path` (as `eagervm replay`): returns what ran, and raises
/// `TraceError` if the trace is invalid or the replay does not reproduce it.
#[pyfunction]
#[pyo3(signature = (path, *, device="recorded", resync=false, tolerance=None, profile=false, timeline=None))]
pub(crate) fn replay<'py>(
    py: Python<'py>,
    path: PathBuf,
    device: &str,
    resync: bool,
    tolerance: Option<f64>,
    profile: bool,
    timeline: Option<PathBuf>,
) -> PyResult<Bound<'py, PyDict>> {
    let device: DeviceMap = device.parse().map_err(PyValueError::new_err)?;
    let opts = ReplayOptions {
        resync,
        device,
        config: Config::try_from_env().py_err()?,
        profile: profile || timeline.is_some(),
        tolerance,
    };
    let r = wait(py, move || trace::load(&path).and_then(|t| trace::replay(&t, &opts)))?.py_err()?;
    if let (Some(p), Some(out)) = (&r.profile, &timeline) {
        py.allow_threads(|| p.write_chrome_json(out)).py_err()?;
    }
    let d = PyDict::new(py);
    d.set_item("instructions", r.instructions)?;
    d.set_item("wall", r.wall.as_secs_f64())?;
    let per = PyDict::new(py);
    for (s, n) in &r.per_stream {
        per.set_item(s, n)?;
    }
    d.set_item("per_stream", per)?;
    d.set_item("reads", r.reads.len())?;
    d.set_item("checked", r.checked)?;
    d.set_item(
        "failures",
        r.failures.iter().map(|(line, e)| format!("line {line}: {e}")).collect::<Vec<_>>(),
    )?;
    d.set_item("expected_failure", r.expected_failure.clone())?;
    d.set_item("profile", r.profile.map(PyProfile::new))?;
    Ok(d)
}

/// Validate the trace at `path` (as `eagervm validate`): raises `TraceError` listing every
/// problem with its line and column; returns the counts of a valid one.
#[pyfunction]
#[pyo3(signature = (path, *, resync=false, max_tensor_bytes=None))]
pub(crate) fn validate<'py>(
    py: Python<'py>,
    path: PathBuf,
    resync: bool,
    max_tensor_bytes: Option<u64>,
) -> PyResult<Bound<'py, PyDict>> {
    let max_tensor_bytes = match max_tensor_bytes {
        Some(n) => n,
        None => Config::try_from_env().py_err()?.max_tensor_bytes,
    };
    let (statements, instructions) = py
        .allow_threads(|| {
            let t = trace::load(&path)?;
            trace::validate(&t, &ValidateOptions { resync, max_tensor_bytes })?;
            Ok::<_, trace::TraceError>((t.lines.len(), t.instructions()))
        })
        .py_err()?;
    let d = PyDict::new(py);
    d.set_item("statements", statements)?;
    d.set_item("instructions", instructions)?;
    Ok(d)
}

/// Analyse the trace at `path` (as `eagervm analyze`): its dependency graph's size,
/// critical path and available parallelism, and the graph in Graphviz DOT.
#[pyfunction]
pub(crate) fn analyze<'py>(py: Python<'py>, path: PathBuf) -> PyResult<Bound<'py, PyDict>> {
    let a = py.allow_threads(|| trace::load(&path).and_then(|t| trace::analyze(&t))).py_err()?;
    let d = PyDict::new(py);
    d.set_item("instructions", a.instructions)?;
    d.set_item("edges", a.edges)?;
    d.set_item(
        "per_stream",
        a.per_stream.iter().map(|(id, desc, n)| (format!("s{id}"), desc.clone(), *n)).collect::<Vec<_>>(),
    )?;
    d.set_item("critical_path", a.critical_path)?;
    d.set_item("parallelism", a.parallelism)?;
    d.set_item("dot", a.dot())?;
    Ok(d)
}
