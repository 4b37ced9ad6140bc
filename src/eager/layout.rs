//! The layouts views take, as PyTorch computes them: pure functions from a tensor's shape,
//! strides and offset (in elements of its storage) to a view's, or the reason there is none.
//!
//! Every function returns [`Error::InvalidOperands`] naming the op (`view`, `transpose`,
//! ...) and the shapes at fault; dimensions may be negative, counted from the end, as in
//! PyTorch (`-1` is the last). [`Array`](super::Array)'s view methods make a view of the
//! result (`framework::Tensor::view_layout`): no copy, no instruction.

use smallvec::SmallVec;

use crate::framework::{contiguous_strides, Shape, Strides};
use crate::vm::{Error, Result};

/// A layout: shape, strides and offset, in elements of the storage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Layout {
    pub(crate) shape: Shape,
    pub(crate) strides: Strides,
    pub(crate) offset: usize,
}

fn bad(op: &str, detail: String) -> Error {
    Error::InvalidOperands { op: op.into(), detail }
}

/// Dimension `d` (negative counts from the end) of a tensor of `rank` dimensions, where
/// `rank` may be 0 for ops that treat a 0-d tensor as one of one dimension (`wrap_scalar`).
pub(crate) fn dim(op: &str, d: isize, rank: usize) -> Result<usize> {
    let r = rank.max(1) as isize;
    let w = if d < 0 { d + r } else { d };
    if (0..r).contains(&w) {
        Ok(w as usize)
    } else {
        Err(bad(
            op,
            format!(
                "dimension {d} is out of range for a tensor of {rank} dimensions (expected -{r} to {})",
                r - 1
            ),
        ))
    }
}

/// A dimension of exactly `rank` dimensions (no leeway for 0-d tensors).
fn dim_exact(op: &str, d: isize, rank: usize) -> Result<usize> {
    if rank == 0 {
        return Err(bad(op, format!("dimension {d} of a 0-d tensor: it has no dimensions")));
    }
    dim(op, d, rank)
}

/// `shape` with its one `-1` (if any) worked out for `numel` elements, as `view`,
/// `reshape` and `unflatten` take it.
pub(crate) fn infer_size(op: &str, shape: &[isize], numel: usize) -> Result<Shape> {
    let mut known = 1usize;
    let mut infer = None;
    for (i, &d) in shape.iter().enumerate() {
        match d {
            -1 if infer.is_none() => infer = Some(i),
            -1 => return Err(bad(op, format!("only one dimension can be -1, in {shape:?}"))),
            d if d < 0 => return Err(bad(op, format!("invalid size {d} in {shape:?}"))),
            d => {
                known = known.checked_mul(d as usize).ok_or_else(|| {
                    bad(op, format!("the shape {shape:?} has more elements than fit in memory"))
                })?
            }
        }
    }
    let mut out: Shape = shape.iter().map(|&d| d.max(0) as usize).collect();
    match infer {
        Some(i) => {
            if known == 0 || numel % known != 0 {
                return Err(bad(op, format!("shape {shape:?} is invalid for an input of {numel} elements")));
            }
            out[i] = numel / known;
        }
        None if known != numel => {
            return Err(bad(op, format!("shape {shape:?} is invalid for an input of {numel} elements")))
        }
        None => {}
    }
    Ok(out)
}

/// The strides of a view of `shape` over a tensor of `old` shape and `strides`, if one
/// exists (PyTorch's `computeStride`): each run of old dimensions that is contiguous in
/// memory may be split or merged freely; a new dimension may not span two such runs.
pub(crate) fn view_strides(old: &[usize], strides: &[isize], shape: &[usize]) -> Option<Strides> {
    let numel: usize = old.iter().product();
    if numel == 0 {
        // Any shape of no elements: contiguous strides of it.
        return Some(contiguous_strides(shape));
    }
    if old.is_empty() {
        return Some(SmallVec::from_elem(1, shape.len()));
    }
    let mut out: Strides = SmallVec::from_elem(0, shape.len());
    // Walk the old dimensions from the last, one contiguous chunk at a time.
    let mut view_d = shape.len() as isize - 1;
    let mut chunk_base_stride = *strides.last().expect("non-empty");
    let mut tensor_numel = 1usize;
    let mut view_numel = 1usize;
    for tensor_d in (0..old.len()).rev() {
        tensor_numel *= old[tensor_d];
        // The end of a chunk: the first dimension, or one not contiguous with the next.
        if tensor_d == 0
            || (old[tensor_d - 1] != 1 && strides[tensor_d - 1] != tensor_numel as isize * chunk_base_stride)
        {
            while view_d >= 0 && (view_numel < tensor_numel || shape[view_d as usize] == 1) {
                out[view_d as usize] = view_numel as isize * chunk_base_stride;
                view_numel *= shape[view_d as usize];
                view_d -= 1;
            }
            if view_numel != tensor_numel {
                return None;
            }
            if tensor_d > 0 {
                chunk_base_stride = strides[tensor_d - 1];
                tensor_numel = 1;
                view_numel = 1;
            }
        }
    }
    (view_d == -1).then_some(out)
}

/// `view(shape)`: the same elements in another shape, without a copy; refused where the
/// strides do not allow it (`reshape` copies then).
pub(crate) fn view(l: &Layout, shape: &[isize]) -> Result<Layout> {
    let numel: usize = l.shape.iter().product();
    let shape = infer_size("view", shape, numel)?;
    let strides = view_strides(&l.shape, &l.strides, &shape).ok_or_else(|| {
        bad(
            "view",
            format!(
                "shape {:?} is not compatible with the input's shape {:?} and strides {:?} (a dimension would span two \
                 runs of contiguous elements); use reshape(), which copies",
                &shape[..],
                &l.shape[..],
                &l.strides[..]
            ),
        )
    })?;
    Ok(Layout { shape, strides, offset: l.offset })
}

/// `transpose(d0, d1)`: two dimensions swapped.
pub(crate) fn transpose(l: &Layout, d0: isize, d1: isize) -> Result<Layout> {
    let n = l.shape.len();
    if n == 0 {
        // PyTorch allows transpose(0, 0), (0, -1), ... of a 0-d tensor: itself.
        dim("transpose", d0, 0)?;
        dim("transpose", d1, 0)?;
        return Ok(l.clone());
    }
    let (a, b) = (dim("transpose", d0, n)?, dim("transpose", d1, n)?);
    let mut out = l.clone();
    out.shape.swap(a, b);
    out.strides.swap(a, b);
    Ok(out)
}

/// `permute(dims)`: dimension `i` of the result is dimension `dims[i]` of the input.
pub(crate) fn permute(l: &Layout, dims: &[isize]) -> Result<Layout> {
    let n = l.shape.len();
    if dims.len() != n {
        return Err(bad(
            "permute",
            format!("{} dimensions given for a tensor of {n} dimensions ({dims:?})", dims.len()),
        ));
    }
    let mut seen = SmallVec::<[bool; 8]>::from_elem(false, n);
    let mut out = Layout { shape: Shape::new(), strides: Strides::new(), offset: l.offset };
    for &d in dims {
        let d = dim("permute", d, n)?;
        if std::mem::replace(&mut seen[d], true) {
            return Err(bad("permute", format!("dimension {d} repeats in {dims:?}")));
        }
        out.shape.push(l.shape[d]);
        out.strides.push(l.strides[d]);
    }
    Ok(out)
}

/// `expand(sizes)`: size-1 dimensions repeated to `sizes` (stride 0), new leading
/// dimensions added; `-1` keeps a size.
pub(crate) fn expand(l: &Layout, sizes: &[isize]) -> Result<Layout> {
    let n = l.shape.len();
    if sizes.len() < n {
        return Err(bad(
            "expand",
            format!(
                "the number of sizes ({}) must be at least the tensor's dimensions ({n}): {sizes:?} for {:?}",
                sizes.len(),
                &l.shape[..]
            ),
        ));
    }
    let lead = sizes.len() - n;
    let mut out = Layout { shape: Shape::new(), strides: Strides::new(), offset: l.offset };
    for (i, &s) in sizes.iter().enumerate() {
        if i < lead {
            if s < 0 {
                return Err(bad(
                    "expand",
                    format!("size {s} of new leading dimension {i} must be non-negative ({sizes:?})"),
                ));
            }
            out.shape.push(s as usize);
            out.strides.push(0);
            continue;
        }
        let (d, st) = (l.shape[i - lead], l.strides[i - lead]);
        match s {
            -1 => {
                out.shape.push(d);
                out.strides.push(st);
            }
            s if s >= 0 && s as usize == d => {
                out.shape.push(d);
                out.strides.push(st);
            }
            s if s >= 0 && d == 1 => {
                out.shape.push(s as usize);
                out.strides.push(0);
            }
            _ => {
                return Err(bad(
                    "expand",
                    format!(
                    "the size of dimension {} ({d}) must match {s}, or be 1: {:?} cannot expand to {sizes:?}",
                    i - lead,
                    &l.shape[..]
                ),
                ))
            }
        }
    }
    Ok(out)
}

/// The shape NumPy's and PyTorch's broadcasting gives `a` and `b`, or why there is none.
pub(crate) fn broadcast_shapes(op: &str, a: &[usize], b: &[usize]) -> Result<Shape> {
    let n = a.len().max(b.len());
    let mut out: Shape = SmallVec::from_elem(0, n);
    for i in 0..n {
        let x = if i + a.len() >= n { a[i + a.len() - n] } else { 1 };
        let y = if i + b.len() >= n { b[i + b.len() - n] } else { 1 };
        out[i] = match (x, y) {
            (x, y) if x == y => x,
            (1, y) => y,
            (x, 1) => x,
            _ => {
                return Err(bad(
                    op,
                    format!("shapes {a:?} and {b:?} do not broadcast (dimension {i}: {x} against {y})"),
                ))
            }
        };
    }
    Ok(out)
}

/// `squeeze(dims)`: the given dimensions dropped where their size is 1 (every size-1
/// dimension for `None`).
pub(crate) fn squeeze(l: &Layout, dims: Option<&[isize]>) -> Result<Layout> {
    let n = l.shape.len();
    let mut drop = SmallVec::<[bool; 8]>::from_elem(false, n);
    match dims {
        None => drop.iter_mut().zip(&l.shape).for_each(|(x, &d)| *x = d == 1),
        Some(ds) => {
            for &d in ds {
                if n == 0 {
                    dim("squeeze", d, 0)?;
                    continue;
                }
                let d = dim("squeeze", d, n)?;
                drop[d] = l.shape[d] == 1;
            }
        }
    }
    let mut out = Layout { shape: Shape::new(), strides: Strides::new(), offset: l.offset };
    for i in 0..n {
        if !drop[i] {
            out.shape.push(l.shape[i]);
            out.strides.push(l.strides[i]);
        }
    }
    Ok(out)
}

/// `unsqueeze(d)`: a dimension of size 1 inserted at `d` (`-1`: after the last).
pub(crate) fn unsqueeze(l: &Layout, d: isize) -> Result<Layout> {
    let n = l.shape.len();
    let d = dim("unsqueeze", d, n + 1)?;
    let mut out = l.clone();
    // The stride a size-1 dimension takes: as if contiguous after it.
    let stride = if d < n { l.strides[d] * l.shape[d] as isize } else { 1 };
    out.shape.insert(d, 1);
    out.strides.insert(d, stride);
    Ok(out)
}

/// `narrow(d, start, length)`: elements `start..start + length` of dimension `d` (a
/// negative start counts from the end).
pub(crate) fn narrow(l: &Layout, d: isize, start: isize, length: usize) -> Result<Layout> {
    let d = dim_exact("narrow", d, l.shape.len())?;
    let size = l.shape[d];
    let s = if start < 0 { start + size as isize } else { start };
    if s < 0 || s as usize > size || length > size - s as usize {
        return Err(bad(
            "narrow",
            format!(
                "start {start} and length {length} exceed dimension {d} of size {size} (shape {:?})",
                &l.shape[..]
            ),
        ));
    }
    let mut out = l.clone();
    out.shape[d] = length;
    out.offset = offset_by(l.offset, s as usize, l.strides[d]);
    Ok(out)
}

/// `offset + i * stride`, the offset of element `i` along a dimension (within the storage:
/// the layout was checked, so the result is an element of it).
fn offset_by(offset: usize, i: usize, stride: isize) -> usize {
    (offset as isize + i as isize * stride) as usize
}

/// `select(d, index)`: element `index` of dimension `d` (negative from the end), the
/// dimension removed.
pub(crate) fn select(l: &Layout, d: isize, index: isize) -> Result<Layout> {
    let d = dim_exact("select", d, l.shape.len())?;
    let size = l.shape[d];
    let i = if index < 0 { index + size as isize } else { index };
    if i < 0 || i as usize >= size {
        return Err(bad(
            "select",
            format!(
                "index {index} is out of range for dimension {d} of size {size} (shape {:?})",
                &l.shape[..]
            ),
        ));
    }
    let mut out = l.clone();
    out.offset = offset_by(l.offset, i as usize, l.strides[d]);
    out.shape.remove(d);
    out.strides.remove(d);
    Ok(out)
}

/// `slice(d, start, end, step)` as Python slices a sequence (`start` and `end` clamped to
/// the dimension, negative from the end; `step` at least 1, as PyTorch takes it).
pub(crate) fn slice(
    l: &Layout,
    d: isize,
    start: Option<isize>,
    end: Option<isize>,
    step: isize,
) -> Result<Layout> {
    let d = dim_exact("slice", d, l.shape.len())?;
    if step <= 0 {
        return Err(bad(
            "slice",
            format!("step must be positive, not {step} (PyTorch's rule; flip() reverses)"),
        ));
    }
    let size = l.shape[d] as isize;
    let clamp = |v: Option<isize>, default: isize| -> isize {
        match v {
            None => default,
            Some(v) if v < 0 => (v + size).max(0),
            Some(v) => v.min(size),
        }
    };
    let (s, e) = (clamp(start, 0), clamp(end, size));
    let len = if e > s { ((e - s) + step - 1) / step } else { 0 };
    let mut out = l.clone();
    out.shape[d] = len as usize;
    out.strides[d] = l.strides[d] * step;
    if len > 0 {
        out.offset = offset_by(l.offset, s as usize, l.strides[d]);
    }
    Ok(out)
}

/// `diagonal(offset, d1, d2)`: the elements `[i, i + offset]` of dimensions `d1` and `d2`
/// (removed), as a last dimension.
pub(crate) fn diagonal(l: &Layout, offset: isize, d1: isize, d2: isize) -> Result<Layout> {
    let n = l.shape.len();
    let (a, b) = (dim_exact("diagonal", d1, n)?, dim_exact("diagonal", d2, n)?);
    if a == b {
        return Err(bad("diagonal", format!("dimensions {d1} and {d2} are the same dimension")));
    }
    let (sa, sb) = (l.shape[a] as isize, l.shape[b] as isize);
    let (len, start) = if offset >= 0 {
        ((sa.min(sb - offset)).max(0), if sb > offset { offset * l.strides[b] } else { 0 })
    } else {
        ((sa + offset).min(sb).max(0), if sa > -offset { -offset * l.strides[a] } else { 0 })
    };
    let mut out = Layout { shape: Shape::new(), strides: Strides::new(), offset: l.offset };
    if len > 0 {
        out.offset = (l.offset as isize + start) as usize;
    }
    for i in 0..n {
        if i != a && i != b {
            out.shape.push(l.shape[i]);
            out.strides.push(l.strides[i]);
        }
    }
    out.shape.push(len as usize);
    out.strides.push(l.strides[a] + l.strides[b]);
    Ok(out)
}

/// The lengths `split` cuts dimension `size` into: pieces of `split_size`, the last
/// shorter.
pub(crate) fn split_lengths(size: usize, split_size: usize) -> Result<SmallVec<[usize; 8]>> {
    if split_size == 0 && size > 0 {
        return Err(bad("split", format!("split_size 0 cannot split a dimension of size {size}")));
    }
    if size == 0 {
        return Ok(SmallVec::from_elem(0, 1));
    }
    let n = size.div_ceil(split_size);
    Ok((0..n).map(|i| split_size.min(size - i * split_size)).collect())
}

/// The lengths `chunk` cuts dimension `size` into: `chunks` pieces at most, of
/// `ceil(size / chunks)` each, the last shorter (fewer pieces when they run out).
pub(crate) fn chunk_lengths(size: usize, chunks: usize) -> Result<SmallVec<[usize; 8]>> {
    if chunks == 0 {
        return Err(bad("chunk", "chunks must be at least 1".into()));
    }
    split_lengths(size, size.div_ceil(chunks).max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lay(shape: &[usize]) -> Layout {
        Layout { shape: shape.into(), strides: contiguous_strides(shape), offset: 0 }
    }

    #[test]
    fn views_follow_pytorch_compute_stride() {
        // Contiguous: any view.
        assert_eq!(view_strides(&[2, 3, 4], &[12, 4, 1], &[6, 4]).unwrap().as_slice(), &[4, 1]);
        assert_eq!(view_strides(&[2, 3, 4], &[12, 4, 1], &[2, 12]).unwrap().as_slice(), &[12, 1]);
        // A transpose cannot be flattened, but its dimensions can be split.
        assert!(view_strides(&[3, 2], &[1, 3], &[6]).is_none());
        assert_eq!(view_strides(&[4, 2], &[1, 4], &[2, 2, 2]).unwrap().as_slice(), &[2, 1, 4]);
        // Size-1 dimensions go anywhere.
        assert_eq!(view_strides(&[3, 2], &[1, 3], &[3, 1, 2]).unwrap().as_slice(), &[1, 6, 3]);
        // 0-d and empty.
        assert_eq!(view_strides(&[], &[], &[1, 1]).unwrap().as_slice(), &[1, 1]);
        assert_eq!(view_strides(&[0, 3], &[3, 1], &[3, 0]).unwrap().as_slice(), &[1, 1]);
    }

    #[test]
    fn errors_name_the_op_and_the_shapes() {
        let l = lay(&[2, 3]);
        match view(&l, &[4, -1]) {
            Err(Error::InvalidOperands { op, detail }) => {
                assert_eq!(op, "view");
                assert!(detail.contains("[4, -1]") && detail.contains("6 elements"), "{detail}");
            }
            other => panic!("{other:?}"),
        }
        assert!(infer_size("view", &[-1, -1], 6).is_err());
        assert!(infer_size("view", &[-2, 3], 6).is_err());
        assert!(transpose(&l, 0, 2).is_err());
        assert!(permute(&l, &[0, 0]).is_err());
        assert!(expand(&l, &[3, 3]).is_err());
        assert!(narrow(&l, 1, 2, 2).is_err());
        assert!(select(&l, 0, 2).is_err());
        assert!(slice(&l, 0, None, None, 0).is_err());
        assert!(broadcast_shapes("add", &[4, 3], &[2, 3]).is_err());
    }

    #[test]
    fn layouts_of_the_common_views() {
        let l = lay(&[4, 6]);
        let s = slice(&l, 1, Some(1), None, 2).unwrap();
        assert_eq!(
            (s.shape.as_slice(), s.strides.as_slice(), s.offset),
            (&[4usize, 3][..], &[6isize, 2][..], 1)
        );
        let s = slice(&l, 0, Some(-2), Some(100), 1).unwrap();
        assert_eq!((s.shape.as_slice(), s.offset), (&[2usize, 6][..], 12));
        assert_eq!(slice(&l, 0, Some(3), Some(1), 1).unwrap().shape.as_slice(), &[0, 6]);
        let e = expand(&lay(&[3, 1]), &[2, -1, 4]).unwrap();
        assert_eq!((e.shape.as_slice(), e.strides.as_slice()), (&[2usize, 3, 4][..], &[0isize, 1, 0][..]));
        let d = diagonal(&lay(&[3, 4]), 1, 0, 1).unwrap();
        assert_eq!((d.shape.as_slice(), d.strides.as_slice(), d.offset), (&[3usize][..], &[5isize][..], 1));
        let d = diagonal(&lay(&[3, 4]), -1, 0, 1).unwrap();
        assert_eq!((d.shape.as_slice(), d.offset), (&[2usize][..], 4));
        assert_eq!(broadcast_shapes("add", &[4, 1, 3], &[5, 1]).unwrap().as_slice(), &[4, 5, 3]);
        assert_eq!(split_lengths(5, 2).unwrap().as_slice(), &[2, 2, 1]);
        assert_eq!(chunk_lengths(5, 3).unwrap().as_slice(), &[2, 2, 1]);
        assert_eq!(chunk_lengths(6, 4).unwrap().as_slice(), &[2, 2, 2]);
        let u = unsqueeze(&lay(&[2, 3]), -1).unwrap();
        assert_eq!((u.shape.as_slice(), u.strides.as_slice()), (&[2usize, 3, 1][..], &[3isize, 1, 1][..]));
        let q = squeeze(&lay(&[1, 2, 1]), None).unwrap();
        assert_eq!(q.shape.as_slice(), &[2]);
    }
}
