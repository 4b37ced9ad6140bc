//! Advanced indexing: `index` (`x[idx]` with index tensors), `index_put` (`x[idx] = v`,
//! with or without accumulation) and `nonzero`, after PyTorch's ops of those names.
//!
//! `index` and `index_put` take `k` index tensors (`i64` or `i32`), broadcast together to
//! one shape `B`, that index `k` consecutive dimensions of `x` from dimension `d0`
//! (`ints = [d0]`; `index_put`: `ints = [d0, accumulate, strict]`, strict 1 refusing
//! negative indices, as PyTorch's `index_copy` does). The indexed result has shape
//! `x.shape[..d0] + B + x.shape[d0 + k..]`. A negative index counts from the end of its
//! dimension, as in PyTorch; one out of range after that fails the call when it runs,
//! before anything is written, with a message naming the dimension, the index and the
//! size. The front ends turn `bool` masks into index tensors (`nonzero`), and index
//! tensors that are not adjacent in `x[...]` into adjacent ones by a permuted view, as
//! PyTorch does.
//!
//! `index_put` writes its values in row-major order of the indexed shape: where indices
//! repeat, the last write wins, or (with accumulate) the values are added in that order,
//! each addition rounded as it is stored, as PyTorch's CPU kernel does.
//!
//! `nonzero`'s output has a size known only from the input's values: the caller counts
//! them first (a read, `eager::advanced`) and gives the output, `i64[n, rank]`; the kernel
//! fails if the input holds another count.

use smallvec::{smallvec, SmallVec};

use super::dtype::{dispatch, Elem, Ring, Wide};
use super::index::{at, for_each_index, read_index, stage_if_shared, Idx};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{copy_elements, input, output};
use super::{count_error, spec_of};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta};

/// The broadcast shape of the index tensors `idx`, or a message naming the two that do
/// not broadcast.
fn index_shape(op: &str, idx: &[&TensorMeta]) -> Result<Shape, String> {
    let mut b = Shape::new();
    for (j, m) in idx.iter().enumerate() {
        super::index::index_dtype(op, &format!("index tensor {j}"), m)?;
        let rank = b.len().max(m.shape.len());
        let mut next = Shape::with_capacity(rank);
        for d in 0..rank {
            let x = (d + b.len()).checked_sub(rank).map_or(1, |i| b[i]);
            let y = (d + m.shape.len()).checked_sub(rank).map_or(1, |i| m.shape[i]);
            next.push(match (x, y) {
                _ if x == y => x,
                (1, _) => y,
                (_, 1) => x,
                _ => {
                    return Err(format!(
                        "{op}: shape mismatch: index tensor {j} of shape {:?} does not broadcast with the \
                         others' shape {:?}",
                        m.shape.as_slice(),
                        b.as_slice()
                    ))
                }
            });
        }
        b = next;
    }
    Ok(b)
}

/// The indexed shape of `x` (module docs) and the checked `d0`, `k`.
fn indexed_shape(
    op: &str,
    x: &TensorMeta,
    idx: &[&TensorMeta],
    attrs: &Attrs,
) -> Result<(Shape, usize), String> {
    let k = idx.len();
    if k == 0 {
        return Err(format!("{op}: expected at least one index tensor"));
    }
    let d0 = attrs.params().int_or(0, 0);
    if d0 < 0 || d0 as usize + k > x.shape.len() {
        return Err(format!(
            "{op}: {k} index tensors from dimension {d0} do not fit a tensor of {} dimensions ({})",
            x.shape.len(),
            x.describe()
        ));
    }
    let d0 = d0 as usize;
    let b = index_shape(op, idx)?;
    let mut shape: Shape = x.shape[..d0].iter().copied().collect();
    shape.extend(b.iter().copied());
    shape.extend(x.shape[d0 + k..].iter().copied());
    Ok((shape, d0))
}

/// The element offsets into `x` (in elements, along dimensions `d0..d0 + k`) of every
/// position of the index shape `b`, row-major, each index checked (and a negative one
/// counted from the end, with `wrap`).
fn index_offsets(
    op: &str,
    x: &Operand<'_>,
    idx: &[Operand<'_>],
    d0: usize,
    b: &[usize],
    wrap: bool,
) -> Result<Vec<isize>, String> {
    // Each index tensor's strides broadcast to `b` (aligned at the last dimension).
    let strides: Vec<SmallVec<[isize; 8]>> = idx
        .iter()
        .map(|t| {
            let lead = b.len() - t.shape.len();
            (0..b.len())
                .map(|d| if d < lead || t.shape[d - lead] == 1 { 0 } else { t.strides[d - lead] })
                .collect()
        })
        .collect();
    let mut offs = Vec::with_capacity(b.iter().product());
    for_each_index(b, |p| {
        let mut off = 0isize;
        for (j, t) in idx.iter().enumerate() {
            let e: isize = p.iter().zip(&strides[j]).map(|(&i, &s)| i as isize * s).sum();
            let ptr = t.first.wrapping_offset(e * t.dtype.size() as isize);
            // SAFETY: `p` is inside `b`, to which the index tensor broadcasts: the address
            // is one of its elements, inside its checked storage.
            let v = unsafe { read_index(ptr, t.dtype) };
            let d = d0 + j;
            let size = x.shape[d];
            let w = if v < 0 && wrap { v.wrapping_add(size as i64) } else { v };
            if w < 0 || w as u64 >= size as u64 {
                return Err(super::index::out_of_range(op, v, d, size));
            }
            off += w as isize * x.strides[d];
        }
        offs.push(off);
        Ok(())
    })?;
    Ok(offs)
}

/// One row of the indexed shape (its last dimension): where each of its elements lies in
/// `x`, as an offset in elements from `x.first`.
#[derive(Clone, Copy)]
enum Row<'o> {
    /// The last dimension is one of `x`'s own: `base + j * step`.
    Strided { base: isize, step: isize },
    /// The last dimension is the index tensors' last: `base + offs[j]`.
    Gathered { base: isize, offs: &'o [isize] },
}

impl Row<'_> {
    #[inline(always)]
    fn at(self, j: usize) -> isize {
        match self {
            Row::Strided { base, step } => base + j as isize * step,
            Row::Gathered { base, offs } => base + offs[j],
        }
    }
}

/// Call `f(row, n, where)` for every row of the indexed shape `shape` in row-major order:
/// `row` is the position of its first element (last coordinate 0), `n` its length, and
/// `where` says where its elements lie in `x` (a 0-d shape is one row of one element).
fn walk(
    x: &Operand<'_>,
    shape: &[usize],
    d0: usize,
    k: usize,
    nb: usize,
    offs: &[isize],
    mut f: impl FnMut(&[usize], usize, Row<'_>),
) -> Result<(), String> {
    if shape.is_empty() {
        f(&[], 1, Row::Gathered { base: 0, offs });
        return Ok(());
    }
    let last = shape.len() - 1;
    let bstrides = crate::vm::contiguous_strides(&shape[d0..d0 + nb]);
    let mut row: Idx = smallvec![0; shape.len()];
    for_each_index(&shape[..last], |p| {
        row[..last].copy_from_slice(p);
        let i = &row[..];
        let mut base = 0isize;
        for (&c, &st) in i[..d0].iter().zip(x.strides) {
            base += c as isize * st;
        }
        let bflat: isize = i[d0..d0 + nb].iter().zip(bstrides.iter()).map(|(&a, &s)| a as isize * s).sum();
        let n = shape[last];
        let r = if d0 + nb <= last {
            // The last dimension is `x`'s last: the suffix.
            base += offs[bflat as usize];
            for (q, &c) in i[d0 + nb..].iter().enumerate() {
                base += c as isize * x.strides[d0 + k + q];
            }
            Row::Strided { base, step: x.strides[x.shape.len() - 1] }
        } else {
            Row::Gathered { base, offs: &offs[bflat as usize..bflat as usize + n] }
        };
        f(i, n, r);
        Ok(())
    })
}

/// `index`: inputs `x` (any dtype) and `k` index tensors; `ints = [d0]`. The output, of
/// the indexed shape and `x`'s dtype, holds `x`'s elements at the indices (module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexKernel;

impl OpKernel for IndexKernel {
    fn name(&self) -> &'static str {
        "index"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        let (x, idx) = inputs.split_first().ok_or_else(|| count_error(2, 0))?;
        let (shape, _) = indexed_shape("index", x, idx, attrs)?;
        outputs.push(OutSpec { shape, dtype: x.dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: SmallVec<[&TensorMeta; 4]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let (shape, d0) = indexed_shape("index", metas[0], &metas[1..], &ctx.attrs)?;
        let (xv, ov) = (input(ctx, 0)?, output(ctx, 0)?);
        let dtype = xv.meta.dtype;
        let o = Operand::output(ov.meta, ov.data, 0, dtype)?;
        if o.shape != shape.as_slice() {
            return Err(format!("output 0 is {} but index makes {shape:?}", ov.meta.describe()));
        }
        let x = Operand::input(xv.meta, xv.data, 0, dtype)?;
        let sx = stage_if_shared(&x, xv.data, &o, ov.data, false)?;
        let x = sx.as_ref().map_or(x, |s| s.operand());
        let k = metas.len() - 1;
        let mut staged: Vec<Option<Staged>> = Vec::with_capacity(k);
        for (j, v) in ctx.inputs[1..].iter().enumerate() {
            let t = Operand::input(v.meta, v.data, j + 1, v.meta.dtype)?;
            staged.push(stage_if_shared(&t, v.data, &o, ov.data, false)?);
        }
        let idx: Vec<Operand<'_>> = ctx.inputs[1..]
            .iter()
            .zip(&staged)
            .enumerate()
            .map(|(j, (v, s))| match s {
                Some(s) => Ok(s.operand()),
                None => Operand::input(v.meta, v.data, j + 1, v.meta.dtype),
            })
            .collect::<Result<_, String>>()?;
        let nb = shape.len() + k - x.shape.len();
        let offs = index_offsets("index", &x, &idx, d0, &shape[d0..d0 + nb], true)?;
        let size = dtype.size() as isize;
        if o.numel == 0 {
            return Ok(());
        }
        let so = o.strides.last().copied().unwrap_or(0);
        super::index::by_size!(dtype.size(), W => walk(&x, &shape, d0, k, nb, &offs, |i, n, row| {
            let po = at(&o, i).cast::<W>();
            for j in 0..n {
                // SAFETY: `row.at(j)` names an element of `x` (each coordinate inside its
                // dimension: the indices were checked), `po + j * so` one of the output's
                // row; they do not overlap (a shared input was copied aside).
                unsafe { po.offset(j as isize * so).write(x.first.wrapping_offset(row.at(j) * size).cast::<W>().read()) }
            }
        }))
    }
}

/// `index_put`: inputs `x` (any dtype), `values` (`x`'s dtype, of the indexed shape: the
/// front ends broadcast it) and `k` index tensors; `ints = [d0, accumulate, strict]`. The output is
/// like `x`, a copy of `x` with the values written at the indices (added with
/// accumulate 1), in row-major order of the indexed shape. Works in place.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexPutKernel;

fn index_put_check(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<(Shape, usize, bool, bool), String> {
    if inputs.len() < 3 {
        return Err(count_error(3, inputs.len()));
    }
    let (x, values) = (inputs[0], inputs[1]);
    if values.dtype != x.dtype {
        return Err(format!(
            "index_put: input 1 (the values) is {} but input 0 is {}: cast the values to the input's dtype",
            values.dtype, x.dtype
        ));
    }
    let (shape, d0) = indexed_shape("index_put", x, &inputs[2..], attrs)?;
    if values.shape != shape {
        return Err(format!(
            "index_put: input 1 (the values) is {} but the indexed shape is {:?}: broadcast the values to it",
            values.describe(),
            shape.as_slice()
        ));
    }
    let acc = match attrs.params().int_or(1, 0) {
        0 => false,
        1 => true,
        a => return Err(format!("index_put: accumulate {a} is not 0 or 1")),
    };
    let wrap = match attrs.params().int_or(2, 0) {
        0 => true,
        1 => false,
        a => return Err(format!("index_put: strict {a} is not 0 or 1")),
    };
    Ok((shape, d0, acc, wrap))
}

impl OpKernel for IndexPutKernel {
    fn name(&self) -> &'static str {
        "index_put"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        index_put_check(inputs, attrs)?;
        outputs.push(spec_of(inputs[0]));
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: SmallVec<[&TensorMeta; 4]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let (shape, d0, acc, wrap) = index_put_check(&metas, &ctx.attrs)?;
        let (xv, vv, ov) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
        let dtype = xv.meta.dtype;
        let o = Operand::output(ov.meta, ov.data, 0, dtype)?;
        if o.shape != xv.meta.shape.as_slice() {
            return Err(format!(
                "output 0 is {} but index_put makes {}",
                ov.meta.describe(),
                xv.meta.describe()
            ));
        }
        let x = Operand::input(xv.meta, xv.data, 0, dtype)?;
        let vals = Operand::input(vv.meta, vv.data, 1, dtype)?;
        let sv = stage_if_shared(&vals, vv.data, &o, ov.data, false)?;
        let vals = sv.as_ref().map_or(vals, |s| s.operand());
        let k = metas.len() - 2;
        let mut staged: Vec<Option<Staged>> = Vec::with_capacity(k);
        for (j, v) in ctx.inputs[2..].iter().enumerate() {
            let t = Operand::input(v.meta, v.data, j + 2, v.meta.dtype)?;
            staged.push(stage_if_shared(&t, v.data, &o, ov.data, false)?);
        }
        let idx: Vec<Operand<'_>> = ctx.inputs[2..]
            .iter()
            .zip(&staged)
            .enumerate()
            .map(|(j, (v, s))| match s {
                Some(s) => Ok(s.operand()),
                None => Operand::input(v.meta, v.data, j + 2, v.meta.dtype),
            })
            .collect::<Result<_, String>>()?;
        let nb = shape.len() + k - o.shape.len();
        // The offsets are of the output's layout: the indices are checked against it (the
        // same shape as `x`) before anything is written.
        let offs = index_offsets("index_put", &o, &idx, d0, &shape[d0..d0 + nb], wrap)?;
        match share(&x, xv.data, &o, ov.data) {
            Share::Same => {}
            Share::Disjoint => copy_elements(&o, &x),
            Share::Overlap => copy_elements(&o, &Staged::new(&x)?.operand()),
        }
        let size = dtype.size() as isize;
        if vals.numel == 0 {
            return Ok(());
        }
        let sv = vals.strides.last().copied().unwrap_or(0);
        if !acc {
            return super::index::by_size!(dtype.size(), W => walk(&o, &shape, d0, k, nb, &offs, |i, n, row| {
                let pv = at(&vals, i).cast::<W>().cast_const();
                for j in 0..n {
                    // SAFETY: `row.at(j)` names an element of the output (indices checked),
                    // `pv + j * sv` one of the values' row, which do not overlap it.
                    unsafe { o.first.wrapping_offset(row.at(j) * size).cast::<W>().write(pv.offset(j as isize * sv).read()) }
                }
            }));
        }
        dispatch!(dtype, all, T => walk(&o, &shape, d0, k, nb, &offs, |i, n, row| {
            let pv = at(&vals, i).cast_const();
            for j in 0..n {
                // SAFETY: as above, elements of `T`.
                unsafe { add_into::<T>(o.first.wrapping_offset(row.at(j) * size), pv.wrapping_offset(j as isize * sv * size)) }
            }
        }), Err(format!("index_put: no kernel for {dtype}")))
    }
}

/// `*po += *ps` in `T`'s compute type, rounded once on store.
///
/// # Safety
/// `po` and `ps` address elements of `T` in checked operands; `po` is writable.
#[inline(always)]
unsafe fn add_into<T: Elem>(po: *mut u8, ps: *const u8)
where
    T::C: Ring,
{
    // SAFETY: the contract.
    unsafe {
        let (a, b) = (po.cast::<T>().read().load(), ps.cast::<T>().read().load());
        po.cast::<T>().write(T::store(a.add(b)));
    }
}

/// `nonzero`: input `x` (any dtype); the output, which the caller gives, is `i64[n,
/// x.rank]`: the indices of `x`'s `n` nonzero elements (`true`, any nonzero number, NaN) in
/// row-major order. Fails if `x` does not hold exactly `n` of them.
#[derive(Debug, Clone, Copy, Default)]
pub struct NonzeroKernel;

impl OpKernel for NonzeroKernel {
    fn name(&self) -> &'static str {
        "nonzero"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        if inputs.len() != 1 {
            return Err(count_error(1, inputs.len()));
        }
        let x = inputs[0];
        match given {
            [out] if out.dtype == DType::I64 && out.shape.len() == 2 && out.shape[1] == x.shape.len() => {
                outputs.push(spec_of(out));
                Ok(())
            }
            [out] => Err(format!(
                "nonzero: output 0 is {} but the input is {}: the output must be i64[n, {}]",
                out.describe(),
                x.describe(),
                x.shape.len()
            )),
            _ => Err(format!(
                "nonzero: the output must be given (i64[n, {}], n the count of nonzero elements, read first)",
                x.shape.len()
            )),
        }
    }

    fn strided(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let (xv, ov) = (input(ctx, 0)?, output(ctx, 0)?);
        let x = Operand::input(xv.meta, xv.data, 0, xv.meta.dtype)?;
        let o = Operand::output(ov.meta, ov.data, 0, DType::I64)?;
        let rank = x.shape.len();
        if o.shape.len() != 2 || o.shape[1] != rank {
            return Err(format!("nonzero: output 0 is {}, not i64[n, {rank}]", ov.meta.describe()));
        }
        let room = o.shape[0];
        let sx = stage_if_shared(&x, xv.data, &o, ov.data, false)?;
        let x = sx.as_ref().map_or(x, |s| s.operand());
        let mut rows: Vec<Idx> = Vec::with_capacity(room);
        let mut count = 0usize;
        let dtype = x.dtype;
        dispatch!(dtype, all, T => for_each_index(x.shape, |i| {
            // SAFETY: `i` is inside the checked input's shape.
            let v = unsafe { at(&x, i).cast::<T>().read() };
            if is_nonzero(v.widen()) {
                count += 1;
                if rows.len() < room {
                    rows.push(i.iter().copied().collect());
                }
            }
            Ok(())
        }), Err(format!("nonzero: no kernel for {dtype}")))?;
        if count != room {
            return Err(format!(
                "nonzero: the input holds {count} nonzero elements but the output has room for {room}"
            ));
        }
        let mut pos: Idx = smallvec![0; 2];
        for (r, row) in rows.iter().enumerate() {
            for (c, &v) in row.iter().enumerate() {
                pos[0] = r;
                pos[1] = c;
                // SAFETY: `[r, c]` is inside the checked output's shape.
                unsafe { at(&o, &pos).cast::<i64>().write(v as i64) };
            }
        }
        Ok(())
    }
}

/// Whether a value is nonzero as `nonzero` counts it (`true`, any nonzero number, NaN).
fn is_nonzero(w: Wide) -> bool {
    match w {
        Wide::Bool(b) => b,
        Wide::Int(i) => i != 0,
        Wide::Float(f) => f != 0.0,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, compute_raw, run_with, t_f32, t_i64, tensor, values};
    use crate::vm::f16;

    fn attrs(ints: &[i64]) -> Attrs {
        Attrs::default().with_params(ints, &[]).unwrap()
    }

    #[test]
    fn index_gathers_with_broadcast_and_negative_indices() {
        // x[3, 4]; x[:, [[-1], [0]] , ] with d0 = 1 and a [2, 1] index and a [3] one on a 3-D x.
        let x = t_f32(&[2, 3, 4], &(0..24).map(|v| v as f32).collect::<Vec<_>>());
        let i = t_i64(&[2, 1], &[-1, 0]);
        let j = t_i64(&[3], &[0, 3, -4]);
        let out = run_with(&IndexKernel, attrs(&[1]), vec![x, i, j], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2, 3]);
        let want: Vec<f32> = [0usize, 1]
            .iter()
            .flat_map(|&a| {
                [2usize, 0]
                    .into_iter()
                    .flat_map(move |b| [0usize, 3, 0].into_iter().map(move |c| (a * 12 + b * 4 + c) as f32))
            })
            .collect();
        assert_eq!(as_f32(&out[0]), want);
        let e = run_with(&IndexKernel, attrs(&[0]), vec![t_f32(&[2], &[1.0, 2.0]), t_i64(&[1], &[-3])], &[])
            .unwrap_err();
        assert_eq!(e, "index: index -3 is out of range for dimension 0 of size 2");
    }

    #[test]
    fn index_put_writes_last_and_accumulates_in_order() {
        let x = tensor(&[3], &[f16::from_f32(2048.0), f16::from_f32(0.0), f16::from_f32(5.0)]);
        let v = tensor(&[3], &[f16::from_f32(1.0), f16::from_f32(1.0), f16::from_f32(7.0)]);
        let i = t_i64(&[3], &[0, 0, -1]);
        compute_raw(
            &IndexPutKernel,
            attrs(&[0, 1]),
            &[(&x.0, &x.1), (&v.0, &v.1), (&i.0, &i.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        // 2048 + 1 rounds back to 2048 at each store; 5 + 7.
        assert_eq!(values::<f16>(&x), [f16::from_f32(2048.0), f16::from_f32(0.0), f16::from_f32(12.0)]);
        let x = t_f32(&[2, 2], &[0.0; 4]);
        let v = t_f32(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let i = t_i64(&[3], &[1, 0, 1]);
        let out = run_with(&IndexPutKernel, attrs(&[0, 0]), vec![x, v, i], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [3.0, 4.0, 5.0, 6.0]);
        // Out of range: nothing written.
        let x = t_f32(&[2], &[1.0, 2.0]);
        let v = t_f32(&[2], &[9.0, 9.0]);
        let i = t_i64(&[2], &[0, 2]);
        let e = compute_raw(
            &IndexPutKernel,
            attrs(&[0, 0]),
            &[(&x.0, &x.1), (&v.0, &v.1), (&i.0, &i.1)],
            (&x.0, &x.1),
        );
        assert!(e.unwrap_err().contains("index 2 is out of range for dimension 0 of size 2"));
        assert_eq!(as_f32(&x), [1.0, 2.0]);
    }

    #[test]
    fn nonzero_lists_indices_and_checks_the_count() {
        let x = t_f32(&[2, 3], &[0.0, f32::NAN, 0.0, -0.0, 2.0, 1.0]);
        let given = TensorMeta::new(&[3, 2], DType::I64, crate::ep::DeviceId::CPU);
        let out = run_with(&NonzeroKernel, Attrs::default(), vec![x], &[given]).unwrap();
        assert_eq!(as_i64(&out[0]), [0, 1, 1, 1, 1, 2]);
        let x = t_f32(&[2], &[1.0, 1.0]);
        let given = TensorMeta::new(&[1, 1], DType::I64, crate::ep::DeviceId::CPU);
        let e = run_with(&NonzeroKernel, Attrs::default(), vec![x], &[given]).unwrap_err();
        assert!(e.contains("holds 2 nonzero elements but the output has room for 1"), "{e}");
        let mut specs = OutSpecs::new();
        assert!(NonzeroKernel
            .infer(&[&t_f32(&[2], &[0.0; 2]).0], &[], &Attrs::default(), &mut specs)
            .is_err());
    }
}
