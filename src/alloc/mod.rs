//! The VM's tensor storage allocator, one per device.
//!
//! Tensor storage comes from a caching allocator per device ([`HostAllocator`]): freed
//! blocks go back to a free list per size class and are handed out again, so a program
//! that reuses tensor sizes (every training loop) stops calling the system allocator after
//! its first iteration. The mock device has its own instance, so that its memory is
//! accounted separately from the host's.
//!
//! This module sits above the device layer and uses it: for a device with memory of its own
//! (CUDA), the allocator hands out storages that own a
//! [`DeviceBuffer`](crate::ep::memory::DeviceBuffer) taken from the device's
//! [`DeviceMemory`](crate::ep::memory::DeviceMemory) instead of host bytes, and host blocks
//! freed while a launch on an asynchronous stream is being enqueued wait in
//! [`ep::memory::defer`](crate::ep::memory::defer) until the stream gets there. The caching
//! device allocator behind a backend's memory belongs to the backend
//! ([`ep::memory::caching`](crate::ep::memory::caching)). The arrow runs `alloc` → `ep`
//! only: nothing in `ep` names this module.
//!
//! Every allocation whose size a program chooses is fallible: out of memory is an error
//! value ([`HostOutOfMemory`], `EpError::OutOfMemory`), never the global allocator's abort,
//! and each allocator gives its cache back and retries once before reporting it. For tests,
//! [`AllocFaults`] makes chosen tensors' allocations fail without real memory pressure.
//! [`pin`] remembers which cached host blocks a device backend has page-locked. [`lend`]
//! lends a storage's bytes out of the VM ([`HostLoan`]) and wraps memory another library
//! owns as a storage ([`Storage::foreign`]).

// The files, from the bottom up; each names only those above it in this list (and `ep`):
// the size classes and the counters; the allocator and its shared free lists (`host`); the
// thread caches in front of them; the loans registry (`lend`); the storage, whose drop
// returns its block to one of them; the path of a request, which makes storages.
mod fault;
mod host;
pub mod lend;
pub(crate) mod objects;
pub mod pin;
mod request;
mod size_class;
mod stats;
mod storage;
pub(crate) mod thread_cache;

pub use fault::AllocFaults;
pub use host::{HostAllocator, HostOutOfMemory};
pub use lend::{DeviceLoan, HostLoan};
pub use request::Contents;
pub use stats::AllocStats;
pub use storage::Storage;

/// Ask for the `lines` cache lines from `p` on in a writable state, ahead of writing them.
///
/// Memory that another core used last (a recycled instruction line, a tensor object a
/// worker freed) must be taken from that core before this one can write it. The write
/// itself does not wait, but the next locked instruction waits for every pending store (on
/// the eager path, the context's unlock after each call: `docs/performance.md`, "The call
/// path"); asked for early, the transfer overlaps the work in between. A hint only: it
/// never faults, whatever `p` is, and does nothing where the processor lacks it.
#[inline(always)]
pub(crate) fn prefetch_for_write<T>(p: *const T, lines: usize) {
    for i in 0..lines {
        let _line = p.cast::<u8>().wrapping_add(64 * i);
        #[cfg(all(target_arch = "x86_64", not(miri)))]
        // SAFETY: `prefetchw` reads no memory the program can observe, writes none, and
        // raises no fault for any address (an unmapped one included); processors without it
        // run it as a no-op. It touches no flags and no stack.
        unsafe {
            std::arch::asm!("prefetchw [{}]", in(reg) _line, options(nostack, readonly, preserves_flags));
        }
    }
}
