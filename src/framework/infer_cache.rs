//! A small cache of shape-inference results, so that a call the builder has already
//! checked once is not inferred again.
//!
//! An eager program calls the same few ops on tensors of the same few shapes over and over
//! (every step of a training loop repeats the previous one). A kernel's `infer` is a pure
//! function of the kernel, the attributes and the operands' metas (shape, dtype, device),
//! so its answer for one such signature holds for every later call with the same
//! signature. OneFlow keeps a similar cache per op expression.
//!
//! The cache holds a few entries, looked up by linear scan (kernel and counts first, metas
//! last) and replaced round-robin. What it never caches: anything about the tensors'
//! identity or state (released, aliased, on which device relative to the stream). The
//! builder checks those on every call.

use smallvec::SmallVec;

use crate::framework::{Attrs, OpKernel, OutSpecs, TensorMeta};

/// Entries kept. A loop body rarely uses more distinct signatures than this at a time; a
/// miss costs one `infer` call, as without the cache.
const ENTRIES: usize = 8;

/// One checked signature and its inferred outputs.
struct Entry {
    /// Data and vtable address: built-in kernels are zero-sized, so two kernels can share
    /// a data address and differ only in their vtable. (A duplicated vtable can only cause
    /// a miss, never a false hit.)
    kernel: *const dyn OpKernel,
    stream: u32,
    attrs: u64,
    n_inputs: u8,
    /// Inputs' metas, then the given outputs' metas.
    metas: SmallVec<[TensorMeta; 4]>,
    specs: OutSpecs,
}

/// The cache (one per builder; recycled between builders of a VM).
#[derive(Default)]
pub(crate) struct InferCache {
    entries: Vec<Entry>,
    next: usize,
}

// SAFETY: the raw kernel pointer is only compared, never dereferenced; everything else is
// owned data.
unsafe impl Send for InferCache {}

fn kernel_key(kernel: &'static dyn OpKernel) -> *const dyn OpKernel {
    kernel as *const dyn OpKernel
}

impl InferCache {
    /// The specs cached for this signature, if any.
    /// `metas` are the inputs' metas, then the given outputs' metas: `n` in all, the first
    /// `n_inputs` of them inputs.
    #[inline]
    pub(crate) fn get<'m>(
        &self,
        kernel: &'static dyn OpKernel,
        stream: u32,
        attrs: &Attrs,
        n_inputs: usize,
        n: usize,
        metas: impl Iterator<Item = &'m TensorMeta> + Clone,
    ) -> Option<usize> {
        let (k, bits) = (kernel_key(kernel), attrs.scalar.to_bits());
        self.entries.iter().position(|e| {
            std::ptr::eq(e.kernel, k)
                && e.stream == stream
                && e.attrs == bits
                && e.n_inputs as usize == n_inputs
                && e.metas.len() == n
                && e.metas.iter().zip(metas.clone()).all(|(a, b)| a == b)
        })
    }

    /// The specs of entry `i` (from [`get`](Self::get) or [`insert`](Self::insert)).
    #[inline]
    pub(crate) fn specs(&self, i: usize) -> &OutSpecs {
        &self.entries[i].specs
    }

    /// Remember a checked signature; returns its entry. Calls with more than 255 inputs
    /// are not cached (`None`).
    pub(crate) fn insert(
        &mut self,
        kernel: &'static dyn OpKernel,
        stream: u32,
        attrs: &Attrs,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        specs: OutSpecs,
    ) -> Option<usize> {
        let n_inputs = u8::try_from(inputs.len()).ok()?;
        let e = Entry {
            kernel: kernel_key(kernel),
            stream,
            attrs: attrs.scalar.to_bits(),
            n_inputs,
            metas: inputs.iter().chain(given).map(|m| (*m).clone()).collect(),
            specs,
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
    use crate::ep::DeviceId;
    use crate::framework::{DType, OpRegistry};

    #[test]
    fn hits_only_the_same_signature() {
        let reg = OpRegistry::with_builtins();
        let add = reg.get("add").unwrap().kernel(crate::ep::DeviceType::Cpu).unwrap();
        let mul = reg.get("mul").unwrap().kernel(crate::ep::DeviceType::Cpu).unwrap();
        let a = TensorMeta::new(&[2, 3], DType::F32, DeviceId::CPU);
        let b = TensorMeta::new(&[3, 2], DType::F32, DeviceId::CPU);
        let mut c = InferCache::default();
        let at = Attrs::default();
        assert_eq!(c.get(add, 0, &at, 2, 2, [&a, &a].into_iter().chain([])), None);
        let i = c.insert(add, 0, &at, &[&a, &a], &[], OutSpecs::new()).unwrap();
        assert_eq!(c.get(add, 0, &at, 2, 2, [&a, &a].into_iter().chain([])), Some(i));
        assert!(c.specs(i).is_empty());
        assert_eq!(c.get(mul, 0, &at, 2, 2, [&a, &a].into_iter().chain([])), None, "other kernel");
        assert_eq!(c.get(add, 1, &at, 2, 2, [&a, &a].into_iter().chain([])), None, "other stream");
        assert_eq!(
            c.get(add, 0, &Attrs::scalar(2.0), 2, 2, [&a, &a].into_iter().chain([])),
            None,
            "other attrs"
        );
        assert_eq!(c.get(add, 0, &at, 2, 2, [&a, &b].into_iter().chain([])), None, "other shape");
        assert_eq!(c.get(add, 0, &at, 1, 2, [&a].into_iter().chain([&a])), None, "input moved to outputs");
        // Filling past capacity evicts round-robin and never grows.
        for k in 0..3 * ENTRIES {
            let m = TensorMeta::new(&[k], DType::F32, DeviceId::CPU);
            c.insert(add, 0, &at, &[&m], &[], OutSpecs::new());
        }
        assert!(c.entries.len() <= ENTRIES);
        assert_eq!(c.get(add, 0, &at, 2, 2, [&a, &a].into_iter().chain([])), None);
    }
}
