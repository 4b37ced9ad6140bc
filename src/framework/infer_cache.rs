//! A cache of checked call signatures, so that a call the builder has already checked
//! once is not checked again.
//!
//! An eager program calls the same ops on tensors of the same shapes over and over (every
//! step of a training loop repeats the previous one). A kernel's `infer`, and the rule of
//! which devices its operands may live on, are pure functions of the kernel, the stream,
//! the attributes and the operands' metas (shape, dtype, device), so their answer for one
//! such signature holds for every later call with the same signature. OneFlow keeps a
//! similar cache per op expression.
//!
//! Metas are compared by the number the VM gives each distinct meta (`Engine::intern`),
//! so a signature is a handful of words and a lookup compares words, not shapes. A
//! signature of at most [`KEY_OPS`] operands (nearly every call) is packed into a [`Key`]
//! of five words and kept in a set-associative table: the key's hash (FxHash's multiply
//! and rotate, over the five words) picks one of [`SETS`] sets, and the set's [`WAYS`] keys
//! lie side by side, so a lookup compares at most eight keys in five cache lines,
//! after first trying the entry that answered last (a loop of one signature). A set that
//! is full replaces its entries round-robin. The table holds a real loop's signatures: the
//! MLP step of `run mlp` has 24, which a table of 8 entries replaced round-robin missed on
//! every call. Wider signatures, up to [`WIDE_OPS`] operands, are packed the same way into
//! a longer [`WideKey`] and kept in a short list of their own, whose last hit is tried
//! first; the rare wider one is compared operand by operand. What the cache never holds: anything about the tensors' identity or state
//! (released, aliased). The builder checks those on every call.

use smallvec::SmallVec;

use crate::framework::{Attrs, OutSpecs};
use crate::vm::tensor::MetaId;
use crate::vm::KernelRef;

/// Sets of the table of packed signatures.
const SETS: usize = 64;

/// Entries per set: 512 signatures in all. Eight ways make a set that overflows on a loop
/// of a few dozen signatures vanishingly rare (for 24, one loop in tens of millions, by
/// where the hash happens to put them); a miss costs one full check, as without the cache.
const WAYS: usize = 8;

/// Entries for signatures of more than [`KEY_OPS`] operands, replaced round-robin.
const WIDE: usize = 16;

/// The most operands a signature packed into a [`Key`] has.
pub(crate) const KEY_OPS: usize = 4;

/// The most operands a signature packed into a [`WideKey`] has.
pub(crate) const WIDE_OPS: usize = 16;

/// A signature of at most `N` operands packed into `W = 4 + N / 2` words: the kernel, the
/// scalar attribute's bits, the stream with the input and operand counts and the other
/// attributes' bits ([`Attrs::flag_bits`]), the parameter list's number
/// ([`Attrs::params_id`]), then the operands' meta ids two to a word (unused places
/// zero). Equal keys are equal signatures. The all-zero key belongs to no
/// signature (no kernel lies at address zero). Two sizes are used: [`Key`] and
/// [`WideKey`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Packed<const W: usize, const N: usize>([u64; W]);

/// A signature of at most [`KEY_OPS`] operands: six words, which the table hashes.
pub(crate) type Key = Packed<6, KEY_OPS>;

/// A signature of at most [`WIDE_OPS`] operands: twelve words. A fan-in of eight inputs is
/// found by comparing them, with no walk over an entry's id list.
pub(crate) type WideKey = Packed<{ 4 + WIDE_OPS / 2 }, WIDE_OPS>;

impl<const W: usize, const N: usize> Default for Packed<W, N> {
    fn default() -> Self {
        Packed([0; W])
    }
}

impl<const W: usize, const N: usize> PartialEq for Packed<W, N> {
    /// Word by word, without a branch (a derived comparison of the array calls `memcmp`,
    /// which costs more than the rest of a cached call's check).
    #[inline(always)]
    fn eq(&self, other: &Self) -> bool {
        self.0.iter().zip(&other.0).fold(0, |d, (a, b)| d | (a ^ b)) == 0
    }
}

impl<const W: usize, const N: usize> Eq for Packed<W, N> {}

impl<const W: usize, const N: usize> Packed<W, N> {
    /// The two sizes agree: four words, then two meta ids to a word.
    const SIZES: () = assert!(W == 4 + N / 2 && N % 2 == 0);

    /// The key of a signature whose `n` operands (`n_inputs` of them inputs) have the meta
    /// ids `ids[..n]` (`n <= N`; the rest of `ids` must be zero).
    #[inline(always)]
    pub(crate) fn new(
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        n: usize,
        ids: &[MetaId; N],
    ) -> Self {
        let () = Self::SIZES;
        debug_assert!(n <= N && ids[n..].iter().all(|id| id.0 == 0));
        let mut w = [0u64; W];
        w[0] = kernel.addr() as u64;
        w[1] = attrs.scalar_bits();
        w[2] = stream as u64 | (n_inputs as u64) << 32 | (n as u64) << 40 | (attrs.flag_bits() as u64) << 48;
        w[3] = attrs.params_id() as u64;
        for (word, p) in w[4..].iter_mut().zip(ids.chunks_exact(2)) {
            *word = pair(p[0], p[1]);
        }
        Packed(w)
    }

    /// The key of a signature whose operands have the meta ids `ids` (inputs first);
    /// `None` if it has more than `N` operands.
    #[inline]
    pub(crate) fn of(
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: impl IntoIterator<Item = MetaId>,
    ) -> Option<Self> {
        let mut packed = [MetaId(0); N];
        let mut n = 0;
        for id in ids {
            *packed.get_mut(n)? = id;
            n += 1;
        }
        Some(Self::new(kernel, stream, attrs, n_inputs, n, &packed))
    }
}

impl Key {
    /// The set this key lives in: FxHash's step (rotate, xor, multiply) over the words, and
    /// the top bits of the product, which depend on every bit of every word.
    #[inline(always)]
    fn set(&self) -> usize {
        const K: u64 = 0x517c_c1b7_2722_0a95;
        let h = self.0.iter().fold(0u64, |h, &w| (h.rotate_left(5) ^ w).wrapping_mul(K));
        (h >> (64 - SETS.trailing_zeros())) as usize
    }
}

/// Two meta ids in one word of a key.
#[inline(always)]
fn pair(a: MetaId, b: MetaId) -> u64 {
    a.0 as u64 | (b.0 as u64) << 32
}

/// One checked signature and its inferred outputs.
struct Entry {
    kernel: usize,
    stream: u32,
    /// The attributes' bits: `scalar`'s, [`Attrs::flag_bits`] and [`Attrs::params_id`].
    attrs: (u64, u16, u32),
    n_inputs: u8,
    /// Inputs' meta ids, then the given outputs' meta ids.
    ids: SmallVec<[MetaId; 4]>,
    specs: OutSpecs,
    /// The meta ids of outputs made from `specs` on the stream's device.
    out_ids: SmallVec<[MetaId; 2]>,
}

impl Entry {
    fn matches(
        &self,
        kernel: usize,
        stream: u32,
        attrs: (u64, u16, u32),
        n_inputs: usize,
        ids: impl Iterator<Item = MetaId>,
    ) -> bool {
        self.kernel == kernel
            && self.stream == stream
            && self.attrs == attrs
            && self.n_inputs as usize == n_inputs
            && self.ids.iter().copied().eq(ids)
    }
}

/// The cache (one per builder; recycled between builders of a VM). Entry `i < SETS * WAYS`
/// is way `i % WAYS` of set `i / WAYS` of the table; entry `SETS * WAYS + j` is the `j`th
/// wide one.
pub(crate) struct InferCache {
    /// `keys[i]`: the key of table entry `i`, zero if it has none.
    keys: Box<[Key; SETS * WAYS]>,
    /// The table's entries (empty until the first insert) and then the wide ones.
    entries: Vec<Option<Entry>>,
    /// Per set, the way its next insert replaces.
    next: [u8; SETS],
    /// The wide entry the next wide insert replaces.
    next_wide: usize,
    /// The entry the last lookup by key found.
    last: usize,
    /// `wide_keys[j]`: the key of wide entry `j`, zero if it has none or its signature has
    /// more than [`WIDE_OPS`] operands.
    wide_keys: Box<[WideKey; WIDE]>,
    /// The wide entry the last lookup by wide key found.
    last_wide: usize,
    /// Signatures inserted so far (each one a call that took the full check).
    inserted: u64,
}

impl Default for InferCache {
    fn default() -> Self {
        InferCache {
            keys: Box::new([Key::default(); SETS * WAYS]),
            entries: Vec::new(),
            next: [0; SETS],
            next_wide: 0,
            last: 0,
            wide_keys: Box::new([WideKey::default(); WIDE]),
            last_wide: 0,
            inserted: 0,
        }
    }
}

impl InferCache {
    /// The entry cached for the signature packed in `key`, if any.
    #[inline(always)]
    pub(crate) fn find(&mut self, key: &Key) -> Option<usize> {
        if self.keys[self.last] == *key {
            return Some(self.last);
        }
        let first = key.set() * WAYS;
        let way = self.keys[first..first + WAYS].iter().position(|k| k == key)?;
        self.last = first + way;
        Some(self.last)
    }

    /// The entry cached for the wide signature packed in `key`, if any.
    #[inline(always)]
    pub(crate) fn find_wide(&mut self, key: &WideKey) -> Option<usize> {
        if self.wide_keys[self.last_wide] != *key {
            self.last_wide = self.wide_keys.iter().position(|k| k == key)?;
        }
        Some(SETS * WAYS + self.last_wide)
    }

    /// The entry cached for this signature, if any. `ids` are the inputs' meta ids, then
    /// the given outputs' meta ids. (Signatures of at most [`KEY_OPS`] and of at most
    /// [`WIDE_OPS`] operands are found faster with [`find`](Self::find) and
    /// [`find_wide`](Self::find_wide).)
    #[inline]
    pub(crate) fn get(
        &self,
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: impl Iterator<Item = MetaId> + Clone,
    ) -> Option<usize> {
        if let Some(key) = Key::of(kernel, stream, attrs, n_inputs, ids.clone()) {
            let first = key.set() * WAYS;
            return self.keys[first..first + WAYS].iter().position(|k| *k == key).map(|w| first + w);
        }
        if let Some(key) = WideKey::of(kernel, stream, attrs, n_inputs, ids.clone()) {
            return self.wide_keys.iter().position(|k| *k == key).map(|j| SETS * WAYS + j);
        }
        let (k, bits) = (kernel.addr(), (attrs.scalar_bits(), attrs.flag_bits(), attrs.params_id()));
        let wide = self.entries.get(SETS * WAYS..)?;
        let j = wide
            .iter()
            .position(|e| e.as_ref().is_some_and(|e| e.matches(k, stream, bits, n_inputs, ids.clone())))?;
        Some(SETS * WAYS + j)
    }

    /// The output specs and output meta ids of entry `i`.
    #[inline]
    pub(crate) fn outputs(&self, i: usize) -> (&OutSpecs, &[MetaId]) {
        let e = self.entries[i].as_ref().expect("an entry found by a lookup");
        (&e.specs, &e.out_ids)
    }

    /// Signatures inserted so far: calls that took the full check and were cached.
    #[cfg(test)]
    pub(crate) fn inserted(&self) -> u64 {
        self.inserted
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
        let key = Key::of(kernel, stream, attrs, n_inputs as usize, ids.iter().copied());
        let e = Entry {
            kernel: kernel.addr(),
            stream,
            attrs: (attrs.scalar_bits(), attrs.flag_bits(), attrs.params_id()),
            n_inputs,
            ids,
            specs,
            out_ids,
        };
        if self.entries.is_empty() {
            self.entries.resize_with(SETS * WAYS, || None);
        }
        let i = match key {
            Some(key) => {
                let set = key.set();
                let way = self.next[set] as usize;
                self.next[set] = ((way + 1) % WAYS) as u8;
                let i = set * WAYS + way;
                self.keys[i] = key;
                i
            }
            None => {
                let j = self.next_wide;
                let i = SETS * WAYS + j;
                self.next_wide = (j + 1) % WIDE;
                self.wide_keys[j] =
                    WideKey::of(kernel, stream, attrs, n_inputs as usize, e.ids.iter().copied())
                        .unwrap_or_default();
                if i == self.entries.len() {
                    self.entries.push(None);
                }
                i
            }
        };
        self.entries[i] = Some(e);
        self.inserted += 1;
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
        // Filling past capacity evicts and never grows.
        for k in 0..3 * (SETS * WAYS) as u32 {
            c.insert(add, 0, &at, 1, SmallVec::from_iter([MetaId(10 + k)]), OutSpecs::new(), none.clone());
        }
        assert_eq!(c.entries.len(), SETS * WAYS);
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
        // Wide signatures live apart, with no key.
        let wide: Vec<MetaId> = (0..5).map(MetaId).collect();
        let keys = c.keys.clone();
        for _ in 0..WIDE {
            c.insert(mul, 9, &Attrs::default(), 1, SmallVec::from_slice(&wide), OutSpecs::new(), none());
        }
        assert!(c.get(mul, 9, &Attrs::default(), 1, wide.iter().copied()).is_some());
        assert!(c.keys[..] == keys[..], "wide signatures have no key");
        assert_eq!(c.entries.len(), SETS * WAYS + WIDE);
        // Eviction replaces the key with the entry: fill every way of one key's set.
        let (k0, s0, at0, n0, ids0) = &sigs[0];
        let k = key(*k0, *s0, at0, *n0, ids0);
        let mut m = 100;
        let mut evicting = 0;
        while evicting < WAYS {
            let other = [MetaId(m)];
            if key(add, 3, &Attrs::default(), 1, &other).set() == k.set() {
                c.insert(add, 3, &Attrs::default(), 1, SmallVec::from_slice(&other), OutSpecs::new(), none());
                evicting += 1;
            }
            m += 1;
        }
        assert_eq!(c.find(&k), None, "evicted");
    }

    /// Wide signatures (more than `KEY_OPS` operands): `find_wide` answers as `get` does,
    /// tells apart every part of a signature, follows the round-robin eviction, and a
    /// signature too wide for a wide key is still found by `get`, operand by operand.
    #[test]
    fn wide_keys_find_what_get_finds() {
        let reg = OpRegistry::with_builtins();
        let add = reg.get("add").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let mul = reg.get("mul").unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap();
        let none = SmallVec::new;
        let ids = |n: u32, base: u32| (0..n).map(|k| MetaId(base + k)).collect::<SmallVec<[MetaId; 4]>>();
        let wide_key = |k, stream, attrs: &Attrs, n_in, ids: &[MetaId]| {
            let mut packed = [MetaId(0); WIDE_OPS];
            packed[..ids.len()].copy_from_slice(ids);
            WideKey::new(k, stream, attrs, n_in, ids.len(), &packed)
        };
        let mut c = InferCache::default();
        let at = Attrs::default();
        let nine = ids(9, 1);
        let i = c.insert(add, 0, &at, 8, nine.clone(), OutSpecs::new(), none()).unwrap();
        assert_eq!(c.find_wide(&wide_key(add, 0, &at, 8, &nine)), Some(i));
        assert_eq!(c.get(add, 0, &at, 8, nine.iter().copied()), Some(i));
        let mut other = nine.clone();
        other[8] = MetaId(99);
        let misses = [
            wide_key(mul, 0, &at, 8, &nine),
            wide_key(add, 1, &at, 8, &nine),
            wide_key(add, 0, &Attrs::scalar(2.0), 8, &nine),
            wide_key(add, 0, &at, 7, &nine),
            wide_key(add, 0, &at, 8, &nine[..8]),
            wide_key(add, 0, &at, 8, &other),
        ];
        for (k, miss) in misses.iter().enumerate() {
            assert_eq!(c.find_wide(miss), None, "signature {k} differs in one part");
        }
        // The hint follows the last hit; a second signature is found beside the first.
        let ten = ids(10, 50);
        let j = c.insert(add, 0, &at, 9, ten.clone(), OutSpecs::new(), none()).unwrap();
        assert_ne!(i, j);
        for _ in 0..2 {
            assert_eq!(c.find_wide(&wide_key(add, 0, &at, 9, &ten)), Some(j));
            assert_eq!(c.find_wide(&wide_key(add, 0, &at, 8, &nine)), Some(i));
        }
        // More operands than a wide key holds: cached, found by `get` only.
        let many = ids(WIDE_OPS as u32 + 1, 200);
        let m = c.insert(add, 0, &at, WIDE_OPS, many.clone(), OutSpecs::new(), none()).unwrap();
        assert_eq!(c.get(add, 0, &at, WIDE_OPS, many.iter().copied()), Some(m));
        // `WIDE` more wide signatures evict the first ones.
        for k in 0..WIDE as u32 {
            c.insert(mul, 0, &at, 8, ids(9, 1000 + 10 * k), OutSpecs::new(), none());
        }
        assert_eq!(c.find_wide(&wide_key(add, 0, &at, 8, &nine)), None, "evicted");
        assert_eq!(c.get(add, 0, &at, WIDE_OPS, many.iter().copied()), None, "evicted");
        assert_eq!(c.find_wide(&wide_key(mul, 0, &at, 8, &ids(9, 1000))), Some(SETS * WAYS + 3));
        assert_eq!(c.entries.len(), SETS * WAYS + WIDE);
    }

    /// The MLP step's pattern: a loop over 24 distinct signatures. After the first pass,
    /// every call finds its signature (a cache of 8 entries replaced round-robin, as this
    /// one was, missed every one of them).
    #[test]
    fn a_loop_of_24_signatures_stays_cached() {
        let reg = OpRegistry::with_builtins();
        let ops: Vec<KernelRef> = ["add", "sub", "mul", "matmul", "relu", "scale"]
            .iter()
            .map(|o| reg.get(o).unwrap().kernel_ref(crate::ep::DeviceType::Cpu).unwrap())
            .collect();
        let sigs: Vec<Key> = (0..24u32)
            .map(|i| {
                let k = ops[i as usize % ops.len()];
                let ids = [MetaId(i / 6 + 1), MetaId(i % 5 + 1), MetaId(0), MetaId(0)];
                Key::new(k, 0, &Attrs::scalar(f64::from(i % 2)), 2, 2, &ids)
            })
            .collect();
        let mut c = InferCache::default();
        let mut misses = 0;
        for _round in 0..10 {
            for k in &sigs {
                if c.find(k).is_none() {
                    misses += 1;
                    let ids: SmallVec<[MetaId; 4]> =
                        SmallVec::from_slice(&[MetaId((k.0[4]) as u32), MetaId((k.0[4] >> 32) as u32)]);
                    let kernel = ops.iter().copied().find(|o| o.addr() as u64 == k.0[0]).unwrap();
                    let at = Attrs::scalar(f64::from_bits(k.0[1]));
                    c.insert(kernel, 0, &at, 2, ids, OutSpecs::new(), SmallVec::new()).unwrap();
                }
            }
        }
        assert_eq!(misses, 24, "only the first pass misses");
        assert_eq!(c.inserted(), 24);
    }
}
