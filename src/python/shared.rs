//! What every Python object of one VM shares: the [`VirtualMachine`], and the one
//! [`InstructionsBuilder`] kept open on it, which builds every call made from Python.
//!
//! # Why one open builder
//!
//! `VirtualMachine::run` lends a builder to a closure, and each closing of a builder hands
//! its batch to the scheduler and wakes it (`docs/frontend.md`, "One check per call, and
//! batches"): one `run` per Python call would pay that per call. So the binding keeps one builder open and hands its
//! batch over every `flush_every` calls, and before anything waits or reads (the eager
//! front end's `Context` batches for the same reason; it cannot be held by a Python object,
//! which may move between threads, while the builder can). The eager methods of `Array` and
//! the explicit-stream calls of `Program` go through this same builder, so their
//! instructions reach the VM in the order Python made them, whichever API made them.
//!
//! An open builder holds back the `Release` of tensors dropped meanwhile until its next
//! flush (`framework::release`): at most `flush_every` calls, or the next wait.
//!
//! # Locking and the GIL
//!
//! The builder sits behind a mutex. It is taken with the GIL held for a call (short:
//! checks and a push), or without the GIL for a flush (which may wait for back-pressure);
//! no thread ever waits for the GIL while holding it, so the two cannot deadlock, and
//! nothing in here calls into Python while it holds the lock (the one call into Python,
//! deleting the DLPack producers' tensors the VM has freed, comes before the lock is taken
//! and after a flush has let it go: `python::deleters`).

use parking_lot::Mutex;
use pyo3::prelude::*;

use super::wait::wait;
use crate::framework::virtual_machine::{build_host_access, HostAccess};
use crate::framework::{InstructionsBuilder, Op, Tensor};
use crate::VirtualMachine;

/// The ops the eager methods call, resolved once.
pub(crate) struct Ops {
    pub(crate) fill: Op,
    pub(crate) copy: Op,
    pub(crate) add: Op,
    pub(crate) sub: Op,
    pub(crate) mul: Op,
    pub(crate) scale: Op,
    pub(crate) relu: Op,
    pub(crate) relu_grad: Op,
    pub(crate) matmul: Op,
    pub(crate) matmul_tn: Op,
    pub(crate) matmul_nt: Op,
    pub(crate) add_bias: Op,
    pub(crate) sum: Op,
    pub(crate) sum_rows: Op,
}

impl Ops {
    fn resolve(vm: &VirtualMachine) -> crate::Result<Self> {
        Ok(Ops {
            fill: vm.op("fill")?,
            copy: vm.op("copy")?,
            add: vm.op("add")?,
            sub: vm.op("sub")?,
            mul: vm.op("mul")?,
            scale: vm.op("scale")?,
            relu: vm.op("relu")?,
            relu_grad: vm.op("relu_grad")?,
            matmul: vm.op("matmul")?,
            matmul_tn: vm.op("matmul_tn")?,
            matmul_nt: vm.op("matmul_nt")?,
            add_bias: vm.op("add_bias")?,
            sum: vm.op("sum")?,
            sum_rows: vm.op("sum_rows")?,
        })
    }
}

/// The open builder and the calls it has built since its last flush.
pub(crate) struct Open {
    pub(crate) b: InstructionsBuilder<'static>,
    calls: usize,
}

/// A VM and its open builder.
pub(crate) struct Shared {
    // Declared before `vm`: fields drop in order, so the builder, which borrows the VM,
    // is dropped (and flushed) before it.
    open: Mutex<Open>,
    /// Boxed: the builder borrows it, and its address must not change while `Shared` moves.
    vm: Box<VirtualMachine>,
    pub(crate) ops: Ops,
    flush_every: usize,
}

impl Shared {
    /// Take ownership of `vm` and open its builder.
    pub(crate) fn new(vm: VirtualMachine, flush_every: usize) -> crate::Result<Self> {
        let vm = Box::new(vm);
        let ops = Ops::resolve(&vm)?;
        // The builder holds a counted handle of the engine of its own.
        let b = InstructionsBuilder::owned(vm.engine().clone());
        Ok(Shared { open: Mutex::new(Open { b, calls: 0 }), vm, ops, flush_every: flush_every.max(1) })
    }

    /// The VM.
    pub(crate) fn vm(&self) -> &VirtualMachine {
        &self.vm
    }

    /// The calls built between two flushes at most.
    pub(crate) fn flush_every(&self) -> usize {
        self.flush_every
    }

    /// Build with the open builder (one Python-level call: `f` makes its instructions).
    /// Every `flush_every` calls, hands the batch to the VM, with the GIL released.
    pub(crate) fn with_builder<R>(
        &self,
        py: Python<'_>,
        f: impl for<'a> FnOnce(&mut InstructionsBuilder<'a>) -> R,
    ) -> R {
        // Producers' tensors the VM has freed are deleted here, with the GIL and no lock
        // held (`python::deleters`).
        super::deleters::collect(py);
        let (r, full) = {
            let mut open = self.open.lock();
            let r = f(&mut open.b);
            open.calls += 1;
            (r, open.calls >= self.flush_every)
        };
        if full {
            self.flush(py);
        }
        r
    }

    /// Hand everything built so far to the VM (before a wait or a read, or when asked).
    /// Releases the GIL: a submission can wait for back-pressure.
    pub(crate) fn flush(&self, py: Python<'_>) {
        py.allow_threads(|| self.flush_nogil());
        super::deleters::collect(py);
    }

    /// A read (`Read`) or wait (`Wait`) of `t`, an array of this VM, built into the open
    /// batch and handed over with it (`InstructionsBuilder::flush_for_wait`): an idle VM
    /// lets this thread run the batch, with the GIL released, and the answer is there at
    /// once; otherwise the wait goes to a helper thread as every wait does (`python::wait`),
    /// so that Ctrl-C cuts it short. A batch run on this thread is not cut short: it is the
    /// work itself, as an op of an eager CPU framework is. Returns the bytes (none for a
    /// wait), or the error the access raised.
    pub(crate) fn host_access(
        &self,
        py: Python<'_>,
        t: &Tensor,
        what: HostAccess,
    ) -> PyResult<crate::Result<Vec<u8>>> {
        super::deleters::collect(py);
        let built = py.allow_threads(|| {
            let (slot, handoff) = {
                let mut open = self.open.lock();
                let slot = build_host_access(&mut open.b, t, what)?;
                open.calls = 0;
                (slot, open.b.flush_for_wait())
            };
            let ran_here = handoff.is_claimed();
            handoff.finish();
            crate::Result::Ok((slot, ran_here))
        });
        let (slot, ran_here) = match built {
            Ok(b) => b,
            Err(e) => return Ok(Err(e)),
        };
        let engine = self.vm.engine().clone();
        if ran_here {
            super::deleters::collect(py);
            // The batch has run: the slot holds the answer, and this does not block.
            return Ok(engine.wait_access(&slot));
        }
        wait(py, move || engine.wait_access(&slot))
    }

    /// [`flush`](Self::flush) on a thread that does not hold the GIL.
    pub(crate) fn flush_nogil(&self) {
        let mut open = self.open.lock();
        open.b.flush();
        open.calls = 0;
    }
}
