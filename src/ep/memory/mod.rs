//! Device memory: what a device with memory of its own hands to tensor storage, and the
//! caching allocator a backend builds that on.
//!
//! - [`DeviceMemory`] is the contract: blocks of device memory ([`Block`]) taken and given
//!   back per stream; a [`DeviceBuffer`] owns one block and gives it back when dropped. The
//!   three are defined in the device layer's dependency-free types module and re-exported
//!   here.
//! - [`caching`]: the caching device allocator (size classes, split and merge,
//!   stream-ordered reuse, shrink-and-retry before out-of-memory), generic over a raw source
//!   ([`caching::RawMemory`]); the CUDA backend puts it over `cuMemAlloc`.
//! - [`defer`]: host frees made while a launch on an asynchronous stream is being enqueued,
//!   held back until the stream reaches that point.
//!
//! These belong to the device layer because a backend owns its memory, as PyTorch's CUDA
//! caching allocator belongs to its CUDA backend. The VM's per-device storage allocator
//! (`HostAllocator`, in `alloc`) sits above: it takes a device tensor's bytes from the device's
//! [`DeviceMemory`] and offers host blocks freed during a launch to [`defer`]. So `alloc`
//! uses this module, and nothing here uses `alloc`.

pub mod caching;
pub mod defer;

pub use super::types::{Block, DeviceBuffer, DeviceMemory};
