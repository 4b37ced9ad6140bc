//! Layouts: how views lie in their storage, whether two of them overlap, and the shapes
//! broadcasting gives.
//!
//! The overlap rules are PyTorch's (`ATen/MemoryOverlap.cpp`): an output may be exactly an
//! input (the same elements, an in-place op), but not overlap one otherwise, nor name one
//! of its own elements twice; where telling would take more than a comparison of the two
//! layouts' extents, the call is let through, as PyTorch lets it through.

use smallvec::SmallVec;

use crate::vm::tensor::{contiguous_strides, Strides};
use crate::vm::TensorMeta;

/// How two views of one storage share its elements.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overlap {
    /// No element in common.
    None,
    /// The same elements in the same order: the same shape, strides and offset.
    Same,
    /// Some elements in common, not all in the same places.
    Partial,
    /// Not told from the layouts' extents alone (interleaved strides): let through.
    Unknown,
}

/// Whether the layout covers its extent exactly, each element once: row-major up to a
/// permutation of its dimensions (PyTorch's `is_non_overlapping_and_dense`).
pub(crate) fn is_dense(m: &TensorMeta) -> bool {
    if m.numel() <= 1 {
        return true;
    }
    let mut dims: smallvec::SmallVec<[(usize, isize); 4]> =
        m.shape.iter().copied().zip(m.strides.iter().copied()).filter(|&(d, _)| d != 1).collect();
    dims.sort_by_key(|&(_, s)| s.unsigned_abs());
    let mut expected = 1usize;
    for (d, s) in dims {
        if s.unsigned_abs() != expected {
            return false;
        }
        expected = expected.saturating_mul(d);
    }
    true
}

/// Whether the layout names some element of its storage more than once, as far as PyTorch
/// tells (a stride of 0 on a dimension of more than one element: an `expand`ed tensor).
pub(crate) fn has_internal_overlap(m: &TensorMeta) -> bool {
    // A layout of no elements names none twice, broadcast or not.
    !m.shape.contains(&0) && m.shape.iter().zip(&m.strides).any(|(&d, &s)| d > 1 && s == 0)
}

/// How views `a` and `b` of one storage share its elements.
pub(crate) fn overlap(a: &TensorMeta, b: &TensorMeta) -> Overlap {
    let (Some(ra), Some(rb)) = (a.span(), b.span()) else { return Overlap::None };
    if a.offset == b.offset && a.shape == b.shape && a.strides == b.strides {
        return Overlap::Same;
    }
    if ra.end <= rb.start || rb.end <= ra.start {
        return Overlap::None;
    }
    if is_dense(a) && is_dense(b) {
        Overlap::Partial
    } else {
        Overlap::Unknown
    }
}

/// The strides of the output of a pointwise op over `inputs`, of broadcast shape `shape`,
/// laid out like its inputs: PyTorch's rule (`TensorIterator::reorder_dimensions`). The
/// dimensions are ordered from the fastest, comparing two of them by the first input
/// whose strides along both are not 0 (a broadcast dimension says nothing): the smaller
/// stride (its magnitude: a reversed view counts like its forward one) goes first; equal
/// strides put the smaller size first. The output is then dense in that order. `None`
/// where that order is row-major (every input contiguous, the common case), so that the
/// output's strides are the contiguous ones.
pub(crate) fn pointwise_strides(shape: &[usize], inputs: &[&TensorMeta]) -> Option<Strides> {
    let n = shape.len();
    if n < 2 || inputs.iter().all(|m| m.is_contiguous()) || shape.contains(&0) {
        return None;
    }
    // Each input's strides along the output's dimensions: 0 where it is broadcast (a
    // missing leading dimension, or a size of 1 where the output's is larger).
    let stride = |m: &TensorMeta, d: usize| -> usize {
        let lead = n - m.shape.len();
        if d < lead || m.shape[d - lead] != shape[d] {
            0
        } else {
            m.strides[d - lead].unsigned_abs()
        }
    };
    // Whether `d0` (now the faster of the two) and `d1` must swap: 1 yes, -1 no, 0 no
    // input tells.
    let order = |d0: usize, d1: usize| -> i32 {
        for m in inputs {
            let (s0, s1) = (stride(m, d0), stride(m, d1));
            if s0 == 0 || s1 == 0 {
                continue;
            }
            if s0 != s1 {
                return if s0 < s1 { -1 } else { 1 };
            }
            if shape[d0] > shape[d1] {
                return 1;
            }
        }
        0
    };
    // perm[0] is the fastest dimension; row-major to begin with.
    let mut perm: SmallVec<[usize; 4]> = (0..n).rev().collect();
    for i in 1..n {
        let mut d1 = i;
        for d0 in (0..i).rev() {
            match order(perm[d0], perm[d1]) {
                1 => {
                    perm.swap(d0, d1);
                    d1 = d0;
                }
                -1 => break,
                _ => {}
            }
        }
    }
    let mut strides: Strides = SmallVec::from_elem(0, n);
    let mut step = 1usize;
    for &d in &perm {
        strides[d] = step as isize;
        step = step.saturating_mul(shape[d].max(1));
    }
    (strides != contiguous_strides(shape)).then_some(strides)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::vm::DType;

    fn view(shape: &[usize], strides: &[isize], offset: usize) -> TensorMeta {
        TensorMeta::new(&[64], DType::F32, DeviceId::CPU).with_layout(shape, strides, offset)
    }

    #[test]
    fn overlaps_as_pytorch_tells_them() {
        let row = |i: usize| view(&[4], &[1], 4 * i);
        assert_eq!(overlap(&row(0), &row(0)), Overlap::Same);
        assert_eq!(overlap(&row(0), &row(1)), Overlap::None);
        // x[1:5] against x[0:4]: dense, shifted by one.
        assert_eq!(overlap(&view(&[4], &[1], 1), &row(0)), Overlap::Partial);
        // A square matrix and its transpose: the same extent, other places.
        assert_eq!(overlap(&view(&[4, 4], &[4, 1], 0), &view(&[4, 4], &[1, 4], 0)), Overlap::Partial);
        // Even and odd columns: interleaved, not told from the extents.
        assert_eq!(overlap(&view(&[4, 2], &[4, 2], 0), &view(&[4, 2], &[4, 2], 1)), Overlap::Unknown);
        // Empty views touch nothing.
        assert_eq!(overlap(&view(&[0], &[1], 0), &row(0)), Overlap::None);
    }

    /// The output strides PyTorch 2.x gives for the same inputs (`torch.exp(x).stride()`,
    /// `(a + b).stride()`), as checked by hand against it.
    #[test]
    fn pointwise_outputs_are_laid_out_like_torch_lays_them_out() {
        let out = |shape: &[usize], ins: &[TensorMeta]| {
            let refs: Vec<&TensorMeta> = ins.iter().collect();
            pointwise_strides(shape, &refs).map(|s| s.to_vec())
        };
        // Row-major inputs, stepped, reversed, 0-d, 1-d, empty: row-major (`None`).
        assert_eq!(out(&[4, 3], &[view(&[4, 3], &[3, 1], 0)]), None);
        assert_eq!(out(&[4, 3], &[view(&[4, 3], &[12, 2], 0)]), None);
        assert_eq!(out(&[4, 3], &[view(&[4, 3], &[-3, 1], 9)]), None);
        assert_eq!(out(&[], &[view(&[], &[], 0)]), None);
        assert_eq!(out(&[5], &[view(&[5], &[-2], 9)]), None);
        assert_eq!(out(&[0, 3], &[view(&[0, 3], &[1, 0], 0)]), None);
        // x.t() of [3, 4]: strides (1, 4), as PyTorch's output.
        assert_eq!(out(&[4, 3], &[view(&[4, 3], &[1, 4], 0)]), Some(vec![1, 4]));
        // x.permute(2, 0, 1) of [2, 3, 4]: (1, 12, 4).
        assert_eq!(out(&[4, 2, 3], &[view(&[4, 2, 3], &[1, 12, 4], 0)]), Some(vec![1, 12, 4]));
        // The first input whose strides tell decides: a.t() + b is laid out like a.t(),
        // b + a.t() like b.
        let (t, c) = (view(&[4, 3], &[1, 4], 0), view(&[4, 3], &[3, 1], 0));
        assert_eq!(out(&[4, 3], &[t.clone(), c.clone()]), Some(vec![1, 4]));
        assert_eq!(out(&[4, 3], &[c, t.clone()]), None);
        // A broadcast input says nothing along its broadcast dimension: a.t() + v, v of [3].
        assert_eq!(out(&[4, 3], &[view(&[3], &[1], 0), t]), Some(vec![1, 4]));
        // A transposed [B, T, H] (channels first in memory): [H, B, T] order kept.
        assert_eq!(out(&[2, 5, 3], &[view(&[2, 5, 3], &[5, 1, 10], 0)]), Some(vec![5, 1, 10]));
        // Size-1 dimensions carry no order: x.t() of [1, 4] counts as row-major.
        assert_eq!(out(&[4, 1], &[view(&[4, 1], &[1, 4], 0)]), None);
    }

    #[test]
    fn density_and_internal_overlap() {
        assert!(is_dense(&view(&[4, 4], &[1, 4], 0)));
        assert!(is_dense(&view(&[2, 1, 3], &[3, 99, 1], 5)));
        assert!(!is_dense(&view(&[4, 2], &[4, 2], 0)));
        assert!(has_internal_overlap(&view(&[4, 3], &[0, 1], 0)));
        assert!(!has_internal_overlap(&view(&[1, 3], &[0, 1], 0)));
    }
}
