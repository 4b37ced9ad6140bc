//! Host memory lent out of the VM ([`HostLoan`]) and host memory the VM borrows
//! ([`Storage::foreign`]): the two halves of a zero-copy exchange with another library
//! (DLPack, `docs/python.md`).
//!
//! # Loans
//!
//! A [`Storage`] owns its block, and the VM drops it when the tensor's `Release` runs,
//! which the front end emits when the last handle drops or at an explicit release. A loan
//! ([`Storage::lend`]) must outlive all of that: the consumer keeps the pointer until it
//! says it is done, whatever happens to the tensor, its handles or its VM. So a loan
//! registers its block's address here; a storage dropped while a loan of its address is
//! live hands what would free the block (the return to its allocator's cache, or a foreign
//! block's owner) to the registry instead, and the last loan of that address runs it.
//!
//! The VM's own rule makes this race-free without a lock on the common path: a loan is
//! taken by an instruction that holds a read access to the tensor
//! (`Tensor::lend_host`), and every drop of that storage happens after it (the `Release`
//! is ordered after every access; an object freed without a `Release` is freed after its
//! last handle, or after its VM's threads are joined). The count of live loans (`LOANS`)
//! is changed under the registry's lock and read relaxed by every storage's drop: a loan
//! that happens before the drop is seen by it (read-write coherence), so a drop that reads
//! zero has no loan of its block to respect. The registry is taken only while some loan is
//! live anywhere in the process: then a storage's drop takes one uncontended lock.
//!
//! Loans are keyed by address, not by storage, because the storage may be gone when the
//! loan ends. Two storages can share an address only if both are foreign (a producer's
//! memory imported twice); each keeps its own owner, so the registry keeps a list of what
//! to run per address.
//!
//! # Device loans
//!
//! A storage of device memory (CUDA) lends its [`DeviceBuffer`] the same way
//! ([`Storage::lend_device`], a [`DeviceLoan`]), under the block's device address in a key
//! space of its own: a device storage dropped while its address is lent keeps its buffer
//! here, and the last loan gives it back. A buffer given back from the VM's `Release` is
//! stream-ordered (the device allocator reuses it only on the stream that freed it); one
//! given back at a loan's end is not: the consumer that ends the loan may still have work
//! in flight on the device that reads it, which the VM cannot see. So the last loan first
//! waits for the device to be idle ([`DeviceBuffer::synchronize`]), then gives the buffer
//! back: a host wait, once per export of device memory, on the thread that ends the loan.
//!
//! # Foreign storage
//!
//! [`Storage::foreign`] wraps memory that another library owns: the storage points at it,
//! and drops `owner` (whose drop tells the producer it is done, e.g. a DLPack deleter)
//! where it would have returned a block to the cache: after every loan of it, and, as a
//! cached block's return is, behind a launch in flight on an asynchronous stream
//! (`ep::memory::defer`).

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;

use super::host::{HostAllocator, Storage};
use crate::ep::memory::DeviceBuffer;

/// What frees a block whose storage dropped while it was lent.
type Free = Box<dyn FnOnce() + Send>;

/// Live loans of one address, and what to run once the last of them ends.
#[derive(Default)]
struct Lent {
    loans: usize,
    kept: Vec<Free>,
}

/// The address space of a lent address: host and device addresses are kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Space {
    Host,
    Device,
}

/// Loans by address (block or foreign data start).
static LENT: Mutex<Option<HashMap<(Space, usize), Lent>>> = Mutex::new(None);

/// Live loans in the process, any address; changed under [`LENT`]'s lock (module docs).
static LOANS: AtomicUsize = AtomicUsize::new(0);

/// Whether some loan is live (a relaxed load: module docs, "Loans").
#[inline]
pub(super) fn any() -> bool {
    LOANS.load(Ordering::Relaxed) != 0
}

/// Run `free` now, unless a loan of `addr` is live: then keep it for the last loan's end.
pub(super) fn free_unless_lent(addr: usize, free: Free) {
    {
        let mut lent = LENT.lock();
        if let Some(l) = lent.as_mut().and_then(|m| m.get_mut(&(Space::Host, addr))) {
            l.kept.push(free);
            return;
        }
    }
    free();
}

/// Drop `buffer` now, unless a loan of its address is live: then keep it for the last
/// loan's end, which waits for the device to be idle before giving it back (module docs,
/// "Device loans").
pub(super) fn free_device_unless_lent(buffer: Box<DeviceBuffer>) {
    let key = (Space::Device, buffer.addr() as usize);
    let mut buffer = Some(buffer);
    {
        let mut lent = LENT.lock();
        if let Some(l) = lent.as_mut().and_then(|m| m.get_mut(&key)) {
            let buffer = buffer.take().expect("taken once");
            l.kept.push(Box::new(move || {
                if let Err(e) = buffer.synchronize() {
                    // The block cannot be known unused: keep it out of the allocator.
                    tracing::error!(error = %e, ?buffer, "a lent device block is leaked");
                    std::mem::forget(buffer);
                }
            }));
            return;
        }
    }
    drop(buffer);
}

/// Take a loan of `key`.
fn register(key: (Space, usize)) {
    let mut lent = LENT.lock();
    lent.get_or_insert_with(HashMap::new).entry(key).or_default().loans += 1;
    LOANS.fetch_add(1, Ordering::Relaxed);
}

/// End a loan of `key`; the last one runs what was kept for its address.
fn unregister(key: (Space, usize)) {
    let kept = {
        let mut lent = LENT.lock();
        let map = lent.as_mut().expect("a live loan is registered");
        let l = map.get_mut(&key).expect("a live loan is registered");
        l.loans -= 1;
        LOANS.fetch_sub(1, Ordering::Relaxed);
        if l.loans > 0 {
            return;
        }
        map.remove(&key).map(|l| l.kept).unwrap_or_default()
    };
    // Outside the lock: a return to a cache takes the allocator's lock, a foreign owner's
    // drop may do anything, and a device buffer's waits for its device.
    for free in kept {
        free();
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

/// The alignment a foreign storage's address must have: the largest of the element types
/// a storage is viewed as (`f32`, `i64`).
pub const FOREIGN_ALIGN: usize = 8;

/// A loan of a storage's host bytes: `len` bytes at [`as_ptr`](Self::as_ptr), which stay
/// allocated (neither freed nor handed to another tensor) until the loan drops, even if the
/// storage, its tensor or its VM is gone by then.
///
/// A loan grants no access: the VM may still write the bytes (an instruction issued after
/// the loan was taken that writes the tensor, in place), so a reader through the pointer
/// must order itself with the VM's writes (wait for them) for its reads to be defined.
/// Dropping it may run on any thread.
#[derive(Debug)]
pub struct HostLoan {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a loan is an address and a registration; nothing is read or written through it
// here, and its drop only takes the registry's lock and runs what frees a block, which is
// `Send` (an allocator's return or a foreign owner's drop).
unsafe impl Send for HostLoan {}
// SAFETY: as for Send; `&HostLoan` only reads the two fields.
unsafe impl Sync for HostLoan {}

impl HostLoan {
    /// The first byte (a dangling, aligned address when the loan is empty).
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is lent (an empty storage: nothing to keep).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for HostLoan {
    fn drop(&mut self) {
        if self.len == 0 {
            return;
        }
        unregister((Space::Host, self.ptr.as_ptr() as usize));
    }
}

/// A loan of a storage's device memory ([`Storage::lend_device`]): `len` bytes at device
/// address [`addr`](Self::addr) on [`device`](Self::device), which stay allocated (neither
/// freed nor handed to another tensor) until the loan drops, even if the storage, its
/// tensor or its VM is gone by then. As a [`HostLoan`], it grants no access: a user of the
/// address orders itself with the VM's accesses. Dropping it may run on any thread; the
/// drop that ends the last loan of a storage already freed waits for the device to be idle
/// (module docs, "Device loans").
#[derive(Debug)]
pub struct DeviceLoan {
    addr: u64,
    len: usize,
    device: crate::ep::DeviceId,
}

impl DeviceLoan {
    /// The device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.addr
    }

    /// Bytes lent.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no byte is lent (an empty tensor's storage: nothing to keep).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The device the memory is on.
    pub fn device(&self) -> crate::ep::DeviceId {
        self.device
    }
}

impl Drop for DeviceLoan {
    fn drop(&mut self) {
        if self.len > 0 {
            unregister((Space::Device, self.addr as usize));
        }
    }
}

impl Storage {
    /// Lend this storage's host bytes (module docs): they stay allocated until the loan
    /// drops, even after this storage drops. An empty storage (no bytes, or device memory,
    /// whose host view is empty) gives an empty loan.
    pub fn lend(&self) -> HostLoan {
        let (ptr, len) = (self.ptr(), self.len());
        if len > 0 {
            register((Space::Host, ptr.as_ptr() as usize));
        }
        HostLoan { ptr, len }
    }

    /// Lend this storage's device memory (module docs, "Device loans"): it stays allocated
    /// until the loan drops, even after this storage drops. `None` for a storage of host
    /// memory; an empty buffer gives an empty loan.
    pub fn lend_device(&self) -> Option<DeviceLoan> {
        let b = self.device_buffer()?;
        let loan = DeviceLoan { addr: b.addr(), len: b.len(), device: b.device() };
        if loan.len > 0 {
            register((Space::Device, loan.addr as usize));
        }
        Some(loan)
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
    use std::sync::atomic::AtomicUsize;

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
