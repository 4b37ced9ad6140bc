//! Instructions: what the builder emits and the scheduler dispatches.
//!
//! An [`Instruction`] is one cache line (64 bytes, aligned to it): its [`Body`] (what it
//! does), its operand list (three one-word operands inline), its stream and its input
//! count. An `OpCall` is written once, by the builder, and only read after that: neither the
//! scheduler nor a synchronous worker writes to it (the scheduler keeps its own records,
//! `vm::scheduler`), so the line the builder fills goes to the other cores and comes back
//! without being written there. (The scheduler writes to an instruction only to turn a
//! `StreamWaitEvent` into a `WaitEvent`, to take a barrier's callback, and to move out one
//! that must wait; a worker takes a `WaitEvent`'s event as it runs.) Its
//! kernel is a one-word `&'static` reference, and its operands point to their tensors without
//! a reference count ([`TensorPtr`]): emitting, running and dropping one costs no allocation
//! and no atomic operation.
//!
//! Instructions travel in [`Batch`]es: the builder's unit of submission, the scheduler's
//! unit of dispatch, and the worker's unit of work. A batch also carries the program number
//! of each instruction (errors and timelines name instructions by it), as one number for the
//! whole batch when its instructions are consecutive in program order.

use std::ptr::NonNull;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::Event;
use crate::error::Error;
use crate::framework::tensor::{TensorInner, TensorOwner};
use crate::framework::{Attrs, KernelRef};
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
/// - while the instruction is unsubmitted, the caller's handle, and after that the rule
///   that a tensor's `Release` is submitted only after every builder batch that was open
///   when its last handle dropped (`framework::release`);
/// - after that, the tensor's `Release` instruction, which owns a count
///   ([`Body::Release`]) and is ordered after every instruction that uses the tensor:
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
    /// The instruction that holds the pointer must be submitted while `t` is alive, before
    /// a `Release` of `t` can be submitted (the builder's rule: `framework::release`), and
    /// `t` must get a `Release` (or outlive the VM) after it: see the type's docs. Every
    /// caller is in `framework::builder` or in trace replay, which keeps each tensor's
    /// handle until it emits the tensor's `Release`.
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

/// Operand list; inputs first (reads), then outputs (writes) for an `OpCall`. Three inline:
/// with the body, that keeps an instruction on one cache line.
pub(crate) type Operands = SmallVec<[Operand; 3]>;

/// What an instruction does; the policy of DESIGN.md's instruction table. Every payload is
/// at most two words, so that the body takes three.
pub(crate) enum Body {
    /// Run a kernel: reads `operands[..n_inputs]`, writes the rest.
    OpCall { kernel: KernelRef, attrs: Attrs },
    /// Record an event on the stream after everything before it; `id` names it for the
    /// `StreamWaitEvent`s that wait on it.
    RecordEvent { id: u64 },
    /// Make the stream wait, on the device, for the event `id`. The scheduler turns it into
    /// [`Body::WaitEvent`] when it dispatches it.
    StreamWaitEvent { id: u64 },
    /// A dispatched `StreamWaitEvent`: the event to wait for, `None` if it is already known
    /// to be complete.
    WaitEvent { event: Option<Arc<dyn Event>> },
    /// Run a host callback once everything before it has finished (`vm.sync()`).
    Barrier { callback: Box<dyn FnOnce() + Send> },
    /// Free the storage of the (single, written) operand after every earlier use. `owner`
    /// keeps the tensor alive until the instruction is dropped (see [`TensorPtr`]); it is
    /// `None` only in the inert instruction [`Instruction::take`] leaves behind.
    Release { owner: Option<TensorOwner> },
    /// Copy a host tensor's bytes out to the waiting caller (single operand).
    Read(Arc<AccessSlot>),
    /// Overwrite a host tensor with these bytes (single operand).
    Write(Box<[u8]>),
    /// Report a host tensor's error state to the waiting caller (`Tensor::wait`).
    Wait(Arc<AccessSlot>),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Body {
    /// The instruction's name in messages, timelines and traces.
    pub(crate) fn name(&self) -> &'static str {
        match self {
            Body::OpCall { kernel, .. } => kernel.name(),
            Body::RecordEvent { .. } => "RecordEvent",
            Body::StreamWaitEvent { .. } | Body::WaitEvent { .. } => "StreamWaitEvent",
            Body::Barrier { .. } => "Barrier",
            Body::Release { .. } => "Release",
            Body::Read(_) | Body::Write(_) | Body::Wait(_) => "Access",
        }
    }
}

/// One instruction: one cache line, aligned to it, so that writing or reading one touches
/// one line and no other instruction's.
#[derive(Debug)]
#[repr(align(64))]
pub(crate) struct Instruction {
    pub(crate) body: Body,
    pub(crate) operands: Operands,
    pub(crate) stream: StreamId,
    /// How many of the operands are inputs (an `OpCall`'s reads); 0 for other kinds.
    pub(crate) n_inputs: u8,
}

impl Instruction {
    pub(crate) fn new(body: Body, stream: StreamId, operands: Operands) -> Self {
        Instruction { body, operands, stream, n_inputs: 0 }
    }

    /// Move the instruction out, leaving an inert one (no operands, never run) in its place.
    pub(crate) fn take(&mut self) -> Instruction {
        std::mem::replace(self, Instruction::new(Body::Release { owner: None }, self.stream, Operands::new()))
    }
}

/// Instructions in program order (per stream), and their program numbers.
///
/// Program numbers are given by the scheduler when it receives a batch: the builder's batch
/// gets one number for its first instruction (the others follow it); a batch the scheduler
/// puts together from instructions that waited carries one number per instruction.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) ins: Vec<Instruction>,
    /// The program number of `ins[0]`, when `numbers` is empty.
    first: u64,
    /// The program number of each instruction, when they are not consecutive.
    numbers: Vec<u64>,
}

impl Batch {
    /// An empty batch with room for `n` instructions.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Batch { ins: Vec::with_capacity(n), first: 0, numbers: Vec::new() }
    }

    /// Number the instructions consecutively from `first`.
    #[inline]
    pub(crate) fn number_from(&mut self, first: u64) {
        self.first = first;
        self.numbers.clear();
    }

    /// Append an instruction with its program number (a batch built this way carries one
    /// number per instruction).
    #[inline]
    pub(crate) fn push_numbered(&mut self, ins: Instruction, program: u64) {
        if self.numbers.len() < self.ins.len() {
            // Consecutive so far: spell the numbers out before this one breaks the run.
            let first = self.first;
            self.numbers.extend((0..self.ins.len() as u64).map(|i| first + i));
        }
        self.ins.push(ins);
        self.numbers.push(program);
    }

    /// The program number of instruction `i`.
    #[inline]
    pub(crate) fn program(&self, i: usize) -> u64 {
        if self.numbers.is_empty() {
            self.first + i as u64
        } else {
            self.numbers[i]
        }
    }

    pub(crate) fn len(&self) -> usize {
        self.ins.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ins.is_empty()
    }

    /// Drop the instructions, keeping the memory for reuse.
    pub(crate) fn clear(&mut self) {
        self.ins.clear();
        self.numbers.clear();
    }

    /// Whether this batch has kept no memory worth pooling.
    pub(crate) fn has_capacity(&self) -> bool {
        self.ins.capacity() > 0
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
    fn an_instruction_is_one_cache_line() {
        // Every instruction is written by the builder and read by the scheduler and the
        // worker, each on its own core: its size is memory traffic per instruction.
        assert_eq!(std::mem::size_of::<Operand>(), 8);
        assert_eq!(std::mem::size_of::<Body>(), 24);
        assert_eq!(std::mem::size_of::<Instruction>(), 64);
        assert_eq!(std::mem::align_of::<Instruction>(), 64);
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

    #[test]
    fn batches_number_their_instructions() {
        let inert = || Instruction::new(Body::RecordEvent { id: 1 }, StreamId(0), Operands::new());
        let mut b = Batch::with_capacity(4);
        b.ins.extend([inert(), inert(), inert()]);
        b.number_from(10);
        assert_eq!((b.program(0), b.program(2)), (10, 12));
        b.push_numbered(inert(), 40);
        assert_eq!((0..4).map(|i| b.program(i)).collect::<Vec<_>>(), [10, 11, 12, 40]);
        b.clear();
        b.push_numbered(inert(), 7);
        b.push_numbered(inert(), 3);
        assert_eq!((b.program(0), b.program(1)), (7, 3));
    }
}
