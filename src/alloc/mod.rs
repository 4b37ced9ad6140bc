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

pub mod defer;
pub mod device;
mod host;
pub mod pin;

pub use device::{DeviceBuffer, DeviceMemory};
pub use host::{AllocStats, HostAllocator, Storage};
