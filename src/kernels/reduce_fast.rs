//! The vectorised paths of the reductions along dims for `f32` and `f64`, each giving the
//! bits of the general path (`kernels::reduce_dims`) for the same values, compiled for
//! AVX-512, AVX2 and the baseline and picked at run time (`kernels::vmath`):
//!
//! - **Columns**: a reduction whose innermost kept dimensions lie one after another (the
//!   input seen as `[outer, rows, k]`, `rows` the reduced elements, `sum(dim=0)` of a
//!   matrix the common case) adds each row of `k` values into `k` accumulators, one per
//!   output element: every load is contiguous and the `k` dependency chains are
//!   independent. Each accumulator still takes its group's elements in row-major order of
//!   the reduced dims, in `sum`'s order: one at a time up to 4096 rows; above, 32
//!   accumulators per output element (row `i` into accumulator `i mod 32`, as `sum_f32`'s
//!   partial sums), combined by its tree, then the remaining rows. Products multiply in
//!   index order, and the extremes keep the first best value (the first NaN) per column.
//! - **Rows**: the extremes of groups that lie one after another (`amax(dim=1)` of a
//!   matrix): the extreme value over 32 lanes (NaN found apart), then, where the index is
//!   wanted or the value is a zero or NaN, the first element holding it. Which value is
//!   largest, and whether a NaN is there, does not depend on the order of the
//!   comparisons; the index (and so the sign of a zero extreme) comes from the second pass
//!   in index order.

use std::slice;

use super::super::reduce::{LANES, SEQUENTIAL_SUM_MAX};
use super::super::vmath::widest;
use super::{emit, emit_extremes, offsets, room, Dims, Kind, Real};
use crate::kernels::dtype::{Elem, Ring};
use crate::kernels::iter::Operand;
use crate::vm::{DType, KernelCtx};

/// The map applied to each element before a column sum, with the column's parameter `m`.
#[derive(Clone, Copy)]
pub(super) enum Map<C> {
    /// `v`.
    Id,
    /// `(v - m)²`.
    SqDiff,
    /// `exp(v - m)`.
    ExpDiff,
    /// `v²`.
    Sq,
    /// `|v|`.
    Abs,
    /// 1 for a nonzero `v` (NaN is), else `v²` (zero).
    Nonzero,
    /// `|v|^p`.
    Pow(C),
}

/// The bytes of accumulators a column pass keeps per chunk of columns (in L1 for one
/// accumulator per column, in L2 for 32).
const CHUNK_BYTES: usize = 16 << 10;

/// The fewest contiguous columns the column paths take; narrower inputs read a block of
/// groups at a time as before.
const MIN_COLUMNS: usize = 8;

/// The shortest groups the row path takes.
const MIN_ROW: usize = 32;

/// The column sums of `f(x, param[j])` over `rows` (each holding `out.len()` columns)
/// into `out`, in `sum`'s order (module docs). `scratch` holds the 32 accumulators of a
/// chunk of columns where there are more than [`SEQUENTIAL_SUM_MAX`] rows.
#[inline(always)]
fn col_sums_by<C: Ring>(rows: &[&[C]], param: &[C], scratch: &mut [C], out: &mut [C], f: impl Fn(C, C) -> C) {
    let k = out.len();
    let width = (CHUNK_BYTES / std::mem::size_of::<C>()).max(1);
    let n = rows.len();
    if n <= SEQUENTIAL_SUM_MAX {
        for c0 in (0..k).step_by(width) {
            let c1 = k.min(c0 + width);
            let (acc, p) = (&mut out[c0..c1], &param[c0..c1]);
            acc.fill(C::ZERO);
            for row in rows {
                for ((a, &v), &m) in acc.iter_mut().zip(&row[c0..c1]).zip(p) {
                    *a = a.add(f(v, m));
                }
            }
        }
        return;
    }
    let whole = n / LANES * LANES;
    let width = (scratch.len() / LANES).max(1);
    for c0 in (0..k).step_by(width) {
        let c1 = k.min(c0 + width);
        let w = c1 - c0;
        let lanes = &mut scratch[..LANES * w];
        lanes.fill(C::ZERO);
        let p = &param[c0..c1];
        for (i, row) in rows[..whole].iter().enumerate() {
            let lane = &mut lanes[(i % LANES) * w..(i % LANES + 1) * w];
            for ((a, &v), &m) in lane.iter_mut().zip(&row[c0..c1]).zip(p) {
                *a = a.add(f(v, m));
            }
        }
        // `sum_f32`'s tree: lane `l` += lane `l + h` for `h` = 16, 8, 4, 2, 1.
        let mut half = LANES / 2;
        while half > 0 {
            let (lo, hi) = lanes.split_at_mut(half * w);
            for (a, &b) in lo.iter_mut().zip(&hi[..half * w]) {
                *a = a.add(b);
            }
            half /= 2;
        }
        let acc = &mut out[c0..c1];
        acc.copy_from_slice(&lanes[..w]);
        for row in &rows[whole..] {
            for ((a, &v), &m) in acc.iter_mut().zip(&row[c0..c1]).zip(p) {
                *a = a.add(f(v, m));
            }
        }
    }
}

/// [`col_sums_by`] with `map`'s function, one loop per map.
#[inline(always)]
fn col_sums<C: Real>(rows: &[&[C]], map: Map<C>, param: &[C], scratch: &mut [C], out: &mut [C]) {
    let (zero, one) = (C::of(0.0), C::of(1.0));
    match map {
        Map::Id => col_sums_by(rows, param, scratch, out, |v, _| v),
        Map::SqDiff => col_sums_by(rows, param, scratch, out, |v, m| {
            let d = v - m;
            d * d
        }),
        Map::ExpDiff => col_sums_by(rows, param, scratch, out, |v, m| (v - m).exp()),
        Map::Sq => col_sums_by(rows, param, scratch, out, |v, _| v * v),
        Map::Abs => col_sums_by(rows, param, scratch, out, |v, _| v.abs()),
        Map::Nonzero => col_sums_by(rows, param, scratch, out, |v, _| if v != zero { one } else { v * v }),
        Map::Pow(p) => col_sums_by(rows, param, scratch, out, |v, _| v.abs().powf(p)),
    }
}

/// The column products over `rows` into `out`, in index order from 1.
#[inline(always)]
fn col_prod<C: Real>(rows: &[&[C]], out: &mut [C]) {
    let k = out.len();
    let width = (CHUNK_BYTES / std::mem::size_of::<C>()).max(1);
    for c0 in (0..k).step_by(width) {
        let c1 = k.min(c0 + width);
        let acc = &mut out[c0..c1];
        acc.fill(C::of(1.0));
        for row in rows {
            for (a, &v) in acc.iter_mut().zip(&row[c0..c1]) {
                *a = *a * v;
            }
        }
    }
}

/// Whether `c` replaces `best`: strictly better (`better`), or the first NaN.
#[inline(always)]
#[allow(clippy::eq_op)]
fn replaces<C: Real>(c: C, best: C, better: impl Fn(C, C) -> bool) -> bool {
    better(c, best) | ((c != c) & (best == best))
}

/// The first extreme of each column over `rows` (`rows` not empty) into `vals`, and its row
/// into `idx` unless `idx` is empty; `better(c, b)` says whether `c` is strictly better.
#[inline(always)]
fn col_extremes_by<C: Real>(
    rows: &[&[C]],
    vals: &mut [C],
    idx: &mut [i64],
    better: impl Fn(C, C) -> bool + Copy,
) {
    let k = vals.len();
    // The values, and the indices where kept, within the chunk's bytes.
    let per_column = std::mem::size_of::<C>() + if idx.is_empty() { 0 } else { 8 };
    let width = (CHUNK_BYTES / per_column).max(1);
    let Some((first, rest)) = rows.split_first() else { return };
    for c0 in (0..k).step_by(width) {
        let c1 = k.min(c0 + width);
        let best = &mut vals[c0..c1];
        best.copy_from_slice(&first[c0..c1]);
        if idx.is_empty() {
            for row in rest {
                for (b, &c) in best.iter_mut().zip(&row[c0..c1]) {
                    *b = if replaces(c, *b, better) { c } else { *b };
                }
            }
        } else {
            let at = &mut idx[c0..c1];
            at.fill(0);
            for (i, row) in rest.iter().enumerate() {
                let i = i as i64 + 1;
                for ((b, a), &c) in best.iter_mut().zip(at.iter_mut()).zip(&row[c0..c1]) {
                    let r = replaces(c, *b, better);
                    *b = if r { c } else { *b };
                    *a = if r { i } else { *a };
                }
            }
        }
    }
}

/// [`col_extremes_by`] for the largest (`max`) or the smallest values.
#[inline(always)]
fn col_extremes<C: Real>(rows: &[&[C]], max: bool, vals: &mut [C], idx: &mut [i64]) {
    if max {
        col_extremes_by(rows, vals, idx, |c, b| c > b)
    } else {
        col_extremes_by(rows, vals, idx, |c, b| c < b)
    }
}

/// The first extreme of `xs` (not empty) and its index (where `index`, or where the value
/// alone does not say which element it is: a NaN, a zero), as `reduce_dims::extreme`.
/// First the extreme over 32 lanes, NaN aside, with a sum of `x - x` per lane that only
/// a NaN or an infinity makes NaN; where it is, again with a NaN sticking. Which value is
/// extreme and whether there is a NaN does not depend on the order. Then the first element
/// equal to it (or the first NaN) in index order, which gives a zero extreme its sign.
#[inline(always)]
#[allow(clippy::eq_op)]
fn row_extreme_by<C: Real>(xs: &[C], index: bool, better: impl Fn(C, C) -> bool + Copy) -> (C, i64) {
    let Some(&first) = xs.first() else { return (C::of(0.0), -1) };
    let zero = C::of(0.0);
    let mut acc = [first; LANES];
    let mut poison = [zero; LANES];
    let groups = xs.chunks_exact(LANES);
    let tail = groups.remainder();
    for g in groups.clone() {
        for ((a, p), &v) in acc.iter_mut().zip(poison.iter_mut()).zip(g) {
            *a = if better(v, *a) { v } else { *a };
            *p = *p + (v - v);
        }
    }
    if poison.iter().any(|&p| p != zero) {
        acc = [first; LANES];
        for g in groups {
            for (a, &v) in acc.iter_mut().zip(g) {
                *a = if replaces(v, *a, better) { v } else { *a };
            }
        }
    }
    let m = acc.iter().chain(tail).fold(first, |m, &v| if replaces(v, m, better) { v } else { m });
    let nan = m != m;
    if !index && !nan && m != zero {
        return (m, -1);
    }
    let hit = |v: C| if nan { v.is_nan() } else { v == m };
    let mut base = 0;
    for g in xs.chunks(LANES) {
        if g.iter().fold(false, |any, &v| any | hit(v)) {
            if let Some(i) = g.iter().position(|&v| hit(v)) {
                return (g[i], (base + i) as i64);
            }
        }
        base += g.len();
    }
    (m, -1)
}

/// [`row_extreme_by`] for the largest (`max`) or the smallest value.
#[inline(always)]
fn row_extreme<C: Real>(xs: &[C], max: bool, index: bool) -> (C, i64) {
    if max {
        row_extreme_by(xs, index, |c, b| c > b)
    } else {
        row_extreme_by(xs, index, |c, b| c < b)
    }
}

/// The compute types with vectorised loops: each loop in its widest version.
pub(super) trait Lane: Real + Elem<C = Self> + Default {
    /// [`col_sums`].
    fn sums(rows: &[&[Self]], map: Map<Self>, param: &[Self], scratch: &mut [Self], out: &mut [Self]);
    /// [`col_prod`].
    fn prod(rows: &[&[Self]], out: &mut [Self]);
    /// [`col_extremes`].
    fn extremes(rows: &[&[Self]], max: bool, vals: &mut [Self], idx: &mut [i64]);
    /// [`row_extreme`] into `out`.
    fn row_extreme(xs: &[Self], max: bool, index: bool, out: &mut (Self, i64));
}

macro_rules! lane {
    ($t:ident, $sums:ident, $prod:ident, $ext:ident, $row:ident) => {
        widest!(
            /// [`col_sums`] in the widest version.
            fn $sums(rows: &[&[$t]], map: Map<$t>, param: &[$t], scratch: &mut [$t], out: &mut [$t]) {
                col_sums(rows, map, param, scratch, out)
            }
        );
        widest!(
            /// [`col_prod`] in the widest version.
            fn $prod(rows: &[&[$t]], out: &mut [$t]) {
                col_prod(rows, out)
            }
        );
        widest!(
            /// [`col_extremes`] in the widest version.
            fn $ext(rows: &[&[$t]], max: bool, vals: &mut [$t], idx: &mut [i64]) {
                col_extremes(rows, max, vals, idx)
            }
        );
        widest!(
            /// [`row_extreme`] in the widest version.
            fn $row(xs: &[$t], max: bool, index: bool, out: &mut ($t, i64)) {
                *out = row_extreme(xs, max, index)
            }
        );

        impl Lane for $t {
            fn sums(
                rows: &[&[Self]],
                map: Map<Self>,
                param: &[Self],
                scratch: &mut [Self],
                out: &mut [Self],
            ) {
                $sums(rows, map, param, scratch, out)
            }
            fn prod(rows: &[&[Self]], out: &mut [Self]) {
                $prod(rows, out)
            }
            fn extremes(rows: &[&[Self]], max: bool, vals: &mut [Self], idx: &mut [i64]) {
                $ext(rows, max, vals, idx)
            }
            fn row_extreme(xs: &[Self], max: bool, index: bool, out: &mut (Self, i64)) {
                $row(xs, max, index, out)
            }
        }
    };
}
lane!(f32, col_sums_f32, col_prod_f32, col_extremes_f32, row_extreme_f32);
lane!(f64, col_sums_f64, col_prod_f64, col_extremes_f64, row_extreme_f64);

// ---- Layouts ------------------------------------------------------------------------

/// An input seen as `[outer, rows, k]`: `outer` the kept dimensions before the innermost
/// dense run of kept ones, `rows` the reduced elements (row-major order of the reduced
/// dims), `k` the elements of that run, which lie one after another.
pub(super) struct Columns {
    /// The offset (in elements) of each outer index's first element, in row-major order.
    pub(super) outer: Vec<isize>,
    /// The offset of each row of a group from the group's first, in row-major order of the
    /// reduced dims.
    pub(super) rows: Vec<isize>,
    /// The contiguous columns of a row.
    pub(super) k: usize,
}

impl Columns {
    /// `a` reduced along `reduced` as columns, where its innermost kept dims lie one after
    /// another for at least [`MIN_COLUMNS`] elements and some dimension of size above 1 is
    /// reduced; `None` otherwise (and for empty inputs).
    pub(super) fn new(a: &Operand<'_>, reduced: &[bool]) -> Option<Result<Columns, String>> {
        // Dimensions of size 1 change neither the order nor the addresses.
        let dims: Vec<(usize, isize, bool)> = a
            .shape
            .iter()
            .zip(a.strides)
            .zip(reduced)
            .filter(|((&n, _), _)| n != 1)
            .map(|((&n, &s), &r)| (n, s, r))
            .collect();
        if dims.iter().any(|d| d.0 == 0) || !dims.iter().any(|d| d.2) {
            return None;
        }
        let mut k = 1usize;
        let mut run = dims.len();
        while run > 0 && !dims[run - 1].2 && dims[run - 1].1 == k as isize {
            k *= dims[run - 1].0;
            run -= 1;
        }
        if k < MIN_COLUMNS {
            return None;
        }
        let pick = |want: bool| -> (Vec<usize>, Vec<isize>) {
            dims[..run].iter().filter(|d| d.2 == want).map(|d| (d.0, d.1)).unzip()
        };
        let (outer_shape, outer_strides) = pick(false);
        let (rows_shape, rows_strides) = pick(true);
        Some((|| {
            Ok(Columns {
                outer: offsets(&outer_shape, &outer_strides)?,
                rows: offsets(&rows_shape, &rows_strides)?,
                k,
            })
        })())
    }

    /// Call `f(o, rows)` for each outer index `o` with the slices of its group's rows.
    fn for_each<C>(&self, a: &Operand<'_>, mut f: impl FnMut(usize, &[&[C]])) -> Result<(), String> {
        let mut rows: Vec<&[C]> = room(self.rows.len())?;
        let first = a.first.cast_const().cast::<C>();
        for (o, &start) in self.outer.iter().enumerate() {
            rows.clear();
            rows.extend(self.rows.iter().map(|&r| {
                // SAFETY: the `k` elements from element `start + r` of the checked operand
                // lie one after another (`Columns::new`); no output is written while the
                // slices live.
                unsafe { slice::from_raw_parts(first.wrapping_offset(start + r), self.k) }
            }));
            f(o, &rows);
        }
        Ok(())
    }

    /// The column sums of `map` of each group, with the parameters `params` (one per
    /// output element; zeros where not given).
    fn sums<C: Lane>(&self, a: &Operand<'_>, map: Map<C>, params: Option<&[C]>) -> Result<Vec<C>, String> {
        let total = self.outer.len() * self.k;
        let mut out = room::<C>(total)?;
        out.resize(total, C::ZERO);
        let mut acc = apart::<C>(self.k)?;
        let mut scratch = room::<C>(0)?;
        if self.rows.len() > SEQUENTIAL_SUM_MAX {
            let n = LANES * (CHUNK_BYTES * 8 / LANES / std::mem::size_of::<C>()).min(self.k);
            scratch = room(n)?;
            scratch.resize(n, C::ZERO);
        }
        let k = self.k;
        let zeros = if params.is_some() { Vec::new() } else { vec![C::ZERO; k] };
        self.for_each::<C>(a, |o, rows| {
            let p = params.map_or(&zeros[..], |p| &p[o * k..(o + 1) * k]);
            let acc = window(&mut acc, k, rows[0].as_ptr().cast());
            C::sums(rows, map, p, &mut scratch, acc);
            out[o * k..(o + 1) * k].copy_from_slice(acc);
        })?;
        Ok(out)
    }
}

/// The bytes of a page: loads whose address matches that of an earlier store in its low 12
/// bits wait for it (4K aliasing), which accumulators at the rows' offset in the page would
/// do at every element of a row.
const PAGE: usize = 4096;

/// Room for `k` accumulators placed by [`window`].
fn apart<C: Copy + Default>(k: usize) -> Result<Vec<C>, String> {
    let n = k + PAGE / std::mem::size_of::<C>();
    let mut v = room::<C>(n)?;
    v.resize(n, C::default());
    Ok(v)
}

/// `k` elements of `buf` ([`apart`]) that start half a page (modulo a page) from `near`.
fn window<C>(buf: &mut [C], k: usize, near: *const u8) -> &mut [C] {
    let size = std::mem::size_of::<C>();
    let at = buf.as_ptr() as usize;
    let skip = (near as usize).wrapping_add(PAGE / 2).wrapping_sub(at) % PAGE / size;
    &mut buf[skip..skip + k]
}

/// [`Columns::sums`] with no parameter.
fn plain<C: Lane>(c: &Columns, a: &Operand<'_>, map: Map<C>) -> Result<Vec<C>, String> {
    c.sums(a, map, None)
}

/// Output 0 holds `vals` stored.
fn store<C: Lane>(ctx: &KernelCtx<'_, '_>, vals: impl Iterator<Item = C>) -> Result<(), String> {
    emit(ctx, 0, &vals.collect::<Vec<C>>())
}

/// `kind` along `dims` of `a` through the vectorised paths, where `a` is `f32` or `f64` and
/// a path takes its layout; `None` leaves it to the general path.
pub(super) fn reduce(
    kind: Kind,
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    dims: &Dims,
) -> Option<Result<(), String>> {
    #[cfg(test)]
    if tests::GENERAL_ONLY.with(std::cell::Cell::get) {
        return None;
    }
    let done = match a.dtype {
        DType::F32 => reduce_as::<f32>(kind, ctx, a, dims),
        DType::F64 => reduce_as::<f64>(kind, ctx, a, dims),
        _ => None,
    };
    #[cfg(test)]
    if done.is_some() {
        tests::TAKEN.with(|t| t.set(t.get() + 1));
    }
    done
}

fn reduce_as<C: Lane>(
    kind: Kind,
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    dims: &Dims,
) -> Option<Result<(), String>> {
    let extreme =
        matches!(kind, Kind::Amax | Kind::Amin | Kind::Max | Kind::Min | Kind::Argmax | Kind::Argmin);
    if extreme {
        if let Some(r) = rows_extremes::<C>(kind, ctx, a, dims) {
            return Some(r);
        }
    }
    let p = super::norm_order(&ctx.attrs);
    if matches!(kind, Kind::All | Kind::Any) || (kind == Kind::Norm && p.is_infinite()) {
        return None;
    }
    let c = match Columns::new(a, &dims.reduced)? {
        Ok(c) => c,
        Err(e) => return Some(Err(e)),
    };
    Some(columns::<C>(kind, ctx, a, &c, p))
}

/// `kind` (not `all`, `any` or an infinite norm) through the column path.
fn columns<C: Lane>(
    kind: Kind,
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    c: &Columns,
    p: f64,
) -> Result<(), String> {
    let n = C::of(c.rows.len() as f64);
    let k = c.k;
    match kind {
        Kind::Sum => store(ctx, plain::<C>(c, a, Map::Id)?.into_iter()),
        Kind::Mean => store(ctx, plain::<C>(c, a, Map::Id)?.into_iter().map(|s| s / n)),
        Kind::Var | Kind::Std => {
            let correction = ctx.attrs.params().scalar(0).map_or(1.0, crate::vm::Scalar::as_f64);
            let means: Vec<C> = plain::<C>(c, a, Map::Id)?.into_iter().map(|s| s / n).collect();
            let ss = c.sums(a, Map::SqDiff, Some(&means))?;
            let div = C::of((c.rows.len() as f64 - correction).max(0.0));
            let std = kind == Kind::Std;
            store(
                ctx,
                ss.into_iter().map(|s| {
                    let v = s / div;
                    if std {
                        v.sqrt()
                    } else {
                        v
                    }
                }),
            )
        }
        Kind::Logsumexp => {
            let (maxes, _) = col_extremes_all::<C>(c, a, true, false)?;
            let zero = C::of(0.0);
            let maxes: Vec<C> = maxes.into_iter().map(|m| if m.is_infinite() { zero } else { m }).collect();
            let sums = c.sums(a, Map::ExpDiff, Some(&maxes))?;
            store(ctx, sums.into_iter().zip(&maxes).map(|(s, &m)| s.ln() + m))
        }
        Kind::Norm => {
            if p == 2.0 {
                store(ctx, plain::<C>(c, a, Map::Sq)?.into_iter().map(Real::sqrt))
            } else if p == 1.0 {
                store(ctx, plain::<C>(c, a, Map::Abs)?.into_iter())
            } else if p == 0.0 {
                store(ctx, plain::<C>(c, a, Map::Nonzero)?.into_iter())
            } else {
                let inv = C::of(1.0 / p);
                store(ctx, plain::<C>(c, a, Map::Pow(C::of(p)))?.into_iter().map(|s| s.powf(inv)))
            }
        }
        Kind::Prod => {
            let mut out = room::<C>(c.outer.len() * k)?;
            out.resize(c.outer.len() * k, C::ZERO);
            let mut acc = apart::<C>(k)?;
            c.for_each::<C>(a, |o, rows| {
                let acc = window(&mut acc, k, rows[0].as_ptr().cast());
                C::prod(rows, acc);
                out[o * k..(o + 1) * k].copy_from_slice(acc);
            })?;
            emit(ctx, 0, &out)
        }
        Kind::Amax | Kind::Amin | Kind::Max | Kind::Min | Kind::Argmax | Kind::Argmin => {
            let max = matches!(kind, Kind::Amax | Kind::Max | Kind::Argmax);
            let index = !matches!(kind, Kind::Amax | Kind::Amin);
            let (vals, idx) = col_extremes_all::<C>(c, a, max, index)?;
            emit_extremes(ctx, kind, &vals, &idx)
        }
        Kind::All | Kind::Any => Err(format!("{kind:?} has no column path")),
    }
}

/// The first extreme of every column group, and its index where `index`.
fn col_extremes_all<C: Lane>(
    c: &Columns,
    a: &Operand<'_>,
    max: bool,
    index: bool,
) -> Result<(Vec<C>, Vec<i64>), String> {
    let total = c.outer.len() * c.k;
    let mut vals = room::<C>(total)?;
    vals.resize(total, C::ZERO);
    let n = if index { total } else { 0 };
    let mut idx = room::<i64>(n)?;
    idx.resize(n, 0);
    let k = c.k;
    let (mut best, mut at) = (apart::<C>(k)?, apart::<i64>(if index { k } else { 0 })?);
    c.for_each::<C>(a, |o, rows| {
        let near = rows[0].as_ptr().cast::<u8>();
        let best = window(&mut best, k, near);
        let at = window(&mut at, if index { k } else { 0 }, near.wrapping_add(PAGE / 4));
        C::extremes(rows, max, best, at);
        vals[o * k..(o + 1) * k].copy_from_slice(best);
        if index {
            idx[o * k..(o + 1) * k].copy_from_slice(at);
        }
    })?;
    Ok((vals, idx))
}

/// The extremes of groups that lie one after another, at least [`MIN_ROW`] long, through
/// the row path; `None` for other layouts.
fn rows_extremes<C: Lane>(
    kind: Kind,
    ctx: &KernelCtx<'_, '_>,
    a: &Operand<'_>,
    dims: &Dims,
) -> Option<Result<(), String>> {
    let s = super::Split::new(a.shape, a.strides, &dims.reduced);
    if s.len < MIN_ROW || s.groups == 0 || !super::dense_groups(&s) {
        return None;
    }
    let max = matches!(kind, Kind::Amax | Kind::Max | Kind::Argmax);
    let index = !matches!(kind, Kind::Amax | Kind::Amin);
    Some((|| {
        let mut vals = room::<C>(s.groups)?;
        let mut idx = room::<i64>(s.groups)?;
        super::for_each_group::<C>(a, &dims.reduced, |xs| {
            let mut e = (C::ZERO, 0);
            C::row_extreme(xs, max, index, &mut e);
            vals.push(e.0);
            idx.push(e.1);
        })?;
        emit_extremes(ctx, kind, &vals, &idx)
    })())
}

#[cfg(test)]
#[path = "reduce_fast_tests.rs"]
mod tests;
