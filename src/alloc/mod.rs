//! Caching allocators.
//!
//! Tensor storage comes from a caching allocator per device ([`HostAllocator`]): freed
//! blocks go back to a free list per size class and are handed out again, so a program
//! that reuses tensor sizes (every training loop) stops calling the system allocator after
//! its first iteration. The mock device has its own instance, so that its memory is
//! accounted separately from the host's.

mod host;

pub use host::{AllocStats, HostAllocator, Storage};
