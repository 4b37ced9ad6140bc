//! The path of a request for storage, from a size to a [`Storage`]: this thread's cache,
//! the allocator's shared lists, the system; out of memory and injected failures on the
//! way.
//!
//! Blocks come zeroed from the system; a reused block is zeroed again over the requested
//! length, so a new [`Storage`] reads as zeros ([`HostAllocator::try_alloc`]). A 0-byte
//! request gets an empty [`Storage`] that owns no block.
//!
//! # Unzeroed blocks
//!
//! A writer that overwrites every byte of a storage before anything reads it has no use
//! for the zeros: for a large tensor, zeroing a reused block is one more pass over as much
//! memory as the writer's own. [`HostAllocator::try_alloc_unzeroed`] (and [`alloc_tensor`](HostAllocator::alloc_tensor)
//! with [`Contents::Unzeroed`]) skips the zeroing of a reused block, whose bytes are then
//! what the block's earlier storage left there. The VM asks for that only for the outputs
//! of a call whose kernel writes each of its outputs whole (`OpKernel::writes_outputs`),
//! and only for an output that is its whole storage (an owner, or a view that is all of
//! it): a view of part of a storage written first allocates the storage zeroed, so the
//! rest of it reads as zeros, as before. A kernel that fails leaves its outputs carrying
//! the error, and no read, copy or loan of a storage that carries an error reaches its
//! bytes (`vm::instruction_policy`); a later write of part of the storage keeps the error.
//!
//! Reading the old bytes is sound, not undefined behaviour: every block comes from the
//! system through `alloc_zeroed` (a fresh block is zeroed either way), and is afterwards
//! only written with initialised values (the kernels store elements of plain-old-data
//! types, valid for every bit pattern: `kernels::dtype::Elem`), so every byte of a reused
//! block, past the requested length included, is initialised: slices of it may be made
//! before the kernel writes it. What they hold is whatever the block's earlier storage
//! held.
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

use std::ptr::NonNull;
use std::sync::Arc;

use super::host::{HostAllocator, HostOutOfMemory};
use super::size_class::{block_layout, class_of, system_block, FINE_SHIFT, MAX_BYTES};
use super::storage::Storage;
use super::thread_cache;
use crate::ep::memory::DeviceBuffer;
use crate::ep::{DeviceId, EpError};

/// What the bytes of a new host storage hold (module docs, "Unzeroed blocks").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Contents {
    /// Zeros: what a tensor reads as where nothing wrote it.
    Zeroed,
    /// Zeros from a fresh block; from a reused one, the bytes its earlier storage left. For
    /// a writer that writes every byte before anything reads them.
    Unzeroed,
}

impl HostAllocator {
    /// Storage of `bytes` bytes for tensor `tensor` on `device`, as
    /// [`HostAllocator::alloc_for`] gives (host bytes holding `contents`), or
    /// [`EpError::OutOfMemory`] naming the tensor; the tensors this allocator's
    /// [`AllocFaults`](super::AllocFaults) chooses always fail. What the VM calls to allocate
    /// an instruction's outputs and a host write's tensor.
    #[inline]
    pub fn alloc_tensor(
        self: &Arc<Self>,
        tensor: u64,
        device: DeviceId,
        bytes: usize,
        contents: Contents,
    ) -> Result<Storage, EpError> {
        if self.faults.fails(tensor) {
            return Err(self.injected_failure(tensor, device, bytes));
        }
        self.alloc_on(device, bytes, contents).map_err(|e| match e {
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
        self.alloc_on(device, bytes, Contents::Zeroed)
    }

    /// [`alloc_for`](Self::alloc_for), host bytes holding `contents`.
    #[inline]
    fn alloc_on(
        self: &Arc<Self>,
        device: DeviceId,
        bytes: usize,
        contents: Contents,
    ) -> Result<Storage, EpError> {
        match &self.device_memory {
            Some(m) if m.device() == device => {
                Ok(Storage::with_device(DeviceBuffer::new(m, bytes)?, Arc::clone(self)))
            }
            _ => self
                .try_alloc_with(bytes, contents)
                .map_err(|e| EpError::OutOfMemory { device, detail: e.to_string() }),
        }
    }

    /// A zero-filled storage of `bytes` bytes, as [`HostAllocator::try_alloc`] gives.
    ///
    /// # Panics
    /// If the system is out of memory (a panic, which unwinds, never the global allocator's
    /// abort). For tests and fixed small sizes; sizes a program chooses go through
    /// [`HostAllocator::try_alloc`].
    pub fn alloc(self: &Arc<Self>, bytes: usize) -> Storage {
        self.try_alloc(bytes).unwrap_or_else(|e| panic!("{}: {e}", self.name()))
    }

    /// A zero-filled storage of `bytes` bytes, taken from the cache if a block of the
    /// request's size class is free, from the system otherwise. `0` bytes allocate nothing.
    /// If the system refuses, the cache is given back and the system asked once more; if it
    /// refuses again (or `bytes` exceeds the largest class, `isize::MAX / 2 + 1`), the
    /// request fails with [`HostOutOfMemory`].
    #[inline]
    pub fn try_alloc(self: &Arc<Self>, bytes: usize) -> Result<Storage, HostOutOfMemory> {
        self.try_alloc_with(bytes, Contents::Zeroed)
    }

    /// [`try_alloc`](Self::try_alloc) without zeroing a reused block: the storage's bytes are
    /// zeros from a fresh block and the bytes the earlier storage left in a reused one, all
    /// of them initialised (module docs, "Unzeroed blocks"). For a writer that writes every
    /// byte before anything reads them.
    #[inline]
    pub fn try_alloc_unzeroed(self: &Arc<Self>, bytes: usize) -> Result<Storage, HostOutOfMemory> {
        self.try_alloc_with(bytes, Contents::Unzeroed)
    }

    /// [`try_alloc`](Self::try_alloc) or [`try_alloc_unzeroed`](Self::try_alloc_unzeroed).
    #[inline(always)]
    fn try_alloc_with(
        self: &Arc<Self>,
        bytes: usize,
        contents: Contents,
    ) -> Result<Storage, HostOutOfMemory> {
        // The thread cache's path inlined into the caller; everything else out of line.
        if bytes.wrapping_sub(1) < 1 << FINE_SHIFT {
            let (class, _) = class_of(bytes);
            if let Some((ptr, allocator)) = thread_cache::take(self, class, bytes) {
                if contents == Contents::Zeroed {
                    // SAFETY: the block is a class's `>= bytes` bytes long and came off this
                    // thread's cache, so nothing else refers to it.
                    unsafe { ptr.as_ptr().write_bytes(0, bytes) };
                }
                return Ok(Storage::from_block(ptr, bytes, class, allocator));
            }
        }
        self.alloc_shared(bytes, contents)
    }

    /// [`try_alloc_with`](Self::try_alloc_with) from the shared lists or the system.
    #[inline(never)]
    fn alloc_shared(self: &Arc<Self>, bytes: usize, contents: Contents) -> Result<Storage, HostOutOfMemory> {
        if bytes == 0 {
            return Ok(Storage::empty(Arc::clone(self)));
        }
        if bytes > MAX_BYTES {
            return Err(self.out_of_memory(bytes, 0));
        }
        let (class, size) = class_of(bytes);
        let ptr = match self.take_cached(class, bytes) {
            Some(ptr) => {
                if contents == Contents::Zeroed {
                    // SAFETY: the block is `size >= bytes` bytes long, came off the free
                    // list so nothing else refers to it, and `u8` has no alignment
                    // requirement.
                    unsafe { ptr.as_ptr().write_bytes(0, bytes) };
                }
                // Unzeroed, every byte of the block is initialised all the same: it came
                // from `alloc_zeroed` and was only ever written with initialised values
                // (module docs, "Unzeroed blocks").
                ptr
            }
            None => {
                let layout = block_layout(size);
                let ptr: NonNull<u8> = match system_block(layout) {
                    Some(ptr) => ptr,
                    None => {
                        // Give the cache back and ask once more, as the device allocator does.
                        let cached = self.shared_cached_bytes();
                        self.shrink();
                        match system_block(layout) {
                            Some(ptr) => ptr,
                            None => return Err(self.out_of_memory(bytes, cached)),
                        }
                    }
                };
                self.count_fresh(size, bytes);
                ptr
            }
        };
        Ok(Storage::from_block(ptr, bytes, class, Arc::clone(self)))
    }

    #[cold]
    fn out_of_memory(&self, requested: usize, cached: usize) -> HostOutOfMemory {
        HostOutOfMemory { requested, in_use: self.in_use_bytes(), cached }
    }

    /// Give every cached free block back to the system. Blocks in use are not affected;
    /// they return to the (now empty) cache when their storages drop.
    pub fn shrink(&self) {
        // This thread's cache first (other threads' caches keep theirs: at most
        // `thread_cache::depth` blocks per class each).
        thread_cache::flush(self);
        self.release_cached();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::alloc::{AllocFaults, AllocStats};

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
        match a.alloc_tensor(42, DeviceId::mock(1), BEYOND_ANY_MACHINE, Contents::Zeroed) {
            Err(EpError::OutOfMemory { detail, .. }) => {
                assert!(detail.starts_with("tensor 42: out of memory"), "{detail}")
            }
            other => panic!("expected OutOfMemory, got {other:?}"),
        }
        assert_eq!(a.alloc_tensor(42, DeviceId::mock(1), 8, Contents::Unzeroed).unwrap().len(), 8);
    }

    /// A block reused unzeroed holds what its earlier storage left, on the shared lists' path
    /// and on a thread cache's; a fresh block is zeros; a zeroed request zeroes a reused
    /// block again.
    #[test]
    fn an_unzeroed_request_keeps_a_reused_blocks_bytes() {
        let check = |a: &Arc<HostAllocator>, bytes: usize| {
            let mut s = a.try_alloc_unzeroed(bytes).unwrap();
            assert!(s.as_bytes().iter().all(|&b| b == 0), "a fresh block of {bytes} bytes");
            s.as_bytes_mut().fill(0xAB);
            drop(s);
            let mut s = a.alloc_tensor(7, DeviceId::CPU, bytes, Contents::Unzeroed).unwrap();
            assert!(s.as_bytes().iter().all(|&b| b == 0xAB), "a reused block of {bytes} bytes");
            s.as_bytes_mut()[..bytes / 2].fill(0xCD);
            drop(s);
            let s = a.try_alloc_unzeroed(bytes).unwrap();
            assert!(s.as_bytes()[..bytes / 2].iter().all(|&b| b == 0xCD));
            assert!(s.as_bytes()[bytes / 2..].iter().all(|&b| b == 0xAB));
            drop(s);
            let s = a.alloc_tensor(8, DeviceId::CPU, bytes, Contents::Zeroed).unwrap();
            assert!(s.as_bytes().iter().all(|&b| b == 0), "zeroed again");
            drop(s);
            assert!(a.try_alloc(bytes).unwrap().as_bytes().iter().all(|&b| b == 0));
        };
        // The shared lists (this thread has no cache), a small and a large class.
        let a = HostAllocator::new("test");
        check(&a, 256);
        check(&a, 3 << 20);
        assert_eq!((a.stats().system_allocs, a.stats().cache_hits), (2, 8));
        // A thread cache's blocks.
        std::thread::spawn(move || {
            thread_cache::enable();
            let a = HostAllocator::new("test");
            check(&a, 256);
            assert_eq!((a.stats().system_allocs, a.stats().cache_hits), (1, 4));
        })
        .join()
        .unwrap();
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
                match a.alloc_tensor(t, DeviceId::CPU, 16, Contents::Zeroed) {
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
}
