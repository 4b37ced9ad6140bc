//! Stream ids: what the builder names a stream by.
//!
//! The VM's stream table is fixed when the VM starts (`vm::engine::streams`): `cpu:0` has
//! one compute stream (CPU copies and host accesses run there too); each asynchronous
//! device has one stream per `StreamType`. A [`StreamId`] indexes that table; it is what
//! the builder takes and what a tensor remembers as its last-used stream (OneFlow's
//! `last_used_stream`).

/// A stream of the VM, as the builder names it. Cheap to copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub(crate) u32);

impl StreamId {
    /// Position in the VM's stream table.
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
