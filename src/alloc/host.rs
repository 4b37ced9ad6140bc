//! The host caching allocator.
//!
//! Every tensor's bytes on the host (and on the mock device, which has its own instance)
//! come from a [`HostAllocator`]. A request is rounded up to a *size class*; a block freed
//! by dropping its [`Storage`] goes back on its class's free list, and the next request of
//! the same class takes it from there instead of asking the system. Training loops that
//! allocate the same shapes every iteration therefore stop calling the system allocator
//! after the first one. [`HostAllocator::shrink`] gives every cached block back.
//!
//! The design follows the caching allocators of the deep-learning runtimes (PyTorch's
//! `CUDACachingAllocator`, OneFlow's `CachingAllocator`), reduced to what host memory
//! needs: no block splitting or merging, one free list per class.
//!
//! # Size classes
//!
//! A request of `n > 0` bytes gets a block of [`HostAllocator::size_class`]`(n)` bytes:
//!
//! - up to 4 KiB: the next power of two, at least 64 (64, 128, 256, ..., 4096);
//! - above 4 KiB: for `2^k < n <= 2^(k+1)`, the next multiple of `2^k / 4`, which gives four
//!   classes per power of two (5 KiB, 6 KiB, 7 KiB, 8 KiB, 10 KiB, 12 KiB, ...) and wastes
//!   less than a quarter of the block.
//!
//! Requests up to `isize::MAX / 2 + 1` bytes (2^62 on 64-bit targets) have a class; larger
//! ones are out of memory. A 0-byte request gets an empty [`Storage`] that owns no block.
//!
//! # Out of memory
//!
//! Allocation is fallible ([`HostAllocator::try_alloc`]): a request the system refuses (a
//! null from the global allocator, never its abort handler) first makes the allocator give
//! its whole cache back ([`HostAllocator::shrink`]) and ask once more, as the device
//! allocator does; if that fails too, the request fails with [`HostOutOfMemory`], which
//! names the request and what is in use. The VM turns that into `Error::Alloc` on the
//! instruction's outputs. On Linux, what the kernel refuses at once depends on its
//! overcommit policy (`/proc/sys/vm/overcommit_memory`): under the default heuristic a
//! request larger than the machine's memory and swap fails here; one the kernel grants but
//! cannot back later is beyond any allocator's reach (the kernel's out-of-memory killer).
//!
//! # Fault injection
//!
//! For tests, an allocator can be made to fail the storage of chosen tensors as if the
//! system were out of memory ([`AllocFaults`](super::AllocFaults), set from
//! `Config::fault`, `FaultInjection::fail_alloc_one_in`). When it is off, the check is one
//! predictable branch per storage allocated, which happens once per tensor written, not per
//! instruction.
//!
//! Every block is 64-byte aligned (a cache line, and enough for every element type). Fresh
//! blocks come zeroed from the system (`alloc_zeroed`); a reused block is zeroed again over
//! the requested length, so a new [`Storage`] always reads as zeros.
//!
//! # Locking and memory ordering
//!
//! One `parking_lot::Mutex` guards all free lists: allocation happens when a tensor is first
//! written, not per instruction, so the lock is uncontended. A thread that allocates and
//! frees many small blocks (a VM worker in an eager loop, which makes a tensor per call)
//! keeps them in a cache of its own instead ([`thread_cache`](super::thread_cache)) and takes
//! the lock once per batch of blocks. The lock also orders a block's reuse
//! after its free: the thread that pushes a freed block releases the lock, the thread that
//! pops it acquires it, so every write through the old [`Storage`] happens before the
//! zeroing and every later access through the new one.
//!
//! The statistics are separate atomics with `Relaxed` ordering, so that
//! [`HostAllocator::stats`] and the profiler's sample of the bytes in use read them without
//! the free lists' lock (and add up the thread caches' counters, under a lock of their own).
//! Every shared counter but the two of system calls and the peak changes only under the
//! lock, with a load and a store rather than a read-modify-write: the lock already makes
//! the update exclusive, and a locked instruction per counter cost more than the rest of an
//! allocation from the cache. A thread cache's counters are differences that only its thread
//! writes, also with loads and stores; the counters wrap, and their sums come back in range.
//! The peak, which thread caches raise too, is raised with `fetch_max`. The counters
//! synchronise nothing; `stats` reads each on its own, so under concurrent traffic a
//! snapshot may mix counters from slightly different moments.
//!
//! This module uses `std` and `parking_lot` directly rather than [`crate::sync`]: it never
//! sleeps waiting for another thread, so it takes no part in the protocols the model
//! checker explores, and the model checker's types would only make every allocation inside
//! a model expensive.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::ptr::NonNull;
use std::slice;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;

use super::fault::AllocFaults;
use super::lend::{self, Foreign};
use super::thread_cache::{self, LocalCounters};
use crate::ep::memory::defer;
use crate::ep::memory::{DeviceBuffer, DeviceMemory};
use crate::ep::{DeviceId, EpError};

/// Alignment of every block, in bytes.
const ALIGN: usize = 64;

/// log2 of the smallest class (64 bytes).
const MIN_SHIFT: u32 = 6;
/// log2 of the largest power-of-two-only class (4 KiB); above it classes are finer.
const FINE_SHIFT: u32 = 12;
/// Classes per power of two above 4 KiB.
const SUB_STEPS: usize = 4;
/// log2 of the largest class: the largest request that has a class is `1 << MAX_SHIFT`.
const MAX_SHIFT: u32 = usize::BITS - 2;
/// The largest request that has a size class.
const MAX_BYTES: usize = 1 << MAX_SHIFT;
/// Classes 64, 128, ..., 4096.
pub(super) const POW2_CLASSES: usize = (FINE_SHIFT - MIN_SHIFT + 1) as usize;
/// Number of size classes: the power-of-two ones, then four per power of two up to
/// `MAX_BYTES`.
const NUM_CLASSES: usize = POW2_CLASSES + (MAX_SHIFT - FINE_SHIFT) as usize * SUB_STEPS;

/// The index and size of the class that serves a request of `bytes` (1..=`MAX_BYTES`).
///
/// Rule: up to 4 KiB, the next power of two (at least 64); above, with `2^k < bytes <=
/// 2^(k+1)`, the next multiple of `2^k / 4`. Classes are numbered in increasing size.
fn class_of(bytes: usize) -> (usize, usize) {
    debug_assert!(bytes > 0 && bytes <= MAX_BYTES);
    if bytes <= 1 << FINE_SHIFT {
        let size = bytes.next_power_of_two().max(1 << MIN_SHIFT);
        ((size.trailing_zeros() - MIN_SHIFT) as usize, size)
    } else {
        // 2^k < bytes <= 2^(k+1), k >= FINE_SHIFT.
        let k = usize::BITS - 1 - (bytes - 1).leading_zeros();
        let base = 1usize << k;
        let step = base / SUB_STEPS;
        let sub = (bytes - base).div_ceil(step); // 1..=SUB_STEPS
        let index = POW2_CLASSES + (k - FINE_SHIFT) as usize * SUB_STEPS + (sub - 1);
        (index, base + sub * step)
    }
}

/// The layout of a block of a class of `size` bytes.
fn block_layout(size: usize) -> Layout {
    // Sizes come from `class_of`, so they are at most `MAX_BYTES`, a multiple of 64, and far
    // below `isize::MAX`: the layout is always valid.
    Layout::from_size_align(size, ALIGN).expect("size classes have valid layouts")
}

/// A 64-byte-aligned type, so that `NonNull::<Align64>::dangling()` is a well-aligned
/// non-null address for empty storages.
#[repr(C, align(64))]
struct Align64([u8; ALIGN]);

/// A free block's address. Its owner is the free list that holds it.
pub(super) struct Block(pub(super) NonNull<u8>);

// SAFETY: a `Block` is the sole owner of the memory it points to (it was allocated by the
// global allocator, which any thread may free, and nothing else refers to it while it is
// on a free list), so moving it to another thread is moving plain owned memory.
unsafe impl Send for Block {}

/// Counters behind [`AllocStats`]; `Relaxed` atomics (see the module docs). All but the
/// system counters change only under the free lists' lock, by a load and a store (`add`,
/// `sub`, `taken`): the lock makes them exclusive, so no read-modify-write is needed, and a
/// plain store costs far less than a locked one on the allocation path.
#[derive(Default)]
struct Counters {
    in_use_bytes: AtomicUsize,
    requested_bytes: AtomicUsize,
    peak_in_use_bytes: AtomicUsize,
    cached_bytes: AtomicUsize,
    cached_blocks: AtomicUsize,
    system_allocs: AtomicU64,
    system_frees: AtomicU64,
    cache_hits: AtomicUsize,
}

impl Counters {
    /// `n` more in `counter` (under the free lists' lock).
    #[inline]
    fn add(&self, counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
    }

    /// `n` less in `counter` (under the free lists' lock).
    #[inline]
    fn sub(&self, counter: &AtomicUsize, n: usize) {
        counter.store(counter.load(Ordering::Relaxed).wrapping_sub(n), Ordering::Relaxed);
    }

    /// A block of `size` bytes handed out for `bytes` requested (under the lock).
    #[inline]
    fn taken(&self, size: usize, bytes: usize) {
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

/// A snapshot of a [`HostAllocator`]'s counters.
///
/// Byte counts are in block (size-class) bytes unless said otherwise; 0-byte storages own
/// no block and count nowhere.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AllocStats {
    /// Bytes of the blocks currently held by live [`Storage`]s.
    pub in_use_bytes: usize,
    /// Bytes requested by the live [`Storage`]s (at most `in_use_bytes`; the difference is
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
    /// Blocks given back to the system allocator (by [`HostAllocator::shrink`]).
    pub system_frees: u64,
    /// Requests served from the cache without asking the system.
    pub cache_hits: u64,
}

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

/// A caching allocator of 64-byte-aligned, zeroed host memory (see the module docs for the
/// size classes and the locking).
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
    device_memory: Option<Arc<dyn DeviceMemory>>,
    /// One free list per size class, indexed by class index.
    free: Mutex<Vec<Vec<Block>>>,
    counters: Counters,
    /// The counters of the thread caches this allocator owns (`alloc::thread_cache`):
    /// [`stats`](Self::stats) adds them up.
    locals: Mutex<Vec<Arc<LocalCounters>>>,
    /// Deliberate failures of tensors' storage (tests only; off by default).
    faults: AllocFaults,
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

    /// Storage of `bytes` bytes for tensor `tensor` on `device`, as
    /// [`HostAllocator::alloc_for`] gives, or [`EpError::OutOfMemory`] naming the tensor; the
    /// tensors this allocator's [`AllocFaults`] chooses always fail. What the VM calls to
    /// allocate an instruction's outputs and a host write's tensor.
    #[inline]
    pub fn alloc_tensor(
        self: &Arc<Self>,
        tensor: u64,
        device: DeviceId,
        bytes: usize,
    ) -> Result<Storage, EpError> {
        if self.faults.fails(tensor) {
            return Err(self.injected_failure(tensor, device, bytes));
        }
        self.alloc_for(device, bytes).map_err(|e| match e {
            EpError::OutOfMemory { device, detail } => {
                EpError::OutOfMemory { device, detail: format!("tensor {tensor}: {detail}") }
            }
            other => other,
        })
    }

    #[cold]
    fn injected_failure(&self, tensor: u64, device: DeviceId, bytes: usize) -> EpError {
        EpError::OutOfMemory {
            device,
            detail: format!(
                "tensor {tensor}: out of memory allocating {bytes} bytes (injected: \
                 FaultInjection::fail_alloc_one_in {})",
                self.faults.one_in
            ),
        }
    }

    /// Storage of `bytes` bytes for a tensor on `device`: device memory if this allocator
    /// has memory of `device` ([`HostAllocator::with_device_memory`]; not zeroed, and its
    /// host view is empty), otherwise zeroed host memory as [`HostAllocator::try_alloc`]
    /// gives. Out of memory, host or device, is [`EpError::OutOfMemory`], never a panic or
    /// an abort.
    #[inline]
    pub fn alloc_for(self: &Arc<Self>, device: DeviceId, bytes: usize) -> Result<Storage, EpError> {
        match &self.device_memory {
            Some(m) if m.device() == device => Ok(Storage {
                ptr: NonNull::<Align64>::dangling().cast(),
                len: 0,
                class: None,
                allocator: ManuallyDrop::new(Arc::clone(self)),
                device: Some(Box::new(DeviceBuffer::new(m, bytes)?)),
                foreign: None,
            }),
            _ => self.try_alloc(bytes).map_err(|e| EpError::OutOfMemory { device, detail: e.to_string() }),
        }
    }

    /// A zero-filled storage of `bytes` bytes, as [`HostAllocator::try_alloc`] gives.
    ///
    /// # Panics
    /// If the system is out of memory (a panic, which unwinds, never the global allocator's
    /// abort). For tests and fixed small sizes; sizes a program chooses go through
    /// [`HostAllocator::try_alloc`].
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Storage {
        self.try_alloc(bytes).unwrap_or_else(|e| panic!("{}: {e}", self.name))
    }

    /// A zero-filled storage of `bytes` bytes, taken from the cache if a block of the
    /// request's size class is free, from the system otherwise. `0` bytes allocate nothing.
    /// If the system refuses, the cache is given back and the system asked once more; if it
    /// refuses again (or `bytes` exceeds the largest class, `isize::MAX / 2 + 1`), the
    /// request fails with [`HostOutOfMemory`].
    #[inline]
    pub fn try_alloc(self: &Arc<Self>, bytes: usize) -> Result<Storage, HostOutOfMemory> {
        // The thread cache's path inlined into the caller; everything else out of line.
        if bytes.wrapping_sub(1) < 1 << FINE_SHIFT {
            let (class, _) = class_of(bytes);
            if let Some((ptr, allocator)) = thread_cache::take(self, class, bytes) {
                // SAFETY: the block is a class's `>= bytes` bytes long and came off this
                // thread's cache, so nothing else refers to it.
                unsafe { ptr.as_ptr().write_bytes(0, bytes) };
                let allocator = ManuallyDrop::new(allocator);
                return Ok(Storage {
                    ptr,
                    len: bytes,
                    class: Some(class),
                    allocator,
                    device: None,
                    foreign: None,
                });
            }
        }
        self.alloc_shared(bytes)
    }

    /// [`try_alloc`](Self::try_alloc) from the shared lists or the system.
    #[inline(never)]
    fn alloc_shared(self: &Arc<Self>, bytes: usize) -> Result<Storage, HostOutOfMemory> {
        if bytes == 0 {
            return Ok(Storage {
                ptr: NonNull::<Align64>::dangling().cast(),
                len: 0,
                class: None,
                allocator: ManuallyDrop::new(Arc::clone(self)),
                device: None,
                foreign: None,
            });
        }
        if bytes > MAX_BYTES {
            return Err(self.out_of_memory(bytes, 0));
        }
        let c = &self.counters;
        let (class, size) = class_of(bytes);
        let cached = {
            let mut free = self.free.lock();
            let block = free[class].pop();
            if block.is_some() {
                c.sub(&c.cached_bytes, size);
                c.sub(&c.cached_blocks, 1);
                c.cache_hits.store(c.cache_hits.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                c.taken(size, bytes);
            }
            block
        };
        let ptr = match cached {
            Some(Block(ptr)) => {
                // SAFETY: the block is `size >= bytes` bytes long, came off the free list
                // so nothing else refers to it, and `u8` has no alignment requirement.
                unsafe { ptr.as_ptr().write_bytes(0, bytes) };
                ptr
            }
            None => {
                let layout = block_layout(size);
                let ptr = match system_block(layout) {
                    Some(ptr) => ptr,
                    None => {
                        // Give the cache back and ask once more, as the device allocator does.
                        let cached = c.cached_bytes.load(Ordering::Relaxed);
                        self.shrink();
                        match system_block(layout) {
                            Some(ptr) => ptr,
                            None => return Err(self.out_of_memory(bytes, cached)),
                        }
                    }
                };
                c.system_allocs.fetch_add(1, Ordering::Relaxed);
                let _free = self.free.lock();
                c.taken(size, bytes);
                ptr
            }
        };
        Ok(Storage {
            ptr,
            len: bytes,
            class: Some(class),
            allocator: ManuallyDrop::new(Arc::clone(self)),
            device: None,
            foreign: None,
        })
    }

    #[cold]
    fn out_of_memory(&self, requested: usize, cached: usize) -> HostOutOfMemory {
        HostOutOfMemory { requested, in_use: self.in_use_bytes(), cached }
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

    /// Give every cached free block back to the system. Blocks in use are not affected;
    /// they return to the (now empty) cache when their storages drop.
    pub fn shrink(&self) {
        // This thread's cache first (other threads' caches keep theirs: at most
        // `thread_cache::depth` blocks per class each).
        thread_cache::flush(self);
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
    fn give_back(&self, class: usize, requested: usize, ptr: NonNull<u8>) {
        let size = class_size(class);
        let c = &self.counters;
        let mut free = self.free.lock();
        free[class].push(Block(ptr));
        c.sub(&c.in_use_bytes, size);
        c.sub(&c.requested_bytes, requested);
        c.add(&c.cached_bytes, size);
        c.add(&c.cached_blocks, 1);
    }

    /// Count a thread cache's counters in [`stats`](Self::stats) (it takes this allocator
    /// as its owner).
    pub(super) fn register(&self, counters: Arc<LocalCounters>) {
        self.locals.lock().push(counters);
    }

    /// Move up to `thread_cache::batch` free blocks of `class` from the shared list to a
    /// thread cache's `list`, counting them as that cache's.
    pub(super) fn refill(&self, class: usize, list: &mut Vec<NonNull<u8>>, local: &LocalCounters) {
        let c = &self.counters;
        let moved = {
            let mut free = self.free.lock();
            let shared = &mut free[class];
            let n = shared.len().min(thread_cache::batch(class));
            list.extend(shared.drain(shared.len() - n..).map(|Block(p)| p));
            c.sub(&c.cached_bytes, n * class_size(class));
            c.sub(&c.cached_blocks, n);
            n
        };
        LocalCounters::add(&local.cached_bytes, moved * class_size(class));
        LocalCounters::add(&local.cached_blocks, moved);
    }

    /// Move `thread_cache::batch` blocks of a thread cache's full `list` (of `class`) to the
    /// shared list.
    pub(super) fn spill(&self, class: usize, list: &mut Vec<NonNull<u8>>, local: &LocalCounters) {
        let n = thread_cache::batch(class).min(list.len());
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

/// The size of class `class` (inverse of [`class_of`]).
pub(super) fn class_size(class: usize) -> usize {
    if class < POW2_CLASSES {
        1 << (MIN_SHIFT as usize + class)
    } else {
        let fine = class - POW2_CLASSES;
        let base = 1usize << (FINE_SHIFT as usize + fine / SUB_STEPS);
        base + (fine % SUB_STEPS + 1) * (base / SUB_STEPS)
    }
}

/// A fresh zeroed block of `layout` from the system, or `None` if it refuses (never its
/// out-of-memory handler, which aborts).
fn system_block(layout: Layout) -> Option<NonNull<u8>> {
    // SAFETY: `layout` has a non-zero size (classes are at least 64 bytes).
    NonNull::new(unsafe { alloc_zeroed(layout) })
}

impl Drop for HostAllocator {
    fn drop(&mut self) {
        // Every storage holds an `Arc` to its allocator, so no block is in use any more:
        // the cache holds them all.
        self.shrink();
    }
}

impl fmt::Debug for HostAllocator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostAllocator").field("name", &self.name).field("stats", &self.stats()).finish()
    }
}

/// One block of host memory from a [`HostAllocator`], owned exclusively: `len` bytes,
/// 64-byte aligned, zeroed when handed out. Dropping it returns the block to its
/// allocator's cache.
pub struct Storage {
    /// Start of the block (a dangling, 64-aligned address when `class` is `None`).
    ptr: NonNull<u8>,
    /// Requested length in bytes; the block may be longer.
    len: usize,
    /// The block's size class; `None` for an empty storage, which owns no block.
    class: Option<usize>,
    /// Dropped by hand: a thread cache may take the reference over (`Drop`).
    allocator: ManuallyDrop<Arc<HostAllocator>>,
    /// Device memory, for a tensor on a device with memory of its own (then the host view
    /// is empty: `len == 0`, no class). Boxed, so that a storage is six words and a
    /// tensor's value (its storage and its error) fits in one cache line: the worker reads
    /// that line for every operand of every call.
    device: Option<Box<DeviceBuffer>>,
    /// The owner of memory the VM did not allocate (`Storage::foreign`, `alloc::lend`),
    /// dropped when the storage is freed; then `ptr` is its memory and `class` is `None`.
    foreign: Option<Box<Foreign>>,
}

// SAFETY: a `Storage` owns its block exclusively (no other pointer to it exists while the
// storage lives, except a loan's, which grants no access: `alloc::lend`; a foreign block's
// other users are bound by `Storage::foreign`'s contract), so sending it to another thread
// moves plain owned bytes; the allocator it returns them to is `Send + Sync` (a mutex and
// atomics), and a foreign owner is `Send`.
unsafe impl Send for Storage {}
// SAFETY: through `&Storage` the block is read (`as_bytes`, `as_f32`, `as_i64`), or written
// through `as_mut_ptr` by a kernel whose instruction holds the write access to the storage
// under the VM's dependence rules, which runs no other instruction on it meanwhile (the
// accesses of one instruction to its own operands are the kernel's to order); every other
// write needs `&mut Storage`. A foreign owner is never reached through `&Storage`.
unsafe impl Sync for Storage {}

impl Storage {
    /// A storage of foreign memory (`Storage::foreign`, whose contract the caller keeps).
    pub(super) fn with_foreign(
        ptr: NonNull<u8>,
        len: usize,
        allocator: Arc<HostAllocator>,
        owner: Box<Foreign>,
    ) -> Storage {
        Storage {
            ptr,
            len,
            class: None,
            allocator: ManuallyDrop::new(allocator),
            device: None,
            foreign: Some(owner),
        }
    }

    /// A storage over a device buffer the VM did not allocate (`Storage::foreign_device`).
    pub(super) fn with_device(buffer: DeviceBuffer, allocator: Arc<HostAllocator>) -> Storage {
        Storage {
            ptr: NonNull::<Align64>::dangling().cast(),
            len: 0,
            class: None,
            allocator: ManuallyDrop::new(allocator),
            device: Some(Box::new(buffer)),
            foreign: None,
        }
    }

    /// The first byte (dangling and aligned for an empty storage).
    pub(super) fn ptr(&self) -> NonNull<u8> {
        self.ptr
    }

    /// The device memory behind this storage, for tensors on a device with memory of its
    /// own (CUDA); `None` for host memory.
    pub fn device_buffer(&self) -> Option<&DeviceBuffer> {
        self.device.as_deref()
    }

    /// Length in bytes (what was requested, not the size class).
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the storage holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The host block behind the storage, as (start address, block size), for a storage
    /// that holds host bytes from the cache (`None` for an empty or a device storage): what
    /// a device backend locks for direct copies (`alloc::pin`).
    pub fn host_block(&self) -> Option<(usize, usize)> {
        self.class.map(|c| (self.ptr.as_ptr() as usize, class_size(c)))
    }

    /// The first byte of the host block, for a kernel that reads its operands element by
    /// element through their layouts (dangling and aligned for an empty or device storage).
    #[inline]
    pub fn as_ptr(&self) -> *const u8 {
        self.ptr.as_ptr()
    }

    /// The first byte of the host block, writable through a shared reference: for a kernel
    /// that writes its outputs, which may share this storage with its inputs (an in-place
    /// op), element by element through their layouts. Writing through it is sound only for
    /// an instruction that holds the write access to the storage (the VM's dependence rules
    /// run nothing else on it meanwhile), and only while no reference to the bytes written
    /// ([`as_bytes`](Self::as_bytes), a slice made from this pointer) is alive.
    #[inline]
    pub fn as_mut_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// The bytes, writable through a shared reference: for a kernel that writes its output
    /// as a slice.
    ///
    /// # Safety
    /// The caller's instruction holds the write access to this storage (the VM's dependence
    /// rules run nothing else on it meanwhile), and no other reference to its bytes is alive
    /// while the slice is: no input of the call shares the storage (the kernel does not work
    /// in place: `OpKernel::in_place`).
    #[allow(clippy::mut_from_ref)]
    pub unsafe fn bytes_mut(&self) -> &mut [u8] {
        // SAFETY: `ptr` is valid for `len` bytes (as in `as_bytes`), and the caller makes this
        // the only reference to them while it lives.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        // SAFETY: `ptr` is non-null and valid for reads of `len` initialised (zeroed, then
        // only written through `&mut self`) bytes, or dangling with `len == 0`; the
        // borrow of `self` keeps the block alive and unwritten for the slice's lifetime.
        unsafe { slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes, writable.
    pub fn as_bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `as_bytes`; `&mut self` makes this the only reference to the block.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }

    /// The bytes as `f32`s (the largest whole prefix if `len` is not a multiple of 4).
    pub fn as_f32(&self) -> &[f32] {
        // SAFETY: `view` requires a plain-old-data `T` with alignment at most 64: `f32`
        // has alignment 4 and every bit pattern is a valid `f32`.
        unsafe { self.view() }
    }

    /// The bytes as `f32`s, writable (the largest whole prefix).
    pub fn as_f32_mut(&mut self) -> &mut [f32] {
        // SAFETY: as in `as_f32`.
        unsafe { self.view_mut() }
    }

    /// The bytes as `i64`s (the largest whole prefix if `len` is not a multiple of 8).
    pub fn as_i64(&self) -> &[i64] {
        // SAFETY: `i64` has alignment 8 (at most 64) and every bit pattern is a valid `i64`.
        unsafe { self.view() }
    }

    /// The bytes as `i64`s, writable (the largest whole prefix).
    pub fn as_i64_mut(&mut self) -> &mut [i64] {
        // SAFETY: as in `as_i64`.
        unsafe { self.view_mut() }
    }

    /// The largest whole prefix of the bytes as `T`s.
    ///
    /// # Safety
    /// `T` must have alignment at most 8 (a foreign storage's) and no invalid bit patterns
    /// (plain old data).
    unsafe fn view<T>(&self) -> &[T] {
        debug_assert!(mem::align_of::<T>() <= lend::FOREIGN_ALIGN && mem::size_of::<T>() > 0);
        let n = self.len / mem::size_of::<T>();
        // SAFETY: `ptr` is 64-byte aligned (a block's layout, or `Align64`'s dangling
        // address when empty), or 8-byte aligned for foreign memory (`Storage::foreign`'s
        // contract), which covers `T`'s alignment by the caller's contract (f32, i64);
        // `n * size_of::<T>() <= len` bytes are valid for reads, and any bit pattern
        // there is a valid `T` by the contract. The borrow of `self` keeps the block
        // alive and unwritten for the slice's lifetime.
        unsafe { slice::from_raw_parts(self.ptr.as_ptr().cast::<T>(), n) }
    }

    /// The largest whole prefix of the bytes as `T`s, writable.
    ///
    /// # Safety
    /// As for [`Storage::view`]; moreover every bit pattern written through a `T` is a
    /// valid byte sequence (true of any type without padding, such as `f32` and `i64`).
    unsafe fn view_mut<T>(&mut self) -> &mut [T] {
        debug_assert!(mem::align_of::<T>() <= lend::FOREIGN_ALIGN && mem::size_of::<T>() > 0);
        let n = self.len / mem::size_of::<T>();
        // SAFETY: as in `view`; `&mut self` makes this the only reference to the block.
        unsafe { slice::from_raw_parts_mut(self.ptr.as_ptr().cast::<T>(), n) }
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        // SAFETY: `allocator` is taken once, here, and not used after.
        let allocator = unsafe { ManuallyDrop::take(&mut self.allocator) };
        if self.foreign.is_some() || lend::any() {
            self.drop_lent_or_foreign(allocator);
            return;
        }
        let Some(class) = self.class else { return };
        if defer::active() {
            // Freed while work is enqueued on an asynchronous stream: return the block
            // when the stream gets there (see `ep::memory::defer`).
            let (block, len) = (Block(self.ptr), self.len);
            defer::offer(move || {
                // Move the whole `Block` (which is `Send`) into the closure.
                let block = block;
                allocator.give_back(class, len, block.0)
            });
        } else if class < thread_cache::CLASSES {
            if let Err(allocator) = thread_cache::give(allocator, class, self.len, self.ptr) {
                allocator.give_back(class, self.len, self.ptr);
            }
        } else {
            allocator.give_back(class, self.len, self.ptr);
        }
    }
}

impl Storage {
    /// The drop of a foreign storage, or of any while some loan is live (`alloc::lend`):
    /// what frees the block waits for the loans of its address, and, as a cached block's
    /// return does, for a launch in flight on this thread's asynchronous stream.
    #[cold]
    fn drop_lent_or_foreign(&mut self, allocator: Arc<HostAllocator>) {
        if let Some(buffer) = self.device.take() {
            // Device memory: its own loans (`alloc::lend`, "Device loans").
            lend::free_device_unless_lent(buffer);
            return;
        }
        let free: Box<dyn FnOnce() + Send> = match (self.class, self.foreign.take()) {
            (Some(class), _) => {
                let (block, len) = (Block(self.ptr), self.len);
                Box::new(move || {
                    let block = block;
                    allocator.give_back(class, len, block.0)
                })
            }
            (None, Some(owner)) => Box::new(move || drop(owner)),
            (None, None) => return,
        };
        let addr = self.ptr.as_ptr() as usize;
        let free = move || lend::free_unless_lent(addr, free);
        if defer::active() {
            defer::offer(free);
        } else {
            free();
        }
    }
}

impl fmt::Debug for Storage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Storage")
            .field("len", &self.len)
            .field("allocator", &self.allocator.name)
            .field("device", &self.device)
            .finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_rule() {
        let cases = [
            (1, 64),
            (64, 64),
            (65, 128),
            (1000, 1024),
            (4096, 4096),
            (4097, 5120),
            (5120, 5120),
            (5121, 6144),
            (8192, 8192),
            (8193, 10240),
            (1 << 20, 1 << 20),
            ((1 << 20) + 1, (1 << 20) + (1 << 18)),
            (MAX_BYTES, MAX_BYTES),
        ];
        for (bytes, size) in cases {
            assert_eq!(HostAllocator::size_class(bytes), size, "request of {bytes}");
        }
        assert_eq!(HostAllocator::size_class(0), 0);
        assert_eq!(class_of(MAX_BYTES).0, NUM_CLASSES - 1);
    }

    #[test]
    fn class_indices_are_dense_and_increasing() {
        let mut sizes = Vec::new();
        for class in 0..NUM_CLASSES {
            let size = class_size(class);
            assert_eq!(class_of(size), (class, size));
            assert_eq!(class_of(size - size / 8 + 1).0, class, "just below {size}");
            sizes.push(size);
        }
        assert!(sizes.windows(2).all(|w| w[0] < w[1]));
        // Above 4 KiB a block wastes less than a quarter of itself.
        for bytes in (4097..200_000).step_by(97) {
            let size = HostAllocator::size_class(bytes);
            assert!(size >= bytes && (size - bytes) * 4 < size, "{bytes} -> {size}");
        }
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
    fn zero_size_allocates_nothing() {
        let a = HostAllocator::new("test");
        let mut s = a.alloc(0);
        assert!(s.is_empty());
        assert_eq!(s.as_bytes(), &[] as &[u8]);
        assert!(s.as_bytes_mut().is_empty());
        assert!(s.as_f32().is_empty() && s.as_i64().is_empty());
        assert!(s.as_f32_mut().is_empty() && s.as_i64_mut().is_empty());
        assert_eq!(s.as_f32().as_ptr() as usize % ALIGN, 0);
        drop(s);
        assert_eq!(a.stats(), AllocStats::default());
    }

    #[test]
    fn typed_views_are_aligned_and_whole() {
        let a = HostAllocator::new("test");
        for bytes in [4, 8, 12, 60, 100, 4100, 9000] {
            let mut s = a.alloc(bytes);
            assert_eq!(s.as_bytes().as_ptr() as usize % ALIGN, 0);
            assert_eq!(s.as_f32().len(), bytes / 4);
            assert_eq!(s.as_i64().len(), bytes / 8);
            assert_eq!(s.as_f32_mut().as_ptr() as usize % 4, 0);
            assert_eq!(s.as_i64_mut().as_ptr() as usize % 8, 0);
        }
        // A length that is not a multiple of the element size views the whole prefix.
        let mut s = a.alloc(13);
        assert_eq!((s.as_f32().len(), s.as_i64().len()), (3, 1));
        s.as_i64_mut()[0] = -2;
        s.as_f32_mut()[2] = 1.5;
        assert_eq!(s.as_i64()[0], -2);
        assert_eq!(s.as_f32()[2], 1.5);
        assert_eq!(s.as_bytes()[12], 0);
    }

    #[test]
    fn storage_is_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Storage>();
        check::<HostAllocator>();
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

    /// A request no machine can serve: beyond the 128 TiB of user address space of a 64-bit
    /// Linux process, so the system refuses it under every overcommit policy.
    const BEYOND_ANY_MACHINE: usize = 1 << 50;

    #[test]
    fn a_request_the_system_refuses_is_an_error_after_giving_the_cache_back() {
        let a = HostAllocator::new("test");
        drop(a.alloc(4096)); // one cached block
        let live = a.alloc(100);
        assert_eq!(a.stats().cached_blocks, 1);
        let e = a.try_alloc(BEYOND_ANY_MACHINE).unwrap_err();
        assert_eq!(e, HostOutOfMemory { requested: BEYOND_ANY_MACHINE, in_use: 128, cached: 4096 });
        assert!(e.to_string().contains(&format!("allocating {BEYOND_ANY_MACHINE} bytes")), "{e}");
        // The cache was given back before the retry; nothing else changed.
        let st = a.stats();
        assert_eq!((st.cached_blocks, st.system_frees, st.system_allocs), (0, 1, 2));
        assert_eq!((st.in_use_bytes, st.requested_bytes), (128, 100));
        // The allocator goes on serving.
        let s = a.try_alloc(64).unwrap();
        assert_eq!(s.as_bytes(), &[0u8; 64]);
        drop((s, live));
    }

    #[test]
    fn a_request_beyond_the_largest_class_is_an_error() {
        let a = HostAllocator::new("test");
        for bytes in [MAX_BYTES + 1, usize::MAX] {
            let e = a.try_alloc(bytes).unwrap_err();
            assert_eq!(e.requested, bytes);
        }
        assert_eq!(a.stats(), AllocStats::default());
    }

    #[test]
    fn out_of_memory_reaches_the_vm_as_an_ep_error_naming_device_and_tensor() {
        let a = HostAllocator::new("mock:1");
        match a.alloc_for(DeviceId::mock(1), BEYOND_ANY_MACHINE) {
            Err(EpError::OutOfMemory { device, detail }) => {
                assert_eq!(device, DeviceId::mock(1));
                assert!(detail.starts_with("out of memory allocating"), "{detail}");
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        match a.alloc_tensor(42, DeviceId::mock(1), BEYOND_ANY_MACHINE) {
            Err(EpError::OutOfMemory { detail, .. }) => {
                assert!(detail.starts_with("tensor 42: out of memory"), "{detail}")
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(a.alloc_tensor(42, DeviceId::mock(1), 8).unwrap().len(), 8);
    }

    #[test]
    #[should_panic(expected = "test: out of memory allocating")]
    fn the_infallible_path_panics_instead_of_aborting() {
        HostAllocator::new("test").alloc(BEYOND_ANY_MACHINE);
    }

    #[test]
    fn injected_failures_fail_the_chosen_tensors_every_time() {
        let off = AllocFaults::default();
        assert!((0..10_000).all(|t| !off.fails(t)));
        let all = AllocFaults { one_in: 1, seed: 7 };
        assert!((0..10_000).all(|t| all.fails(t)));
        let some = AllocFaults { one_in: 4, seed: 7 };
        let chosen: Vec<u64> = (0..10_000).filter(|&t| some.fails(t)).collect();
        assert!((2_200..2_800).contains(&chosen.len()), "{} of 10000 chosen", chosen.len());
        // Another seed chooses other tensors.
        let other = AllocFaults { one_in: 4, seed: 8 };
        assert_ne!(chosen, (0..10_000).filter(|&t| other.fails(t)).collect::<Vec<_>>());

        let a = HostAllocator::with_faults("cpu:0", None, some);
        assert_eq!(a.faults(), some);
        for t in 0..64 {
            for _ in 0..2 {
                match a.alloc_tensor(t, DeviceId::CPU, 16) {
                    Ok(s) => assert!(!some.fails(t) && s.len() == 16),
                    Err(EpError::OutOfMemory { device, detail }) => {
                        assert!(some.fails(t), "tensor {t} failed: {detail}");
                        assert_eq!(device, DeviceId::CPU);
                        assert!(detail.starts_with(&format!(
                            "tensor {t}: out of memory allocating 16 bytes (injected"
                        )));
                    }
                    Err(e) => panic!("{e}"),
                }
            }
        }
        // Injected failures never reach the system allocator or the cache.
        assert_eq!(a.stats().system_allocs, 1);
    }

    #[test]
    fn storage_outlives_its_handle_to_the_allocator() {
        let a = HostAllocator::new("test");
        let s = a.alloc(64);
        drop(a);
        assert_eq!(s.as_bytes().len(), 64);
        drop(s); // returns the block, then frees the allocator and its cache
    }

    #[test]
    fn storage_freed_inside_a_launch_returns_when_the_list_drops() {
        let host = HostAllocator::new("t");
        let s = host.alloc(100);
        let ((), pending) = defer::collect(|| drop(s));
        assert_eq!(pending.len(), 1);
        assert_eq!(host.stats().cached_blocks, 0, "returned before the list dropped");
        drop(pending);
        assert_eq!(host.stats().cached_blocks, 1);
        // Outside a collector, immediate.
        drop(host.alloc(100));
        assert_eq!(host.stats().cached_blocks, 1);
        assert_eq!(host.stats().cache_hits, 1);
    }

    #[test]
    fn no_collector_outlives_a_panicking_launch() {
        let r = std::panic::catch_unwind(|| defer::collect(|| panic!("planted")));
        assert!(r.is_err());
        let host = HostAllocator::new("t");
        drop(host.alloc(8));
        assert_eq!(host.stats().cached_blocks, 1, "a collector leaked past the panic");
    }
}
