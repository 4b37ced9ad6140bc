//! Instructions: what the builder emits and the scheduler dispatches.
//!
//! An [`Instruction`] (96 bytes) is moved by value from the builder's batch through the
//! scheduler to the worker (a batch that is all ready for one worker is handed over
//! whole). Its operand list is inline (four one-word operands without a heap allocation),
//! its kernel a `&'static` reference, and its operands point to their tensors without a
//! reference count ([`TensorPtr`]): emitting, running and dropping one costs no allocation
//! and no atomic operation. A synchronous worker runs the instructions of a batch in place,
//! then empties it and hands it back to the pool; an asynchronous stream moves each
//! instruction into the closure its device runs.

use std::ptr::NonNull;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::Event;
use crate::error::Error;
use crate::framework::tensor::{TensorInner, TensorOwner};
use crate::framework::{Attrs, OpKernel};
use parking_lot::{Condvar, Mutex};

use super::stream::StreamId;

/// How an instruction uses an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum AccessMode {
    /// Reads the tensor; may run alongside other readers.
    Read,
    /// Writes the tensor; runs alone, after every earlier access.
    Write,
}

/// A tensor named by an instruction: a plain pointer, with no reference count.
///
/// Instructions borrow their tensors instead of owning a count of them: the count's cache
/// line would otherwise be written twice per operand (when the instruction is built and
/// when it is dropped). What keeps the tensor alive instead:
/// - while the instruction is unsubmitted, the builder's keep-alive handle
///   (`framework::builder`, "Releases");
/// - after that, the tensor's `Release` instruction, which owns a count
///   ([`InstrKind::Release`]) and is ordered after every instruction that uses the tensor:
///   it runs only once they have run (or are ahead of it on its stream's FIFO), and the
///   scheduler has admitted them all before it admits the `Release`.
///
/// So a `TensorPtr` is dereferenced only while its tensor is alive: by the scheduler when
/// it admits the instruction, and by the instruction's execution. Dropping one does
/// nothing. Instructions that can no longer run (a dead VM) are kept, not dropped, until
/// every VM thread has exited (`VmShared::bury`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct TensorPtr(NonNull<TensorInner>);

// SAFETY: a TensorPtr is a shared reference in all but lifetime, and TensorInner is Sync
// (its own SAFETY comment), so it may be sent to and shared between threads.
unsafe impl Send for TensorPtr {}
// SAFETY: as for Send.
unsafe impl Sync for TensorPtr {}

impl TensorPtr {
    /// A pointer to `t`.
    ///
    /// # Safety
    /// The instruction that holds the pointer must be submitted before the keep-alive
    /// handle of `t` in its builder is dropped, and `t` must get a `Release` (or
    /// outlive the VM) after it: see the type's docs. Every caller is in
    /// `framework::builder` or in trace replay, which keeps each tensor's handle until
    /// it emits the tensor's `Release`.
    pub(crate) unsafe fn new(t: &TensorInner) -> Self {
        TensorPtr(NonNull::from(t))
    }
}

impl std::fmt::Debug for TensorPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tensor@{:p}", self.0)
    }
}

/// One operand: a tensor and how it is used, in one word. Tensor objects are 64-byte
/// aligned, so the pointer's lowest bit is free to say "written".
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct Operand(NonNull<TensorInner>);

// SAFETY: an Operand is a TensorPtr and a flag (TensorPtr's SAFETY comments).
unsafe impl Send for Operand {}
// SAFETY: as for Send.
unsafe impl Sync for Operand {}

const WRITE_BIT: usize = 1;
const _: () = assert!(std::mem::align_of::<TensorInner>() > WRITE_BIT);

impl Operand {
    /// `tensor`, used as `mode` says.
    #[inline]
    pub(crate) fn new(tensor: TensorPtr, mode: AccessMode) -> Self {
        let bit = match mode {
            AccessMode::Read => 0,
            AccessMode::Write => WRITE_BIT,
        };
        Operand(tensor.0.map_addr(|a| a | bit))
    }

    /// The tensor (see [`TensorPtr`] for why it is alive).
    #[inline]
    pub(crate) fn tensor(&self) -> &TensorInner {
        // SAFETY: the untagged pointer is the TensorPtr this operand was made from, alive
        // for as long as the instruction holding it can be admitted or run (TensorPtr).
        unsafe { self.ptr().0.as_ref() }
    }

    /// The tensor as a pointer.
    #[inline]
    pub(crate) fn ptr(&self) -> TensorPtr {
        // SAFETY: clearing the flag bit gives back the non-null, aligned tensor address.
        TensorPtr(unsafe { NonNull::new_unchecked(self.0.as_ptr().map_addr(|a| a & !WRITE_BIT)) })
    }

    /// How the instruction uses the tensor.
    #[inline]
    pub(crate) fn mode(&self) -> AccessMode {
        if self.0.addr().get() & WRITE_BIT != 0 {
            AccessMode::Write
        } else {
            AccessMode::Read
        }
    }
}

impl std::fmt::Debug for Operand {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:?} {:?}", self.mode(), self.ptr())
    }
}

/// Operand list; inputs first (reads), then outputs (writes) for an `OpCall`.
pub(crate) type Operands = SmallVec<[Operand; 4]>;

/// What a host `Access` does.
#[derive(Debug)]
pub(crate) enum HostAccess {
    /// Copy the tensor's bytes out to the waiting caller.
    Read(Arc<AccessSlot>),
    /// Overwrite the tensor with these bytes.
    Write(Vec<u8>),
    /// Report the tensor's error state to the waiting caller (`Tensor::wait`).
    Wait(Arc<AccessSlot>),
}

/// What an instruction does; the policy of DESIGN.md's instruction table.
pub(crate) enum InstrKind {
    /// Run a kernel: reads `operands[..n_inputs]`, writes the rest.
    OpCall { kernel: &'static dyn OpKernel, attrs: Attrs, n_inputs: u8 },
    /// Record an event on the stream after everything before it; `id` names it for the
    /// `StreamWaitEvent`s that wait on it.
    RecordEvent { id: u64 },
    /// Make the stream wait, on the device, for the event `id`. `event` is filled in by
    /// the scheduler at dispatch (None if the event is already known to be complete).
    StreamWaitEvent { id: u64, event: Option<Arc<dyn Event>> },
    /// Run a host callback once everything before it has finished (`vm.sync()`).
    Barrier { callback: Box<dyn FnOnce() + Send> },
    /// Free the storage of the (single, written) operand after every earlier use. `owner`
    /// keeps the tensor alive until the instruction is dropped (see [`TensorPtr`]); it is
    /// `None` only in the inert instruction [`Instruction::take`] leaves behind.
    Release {
        #[expect(dead_code, reason = "held only to keep the tensor alive until the instruction drops")]
        owner: Option<TensorOwner>,
    },
    /// Read or write a host tensor's bytes from the caller (single operand).
    Access(HostAccess),
}

impl std::fmt::Debug for InstrKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl InstrKind {
    /// The instruction's name in messages, timelines and traces.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            InstrKind::OpCall { kernel, .. } => kernel.name(),
            InstrKind::RecordEvent { .. } => "RecordEvent",
            InstrKind::StreamWaitEvent { .. } => "StreamWaitEvent",
            InstrKind::Barrier { .. } => "Barrier",
            InstrKind::Release { .. } => "Release",
            InstrKind::Access(_) => "Access",
        }
    }
}

/// One instruction.
#[derive(Debug)]
pub(crate) struct Instruction {
    pub(crate) kind: InstrKind,
    pub(crate) stream: StreamId,
    pub(crate) operands: Operands,
    /// Program-order number, assigned by the scheduler on receipt (errors name it).
    pub(crate) program: u64,
    /// Scheduler slot and generation, assigned on receipt; echoed in completion reports.
    pub(crate) slot: u32,
    pub(crate) gen: u32,
}

impl Instruction {
    pub(crate) fn new(kind: InstrKind, stream: StreamId, operands: Operands) -> Self {
        Instruction { kind, stream, operands, program: 0, slot: 0, gen: 0 }
    }

    /// Move the instruction out, leaving an inert one (no operands, never run) in its place.
    pub(crate) fn take(&mut self) -> Instruction {
        std::mem::replace(
            self,
            Instruction::new(InstrKind::Release { owner: None }, self.stream, Operands::new()),
        )
    }
}

/// A one-shot rendezvous between a host access and the caller waiting for it.
///
/// The caller re-checks every 50 ms whether the VM died (a scheduler that panicked can
/// never fulfil the slot); a healthy VM wakes it at once through the condition variable.
#[derive(Debug, Default)]
pub(crate) struct AccessSlot {
    result: Mutex<Option<Result<Vec<u8>, Error>>>,
    cv: Condvar,
}

impl AccessSlot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(AccessSlot::default())
    }

    /// Hand the result to the waiter.
    pub(crate) fn fulfil(&self, r: Result<Vec<u8>, Error>) {
        let mut g = self.result.lock();
        *g = Some(r);
        self.cv.notify_all();
    }

    /// Block until fulfilled, or until `abandoned()` says it never will be.
    pub(crate) fn wait(&self, abandoned: impl Fn() -> bool) -> Result<Vec<u8>, Error> {
        let mut g = self.result.lock();
        loop {
            if let Some(r) = g.take() {
                return r;
            }
            if abandoned() {
                return Err(Error::ShutDown);
            }
            self.cv.wait_for(&mut g, std::time::Duration::from_millis(50));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn instructions_and_operands_stay_small() {
        // Every instruction is written by the builder and read by the scheduler and the
        // worker, each on its own core: its size is memory traffic per instruction.
        assert_eq!(std::mem::size_of::<Operand>(), 8);
        assert!(std::mem::size_of::<Instruction>() <= 96, "{}", std::mem::size_of::<Instruction>());
    }

    #[test]
    fn an_operand_gives_back_its_tensor_and_mode() {
        use crate::ep::DeviceId;
        use crate::framework::{DType, Tensor, TensorMeta};
        let t = Tensor::new(7, TensorMeta::new(&[2], DType::F32, DeviceId::CPU), std::sync::Weak::new());
        // SAFETY: `t` outlives every operand made here, and none is put in an instruction.
        let p = unsafe { TensorPtr::new(t.inner()) };
        for mode in [AccessMode::Read, AccessMode::Write] {
            let o = Operand::new(p, mode);
            assert_eq!((o.mode(), o.ptr()), (mode, p));
            assert_eq!(o.tensor().id, 7);
            assert!(std::ptr::eq(o.tensor(), t.inner()));
        }
    }
}
