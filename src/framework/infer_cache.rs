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
//! Metas are compared by the number the VM gives each distinct meta (`VmShared::intern`),
//! so a signature is a handful of words and a lookup compares words, not shapes. The cache
//! holds a few entries, looked up by linear scan (kernel first) and replaced round-robin.
//! What it never caches: anything about the tensors' identity or state (released,
//! aliased). The builder checks those on every call.

use smallvec::SmallVec;

use crate::framework::tensor::MetaId;
use crate::framework::{Attrs, KernelRef, OutSpecs};

/// Entries kept. A loop body rarely uses more distinct signatures than this at a time; a
/// miss costs one full check, as without the cache.
const ENTRIES: usize = 8;

/// One checked signature and its inferred outputs.
struct Entry {
    kernel: usize,
    stream: u32,
    attrs: u64,
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
    next: usize,
}

impl InferCache {
    /// The entry cached for this signature, if any. `ids` are the inputs' meta ids, then
    /// the given outputs' meta ids.
    #[inline]
    pub(crate) fn get(
        &self,
        kernel: KernelRef,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        ids: impl Iterator<Item = MetaId> + Clone,
    ) -> Option<usize> {
        let (k, bits) = (kernel.addr(), attrs.scalar.to_bits());
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
        let e = Entry {
            kernel: kernel.addr(),
            stream,
            attrs: attrs.scalar.to_bits(),
            n_inputs,
            ids,
            specs,
            out_ids,
        };
        if self.entries.len() < ENTRIES {
            self.entries.push(e);
            return Some(self.entries.len() - 1);
        }
        let i = self.next;
        self.next = (self.next + 1) % ENTRIES;
        self.entries[i] = e;
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
}
