//! Trace replay's emitters: instructions exactly as a trace gives them, with no checks and
//! no soft sync (`trace::replay` without `--resync`, which validated the trace beforehand
//! and replays the trace's own `RecordEvent` and `StreamWaitEvent` instructions). They
//! write into a builder's batch, and so take part in its batches and in the release rule
//! as any call does, but they are not the builder's: [`InstructionsBuilder::raw`] lends
//! them.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::framework::tensor::Tensor;
use crate::framework::Attrs;
use crate::vm::instruction::AccessSlot;
use crate::vm::tensor::TensorOwner;
use crate::vm::{KernelRef, StreamId};

use super::InstructionsBuilder;

/// A builder's batch, written as a trace gives it (module docs).
pub(crate) struct Raw<'b, 'vm>(pub(super) &'b mut InstructionsBuilder<'vm>);

impl Raw<'_, '_> {
    /// Mark `tensors` used on `stream`, with no soft sync (the trace carries its own), and
    /// open the batch.
    fn mark<'t>(&mut self, stream: StreamId, tensors: impl Iterator<Item = &'t Tensor>) {
        self.0.open_if_idle();
        for t in tensors {
            t.inner().last_stream.store(stream.0, Ordering::Relaxed);
            t.inner().owner().last_stream.store(stream.0, Ordering::Relaxed);
        }
    }

    /// Emit an `OpCall` exactly as given. At most [`MAX_INPUTS`](super::MAX_INPUTS) inputs.
    pub(crate) fn call(
        &mut self,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) {
        self.mark(stream, inputs.iter().chain(outputs).copied());
        // SAFETY: the replay holds every tensor's handle until it emits the tensor's
        // `Release`, after this batch.
        unsafe { self.0.batch.push_call_of(kernel, attrs, stream, inputs, outputs) };
        self.0.flush_if_full();
    }

    /// Emit a `RecordEvent` of event `id` on `stream` after `tensors`' uses, as given.
    pub(crate) fn record_event(&mut self, id: u64, stream: StreamId, tensors: &[&Tensor]) {
        self.mark(stream, tensors.iter().copied());
        // SAFETY: as in `call`.
        unsafe { self.0.batch.push_record_event(id, stream, tensors.iter().map(|t| t.inner())) };
        self.0.flush_if_full();
    }

    /// Emit a `StreamWaitEvent` on `stream` for event `id`, as given.
    pub(crate) fn stream_wait(&mut self, id: u64, stream: StreamId) {
        self.0.open_if_idle();
        self.0.batch.push_stream_wait(id, stream);
        self.0.flush_if_full();
    }

    /// Emit `t`'s `Release` on `stream`, as given; `t` is marked released, so that dropping
    /// its handles emits nothing more.
    pub(crate) fn release(&mut self, t: &Tensor, stream: StreamId) {
        self.mark(stream, std::iter::once(t));
        t.inner().released.store(true, Ordering::Relaxed);
        let base = crate::framework::tensor::hand_off_base(t.inner());
        self.0.batch.push_release(TensorOwner::counted(t.inner()), stream);
        if let Some(base) = base {
            crate::framework::tensor::hand_back_later(base);
        }
        self.0.flush_if_full();
    }

    /// Emit a host write of `bytes` into `t` on `stream`, as given.
    pub(crate) fn write(&mut self, t: &Tensor, bytes: Box<[u8]>, stream: StreamId) {
        self.mark(stream, std::iter::once(t));
        // SAFETY: as in `call`.
        unsafe { self.0.batch.push_write(t.inner(), stream, bytes) };
        self.0.flush_if_full();
    }

    /// Emit a host read (`wait_only`: of the error state) of `t` into `slot` on `stream`, as
    /// given.
    pub(crate) fn read(&mut self, t: &Tensor, stream: StreamId, slot: Arc<AccessSlot>, wait_only: bool) {
        self.mark(stream, std::iter::once(t));
        // SAFETY: as in `call`.
        unsafe { self.0.batch.push_read(t.inner(), stream, slot, wait_only) };
        self.0.flush_if_full();
    }
}
