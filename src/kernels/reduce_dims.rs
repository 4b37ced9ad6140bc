//! Reductions along any set of dimensions, with `keepdim`: `sum` (with a parameter list),
//! `mean`, `prod`, `amax`, `amin`, `max` and `min` (values and indices), `argmax`, `argmin`,
//! `all`, `any`, `var`, `std`, `logsumexp` and `norm`, and the machinery the ops along one
//! dimension (`kernels::normalize`, `kernels::loss`) share with them.
//!
//! **Parameter list.** `ints` = `[dims..., keepdim]`: the dimensions to reduce (negative
//! counts from the end; each at most once), then `keepdim` (0 or 1). No integers, or only
//! `keepdim`, reduces every dimension (the whole-tensor forms: `x.sum()`, `x.argmax()` over
//! the flattened tensor). `var` and `std` read `scalars[0]`, the correction (default 1);
//! `norm` reads `scalars[0]`, the order `p` (default 2).
//!
//! **Order.** Each output element reduces its *group*, the input's elements that share its
//! index in the kept dimensions, in row-major order of the reduced dimensions, whatever the
//! layout: several short groups are read together, element by element, each in its own
//! order ([`for_each_block`]); otherwise a group whose elements lie one after another is
//! read in place, and other groups are copied to a contiguous buffer first, a slab of whole
//! groups at a time ([`for_each_group`]); `f32` and `f64` reductions along outer dims add
//! rows of contiguous columns as vectors, and the extremes of contiguous groups are
//! vectorised ([`fast`]), each in the same order. Floating sums (`sum`, `mean`, `var`,
//! `std`, `logsumexp`, `norm`) add a group's terms in the order of `kernels::sum_f32` (one
//! at a time up to 4096 terms, 32 partial sums combined as a fixed tree above), in the
//! compute type (`f32` for `f16`, `bf16` and `f32`; `f64` for `f64`),
//! rounding once on store. So a result does not depend on the layout, the machine, or any
//! thread count, and a `sum` along every dimension has the bits of the whole-tensor `sum`.
//! `prod` multiplies in index order; `bool` and integer sums and products wrap in `i64`.

use std::ops::{Add, Div, Mul, Neg, Sub};
use std::slice;

use smallvec::{smallvec, SmallVec};

use super::dtype::{dispatch, int_of, Bool8, Elem, Float, Ring, Wide};
use super::iter::{for_each_slab, Operand};
use super::loops::{copy_elements, expect_count, input, output};
use super::reduce::{push_values, sum_dtype, sum_in_order, Ordered};
use super::{check_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{
    contiguous_strides, Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Scalar, Shape, TensorMeta,
    TensorViewMut,
};

/// The most elements a reduction copies to a contiguous buffer at a time (256 KiB of `f32`).
const SLAB: usize = 1 << 16;

// ---- Floating compute types ---------------------------------------------------------

/// The floating compute types (`f32`, `f64`) with the functions the reductions use.
pub(super) trait Real:
    Float + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self> + Neg<Output = Self>
{
    /// Negative infinity.
    const NEG_INFINITY: Self;
    /// `v` rounded to this type.
    fn of(v: f64) -> Self;
    /// `e^self`.
    fn exp(self) -> Self;
    /// The natural logarithm.
    fn ln(self) -> Self;
    /// The square root.
    fn sqrt(self) -> Self;
    /// The absolute value.
    fn abs(self) -> Self;
    /// `self^p`.
    fn powf(self, p: Self) -> Self;
    /// Whether it is NaN.
    fn is_nan(self) -> bool;
    /// Whether it is infinite.
    fn is_infinite(self) -> bool;
}

macro_rules! real {
    ($($t:ident: $exp:path),*) => {$(
        impl Real for $t {
            const NEG_INFINITY: Self = $t::NEG_INFINITY;
            #[inline(always)]
            fn of(v: f64) -> Self {
                v as $t
            }
            #[inline(always)]
            fn exp(self) -> Self {
                $exp(self)
            }
            #[inline(always)]
            fn ln(self) -> Self {
                $t::ln(self)
            }
            #[inline(always)]
            fn sqrt(self) -> Self {
                $t::sqrt(self)
            }
            #[inline(always)]
            fn abs(self) -> Self {
                $t::abs(self)
            }
            #[inline(always)]
            fn powf(self, p: Self) -> Self {
                $t::powf(self, p)
            }
            #[inline(always)]
            fn is_nan(self) -> bool {
                $t::is_nan(self)
            }
            #[inline(always)]
            fn is_infinite(self) -> bool {
                $t::is_infinite(self)
            }
        }
    )*};
}
// `f32`'s `exp` is the vectorisable one of `kernels::vmath`, as everywhere in the kernels.
real!(f32: super::vmath::exp_f32, f64: f64::exp);

/// The sum of `xs` in their compute type, in the order of `kernels::sum_f32`.
pub(super) fn sum_of<T: Elem>(xs: &[T]) -> T::C
where
    T::C: Ring,
{
    match T::as_compute(xs) {
        Some(c) => sum_in_order(c),
        None => {
            let mut ord = Ordered::new(xs.len());
            push_values(&mut ord, xs);
            ord.finish()
        }
    }
}

/// The sum of `f(x)` over `xs`, in the order of `kernels::sum_f32`.
pub(super) fn sum_mapped<T: Elem>(xs: &[T], f: impl Fn(T::C) -> T::C) -> T::C
where
    T::C: Ring,
{
    let mut ord = Ordered::new(xs.len());
    let mut buf = [<T::C as Ring>::ZERO; 256];
    for chunk in xs.chunks(buf.len()) {
        for (b, &v) in buf.iter_mut().zip(chunk) {
            *b = f(v.load());
        }
        ord.push_slice(&buf[..chunk.len()]);
    }
    ord.finish()
}

/// Whether a value is nonzero (NaN is).
#[inline(always)]
fn truthy<T: Elem>(v: T) -> bool {
    match v.widen() {
        Wide::Bool(b) => b,
        Wide::Int(i) => i != 0,
        Wide::Float(f) => f != 0.0,
    }
}

/// `all` (with `all`) or `any` of the values' truth.
fn truth<T: Elem>(xs: &[T], all: bool) -> bool {
    if all {
        xs.iter().all(|&v| truthy(v))
    } else {
        xs.iter().any(|&v| truthy(v))
    }
}

// ---- Dimensions ---------------------------------------------------------------------

/// Dimension `d` of a tensor of `rank` dimensions, counted from the front (a 0-d tensor
/// takes 0 and -1, as PyTorch's reductions do).
pub(super) fn wrap_dim(d: i64, rank: usize) -> Result<usize, String> {
    let r = rank.max(1) as i64;
    let w = if d < 0 { d.wrapping_add(r) } else { d };
    if (0..r).contains(&w) {
        Ok(w as usize)
    } else {
        Err(format!(
            "dimension {d} is out of range for a tensor of {rank} dimensions (expected -{r} to {})",
            r - 1
        ))
    }
}

/// The dimensions a call reduces, and whether it keeps them.
#[derive(Debug, Clone)]
pub(super) struct Dims {
    /// Per dimension of the input: whether it is reduced.
    pub(super) reduced: SmallVec<[bool; 8]>,
    /// Whether reduced dimensions stay, of size 1.
    pub(super) keepdim: bool,
}

impl Dims {
    /// The dims of a reduction's parameter list (module docs) over `meta`.
    pub(super) fn from_params(meta: &TensorMeta, attrs: &Attrs) -> Result<Dims, String> {
        let ints = attrs.params().ints();
        let (list, keepdim) = match ints.split_last() {
            None => (&[][..], false),
            Some((&k, list)) => (list, k != 0),
        };
        Dims::new(meta.shape.len(), list, keepdim, true)
    }

    /// `list` over a tensor of `rank` dimensions; an empty list is every dimension where
    /// `empty_is_all`, none otherwise. A dimension given twice is refused.
    pub(super) fn new(rank: usize, list: &[i64], keepdim: bool, empty_is_all: bool) -> Result<Dims, String> {
        let mut reduced: SmallVec<[bool; 8]> = smallvec![list.is_empty() && empty_is_all; rank];
        let mut seen = [false; 1];
        for &d in list {
            let w = wrap_dim(d, rank)?;
            let slot = if rank == 0 { &mut seen[0] } else { &mut reduced[w] };
            if *slot {
                return Err(format!(
                    "dimension {w} appears more than once in the dims {list:?}: give each dimension once"
                ));
            }
            *slot = true;
        }
        Ok(Dims { reduced, keepdim })
    }

    /// The output's shape for an input of `shape`.
    pub(super) fn out_shape(&self, shape: &[usize]) -> Shape {
        shape
            .iter()
            .zip(&self.reduced)
            .filter_map(|(&n, &r)| match (r, self.keepdim) {
                (false, _) => Some(n),
                (true, true) => Some(1),
                (true, false) => None,
            })
            .collect()
    }

    /// Refuse a reduction of an empty dimension by `op` (which has no value for no
    /// elements: the extremes and their indices).
    pub(super) fn check_nonempty(&self, op: &str, shape: &[usize]) -> Result<(), String> {
        match shape.iter().zip(&self.reduced).position(|(&n, &r)| r && n == 0) {
            None => Ok(()),
            Some(d) => Err(format!(
                "{op} of an empty dimension: dimension {d} of [{}] has size 0, and {op} of no elements has no \
                 value (reduce along other dimensions, or check the size first)",
                shape.iter().map(|n| n.to_string()).collect::<Vec<_>>().join(", ")
            )),
        }
    }
}

// ---- Groups -------------------------------------------------------------------------

/// An operand's dimensions reordered: the kept ones, then the reduced ones, each in order.
pub(super) struct Split {
    pub(super) shape: SmallVec<[usize; 8]>,
    pub(super) strides: SmallVec<[isize; 8]>,
    /// How many of the dimensions are kept (they come first).
    pub(super) kept: usize,
    /// The number of groups (the product of the kept sizes).
    pub(super) groups: usize,
    /// The elements of each group (the product of the reduced sizes).
    pub(super) len: usize,
}

impl Split {
    /// `shape` and `strides` split by `reduced`.
    pub(super) fn new(shape: &[usize], strides: &[isize], reduced: &[bool]) -> Split {
        let mut s = Split { shape: SmallVec::new(), strides: SmallVec::new(), kept: 0, groups: 1, len: 1 };
        for pass in [false, true] {
            for ((&n, &st), &r) in shape.iter().zip(strides).zip(reduced) {
                if r == pass {
                    s.shape.push(n);
                    s.strides.push(st);
                    if pass {
                        s.len *= n;
                    } else {
                        s.kept += 1;
                        s.groups *= n;
                    }
                }
            }
        }
        s
    }
}

/// A vector of `n` elements' room, or the error saying there is no memory for it.
pub(super) fn room<O>(n: usize) -> Result<Vec<O>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| format!("no memory for {n} results: {e}"))?;
    Ok(v)
}

/// A zeroed buffer of words holding `n` elements of `size` bytes.
fn words(n: usize, size: usize) -> Result<Vec<u64>, String> {
    let w = n.checked_mul(size).ok_or("a buffer's size overflows")?.div_ceil(8);
    let mut v: Vec<u64> = Vec::new();
    v.try_reserve_exact(w).map_err(|e| format!("no memory for a buffer of {n} elements: {e}"))?;
    v.resize(w, 0);
    Ok(v)
}

/// Call `f` with each group of `a` (its elements in row-major order of the reduced
/// dimensions), the groups in row-major order of the kept dimensions (module docs).
pub(super) fn for_each_group<T: Elem>(
    a: &Operand<'_>,
    reduced: &[bool],
    mut f: impl FnMut(&[T]),
) -> Result<(), String> {
    let s = Split::new(a.shape, a.strides, reduced);
    if s.groups == 0 {
        return Ok(());
    }
    if s.len == 0 {
        for _ in 0..s.groups {
            f(&[]);
        }
        return Ok(());
    }
    let size = T::DTYPE.size() as isize;
    // The reduced dimensions lie one after another: read each group in place.
    if dense_groups(&s) {
        for_each_start(&s, a.first, size, |p| {
            // SAFETY: the group's `len` elements lie one after another from `p`, inside
            // the checked operand; no output is written while the slice lives.
            f(unsafe { slice::from_raw_parts(p.cast_const().cast::<T>(), s.len) })
        });
        return Ok(());
    }
    let view = a.relaid(&s.shape, &s.strides, a.first);
    if s.groups > 1 {
        // The first dimension of size above 1 is a kept one: every slab holds whole groups.
        let slabbed = for_each_slab(&view, SLAB, |p, n| {
            // SAFETY: `n` elements of `T` of the slab's buffer, aligned to 8 bytes.
            let xs = unsafe { slice::from_raw_parts(p.cast::<T>(), n) };
            for g in xs.chunks_exact(s.len) {
                f(g);
            }
        })?;
        if slabbed {
            return Ok(());
        }
    }
    // One group at a time (large groups).
    let mut buf = words(s.len, size as usize)?;
    let inner_shape = &s.shape[s.kept..];
    let inner_strides = &s.strides[s.kept..];
    let dst_strides = contiguous_strides(inner_shape);
    let dst_first = buf.as_mut_ptr().cast::<u8>();
    for_each_start(&s, a.first, size, |p| {
        let src = view.relaid(inner_shape, inner_strides, p);
        let dst = Operand::buffer(inner_shape, &dst_strides, T::DTYPE, dst_first);
        copy_elements(&dst, &src);
        // SAFETY: the buffer holds the group's `len` elements, just written.
        f(unsafe { slice::from_raw_parts(dst_first.cast_const().cast::<T>(), s.len) })
    });
    Ok(())
}

/// Groups a block reads together ([`for_each_block`]).
const BLOCK: usize = 128;

/// The longest groups read a block at a time: each block keeps one offset per element of
/// a group.
const BLOCK_MAX_LEN: usize = 1 << 16;

/// Whether the reductions read `a`'s groups a block at a time ([`for_each_block`]) rather
/// than one whole group after another ([`for_each_group`]): where there are several groups,
/// not too long, and not both dense and long (a dense group above `SEQUENTIAL_SUM_MAX` sums
/// fastest in place, in its 32 partial sums). Both read each group in the same order, so
/// the choice changes no result.
pub(super) fn blocked(a: &Operand<'_>, reduced: &[bool]) -> bool {
    let s = Split::new(a.shape, a.strides, reduced);
    if s.groups <= 1 || s.len == 0 || s.len > BLOCK_MAX_LEN {
        return false;
    }
    !(dense_groups(&s) && s.len > super::reduce::SEQUENTIAL_SUM_MAX)
}

/// Whether each group's elements lie one after another (the reduced dimensions are dense).
pub(super) fn dense_groups(s: &Split) -> bool {
    let mut expected = 1isize;
    (s.kept..s.shape.len()).rev().all(|d| {
        let ok = s.shape[d] == 1 || s.strides[d] == expected;
        expected = expected.wrapping_mul(s.shape[d] as isize);
        ok
    })
}

/// Call `f(starts, offsets)` for each block of up to [`BLOCK`] groups of `a`, in order:
/// `starts` are the groups' first elements, `offsets` the elements of a group relative to
/// its first, in row-major order of the reduced dimensions. A caller that walks
/// `offsets` outside and `starts` inside reads every group in its order while the
/// block's groups advance together: the loads of a reduction along an outer dimension are
/// then neighbours, and the groups' dependency chains interleave.
fn for_each_block<T: Elem>(
    a: &Operand<'_>,
    reduced: &[bool],
    mut f: impl FnMut(&[*const T], &[isize]),
) -> Result<(), String> {
    let s = Split::new(a.shape, a.strides, reduced);
    if s.groups == 0 || s.len == 0 {
        return Ok(());
    }
    let offsets = offsets(&s.shape[s.kept..], &s.strides[s.kept..])?;
    let mut starts: SmallVec<[*const T; BLOCK]> = SmallVec::new();
    for_each_start(&s, a.first, T::DTYPE.size() as isize, |p| {
        starts.push(p.cast_const().cast::<T>());
        if starts.len() == BLOCK {
            f(&starts, &offsets);
            starts.clear();
        }
    });
    if !starts.is_empty() {
        f(&starts, &offsets);
    }
    Ok(())
}

/// The offsets of the elements of `shape` with `strides`, in row-major order.
pub(super) fn offsets(shape: &[usize], strides: &[isize]) -> Result<Vec<isize>, String> {
    let n: usize = shape.iter().product();
    let mut out = room::<isize>(n)?;
    let mut index: SmallVec<[usize; 8]> = smallvec![0; shape.len()];
    let mut at = 0isize;
    for _ in 0..n {
        out.push(at);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            at += strides[d];
            if index[d] < shape[d] {
                break;
            }
            at -= strides[d] * shape[d] as isize;
            index[d] = 0;
        }
    }
    Ok(out)
}

/// `step` folded over each group of `a` from `init`, element by element in index order,
/// a block of groups at a time: `step(acc, value, i)` for element `i` of the group.
fn block_fold<T: Elem, A: Copy>(
    a: &Operand<'_>,
    reduced: &[bool],
    init: A,
    step: impl Fn(A, T, usize) -> A,
) -> Result<Vec<A>, String> {
    let s = Split::new(a.shape, a.strides, reduced);
    let mut out = room::<A>(s.groups)?;
    for_each_block::<T>(a, reduced, |starts, offsets| {
        let mut acc: SmallVec<[A; BLOCK]> = smallvec![init; starts.len()];
        for (i, &o) in offsets.iter().enumerate() {
            for (x, &p) in acc.iter_mut().zip(starts) {
                // SAFETY: element `o` of a group of the checked operand (its layout's
                // offsets from the group's first element).
                *x = step(*x, unsafe { p.offset(o).read() }, i);
            }
        }
        out.extend_from_slice(&acc);
    })?;
    Ok(out)
}

/// The sum of `f(x, g)` over each group `g` of `a`, in the order of `kernels::sum_f32`, a
/// block of groups at a time.
pub(super) fn block_sums<T: Elem>(
    a: &Operand<'_>,
    reduced: &[bool],
    f: impl Fn(T::C, usize) -> T::C,
) -> Result<Vec<T::C>, String>
where
    T::C: Ring,
{
    let s = Split::new(a.shape, a.strides, reduced);
    let mut out = room::<T::C>(s.groups)?;
    let zero = <T::C as Ring>::ZERO;
    for_each_block::<T>(a, reduced, |starts, offsets| {
        let base = out.len();
        let n = offsets.len();
        if n <= super::reduce::SEQUENTIAL_SUM_MAX && offsets.iter().enumerate().all(|(i, &o)| o == i as isize)
        {
            // Dense groups, one at a time in index order (`sum_f32`'s order at this
            // length), eight chains interleaved.
            let mut chunks = starts.chunks_exact(8);
            for (c, chunk) in chunks.by_ref().enumerate() {
                // SAFETY: each group's `n` elements lie one after another from its start,
                // inside the checked operand.
                let rows: [&[T]; 8] = std::array::from_fn(|j| unsafe { slice::from_raw_parts(chunk[j], n) });
                let mut acc = [zero; 8];
                for i in 0..n {
                    for (j, (x, row)) in acc.iter_mut().zip(&rows).enumerate() {
                        *x = x.add(f(row[i].load(), base + 8 * c + j));
                    }
                }
                out.extend_from_slice(&acc);
            }
            for &p in chunks.remainder() {
                let g = out.len();
                // SAFETY: as above.
                let row = unsafe { slice::from_raw_parts(p, n) };
                out.push(row.iter().fold(zero, |x, &v| x.add(f(v.load(), g))));
            }
        } else if n <= super::reduce::SEQUENTIAL_SUM_MAX {
            // One at a time in index order: `sum_f32`'s order at this length.
            let mut acc: SmallVec<[T::C; BLOCK]> = smallvec![zero; starts.len()];
            for &o in offsets {
                for (k, (x, &p)) in acc.iter_mut().zip(starts).enumerate() {
                    // SAFETY: as in `block_fold`.
                    *x = x.add(f(unsafe { p.offset(o).read() }.load(), base + k));
                }
            }
            out.extend_from_slice(&acc);
        } else {
            let mut ords: Vec<Ordered<T::C>> = starts.iter().map(|_| Ordered::new(offsets.len())).collect();
            for &o in offsets {
                for (k, (ord, &p)) in ords.iter_mut().zip(starts).enumerate() {
                    // SAFETY: as in `block_fold`.
                    ord.push(f(unsafe { p.offset(o).read() }.load(), base + k));
                }
            }
            out.extend(ords.into_iter().map(Ordered::finish));
        }
    })?;
    Ok(out)
}

/// The first extreme of each group and its index (as [`extreme`]), a block at a time: the
/// best value so far of each group in its compute type, replaced by a strictly better one
/// or by the first NaN.
fn block_extremes<T: Elem>(a: &Operand<'_>, reduced: &[bool], max: bool) -> Result<Vec<(T, i64)>, String> {
    let s = Split::new(a.shape, a.strides, reduced);
    let mut out = room::<(T, i64)>(s.groups)?;
    for_each_block::<T>(a, reduced, |starts, offsets| {
        let Some((&first, rest)) = offsets.split_first() else { return };
        // SAFETY: element `first` of each group of the checked operand.
        let mut best: SmallVec<[T::C; BLOCK]> =
            starts.iter().map(|&p| unsafe { p.offset(first).read() }.load()).collect();
        let mut index: SmallVec<[usize; BLOCK]> = smallvec![0; starts.len()];
        for (i, &o) in rest.iter().enumerate() {
            for ((b, at), &p) in best.iter_mut().zip(index.iter_mut()).zip(starts) {
                // SAFETY: as above.
                let c = unsafe { p.offset(o).read() }.load();
                #[allow(clippy::eq_op)]
                let better = (if max { c > *b } else { c < *b }) || (c != c && *b == *b);
                if better {
                    *b = c;
                    *at = i + 1;
                }
            }
        }
        out.extend(best.iter().zip(&index).map(|(&b, &i)| (T::store(b), i as i64)));
    })?;
    Ok(out)
}

/// Write `vals` to output `i`.
fn emit<O: Elem>(ctx: &KernelCtx<'_, '_>, i: usize, vals: &[O]) -> Result<(), String> {
    write_output(output(ctx, i)?, i, None, vals)
}

/// Write the extremes' values and indices to the outputs `kind` has (`amax`, `amin`: the
/// values; `argmax`, `argmin`: the indices; `max`, `min`: both).
fn emit_extremes<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    kind: Kind,
    vals: &[T],
    idx: &[i64],
) -> Result<(), String> {
    match kind {
        Kind::Amax | Kind::Amin => emit(ctx, 0, vals),
        Kind::Argmax | Kind::Argmin => emit(ctx, 0, idx),
        _ => {
            emit(ctx, 0, vals)?;
            emit(ctx, 1, idx)
        }
    }
}

/// Call `f` with the address of each group's first element (the kept dimensions'
/// odometer), in row-major order of the kept dimensions.
fn for_each_start(s: &Split, first: *mut u8, size: isize, mut f: impl FnMut(*mut u8)) {
    let mut index: SmallVec<[usize; 8]> = smallvec![0; s.kept];
    let mut p = first;
    for _ in 0..s.groups {
        f(p);
        for d in (0..s.kept).rev() {
            let step = s.strides[d].wrapping_mul(size);
            index[d] += 1;
            p = p.wrapping_offset(step);
            if index[d] < s.shape[d] {
                break;
            }
            p = p.wrapping_offset(step.wrapping_mul(-(s.shape[d] as isize)));
            index[d] = 0;
        }
    }
}

/// Write `vals` (row-major order of output `i`'s shape, or of its dimensions reordered by
/// `reduced` as [`Split`] does, when given) to output `i`.
pub(super) fn write_output<O: Elem>(
    out: &TensorViewMut<'_>,
    i: usize,
    reduced: Option<&[bool]>,
    vals: &[O],
) -> Result<(), String> {
    let o = Operand::output(out.meta, out.data, i, O::DTYPE)?;
    if o.numel != vals.len() {
        return Err(format!(
            "output {i} is {} but the op computed {} element(s)",
            out.meta.describe(),
            vals.len()
        ));
    }
    if o.numel == 0 {
        return Ok(());
    }
    let split = reduced.map(|r| Split::new(o.shape, o.strides, r));
    let dst = match &split {
        Some(s) => o.relaid(&s.shape, &s.strides, o.first),
        None => o,
    };
    let strides = contiguous_strides(dst.shape);
    let src = Operand::buffer(dst.shape, &strides, O::DTYPE, vals.as_ptr().cast_mut().cast::<u8>());
    copy_elements(&dst, &src);
    Ok(())
}

// ---- The reductions -----------------------------------------------------------------

/// A reduction along dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Sum,
    Mean,
    Prod,
    Amax,
    Amin,
    Max,
    Min,
    Argmax,
    Argmin,
    All,
    Any,
    Var,
    Std,
    Logsumexp,
    Norm,
}

impl Kind {
    fn dtypes(self) -> Dtypes {
        match self {
            Kind::Sum
            | Kind::Prod
            | Kind::Amax
            | Kind::Amin
            | Kind::Max
            | Kind::Min
            | Kind::All
            | Kind::Any => Dtypes::All,
            Kind::Argmax | Kind::Argmin => Dtypes::Numeric,
            Kind::Mean | Kind::Var | Kind::Std | Kind::Logsumexp | Kind::Norm => Dtypes::Floating,
        }
    }

    fn out_dtype(self, d: DType) -> DType {
        match self {
            Kind::Sum | Kind::Prod => sum_dtype(d),
            Kind::Argmax | Kind::Argmin => DType::I64,
            Kind::All | Kind::Any if d == DType::U8 => DType::U8,
            Kind::All | Kind::Any => DType::Bool,
            _ => d,
        }
    }
}

/// The order `p` of a `norm` call (default 2).
fn norm_order(attrs: &Attrs) -> f64 {
    attrs.params().scalar(0).map_or(2.0, Scalar::as_f64)
}

/// Whether `kind` refuses an empty reduced dimension under `attrs`.
fn needs_elements(kind: Kind, attrs: &Attrs) -> bool {
    match kind {
        Kind::Amax | Kind::Amin | Kind::Max | Kind::Min | Kind::Argmax | Kind::Argmin => true,
        Kind::Norm => norm_order(attrs).is_infinite(),
        _ => false,
    }
}

/// `infer` of a reduction along dims.
pub(super) fn infer_reduce(
    op: &str,
    kind: Kind,
    inputs: &[&TensorMeta],
    attrs: &Attrs,
    outputs: &mut OutSpecs,
) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    let x = inputs[0];
    check_dtype(op, x.dtype, kind.dtypes())?;
    let dims = Dims::from_params(x, attrs)?;
    if needs_elements(kind, attrs) {
        dims.check_nonempty(op, &x.shape)?;
    }
    let shape = dims.out_shape(&x.shape);
    if matches!(kind, Kind::Max | Kind::Min) {
        outputs.push(OutSpec { shape: shape.clone(), dtype: x.dtype });
        outputs.push(OutSpec { shape, dtype: DType::I64 });
    } else {
        outputs.push(OutSpec { shape, dtype: kind.out_dtype(x.dtype) });
    }
    Ok(())
}

/// `compute` of a reduction along dims.
pub(super) fn compute_reduce(op: &str, kind: Kind, ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    expect_count(ctx, 1)?;
    let x = input(ctx, 0)?;
    let dtype = x.meta.dtype;
    let dims = Dims::from_params(x.meta, &ctx.attrs)?;
    if needs_elements(kind, &ctx.attrs) {
        dims.check_nonempty(op, &x.meta.shape)?;
    }
    let a = Operand::input(x.meta, x.data, 0, dtype)?;
    let no = || Err(refusal(op, dtype, kind.dtypes()));
    let attrs = ctx.attrs;
    let r = &dims.reduced;
    if let Some(done) = fast::reduce(kind, ctx, &a, &dims) {
        return done;
    }
    if blocked(&a, r) {
        return compute_blocked(kind, ctx, &a, r, dtype).unwrap_or_else(no);
    }
    match kind {
        Kind::Sum => dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, |xs| T::store(sum_of(xs))),
            dispatch!(dtype, integral, T => one::<T, i64>(ctx, &a, &dims, int_sum::<T>), no())),
        Kind::Prod => {
            dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, |xs| T::store(prod_of(xs))),
            dispatch!(dtype, integral, T => one::<T, i64>(ctx, &a, &dims, int_prod::<T>), no()))
        }
        Kind::Amax | Kind::Amin => {
            let max = kind == Kind::Amax;
            dispatch!(dtype, all, T => one::<T, T>(ctx, &a, &dims, |xs| extreme(xs, max).0), no())
        }
        Kind::Max | Kind::Min => {
            let max = kind == Kind::Max;
            dispatch!(dtype, all, T => two::<T>(ctx, &a, &dims, |xs| extreme(xs, max)), no())
        }
        Kind::Argmax | Kind::Argmin => {
            let max = kind == Kind::Argmax;
            dispatch!(dtype, numeric, T => one::<T, i64>(ctx, &a, &dims, |xs| extreme(xs, max).1), no())
        }
        Kind::All | Kind::Any => {
            let all = kind == Kind::All;
            if dtype == DType::U8 {
                one::<u8, u8>(ctx, &a, &dims, |xs| u8::from(truth(xs, all)))
            } else {
                dispatch!(dtype, all, T => one::<T, Bool8>(ctx, &a, &dims, |xs: &[T]| Bool8::of(truth(xs, all))), no())
            }
        }
        Kind::Mean => dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, mean_of::<T>), no()),
        Kind::Var | Kind::Std => {
            let correction = attrs.params().scalar(0).map_or(1.0, Scalar::as_f64);
            let std = kind == Kind::Std;
            dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, |xs| {
                let v = var_of(xs, correction);
                T::store(if std { v.sqrt() } else { v })
            }), no())
        }
        Kind::Logsumexp => {
            dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, |xs| T::store(logsumexp_of(xs))), no())
        }
        Kind::Norm => {
            let p = norm_order(&attrs);
            dispatch!(dtype, floating, T => one::<T, T>(ctx, &a, &dims, |xs| T::store(norm_of(xs, p))), no())
        }
    }
}

/// [`compute_reduce`] a block of groups at a time ([`blocked`]): the same results, in the
/// same order. `None` for a dtype the op does not take.
fn compute_blocked(
    kind: Kind,
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    r: &[bool],
    dtype: DType,
) -> Option<Result<(), String>> {
    let attrs = ctx.attrs;
    Some(match kind {
        Kind::Mean => dispatch!(dtype, floating, T => blocked_mean::<T>(ctx, a, r, true), return None),
        Kind::Sum => dispatch!(dtype, floating, T => blocked_mean::<T>(ctx, a, r, false),
            dispatch!(dtype, integral, T => (|| {
                let v = block_fold::<T, i64>(a, r, 0, |s, v, _| s.wrapping_add(int_of(v)))?;
                emit(ctx, 0, &v)
            })(), return None)),
        Kind::Prod => dispatch!(dtype, floating, T => blocked_prod::<T>(ctx, a, r),
            dispatch!(dtype, integral, T => (|| {
                let v = block_fold::<T, i64>(a, r, 1, |s, v, _| s.wrapping_mul(int_of(v)))?;
                emit(ctx, 0, &v)
            })(), return None)),
        Kind::Amax | Kind::Amin | Kind::Max | Kind::Min | Kind::Argmax | Kind::Argmin => {
            let max = matches!(kind, Kind::Amax | Kind::Max | Kind::Argmax);
            dispatch!(dtype, all, T => (|| {
                let (vals, idx): (Vec<T>, Vec<i64>) = block_extremes::<T>(a, r, max)?.into_iter().unzip();
                emit_extremes(ctx, kind, &vals, &idx)
            })(), return None)
        }
        Kind::Var | Kind::Std => {
            let correction = attrs.params().scalar(0).map_or(1.0, Scalar::as_f64);
            dispatch!(dtype, floating, T => blocked_var::<T>(ctx, a, r, correction, kind == Kind::Std), return None)
        }
        Kind::Logsumexp => dispatch!(dtype, floating, T => blocked_logsumexp::<T>(ctx, a, r), return None),
        Kind::Norm => {
            let p = norm_order(&attrs);
            dispatch!(dtype, floating, T => blocked_norm::<T>(ctx, a, r, p), return None)
        }
        Kind::All | Kind::Any => {
            let all = kind == Kind::All;
            dispatch!(dtype, all, T => (|| {
                let v = block_fold::<T, bool>(a, r, all, |acc, v, _| if all { acc && truthy(v) } else { acc || truthy(v) })?;
                if dtype == DType::U8 {
                    emit(ctx, 0, &v.into_iter().map(u8::from).collect::<Vec<u8>>())
                } else {
                    emit(ctx, 0, &v.into_iter().map(Bool8::of).collect::<Vec<Bool8>>())
                }
            })(), return None)
        }
    })
}

fn blocked_mean<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    r: &[bool],
    mean: bool,
) -> Result<(), String>
where
    T::C: Real,
{
    let n = <T::C as Real>::of(Split::new(a.shape, a.strides, r).len as f64);
    let sums = block_sums::<T>(a, r, |v, _| v)?;
    emit(ctx, 0, &sums.into_iter().map(|s| T::store(if mean { s / n } else { s })).collect::<Vec<T>>())
}

fn blocked_prod<T: Elem>(ctx: &KernelCtx<'_, '_>, a: &Operand<'_>, r: &[bool]) -> Result<(), String>
where
    T::C: Real,
{
    let v = block_fold::<T, T::C>(a, r, <T::C as Real>::of(1.0), |s, v, _| s * v.load())?;
    emit(ctx, 0, &v.into_iter().map(T::store).collect::<Vec<T>>())
}

fn blocked_var<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    r: &[bool],
    correction: f64,
    std: bool,
) -> Result<(), String>
where
    T::C: Real,
{
    let len = Split::new(a.shape, a.strides, r).len as f64;
    let n = <T::C as Real>::of(len);
    let means: Vec<T::C> = block_sums::<T>(a, r, |v, _| v)?.into_iter().map(|s| s / n).collect();
    let ss = block_sums::<T>(a, r, |v, g| {
        let d = v - means[g];
        d * d
    })?;
    let div = <T::C as Real>::of((len - correction).max(0.0));
    emit(
        ctx,
        0,
        &ss.into_iter()
            .map(|s| {
                let v = s / div;
                T::store(if std { v.sqrt() } else { v })
            })
            .collect::<Vec<T>>(),
    )
}

fn blocked_logsumexp<T: Elem>(ctx: &KernelCtx<'_, '_>, a: &Operand<'_>, r: &[bool]) -> Result<(), String>
where
    T::C: Real,
{
    let zero = <T::C as Real>::of(0.0);
    let maxes: Vec<T::C> = block_extremes::<T>(a, r, true)?
        .into_iter()
        .map(|(v, _)| {
            let m = v.load();
            if m.is_infinite() {
                zero
            } else {
                m
            }
        })
        .collect();
    let sums = block_sums::<T>(a, r, |v, g| (v - maxes[g]).exp())?;
    emit(ctx, 0, &sums.into_iter().zip(&maxes).map(|(s, &m)| T::store(s.ln() + m)).collect::<Vec<T>>())
}

fn blocked_norm<T: Elem>(ctx: &KernelCtx<'_, '_>, a: &Operand<'_>, r: &[bool], p: f64) -> Result<(), String>
where
    T::C: Real,
{
    let zero = <T::C as Real>::of(0.0);
    let one = <T::C as Real>::of(1.0);
    let vals: Vec<T::C> = if p == 2.0 {
        block_sums::<T>(a, r, |v, _| v * v)?.into_iter().map(Real::sqrt).collect()
    } else if p == 1.0 {
        block_sums::<T>(a, r, |v, _| v.abs())?
    } else if p == 0.0 {
        block_sums::<T>(a, r, |v, _| if v != zero { one } else { v * v })?
    } else if p.is_infinite() {
        let up = p > 0.0;
        let folded = block_fold::<T, (T::C, bool)>(a, r, (zero, false), |acc, v, i| {
            let c = v.load().abs();
            if acc.0.is_nan() {
                acc
            } else if c.is_nan() || i == 0 || (up && c > acc.0) || (!up && c < acc.0) {
                (c, true)
            } else {
                acc
            }
        })?;
        folded.into_iter().map(|(v, _)| v).collect()
    } else {
        let (pc, inv) = (<T::C as Real>::of(p), <T::C as Real>::of(1.0 / p));
        block_sums::<T>(a, r, |v, _| v.abs().powf(pc))?.into_iter().map(|s| s.powf(inv)).collect()
    };
    emit(ctx, 0, &vals.into_iter().map(T::store).collect::<Vec<T>>())
}

/// Output 0 holds `f` of each group of `a`.
fn one<T: Elem, O: Elem>(
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    dims: &Dims,
    mut f: impl FnMut(&[T]) -> O,
) -> Result<(), String> {
    let out = output(ctx, 0)?;
    let mut vals = room::<O>(out.meta.numel())?;
    for_each_group::<T>(a, &dims.reduced, |xs| vals.push(f(xs)))?;
    write_output(out, 0, None, &vals)
}

/// Outputs 0 and 1 hold the two parts of `f` of each group of `a`.
fn two<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    dims: &Dims,
    mut f: impl FnMut(&[T]) -> (T, i64),
) -> Result<(), String> {
    let (o0, o1) = (output(ctx, 0)?, output(ctx, 1)?);
    let n = o0.meta.numel();
    let (mut vals, mut idx) = (room::<T>(n)?, room::<i64>(n)?);
    for_each_group::<T>(a, &dims.reduced, |xs| {
        let (v, i) = f(xs);
        vals.push(v);
        idx.push(i);
    })?;
    write_output(o0, 0, None, &vals)?;
    write_output(o1, 1, None, &idx)
}

/// The wrapping `i64` sum of `bool` or integer values.
fn int_sum<T: Elem>(xs: &[T]) -> i64 {
    xs.iter().fold(0i64, |s, &v| s.wrapping_add(int_of(v)))
}

/// The wrapping `i64` product of `bool` or integer values, in index order.
fn int_prod<T: Elem>(xs: &[T]) -> i64 {
    xs.iter().fold(1i64, |s, &v| s.wrapping_mul(int_of(v)))
}

/// The product of float values in their compute type, in index order (1 for none).
fn prod_of<T: Elem>(xs: &[T]) -> T::C
where
    T::C: Real,
{
    xs.iter().fold(<T::C as Real>::of(1.0), |s, &v| s * v.load())
}

/// The first extreme (the largest with `max`, else the smallest) and its index; a NaN is
/// the extreme wherever it is (the first NaN), as in PyTorch. `xs` is not empty.
#[inline]
fn extreme<T: Elem>(xs: &[T], max: bool) -> (T, i64) {
    let Some(&first) = xs.first() else {
        // Refused before any compute (`Dims::check_nonempty`).
        return (first_or_zero(), -1);
    };
    let (mut best, mut bv, mut bi) = (first, first.load(), 0usize);
    #[allow(clippy::eq_op)]
    if bv != bv {
        return (best, 0);
    }
    for (i, &v) in xs.iter().enumerate().skip(1) {
        let c = v.load();
        #[allow(clippy::eq_op)]
        if c != c {
            return (v, i as i64);
        }
        if if max { c > bv } else { c < bv } {
            (best, bv, bi) = (v, c, i);
        }
    }
    (best, bi as i64)
}

/// A zero of any stored type (every bit pattern is a value).
fn first_or_zero<T: Elem>() -> T {
    T::narrow(Wide::Int(0))
}

/// The mean of float values: their sum (in the order of `sum_f32`) over their count (NaN
/// for none).
fn mean_of<T: Elem>(xs: &[T]) -> T
where
    T::C: Real,
{
    T::store(sum_of(xs) / <T::C as Real>::of(xs.len() as f64))
}

/// The variance of float values with `correction`: the mean first, then the sum of the
/// squared deviations (both in the order of `sum_f32`) over `max(0, n - correction)`.
pub(super) fn var_of<T: Elem>(xs: &[T], correction: f64) -> T::C
where
    T::C: Real,
{
    let n = xs.len() as f64;
    let mean = sum_of(xs) / <T::C as Real>::of(n);
    let ss = sum_mapped(xs, |v| {
        let d = v - mean;
        d * d
    });
    ss / <T::C as Real>::of((n - correction).max(0.0))
}

/// `log(sum(exp(x)))`, with the maximum taken out first as PyTorch does: `m + log(sum(exp(x
/// - m)))`, where an infinite maximum counts as 0 (so `+inf` gives `+inf`, all `-inf` or no
/// element gives `-inf`) and a NaN gives NaN.
fn logsumexp_of<T: Elem>(xs: &[T]) -> T::C
where
    T::C: Real,
{
    let mut m = <T::C as Real>::NEG_INFINITY;
    for &v in xs {
        let c = v.load();
        if c.is_nan() {
            return c;
        }
        if c > m {
            m = c;
        }
    }
    if m.is_infinite() {
        m = <T::C as Real>::of(0.0);
    }
    sum_mapped(xs, |v| (v - m).exp()).ln() + m
}

/// The vector `p`-norm: `sqrt(sum x²)` for 2, `sum |x|` for 1, `max |x|` for `inf`, `min
/// |x|` for `-inf`, the count of nonzero elements for 0, `(sum |x|^p)^(1/p)` otherwise.
fn norm_of<T: Elem>(xs: &[T], p: f64) -> T::C
where
    T::C: Real,
{
    if p == 2.0 {
        sum_mapped(xs, |v| v * v).sqrt()
    } else if p == 1.0 {
        sum_mapped(xs, Real::abs)
    } else if p.is_infinite() {
        let mut best = xs.first().map_or(<T::C as Real>::of(0.0), |v| v.load().abs());
        for &v in xs {
            let c = v.load().abs();
            if c.is_nan() {
                return c;
            }
            if (p > 0.0 && c > best) || (p < 0.0 && c < best) {
                best = c;
            }
        }
        best
    } else if p == 0.0 {
        sum_mapped(xs, |v| if v != <T::C as Real>::of(0.0) { <T::C as Real>::of(1.0) } else { v * v })
    } else {
        let pc = <T::C as Real>::of(p);
        sum_mapped(xs, |v| v.abs().powf(pc)).powf(<T::C as Real>::of(1.0 / p))
    }
}

// ---- The kernels --------------------------------------------------------------------

macro_rules! reduce_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                $kind.dtypes().list()
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_reduce($op, $kind, inputs, attrs, outputs)
            }

            fn strided(&self) -> bool {
                true
            }

            fn writes_outputs(&self) -> bool {
                true
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                compute_reduce($op, $kind, ctx)
            }
        }
    };
}

reduce_kernel!(
    /// `mean`: the sum along the dims over the count (floating dtypes; NaN for no
    /// elements).
    MeanKernel, "mean", Kind::Mean
);
reduce_kernel!(
    /// `prod`: the product along the dims in index order (1 for none); every dtype, `bool`
    /// and integers in wrapping `i64` (the output is `i64`).
    ProdKernel, "prod", Kind::Prod
);
reduce_kernel!(
    /// `amax`: the largest element along the dims; NaN if any is NaN; every dtype; an empty
    /// reduced dimension is refused.
    AmaxKernel, "amax", Kind::Amax
);
reduce_kernel!(
    /// `amin`: the smallest element along the dims (as `amax`).
    AminKernel, "amin", Kind::Amin
);
reduce_kernel!(
    /// `max` along dims: two outputs, the largest values and the `i64` index of the first of
    /// each in row-major order of the reduced dims (the first NaN where there is one).
    MaxKernel, "max", Kind::Max
);
reduce_kernel!(
    /// `min` along dims: the smallest values and their first indices (as `max`).
    MinKernel, "min", Kind::Min
);
reduce_kernel!(
    /// `argmax`: the `i64` index of the first largest element along the dims (row-major
    /// over the reduced dims; over the flattened tensor when every dim is reduced); numeric
    /// dtypes.
    ArgmaxKernel, "argmax", Kind::Argmax
);
reduce_kernel!(
    /// `argmin`: the index of the first smallest element (as `argmax`).
    ArgminKernel, "argmin", Kind::Argmin
);
reduce_kernel!(
    /// `all`: whether every element along the dims is nonzero (`true` for none); `bool`
    /// output (`u8` for a `u8` input, as PyTorch).
    AllKernel, "all", Kind::All
);
reduce_kernel!(
    /// `any`: whether some element along the dims is nonzero (`false` for none).
    AnyKernel, "any", Kind::Any
);
reduce_kernel!(
    /// `var`: the variance along the dims with `scalars[0]` as the correction (default 1):
    /// the sum of squared deviations from the mean over `max(0, n - correction)`.
    VarKernel, "var", Kind::Var
);
reduce_kernel!(
    /// `std`: the square root of `var`.
    StdKernel, "std", Kind::Std
);
reduce_kernel!(
    /// `logsumexp`: `log(sum(exp(x)))` along the dims, the maximum taken out first.
    LogsumexpKernel, "logsumexp", Kind::Logsumexp
);
reduce_kernel!(
    /// `norm`: the vector `p`-norm along the dims, `p` in `scalars[0]` (default 2; `inf`,
    /// `-inf`, 0 and any other real).
    NormKernel, "norm", Kind::Norm
);

#[path = "reduce_fast.rs"]
mod fast;

#[cfg(test)]
#[path = "reduce_dims_tests.rs"]
mod tests;
