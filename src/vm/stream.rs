//! VM streams: a device plus a stream type, bound to one `ThreadCtx` worker.
//!
//! The VM's stream table is fixed when the VM starts: `cpu:0` has one compute stream (CPU
//! copies and host accesses run there too); each asynchronous device has one stream per
//! [`StreamType`]. A [`StreamId`] indexes that table; it is what the builder takes and
//! what a tensor remembers as its last-used stream (OneFlow's `last_used_stream`).

use std::fmt;
use std::sync::Arc;

use crate::alloc::HostAllocator;
use crate::ep::{DeviceId, EventPool, Stream, StreamType};

/// A stream of the VM, as the builder names it. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32);

impl StreamId {
    /// Position in the VM's stream table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// How a stream's instructions complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PolicyKind {
    /// Synchronous: run on the worker; launched means done (CPU).
    Sync,
    /// Asynchronous: launch on the device stream, record a pooled event, and let the
    /// stream's watcher report completion when the event is reached (mock, CUDA).
    Event,
}

/// One entry of the stream table.
pub(crate) struct VmStream {
    pub(crate) id: StreamId,
    pub(crate) device: DeviceId,
    pub(crate) ty: StreamType,
    pub(crate) policy: PolicyKind,
    /// Whether another stream of this device can wait for this one's events on the device.
    pub(crate) device_waits: bool,
    pub(crate) ep: Arc<dyn Stream>,
    pub(crate) events: Arc<EventPool>,
    pub(crate) alloc: Arc<HostAllocator>,
    /// Index of the `ThreadCtx` that runs this stream.
    pub(crate) ctx: usize,
    /// `mock:0:h2d`-style name for messages and timelines.
    pub(crate) name: String,
}

impl fmt::Debug for VmStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}
