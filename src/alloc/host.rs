//! The host caching allocator: its shared free lists and its counters.
//!
//! Every tensor's bytes on the host (and on the mock device, which has its own instance)
//! come from a [`HostAllocator`]. A request is rounded up to a *size class*
//! ([`size_class`](super::size_class)); a block freed by dropping its
//! [`Storage`](super::Storage) goes back on its class's free list, and the next request of
//! the same class takes it from there instead of asking the system. Training loops that
//! allocate the same shapes every iteration therefore stop calling the system allocator
//! after the first one. [`HostAllocator::shrink`] gives every cached block back.
//!
//! The design follows the caching allocators of the deep-learning runtimes (PyTorch's
//! `CUDACachingAllocator`, OneFlow's `CachingAllocator`), reduced to what host memory
//! needs: no block splitting or merging, one free list per class.
//!
//! This file holds the allocator and its shared state: the free lists, the counters
//! ([`stats`](super::stats)), and what the layers above call on them. The layers above are,
//! in order: the per-thread caches in front of the lists
//! ([`thread_cache`](super::thread_cache)), the [`Storage`](super::Storage) that owns a
//! block and returns it when dropped ([`storage`](super::storage)), and the path of a
//! request from a size to a storage, out of memory and fault injection included
//! ([`request`](super::request)).
//!
//! # Locking and memory ordering
//!
//! One `parking_lot::Mutex` guards all free lists: allocation happens when a tensor is first
//! written, not per instruction, so the lock is uncontended. A thread that allocates and
//! frees many small blocks (a VM worker in an eager loop, which makes a tensor per call)
//! keeps them in a cache of its own instead ([`thread_cache`](super::thread_cache)) and takes
//! the lock once per batch of blocks. The lock also orders a block's reuse
//! after its free: the thread that pushes a freed block releases the lock, the thread that
//! pops it acquires it, so every write through the old [`Storage`](super::Storage) happens
//! before the zeroing and every later access through the new one. The counters are
//! `Relaxed` atomics beside the lock ([`stats`](super::stats)).
//!
//! This module uses `std` and `parking_lot` directly rather than [`crate::sync`]: it never
//! sleeps waiting for another thread, so it takes no part in the protocols the model
//! checker explores, and the model checker's types would only make every allocation inside
//! a model expensive.

use std::alloc::dealloc;
use std::fmt;
use std::mem;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use parking_lot::Mutex;

use super::fault::AllocFaults;
use super::size_class::{block_layout, class_of, class_size, Block, MAX_BYTES, NUM_CLASSES};
use super::stats::{AllocStats, Counters, LocalCounters};
use crate::ep::memory::DeviceMemory;

/// A host allocation the system refused, even after the allocator gave its cache back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "out of memory allocating {requested} bytes ({in_use} bytes in use, {cached} bytes cached \
     and given back before retrying); free tensors or use smaller ones"
)]
pub struct HostOutOfMemory {
    /// Bytes requested.
    pub requested: usize,
    /// Bytes of blocks in use when the request failed.
    pub in_use: usize,
    /// Bytes that were cached (free) before the allocator gave them back to retry.
    pub cached: usize,
}

/// A caching allocator of 64-byte-aligned host memory, zeroed unless asked otherwise
/// ([`HostAllocator::try_alloc_unzeroed`]; see the module docs for the size classes and
/// the locking).
///
/// ```
/// use eagervm::alloc::HostAllocator;
///
/// let host = HostAllocator::new("cpu:0");
/// let mut s = host.try_alloc(3 * 4)?;
/// s.as_f32_mut().copy_from_slice(&[1.0, 2.0, 3.0]);
/// drop(s); // back to the cache
/// let again = host.try_alloc(12)?;
/// assert_eq!(again.as_f32(), &[0.0; 3]); // reused, and zeroed again
/// assert_eq!(host.stats().system_allocs, 1);
/// assert_eq!(host.stats().cache_hits, 1);
/// // More than the machine has is an error, not an abort.
/// assert!(host.try_alloc(1 << 60).is_err());
/// # Ok::<(), eagervm::alloc::HostOutOfMemory>(())
/// ```
pub struct HostAllocator {
    name: String,
    /// The device memory that storages of the device's own tensors come from, for devices
    /// with memory of their own.
    pub(super) device_memory: Option<Arc<dyn DeviceMemory>>,
    /// One free list per size class, indexed by class index.
    free: Mutex<Vec<Vec<Block>>>,
    counters: Counters,
    /// The counters of the thread caches this allocator owns (`alloc::thread_cache`):
    /// [`stats`](Self::stats) adds them up.
    locals: Mutex<Vec<Arc<LocalCounters>>>,
    /// Deliberate failures of tensors' storage (tests only; off by default).
    pub(super) faults: AllocFaults,
}

impl HostAllocator {
    /// A new allocator with an empty cache; `name` appears in messages and statistics
    /// (`cpu:0`, `mock:0`).
    pub fn new(name: &str) -> Arc<HostAllocator> {
        HostAllocator::with_device_memory(name, None)
    }

    /// A new allocator whose storages for tensors on `memory`'s device come from `memory`
    /// (see [`HostAllocator::alloc_for`]); host storages come from the cache as usual.
    pub fn with_device_memory(name: &str, memory: Option<Arc<dyn DeviceMemory>>) -> Arc<HostAllocator> {
        HostAllocator::with_faults(name, memory, AllocFaults::default())
    }

    /// [`HostAllocator::with_device_memory`], failing the storage of the tensors `faults`
    /// chooses ([`HostAllocator::alloc_tensor`]); for tests.
    pub fn with_faults(
        name: &str,
        memory: Option<Arc<dyn DeviceMemory>>,
        faults: AllocFaults,
    ) -> Arc<HostAllocator> {
        let free = (0..NUM_CLASSES).map(|_| Vec::new()).collect();
        Arc::new(HostAllocator {
            name: name.to_string(),
            device_memory: memory,
            free: Mutex::new(free),
            counters: Counters::default(),
            locals: Mutex::new(Vec::new()),
            faults,
        })
    }

    /// The allocator's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The block size that serves a request of `bytes` bytes (see the module docs): `0` for
    /// `0`, otherwise at least `bytes`.
    ///
    /// # Panics
    /// If `bytes` exceeds the largest class, `isize::MAX / 2 + 1`.
    pub fn size_class(bytes: usize) -> usize {
        if bytes == 0 {
            0
        } else {
            assert!(
                bytes <= MAX_BYTES,
                "host allocation of {bytes} bytes exceeds the largest size class ({MAX_BYTES} bytes)"
            );
            class_of(bytes).1
        }
    }

    /// The deliberate failures this allocator injects.
    pub fn faults(&self) -> AllocFaults {
        self.faults
    }

    /// Bytes in blocks handed out and not yet freed (one relaxed load; the profiler's
    /// allocator counter samples it).
    pub fn in_use_bytes(&self) -> usize {
        self.stats().in_use_bytes
    }

    /// A snapshot of the counters.
    pub fn stats(&self) -> AllocStats {
        let c = &self.counters;
        let mut s = AllocStats {
            in_use_bytes: c.in_use_bytes.load(Ordering::Relaxed),
            requested_bytes: c.requested_bytes.load(Ordering::Relaxed),
            peak_in_use_bytes: c.peak_in_use_bytes.load(Ordering::Relaxed),
            cached_bytes: c.cached_bytes.load(Ordering::Relaxed),
            cached_blocks: c.cached_blocks.load(Ordering::Relaxed),
            system_allocs: c.system_allocs.load(Ordering::Relaxed),
            system_frees: c.system_frees.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed) as u64,
        };
        // The thread caches' differences (`alloc::thread_cache`, "Counters"); the sums
        // wrap back into range.
        for l in self.locals.lock().iter() {
            s.in_use_bytes = s.in_use_bytes.wrapping_add(l.in_use_bytes.load(Ordering::Relaxed));
            s.requested_bytes = s.requested_bytes.wrapping_add(l.requested_bytes.load(Ordering::Relaxed));
            s.cached_bytes = s.cached_bytes.wrapping_add(l.cached_bytes.load(Ordering::Relaxed));
            s.cached_blocks = s.cached_blocks.wrapping_add(l.cached_blocks.load(Ordering::Relaxed));
            s.cache_hits = s.cache_hits.wrapping_add(l.cache_hits.load(Ordering::Relaxed) as u64);
        }
        s
    }

    /// Give every free block on the shared lists back to the system (what
    /// [`shrink`](Self::shrink) does after flushing this thread's cache).
    pub(super) fn release_cached(&self) {
        let c = &self.counters;
        // Take the lists under the lock, free them outside it.
        let lists: Vec<Vec<Block>> = {
            let mut free = self.free.lock();
            // The cache counters change only under the lock, so they match the lists at
            // every unlock and can simply be reset here.
            c.cached_bytes.store(0, Ordering::Relaxed);
            c.cached_blocks.store(0, Ordering::Relaxed);
            free.iter_mut().map(mem::take).collect()
        };
        for (class, list) in lists.into_iter().enumerate() {
            if list.is_empty() {
                continue;
            }
            let layout = block_layout(class_size(class));
            for Block(ptr) in list {
                // A device backend may have page-locked it (`alloc::pin`).
                super::pin::forget(ptr.as_ptr() as usize);
                // SAFETY: the block was allocated by `alloc_zeroed` with this class's
                // layout (a block is only ever put on its own class's list) and nothing
                // refers to it since it left the free list.
                unsafe { dealloc(ptr.as_ptr(), layout) };
                c.system_frees.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Put a block freed by a storage back on its class's list.
    pub(super) fn give_back(&self, class: usize, requested: usize, ptr: NonNull<u8>) {
        let size = class_size(class);
        let c = &self.counters;
        let mut free = self.free.lock();
        free[class].push(Block(ptr));
        c.sub(&c.in_use_bytes, size);
        c.sub(&c.requested_bytes, requested);
        c.add(&c.cached_bytes, size);
        c.add(&c.cached_blocks, 1);
    }

    /// A block of `class` off its shared list, counted as handed out for `bytes` requested;
    /// `None` if the list is empty. The block is not zeroed yet.
    pub(super) fn take_cached(&self, class: usize, bytes: usize) -> Option<NonNull<u8>> {
        let c = &self.counters;
        let mut free = self.free.lock();
        let Block(ptr) = free[class].pop()?;
        let size = class_size(class);
        c.sub(&c.cached_bytes, size);
        c.sub(&c.cached_blocks, 1);
        c.cache_hits.store(c.cache_hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
        c.taken(size, bytes);
        Some(ptr)
    }

    /// Count a fresh block of `size` bytes from the system, handed out for `bytes` requested.
    pub(super) fn count_fresh(&self, size: usize, bytes: usize) {
        let c = &self.counters;
        c.system_allocs.fetch_add(1, Ordering::Relaxed);
        let _free = self.free.lock();
        c.taken(size, bytes);
    }

    /// Bytes of free blocks on the shared lists (what a retry after giving them back may
    /// find).
    pub(super) fn shared_cached_bytes(&self) -> usize {
        self.counters.cached_bytes.load(Ordering::Relaxed)
    }

    /// Count a thread cache's counters in [`stats`](Self::stats) (it takes this allocator
    /// as its owner).
    pub(super) fn register(&self, counters: Arc<LocalCounters>) {
        self.locals.lock().push(counters);
    }

    /// Move up to `batch` free blocks of `class` from the shared list to a thread cache's
    /// `list`, counting them as that cache's.
    pub(super) fn refill(
        &self,
        class: usize,
        batch: usize,
        list: &mut Vec<NonNull<u8>>,
        local: &LocalCounters,
    ) {
        let c = &self.counters;
        let moved = {
            let mut free = self.free.lock();
            let shared = &mut free[class];
            let n = shared.len().min(batch);
            list.extend(shared.drain(shared.len() - n..).map(|Block(p)| p));
            c.sub(&c.cached_bytes, n * class_size(class));
            c.sub(&c.cached_blocks, n);
            n
        };
        LocalCounters::add(&local.cached_bytes, moved * class_size(class));
        LocalCounters::add(&local.cached_blocks, moved);
    }

    /// Move `batch` blocks of a thread cache's full `list` (of `class`) to the shared list.
    pub(super) fn spill(
        &self,
        class: usize,
        batch: usize,
        list: &mut Vec<NonNull<u8>>,
        local: &LocalCounters,
    ) {
        let n = batch.min(list.len());
        let blocks = list.drain(..n).map(|p| (class, Block(p)));
        self.put_back(blocks, local);
    }

    /// Put blocks a thread cache held (`(class, block)`) back on the shared lists,
    /// counting them there rather than in the cache's `local` counters.
    pub(super) fn put_back(&self, blocks: impl IntoIterator<Item = (usize, Block)>, local: &LocalCounters) {
        let c = &self.counters;
        let (mut bytes, mut n) = (0, 0);
        {
            let mut free = self.free.lock();
            for (class, block) in blocks {
                free[class].push(block);
                bytes += class_size(class);
                n += 1;
            }
            c.add(&c.cached_bytes, bytes);
            c.add(&c.cached_blocks, n);
        }
        LocalCounters::sub(&local.cached_bytes, bytes);
        LocalCounters::sub(&local.cached_blocks, n);
    }

    /// A thread cache gives up this allocator: its blocks go back on the shared lists, its
    /// counters are folded into the shared ones, and [`stats`](Self::stats) stops reading
    /// them.
    pub(super) fn take_back(&self, blocks: Vec<(usize, Block)>, local: &Arc<LocalCounters>) {
        self.put_back(blocks, local);
        let c = &self.counters;
        {
            let _free = self.free.lock();
            let [in_use, requested, cached, cached_blocks, hits] = local.take();
            c.add(&c.in_use_bytes, in_use);
            c.add(&c.requested_bytes, requested);
            c.add(&c.cached_bytes, cached);
            c.add(&c.cached_blocks, cached_blocks);
            c.add(&c.cache_hits, hits);
        }
        self.locals.lock().retain(|l| !Arc::ptr_eq(l, local));
    }

    /// Thread caches that have this allocator as their owner (tests).
    #[cfg(test)]
    pub(super) fn thread_caches(&self) -> usize {
        self.locals.lock().len()
    }

    /// Free blocks on the shared lists alone (tests).
    #[cfg(test)]
    pub(super) fn shared_cached_blocks(&self) -> usize {
        self.counters.cached_blocks.load(Ordering::Relaxed)
    }

    /// A thread cache whose in-use difference is now `local_in_use` handed a block out:
    /// raise the peak if the shared count plus that difference exceeds it.
    #[inline]
    pub(super) fn note_peak(&self, local_in_use: usize) {
        let c = &self.counters;
        let now = c.in_use_bytes.load(Ordering::Relaxed).wrapping_add(local_in_use);
        if (now as isize) > c.peak_in_use_bytes.load(Ordering::Relaxed) as isize {
            c.peak_in_use_bytes.fetch_max(now, Ordering::Relaxed);
        }
    }
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        // Every storage holds an `Arc` to its allocator, so no block is in use any more:
        // the cache holds them all. No thread cache holds blocks of it either (a cache
        // holds a reference to its owner), so the shared lists are the whole cache.
        self.release_cached();
    }
}

impl fmt::Debug for HostAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostAllocator").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_classes_of_requests() {
        assert_eq!(HostAllocator::size_class(0), 0);
        assert_eq!(HostAllocator::size_class(1), 64);
        assert_eq!(HostAllocator::size_class(4097), 5120);
        assert_eq!(HostAllocator::size_class(MAX_BYTES), MAX_BYTES);
    }

    #[test]
    #[should_panic(expected = "exceeds the largest size class")]
    fn too_large_request_panics() {
        HostAllocator::size_class(MAX_BYTES + 1);
    }

    #[test]
    fn reuse_hits_the_cache() {
        let a = HostAllocator::new("test");
        let s = a.alloc(1000);
        assert_eq!(s.len(), 1000);
        let first = s.as_bytes().as_ptr();
        drop(s);
        let s = a.alloc(1000);
        assert_eq!(s.as_bytes().as_ptr(), first);
        let st = a.stats();
        assert_eq!((st.system_allocs, st.cache_hits), (1, 1));
    }

    #[test]
    fn reused_block_is_zeroed() {
        let a = HostAllocator::new("test");
        let mut s = a.alloc(256);
        s.as_bytes_mut().fill(0xAB);
        drop(s);
        let s = a.alloc(256);
        assert!(s.as_bytes().iter().all(|&b| b == 0));
        assert_eq!(a.stats().cache_hits, 1);
    }

    #[test]
    fn sizes_in_one_class_share_blocks() {
        let a = HostAllocator::new("test");
        let mut s = a.alloc(5000); // class 5120
        s.as_bytes_mut().fill(0xFF);
        drop(s);
        let s = a.alloc(5120);
        assert_eq!(s.len(), 5120);
        assert!(s.as_bytes().iter().all(|&b| b == 0));
        let st = a.stats();
        assert_eq!((st.system_allocs, st.cache_hits), (1, 1));
        // A request of another class does not take it.
        let t = a.alloc(5121);
        assert_eq!(a.stats().system_allocs, 2);
        drop((s, t));
    }

    #[test]
    fn shrink_empties_the_cache() {
        let a = HostAllocator::new("test");
        let live = a.alloc(100);
        drop((a.alloc(64), a.alloc(4096), a.alloc(10_000)));
        let st = a.stats();
        assert_eq!(st.cached_blocks, 3);
        assert_eq!(st.cached_bytes, 64 + 4096 + 10240);
        a.shrink();
        let st = a.stats();
        assert_eq!((st.cached_blocks, st.cached_bytes, st.system_frees), (0, 0, 3));
        assert_eq!(st.in_use_bytes, 128);
        // Nothing cached any more: the next request asks the system.
        let again = a.alloc(64);
        assert_eq!(a.stats().system_allocs, 5);
        drop((live, again));
        assert_eq!(a.stats().cached_blocks, 2);
    }

    #[test]
    fn stats_track_use_and_peak() {
        let a = HostAllocator::new("cpu:0");
        assert_eq!(a.name(), "cpu:0");
        assert_eq!(a.stats(), AllocStats::default());
        let x = a.alloc(100); // 128
        let y = a.alloc(5000); // 5120
        let st = a.stats();
        assert_eq!(st.in_use_bytes, 128 + 5120);
        assert_eq!(st.requested_bytes, 5100);
        assert_eq!(st.peak_in_use_bytes, 5248);
        drop(y);
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes), (128, 100));
        assert_eq!((st.cached_bytes, st.cached_blocks), (5120, 1));
        assert_eq!(st.peak_in_use_bytes, 5248);
        drop(x);
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes, st.cached_bytes), (0, 0, 5248));
        assert_eq!((st.system_allocs, st.system_frees, st.cache_hits), (2, 0, 0));
    }

    #[test]
    fn concurrent_alloc_and_free() {
        const THREADS: usize = 4;
        let rounds = if cfg!(miri) { 20 } else { 2000 };
        let a = HostAllocator::new("test");
        std::thread::scope(|scope| {
            for t in 0..THREADS {
                let a = &a;
                scope.spawn(move || {
                    let mut held = Vec::new();
                    for i in 0..rounds {
                        let bytes = 8 * (1 + (i * 7 + t * 13) % 700);
                        let mut s = a.alloc(bytes);
                        assert!(s.as_bytes().iter().all(|&b| b == 0), "fresh block not zeroed");
                        s.as_i64_mut().fill((t * rounds + i) as i64);
                        held.push(s);
                        if held.len() > 3 {
                            let old = held.remove(0);
                            let v = old.as_i64()[0];
                            assert!(old.as_i64().iter().all(|&x| x == v), "block shared");
                        }
                    }
                });
            }
        });
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes), (0, 0));
        assert_eq!(st.system_allocs + st.cache_hits, (THREADS * rounds) as u64);
        assert_eq!(st.cached_blocks as u64, st.system_allocs);
        assert!(st.cache_hits > 0);
        a.shrink();
        assert_eq!(a.stats().system_frees, st.system_allocs);
    }
}
