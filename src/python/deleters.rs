//! Deleters that need the GIL, deferred from the thread that frees their object to the
//! binding's next call.
//!
//! A DLPack producer's memory imported without a copy becomes a VM tensor's storage
//! (`python::dlpack`), and the VM frees that storage on one of its threads. The producer's
//! deleter may need the GIL (NumPy's takes it with `PyGILState_Ensure`), and a VM thread
//! that waited for the GIL could deadlock with a Python thread that holds it while it waits
//! for the VM (a VM's drop joins its threads; back-pressure inside a call keeps the GIL).
//! So the freeing thread puts the deleter on a list ([`defer`]), and the binding empties
//! it, calling the deleters, the next time it runs with the GIL ([`collect`]: every call,
//! flush and wait).

use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::Mutex;
use pyo3::prelude::*;

/// A deleter to call with the GIL held.
pub(crate) type Deleter = Box<dyn FnOnce(Python<'_>) + Send>;

/// Deleters waiting for the GIL.
static DEAD: Mutex<Vec<Deleter>> = Mutex::new(Vec::new());
/// Whether `DEAD` may hold something (set and cleared under its lock; read relaxed as a
/// hint: one missed is called at the next `collect`).
static ANY_DEAD: AtomicBool = AtomicBool::new(false);

/// Call `deleter` at the binding's next [`collect`]; any thread, no GIL needed.
pub(crate) fn defer(deleter: Deleter) {
    let mut dead = DEAD.lock();
    dead.push(deleter);
    ANY_DEAD.store(true, Ordering::Relaxed);
}

/// Call the deleters deferred so far (module docs). Cheap when there is none: one relaxed
/// load.
pub(crate) fn collect(py: Python<'_>) {
    if !ANY_DEAD.load(Ordering::Relaxed) {
        return;
    }
    let dead = {
        let mut dead = DEAD.lock();
        ANY_DEAD.store(false, Ordering::Relaxed);
        std::mem::take(&mut *dead)
    };
    // Outside the lock: a deleter may drop Python objects, whose destructors may free more.
    for deleter in dead {
        deleter(py);
    }
}
