//! Host blocks page-locked by a device backend, for copies that go straight between them and
//! the device.
//!
//! A backend that can copy directly from or to page-locked host memory (CUDA, whose copy
//! engines then need no staging buffer and no host-side `memcpy`) may lock a
//! [`HostAllocator`](super::HostAllocator) block the first time a large copy uses it
//! ([`lock_once`]). The lock lasts as long as the block stays with the allocator: freed
//! blocks are cached and handed out again, so a training loop's buffers are locked once.
//! The allocator undoes it just before it gives a block back to the system. A
//! block that could not be locked is remembered too, so that the attempt is not repeated.

use std::collections::HashMap;

use parking_lot::Mutex;

/// Copies of at least this many bytes lock their host block by default; smaller ones are
/// cheaper through a staging buffer than the locking call.
pub const LOCK_MIN_BYTES: usize = 256 << 10;

/// The environment variable that sets [`lock_min_bytes`] (read once per process).
pub const ENV_LOCK_MIN_BYTES: &str = "EAGERVM_CUDA_LOCK_MIN_BYTES";

/// The smallest copy that locks its host block: `EAGERVM_CUDA_LOCK_MIN_BYTES` if set to a
/// number (`0`: every copy), else [`LOCK_MIN_BYTES`].
pub fn lock_min_bytes() -> usize {
    static MIN: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *MIN.get_or_init(|| {
        std::env::var(ENV_LOCK_MIN_BYTES).ok().and_then(|v| v.trim().parse().ok()).unwrap_or(LOCK_MIN_BYTES)
    })
}

/// A locked block: how to undo the lock (`None`: locking failed, none to undo).
struct Pin {
    len: usize,
    unlock: Option<Box<dyn FnOnce() + Send>>,
}

/// Blocks by start address.
static PINS: Mutex<Option<HashMap<usize, Pin>>> = Mutex::new(None);

/// Whether the block `[addr, addr + len)` is locked, locking it with `lock` (which returns
/// how to undo it, or `None` if it failed) if nothing is known of it yet.
pub fn lock_once(addr: usize, len: usize, lock: impl FnOnce() -> Option<Box<dyn FnOnce() + Send>>) -> bool {
    let mut pins = PINS.lock();
    let pins = pins.get_or_insert_with(HashMap::new);
    if let Some(p) = pins.get(&addr) {
        return p.unlock.is_some() && p.len >= len;
    }
    let unlock = lock();
    let locked = unlock.is_some();
    pins.insert(addr, Pin { len, unlock });
    locked
}

/// The block at `addr` goes back to the system: undo its lock, if any.
pub(crate) fn forget(addr: usize) {
    let pin = PINS.lock().as_mut().and_then(|p| p.remove(&addr));
    if let Some(Pin { unlock: Some(unlock), .. }) = pin {
        unlock();
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_block_is_locked_once_and_unlocked_when_forgotten() {
        let (locks, unlocks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let addr = 0x7e57_0000_usize;
        let lock = || {
            locks.fetch_add(1, Ordering::SeqCst);
            let u = unlocks.clone();
            Some(Box::new(move || {
                u.fetch_add(1, Ordering::SeqCst);
            }) as Box<dyn FnOnce() + Send>)
        };
        assert!(lock_once(addr, 4096, lock));
        assert!(lock_once(addr, 4096, || unreachable!("locked already")));
        assert!(!lock_once(addr, 8192, || unreachable!("known")), "a longer range than locked");
        assert_eq!((locks.load(Ordering::SeqCst), unlocks.load(Ordering::SeqCst)), (1, 0));
        forget(addr);
        assert_eq!(unlocks.load(Ordering::SeqCst), 1);
        forget(addr); // nothing left to undo
        assert_eq!(unlocks.load(Ordering::SeqCst), 1);
        // A block that could not be locked is not tried again until it is forgotten.
        let failed = 0x7e58_0000_usize;
        assert!(!lock_once(failed, 4096, || None));
        assert!(!lock_once(failed, 4096, || unreachable!("failed before")));
        forget(failed);
        assert!(lock_once(failed, 4096, lock));
        forget(failed);
    }
}
