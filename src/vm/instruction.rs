//! Instructions: what the builder emits and the scheduler dispatches.
//!
//! An [`Instruction`] is one cache line (64 bytes, aligned to it): its [`Body`] (what it
//! does), its operands, its stream and its input count. An operand is one word (a tensor
//! and how it is used); up to three lie in the instruction itself, and the operands of an
//! instruction with more lie in its [`Batch`]'s operand arena, so that no instruction, with
//! any number of operands, costs an allocation.
//!
//! An `OpCall` is written once, by the builder, and only read after that: neither the
//! scheduler nor a synchronous worker writes to it (the scheduler keeps its own records,
//! `vm::scheduler`), so the line the builder fills goes to the other cores and comes back
//! without being written there. (The scheduler writes to an instruction only to turn a
//! `StreamWaitEvent` into a `WaitEvent`, to take a barrier's callback, and to move out one
//! that must wait; a worker takes a `WaitEvent`'s event as it runs.) Its kernel is a
//! one-word `&'static` reference, and its operands point to their tensors without a
//! reference count ([`TensorPtr`]): emitting, running and dropping one costs no allocation
//! and no atomic operation.
//!
//! Instructions travel in batches: the builder's unit of submission, the scheduler's unit
//! of dispatch, and the worker's unit of work. A batch also carries the program number of
//! each instruction (errors and timelines name instructions by it), as one number for the
//! whole batch when its instructions are consecutive in program order. An instruction moved
//! from one batch to another (by the scheduler, into a worker's outgoing batch) takes the
//! operands it keeps in the arena with it.

use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::Arc;

use smallvec::SmallVec;

use super::dependence::DepObject;
use super::tensor::{TensorInner, TensorOwner};
use crate::ep::Event;
use crate::sync::Mutex;
use crate::vm::Error;
use crate::vm::{Attrs, KernelRef};

use super::rendezvous::Rendezvous;

use super::stream::StreamId;

/// How an instruction uses an operand.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AccessMode {
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
/// every VM thread has exited (`Inbox::bury`, `vm::engine`).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct TensorPtr(NonNull<TensorInner>);

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
    pub(super) unsafe fn new(t: &TensorInner) -> Self {
        TensorPtr(NonNull::from(t))
    }
}

impl std::fmt::Debug for TensorPtr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "tensor@{:p}", self.0)
    }
}

/// A tensor as the layer above hands it to a [`Batch`]: whatever lends the engine's
/// tensor object (the user's handle does).
pub(crate) trait AsObject {
    /// The engine's object of this tensor.
    fn object(&self) -> &TensorInner;
}

impl AsObject for TensorInner {
    #[inline(always)]
    fn object(&self) -> &TensorInner {
        self
    }
}

/// One operand: a tensor and how it is used, in one word. Tensor objects are 64-byte
/// aligned, so the pointer's lowest bits are free: the lowest says "written", the next
/// "a view whose dependence object is its owner's".
///
/// The view bit is there for the scheduler, which reaches the dependence object of every
/// operand of every instruction: told by the operand (and the instruction, `views`), it goes
/// to a tensor's own dependence object with nothing to load or test first. Asking the
/// tensor object (its `base`) put a load in front of every operand's dependence object,
/// which slowed the scheduler of every program over many tensors (`docs/performance.md`,
/// "Tensors with views and dtypes, against the engine before them", has the measurement).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct Operand(NonNull<TensorInner>);

// SAFETY: an Operand is a TensorPtr and a flag (TensorPtr's SAFETY comments).
unsafe impl Send for Operand {}
// SAFETY: as for Send.
unsafe impl Sync for Operand {}

const WRITE_BIT: usize = 1;
const VIEW_BIT: usize = 2;

const _: () = assert!(std::mem::align_of::<TensorInner>() > (WRITE_BIT | VIEW_BIT));

impl Operand {
    /// `tensor`, used as `mode` says.
    #[inline]
    pub(super) fn new(tensor: TensorPtr, mode: AccessMode) -> Self {
        let bit = match mode {
            AccessMode::Read => 0,
            AccessMode::Write => WRITE_BIT,
        };
        // SAFETY: a TensorPtr is made from a live tensor, and an operand is made while its
        // instruction is built, before any `Release` of it can run (TensorPtr's rule).
        let view = if unsafe { tensor.0.as_ref() }.shares_dependence() { VIEW_BIT } else { 0 };
        Operand(tensor.0.map_addr(|a| a | bit | view))
    }

    /// The dependence object of the operand's storage.
    ///
    /// # Safety
    /// As for [`tensor`](Self::tensor) and `TensorInner::own_dep_mut`: only the scheduler
    /// thread calls this, holding no other reference to the same storage's dependence
    /// object.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn dep(&self) -> &mut DepObject {
        // SAFETY: the contract.
        let t = unsafe { self.tensor() };
        // Used where an instruction leaves the scheduler's run (`Scheduler::apply_rules`):
        // the test of the bit is paid there, not in the run's loop (`own_dep`).
        let of = if self.0.addr().get() & VIEW_BIT == 0 { t } else { t.owner() };
        // SAFETY: the contract; `of`'s dependence object is its own (an owner's, or the
        // operand's own when the bit is clear).
        unsafe { of.own_dep_mut() }
    }

    /// The tensor.
    ///
    /// # Safety
    /// The instruction holding this operand is being submitted, admitted or run, so its
    /// tensor is alive ([`TensorPtr`]'s rule). An operand copied out of its instruction and
    /// kept after that may name a freed tensor: this call is what must not follow it.
    #[inline]
    pub(super) unsafe fn tensor(&self) -> &TensorInner {
        // SAFETY: the untagged pointer is the TensorPtr this operand was made from, alive
        // while the instruction holding it is submitted, admitted or run (the contract).
        unsafe { self.ptr().0.as_ref() }
    }

    /// The tensor as a pointer.
    #[inline]
    pub(super) fn ptr(&self) -> TensorPtr {
        // SAFETY: clearing the flag bits gives back the non-null, aligned tensor address.
        TensorPtr(unsafe {
            NonNull::new_unchecked(self.0.as_ptr().map_addr(|a| a & !(WRITE_BIT | VIEW_BIT)))
        })
    }

    /// Whether the tensor is a view whose dependence object is its owner's.
    #[inline]
    pub(super) fn is_shared_view(&self) -> bool {
        self.0.addr().get() & VIEW_BIT != 0
    }

    /// The tensor's own dependence object, for an operand that is not a shared view (an
    /// instruction whose `views` is false): [`dep`](Self::dep) without its branch, which
    /// slowed the scheduler's loop over operands (`Scheduler::admit_run`) as much as the
    /// load it replaces (`docs/performance.md`).
    ///
    /// # Safety
    /// As for [`dep`](Self::dep), and `!self.is_shared_view()`.
    #[inline(always)]
    #[allow(clippy::mut_from_ref)]
    pub(super) unsafe fn own_dep(&self) -> &mut DepObject {
        debug_assert!(!self.is_shared_view());
        // SAFETY: the contract.
        unsafe { self.tensor().own_dep_mut() }
    }

    /// How the instruction uses the tensor.
    #[inline]
    pub(super) fn mode(&self) -> AccessMode {
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

/// An operand list being put together (by soft sync, trace replay, the host accesses) before
/// it goes into a batch: inputs first (reads), then outputs (writes).
pub(super) type Operands = SmallVec<[Operand; 4]>;

/// What an instruction does; the policy of DESIGN.md's instruction table. Every payload is
/// at most two words, so that the body takes three.
pub(super) enum Body {
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
    Read(SlotSender),
    /// Overwrite a host tensor with these bytes (single operand).
    Write(Box<[u8]>),
    /// Report a host tensor's error state to the waiting caller (`Tensor::wait`).
    Wait(SlotSender),
}

impl std::fmt::Debug for Body {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl Body {
    /// The instruction's name in messages, timelines and traces.
    pub(super) fn name(&self) -> &'static str {
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

/// Operands an instruction keeps in itself.
pub(super) const INLINE_OPS: usize = 3;

/// An instruction's operands: up to [`INLINE_OPS`] in the instruction (`inline`), more in
/// its batch's operand arena (at `at`). Invariant: when `len <= INLINE_OPS`, the first `len`
/// slots of `inline` are initialised; the others are never read as operands.
#[derive(Clone, Copy)]
pub(super) struct OpList {
    len: u32,
    at: u32,
    inline: [MaybeUninit<Operand>; INLINE_OPS],
}

impl OpList {
    /// No operands.
    pub(super) const EMPTY: OpList = OpList { len: 0, at: 0, inline: [MaybeUninit::uninit(); INLINE_OPS] };

    /// Whether the operands are in the batch's arena.
    #[inline]
    fn in_arena(&self) -> bool {
        self.len as usize > INLINE_OPS
    }

    #[inline]
    fn arena_range(&self) -> std::ops::Range<usize> {
        self.at as usize..self.at as usize + self.len as usize
    }

    /// The operands kept in the instruction (call only when not [`in_arena`](Self::in_arena)).
    #[inline]
    fn inline_slice(&self) -> &[Operand] {
        debug_assert!(!self.in_arena());
        // SAFETY: an inline list's first `len` slots are initialised (the type's invariant),
        // and `MaybeUninit<Operand>` has `Operand`'s layout.
        unsafe { std::slice::from_raw_parts(self.inline.as_ptr().cast::<Operand>(), self.len as usize) }
    }

    /// The operands, borrowed where they lie: in the list itself or in `arena`, the arena of
    /// the batch the instruction belongs to.
    #[inline]
    fn slice<'a>(&'a self, arena: &'a [Operand]) -> &'a [Operand] {
        if self.in_arena() {
            &arena[self.arena_range()]
        } else {
            self.inline_slice()
        }
    }

    /// The operands as a reader that keeps no borrow of the instruction sees them.
    #[inline]
    fn view<'a>(&self, arena: &'a [Operand]) -> OpsRef<'a> {
        if self.in_arena() {
            OpsRef::Arena(&arena[self.arena_range()])
        } else {
            OpsRef::Inline(*self)
        }
    }
}

impl std::fmt::Debug for OpList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.in_arena() {
            write!(f, "{} operands at {} in the arena", self.len, self.at)
        } else {
            f.debug_list().entries(self.inline_slice()).finish()
        }
    }
}

/// An instruction's operands as a reader sees them: a copy of the inline ones, or the
/// arena's slice. Dereferences to `[Operand]`.
pub(super) enum OpsRef<'a> {
    Inline(OpList),
    Arena(&'a [Operand]),
}

impl std::ops::Deref for OpsRef<'_> {
    type Target = [Operand];
    #[inline]
    fn deref(&self) -> &[Operand] {
        match self {
            OpsRef::Inline(l) => l.inline_slice(),
            OpsRef::Arena(s) => s,
        }
    }
}

/// One instruction: one cache line, aligned to it, so that writing or reading one touches
/// one line and no other instruction's. Its operands: [`Batch::operands`].
#[derive(Debug)]
#[repr(align(64))]
pub(super) struct Instruction {
    pub(super) body: Body,
    pub(super) ops: OpList,
    pub(super) stream: StreamId,
    /// How many of the operands are inputs (an `OpCall`'s reads); 0 for other kinds.
    pub(super) n_inputs: u8,
    /// Whether an operand is a view whose dependence object is its owner's
    /// ([`Operand::dep`]): the scheduler's run of instructions whose operands are all their
    /// own (`Scheduler::admit_run`) stops before such an instruction.
    pub(super) views: bool,
}

impl Instruction {
    /// An instruction with no operands yet (a batch's `push` places them).
    pub(super) fn new(body: Body, stream: StreamId) -> Self {
        Instruction { body, ops: OpList::EMPTY, stream, n_inputs: 0, views: false }
    }

    /// Move the instruction out, leaving an inert one (no operands, never run) in its place.
    pub(super) fn take(&mut self) -> Instruction {
        std::mem::replace(self, Instruction::new(Body::Release { owner: None }, self.stream))
    }
}

/// The size and alignment of one instruction: what the bench's pipelines move per item, to
/// compare like with like.
#[cfg(all(test, feature = "cli"))]
pub(crate) const INSTRUCTION_LAYOUT: (usize, usize) =
    (std::mem::size_of::<Instruction>(), std::mem::align_of::<Instruction>());

/// Instructions in program order (per stream), the operands that do not fit in them, and
/// their program numbers.
///
/// Program numbers are given by the scheduler when it receives a batch: the builder's batch
/// gets one number for its first instruction (the others follow it); a batch the scheduler
/// puts together from instructions that waited carries one number per instruction.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(super) ins: Vec<Instruction>,
    /// The operands of the instructions that have more than [`INLINE_OPS`].
    ops: Vec<Operand>,
    /// The program number of `ins[0]`, when `numbers` is empty.
    first: u64,
    /// The program number of each instruction, when they are not consecutive.
    numbers: Vec<u64>,
    /// Whether an instruction other than an `OpCall` may be in `ins`: only those have
    /// anything to drop, so a batch of calls is emptied without visiting them.
    drops: bool,
}

// An `OpCall`'s payload has no drop glue: forgetting one leaks nothing (`Batch::clear`).
const _: () = {
    const fn copy<T: Copy>() {}
    copy::<KernelRef>();
    copy::<Attrs>();
};

/// The program number of instruction `i` of a batch whose first is `first`, or whose
/// numbers are `numbers` when they are not consecutive.
#[inline(always)]
fn program_at(first: u64, numbers: &[u64], i: usize) -> u64 {
    if numbers.is_empty() {
        first + i as u64
    } else {
        numbers[i]
    }
}

/// How many instructions ahead of the one it writes a builder asks for its line: a batch's
/// instruction lines were last read by the scheduler's and a worker's cores, so the
/// caller's write of each must first take the line from them; asked for a few
/// instructions early (`alloc::prefetch_for_write`), that transfer overlaps the calls in
/// between.
const PREFETCH_AHEAD: usize = 4;

impl Batch {
    /// An empty batch with room for `n` instructions.
    pub(crate) fn with_capacity(n: usize) -> Self {
        Batch { ins: Vec::with_capacity(n), ops: Vec::new(), first: 0, numbers: Vec::new(), drops: false }
    }

    /// Instruction `i`'s body, stream, input count and operands, to admit or run it in
    /// place: the operands are borrowed where they lie (in the instruction or the arena),
    /// beside the body.
    #[inline]
    pub(super) fn parts(&mut self, i: usize) -> (&mut Body, StreamId, u8, &[Operand]) {
        let Instruction { body, ops, stream, n_inputs, .. } = &mut self.ins[i];
        (body, *stream, *n_inputs, ops.slice(&self.ops))
    }

    /// Whether instruction `i` has an operand that is a view of another's storage (its
    /// `views`).
    #[inline(always)]
    pub(super) fn has_views(&self, i: usize) -> bool {
        self.ins[i].views
    }

    /// [`parts`](Self::parts) for running instruction `i`: its body, input count and
    /// operands, and its program number on demand (only an error names it, so the common
    /// path does not work it out).
    #[inline(always)]
    pub(super) fn parts_at(&mut self, i: usize) -> (&mut Body, u8, &[Operand], impl Fn() -> u64 + Copy + '_) {
        let Batch { ins, ops, first, numbers, .. } = self;
        let Instruction { body, ops: list, n_inputs, .. } = &mut ins[i];
        let (first, numbers) = (*first, &numbers[..]);
        let program = move || program_at(first, numbers, i);
        (body, *n_inputs, list.slice(ops), program)
    }

    /// The operands of `ins`, an instruction of this batch.
    #[inline]
    pub(super) fn operands(&self, ins: &Instruction) -> OpsRef<'_> {
        ins.ops.view(&self.ops)
    }

    /// Append `ins` with the operands `ops` (it takes them; whatever it held is replaced).
    #[inline]
    pub(super) fn push(&mut self, mut ins: Instruction, ops: &[Operand]) {
        ins.views = ops.iter().any(Operand::is_shared_view);
        ins.ops = self.place(ops.len(), ops.iter().copied());
        self.drops |= !matches!(ins.body, Body::OpCall { .. });
        self.ins.push(ins);
    }

    /// Append an `OpCall` of `kernel` with `attrs` on `stream`, with the operands `ops`,
    /// writing it field by field where it lies in the batch.
    ///
    /// Assembled on the stack and then moved, as `Vec::push` does when it may have to grow
    /// first, an instruction (or just its body, made before the room for it and kept
    /// across that call) is stored in words and reloaded in wider loads that the store
    /// buffer cannot forward: a stall on every call, longer than the rest of the call's
    /// emission. So the body is made here, after the room, from values in registers, and
    /// this is always inlined.
    ///
    /// `n_ops` is how many operands `ops` yields, which picks where they go; the list's
    /// length is what was really written, so a caller that passes a wrong count gets a
    /// shorter or longer list, never one that reads an unwritten slot. `n_inputs` is
    /// clamped to that length.
    #[inline(always)]
    pub(super) fn push_call(
        &mut self,
        kernel: KernelRef,
        attrs: Attrs,
        stream: StreamId,
        n_inputs: u8,
        n_ops: usize,
        ops: impl Iterator<Item = Operand>,
    ) {
        // The iterator is moved whole into the arena's `extend` (not lent to it), so that a
        // chain of slice maps keeps its exact length there and is copied without a capacity
        // check and a length store per operand.
        let to_arena = n_ops > INLINE_OPS;
        let (at, len, inline) = if to_arena {
            let (at, len) = self.append_to_arena(ops);
            (at, len, None)
        } else {
            (0, 0, Some(ops))
        };
        self.ins.reserve(1);
        let len_now = self.ins.len();
        // SAFETY: `reserve(1)` left room for an element at index `len_now`; every field is
        // written before `set_len` makes it part of the vector. An inline list gets as its
        // length the number of slots written (the rest stay uninitialised, which `OpList`
        // allows); an arena list the number of operands appended, and one of at most
        // `INLINE_OPS` there (a wrong `n_ops`) is moved inline by `settle`.
        unsafe {
            let p = self.ins.as_mut_ptr().add(len_now);
            std::ptr::addr_of_mut!((*p).body).write(Body::OpCall { kernel, attrs });
            let l = std::ptr::addr_of_mut!((*p).ops);
            std::ptr::addr_of_mut!((*l).at).write(at);
            let mut written = len;
            let views = if let Some(ops) = inline {
                let slots = std::ptr::addr_of_mut!((*l).inline).cast::<MaybeUninit<Operand>>();
                written = 0;
                let mut bits = 0;
                for op in ops.take(INLINE_OPS) {
                    bits |= op.0.addr().get();
                    slots.add(written as usize).write(MaybeUninit::new(op));
                    written += 1;
                }
                bits & VIEW_BIT != 0
            } else {
                self.ops[at as usize..(at + len) as usize].iter().any(Operand::is_shared_view)
            };
            std::ptr::addr_of_mut!((*p).views).write(views);
            std::ptr::addr_of_mut!((*l).len).write(written);
            std::ptr::addr_of_mut!((*p).stream).write(stream);
            std::ptr::addr_of_mut!((*p).n_inputs).write(n_inputs.min(written.min(u32::from(u8::MAX)) as u8));
            self.ins.set_len(len_now + 1);
        }
        crate::alloc::prefetch_for_write(self.ins.as_ptr().wrapping_add(len_now + PREFETCH_AHEAD), 1);
        if to_arena && len as usize <= INLINE_OPS {
            self.settle_last();
        }
    }

    /// The last instruction's operands went to the arena but fit in it: move them inline
    /// (only a caller whose operand count was wrong gets here).
    #[cold]
    fn settle_last(&mut self) {
        let Some(ins) = self.ins.last_mut() else { return };
        let (at, n) = (ins.ops.at as usize, ins.ops.len as usize);
        let moved: SmallVec<[Operand; INLINE_OPS]> = self.ops[at..at + n].iter().copied().collect();
        self.ops.truncate(at);
        let mut l = OpList { len: n as u32, ..OpList::EMPTY };
        for (slot, op) in l.inline.iter_mut().zip(moved) {
            *slot = MaybeUninit::new(op);
        }
        ins.ops = l;
    }

    /// Put the operands `ops` at the end of the arena; returns where they start and how many
    /// were put there.
    ///
    /// Always inlined: called out of line, it takes the iterator through memory that its
    /// caller wrote in words and reads it in wider loads, the store-forwarding stall that
    /// [`push_call`](Self::push_call) describes, which made each wide call's append cost
    /// more than the rest of its emission.
    #[inline(always)]
    fn append_to_arena(&mut self, ops: impl Iterator<Item = Operand>) -> (u32, u32) {
        let at = self.ops.len();
        self.ops.extend(ops);
        let n = self.ops.len() - at;
        (
            u32::try_from(at).expect("a batch holds fewer than 2^32 operands"),
            u32::try_from(n).expect("an instruction has fewer than 2^32 operands"),
        )
    }

    /// Where the operands `ops` go for an instruction of this batch: in the instruction if
    /// they fit, else at the end of the arena. The list's length is the number of operands
    /// `ops` really yields, whatever `n` says (`n` only picks the place first).
    #[inline]
    pub(super) fn place(&mut self, n: usize, ops: impl Iterator<Item = Operand>) -> OpList {
        let mut l = OpList::EMPTY;
        if n <= INLINE_OPS {
            for (slot, op) in l.inline.iter_mut().zip(ops) {
                *slot = MaybeUninit::new(op);
                l.len += 1;
            }
        } else {
            let (at, len) = self.append_to_arena(ops);
            if len as usize <= INLINE_OPS {
                let start = at as usize;
                for (slot, op) in l.inline.iter_mut().zip(self.ops.drain(start..)) {
                    *slot = MaybeUninit::new(op);
                }
            } else {
                l.at = at;
            }
            l.len = len;
        }
        l
    }

    /// Append an `OpCall` of `kernel` with `attrs` on `stream`, reading `inputs` and writing
    /// `outputs` (at most [`u8::MAX`] inputs: the builder refuses more).
    ///
    /// # Safety
    /// Every tensor of `inputs` and `outputs` must stay alive while this batch is built and
    /// get its `Release` only after the batch is submitted: [`TensorPtr::new`]'s contract.
    #[inline(always)]
    pub(crate) unsafe fn push_call_of<T: AsObject>(
        &mut self,
        kernel: KernelRef,
        attrs: Attrs,
        stream: StreamId,
        inputs: &[&T],
        outputs: &[&T],
    ) {
        debug_assert!(inputs.len() <= usize::from(u8::MAX));
        // SAFETY (both maps): the caller's contract is `TensorPtr::new`'s.
        let reads =
            inputs.iter().map(|t| Operand::new(unsafe { TensorPtr::new(t.object()) }, AccessMode::Read));
        let writes =
            outputs.iter().map(|t| Operand::new(unsafe { TensorPtr::new(t.object()) }, AccessMode::Write));
        let n = inputs.len() + outputs.len();
        self.push_call(kernel, attrs, stream, inputs.len() as u8, n, reads.chain(writes));
    }

    /// Append a `RecordEvent` of event `id` on `stream`, after `tensors`' uses there.
    ///
    /// # Safety
    /// As for [`push_call_of`](Self::push_call_of), for each of `tensors`.
    pub(crate) unsafe fn push_record_event<'t>(
        &mut self,
        id: u64,
        stream: StreamId,
        tensors: impl Iterator<Item = &'t TensorInner>,
    ) {
        // SAFETY: the caller's contract is `TensorPtr::new`'s.
        let ops: Operands =
            tensors.map(|t| Operand::new(unsafe { TensorPtr::new(t) }, AccessMode::Read)).collect();
        self.push(Instruction::new(Body::RecordEvent { id }, stream), &ops);
    }

    /// Append a `StreamWaitEvent` on `stream` for event `id`.
    pub(crate) fn push_stream_wait(&mut self, id: u64, stream: StreamId) {
        self.push(Instruction::new(Body::StreamWaitEvent { id }, stream), &[]);
    }

    /// Append a host access on `stream` that reads `t` into `slot` (`wait_only`: only its
    /// error state).
    ///
    /// # Safety
    /// As for [`push_call_of`](Self::push_call_of), for `t`.
    pub(crate) unsafe fn push_read(
        &mut self,
        t: &TensorInner,
        stream: StreamId,
        slot: Arc<AccessSlot>,
        wait_only: bool,
    ) {
        // SAFETY: the caller's contract is `TensorPtr::new`'s.
        let op = Operand::new(unsafe { TensorPtr::new(t) }, AccessMode::Read);
        let slot = SlotSender::new(slot);
        let body = if wait_only { Body::Wait(slot) } else { Body::Read(slot) };
        self.push_one(body, stream, op);
    }

    /// Append a host access on `stream` that overwrites `t` with `bytes`.
    ///
    /// # Safety
    /// As for [`push_call_of`](Self::push_call_of), for `t`.
    pub(crate) unsafe fn push_write(&mut self, t: &TensorInner, stream: StreamId, bytes: Box<[u8]>) {
        // SAFETY: the caller's contract is `TensorPtr::new`'s.
        let op = Operand::new(unsafe { TensorPtr::new(t) }, AccessMode::Write);
        self.push_one(Body::Write(bytes), stream, op);
    }

    /// Append the `Release` of the tensor `owner` holds, on `stream`. Safe: the instruction
    /// owns the count that keeps the tensor alive.
    #[inline]
    pub(crate) fn push_release(&mut self, owner: TensorOwner, stream: StreamId) {
        // SAFETY: the instruction owns `owner`, so the pointer lives as long as it.
        let op = Operand::new(unsafe { TensorPtr::new(&owner) }, AccessMode::Write);
        self.push_one(Body::Release { owner: Some(owner) }, stream, op);
    }

    /// Append an instruction of one operand, other than a call: written field by field
    /// where it lies in the batch, as [`push_call`](Self::push_call) writes a call and for
    /// its reason. Every dropped handle of an eager front end emits a `Release` and every
    /// read of a result a host access, so these are as frequent as calls.
    #[inline(always)]
    fn push_one(&mut self, body: Body, stream: StreamId, op: Operand) {
        self.ins.reserve(1);
        let len_now = self.ins.len();
        // SAFETY: `reserve(1)` left room for an element at index `len_now`; every field is
        // written before `set_len` makes it part of the vector (the operand list's one
        // inline slot, as its length says; the others stay uninitialised, which `OpList`
        // allows).
        unsafe {
            let p = self.ins.as_mut_ptr().add(len_now);
            std::ptr::addr_of_mut!((*p).body).write(body);
            let l = std::ptr::addr_of_mut!((*p).ops);
            std::ptr::addr_of_mut!((*l).at).write(0);
            std::ptr::addr_of_mut!((*l).inline).cast::<MaybeUninit<Operand>>().write(MaybeUninit::new(op));
            std::ptr::addr_of_mut!((*l).len).write(1);
            std::ptr::addr_of_mut!((*p).stream).write(stream);
            std::ptr::addr_of_mut!((*p).n_inputs).write(0);
            std::ptr::addr_of_mut!((*p).views).write(op.is_shared_view());
            self.ins.set_len(len_now + 1);
        }
        self.drops = true;
    }

    /// Number the instructions consecutively from `first`.
    #[inline]
    pub(super) fn number_from(&mut self, first: u64) {
        self.first = first;
        self.numbers.clear();
    }

    /// Append an instruction with its operands and its program number (a batch built this
    /// way carries one number per instruction).
    #[inline]
    pub(super) fn push_numbered(&mut self, mut ins: Instruction, ops: &[Operand], program: u64) {
        ins.ops = self.place(ops.len(), ops.iter().copied());
        self.push_placed(ins, program);
    }

    /// Append `ins`, whose operands were already placed in this batch's arena
    /// ([`place`](Self::place)), with its program number (a batch built this way carries
    /// one number per instruction).
    #[inline]
    pub(super) fn push_placed(&mut self, ins: Instruction, program: u64) {
        if self.numbers.len() < self.ins.len() {
            // Consecutive so far: spell the numbers out before this one breaks the run.
            let first = self.first;
            self.numbers.extend((0..self.ins.len() as u64).map(|i| first + i));
        }
        self.drops |= !matches!(ins.body, Body::OpCall { .. });
        self.ins.push(ins);
        self.numbers.push(program);
    }

    /// The program number of instruction `i`.
    #[inline]
    pub(super) fn program(&self, i: usize) -> u64 {
        program_at(self.first, &self.numbers, i)
    }

    pub(crate) fn len(&self) -> usize {
        self.ins.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.ins.is_empty()
    }

    /// Drop the instructions, keeping the memory for reuse. A batch of `OpCall`s only is
    /// emptied without visiting them: they have nothing to drop.
    pub(crate) fn clear(&mut self) {
        if self.drops {
            self.ins.clear();
            self.drops = false;
        } else {
            debug_assert!(self
                .ins
                .iter()
                .all(|i| matches!(i.body, Body::OpCall { .. } | Body::Release { owner: None })));
            // SAFETY: only `push` and `push_placed` add instructions other than `OpCall`s,
            // and both set `drops`; an `OpCall`'s fields have no drop glue (the assertion
            // after `Batch`), nor has the inert instruction `Instruction::take` leaves in
            // its place, so forgetting them is what dropping them would do.
            unsafe { self.ins.set_len(0) };
        }
        self.ops.clear();
        self.numbers.clear();
    }

    /// Move every instruction out, each with its operands and program number, leaving the
    /// batch empty (its memory kept).
    pub(super) fn drain_each(&mut self, mut f: impl FnMut(Instruction, &[Operand], u64)) {
        let arena = std::mem::take(&mut self.ops);
        for (i, ins) in self.ins.drain(..).enumerate() {
            let program = if self.numbers.is_empty() { self.first + i as u64 } else { self.numbers[i] };
            let ops = ins.ops.view(&arena);
            f(ins, &ops, program);
        }
        self.ops = arena;
        self.clear();
    }

    /// Whether this batch has kept no memory worth pooling.
    pub(crate) fn has_capacity(&self) -> bool {
        self.ins.capacity() > 0
    }

    /// The batch will never run (a dead engine buries it): drop every instruction but the
    /// `Release`s, which own tensors that instructions already handed to a worker may still
    /// use, and so must outlive the engine's threads. Dropping a host access answers its
    /// waiter ([`SlotSender`]), and so does dropping a barrier's callback.
    pub(crate) fn abandon(&mut self) {
        // A `Release` has one operand, kept in the instruction: the arena and the numbers
        // are of no use once nothing runs.
        self.ins.retain(|i| matches!(i.body, Body::Release { owner: Some(_) }));
        self.ops.clear();
        self.numbers.clear();
    }
}

/// Where a host access hands its result to the caller waiting for it: a
/// [`Rendezvous`] (its module docs have the protocol), and, for an access that lends the
/// tensor's storage (`Tensor::lend_host`), the loan.
///
/// The caller keeps the slot and waits on it ([`wait`](Self::wait)); the instruction holds
/// its sending side ([`SlotSender`]), which answers [`Error::ShutDown`] if the instruction
/// is dropped without having run, so that no waiter waits for an engine that is gone.
#[derive(Debug, Default)]
pub(crate) struct AccessSlot {
    result: Rendezvous<Result<Vec<u8>, Error>>,
    /// Whether the access lends the tensor's storage: a `Wait` that puts a loan of the bytes
    /// in `loan` before it fulfils the slot.
    lend: bool,
    loan: Mutex<Option<crate::alloc::HostLoan>>,
}

impl AccessSlot {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(AccessSlot::default())
    }

    /// A slot whose `Wait` lends the storage (`lend`).
    pub(crate) fn lending() -> Arc<Self> {
        Arc::new(AccessSlot { lend: true, ..AccessSlot::default() })
    }

    /// Whether the access lends the storage.
    pub(crate) fn lends(&self) -> bool {
        self.lend
    }

    /// Keep the loan for the waiter (before [`fulfil`](Self::fulfil)).
    pub(crate) fn keep_loan(&self, loan: crate::alloc::HostLoan) {
        *self.loan.lock() = Some(loan);
    }

    /// The loan kept, once the wait has returned.
    pub(crate) fn take_loan(&self) -> Option<crate::alloc::HostLoan> {
        self.loan.lock().take()
    }

    /// Hand the result to the waiter.
    pub(crate) fn fulfil(&self, r: Result<Vec<u8>, Error>) {
        self.result.fulfil(r);
    }

    /// Block until answered, re-checking as `backoff` says before sleeping: the result, or
    /// [`Error::ShutDown`] if the instruction was dropped without having run.
    pub(crate) fn wait(&self, backoff: crate::sync::notify::Backoff) -> Result<Vec<u8>, Error> {
        self.result.wait(backoff).unwrap_or(Err(Error::ShutDown))
    }
}

/// The sending side of an [`AccessSlot`], as an instruction (or a barrier's callback)
/// holds it: dropped before the slot was fulfilled, it tells the waiter that no result will
/// come.
#[derive(Debug)]
pub(crate) struct SlotSender(Arc<AccessSlot>);

impl SlotSender {
    /// The sending side of `slot`.
    pub(crate) fn new(slot: Arc<AccessSlot>) -> Self {
        SlotSender(slot)
    }
}

impl std::ops::Deref for SlotSender {
    type Target = AccessSlot;
    #[inline(always)]
    fn deref(&self) -> &AccessSlot {
        &self.0
    }
}

impl Drop for SlotSender {
    fn drop(&mut self) {
        // The common case, an access that ran, skips the lock.
        if !self.0.result.is_done() {
            self.0.result.abandon();
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
        assert_eq!(std::mem::size_of::<OpList>(), 32);
        assert_eq!(std::mem::size_of::<Instruction>(), 64);
        assert_eq!(std::mem::align_of::<Instruction>(), 64);
    }

    #[test]
    fn an_operand_gives_back_its_tensor_and_mode() {
        use crate::ep::DeviceId;
        use crate::vm::tensor::TensorInner;
        use crate::vm::{DType, TensorMeta};
        let t = TensorInner::for_test(7, TensorMeta::new(&[2], DType::F32, DeviceId::CPU));
        // SAFETY: `t` outlives every operand made here, and none is put in an instruction.
        let p = unsafe { TensorPtr::new(t.as_ref()) };
        for mode in [AccessMode::Read, AccessMode::Write] {
            let o = Operand::new(p, mode);
            assert_eq!((o.mode(), o.ptr()), (mode, p));
            // SAFETY: `t` outlives the operand.
            let back = unsafe { o.tensor() };
            assert_eq!(back.id, 7);
            assert!(std::ptr::eq(back, t.as_ref()));
        }
    }

    #[test]
    fn batches_number_their_instructions_and_keep_their_operands() {
        use crate::ep::DeviceId;
        use crate::vm::tensor::TensorInner;
        use crate::vm::{DType, TensorMeta};
        let t = TensorInner::for_test(7, TensorMeta::new(&[2], DType::F32, DeviceId::CPU));
        // SAFETY: `t` outlives every operand made here, and no instruction here ever runs.
        let op = |mode| Operand::new(unsafe { TensorPtr::new(t.as_ref()) }, mode);
        let (r, w) = (op(AccessMode::Read), op(AccessMode::Write));
        let inert = || Instruction::new(Body::RecordEvent { id: 1 }, StreamId(0));
        let mut b = Batch::with_capacity(4);
        b.push(inert(), &[r, r, w]);
        b.push(inert(), &[]);
        b.push(inert(), &[w]);
        b.number_from(10);
        assert_eq!((b.program(0), b.program(2)), (10, 12));
        assert_eq!(*b.operands(&b.ins[0]), [r, r, w]);
        assert!(b.operands(&b.ins[1]).is_empty());
        assert_eq!(b.parts(2).3, [w]);
        b.push_numbered(inert(), &[r; 9], 40);
        assert!(b.ins[3].ops.in_arena(), "more than fit inline");
        assert_eq!((0..4).map(|i| b.program(i)).collect::<Vec<_>>(), [10, 11, 12, 40]);
        assert_eq!(*b.operands(&b.ins[3]), [r; 9]);
        b.push_numbered(inert(), &[w, r, r, w], 41);
        let mut moved = Batch::default();
        b.drain_each(|ins, ops, program| moved.push_numbered(ins, ops, program));
        assert!(b.is_empty() && b.ops.is_empty());
        assert_eq!(*moved.operands(&moved.ins[0]), [r, r, w]);
        assert_eq!(*moved.operands(&moved.ins[3]), [r; 9]);
        assert_eq!(*moved.operands(&moved.ins[4]), [w, r, r, w]);
        assert_eq!(moved.program(3), 40);
        moved.clear();
        moved.push_numbered(inert(), &[], 7);
        moved.push_numbered(inert(), &[], 3);
        assert_eq!((moved.program(0), moved.program(1)), (7, 3));
    }

    #[test]
    fn an_instruction_with_a_view_says_so_and_its_operand_reaches_the_owners_dependence() {
        use crate::ep::DeviceId;
        use crate::vm::tensor::{MetaId, TensorInner};
        use crate::vm::{DType, TensorMeta};
        let meta = TensorMeta::new(&[2, 3], DType::F32, DeviceId::CPU);
        let owner = TensorInner::for_test(1, meta.clone());
        let at = NonNull::from(owner.as_ref());
        let row = meta.with_layout(&[3], &[1], 3);
        // SAFETY: `owner` is an owner and outlives both views (dropped last); nothing counts
        // them, since no instruction here runs and no handle is made.
        let (view, split) = unsafe {
            (
                Box::new(TensorInner::new_view(2, row.clone(), MetaId::NONE, at, false)),
                Box::new(TensorInner::new_view(3, row, MetaId::NONE, at, true)),
            )
        };
        // SAFETY: the three objects outlive every operand made here.
        let op = |t: &TensorInner, mode| Operand::new(unsafe { TensorPtr::new(t) }, mode);
        let (o, v, x) =
            (op(&owner, AccessMode::Write), op(&view, AccessMode::Read), op(&split, AccessMode::Read));
        assert!(!o.is_shared_view() && v.is_shared_view());
        assert!(!x.is_shared_view(), "the planted fault keeps a dependence object of its own");
        assert_eq!((v.mode(), o.mode()), (AccessMode::Read, AccessMode::Write));
        // SAFETY: the objects are alive; each reference is dropped before the next is made.
        let dep = |o: &Operand| unsafe { o.dep() } as *mut DepObject;
        assert_eq!(dep(&v), dep(&o), "a view's dependence object is its owner's");
        assert_ne!(dep(&x), dep(&o));
        // SAFETY: as above.
        assert!(std::ptr::eq(unsafe { v.tensor() }, view.as_ref()));

        // Every way into a batch records it: an inline call, a call in the arena, a push.
        let mut b = Batch::with_capacity(8);
        static NOOP: &dyn crate::vm::OpKernel = &Noop;
        let kernel = crate::vm::KernelRef::new(&NOOP);
        let call = |b: &mut Batch, ts: &[&TensorInner]| {
            // SAFETY: the tensors outlive the batch, whose instructions never run.
            unsafe { b.push_call_of(kernel, crate::vm::Attrs::default(), StreamId(0), &ts[1..], &ts[..1]) }
        };
        call(&mut b, &[&owner, &owner]);
        call(&mut b, &[&owner, &view]);
        call(&mut b, &[&owner, &split]);
        call(&mut b, &[&owner, &owner, &owner, &owner, &owner, &view]);
        call(&mut b, &[&owner, &owner, &owner, &owner, &owner, &owner]);
        b.push(Instruction::new(Body::RecordEvent { id: 1 }, StreamId(0)), &[o, v]);
        b.push(Instruction::new(Body::RecordEvent { id: 2 }, StreamId(0)), &[o, x]);
        let slot = AccessSlot::new();
        // SAFETY: as for the calls above.
        unsafe {
            b.push_read(&view, StreamId(0), slot.clone(), false);
            b.push_read(&owner, StreamId(0), slot.clone(), true);
            b.push_write(&view, StreamId(0), Box::new([0; 12]));
        }
        assert!(b.ins[3].ops.in_arena() && b.ins[4].ops.in_arena());
        let views: Vec<bool> = (0..b.len()).map(|i| b.has_views(i)).collect();
        assert_eq!(views, [false, true, false, true, false, true, false, true, false, true]);
        // The one-operand instructions are written in place: one operand, no inputs.
        assert_eq!(*b.operands(&b.ins[7]), [v]);
        assert_eq!(b.ins[7].n_inputs, 0);
        assert_eq!(*b.operands(&b.ins[8]), [op(&owner, AccessMode::Read)]);
        assert_eq!(*b.operands(&b.ins[9]), [op(&view, AccessMode::Write)]);
        assert!(matches!(b.ins[9].body, Body::Write(_)));
        drop(b);
        drop((view, split));
    }

    /// A kernel that does nothing.
    struct Noop;

    impl crate::vm::OpKernel for Noop {
        fn name(&self) -> &'static str {
            "noop"
        }
        fn infer(
            &self,
            _: &[&crate::vm::TensorMeta],
            _: &[&crate::vm::TensorMeta],
            _: &crate::vm::Attrs,
            _: &mut crate::vm::OutSpecs,
        ) -> Result<(), String> {
            Ok(())
        }
        fn compute(&self, _: &mut crate::vm::KernelCtx<'_, '_>) -> Result<(), String> {
            Ok(())
        }
    }

    #[test]
    fn emptying_a_batch_drops_what_its_instructions_hold() {
        use crate::vm::{Attrs, KernelRef};
        let slot = AccessSlot::new();
        static NOOP: &dyn crate::vm::OpKernel = &Noop;
        let kernel = KernelRef::new(&NOOP);
        let mut b = Batch::with_capacity(4);
        for _ in 0..3 {
            b.push_call(kernel, Attrs::default(), StreamId(0), 0, 0, std::iter::empty());
        }
        b.clear();
        assert!(b.is_empty(), "a batch of calls is emptied without visiting them");
        b.push_call(kernel, Attrs::default(), StreamId(0), 0, 0, std::iter::empty());
        b.push(Instruction::new(Body::Read(SlotSender::new(slot.clone())), StreamId(0)), &[]);
        b.push_numbered(Instruction::new(Body::Wait(SlotSender::new(slot.clone())), StreamId(0)), &[], 9);
        assert_eq!(Arc::strong_count(&slot), 3);
        b.clear();
        assert_eq!(Arc::strong_count(&slot), 1, "the accesses' slots are dropped");
        // The batch forgets that it held them: calls alone are emptied the quick way again.
        b.push(Instruction::new(Body::Read(SlotSender::new(slot.clone())), StreamId(0)), &[]);
        b.clear();
        assert_eq!(Arc::strong_count(&slot), 1);
    }

    #[test]
    fn an_access_dropped_unrun_answers_its_waiter_and_an_abandoned_batch_keeps_its_releases() {
        use crate::ep::DeviceId;
        use crate::vm::tensor::{TensorInner, TensorOwner};
        use crate::vm::{DType, TensorMeta};
        let (read, ran) = (AccessSlot::new(), AccessSlot::new());
        let t = TensorInner::for_test(7, TensorMeta::new(&[2], DType::F32, DeviceId::CPU));
        let t = TensorOwner::counted(&t);
        let mut b = Batch::with_capacity(4);
        b.push(Instruction::new(Body::Read(SlotSender::new(read.clone())), StreamId(0)), &[]);
        b.push_release(t, StreamId(0));
        let sender = SlotSender::new(ran.clone());
        sender.fulfil(Ok(vec![1]));
        b.push(Instruction::new(Body::Wait(sender), StreamId(0)), &[]);
        b.abandon();
        assert_eq!(b.len(), 1, "only the release is kept");
        assert!(matches!(b.ins[0].body, Body::Release { owner: Some(_) }));
        let backoff = crate::sync::notify::Backoff::NONE;
        assert_eq!(read.wait(backoff), Err(Error::ShutDown), "the dropped read answers");
        assert_eq!(ran.wait(backoff), Ok(vec![1]), "an answer given stands");
        b.clear();
    }

    #[test]
    fn a_wrong_operand_count_never_exposes_an_unwritten_slot() {
        use crate::ep::DeviceId;
        use crate::vm::tensor::TensorInner;
        use crate::vm::{Attrs, DType, KernelRef, TensorMeta};
        static NOOP: &dyn crate::vm::OpKernel = &Noop;
        let kernel = KernelRef::new(&NOOP);
        let t = TensorInner::for_test(7, TensorMeta::new(&[2], DType::F32, DeviceId::CPU));
        // SAFETY: `t` outlives every operand made here, and no instruction here ever runs.
        let op = |mode| Operand::new(unsafe { TensorPtr::new(&t) }, mode);
        let (r, w) = (op(AccessMode::Read), op(AccessMode::Write));
        let mut b = Batch::with_capacity(4);
        // Five announced, two given: they end up inline, as two.
        b.push_call(kernel, Attrs::default(), StreamId(0), 2, 5, [r, w].into_iter());
        // One announced, four given: the first three fit inline; the input count is clamped.
        b.push_call(kernel, Attrs::default(), StreamId(0), 9, 1, [r, r, w, w].into_iter());
        // Five announced and given: in the arena.
        b.push_call(kernel, Attrs::default(), StreamId(0), 4, 5, [r, r, r, r, w].into_iter());
        assert_eq!(*b.operands(&b.ins[0]), [r, w]);
        assert!(!b.ins[0].ops.in_arena());
        assert_eq!(*b.operands(&b.ins[1]), [r, r, w]);
        assert_eq!(b.ins[1].n_inputs, 3);
        assert_eq!(*b.operands(&b.ins[2]), [r, r, r, r, w]);
        assert!(b.ins[2].ops.in_arena());
        let placed = b.place(6, [w].into_iter());
        assert_eq!(placed.len, 1);
        assert!(!placed.in_arena());
        let placed = b.place(2, [r, r, r, w].into_iter());
        assert_eq!(placed.len, 3, "an inline list keeps what fits");
    }
}
