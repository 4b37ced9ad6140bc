//! Strided iteration: the operands of a kernel checked against their storages, and the loop
//! plan that walks them, after PyTorch's `TensorIterator`.
//!
//! A kernel names its operands ([`Operand::input`], [`Operand::output`]), which checks each
//! layout against its storage once; a [`Plan`] then covers the output's shape:
//!
//! 1. each input's strides are broadcast to the output's shape (NumPy's rule, aligned at the
//!    last dimension: a dimension of size 1, or a missing one, gets stride 0);
//! 2. dimensions of size 1 are dropped;
//! 3. in [`Order::Memory`], dimensions are sorted so that the innermost has the output's
//!    smallest stride (each element is visited once whatever the order); [`Order::Logical`]
//!    keeps row-major index order, for reductions whose result depends on it;
//! 4. neighbours that are contiguous with respect to each other in every operand are merged
//!    into one dimension.
//!
//! [`Plan::for_each_run`] then calls the kernel's inner loop once per run of the innermost
//! dimension with each operand's address and stride. When every operand is contiguous, the
//! plan is a single run over all elements, which the inner loops (`kernels::loops`) turn into
//! a loop over slices that the compiler vectorises.
//!
//! **Sharing storage.** An input may lie in the output's storage ([`Share`]): exactly the
//! output's elements (an in-place op, each element read before it is written, in the same
//! step), elsewhere in it (nothing to do), or overlapping it otherwise. In the last case the
//! input is first copied to a contiguous buffer ([`Staged`]), so that every input reads its
//! values from before the call whatever the layouts.

use smallvec::SmallVec;

use crate::alloc::Storage;
use crate::vm::{DType, Shape, Strides, TensorMeta};

/// The most operands one loop walks: an output and two inputs.
pub(crate) const MAX_OPERANDS: usize = 3;

/// An operand of a kernel: its layout, checked against its storage, and the address of its
/// element `[0, 0, ...]`.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Operand<'t> {
    /// Its dimensions.
    pub shape: &'t [usize],
    /// Its strides, in elements.
    pub strides: &'t [isize],
    /// Its dtype.
    pub dtype: DType,
    /// The address of element `[0, 0, ...]` (dangling for an empty operand).
    pub first: *mut u8,
    /// Its element count.
    pub numel: usize,
    /// The bytes it may touch, `lo..hi` (empty for an empty operand).
    lo: usize,
    hi: usize,
    /// Whether its elements lie in row-major order one after another.
    pub contiguous: bool,
}

impl<'t> Operand<'t> {
    /// Input `i` of a call, which must be of `dtype`.
    #[inline(always)]
    pub(crate) fn input(
        meta: &'t TensorMeta,
        data: &'t Storage,
        i: usize,
        dtype: DType,
    ) -> Result<Self, String> {
        Operand::new("input", i, meta, data, dtype)
    }

    /// Output `i` of a call, which must be of `dtype`.
    #[inline(always)]
    pub(crate) fn output(
        meta: &'t TensorMeta,
        data: &'t Storage,
        i: usize,
        dtype: DType,
    ) -> Result<Self, String> {
        Operand::new("output", i, meta, data, dtype)
    }

    /// `meta` over `data`, checked: of `dtype`, one stride per dimension, every element
    /// inside the storage. `kind` and `i` name the operand in the error.
    #[inline(always)]
    fn new(
        kind: &'static str,
        i: usize,
        meta: &'t TensorMeta,
        data: &'t Storage,
        dtype: DType,
    ) -> Result<Self, String> {
        if meta.dtype != dtype {
            return Err(wrong_dtype(kind, i, meta, dtype));
        }
        let size = dtype.size();
        let elems = data.len() / size;
        if meta.strides.len() != meta.shape.len() {
            return Err(outside(kind, i, meta, elems));
        }
        // One pass over the dimensions: the count, the reach either side of the offset, and
        // row-major contiguity. A reach that overflows saturates, and fails the check below.
        let (mut numel, mut below, mut above) = (1usize, 0usize, 0usize);
        let (mut expected, mut contiguous, mut empty) = (1isize, true, false);
        for (&d, &s) in meta.shape.iter().zip(&meta.strides).rev() {
            numel = numel.saturating_mul(d);
            empty |= d == 0;
            if d > 1 {
                let reach = (d - 1).saturating_mul(s.unsigned_abs());
                if s < 0 {
                    below = below.saturating_add(reach);
                } else {
                    above = above.saturating_add(reach);
                }
                contiguous &= s == expected;
                expected = expected.wrapping_mul(d as isize);
            }
        }
        let offset = meta.offset;
        let first = data.as_ptr().cast_mut().wrapping_add(offset.wrapping_mul(size));
        if empty {
            // No element is read or written, whatever the offset (`first` is never
            // dereferenced: every loop stops at a count of zero).
            return Ok(Operand {
                shape: &meta.shape,
                strides: &meta.strides,
                dtype,
                first,
                numel: 0,
                lo: 0,
                hi: 0,
                contiguous: true,
            });
        }
        if below > offset || offset.saturating_add(above) >= elems {
            return Err(outside(kind, i, meta, elems));
        }
        // Inside the storage: both ends fit in `usize`.
        let (lo, hi) = ((offset - below) * size, (offset + above + 1) * size);
        Ok(Operand { shape: &meta.shape, strides: &meta.strides, dtype, first, numel, lo, hi, contiguous })
    }

    /// The elements of this operand under another layout over the same storage (a
    /// permutation of its dimensions, or a part of it from `first`), which the caller makes
    /// sure names only elements of this operand. It keeps this operand's byte range.
    pub(crate) fn relaid<'a>(&self, shape: &'a [usize], strides: &'a [isize], first: *mut u8) -> Operand<'a>
    where
        't: 'a,
    {
        let numel = shape.iter().product();
        Operand {
            shape,
            strides,
            dtype: self.dtype,
            first,
            numel,
            lo: self.lo,
            hi: self.hi,
            contiguous: false,
        }
    }

    /// A contiguous buffer of `dtype` elements of `shape` (row-major `strides`) at `first`,
    /// which holds them all.
    pub(crate) fn buffer<'a>(
        shape: &'a [usize],
        strides: &'a [isize],
        dtype: DType,
        first: *mut u8,
    ) -> Operand<'a> {
        let numel: usize = shape.iter().product();
        Operand { shape, strides, dtype, first, numel, lo: 0, hi: numel * dtype.size(), contiguous: true }
    }

    /// The storage byte range this operand touches, as addresses.
    fn bytes(&self, base: *const u8) -> (usize, usize) {
        (base as usize + self.lo, base as usize + self.hi)
    }
}

#[cold]
#[inline(never)]
fn wrong_dtype(kind: &str, i: usize, meta: &TensorMeta, want: DType) -> String {
    format!("{kind} {i} is {} but the kernel ran for {want}", meta.dtype)
}

#[cold]
#[inline(never)]
fn outside(kind: &str, i: usize, meta: &TensorMeta, elems: usize) -> String {
    let why = meta.check_layout(elems).err().unwrap_or_else(|| "a layout outside its storage".into());
    format!("{kind} {i} ({}): {why}", meta.describe())
}

/// Check that input `i` of shape `from` broadcasts to `to` (the output's shape), by NumPy's
/// rule: aligned at the last dimension, each of its dimensions equal or 1.
#[inline]
pub(crate) fn broadcasts_to(i: usize, from: &TensorMeta, to: &[usize]) -> Result<(), String> {
    if fits(&from.shape, to) {
        return Ok(());
    }
    Err(not_broadcast(i, from, to))
}

#[cold]
#[inline(never)]
fn not_broadcast(i: usize, from: &TensorMeta, to: &[usize]) -> String {
    format!(
        "input {i} is {} but the output is [{}]: it does not broadcast to the output's shape",
        from.describe(),
        to.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
    )
}

/// Whether two shapes are equal (a plain loop: shapes are short, and a call to `memcmp`
/// costs more than the comparison).
#[inline(always)]
pub(crate) fn same_shape(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
}

/// Whether `from` broadcasts to `to`.
#[inline(always)]
pub(crate) fn fits(from: &[usize], to: &[usize]) -> bool {
    from.len() <= to.len() && from.iter().rev().zip(to.iter().rev()).all(|(&f, &t)| f == t || f == 1)
}

/// How an input lies relative to the output, in memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Share {
    /// No byte in common.
    Disjoint,
    /// Exactly the output's elements: the same dtype, shape, strides and first address.
    Same,
    /// Some bytes in common, otherwise.
    Overlap,
}

/// How `input` (in `in_data`) lies relative to `output` (in `out_data`). Storages are
/// compared by address, so that two storages over one buffer (imported twice) are seen to
/// share it.
#[inline]
pub(crate) fn share(
    input: &Operand<'_>,
    in_data: &Storage,
    output: &Operand<'_>,
    out_data: &Storage,
) -> Share {
    if input.numel == 0 || output.numel == 0 {
        return Share::Disjoint;
    }
    let (a0, a1) = input.bytes(in_data.as_ptr());
    let (b0, b1) = output.bytes(out_data.as_ptr());
    if a1 <= b0 || b1 <= a0 {
        return Share::Disjoint;
    }
    if input.first == output.first
        && input.dtype == output.dtype
        && same_shape(input.shape, output.shape)
        && input.strides.len() == output.strides.len()
        && input.strides.iter().zip(output.strides).all(|(x, y)| x == y)
    {
        Share::Same
    } else {
        Share::Overlap
    }
}

/// A contiguous copy of an operand, made before the output is written.
#[derive(Debug)]
pub(crate) struct Staged {
    /// The elements, in row-major order (words, for any element's alignment).
    buf: Vec<u64>,
    /// Row-major strides of the shape.
    strides: Strides,
    /// The shape.
    shape: Shape,
    dtype: DType,
}

impl Staged {
    /// Copy `op`'s elements (laid out as `op` says) into a new contiguous buffer.
    pub(crate) fn new(op: &Operand<'_>) -> Result<Staged, String> {
        let bytes = op.numel.checked_mul(op.dtype.size()).ok_or("a staged copy's size overflows")?;
        let mut buf: Vec<u64> = Vec::new();
        buf.try_reserve_exact(bytes.div_ceil(8)).map_err(|e| {
            format!("no memory for a copy of an input that overlaps the output ({bytes} bytes): {e}")
        })?;
        buf.resize(bytes.div_ceil(8), 0);
        let staged = Staged {
            buf,
            strides: crate::vm::contiguous_strides(op.shape),
            shape: op.shape.iter().copied().collect(),
            dtype: op.dtype,
        };
        let dst = staged.operand();
        super::loops::copy_elements(&dst, op);
        Ok(staged)
    }

    /// The copy as an operand.
    pub(crate) fn operand(&self) -> Operand<'_> {
        let bytes = self.buf.len() * 8;
        Operand {
            shape: &self.shape,
            strides: &self.strides,
            dtype: self.dtype,
            // Written only by `new`, through this pointer, before any other use.
            first: self.buf.as_ptr().cast_mut().cast::<u8>(),
            numel: self.shape.iter().product(),
            lo: 0,
            hi: bytes,
            contiguous: true,
        }
    }
}

/// Call `f(elements, count)` with `op`'s elements in row-major order, a slab of its first
/// dimension of more than one element at a time, each copied first to a contiguous buffer
/// of at most `max` elements (the copy walks the buffer's order, in square tiles where the
/// operand steps further along its last dimension than along the one before: [`Plan`]).
/// `Ok(false)`, and no call, when one step of that dimension holds more than `max`
/// elements; `op` holds at least one.
pub(crate) fn for_each_slab(
    op: &Operand<'_>,
    max: usize,
    mut f: impl FnMut(*const u8, usize),
) -> Result<bool, String> {
    let Some(d) = op.shape.iter().position(|&n| n > 1) else {
        f(op.first, 1);
        return Ok(true);
    };
    let (rows, inner) = (op.shape[d], op.numel / op.shape[d]);
    if inner > max {
        return Ok(false);
    }
    let per = (max / inner).clamp(1, rows);
    let mut shape: Shape = op.shape.iter().copied().collect();
    shape[d] = per;
    let size = op.dtype.size();
    let mut buf: Vec<u64> = Vec::new();
    let words = (per * inner * size).div_ceil(8);
    buf.try_reserve_exact(words)
        .map_err(|e| format!("no memory for a slab of {} elements: {e}", per * inner))?;
    buf.resize(words, 0);
    let strides = crate::vm::contiguous_strides(&shape);
    for start in (0..rows).step_by(per) {
        let r = per.min(rows - start);
        shape[d] = r;
        let src = Operand {
            shape: &shape,
            first: op
                .first
                .wrapping_offset((start as isize).wrapping_mul(op.strides[d]).wrapping_mul(size as isize)),
            numel: r * inner,
            contiguous: false,
            ..*op
        };
        // Dimensions before `d` have one element: the contiguous strides of the full slab's
        // shape serve every slab.
        let dst = Operand {
            shape: &shape,
            strides: &strides,
            dtype: op.dtype,
            first: buf.as_mut_ptr().cast::<u8>(),
            numel: r * inner,
            lo: 0,
            hi: words * 8,
            contiguous: true,
        };
        super::loops::copy_elements(&dst, &src);
        f(buf.as_ptr().cast::<u8>(), r * inner);
    }
    Ok(true)
}

/// The order a plan visits elements in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Order {
    /// Any order, the output's memory order first: for elementwise ops.
    Memory,
    /// Row-major order of the index: for reductions.
    Logical,
}

/// The side of the tiles a plan walks two dimensions in, in elements: a tile of an operand
/// read across its memory order touches `TILE` cache lines, which stay in L1 while it is
/// walked.
const TILE: usize = 64;

/// One dimension of a plan: its size and each operand's stride in bytes.
#[derive(Debug, Clone, Copy)]
struct Dim {
    size: usize,
    strides: [isize; MAX_OPERANDS],
}

/// A loop over a shape with up to [`MAX_OPERANDS`] operands (the module docs).
#[derive(Debug)]
pub(crate) struct Plan {
    /// Dimensions, innermost first.
    dims: SmallVec<[Dim; 6]>,
    /// Whether the two innermost dimensions are walked in tiles ([`TILE`]).
    tiled: bool,
    /// Each operand's element size.
    sizes: [usize; MAX_OPERANDS],
    /// Each operand's element `[0, 0, ...]`.
    first: [*mut u8; MAX_OPERANDS],
}

impl Plan {
    /// A plan over `ops[0]`'s shape, which holds at least one element; the other operands
    /// broadcast to it (checked by the caller: [`broadcasts_to`]). Unused operand slots
    /// repeat `ops[0]` with stride 0.
    pub(crate) fn new(ops: &[&Operand<'_>], order: Order) -> Plan {
        let shape = ops[0].shape;
        let rank = shape.len();
        let mut sizes = [ops[0].dtype.size(); MAX_OPERANDS];
        let mut first = [ops[0].first; MAX_OPERANDS];
        for (k, op) in ops.iter().enumerate().take(MAX_OPERANDS) {
            sizes[k] = op.dtype.size();
            first[k] = op.first;
        }
        let mut dims: SmallVec<[Dim; 6]> = SmallVec::new();
        for d in (0..rank).rev() {
            if shape[d] == 1 {
                continue;
            }
            let mut strides = [0isize; MAX_OPERANDS];
            for (k, op) in ops.iter().enumerate().take(MAX_OPERANDS) {
                // Aligned at the last dimension; a missing or size-1 dimension broadcasts.
                let back = rank - d;
                if let Some(j) = op.shape.len().checked_sub(back) {
                    if op.shape[j] != 1 {
                        strides[k] = op.strides[j].wrapping_mul(sizes[k] as isize);
                    }
                }
            }
            dims.push(Dim { size: shape[d], strides });
        }
        if order == Order::Memory {
            // Insertion sort (few dimensions), stable: the smallest output stride innermost.
            for i in 1..dims.len() {
                let mut j = i;
                while j > 0 && dims[j].strides[0].unsigned_abs() < dims[j - 1].strides[0].unsigned_abs() {
                    dims.swap(j, j - 1);
                    j -= 1;
                }
            }
        }
        // Merge each dimension into the one inside it where every operand steps over the
        // inner one exactly.
        let mut merged: SmallVec<[Dim; 6]> = SmallVec::new();
        for dim in dims {
            match merged.last_mut() {
                Some(inner)
                    if (0..MAX_OPERANDS)
                        .all(|k| dim.strides[k] == inner.strides[k].wrapping_mul(inner.size as isize)) =>
                {
                    inner.size *= dim.size;
                }
                _ => merged.push(dim),
            }
        }
        // An operand that steps further along the innermost dimension than along the next
        // (a transposed input of a contiguous output) would touch a new cache line at every
        // element: walk the two in square tiles instead, so that each line is read once.
        let tiled = order == Order::Memory
            && merged.len() >= 2
            && merged[0].size > TILE
            && (0..MAX_OPERANDS).any(|k| {
                let (s0, s1) = (merged[0].strides[k].unsigned_abs(), merged[1].strides[k].unsigned_abs());
                s1 != 0 && s0 > s1
            });
        Plan { dims: merged, tiled, sizes, first }
    }

    /// Call `run(addresses, strides, len)` for each run of the innermost dimension: the
    /// operands' addresses at its start, their strides in elements, and its length. A plan
    /// over one element (or none of size above 1) is one run of length 1 with unit strides.
    /// The caller makes sure the shape holds at least one element.
    #[inline]
    pub(crate) fn for_each_run(
        &self,
        mut run: impl FnMut([*mut u8; MAX_OPERANDS], [isize; MAX_OPERANDS], usize),
    ) {
        let Some((inner, outer)) = self.dims.split_first() else {
            run(self.first, [1; MAX_OPERANDS], 1);
            return;
        };
        let mut inner_strides = [0isize; MAX_OPERANDS];
        for (k, s) in inner_strides.iter_mut().enumerate() {
            *s = inner.strides[k] / self.sizes[k] as isize;
        }
        // With tiles, the odometer walks the dimensions outside the two tiled ones, and each
        // of its steps walks the tiles.
        let (tile, outer) = match (self.tiled, outer.split_first()) {
            (true, Some((second, rest))) => (Some(second), rest),
            _ => (None, outer),
        };
        let mut ptrs = self.first;
        let mut index: SmallVec<[usize; 6]> = SmallVec::from_elem(0, outer.len());
        loop {
            match tile {
                None => run(ptrs, inner_strides, inner.size),
                Some(second) => {
                    for j0 in (0..second.size).step_by(TILE) {
                        for i0 in (0..inner.size).step_by(TILE) {
                            let len = TILE.min(inner.size - i0);
                            for j in j0..second.size.min(j0 + TILE) {
                                let mut at = ptrs;
                                for (k, p) in at.iter_mut().enumerate() {
                                    let step = (i0 as isize).wrapping_mul(inner.strides[k]);
                                    *p = p.wrapping_offset(
                                        step.wrapping_add((j as isize).wrapping_mul(second.strides[k])),
                                    );
                                }
                                run(at, inner_strides, len);
                            }
                        }
                    }
                }
            }
            // The odometer over the outer dimensions. Addresses step with wrapping
            // arithmetic: after the last step of a dimension they may point past the
            // operand, and are moved back before any use.
            let mut d = 0;
            loop {
                let Some(dim) = outer.get(d) else { return };
                index[d] += 1;
                if index[d] < dim.size {
                    for (p, &s) in ptrs.iter_mut().zip(&dim.strides) {
                        *p = p.wrapping_offset(s);
                    }
                    break;
                }
                let back = (dim.size - 1) as isize;
                for (p, &s) in ptrs.iter_mut().zip(&dim.strides) {
                    *p = p.wrapping_offset(-s.wrapping_mul(back));
                }
                index[d] = 0;
                d += 1;
            }
        }
    }

    /// The number of runs and the length of each (tests).
    #[cfg(test)]
    fn runs(&self) -> (usize, usize) {
        let inner = self.dims.first().map_or(1, |d| d.size);
        (self.dims.iter().skip(1).map(|d| d.size).product(), inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{t_f32, Owned};

    fn view(t: &Owned, shape: &[usize], strides: &[isize], offset: usize) -> TensorMeta {
        t.0.with_layout(shape, strides, offset)
    }

    #[test]
    fn contiguous_operands_make_one_run() {
        let t = t_f32(&[24], &[0.0; 24]);
        let m = view(&t, &[2, 3, 4], &[12, 4, 1], 0);
        let op = Operand::output(&m, &t.1, 0, DType::F32).unwrap();
        assert!(op.contiguous);
        let plan = Plan::new(&[&op, &op], Order::Memory);
        assert_eq!(plan.runs(), (1, 24));
    }

    #[test]
    fn a_transposed_output_is_walked_in_its_memory_order() {
        let t = t_f32(&[12], &[0.0; 12]);
        let out = view(&t, &[3, 4], &[1, 3], 0);
        let o = Operand::output(&out, &t.1, 0, DType::F32).unwrap();
        assert!(!o.contiguous);
        let plan = Plan::new(&[&o], Order::Memory);
        // Innermost: the dimension of stride 1 (size 3), merged with the other into one.
        assert_eq!(plan.runs(), (1, 12));
        let plan = Plan::new(&[&o], Order::Logical);
        assert_eq!(plan.runs(), (3, 4));
        let mut seen = vec![];
        plan.for_each_run(|p, s, n| seen.push((p[0] as usize - o.first as usize, s[0], n)));
        assert_eq!(seen, vec![(0, 3, 4), (4, 3, 4), (8, 3, 4)]);
    }

    /// A transposed input of a contiguous output is walked in tiles: every element once,
    /// in runs of at most the tile's side.
    #[test]
    fn transposed_operands_are_walked_in_tiles() {
        let (rows, cols) = (150, 70);
        let t = t_f32(&[rows * cols], &vec![0.0; rows * cols]);
        let out = view(&t, &[rows, cols], &[cols as isize, 1], 0);
        let tr = view(&t, &[rows, cols], &[1, rows as isize], 0);
        let o = Operand::output(&out, &t.1, 0, DType::F32).unwrap();
        let a = Operand::input(&tr, &t.1, 1, DType::F32).unwrap();
        let plan = Plan::new(&[&o, &a], Order::Memory);
        assert!(plan.tiled);
        let mut seen = vec![0u32; rows * cols];
        let mut pairs = vec![];
        plan.for_each_run(|p, s, n| {
            assert!(n <= TILE && s == [1, rows as isize, 0]);
            for i in 0..n {
                let oe = (p[0] as usize - t.1.as_ptr() as usize) / 4 + i;
                let ae = (p[1] as usize - t.1.as_ptr() as usize) / 4 + i * rows;
                seen[oe] += 1;
                pairs.push((oe, ae));
            }
        });
        assert!(seen.iter().all(|&c| c == 1));
        // Element (r, c) of the output pairs with element (r, c) of the transposed view.
        assert!(pairs.iter().all(|&(oe, ae)| ae == (oe % cols) * rows + oe / cols));
        // Contiguous operands are not tiled.
        assert!(!Plan::new(&[&o, &o], Order::Memory).tiled);
        assert!(!Plan::new(&[&a], Order::Logical).tiled);
    }

    #[test]
    fn broadcast_dimensions_get_stride_zero() {
        let t = t_f32(&[12], &[0.0; 12]);
        let out = view(&t, &[3, 4], &[4, 1], 0);
        let bias = view(&t, &[4], &[1], 0);
        let col = view(&t, &[3, 1], &[1, 1], 0);
        let o = Operand::output(&out, &t.1, 0, DType::F32).unwrap();
        let b = Operand::input(&bias, &t.1, 1, DType::F32).unwrap();
        let c = Operand::input(&col, &t.1, 2, DType::F32).unwrap();
        let plan = Plan::new(&[&o, &b, &c], Order::Memory);
        assert_eq!(plan.runs(), (3, 4));
        let mut seen = vec![];
        plan.for_each_run(|p, s, n| {
            seen.push((p.map(|x| (x as usize - t.1.as_ptr() as usize) / 4), s, n));
        });
        assert_eq!(
            seen,
            vec![([0, 0, 0], [1, 1, 0], 4), ([4, 0, 1], [1, 1, 0], 4), ([8, 0, 2], [1, 1, 0], 4)]
        );
    }

    #[test]
    fn operands_outside_their_storage_are_refused() {
        let t = t_f32(&[6], &[0.0; 6]);
        let ok = view(&t, &[2, 3], &[3, 1], 0);
        assert!(Operand::input(&ok, &t.1, 0, DType::F32).is_ok());
        let past = view(&t, &[2, 3], &[3, 1], 1);
        let err = Operand::input(&past, &t.1, 0, DType::F32).unwrap_err();
        assert!(err.starts_with("input 0 (f32[2, 3] (offset 1)): "), "{err}");
        assert!(err.contains("outside a storage of 6 elements"), "{err}");
        let before = view(&t, &[3], &[-2], 3);
        assert!(Operand::input(&before, &t.1, 0, DType::F32).is_err());
        let reversed = view(&t, &[3], &[-2], 4);
        let r = Operand::input(&reversed, &t.1, 0, DType::F32).unwrap();
        assert_eq!((r.lo, r.hi), (0, 20));
        let empty = view(&t, &[0, 3], &[3, 1], 6);
        assert_eq!(Operand::input(&empty, &t.1, 0, DType::F32).unwrap().numel, 0);
        // No element, so no offset is outside (PyTorch's rule).
        let empty_past = view(&t, &[0], &[1], 7);
        assert_eq!(Operand::input(&empty_past, &t.1, 0, DType::F32).unwrap().numel, 0);
        let bad_rank = view(&t, &[2], &[1, 1], 0);
        assert!(Operand::input(&bad_rank, &t.1, 0, DType::F32).is_err());
        assert_eq!(
            Operand::output(&ok, &t.1, 2, DType::I64).unwrap_err(),
            "output 2 is f32 but the kernel ran for i64"
        );
    }

    #[test]
    fn sharing_is_told_from_addresses_and_layouts() {
        let t = t_f32(&[8], &[0.0; 8]);
        let u = t_f32(&[8], &[0.0; 8]);
        let (lo, hi) = (view(&t, &[4], &[1], 0), view(&t, &[4], &[1], 4));
        let (even, odd) = (view(&t, &[4], &[2], 0), view(&t, &[4], &[2], 1));
        let other = view(&u, &[4], &[1], 0);
        let op = |m| Operand::input(m, &t.1, 0, DType::F32).unwrap();
        assert_eq!(share(&op(&lo), &t.1, &op(&hi), &t.1), Share::Disjoint);
        assert_eq!(share(&op(&lo), &t.1, &op(&lo), &t.1), Share::Same);
        assert_eq!(share(&op(&even), &t.1, &op(&odd), &t.1), Share::Overlap);
        let o = Operand::input(&other, &u.1, 0, DType::F32).unwrap();
        assert_eq!(share(&o, &u.1, &op(&lo), &t.1), Share::Disjoint);
    }

    #[test]
    fn staging_copies_in_row_major_order() {
        let t = t_f32(&[6], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let tr = view(&t, &[3, 2], &[1, 3], 0);
        let s = Staged::new(&Operand::input(&tr, &t.1, 0, DType::F32).unwrap()).unwrap();
        let vals: Vec<f32> = s
            .buf
            .iter()
            .flat_map(|w| w.to_ne_bytes())
            .collect::<Vec<u8>>()
            .chunks_exact(4)
            .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
            .collect();
        assert_eq!(vals, [0.0, 3.0, 1.0, 4.0, 2.0, 5.0]);
        assert!(s.operand().contiguous);
    }
}
