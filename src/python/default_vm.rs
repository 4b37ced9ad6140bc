//! The default VM: the one the module's functions (`eagervm.tensor`, `eagervm.zeros`, ...)
//! use when no VM is named (`eagervm.default_vm` and `set_default_vm`, in `python::vm`,
//! read and write the records kept here).
//!
//! Per thread, the innermost `with vm:` block's VM; outside every block, the process's
//! default: the VM given to `set_default_vm`, or else one made on first use with `VM()`'s
//! defaults (the `EAGERVM_*` variables apply) and kept for the process. `with` blocks are
//! per thread, as PyTorch's `with torch.device(...)` is: a block on one thread changes
//! nothing on another; `set_default_vm` is for the whole process.
//!
//! Neither lock here is held while the GIL is released or taken: the first default VM is
//! made with no lock held (two threads may both make one; the first to store it wins).

use std::cell::RefCell;

use parking_lot::Mutex;
use pyo3::prelude::*;

/// The process's default VM, once made or set.
static DEFAULT: Mutex<Option<PyObject>> = Mutex::new(None);

thread_local! {
    /// This thread's `with vm:` blocks, innermost last.
    static STACK: RefCell<Vec<PyObject>> = const { RefCell::new(Vec::new()) };
}

/// Enter a `with vm:` block on this thread.
pub(crate) fn push(vm: PyObject) {
    STACK.with(|s| s.borrow_mut().push(vm));
}

/// Leave the innermost `with` block of `vm` on this thread.
pub(crate) fn pop(vm: &Bound<'_, PyAny>) {
    let popped = STACK.with(|s| {
        let mut s = s.borrow_mut();
        let at = s.iter().rposition(|v| v.as_ptr() == vm.as_ptr())?;
        Some(s.remove(at))
    });
    // Dropped here, out of the borrow: a VM's drop may run Python code (its arrays').
    drop(popped);
}

/// The VM the module's functions use now, on this thread (module docs); `make` makes the
/// process's default if there is none yet.
pub(crate) fn current(py: Python<'_>, make: impl FnOnce() -> PyResult<PyObject>) -> PyResult<PyObject> {
    if let Some(vm) = STACK.with(|s| s.borrow().last().map(|v| v.clone_ref(py))) {
        return Ok(vm);
    }
    if let Some(vm) = DEFAULT.lock().as_ref().map(|v| v.clone_ref(py)) {
        return Ok(vm);
    }
    let made = make()?;
    let (vm, spare) = {
        let mut d = DEFAULT.lock();
        match d.as_ref() {
            Some(first) => (first.clone_ref(py), Some(made)),
            None => (d.insert(made).clone_ref(py), None),
        }
    };
    // Another thread's VM came first: ours goes, out of the lock.
    drop(spare);
    Ok(vm)
}

/// Make `vm` the process's default (`None`: the one made on first use, again).
pub(crate) fn set(vm: Option<PyObject>) {
    let old = std::mem::replace(&mut *DEFAULT.lock(), vm);
    drop(old);
}
