//! [`Storage`]: one block of a tensor's memory, owned exclusively, and what happens to it
//! when it drops.
//!
//! A storage is host bytes from a [`HostAllocator`]'s cache (a size class's block), device
//! memory for a tensor on a device with memory of its own (a
//! [`DeviceBuffer`]), or memory another library owns ([`Storage::foreign`]). Its drop
//! returns the block: to this thread's cache ([`thread_cache`](super::thread_cache)) or the
//! allocator's shared lists; behind a launch in flight on an asynchronous stream
//! ([`ep::memory::defer`](crate::ep::memory::defer)); or, while the block is lent
//! ([`lend`](super::lend)), to the registry that the last loan empties.
//!
//! # Foreign storage
//!
//! [`Storage::foreign`] wraps memory that another library owns: the storage points at it,
//! and drops `owner` (whose drop tells the producer it is done, e.g. a DLPack deleter)
//! where it would have returned a block to the cache: after every loan of it, and, as a
//! cached block's return is, behind a launch in flight on an asynchronous stream
//! (`ep::memory::defer`). [`Storage::foreign_device`] does the same for device memory.

use std::fmt;
use std::mem::{self, ManuallyDrop};
use std::ptr::NonNull;
use std::slice;
use std::sync::{Arc, OnceLock};

use super::host::HostAllocator;
use super::lend::{self, DeviceLoan, HostLoan, FOREIGN_ALIGN};
use super::size_class::{class_size, dangling, Block};
use super::thread_cache;
use crate::ep::memory::defer;
use crate::ep::memory::DeviceBuffer;

/// One block of host memory from a [`HostAllocator`], owned exclusively: `len` bytes,
/// 64-byte aligned, zeroed when handed out (unless asked for as
/// [`Contents::Unzeroed`](super::Contents::Unzeroed), for a writer that overwrites them).
/// Dropping it returns the block to its allocator's cache.
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
    /// A storage of `len` bytes in the block `ptr` of class `class`, which `allocator`
    /// handed out (its counters count it in use).
    #[inline]
    pub(super) fn from_block(
        ptr: NonNull<u8>,
        len: usize,
        class: usize,
        allocator: Arc<HostAllocator>,
    ) -> Storage {
        Storage {
            ptr,
            len,
            class: Some(class),
            allocator: ManuallyDrop::new(allocator),
            device: None,
            foreign: None,
        }
    }

    /// An empty storage, which owns no block.
    pub(super) fn empty(allocator: Arc<HostAllocator>) -> Storage {
        Storage {
            ptr: dangling(),
            len: 0,
            class: None,
            allocator: ManuallyDrop::new(allocator),
            device: None,
            foreign: None,
        }
    }

    /// A storage of foreign memory (`Storage::foreign`, whose contract the caller keeps).
    fn with_foreign(
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
            ptr: dangling(),
            len: 0,
            class: None,
            allocator: ManuallyDrop::new(allocator),
            device: Some(Box::new(buffer)),
            foreign: None,
        }
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
        // SAFETY: `ptr` is non-null and valid for reads of `len` initialised bytes (a block
        // is zeroed when the system hands it out and only ever written with initialised
        // values: `alloc::request`, "Unzeroed blocks"; foreign memory by its contract), or
        // dangling with `len == 0`; the borrow of `self` keeps the block alive, and no
        // instruction writes it while a reference from `as_bytes` is alive (the VM's
        // dependence rules, `Storage`'s `Sync`).
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
        debug_assert!(mem::align_of::<T>() <= FOREIGN_ALIGN && mem::size_of::<T>() > 0);
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
        debug_assert!(mem::align_of::<T>() <= FOREIGN_ALIGN && mem::size_of::<T>() > 0);
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
            .field("allocator", &self.allocator.name())
            .field("device", &self.device)
            .finish()
    }
}

/// The owner of foreign memory wrapped as a [`Storage`] (dropped when the storage is freed).
pub(super) struct Foreign(#[allow(dead_code)] Box<dyn Send>);

/// The allocator named by every foreign storage. It never allocates: a storage names an
/// allocator for its messages and for the return of a cached block, which a foreign storage
/// does not have.
fn foreign_allocator() -> Arc<HostAllocator> {
    static FOREIGN: OnceLock<Arc<HostAllocator>> = OnceLock::new();
    FOREIGN.get_or_init(|| HostAllocator::new("foreign")).clone()
}

impl Storage {
    /// Lend this storage's host bytes ([`lend`](super::lend)): they stay allocated until
    /// the loan drops, even after this storage drops. An empty storage (no bytes, or device
    /// memory, whose host view is empty) gives an empty loan.
    pub fn lend(&self) -> HostLoan {
        HostLoan::take(self.ptr, self.len)
    }

    /// Lend this storage's device memory ([`lend`](super::lend), "Device loans"): it stays
    /// allocated until the loan drops, even after this storage drops. `None` for a storage
    /// of host memory; an empty buffer gives an empty loan.
    pub fn lend_device(&self) -> Option<DeviceLoan> {
        let b = self.device_buffer()?;
        Some(DeviceLoan::take(b.addr(), b.len(), b.device()))
    }

    /// A storage of device memory the VM did not allocate: `buffer`, which a device backend
    /// made over the foreign block (`DeviceBuffer::adopt`), and whose owner gives the
    /// block back to the other library when the buffer drops (after the storage's `Release`
    /// and every loan of it).
    pub fn foreign_device(buffer: DeviceBuffer) -> Storage {
        Storage::with_device(buffer, foreign_allocator())
    }

    /// A storage of `len` bytes at `ptr`, memory the VM did not allocate; `owner` keeps it
    /// valid and is dropped when the storage is freed (module docs, "Foreign storage"), on
    /// whatever thread frees it. Its bytes are read and written in place by the VM's
    /// instructions as a cached block's are; it is not zeroed.
    ///
    /// # Safety
    /// Until `owner` drops: `ptr` is valid for reads and writes of `len` bytes and aligned
    /// to [`FOREIGN_ALIGN`]; and nothing else writes those bytes while a VM instruction may
    /// read them, nor accesses them while one may write them (the VM orders its own
    /// accesses; any other party must order itself with the VM's, e.g. by waiting for it).
    pub unsafe fn foreign(ptr: NonNull<u8>, len: usize, owner: Box<dyn Send>) -> Storage {
        debug_assert_eq!(ptr.as_ptr() as usize % FOREIGN_ALIGN, 0, "the caller's contract");
        Storage::with_foreign(ptr, len, foreign_allocator(), Box::new(Foreign(owner)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::size_class::ALIGN;
    use crate::alloc::AllocStats;
    use std::sync::atomic::{AtomicUsize, Ordering};

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

    /// Counts its drops.
    struct Owner(Arc<AtomicUsize>);
    impl Drop for Owner {
        fn drop(&mut self) {
            self.0.fetch_add(1, Ordering::SeqCst);
        }
    }

    #[test]
    fn a_block_lent_outlives_its_storage_and_goes_back_after_the_last_loan() {
        let a = HostAllocator::new("lend-test");
        let mut s = a.alloc(100);
        s.as_bytes_mut()[..4].copy_from_slice(&[1, 2, 3, 4]);
        let (l1, l2) = (s.lend(), s.lend());
        assert_eq!((l1.as_ptr(), l1.len()), (s.as_bytes().as_ptr() as *mut u8, 100));
        drop(s);
        // The block is kept: a new storage of its class must not get it.
        assert_eq!(a.stats().in_use_bytes, 128, "kept, not given back");
        let other = a.alloc(100);
        assert_ne!(other.as_bytes().as_ptr(), l1.as_ptr() as *const u8);
        // SAFETY: the loan keeps the 100 bytes allocated, and nothing writes them now.
        assert_eq!(unsafe { std::slice::from_raw_parts(l1.as_ptr(), 4) }, &[1, 2, 3, 4]);
        drop(l1);
        assert_eq!(a.stats().in_use_bytes, 256, "one loan is still live");
        drop(l2);
        assert_eq!(a.stats().in_use_bytes, 128, "the last loan gave the block back");
        assert_eq!(a.stats().cached_blocks, 1);
        drop(other);
    }

    #[test]
    fn a_foreign_owner_drops_once_after_its_storage_and_every_loan() {
        let drops = Arc::new(AtomicUsize::new(0));
        let mut mem = vec![0u64; 4];
        let ptr = NonNull::new(mem.as_mut_ptr().cast::<u8>()).unwrap();
        // SAFETY: `mem` outlives the storage and its loans, is 8-aligned, and nothing else
        // touches it meanwhile.
        let mut s = unsafe { Storage::foreign(ptr, 32, Box::new(Owner(drops.clone()))) };
        s.as_i64_mut()[1] = 7;
        assert_eq!(mem_at(ptr, 1), 7, "written in place");
        let l = s.lend();
        drop(s);
        assert_eq!(drops.load(Ordering::SeqCst), 0, "a loan is live");
        drop(l);
        assert_eq!(drops.load(Ordering::SeqCst), 1);
        // Without a loan, at the storage's drop.
        // SAFETY: as above.
        let s = unsafe { Storage::foreign(ptr, 32, Box::new(Owner(drops.clone()))) };
        drop(s);
        assert_eq!(drops.load(Ordering::SeqCst), 2);
        drop(mem);
    }

    fn mem_at(ptr: NonNull<u8>, i: usize) -> i64 {
        // SAFETY: the test's buffer holds at least `i + 1` i64s.
        unsafe { *ptr.as_ptr().cast::<i64>().add(i) }
    }

    /// Device memory that counts what the VM asks of it.
    #[derive(Debug, Default)]
    struct CountingDevice {
        released: AtomicUsize,
        synchronized: AtomicUsize,
    }

    impl crate::ep::memory::DeviceMemory for CountingDevice {
        fn device(&self) -> crate::ep::DeviceId {
            crate::ep::DeviceId::cuda(0)
        }
        fn allocate(&self, _bytes: usize) -> Result<crate::ep::memory::Block, crate::ep::EpError> {
            unreachable!("the tests adopt their blocks")
        }
        fn release(&self, _block: crate::ep::memory::Block) {
            self.released.fetch_add(1, Ordering::SeqCst);
        }
        fn synchronize(&self) -> Result<(), crate::ep::EpError> {
            self.synchronized.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
    }

    fn device_storage(dev: &Arc<CountingDevice>, addr: u64) -> Storage {
        let block = crate::ep::memory::Block { addr, size: 512, requested: 400 };
        Storage::foreign_device(DeviceBuffer::adopt(dev.clone(), block))
    }

    #[test]
    fn a_device_block_lent_is_given_back_after_the_last_loan_and_a_device_wait() {
        let dev = Arc::new(CountingDevice::default());
        // An address no host block has: device loans have their own key space.
        let s = device_storage(&dev, 0x7000_0000_0200);
        assert!(s.lend().is_empty(), "no host bytes");
        let (l1, l2) = (s.lend_device().unwrap(), s.lend_device().unwrap());
        assert_eq!((l1.addr(), l1.len(), l1.device()), (0x7000_0000_0200, 400, crate::ep::DeviceId::cuda(0)));
        drop(s);
        assert_eq!(dev.released.load(Ordering::SeqCst), 0, "kept while lent");
        drop(l1);
        assert_eq!(dev.released.load(Ordering::SeqCst), 0, "one loan is still live");
        drop(l2);
        assert_eq!(dev.synchronized.load(Ordering::SeqCst), 1, "the last loan waits for the device");
        assert_eq!(dev.released.load(Ordering::SeqCst), 1);
        // Not lent: given back at the drop, stream-ordered, without a wait.
        drop(device_storage(&dev, 0x7000_0000_0400));
        assert_eq!((dev.released.load(Ordering::SeqCst), dev.synchronized.load(Ordering::SeqCst)), (2, 1));
        // A loan that ends first leaves the storage's drop as it was.
        let s = device_storage(&dev, 0x7000_0000_0600);
        drop(s.lend_device().unwrap());
        drop(s);
        assert_eq!((dev.released.load(Ordering::SeqCst), dev.synchronized.load(Ordering::SeqCst)), (3, 1));
        // A host storage has no device loan.
        let a = HostAllocator::new("lend-device-test");
        assert!(a.alloc(8).lend_device().is_none());
    }

    #[test]
    fn an_empty_storage_lends_nothing_and_keeps_nothing() {
        let a = HostAllocator::new("lend-empty");
        let s = a.alloc(0);
        let l = s.lend();
        assert!(l.is_empty());
        drop(s);
        drop(l);
    }
}
