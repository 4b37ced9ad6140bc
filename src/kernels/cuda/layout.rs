//! Operand layouts as the generated kernels take them: one index space (the output's
//! shape) and each operand's strides over it, simplified on the host first.
//!
//! An elementwise kernel walks the output's elements in row-major order of their index and
//! finds each operand's element from its strides (PyTorch's `TensorIterator` does the
//! same). Before the launch, [`Layout::plan`]
//!
//! 1. drops the dimensions of size 1 (their strides never matter);
//! 2. merges neighbouring dimensions `d` (outer) and `d + 1` wherever every operand has
//!    `stride[d] == stride[d + 1] * size[d + 1]` (the two are one run of equal steps in
//!    every operand), so a contiguous tensor is one dimension and a transposed matrix two;
//! 3. refuses more than [`MAX_DIMS`] dimensions that remain, naming the shape;
//! 4. marks the layout contiguous when every operand is one run of stride 1 (or the tensor
//!    is one element): the kernels then index all operands by the element number alone,
//!    a plain grid-stride loop with no divisions.
//!
//! Strides are in elements and may be 0 (a broadcast operand) or negative. Offsets are not
//! part of the layout: the launch passes each operand's address at its offset.

use cudarc::driver::DeviceRepr;

use crate::vm::TensorMeta;

/// The most dimensions a kernel takes after [`Layout::plan`] merged what it could.
pub const MAX_DIMS: usize = 8;
/// The most operands (the output first) a [`Layout`] describes.
pub const MAX_OPERANDS: usize = 3;

/// The index space and strides of one launch of an elementwise kernel of up to two inputs,
/// as the kernels' `struct Layout` (the generated source's prelude) lays it out: passed by
/// value, 272 bytes.
pub type Layout = Strides<MAX_OPERANDS>;

/// The index space and strides of one launch of a kernel of three inputs (`where`, `clamp`,
/// `lerp`, `addcmul`, `addcdiv`), as the kernels' `struct Layout4`: 336 bytes.
pub type Layout4 = Strides<4>;

/// The index space and the strides of `N` operands, output first ([`Layout`], [`Layout4`]).
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Strides<const N: usize> {
    /// Number of elements (the product of `size`).
    pub n: u64,
    /// Dimensions in use, at most [`MAX_DIMS`]; 0 for a single element.
    pub ndim: i32,
    /// 1 when every operand is one run of stride 1 (see the module docs), else 0.
    pub contiguous: i32,
    /// Dimension sizes, outermost first; unused entries 1.
    pub size: [i64; MAX_DIMS],
    /// Per operand (output first), its stride along each dimension; unused entries 0.
    pub stride: [[i64; MAX_DIMS]; N],
}

// SAFETY: `Strides<N>` is `repr(C)` plain integers, field for field the `struct Layout`
// (`N` = 3) or `struct Layout4` (`N` = 4) of the generated source (`source::PRELUDE`),
// which the kernels take by value.
unsafe impl<const N: usize> DeviceRepr for Strides<N> {}

impl<const N: usize> Strides<N> {
    /// The layout of `shape` with one stride list per operand (output first, each as long
    /// as `shape`), simplified as the module docs say; an error naming the shape when more
    /// than [`MAX_DIMS`] dimensions remain.
    pub fn plan(shape: &[usize], strides: &[&[isize]]) -> Result<Self, String> {
        let ops = strides.len();
        if ops == 0 || ops > N || strides.iter().any(|s| s.len() != shape.len()) {
            return Err(format!("a layout of shape {shape:?} needs 1 to {N} stride lists of its rank"));
        }
        let n = shape.iter().try_fold(1u64, |n, &d| n.checked_mul(d as u64));
        let n = n.ok_or_else(|| format!("shape {shape:?} has more elements than a u64 counts"))?;
        // (size, strides), outermost first, with the size-1 dimensions dropped.
        let mut dims: Vec<(i64, [i64; N])> = Vec::with_capacity(shape.len());
        for (d, &size) in shape.iter().enumerate() {
            if size == 1 {
                continue;
            }
            let mut st = [0i64; N];
            for (k, s) in strides.iter().enumerate() {
                st[k] = s[d] as i64;
            }
            let size = size as i64;
            match dims.last_mut() {
                Some((outer, os)) if (0..ops).all(|k| os[k] == st[k].wrapping_mul(size)) => {
                    *outer = outer.wrapping_mul(size);
                    *os = st;
                }
                _ => dims.push((size, st)),
            }
        }
        if dims.len() > MAX_DIMS {
            return Err(format!(
                "shape {shape:?} with strides {strides:?} keeps {} dimensions after merging the \
                 contiguous ones: CUDA kernels take at most {MAX_DIMS} (make the operands contiguous first)",
                dims.len()
            ));
        }
        let mut layout = Strides {
            n,
            ndim: dims.len() as i32,
            contiguous: 0,
            size: [1; MAX_DIMS],
            stride: [[0; MAX_DIMS]; N],
        };
        for (d, (size, st)) in dims.iter().enumerate() {
            layout.size[d] = *size;
            for (row, &s) in layout.stride.iter_mut().zip(st) {
                row[d] = s;
            }
        }
        let flat = match dims.as_slice() {
            [] => true,
            [(_, st)] => st[..ops].iter().all(|&s| s == 1),
            _ => false,
        };
        layout.contiguous = i32::from(flat);
        Ok(layout)
    }

    /// The storage offsets (elements, from each operand's own offset) of element `i` in
    /// row-major order: what the kernels' `offsets` computes, for host tests.
    pub fn offsets(&self, mut i: u64) -> [i64; N] {
        let mut o = [0i64; N];
        if self.contiguous != 0 {
            return [i as i64; N];
        }
        for d in (0..self.ndim as usize).rev() {
            let size = self.size[d] as u64;
            let r = (i % size) as i64;
            i /= size;
            for (k, o) in o.iter_mut().enumerate() {
                *o += r * self.stride[k][d];
            }
        }
        o
    }
}

/// The strides that read `m` at each index of `shape`, broadcasting as NumPy and PyTorch
/// do (dimensions aligned from the right; a dimension of size 1, or a missing leading one,
/// is read with stride 0); an error naming `what` when `m` does not broadcast to `shape`.
pub fn broadcast_strides(what: &str, m: &TensorMeta, shape: &[usize]) -> Result<Vec<isize>, String> {
    let (rank, own) = (shape.len(), m.shape.len());
    if own > rank {
        return Err(format!("{what} ({}) has more dimensions than the result {shape:?}", m.describe()));
    }
    let lead = rank - own;
    let mut strides = vec![0isize; rank];
    for d in 0..own {
        let (have, want) = (m.shape[d], shape[lead + d]);
        strides[lead + d] = if have == want {
            m.strides[d]
        } else if have == 1 {
            0
        } else {
            return Err(format!("{what} ({}) does not broadcast to {shape:?}", m.describe()));
        };
    }
    Ok(strides)
}

/// The shape two operands broadcast to (NumPy's rule), or an error naming both.
pub fn broadcast_shapes(a: &TensorMeta, b: &TensorMeta) -> Result<crate::vm::Shape, String> {
    let rank = a.shape.len().max(b.shape.len());
    let dim = |m: &TensorMeta, d: usize| {
        let lead = rank - m.shape.len();
        if d < lead {
            1
        } else {
            m.shape[d - lead]
        }
    };
    (0..rank)
        .map(|d| match (dim(a, d), dim(b, d)) {
            (x, y) if x == y => Ok(x),
            (1, y) => Ok(y),
            (x, 1) => Ok(x),
            _ => Err(format!(
                "input 0 is {} and input 1 is {}: the shapes do not broadcast",
                a.describe(),
                b.describe()
            )),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;
    use crate::vm::DType;

    fn meta(shape: &[usize], strides: &[isize], offset: usize) -> TensorMeta {
        TensorMeta::new(shape, DType::F32, DeviceId::CPU).with_layout(shape, strides, offset)
    }

    #[test]
    fn contiguous_operands_are_one_flat_run() {
        let l = Layout::plan(&[2, 3, 4], &[&[12, 4, 1], &[12, 4, 1]]).unwrap();
        assert_eq!((l.n, l.ndim, l.contiguous, l.size[0]), (24, 1, 1, 24));
        // One element, and no elements: nothing to index.
        let l = Layout::plan(&[], &[&[], &[]]).unwrap();
        assert_eq!((l.n, l.ndim, l.contiguous), (1, 0, 1));
        let l = Layout::plan(&[1, 1], &[&[7, 3]]).unwrap();
        assert_eq!((l.n, l.ndim, l.contiguous), (1, 0, 1));
        assert_eq!(Layout::plan(&[3, 0], &[&[0, 1]]).unwrap().n, 0);
    }

    #[test]
    fn transposed_and_broadcast_operands_keep_their_dimensions() {
        // out [2, 3] contiguous, a = the transpose of a [3, 2], b broadcast along rows.
        let l = Layout::plan(&[2, 3], &[&[3, 1], &[1, 2], &[0, 1]]).unwrap();
        assert_eq!((l.ndim, l.contiguous), (2, 0));
        assert_eq!(&l.size[..2], &[2, 3]);
        assert_eq!(l.offsets(4), [4, 1 + 2, 1]);
        // Size-1 dimensions vanish whatever their stride; contiguous runs merge across them.
        let l = Layout::plan(&[2, 1, 3], &[&[3, 99, 1], &[3, -5, 1]]).unwrap();
        assert_eq!((l.ndim, l.contiguous), (1, 1));
        // A step: one run of stride 2, not contiguous.
        let l = Layout::plan(&[4], &[&[1], &[2]]).unwrap();
        assert_eq!((l.ndim, l.contiguous, l.offsets(3)), (1, 0, [3, 6, 0]));
        // A negative stride.
        let l = Layout::plan(&[3], &[&[1], &[-1]]).unwrap();
        assert_eq!(l.offsets(2), [2, -2, 0]);
    }

    #[test]
    fn offsets_follow_the_strides_for_every_index() {
        let shape = [3, 4, 5];
        let out = [20, 5, 1];
        let a = [1, 3, 12]; // the reverse-order permutation of a [5, 4, 3]
        let b = [0, 5, 1]; // broadcast along dimension 0
        let l = Layout::plan(&shape, &[&out, &a, &b]).unwrap();
        let mut i = 0u64;
        for x in 0..3i64 {
            for y in 0..4i64 {
                for z in 0..5i64 {
                    let want = [x * 20 + y * 5 + z, x + 3 * y + 12 * z, 5 * y + z];
                    assert_eq!(l.offsets(i), want, "[{x}, {y}, {z}]");
                    i += 1;
                }
            }
        }
    }

    #[test]
    fn more_than_eight_dimensions_are_refused_by_shape() {
        // Nine dimensions of 2 whose strides cannot merge (every other one transposed).
        let shape = [2usize; 9];
        let strides: Vec<isize> = (0..9).map(|d| 1 << (2 * d)).collect();
        let contiguous: Vec<isize> = (0..9).rev().map(|d| 1 << d).collect();
        let e = Layout::plan(&shape, &[&contiguous, &strides]).unwrap_err();
        assert!(e.contains("[2, 2, 2, 2, 2, 2, 2, 2, 2]") && e.contains("at most 8"), "{e}");
        // Nine contiguous dimensions are one.
        assert_eq!(Layout::plan(&shape, &[&contiguous]).unwrap().ndim, 1);
    }

    #[test]
    fn broadcasting_follows_numpy() {
        let a = meta(&[3, 1], &[1, 1], 0);
        let b = meta(&[4], &[2], 1);
        assert_eq!(broadcast_shapes(&a, &b).unwrap().as_slice(), &[3, 4]);
        assert_eq!(broadcast_strides("input 0", &a, &[3, 4]).unwrap(), vec![1, 0]);
        assert_eq!(broadcast_strides("input 1", &b, &[3, 4]).unwrap(), vec![0, 2]);
        assert_eq!(broadcast_strides("input 1", &b, &[2, 3, 4]).unwrap(), vec![0, 0, 2]);
        let e = broadcast_strides("mask", &meta(&[3], &[1], 0), &[4]).unwrap_err();
        assert!(e.starts_with("mask (f32[3]) does not broadcast to [4]"), "{e}");
        assert!(broadcast_shapes(&meta(&[2], &[1], 0), &meta(&[3], &[1], 0)).is_err());
        let scalar = meta(&[], &[], 0);
        assert_eq!(broadcast_shapes(&scalar, &b).unwrap().as_slice(), &[4]);
    }
}
