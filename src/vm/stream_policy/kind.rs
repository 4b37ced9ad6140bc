//! Which policy a stream runs under: the [`StreamPolicy`] of each stream of the table, and
//! the one registration that picks it from the stream's device
//! ([`StreamPolicy::for_device`]). The policies themselves are this folder's other files;
//! this one names only the device layer and the instruction kinds, so that the stream table
//! (`vm::engine::streams`) can hold a stream's policy without naming the code that runs it.

use crate::ep::Device;

use super::super::instruction::Body;

/// How a stream's instructions run and complete (the module docs' table).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum StreamPolicy {
    /// Run on the worker; launched means done (CPU).
    Synchronous,
    /// Launched on the device stream, with pooled events recorded behind the launches; the
    /// stream's watcher reports completion when an event is reached (mock, CUDA).
    EventRecorded,
    /// Run by the scheduler on its own thread, never by a worker (`Barrier`). No stream has
    /// it: instructions take it by kind ([`on_scheduler`](Self::on_scheduler)).
    OnScheduler,
}

impl StreamPolicy {
    /// The registration: the policy of the streams of `device`.
    pub(crate) fn for_device(device: &dyn Device) -> StreamPolicy {
        if device.is_async() {
            StreamPolicy::EventRecorded
        } else {
            StreamPolicy::Synchronous
        }
    }

    /// Whether instructions of this kind take the scheduler-thread policy, whatever their
    /// stream.
    #[inline(always)]
    pub(in crate::vm) fn on_scheduler(body: &Body) -> bool {
        matches!(body, Body::Barrier { .. })
    }

    /// The policy `body` runs under on a stream of policy `stream`.
    #[inline(always)]
    pub(in crate::vm) fn of(body: &Body, stream: StreamPolicy) -> StreamPolicy {
        if Self::on_scheduler(body) {
            StreamPolicy::OnScheduler
        } else {
            stream
        }
    }

    /// Whether a stream of this policy finishes its work after the worker has moved on: a
    /// stream that uses its results is ordered behind an event recorded on it (the builder's
    /// soft sync), and, when the device lets it, waits for one on the device (the
    /// scheduler's covering rule). Each such stream has a watcher thread
    /// (`eagervm-watch-<stream>`) that reports its completions.
    pub(crate) fn is_asynchronous(self) -> bool {
        match self {
            StreamPolicy::EventRecorded => true,
            StreamPolicy::Synchronous | StreamPolicy::OnScheduler => false,
        }
    }
}
