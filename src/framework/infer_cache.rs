//! A small cache of checked call signatures, so that a call the builder has already
//! checked once is not checked again.
//!
//! An eager program calls the same few ops on tensors of the same few shapes over and over
//! (every step of a training loop repeats the previous one). A kernel's `infer`, and the
//! rule of which devices its operands may live on, are pure functions of the kernel, the
//! stream, the attributes and the operands' metas (shape, dtype, device), so their answer
//! for one such signature holds for every later call with the same signature. OneFlow keeps
//! a similar cache per op expression.
//!
//! Metas are compared by the number the VM gives each distinct meta (`Engine::intern`),
//! so a signature is a handful of words and a lookup compares words, not shapes. A
//! signature of at most [`KEY_OPS`] operands (nearly every call) is packed into a [`Key`]
//! of five words, and the keys of all entries lie side by side, so a lookup is a scan of
//! a few cache lines comparing five words per entry, starting with the entry that
//! answered last. Wider signatures are compared operand by operand. The cache holds a few
//! entries, replaced round-robin. What it never caches: anything about the tensors'
//! identity or state (released, aliased). The builder checks those on every call.

use smallvec::SmallVec;

use crate::framework::{Attrs, OutSpecs};
use crate::vm::tensor::MetaId;
use crate::vm::KernelRef;

/// Entries kept. A loop body rarely uses more distinct signatures than this at a time; a
/// miss costs one full check, as without the cache.
const ENTRIES: usize = 8;

/// The most operands a signature packed into a [`Key`] has.
pub(crate) const KEY_OPS: usize = 4;

/// A signature of at most [`KEY_OPS`] operands packed into words: the kernel, the scalar
/// attribute's bits, the stream with the input and operand counts and the other attributes'
/// bits ([`Attrs::flag_bits`]), and the operands' meta ids (unused
/// places zero). Equal keys are equal signatures. The all-zero key belongs to no signature
/// (no kernel lies at address zero).
#[derive(Clone, Copy, Default, Debug)]
pub(crate) struct Key([u64; 5]);

impl PartialEq for Key {
    /// Word by word, without a branch (a derived comparison of the array calls `memcmp`,
    /// which costs more than the rest of a cached call's check).
    #[inline(always)]
    fn eq(&self, other: &Key) -> bool {
        self.0.iter().zip(&other.0).fold(0, |d, (a, b)| d | (a ^ b)) == 0
    }
}

impl Eq for Key {}

impl Key {
    /// The key of a signature whose `n` operands (`n_inputs` of them inputs) have the meta
    /// ids `ids[..n]` (`n <= KEY_OPS`; the rest of `ids` must be zero).
    #[inline(always)]
    pub(crate) fn new(
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        n: usize,
        ids: &[MetaId; KEY_OPS],
    ) -> Key {
        debug_assert!(n <= KEY_OPS && ids[n..].iter().all(|id| id.0 == 0));
        let pair = |a: MetaId, b: MetaId| a.0 as u64 | (b.0 as u64) << 32;
        Key([
            kernel.addr() as u64,
            attrs.scalar.to_bits(),
            stream as u64 | (n_inputs as u64) << 32 | (n as u64) << 40 | (attrs.flag_bits() as u64) << 48,
            pair(ids[0], ids[1]),
            pair(ids[2], ids[3]),
        ])
    }

    /// The key of a signature whose operands have the meta ids `ids` (inputs first);
    /// `None` if it has more than [`KEY_OPS`] operands.
    #[inline]
    pub(crate) fn of(
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: impl IntoIterator<Item = MetaId>,
    ) -> Option<Key> {
        let mut packed = [MetaId(0); KEY_OPS];
        let mut n = 0;
        for id in ids {
            *packed.get_mut(n)? = id;
            n += 1;
        }
        Some(Key::new(kernel, stream, attrs, n_inputs, n, &packed))
    }
}

/// One checked signature and its inferred outputs.
struct Entry {
    kernel: usize,
    stream: u32,
    /// The attributes' bits: `scalar`'s and [`Attrs::flag_bits`].
    attrs: (u64, u16),
    n_inputs: u8,
    /// Inputs' meta ids, then the given outputs' meta ids.
    ids: SmallVec<[MetaId; 4]>,
    specs: OutSpecs,
    /// The meta ids of outputs made from `specs` on the stream's device.
    out_ids: SmallVec<[MetaId; 2]>,
}

/// The cache (one per builder; recycled between builders of a VM).
#[derive(Default)]
pub(crate) struct InferCache {
    entries: Vec<Entry>,
    /// `keys[i]`: the key of `entries[i]`, zero if it has none (more than [`KEY_OPS`]
    /// operands) or if there is no entry `i`.
    keys: [Key; ENTRIES],
    /// The entry the last lookup by key found.
    last: usize,
    next: usize,
}

impl InferCache {
    /// The entry cached for the signature packed in `key`, if any.
    #[inline(always)]
    pub(crate) fn find(&mut self, key: &Key) -> Option<usize> {
        if self.keys[self.last] == *key {
            return Some(self.last);
        }
        let i = self.keys.iter().position(|k| k == key)?;
        self.last = i;
        Some(i)
    }

    /// The entry cached for this signature, if any. `ids` are the inputs' meta ids, then
    /// the given outputs' meta ids. (Signatures of at most [`KEY_OPS`] operands are
    /// found faster with [`find`](Self::find).)
    #[inline]
    pub(crate) fn get(
        &self,
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: impl Iterator<Item = MetaId> + Clone,
    ) -> Option<usize> {
        let (k, bits) = (kernel.addr(), (attrs.scalar.to_bits(), attrs.flag_bits()));
        self.entries.iter().position(|e| {
            e.kernel == k
                && e.stream == stream
                && e.attrs == bits
                && e.n_inputs as usize == n_inputs
                && e.ids.iter().copied().eq(ids.clone())
        })
    }

    /// The output specs and output meta ids of entry `i`.
    #[inline]
    pub(crate) fn outputs(&self, i: usize) -> (&OutSpecs, &[MetaId]) {
        let e = &self.entries[i];
        (&e.specs, &e.out_ids)
    }

    /// Remember a checked signature; returns its entry. Not cached (`None`): calls with
    /// more than 255 inputs, and operands whose meta has no number.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn insert(
        &mut self,
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: SmallVec<[MetaId; 4]>,
        specs: OutSpecs,
        out_ids: SmallVec<[MetaId; 2]>,
    ) -> Option<usize> {
        let n_inputs = u8::try_from(n_inputs).ok()?;
        if ids.iter().chain(&out_ids).any(|&id| id == MetaId::NONE) {
            return None;
        }
        let key = Key::of(kernel, stream, attrs, n_inputs as usize, ids.iter().copied()).unwrap_or_default();
        let e = Entry {
            kernel: kernel.addr(),
            stream,
            attrs: (attrs.scalar.to_bits(), attrs.flag_bits()),
            n_inputs,
            ids,
            specs,
            out_ids,
        };
        let i = if self.entries.len() < ENTRIES {
            self.entries.push(e);
            self.entries.len() - 1
        } else {
            let i = self.next;
            self.next = (self.next + 1) % ENTRIES;
            self.entries[i] = e;
            i
        };
        self.keys[i] = key;
        Some(i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::framework::OpRegistry;

    #[test]
    fn hits_only_the_same_signature() {
        let reg = OpRegistry::with_builtins();
        let add = reg.get("add").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let mul = reg.get("mul").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let (a, b) = (MetaId(1), MetaId(2));
        let mut c = InferCache::default();
        let at = Attrs::default();
        let none = SmallVec::new();
        assert_eq!(c.get(add, 0, &at, 2, [a, a].into_iter()), None);
        let i = c.insert(add, 0, &at, 2, SmallVec::from_iter([a, a]), OutSpecs::new(), none.clone()).unwrap();
        assert_eq!(c.get(add, 0, &at, 2, [a, a].into_iter()), Some(i));
        assert!(c.outputs(i).0.is_empty());
        assert_eq!(c.get(mul, 0, &at, 2, [a, a].into_iter()), None, "other kernel");
        assert_eq!(c.get(add, 1, &at, 2, [a, a].into_iter()), None, "other stream");
        assert_eq!(c.get(add, 0, &Attrs::scalar(2.0), 2, [a, a].into_iter()), None, "other attrs");
        assert_eq!(c.get(add, 0, &at, 2, [a, b].into_iter()), None, "other meta");
        assert_eq!(c.get(add, 0, &at, 1, [a, a].into_iter()), None, "input moved to outputs");
        assert_eq!(c.get(add, 0, &at, 2, [a].into_iter()), None, "fewer operands");
        assert_eq!(c.get(add, 0, &at, 2, [a, a, a].into_iter()), None, "more operands");
        // Metas without a number are never cached.
        assert_eq!(
            c.insert(add, 0, &at, 1, SmallVec::from_iter([MetaId::NONE]), OutSpecs::new(), none.clone()),
            None
        );
        // Filling past capacity evicts round-robin and never grows.
        for k in 0..3 * ENTRIES as u32 {
            c.insert(add, 0, &at, 1, SmallVec::from_iter([MetaId(10 + k)]), OutSpecs::new(), none.clone());
        }
        assert!(c.entries.len() <= ENTRIES);
        assert_eq!(c.get(add, 0, &at, 2, [a, a].into_iter()), None);
    }

    /// `find` (packed keys) answers as `get` does, for every signature it can pack, and
    /// follows evictions.
    #[test]
    fn packed_keys_find_what_get_finds() {
        let reg = OpRegistry::with_builtins();
        let add = reg.get("add").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let mul = reg.get("mul").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let key = |k, stream, attrs: &Attrs, n_in, ids: &[MetaId]| {
            Key::of(k, stream, attrs, n_in, ids.iter().copied()).expect("at most KEY_OPS operands")
        };
        let none = SmallVec::new;
        let mut c = InferCache::default();
        let sigs: Vec<(KernelRef, u32, Attrs, usize, Vec<MetaId>)> = vec![
            (add, 0, Attrs::default(), 2, vec![MetaId(1), MetaId(1), MetaId(1)]),
            (add, 0, Attrs::default(), 1, vec![MetaId(1), MetaId(1), MetaId(1)]),
            (add, 1, Attrs::default(), 2, vec![MetaId(1), MetaId(1), MetaId(1)]),
            (mul, 0, Attrs::default(), 2, vec![MetaId(1), MetaId(1), MetaId(1)]),
            (add, 0, Attrs::scalar(0.5), 2, vec![MetaId(1), MetaId(1), MetaId(1)]),
            (add, 0, Attrs::default(), 2, vec![MetaId(1), MetaId(2), MetaId(1)]),
            (add, 0, Attrs::default(), 0, vec![]),
            (add, 0, Attrs::default(), 3, vec![MetaId(0), MetaId(0), MetaId(0), MetaId(7)]),
        ];
        for (i, (k, s, at, n_in, ids)) in sigs.iter().enumerate() {
            for (j, (k2, s2, at2, n_in2, ids2)) in sigs.iter().enumerate().take(i) {
                let found = c.find(&key(*k2, *s2, at2, *n_in2, ids2));
                assert_eq!(found, c.get(*k2, *s2, at2, *n_in2, ids2.iter().copied()), "{j}");
                assert!(found.is_some(), "{j} was inserted");
            }
            assert_eq!(c.find(&key(*k, *s, at, *n_in, ids)), None, "{i} not inserted yet");
            c.insert(*k, *s, at, *n_in, SmallVec::from_slice(ids), OutSpecs::new(), none());
        }
        // Eviction replaces the key with the entry.
        let wide: Vec<MetaId> = (0..5).map(MetaId).collect();
        for _ in 0..ENTRIES {
            c.insert(mul, 9, &Attrs::default(), 1, SmallVec::from_slice(&wide), OutSpecs::new(), none());
        }
        for (k, s, at, n_in, ids) in &sigs {
            assert_eq!(c.find(&key(*k, *s, at, *n_in, ids)), None);
        }
        assert!(c.get(mul, 9, &Attrs::default(), 1, wide.iter().copied()).is_some());
        assert!(c.keys.iter().all(|k| *k == Key::default()), "wide signatures have no key");
    }
}
