//! VM streams: a device plus a stream type, bound to one `ThreadCtx` worker.
//!
//! The VM's stream table is fixed when the VM starts: `cpu:0` has one compute stream (CPU
//! copies and host accesses run there too); each asynchronous device has one stream per
//! [`StreamType`]. A [`StreamId`] indexes that table; it is what the builder takes and
//! what a tensor remembers as its last-used stream (OneFlow's `last_used_stream`). Each
//! stream has a stream policy, picked from its device (`vm::stream_policy`): how its
//! instructions run and who reports them done.

use std::fmt;
use std::sync::Arc;

use crate::alloc::HostAllocator;
use crate::ep::{DeviceId, EventPool, Stream, StreamType};

use super::StreamPolicy;

/// A stream of the VM, as the builder names it. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32);

impl StreamId {
    /// Position in the VM's stream table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

/// One entry of the stream table.
pub(crate) struct VmStream {
    pub(crate) id: StreamId,
    pub(crate) device: DeviceId,
    pub(crate) ty: StreamType,
    /// How its instructions run and complete (`vm::stream_policy`), picked from its device.
    pub(crate) policy: StreamPolicy,
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
