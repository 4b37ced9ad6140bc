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

use std::sync::Arc;

use pyo3::prelude::*;

use super::deleters;
use super::errors::IntoPy;
use super::wait::wait;
use crate::eager::{Array, Context};
use crate::framework::virtual_machine::HostAccess;
use crate::framework::{HostLoan, Tensor};
use crate::vm::instruction::AccessSlot;
use crate::{Error, Result};

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
    Ok(host_access(py, a.context(), a.tensor_unflushed(), what)?.map(|(bytes, _)| bytes))
}

/// A loan of `t`'s host bytes (`t` a tensor of `cx`'s VM; a host copy of a device
/// tensor), once every write of it issued so far has finished, as [`access`] waits for a
/// read (`Tensor::lend_host`, for a DLPack export).
pub(crate) fn lend(py: Python<'_>, cx: &Context, t: &Tensor) -> PyResult<Result<HostLoan>> {
    Ok(host_access(py, cx, t, HostAccess::Lend)?.and_then(|(_, slot)| {
        slot.take_loan()
            .ok_or_else(|| Error::Access { tensor: t.id(), detail: "the access kept no loan".into() })
    }))
}

/// [`access`] and [`lend`]: the bytes (none but for `Read`) and the slot that answered.
fn host_access(
    py: Python<'_>,
    cx: &Context,
    t: &Tensor,
    what: HostAccess,
) -> PyResult<Result<(Vec<u8>, Arc<AccessSlot>)>> {
    deleters::collect(py);
    let (slot, ran_here) = match py.allow_threads(|| cx.begin_host_access(t, what)) {
        Ok(b) => b,
        Err(e) => return Ok(Err(e)),
    };
    let engine = cx.vm().engine().clone();
    if ran_here {
        deleters::collect(py);
        // The batch has run: the slot holds the answer, and this does not block.
        return Ok(engine.wait_access(&slot).map(|bytes| (bytes, slot)));
    }
    let waited = slot.clone();
    Ok(wait(py, move || engine.wait_access(&waited))?.map(|bytes| (bytes, slot)))
}

/// [`access`] with both errors raised.
pub(crate) fn read(py: Python<'_>, a: &Array) -> PyResult<Vec<u8>> {
    access(py, a, HostAccess::Read)?.py_err()
}
