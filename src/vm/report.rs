//! What workers and watchers tell the scheduler: completion reports
//! (`vm::engine::completions` carries them).
//!
//! A stream completes in order, so a report names one position and covers everything
//! before it on its stream: "done through p". A `RecordEvent` on an asynchronous stream is
//! also reported "launched" once its event is recorded, which releases the
//! `StreamWaitEvent`s that wait on it (`vm::scheduler`, "When an edge is released"). The
//! stream policies (`vm::stream_policy`) say who reports what, and when.

use std::sync::Arc;

use crate::ep::Event;

/// What a completion report says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Report {
    /// The `RecordEvent` at this position has recorded event `id` (asynchronous streams).
    Launched { id: u64 },
    /// Every instruction of the stream up to this position has finished.
    Done,
}

/// A completion report from a worker or watcher.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) stream: u32,
    /// Position on the stream.
    pub(crate) seq: u64,
    pub(crate) report: Report,
    /// The pooled event recorded after the instruction, if any: for `Launched`, the event
    /// waiters wait on; for `Done`, an event to give back to its pool.
    pub(crate) event: Option<Arc<dyn Event>>,
}
