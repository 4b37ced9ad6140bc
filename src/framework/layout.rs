//! Layouts: how views lie in their storage, whether two of them overlap, and the shapes
//! broadcasting gives.
//!
//! The overlap rules are PyTorch's (`ATen/MemoryOverlap.cpp`): an output may be exactly an
//! input (the same elements, an in-place op), but not overlap one otherwise, nor name one
//! of its own elements twice; where telling would take more than a comparison of the two
//! layouts' extents, the call is let through, as PyTorch lets it through.

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

    #[test]
    fn density_and_internal_overlap() {
        assert!(is_dense(&view(&[4, 4], &[1, 4], 0)));
        assert!(is_dense(&view(&[2, 1, 3], &[3, 99, 1], 5)));
        assert!(!is_dense(&view(&[4, 2], &[4, 2], 0)));
        assert!(has_internal_overlap(&view(&[4, 3], &[0, 1], 0)));
        assert!(!has_internal_overlap(&view(&[1, 3], &[0, 1], 0)));
    }
}
