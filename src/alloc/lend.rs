//! Host and device memory lent out of the VM ([`HostLoan`], [`DeviceLoan`]): one half of a
//! zero-copy exchange with another library (DLPack, `docs/python.md`); the other half,
//! memory the VM borrows, is [`Storage::foreign`](super::Storage::foreign).
//!
//! # Loans
//!
//! A [`Storage`](super::Storage) owns its block, and the VM drops it when the tensor's
//! `Release` runs, which the front end emits when the last handle drops or at an explicit
//! release. A loan ([`Storage::lend`](super::Storage::lend)) must outlive all of that: the
//! consumer keeps the pointer until it says it is done, whatever happens to the tensor, its
//! handles or its VM. So a loan registers its block's address here; a storage dropped while
//! a loan of its address is live hands what would free the block (the return to its
//! allocator's cache, or a foreign block's owner) to the registry instead, and the last loan
//! of that address runs it.
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
//! ([`Storage::lend_device`](super::Storage::lend_device), a [`DeviceLoan`]), under the block's device address in a key
//! space of its own: a device storage dropped while its address is lent keeps its buffer
//! here, and the last loan gives it back. A buffer given back from the VM's `Release` is
//! stream-ordered (the device allocator reuses it only on the stream that freed it); one
//! given back at a loan's end is not: the consumer that ends the loan may still have work
//! in flight on the device that reads it, which the VM cannot see. So the last loan first
//! waits for the device to be idle ([`DeviceBuffer::synchronize`]), then gives the buffer
//! back: a host wait, once per export of device memory, on the thread that ends the loan.

use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};

use parking_lot::Mutex;

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
    /// A loan of the `len` bytes at `ptr`, registered unless empty (module docs).
    pub(super) fn take(ptr: NonNull<u8>, len: usize) -> HostLoan {
        if len > 0 {
            register((Space::Host, ptr.as_ptr() as usize));
        }
        HostLoan { ptr, len }
    }

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

/// A loan of a storage's device memory
/// ([`Storage::lend_device`](super::Storage::lend_device)): `len` bytes at device
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
    /// A loan of the `len` bytes at device address `addr` on `device`, registered unless
    /// empty (module docs, "Device loans").
    pub(super) fn take(addr: u64, len: usize, device: crate::ep::DeviceId) -> DeviceLoan {
        if len > 0 {
            register((Space::Device, addr as usize));
        }
        DeviceLoan { addr, len, device }
    }

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
