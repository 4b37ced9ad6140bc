//! The Python extension module `eagervm._eagervm` (cargo feature `python`; built by maturin
//! from `pyproject.toml`, re-exported by the package `python/eagervm`). `docs/python.md`
//! is the user's guide.
//!
//! The binding is thin: an eager [`Context`](crate::eager::Context) per `eagervm.VM` (its
//! VM, its one open builder, its op table), an [`eager::Array`](crate::eager::Array) per
//! `eagervm.Array`, every call through the context with the GIL discipline of `issue`,
//! waits on helper threads with the GIL released (`wait`), and every
//! [`Error`](crate::Error) as an exception of its own class (`errors`). The names,
//! arguments and semantics are PyTorch's, so that PyTorch code ports by changing its
//! imports (`docs/python.md` says what exists and what differs). No VM thread calls into
//! Python, and no panic crosses into it (PyO3 turns a panic in a binding into a Python
//! exception; the VM catches kernel panics itself).

mod args;
mod array;
mod conv;
mod convert;
mod creation;
mod default_vm;
mod deleters;
mod dlpack;
mod dtype;
mod errors;
mod interop;
mod issue;
mod methods;
mod ops;
mod pointwise;
mod program;
mod promotion;
mod reduce;
mod select;
mod trace;
mod views;
mod vm;
mod wait;

use pyo3::prelude::*;

/// The native module.
#[pymodule]
#[pyo3(name = "_eagervm")]
fn eagervm_native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<vm::PyVm>()?;
    m.add_class::<program::PyStream>()?;
    m.add_class::<program::Program>()?;
    m.add_class::<array::PyArr>()?;
    m.add_class::<dtype::PyDType>()?;
    m.add_class::<dtype::PyDevice>()?;
    for d in crate::framework::DType::ALL {
        m.add(d.torch_name(), dtype::dtype_object(m.py(), d)?)?;
    }
    m.add_function(wrap_pyfunction!(vm::current_vm, m)?)?;
    m.add_function(wrap_pyfunction!(vm::set_default_vm, m)?)?;
    m.add_function(wrap_pyfunction!(promotion::result_type, m)?)?;
    m.add_function(wrap_pyfunction!(promotion::promote_types, m)?)?;
    m.add_function(wrap_pyfunction!(promotion::can_cast, m)?)?;
    m.add_function(wrap_pyfunction!(promotion::get_default_dtype, m)?)?;
    m.add_function(wrap_pyfunction!(creation::zeros_like, m)?)?;
    m.add_function(wrap_pyfunction!(creation::ones_like, m)?)?;
    m.add_function(wrap_pyfunction!(creation::empty_like, m)?)?;
    m.add_function(wrap_pyfunction!(creation::full_like, m)?)?;
    m.add_class::<trace::PyProfile>()?;
    m.add_class::<trace::PyRecorder>()?;
    m.add_function(wrap_pyfunction!(trace::replay, m)?)?;
    m.add_function(wrap_pyfunction!(trace::validate, m)?)?;
    m.add_function(wrap_pyfunction!(trace::analyze, m)?)?;
    pointwise::register(m)?;
    reduce::register(m)?;
    conv::register(m)?;
    select::register(m)?;
    errors::register(m)?;
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    Ok(())
}
