//! `RecordEvent`, `StreamWaitEvent` and `WaitEvent` on a synchronous stream.
//!
//! A synchronous stream has run everything before an instruction when it runs it, so its
//! events are complete when recorded and there is nothing to wait for. On an
//! event-recorded (asynchronous) stream the worker, which owns the device stream, records
//! and waits on the device itself (`stream_policy::event`); these never reach [`execute`]
//! there.
//!
//! [`execute`]: super::execute

use std::sync::Arc;

use crate::ep::Event;

/// A `RecordEvent` or `StreamWaitEvent` on a synchronous stream: nothing to do.
// Inlined: every arm of `execute_other`'s match runs inside that one out-of-line function.
#[inline(always)]
pub(super) fn record_or_wait() {}

/// A dispatched `StreamWaitEvent` on a synchronous stream: give its pooled event back now,
/// not when the batch is emptied.
#[inline(always)]
pub(super) fn wait_event(event: &mut Option<Arc<dyn Event>>) {
    drop(event.take());
}
