//! How a Python call reaches the VM: through the VM's one [`Context`] (its open builder and
//! op table), with the GIL discipline of the binding.
//!
//! # Calls
//!
//! Every eager method of `eagervm.Array` is a method of [`eager::Array`](crate::eager::Array)
//! (the one place where a call is checked and built), and the instruction-list API
//! (`Program`) builds through the same context ([`Context::build`]), so instructions reach
//! the VM in the order Python made them, whichever API made them. A call takes the
//! context's lock with the GIL held, for its checks and its push only. The context is made
//! by [`Context::deferring_flushes`]: when `flush_every` calls are pending it does not hand
//! the batch over itself; [`issued`] does, with the GIL released, since a hand-off can wait
//! for back-pressure.
//!
//! # Reads and waits
//!
//! [`access`] builds the read into the open batch and hands the batch over with the GIL
//! released ([`Context::begin_host_access`]): an idle VM lets this thread run the batch,
//! and the answer is there at once; otherwise the wait goes to a helper thread
//! (`python::wait`), so that Ctrl-C cuts it short.
//!
//! # Locks and the GIL
//!
//! No thread waits for the GIL while it holds the context's lock: nothing under the lock
//! calls into Python, and what may block (a flush, a wait) runs with the GIL released. The
//! deleters of the DLPack producers' tensors the VM has freed run in [`deleters::collect`]
//! after each call and wait, with the GIL and no lock held (`python::deleters`).

use pyo3::prelude::*;

use super::deleters;
use super::errors::IntoPy;
use super::wait::wait;
use crate::eager::{Array, Context};
use crate::framework::virtual_machine::HostAccess;
use crate::Result;

/// The result of an eager call made on `cx`: flushes if `flush_every` calls are pending
/// (GIL released), collects what the VM freed, and turns an error into its exception.
#[inline]
pub(crate) fn issued<R>(py: Python<'_>, cx: &Context, r: Result<R>) -> PyResult<R> {
    if cx.flush_due() {
        flush(py, cx);
    }
    deleters::collect(py);
    r.py_err()
}

/// Hand everything built so far to the VM (GIL released: a hand-off may wait for
/// back-pressure).
pub(crate) fn flush(py: Python<'_>, cx: &Context) {
    // Cannot fail: `Context::flush` returns `Ok`.
    let _ = py.allow_threads(|| cx.flush());
    deleters::collect(py);
}

/// A read (`Read`: the array's bytes, row-major) or a wait (`Wait`: no bytes) of `a`
/// (module docs). Returns the error the array carries as the inner `Err`; the outer one
/// is a `KeyboardInterrupt` (or another signal handler's exception) during the wait.
pub(crate) fn access(py: Python<'_>, a: &Array, what: HostAccess) -> PyResult<Result<Vec<u8>>> {
    deleters::collect(py);
    let cx = a.context();
    let t = a.tensor_unflushed();
    let (slot, ran_here) = match py.allow_threads(|| cx.begin_host_access(t, what)) {
        Ok(b) => b,
        Err(e) => return Ok(Err(e)),
    };
    let engine = cx.vm().engine().clone();
    if ran_here {
        deleters::collect(py);
        // The batch has run: the slot holds the answer, and this does not block.
        return Ok(engine.wait_access(&slot));
    }
    wait(py, move || engine.wait_access(&slot))
}

/// [`access`] with both errors raised.
pub(crate) fn read(py: Python<'_>, a: &Array) -> PyResult<Vec<u8>> {
    access(py, a, HostAccess::Read)?.py_err()
}
