//! The allocator's counters: what [`HostAllocator::stats`](super::HostAllocator::stats)
//! reports ([`AllocStats`]), and how they are kept.
//!
//! The statistics are separate atomics with `Relaxed` ordering, so that
//! [`HostAllocator::stats`](super::HostAllocator::stats) and the profiler's sample of the
//! bytes in use read them without the free lists' lock (and add up the thread caches'
//! counters, under a lock of their own). Every shared counter ([`Counters`]) but the two of
//! system calls and the peak changes only under the lock, with a load and a store rather
//! than a read-modify-write: the lock already makes the update exclusive, and a locked
//! instruction per counter cost more than the rest of an allocation from the cache. A thread
//! cache's counters ([`LocalCounters`]) are differences that only its thread writes, also
//! with loads and stores; the counters wrap, and their sums come back in range. The peak,
//! which thread caches raise too, is raised with `fetch_max`. The counters synchronise
//! nothing; `stats` reads each on its own, so under concurrent traffic a snapshot may mix
//! counters from slightly different moments.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Counters behind [`AllocStats`]; `Relaxed` atomics (see the module docs). All but the
/// system counters change only under the free lists' lock, by a load and a store (`add`,
/// `sub`, `taken`): the lock makes them exclusive, so no read-modify-write is needed, and a
/// plain store costs far less than a locked one on the allocation path.
#[derive(Default)]
pub(super) struct Counters {
    pub(super) in_use_bytes: AtomicUsize,
    pub(super) requested_bytes: AtomicUsize,
    pub(super) peak_in_use_bytes: AtomicUsize,
    pub(super) cached_bytes: AtomicUsize,
    pub(super) cached_blocks: AtomicUsize,
    pub(super) system_allocs: AtomicU64,
    pub(super) system_frees: AtomicU64,
    pub(super) cache_hits: AtomicUsize,
}

impl Counters {
    /// `n` more in `counter` (under the free lists' lock).
    #[inline]
    pub(super) fn add(&self, counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// `n` less in `counter` (under the free lists' lock).
    #[inline]
    pub(super) fn sub(&self, counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_sub(n), Ordering::Relaxed);
    }

    /// A block of `size` bytes handed out for `bytes` requested (under the lock).
    #[inline]
    pub(super) fn taken(&self, size: usize, bytes: usize) {
        let in_use = self.in_use_bytes.load(Ordering::Relaxed).wrapping_add(size);
        self.in_use_bytes.store(in_use, Ordering::Relaxed);
        // Thread caches raise the peak too (`HostAllocator::note_peak`), so it is raised
        // with `fetch_max` rather than a store.
        if (in_use as isize) > self.peak_in_use_bytes.load(Ordering::Relaxed) as isize {
            self.peak_in_use_bytes.fetch_max(in_use, Ordering::Relaxed);
        }
        self.add(&self.requested_bytes, bytes);
    }
}

/// A snapshot of a [`HostAllocator`](super::HostAllocator)'s counters.
///
/// Byte counts are in block (size-class) bytes unless said otherwise; 0-byte storages own
/// no block and count nowhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes of the blocks currently held by live [`Storage`](super::Storage)s.
    pub in_use_bytes: usize,
    /// Bytes requested by the live [`Storage`](super::Storage)s (at most `in_use_bytes`; the difference is
    /// what rounding up to size classes costs).
    pub requested_bytes: usize,
    /// The largest `in_use_bytes` seen since the allocator was created.
    pub peak_in_use_bytes: usize,
    /// Bytes of the free blocks waiting in the cache for reuse.
    pub cached_bytes: usize,
    /// Number of free blocks waiting in the cache.
    pub cached_blocks: usize,
    /// Blocks obtained from the system allocator since the allocator was created.
    pub system_allocs: u64,
    /// Blocks given back to the system allocator (by [`HostAllocator::shrink`](super::HostAllocator::shrink)).
    pub system_frees: u64,
    /// Requests served from the cache without asking the system.
    pub cache_hits: u64,
}

/// A thread cache's counters, as differences from its owner's shared ones
/// ([`thread_cache`](super::thread_cache), "Counters"). Written by the cache's thread
/// alone, by a load and a store; each value wraps (a difference may be negative: a block
/// made on one thread and freed into another's cache), so they are added with
/// `wrapping_add`.
#[derive(Debug, Default)]
pub(super) struct LocalCounters {
    pub(super) in_use_bytes: AtomicUsize,
    pub(super) requested_bytes: AtomicUsize,
    pub(super) cached_bytes: AtomicUsize,
    pub(super) cached_blocks: AtomicUsize,
    pub(super) cache_hits: AtomicUsize,
}

impl LocalCounters {
    /// Add `n` (wrapping) to `counter`; only the cache's thread writes.
    #[inline]
    pub(super) fn add(counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// Subtract `n` (wrapping) from `counter`; only the cache's thread writes.
    #[inline]
    pub(super) fn sub(counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_sub(n), Ordering::Relaxed);
    }

    /// Take every difference out (each left at zero), for folding into the shared counters.
    pub(super) fn take(&self) -> [usize; 5] {
        [
            self.in_use_bytes.swap(0, Ordering::Relaxed),
            self.requested_bytes.swap(0, Ordering::Relaxed),
            self.cached_bytes.swap(0, Ordering::Relaxed),
            self.cached_blocks.swap(0, Ordering::Relaxed),
            self.cache_hits.swap(0, Ordering::Relaxed),
        ]
    }
}
