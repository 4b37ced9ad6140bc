//! Observers: read-only views of what the engine admitted, dispatched and finished.
//!
//! The engine knows nothing of the layers that watch it. It offers two attachment points,
//! each costing one relaxed load and a branch per batch while nothing is attached:
//!
//! - [`SubmitObserver`]: sees every batch the engine receives, in exactly the order the
//!   scheduler receives them (the engine holds the observer's lock across the splice into
//!   its inbox), as a [`Submitted`] view: each instruction's kind, stream and operands
//!   (tensor id, meta, and for a view the id and meta of its storage's owner). The trace recorder (`trace::record`) is one.
//! - [`Timeline`] ([`timeline`]): while a session is open, the scheduler, the workers and
//!   the watchers record what they admitted, dispatched, ran and saw done, batch by batch,
//!   into per-thread buffers handed to a lock-free sink. The profiler (`profile`) opens a
//!   session, drains the records and builds a timeline from them.
//!
//! Neither view lends out an instruction, an operand or a tensor object: what leaves the
//! engine is names, numbers and metas.

pub(crate) mod timeline;

pub(crate) use super::dependence::InstrRef;
use super::instruction::{Batch, Body, Instruction, OpsRef};
use super::stream::StreamId;
use super::tensor::TensorMeta;
pub(crate) use timeline::{Chunk, Link, Nanos, Rec, Recorder, Timeline};

/// A VM thread that records: the scheduler, a worker, or an asynchronous stream's watcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadRole {
    /// The scheduler thread (`eagervm-scheduler`).
    Scheduler,
    /// Worker `i` (`eagervm-worker-<i>`).
    Worker(u32),
    /// The watcher of the asynchronous stream with this index (`eagervm-watch-<stream>`).
    Watcher(u32),
}

/// Sees every batch the engine receives, in the order the scheduler receives them.
///
/// Called on the submitting thread, under the engine's observer lock, before the batch
/// enters the inbox: keep it short (copy what is needed and hand it to a thread of your
/// own, as the trace recorder does).
pub(crate) trait SubmitObserver: Send {
    /// A batch the engine is about to receive.
    fn submitted(&mut self, batch: Submitted<'_>);
    /// Which attachment this is: an owner detaches only its own observer.
    fn owner(&self) -> u64;
}

/// A read-only view of a submitted batch.
#[derive(Clone, Copy)]
pub(crate) struct Submitted<'a>(&'a Batch);

impl<'a> Submitted<'a> {
    pub(super) fn new(batch: &'a Batch) -> Self {
        Submitted(batch)
    }

    /// The batch's instructions, in order.
    pub(crate) fn instructions(self) -> impl Iterator<Item = InstrView<'a>> {
        let b = self.0;
        b.ins.iter().map(move |ins| InstrView { ins, ops: b.operands(ins) })
    }
}

/// One submitted instruction.
pub(crate) struct InstrView<'a> {
    ins: &'a Instruction,
    ops: OpsRef<'a>,
}

/// What a submitted instruction does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum InstrKind<'a> {
    /// A kernel call: the op, its attributes, how many operands it reads.
    Call { op: &'static str, attrs: crate::vm::Attrs, n_inputs: u8 },
    /// Record event `id`.
    RecordEvent { id: u64 },
    /// Wait, on the device, for event `id`.
    StreamWaitEvent { id: u64 },
    /// A barrier (`sync`).
    Barrier,
    /// Free the operand's storage.
    Release,
    /// Copy the operand's bytes out to the host.
    Read,
    /// Report the operand's error state to the host.
    Wait,
    /// Overwrite the operand with these bytes.
    Write(&'a [u8]),
}

/// One operand of a submitted instruction.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OperandView<'a> {
    /// The tensor's id.
    pub(crate) id: u64,
    /// Its shape, dtype and device (for a view, its own layout in the storage).
    pub(crate) meta: &'a TensorMeta,
    /// For a view, the owner of its storage: the owner's id and meta (a view of a view
    /// names the owner, never the other view). `None` for a tensor that owns its storage.
    pub(crate) owner: Option<(u64, &'a TensorMeta)>,
}

impl<'a> InstrView<'a> {
    /// What it does.
    pub(crate) fn kind(&self) -> InstrKind<'a> {
        match &self.ins.body {
            Body::OpCall { kernel, attrs } => {
                InstrKind::Call { op: kernel.name(), attrs: *attrs, n_inputs: self.ins.n_inputs }
            }
            Body::RecordEvent { id } => InstrKind::RecordEvent { id: *id },
            Body::StreamWaitEvent { id } => InstrKind::StreamWaitEvent { id: *id },
            Body::WaitEvent { .. } => unreachable!("the scheduler makes these, after submission"),
            Body::Barrier { .. } => InstrKind::Barrier,
            Body::Release { .. } => InstrKind::Release,
            Body::Read(_) => InstrKind::Read,
            Body::Wait(_) => InstrKind::Wait,
            Body::Write(bytes) => InstrKind::Write(bytes),
        }
    }

    /// The stream it runs on.
    pub(crate) fn stream(&self) -> StreamId {
        self.ins.stream
    }

    /// Its operands: reads first, then writes.
    pub(crate) fn operands(&self) -> impl Iterator<Item = OperandView<'_>> {
        // Every operand of a submitted instruction names a live tensor: the submitter holds
        // a handle of each (or, for a `Release`, the instruction owns one).
        self.ops.iter().map(|o| {
            // SAFETY: the instruction is being submitted, so its operands' tensors are alive.
            let t = unsafe { o.tensor() };
            // A view keeps its owner alive (`TensorInner`'s docs, "Ownership").
            let owner = t.is_view().then(|| {
                let o = t.owner();
                (o.id, &o.meta)
            });
            OperandView { id: t.id, meta: &t.meta, owner }
        })
    }
}
