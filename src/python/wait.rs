//! Waits that release the GIL and that a `KeyboardInterrupt` cuts short.
//!
//! The VM's waits (`Tensor::wait`, `Tensor::to_vec`, `VirtualMachine::sync`, ...) block
//! until the work is done, and Python runs its signal handlers only on the main thread,
//! between bytecodes. So a wait runs on a helper thread, and the Python thread, with the GIL
//! released, waits for its answer in slices, checking for signals between them: Ctrl-C
//! raises `KeyboardInterrupt` within a slice. An interrupted wait goes on on its helper
//! thread and its answer is dropped; the VM is not disturbed (the work it waited for still
//! runs). Helper threads never call into Python; they are kept in a small pool, since
//! starting a thread per wait would cost more than many small waits.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::mpsc::{channel, sync_channel, RecvTimeoutError, Sender};
use std::time::Duration;

use parking_lot::Mutex;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// How long the Python thread waits before it checks for signals again.
const SLICE: Duration = Duration::from_millis(20);

/// Idle helper threads kept for later waits (more are started when every one is busy).
const MAX_IDLE: usize = 8;

type Job = Box<dyn FnOnce() + Send>;

/// The idle helpers: each takes its next job from its channel.
static IDLE: Mutex<Vec<Sender<Job>>> = Mutex::new(Vec::new());

/// Run `f` (a wait) on a helper thread and return its answer, with the GIL released while
/// it runs; a signal handler that raises (Ctrl-C: `KeyboardInterrupt`) ends the wait early
/// with its exception.
pub(crate) fn wait<R: Send + 'static>(py: Python<'_>, f: impl FnOnce() -> R + Send + 'static) -> PyResult<R> {
    let (tx, mut rx) = sync_channel(1);
    start(Box::new(move || {
        // The receiver may be gone (an interrupted wait): the answer is then dropped.
        let _ = tx.send(f());
    }));
    loop {
        // A `Receiver` is `Send` but not `Sync`: lend it to the GIL-free closure by `&mut`.
        let rx = &mut rx;
        match py.allow_threads(move || rx.recv_timeout(SLICE)) {
            Ok(r) => {
                // What the wait let the VM free: the DLPack producers' tensors among it are
                // deleted now (`python::deleters`).
                super::deleters::collect(py);
                return Ok(r);
            }
            Err(RecvTimeoutError::Timeout) => py.check_signals()?,
            Err(RecvTimeoutError::Disconnected) => {
                return Err(PyRuntimeError::new_err(
                    "eagervm: the helper thread of a wait ended without an answer (it panicked, or no thread could be started)",
                ))
            }
        }
    }
}

/// Give `job` to an idle helper, or to a new one.
fn start(mut job: Job) {
    loop {
        let Some(tx) = IDLE.lock().pop() else { break };
        match tx.send(job) {
            Ok(()) => return,
            // That helper has exited: try the next one.
            Err(e) => job = e.0,
        }
    }
    let (tx, rx) = channel::<Job>();
    if let Err(e) = tx.send(job) {
        // Cannot happen (the receiver is right here); run it inline rather than lose it.
        (e.0)();
        return;
    }
    // If no thread can be started, the closure (and the job in its channel) is dropped, and
    // the waiting side sees its channel closed: a RuntimeError, not a hang.
    let _ = std::thread::Builder::new().name("eagervm-py-wait".into()).spawn(move || {
        while let Ok(job) = rx.recv() {
            // A panic in a wait must not take the helper down with the answer unsent: the
            // job's sender drops with it, which the waiting side reports.
            let _ = catch_unwind(AssertUnwindSafe(job));
            let mut idle = IDLE.lock();
            if idle.len() >= MAX_IDLE {
                return;
            }
            idle.push(tx.clone());
        }
    });
}
