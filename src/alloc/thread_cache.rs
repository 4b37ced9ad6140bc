//! Per-thread caches of small free blocks, in front of a [`HostAllocator`]'s shared lists.
//!
//! In an eager loop every call makes a small tensor and drops an earlier one, and both the
//! allocation of the new tensor's storage and the free of the old one happen on the worker
//! that runs the stream. Through the shared free lists each costs the lock's two locked
//! instructions and a count on the allocator's `Arc`, which together were half of that
//! worker's time per call. A thread that opts in ([`enable`], which the VM's workers do)
//! keeps a small cache instead: per size class of up to 4 KiB up to [`depth`] blocks,
//! taken and given back with plain loads and stores. This is the per-thread cache of tcmalloc
//! and of jemalloc's `tcache`, reduced to what the host allocator needs: blocks move
//! between a thread's cache and the shared lists in batches of half the depth ([`batch`]),
//! under one lock.
//!
//! # Ownership
//!
//! A thread's cache serves one allocator at a time, its *owner*. A request of another
//! allocator takes the shared path; after [`SWITCH_AFTER`] such requests in a row, the
//! cache gives its blocks back to its owner and takes the other allocator as its owner
//! (a worker serving streams of two devices keeps the one it allocates for most). A
//! storage freed on a thread whose cache has another owner, or on a thread without a
//! cache, goes back to its allocator's shared lists, as before.
//!
//! The cache holds strong references to its owner, so that the owner outlives every block
//! the cache holds: one while it is the owner, plus one per storage it took back (the
//! storage's own reference, kept rather than dropped), less one per storage it made (which
//! takes one of them over rather than counting a new one). In a steady loop of making and
//! dropping a tensor that nets out, so neither touches the allocator's count. References
//! beyond [`SPARE_REFS`] are given back. When the cache changes owner, and when its thread
//! exits, its blocks go back to the owner's shared lists and its references are dropped;
//! [`HostAllocator::shrink`] called on the thread gives its blocks back too.
//!
//! # Counters
//!
//! The cache keeps its own copy of the counters it changes ([`LocalCounters`]: in use,
//! requested, cached, hits), as differences from the shared ones, written by its thread
//! alone with plain stores; the allocator keeps every cache's counters in a list, and its
//! statistics add them up. When the cache changes owner or its thread exits, its
//! differences are folded into the shared counters under the lock. The peak in use is
//! compared on each allocation against the shared count plus this cache's difference, so
//! on one thread it is exact; blocks other threads' caches hold may make it miss a peak.
//!
//! # Memory ordering
//!
//! A block in a thread's cache is only handed out again on that thread, after the drop
//! that put it there (program order). Blocks moving between a cache and the shared lists
//! do so under the shared lock, as every block did before. The counters synchronise
//! nothing (`Relaxed`), as the shared ones.

use std::cell::RefCell;
use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::host::HostAllocator;
use super::size_class::{class_size, Block, POW2_CLASSES};
use super::stats::LocalCounters;

/// Size classes a thread caches: 64 B to 4 KiB, the power-of-two ones.
pub(super) const CLASSES: usize = POW2_CLASSES;
/// Bytes of one class a thread's cache keeps at most (under 1.7 MiB over all classes).
const CLASS_BYTES: usize = 256 << 10;
/// Blocks of one class a thread's cache keeps at most, whatever their size.
const MAX_DEPTH: usize = 2048;

/// Blocks of class `class` a thread's cache keeps at most: [`CLASS_BYTES`] of them, at most
/// [`MAX_DEPTH`] (2048 blocks of 64 and 128 bytes, down to 64 blocks of 4 KiB). A worker
/// runs a builder's batch (1024 calls by default) before the batch of releases that follows
/// it, so it allocates that many blocks before it frees any: a cache shallower than that
/// would go back and forth to the shared lists on every batch.
#[inline]
pub(super) fn depth(class: usize) -> usize {
    (CLASS_BYTES / class_size(class)).min(MAX_DEPTH)
}

/// Blocks moved at once between a thread's cache and the shared lists: half its depth.
#[inline]
pub(super) fn batch(class: usize) -> usize {
    depth(class) / 2
}
/// Requests in a row of an allocator other than the owner after which the cache changes
/// owner.
const SWITCH_AFTER: u32 = 64;
/// Strong references to the owner a cache keeps at most; more are given back. At least
/// what a burst of frees as long as the deepest class may leave, so that the allocations
/// after it take them over rather than counting new ones.
const SPARE_REFS: usize = 2 * MAX_DEPTH;
/// What a cache keeps of its spare references when it gives the excess back.
const KEPT_REFS: usize = MAX_DEPTH;

/// One thread's cache.
struct Cache {
    /// Whether this thread caches at all ([`enable`]).
    enabled: bool,
    /// The owner, or null. While non-null, `refs >= 1` of its strong references are held.
    owner: *const HostAllocator,
    /// Strong references to `owner` held (module docs, "Ownership").
    refs: usize,
    /// Requests in a row of another allocator than the owner.
    misses: u32,
    /// This cache's counters, registered with the owner.
    counters: Option<Arc<LocalCounters>>,
    /// Free blocks per class, at most [`depth`] each (room reserved when enabled).
    lists: [Vec<NonNull<u8>>; CLASSES],
}

impl Cache {
    const fn new() -> Self {
        Cache {
            enabled: false,
            owner: std::ptr::null(),
            refs: 0,
            misses: 0,
            counters: None,
            lists: [const { Vec::new() }; CLASSES],
        }
    }

    /// Give every block back to the owner and drop the references held; the cache then has
    /// no owner.
    fn detach(&mut self) {
        if self.owner.is_null() {
            return;
        }
        // SAFETY: the cache holds `refs >= 1` strong references to the owner, so it is alive.
        let owner = unsafe { &*self.owner };
        let counters = self.counters.take().expect("an attached cache has counters");
        let mut blocks = Vec::new();
        for (class, list) in self.lists.iter_mut().enumerate() {
            blocks.extend(list.drain(..).map(|p| (class, Block(p))));
        }
        owner.take_back(blocks, &counters);
        let refs = std::mem::take(&mut self.refs);
        let owner = std::mem::replace(&mut self.owner, std::ptr::null());
        for _ in 0..refs {
            // SAFETY: each of `refs` is a strong reference this cache owns (module docs);
            // the last may free the allocator, which nothing here touches afterwards.
            unsafe { Arc::decrement_strong_count(owner) };
        }
    }

    /// Make `alloc` the owner (after giving the old owner's blocks back).
    fn attach(&mut self, alloc: &Arc<HostAllocator>) {
        self.detach();
        let counters = Arc::new(LocalCounters::default());
        alloc.register(counters.clone());
        self.counters = Some(counters);
        self.owner = Arc::into_raw(Arc::clone(alloc));
        self.refs = 1;
        self.misses = 0;
    }

    /// The cache's counters (it has an owner).
    #[inline]
    fn counters(&self) -> &LocalCounters {
        self.counters.as_deref().expect("an attached cache has counters")
    }
}

impl Drop for Cache {
    /// At thread exit: everything back to the owner.
    fn drop(&mut self) {
        self.detach();
    }
}

thread_local! {
    static CACHE: RefCell<Cache> = const { RefCell::new(Cache::new()) };
}

/// Cache small blocks on this thread from now on (the module docs). The VM's workers call
/// it when they start; a thread that never does takes every block from the shared lists.
pub(crate) fn enable() {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if !c.enabled {
                c.enabled = true;
                for (class, list) in c.lists.iter_mut().enumerate() {
                    list.reserve_exact(depth(class));
                }
            }
        }
    });
}

/// A block of class `class` (< [`CLASSES`]) for a request of `bytes`, from this thread's
/// cache of `alloc`, with the strong reference to `alloc` the storage will hold; `None` if
/// this thread does not cache `alloc`'s blocks, or neither its cache nor the shared list
/// has a block of the class. The block is not zeroed yet; the counters count it in use.
#[inline]
pub(super) fn take(
    alloc: &Arc<HostAllocator>,
    class: usize,
    bytes: usize,
) -> Option<(NonNull<u8>, Arc<HostAllocator>)> {
    CACHE
        .try_with(|c| {
            let mut c = c.try_borrow_mut().ok()?;
            if !c.enabled {
                return None;
            }
            if c.owner != Arc::as_ptr(alloc) {
                c.misses += 1;
                if c.misses < SWITCH_AFTER && !c.owner.is_null() {
                    return None;
                }
                c.attach(alloc);
            }
            c.misses = 0;
            let size = class_size(class);
            let ptr = match c.lists[class].pop() {
                Some(p) => p,
                None => {
                    let Cache { lists, counters, .. } = &mut *c;
                    let counters = counters.as_deref().expect("attached");
                    alloc.refill(class, batch(class), &mut lists[class], counters);
                    lists[class].pop()?
                }
            };
            let k = c.counters();
            LocalCounters::sub(&k.cached_bytes, size);
            LocalCounters::sub(&k.cached_blocks, 1);
            LocalCounters::add(&k.cache_hits, 1);
            LocalCounters::add(&k.in_use_bytes, size);
            LocalCounters::add(&k.requested_bytes, bytes);
            alloc.note_peak(k.in_use_bytes.load(Ordering::Relaxed));
            let arc = if c.refs > 1 {
                c.refs -= 1;
                // SAFETY: the cache holds `refs` strong references to `alloc` (its owner);
                // one of them passes to the storage.
                unsafe { Arc::from_raw(c.owner) }
            } else {
                Arc::clone(alloc)
            };
            Some((ptr, arc))
        })
        .ok()
        .flatten()
}

/// Keep the block `ptr` of class `class` (< [`CLASSES`]), freed by a storage of `alloc`
/// that requested `requested` bytes, in this thread's cache, taking over the storage's
/// strong reference to `alloc`. Returns the reference back if this thread does not cache
/// `alloc`'s blocks (the caller then gives the block back to the shared lists).
#[inline]
pub(super) fn give(
    alloc: Arc<HostAllocator>,
    class: usize,
    requested: usize,
    ptr: NonNull<u8>,
) -> Result<(), Arc<HostAllocator>> {
    let kept = CACHE.try_with(|c| {
        let Ok(mut c) = c.try_borrow_mut() else { return false };
        if c.owner != Arc::as_ptr(&alloc) {
            return false;
        }
        if c.lists[class].len() >= depth(class) {
            let Cache { lists, counters, .. } = &mut *c;
            let counters = counters.as_deref().expect("attached");
            alloc.spill(class, batch(class), &mut lists[class], counters);
        }
        c.lists[class].push(ptr);
        let size = class_size(class);
        let k = c.counters();
        LocalCounters::sub(&k.in_use_bytes, size);
        LocalCounters::sub(&k.requested_bytes, requested);
        LocalCounters::add(&k.cached_bytes, size);
        LocalCounters::add(&k.cached_blocks, 1);
        c.refs += 1;
        if c.refs > SPARE_REFS {
            // A thread that frees more than it makes: give the excess back (the cache keeps
            // `KEPT_REFS`, so the owner stays alive).
            let owner = c.owner;
            for _ in KEPT_REFS..c.refs {
                // SAFETY: a strong reference this cache owns; `KEPT_REFS` remain.
                unsafe { Arc::decrement_strong_count(owner) };
            }
            c.refs = KEPT_REFS;
        }
        true
    });
    if kept == Ok(true) {
        // The cache counted the storage's reference as its own.
        std::mem::forget(alloc);
        Ok(())
    } else {
        Err(alloc)
    }
}

/// Give this thread's cached blocks back, if its cache's owner is `alloc` (for
/// [`HostAllocator::shrink`]); the cache keeps its owner.
pub(super) fn flush(alloc: &HostAllocator) {
    let _ = CACHE.try_with(|c| {
        if let Ok(mut c) = c.try_borrow_mut() {
            if std::ptr::eq(c.owner, alloc) {
                let Cache { lists, counters, .. } = &mut *c;
                let counters = counters.as_deref().expect("attached");
                let mut blocks = Vec::new();
                for (class, list) in lists.iter_mut().enumerate() {
                    blocks.extend(list.drain(..).map(|p| (class, Block(p))));
                }
                alloc.put_back(blocks, counters);
            }
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::AllocStats;

    /// Run `f` on a new thread with a cache, and wait for it (and its cache's exit).
    fn on_cached_thread<T: Send>(f: impl FnOnce() -> T + Send) -> T {
        std::thread::scope(|s| {
            s.spawn(|| {
                enable();
                f()
            })
            .join()
            .expect("no panic")
        })
    }

    #[test]
    fn a_loop_of_make_and_drop_stays_in_the_thread_cache() {
        let a = HostAllocator::new("t");
        on_cached_thread(|| {
            // `x = f(x)`: make the new one, then drop the old one.
            let mut x = a.alloc(4);
            for i in 1..=10_000u32 {
                let mut s = a.alloc(4);
                assert_eq!(s.as_bytes(), &[0; 4], "a reused block is zeroed");
                s.as_bytes_mut().copy_from_slice(&i.to_ne_bytes());
                x = s;
            }
            assert_eq!(x.as_bytes(), &10_000u32.to_ne_bytes());
            let st = a.stats();
            assert_eq!((st.in_use_bytes, st.requested_bytes), (64, 4));
            // Two blocks ever asked of the system; everything else came from the cache.
            assert_eq!(st.system_allocs, 2);
            assert_eq!(st.cache_hits, 10_000 - 1);
            assert_eq!((st.cached_blocks, st.cached_bytes), (1, 64));
            assert_eq!(st.peak_in_use_bytes, 128);
            // The storages took the cache's references over: beyond `a` and the live
            // storage, only the cache's own and the one the last drop left it.
            assert_eq!(Arc::strong_count(&a), 4);
        });
        // The thread exited: its blocks and references are back.
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes, st.cached_blocks), (0, 0, 2));
        assert_eq!(Arc::strong_count(&a), 1);
        assert!(a.thread_caches() == 0);
    }

    #[test]
    fn a_burst_longer_than_the_cache_spills_to_the_shared_lists_and_comes_back() {
        let a = HostAllocator::new("t");
        let n = depth(0) + batch(0) + 7;
        on_cached_thread(|| {
            for round in 0..3 {
                let held: Vec<_> = (0..n).map(|_| a.alloc(64)).collect();
                assert_eq!(a.stats().in_use_bytes, n * 64);
                drop(held);
                let st = a.stats();
                assert_eq!((st.in_use_bytes, st.cached_blocks, st.cached_bytes), (0, n, n * 64));
                assert_eq!(st.system_allocs, n as u64, "round {round} asked the system again");
                // Part of the burst went back to the shared lists, part stayed here.
                let shared = a.shared_cached_blocks();
                assert!(shared > 0 && shared < n, "{shared} of {n} shared");
            }
            assert_eq!(a.stats().peak_in_use_bytes, n * 64);
        });
        assert_eq!(a.stats().cached_blocks, n);
        assert_eq!(Arc::strong_count(&a), 1);
    }

    #[test]
    fn blocks_made_on_one_thread_and_freed_on_another_are_counted_once() {
        let a = HostAllocator::new("t");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::scope(|s| {
            let a = &a;
            // Made here, from the cache; freed on a thread without one (shared lists).
            let maker = s.spawn(move || {
                enable();
                for _ in 0..1000 {
                    tx.send(a.alloc(100)).expect("receiver alive");
                }
            });
            let freer = s.spawn(move || rx.iter().for_each(drop));
            // Joined by hand: the scope's own wait may end before the thread exits, and the
            // cache gives its references back at the thread's exit.
            maker.join().expect("no panic");
            freer.join().expect("no panic");
        });
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes), (0, 0));
        assert_eq!(st.cached_blocks as u64, st.system_allocs);
        assert_eq!(st.system_allocs + st.cache_hits, 1000);
        assert_eq!(Arc::strong_count(&a), 1);
        // And the other way: made on a thread without a cache, freed into one.
        let made: Vec<_> = (0..500).map(|_| a.alloc(100)).collect();
        on_cached_thread(|| {
            drop(a.alloc(100)); // takes `a` as the cache's owner
            drop(made);
            let st = a.stats();
            assert_eq!((st.in_use_bytes, st.requested_bytes), (0, 0));
        });
        let st = a.stats();
        assert_eq!((st.in_use_bytes, st.requested_bytes), (0, 0));
        assert_eq!(st.cached_blocks as u64, st.system_allocs);
        assert_eq!(Arc::strong_count(&a), 1);
    }

    #[test]
    fn a_thread_changes_owner_after_a_run_of_another_allocators_requests() {
        let (a, b) = (HostAllocator::new("a"), HostAllocator::new("b"));
        on_cached_thread(|| {
            drop(a.alloc(8));
            assert_eq!(a.thread_caches(), 1, "a owns the cache");
            for _ in 0..SWITCH_AFTER - 1 {
                drop(b.alloc(8));
            }
            assert!(b.thread_caches() == 0, "too soon to switch");
            drop(b.alloc(8));
            assert!(a.thread_caches() == 0 && b.thread_caches() == 1, "b owns it now");
            // `a`'s block went back to its shared lists, with its counters.
            let st = a.stats();
            assert_eq!((st.in_use_bytes, st.cached_blocks, st.system_allocs), (0, 1, 1));
            assert_eq!(Arc::strong_count(&a), 1);
            // A storage of `a` freed here goes to `a`'s shared lists.
            let s = a.alloc(8);
            drop(s);
            assert_eq!(a.stats().cached_blocks, 1);
        });
        for x in [&a, &b] {
            let st = x.stats();
            assert_eq!((st.in_use_bytes, st.requested_bytes, st.cached_blocks), (0, 0, 1), "{}", x.name());
            assert_eq!(Arc::strong_count(x), 1);
        }
    }

    #[test]
    fn shrink_on_the_thread_gives_its_cache_back_too() {
        let a = HostAllocator::new("t");
        on_cached_thread(|| {
            drop((a.alloc(64), a.alloc(4096)));
            assert_eq!(a.stats().cached_blocks, 2);
            a.shrink();
            let st = a.stats();
            assert_eq!((st.cached_blocks, st.cached_bytes, st.system_frees), (0, 0, 2));
        });
        assert_eq!(
            a.stats(),
            AllocStats {
                system_allocs: 2,
                system_frees: 2,
                peak_in_use_bytes: 4160,
                ..AllocStats::default()
            }
        );
    }

    #[test]
    fn an_allocator_dropped_while_a_cache_holds_its_blocks_lives_until_the_thread_exits() {
        let weak = on_cached_thread(|| {
            let a = HostAllocator::new("t");
            drop(a.alloc(64));
            let weak = Arc::downgrade(&a);
            drop(a);
            assert!(weak.upgrade().is_some(), "the cache's block keeps it alive");
            weak
        });
        assert!(weak.upgrade().is_none(), "freed at the thread's exit");
    }
}
