//! The numbers a VM gives tensor metas (`Engine::intern`), and a per-thread cache of them.
//!
//! Every VM numbers each distinct signature of a [`TensorMeta`] (shape, dtype, device; not its
//! layout, which kernels take as it comes) it sees, so that the builder compares call
//! signatures by number (`framework::infer_cache`). The numbers live
//! in one table per VM ([`Metas`]), a map under a lock, hashed with FNV rather than the
//! standard SipHash: its keys are the program's own shapes, not input an attacker chooses.
//!
//! An eager program asks for the same few metas over and over, from the thread that builds
//! its calls. Each thread therefore keeps a small direct-mapped cache of the answers it got
//! ([`intern`]): the meta's hash picks one of [`SLOTS`] slots, and a slot that holds the
//! same VM and an equal meta answers without the lock. A VM is named in the cache by a
//! serial number that no other VM of the process ever gets (not by its address, which a
//! later VM may reuse), and a meta's number never changes once given, so an answer in the
//! cache stays true for as long as the VM lives, and names no live VM after it.

use std::cell::RefCell;
use std::collections::HashMap;
use std::hash::BuildHasherDefault;
use std::sync::atomic::{AtomicU64, Ordering};

use fnv::FnvHasher;
use parking_lot::Mutex;

use super::tensor::{MetaId, TensorMeta};

/// Slots of each thread's cache.
const SLOTS: usize = 64;

/// Distinct metas a VM numbers; metas beyond this get [`MetaId::NONE`] (their calls are
/// checked in full every time), which bounds the table in programs whose shapes never
/// repeat.
const MAX_METAS: usize = 1 << 20;

/// One VM's table of meta numbers.
pub(crate) struct Metas {
    /// This table's serial number, unique in the process.
    serial: u64,
    table: Mutex<HashMap<TensorMeta, MetaId, BuildHasherDefault<FnvHasher>>>,
}

impl Default for Metas {
    fn default() -> Self {
        static SERIAL: AtomicU64 = AtomicU64::new(1);
        Metas { serial: SERIAL.fetch_add(1, Ordering::Relaxed), table: Mutex::default() }
    }
}

/// One slot of a thread's cache: a VM's serial, a meta and its number (serial 0: empty).
type Slot = (u64, Option<TensorMeta>, MetaId);

thread_local! {
    static CACHE: RefCell<[Slot; SLOTS]> = RefCell::new(std::array::from_fn(|_| (0, None, MetaId::NONE)));
}

/// The slot of `meta` in a thread's cache: FxHash's step over the dimensions, the dtype and
/// the device, and the product's top bits.
#[inline]
fn slot_of(meta: &TensorMeta) -> usize {
    const K: u64 = 0x517c_c1b7_2722_0a95;
    let step = |h: u64, w: u64| (h.rotate_left(5) ^ w).wrapping_mul(K);
    let device = (meta.device.ty as u64) << 16 | meta.device.index as u64;
    let h = meta.shape.iter().fold(step(step(0, meta.dtype as u64), device), |h, &d| step(h, d as u64));
    (h >> (64 - SLOTS.trailing_zeros())) as usize
}

impl Metas {
    /// The number of `meta` in this table: equal metas get equal numbers
    /// ([`MetaId::NONE`] once [`MAX_METAS`] are numbered). Answered from this thread's
    /// cache when it can be (module docs).
    #[inline]
    pub(crate) fn intern(&self, meta: &TensorMeta) -> MetaId {
        let slot = slot_of(meta);
        let hit = CACHE.try_with(|c| {
            let c = c.try_borrow().ok()?;
            let (serial, m, id) = &c[slot];
            (*serial == self.serial && m.as_ref().is_some_and(|m| m.same_signature(meta))).then_some(*id)
        });
        if let Ok(Some(id)) = hit {
            return id;
        }
        let id = self.intern_locked(meta);
        if id != MetaId::NONE {
            let _ = CACHE.try_with(|c| {
                if let Ok(mut c) = c.try_borrow_mut() {
                    c[slot] = (self.serial, Some(meta.clone()), id);
                }
            });
        }
        id
    }

    /// [`intern`](Self::intern) through the table.
    fn intern_locked(&self, meta: &TensorMeta) -> MetaId {
        // Keyed by the signature alone: the contiguous meta of the same shape.
        let key = TensorMeta::new(&meta.shape, meta.dtype, meta.device);
        let mut metas = self.table.lock();
        if let Some(&id) = metas.get(&key) {
            return id;
        }
        if metas.len() >= MAX_METAS {
            return MetaId::NONE;
        }
        let id = MetaId(metas.len() as u32);
        metas.insert(key, id);
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::vm::DType;

    #[test]
    fn equal_metas_get_equal_numbers_in_one_table_only() {
        let (a, b) = (Metas::default(), Metas::default());
        let m = |shape: &[usize], dt| TensorMeta::new(shape, dt, DeviceId::CPU);
        let x = a.intern(&m(&[2, 3], DType::F32));
        assert_eq!(a.intern(&m(&[2, 3], DType::F32)), x, "from the thread's cache");
        assert_ne!(a.intern(&m(&[3, 2], DType::F32)), x);
        assert_ne!(a.intern(&m(&[2, 3], DType::I64)), x);
        assert_ne!(a.intern(&TensorMeta::new(&[2, 3], DType::F32, DeviceId::mock(0))), x);
        // Another table numbers from its own start, whatever this thread's cache holds.
        let y = b.intern(&m(&[7], DType::F32));
        assert_eq!(y, MetaId(0));
        assert_eq!(b.intern(&m(&[2, 3], DType::F32)), MetaId(1));
        assert_eq!(a.intern(&m(&[2, 3], DType::F32)), x);
        // A view's layout is not part of the signature.
        let view = m(&[3, 2], DType::F32).with_layout(&[2, 3], &[1, 2], 0);
        assert_eq!(a.intern(&view), x);
        assert_eq!(a.intern(&view.with_layout(&[2, 3], &[3, 1], 6)), x);
        // Another thread gets the same numbers.
        let (a, x2) = std::thread::scope(|s| {
            s.spawn(|| (a.intern(&m(&[3, 2], DType::F32)), a.intern(&m(&[2, 3], DType::F32)))).join().unwrap()
        });
        assert_eq!((a, x2), (MetaId(1), x));
    }

    #[test]
    fn many_metas_through_a_small_cache() {
        let t = Metas::default();
        let metas: Vec<TensorMeta> =
            (0..4 * SLOTS).map(|n| TensorMeta::new(&[n, 1], DType::F32, DeviceId::CPU)).collect();
        let ids: Vec<MetaId> = metas.iter().map(|m| t.intern(m)).collect();
        for _ in 0..3 {
            for (m, id) in metas.iter().zip(&ids) {
                assert_eq!(t.intern(m), *id);
            }
        }
        let mut sorted: Vec<u32> = ids.iter().map(|i| i.0).collect();
        sorted.dedup();
        assert_eq!(sorted.len(), 4 * SLOTS, "distinct metas, distinct numbers");
    }
}
