//! The Python extension module `eagervm._eagervm` (cargo feature `python`; built by maturin
//! from `pyproject.toml`, re-exported by the package `python/eagervm`). `docs/python.md`
//! is the user's guide.
//!
//! The binding is thin: a [`VirtualMachine`](crate::VirtualMachine) per `eagervm.VM`, its
//! tensors as `eagervm.Array`, every call through one open
//! [`InstructionsBuilder`](crate::framework::InstructionsBuilder) per VM (`shared`), waits
//! on helper threads with the GIL released (`wait`), and every [`Error`](crate::Error) as
//! an exception of its own class (`errors`). No VM thread calls into Python, and no panic
//! crosses into it (PyO3 turns a panic in a binding into a Python exception; the VM
//! catches kernel panics itself).

mod array;
mod deleters;
mod dlpack;
mod errors;
mod shared;
mod trace;
mod vm;
mod wait;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
#[pyo3(name = "_eagervm")]
fn eagervm_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<vm::PyVm>()?;
    m.add_class::<vm::PyStream>()?;
    m.add_class::<vm::Program>()?;
    m.add_class::<array::PyArr>()?;
    m.add_class::<trace::PyProfile>()?;
    m.add_class::<trace::PyRecorder>()?;
    m.add_function(wrap_pyfunction!(trace::replay, m)?)?;
    m.add_function(wrap_pyfunction!(trace::validate, m)?)?;
    m.add_function(wrap_pyfunction!(trace::analyze, m)?)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
