//! Caching allocators.
//!
//! Tensor storage comes from a caching allocator per device ([`HostAllocator`]): freed
//! blocks go back to a free list per size class and are handed out again, so a program
//! that reuses tensor sizes (every training loop) stops calling the system allocator after
//! its first iteration. The mock device has its own instance, so that its memory is
//! accounted separately from the host's.
//!
//! Devices with memory of their own (CUDA) implement [`DeviceMemory`]; the VM's allocator
//! for such a device hands out storages that own a [`DeviceBuffer`] instead of host bytes.
//! [`device`] holds the caching device allocator behind them, generic over its raw source.
//!
//! Every allocation whose size a program chooses is fallible: out of memory is an error
//! value ([`HostOutOfMemory`], `EpError::OutOfMemory`), never the global allocator's abort,
//! and each allocator gives its cache back and retries once before reporting it. For tests,
//! [`AllocFaults`] makes chosen tensors' allocations fail without real memory pressure.

pub mod defer;
pub mod device;
mod fault;
mod host;
pub mod pin;

pub use device::{DeviceBuffer, DeviceMemory};
pub use fault::AllocFaults;
pub use host::{AllocStats, HostAllocator, HostOutOfMemory, Storage};
