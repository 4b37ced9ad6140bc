//! Indexing and joining: `cat`, `index_select`, `gather`, `scatter` (with its reductions:
//! `scatter_add` is `scatter` with reduce 1) and `index_add`, after PyTorch's ops of those
//! names.
//!
//! Every kernel reads its operands in any layout (checked against their storages by
//! [`Operand`], so that an element at an index inside an operand's shape lies inside its
//! storage). Index tensors are `i64` or `i32`. An index is checked against the size it
//! indexes when the kernel runs, before anything is written; one out of range fails the
//! call with a message naming the op's dimension, the index and the size (the VM reports it
//! as `Error::Kernel` naming the op). As in PyTorch, these ops do not wrap negative indices:
//! `-1` is out of range (advanced indexing, `kernels::advanced`, wraps them).
//!
//! Parameter lists (`vm::params`): `cat`, `index_select`, `gather` and `index_add` read
//! `ints = [dim]`; `scatter` reads `ints = [dim, reduce]` (reduce 0: none, 1: add,
//! 2: multiply); `index_add` reads `scalars = [alpha]` (1 when absent). A negative `dim`
//! counts from the end.
//!
//! Order: `scatter` and `index_add` apply their sources in increasing source index
//! (row-major order over the index tensor), so repeated indices give the same result on
//! every run: the last write wins for `scatter`, and the additions (or products) into one
//! element are made in that order, each rounded as it is stored (`f16` and `bf16` compute
//! in `f32` and round after each addition, as PyTorch's CPU kernels do).

use smallvec::{smallvec, SmallVec};

use super::dtype::{dispatch, Elem, Ring};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{copy_elements, input, output};
use super::{common_dtype, count_error, spec_of};
use crate::alloc::Storage;
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta};

/// Index positions, inline up to 8 dimensions.
pub(crate) type Idx = SmallVec<[usize; 8]>;

/// `dim` of the call's parameter list (integer `at`), wrapped against `rank` (a rank of 0
/// takes dims 0 and -1, as PyTorch does).
pub(crate) fn dim_param(op: &str, attrs: &Attrs, at: usize, rank: usize) -> Result<usize, String> {
    let d = attrs.params().int_or(at, 0);
    let r = rank.max(1) as i64;
    if d < -r || d >= r {
        return Err(format!(
            "{op}: dim {d} is out of range for a tensor of {rank} dimensions (expected in [{}, {}])",
            -r,
            r - 1
        ));
    }
    Ok(if d < 0 { (d + r) as usize } else { d as usize })
}

/// Refuse an index tensor that is not `i64` or `i32`.
pub(crate) fn index_dtype(op: &str, which: &str, m: &TensorMeta) -> Result<(), String> {
    match m.dtype {
        DType::I64 | DType::I32 => Ok(()),
        d => Err(format!("{op}: {which} is {d}; index tensors are int64 (or int32): cast with .long()")),
    }
}

/// The value of the index element at `p` (an `i64` or `i32` element of `dtype`).
///
/// # Safety
/// `p` addresses one element of `dtype` inside a checked operand.
#[inline(always)]
pub(crate) unsafe fn read_index(p: *const u8, dtype: DType) -> i64 {
    // SAFETY: the contract; storages are aligned to 8 bytes and offsets count elements.
    unsafe {
        if dtype == DType::I32 {
            i64::from(p.cast::<i32>().read())
        } else {
            p.cast::<i64>().read()
        }
    }
}

/// The address of `op`'s element at `idx` (one coordinate per dimension, each inside the
/// shape: then the address lies inside the checked storage).
#[inline(always)]
pub(crate) fn at(op: &Operand<'_>, idx: &[usize]) -> *mut u8 {
    let mut off = 0isize;
    for (&i, &s) in idx.iter().zip(op.strides) {
        off = off.wrapping_add((i as isize).wrapping_mul(s));
    }
    op.first.wrapping_offset(off.wrapping_mul(op.dtype.size() as isize))
}

/// Call `f` with every index of `shape` in row-major order (once, with `[]`, for a 0-d
/// shape; never for an empty one), stopping at the first error.
pub(crate) fn for_each_index(
    shape: &[usize],
    mut f: impl FnMut(&[usize]) -> Result<(), String>,
) -> Result<(), String> {
    if shape.contains(&0) {
        return Ok(());
    }
    let mut idx: Idx = smallvec![0; shape.len()];
    loop {
        f(&idx)?;
        let mut d = shape.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < shape[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

/// Call `f(row, n)` for every row of `shape` (a run along its last dimension) in row-major
/// order: `row` is the position of the row's first element (last coordinate 0), `n` its
/// length. A 0-d shape is one row of one element; an empty shape has none.
pub(crate) fn for_each_row(
    shape: &[usize],
    mut f: impl FnMut(&[usize], usize) -> Result<(), String>,
) -> Result<(), String> {
    let Some(last) = shape.len().checked_sub(1) else {
        return f(&[], 1);
    };
    let n = shape[last];
    if n == 0 {
        return Ok(());
    }
    let mut row: Idx = smallvec![0; shape.len()];
    for_each_index(&shape[..last], |p| {
        row[..last].copy_from_slice(p);
        f(&row, n)
    })
}

/// The stride of `op`'s last dimension, in bytes (0 for a 0-d operand).
#[inline]
fn last_step(op: &Operand<'_>) -> isize {
    op.strides.last().copied().unwrap_or(0) * op.dtype.size() as isize
}

/// `i` checked against `size` (no wrapping), or the message naming `op`, the dimension and
/// the index.
#[inline(always)]
pub(crate) fn checked(op: &str, i: i64, d: usize, size: usize) -> Result<usize, String> {
    if i >= 0 && (i as u64) < size as u64 {
        Ok(i as usize)
    } else {
        Err(out_of_range(op, i, d, size))
    }
}

#[cold]
#[inline(never)]
pub(crate) fn out_of_range(op: &str, i: i64, d: usize, size: usize) -> String {
    format!("{op}: index {i} is out of range for dimension {d} of size {size}")
}

/// An input that shares bytes with the output copied aside (`None` where it does not:
/// read it in place). `same_ok`: an input that is exactly the output needs no copy (it is
/// read element for element before that element is written).
pub(crate) fn stage_if_shared(
    a: &Operand<'_>,
    a_data: &Storage,
    o: &Operand<'_>,
    o_data: &Storage,
    same_ok: bool,
) -> Result<Option<Staged>, String> {
    match share(a, a_data, o, o_data) {
        Share::Disjoint => Ok(None),
        Share::Same if same_ok => Ok(None),
        _ => Staged::new(a).map(Some),
    }
}

/// Run `$body` with `$W` an unsigned integer of the element size `$size` (elements move as
/// their bits).
macro_rules! by_size {
    ($size:expr, $W:ident => $body:expr) => {
        match $size {
            1 => {
                type $W = u8;
                $body
            }
            2 => {
                type $W = u16;
                $body
            }
            4 => {
                type $W = u32;
                $body
            }
            _ => {
                type $W = u64;
                $body
            }
        }
    };
}
pub(crate) use by_size;

/// Copy input `x` into output `o` (nothing to do if it is exactly `o`): the first step of
/// the ops that update a copy of their input.
fn copy_input_into(
    x: &Operand<'_>,
    x_data: &Storage,
    o: &Operand<'_>,
    o_data: &Storage,
) -> Result<(), String> {
    match share(x, x_data, o, o_data) {
        Share::Same => {}
        Share::Disjoint => copy_elements(o, x),
        Share::Overlap => copy_elements(o, &Staged::new(x)?.operand()),
    }
    Ok(())
}

// ---- cat ------------------------------------------------------------------------------

/// Whether `m` is a 1-D empty tensor, which `cat` skips (PyTorch's legacy rule, so that
/// `cat([empty, x])` works for an `x` of any rank).
fn skipped(m: &TensorMeta) -> bool {
    m.shape.len() == 1 && m.shape[0] == 0
}

/// `cat`: one or more inputs of one dtype (the front ends promote), equal in every
/// dimension but `dim` (`ints = [dim]`); the output joins them along `dim` in call order.
/// 1-D empty inputs are skipped whatever the others' rank, as in PyTorch. A given output
/// may be any view (the front ends split a call of more inputs than an instruction takes
/// into calls that each write a part of one output).
#[derive(Debug, Clone, Copy, Default)]
pub struct CatKernel;

/// `cat`'s output shape and dim, from its inputs.
fn cat_shape(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<(Shape, usize), String> {
    if inputs.is_empty() {
        return Err("cat: expected a non-empty list of tensors".into());
    }
    let kept: SmallVec<[usize; 8]> = (0..inputs.len()).filter(|&i| !skipped(inputs[i])).collect();
    let Some(&first) = kept.first() else {
        return Ok((inputs[0].shape.clone(), 0));
    };
    let base = inputs[first];
    if base.shape.is_empty() {
        return Err(format!("cat: input {first} is 0-d; zero-dimensional tensors cannot be concatenated"));
    }
    let d = dim_param("cat", attrs, 0, base.shape.len())?;
    let mut shape = base.shape.clone();
    shape[d] = 0;
    for &i in &kept {
        let m = inputs[i];
        if m.shape.len() != base.shape.len() {
            return Err(format!(
                "cat: input {i} is {} but input {first} is {}: tensors must have the same number of \
                 dimensions",
                m.describe(),
                base.describe()
            ));
        }
        for (k, (&a, &b)) in m.shape.iter().zip(&base.shape).enumerate() {
            if k != d && a != b {
                return Err(format!(
                    "cat: input {i} is {} but input {first} is {}: sizes must match except in \
                     dimension {d} (dimension {k}: {a} against {b})",
                    m.describe(),
                    base.describe()
                ));
            }
        }
        shape[d] += m.shape[d];
    }
    Ok((shape, d))
}

impl OpKernel for CatKernel {
    fn name(&self) -> &'static str {
        "cat"
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
        let dtype = common_dtype(inputs)?;
        let (shape, _) = cat_shape(inputs, attrs)?;
        outputs.push(OutSpec { shape, dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: SmallVec<[&TensorMeta; 8]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let (shape, d) = cat_shape(&metas, &ctx.attrs)?;
        let out = output(ctx, 0)?;
        let dtype = out.meta.dtype;
        let o = Operand::output(out.meta, out.data, 0, dtype)?;
        if o.shape != shape.as_slice() {
            return Err(format!("output 0 is {} but cat makes {shape:?}", out.meta.describe()));
        }
        let mut start = 0usize;
        for (i, v) in ctx.inputs.iter().enumerate() {
            // A skipped input adds nothing along `dim` (for a 1-D output its size is 0).
            if skipped(v.meta) {
                continue;
            }
            if v.meta.numel() == 0 {
                start += v.meta.shape[d];
                continue;
            }
            let a = Operand::input(v.meta, v.data, i, dtype)?;
            // The part of the output this input fills: its shape, the output's strides.
            let offset = (out.meta.offset as isize + start as isize * out.meta.strides[d]) as usize;
            let part_meta = out.meta.with_layout(&v.meta.shape, &out.meta.strides, offset);
            let part = Operand::output(&part_meta, out.data, 0, dtype)?;
            match stage_if_shared(&a, v.data, &o, out.data, false)? {
                None => copy_elements(&part, &a),
                Some(s) => copy_elements(&part, &s.operand()),
            }
            start += v.meta.shape[d];
        }
        Ok(())
    }
}

// ---- index_select ---------------------------------------------------------------------

/// `index_select`: inputs `x` (any dtype) and `index` (`i64` or `i32`, 0-d or 1-D);
/// `ints = [dim]`. The output is `x`'s shape with dimension `dim` of `index`'s length
/// (`[]` for a 0-d `x`), holding `x`'s slices at the indices, in order.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexSelectKernel;

fn index_select_shape(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<(Shape, usize), String> {
    if inputs.len() != 2 {
        return Err(count_error(2, inputs.len()));
    }
    let (x, index) = (inputs[0], inputs[1]);
    index_dtype("index_select", "input 1 (the index)", index)?;
    if index.shape.len() > 1 {
        return Err(format!(
            "index_select: input 1 (the index) is {}; it must be 0-d or 1-D",
            index.describe()
        ));
    }
    let d = dim_param("index_select", attrs, 0, x.shape.len())?;
    let mut shape = x.shape.clone();
    if shape.is_empty() {
        if index.numel() != 1 {
            return Err(format!(
                "index_select: a 0-d input takes one index, not {} ({})",
                index.numel(),
                index.describe()
            ));
        }
    } else {
        shape[d] = index.numel();
    }
    Ok((shape, d))
}

impl OpKernel for IndexSelectKernel {
    fn name(&self) -> &'static str {
        "index_select"
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
        let (shape, _) = index_select_shape(inputs, attrs)?;
        outputs.push(OutSpec { shape, dtype: inputs[0].dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: SmallVec<[&TensorMeta; 2]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let (_, d) = index_select_shape(&metas, &ctx.attrs)?;
        let (xv, iv, ov) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
        let o = Operand::output(ov.meta, ov.data, 0, xv.meta.dtype)?;
        let x = Operand::input(xv.meta, xv.data, 0, xv.meta.dtype)?;
        let ix = Operand::input(iv.meta, iv.data, 1, iv.meta.dtype)?;
        let sx = stage_if_shared(&x, xv.data, &o, ov.data, false)?;
        let si = stage_if_shared(&ix, iv.data, &o, ov.data, false)?;
        let x = sx.as_ref().map_or(x, |s| s.operand());
        let ix = si.as_ref().map_or(ix, |s| s.operand());
        // The indices, checked before anything is written.
        let size = x.shape.get(d).copied().unwrap_or(1);
        let mut picks: Vec<usize> = Vec::with_capacity(ix.numel);
        for_each_index(ix.shape, |i| {
            // SAFETY: `i` is inside the checked index operand's shape.
            let v = unsafe { read_index(at(&ix, i), ix.dtype) };
            picks.push(checked("index_select", v, d, size)?);
            Ok(())
        })?;
        if x.shape.is_empty() {
            // A 0-d input: its one element (the index was checked against a size of 1).
            copy_elements(&o, &x);
            return Ok(());
        }
        if o.numel == 0 {
            return Ok(());
        }
        let last = o.shape.len() - 1;
        if d != last {
            // A run along the last dimension at a time (the rows of an embedding table).
            let (n, so, sx) = (o.shape[last], o.strides[last], x.strides[last]);
            let (mut src, mut dst): (Idx, Idx) = (smallvec![0; last + 1], smallvec![0; last + 1]);
            return by_size!(x.dtype.size(), W => for_each_index(&o.shape[..last], |i| {
                dst[..last].copy_from_slice(i);
                src[..last].copy_from_slice(i);
                src[d] = picks[i[d]];
                let (po, px) = (at(&o, &dst).cast::<W>(), at(&x, &src).cast::<W>().cast_const());
                // SAFETY: `dst` and `src` start runs of `n` elements inside the output's and
                // `x`'s shapes (the index was checked), in their checked storages, which do
                // not overlap (a shared input was copied aside); the output is not empty.
                unsafe {
                    if so == 1 && sx == 1 {
                        std::ptr::copy_nonoverlapping(px, po, n);
                    } else {
                        for j in 0..n as isize {
                            po.offset(j * so).write(px.offset(j * sx).read());
                        }
                    }
                }
                Ok(())
            }));
        }
        by_size!(x.dtype.size(), W => {
            let mut src: Idx = smallvec![0; x.shape.len()];
            for_each_index(o.shape, |i| {
                src.copy_from_slice(i);
                src[d] = picks[i[d]];
                // SAFETY: `i` is inside the output's shape and `src` inside `x`'s (the
                // index was checked): both addresses lie in their checked storages, which do
                // not overlap (a shared input was copied aside).
                unsafe { at(&o, i).cast::<W>().write(at(&x, &src).cast::<W>().read()) };
                Ok(())
            })
        })
    }
}

// ---- gather ---------------------------------------------------------------------------

/// `gather`: inputs `x` (any dtype) and `index` (`i64` or `i32`, of `x`'s rank, no larger
/// than `x` in any dimension but `dim`); `ints = [dim]`. The output has `index`'s shape and
/// `x`'s dtype: `out[i] = x[i with coordinate dim replaced by index[i]]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct GatherKernel;

/// Check that `index` has `x`'s rank and is no larger than `other` in any dimension
/// (`but`: the dimension that is exempt, if any).
fn index_fits(
    op: &str,
    index: &TensorMeta,
    other: &TensorMeta,
    which: &str,
    but: Option<usize>,
) -> Result<(), String> {
    let (ri, ro) = (index.shape.len().max(1), other.shape.len().max(1));
    if ri != ro {
        return Err(format!(
            "{op}: the index is {} but {which} is {}: index tensor must have the same number of \
             dimensions",
            index.describe(),
            other.describe()
        ));
    }
    for (k, (&a, &b)) in index.shape.iter().zip(&other.shape).enumerate() {
        if Some(k) != but && a > b {
            return Err(format!(
                "{op}: the index is {} but {which} is {}: size {a} of the index in dimension {k} is \
                 larger than {b}",
                index.describe(),
                other.describe()
            ));
        }
    }
    Ok(())
}

impl OpKernel for GatherKernel {
    fn name(&self) -> &'static str {
        "gather"
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
        if inputs.len() != 2 {
            return Err(count_error(2, inputs.len()));
        }
        let (x, index) = (inputs[0], inputs[1]);
        index_dtype("gather", "input 1 (the index)", index)?;
        let d = dim_param("gather", attrs, 0, x.shape.len())?;
        index_fits("gather", index, x, "input 0", Some(d))?;
        outputs.push(OutSpec { shape: index.shape.clone(), dtype: x.dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: SmallVec<[&TensorMeta; 2]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let mut specs = OutSpecs::new();
        self.infer(&metas, &[], &ctx.attrs, &mut specs)?;
        let (xv, iv, ov) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
        let d = dim_param("gather", &ctx.attrs, 0, xv.meta.shape.len())?;
        let o = Operand::output(ov.meta, ov.data, 0, xv.meta.dtype)?;
        if o.shape != specs[0].shape.as_slice() {
            return Err(format!("output 0 is {} but gather makes {:?}", ov.meta.describe(), specs[0].shape));
        }
        let x = Operand::input(xv.meta, xv.data, 0, xv.meta.dtype)?;
        let ix = Operand::input(iv.meta, iv.data, 1, iv.meta.dtype)?;
        let sx = stage_if_shared(&x, xv.data, &o, ov.data, false)?;
        let si = stage_if_shared(&ix, iv.data, &o, ov.data, false)?;
        let x = sx.as_ref().map_or(x, |s| s.operand());
        let ix = si.as_ref().map_or(ix, |s| s.operand());
        let size = x.shape.get(d).copied().unwrap_or(1);
        // Check every index first, so that a bad one writes nothing.
        for_each_index(ix.shape, |i| {
            // SAFETY: `i` is inside the checked index operand's shape.
            checked("gather", unsafe { read_index(at(&ix, i), ix.dtype) }, d, size).map(|_| ())
        })?;
        // A row of the index at a time: along it, the index and the output step by their
        // last strides, and `x` by its stride along `dim` times the index (plus its last
        // stride, where `dim` is not the last dimension).
        let (si, so) = (last_step(&ix), last_step(&o));
        let sd = x.strides.get(d).copied().unwrap_or(0) * x.dtype.size() as isize;
        let along = if d + 1 == x.shape.len() { 0 } else { last_step(&x) };
        by_size!(x.dtype.size(), W => {
            let mut src: Idx = smallvec![0; x.shape.len()];
            for_each_row(ix.shape, |i, n| {
                src.copy_from_slice(i);
                if let Some(c) = src.get_mut(d) {
                    *c = 0;
                }
                let (px, pi, po) = (at(&x, &src), at(&ix, i), at(&o, i));
                for j in 0..n as isize {
                    // SAFETY: element `j` of a row of the index (and of the output) lies in
                    // its checked storage; the index was checked against `x`'s size along
                    // `dim` and fits `x` in the other dimensions, so the element of `x` it
                    // names lies in `x`'s storage; `x` does not overlap the output.
                    unsafe {
                        let v = read_index(pi.wrapping_offset(j * si), ix.dtype) as isize;
                        let from = px.wrapping_offset(v * sd + j * along).cast::<W>();
                        po.wrapping_offset(j * so).cast::<W>().write(from.read());
                    }
                }
                Ok(())
            })
        })
    }
}

// ---- scatter --------------------------------------------------------------------------

/// `scatter`: inputs `x` (any dtype), `index` (`i64` or `i32`, of `x`'s rank, no larger
/// than `src` in any dimension nor than `x` in any but `dim`) and `src` (`x`'s dtype);
/// `ints = [dim, reduce]`. The output is like `x`, a copy of `x` where, for each index
/// position `i` in row-major order, `out[i with coordinate dim replaced by index[i]]` is
/// set to `src[i]` (reduce 0), has `src[i]` added (1, `scatter_add`) or is multiplied by it
/// (2). Works in place (the output exactly `x`). A value is scattered by PyTorch from a
/// number by an expanded 0-d `src`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScatterKernel;

/// `scatter`'s reduction.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reduce {
    None,
    Add,
    Mul,
}

fn reduce_param(attrs: &Attrs) -> Result<Reduce, String> {
    match attrs.params().int_or(1, 0) {
        0 => Ok(Reduce::None),
        1 => Ok(Reduce::Add),
        2 => Ok(Reduce::Mul),
        r => Err(format!("scatter: reduce {r} is not one of 0 (none), 1 (add), 2 (multiply)")),
    }
}

impl OpKernel for ScatterKernel {
    fn name(&self) -> &'static str {
        "scatter"
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
        if inputs.len() != 3 {
            return Err(count_error(3, inputs.len()));
        }
        let (x, index, src) = (inputs[0], inputs[1], inputs[2]);
        index_dtype("scatter", "input 1 (the index)", index)?;
        if src.dtype != x.dtype {
            return Err(format!(
                "scatter: input 2 (src) is {} but input 0 is {}: src must have the input's dtype",
                src.dtype, x.dtype
            ));
        }
        let d = dim_param("scatter", attrs, 0, x.shape.len())?;
        reduce_param(attrs)?;
        index_fits("scatter", index, x, "input 0", Some(d))?;
        index_fits("scatter", index, src, "input 2 (src)", None)?;
        outputs.push(spec_of(x));
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
        let metas: SmallVec<[&TensorMeta; 3]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let mut specs = OutSpecs::new();
        self.infer(&metas, &[], &ctx.attrs, &mut specs)?;
        let reduce = reduce_param(&ctx.attrs)?;
        let d = dim_param("scatter", &ctx.attrs, 0, metas[0].shape.len())?;
        let (xv, iv, sv, ov) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?, output(ctx, 0)?);
        let dtype = xv.meta.dtype;
        let o = Operand::output(ov.meta, ov.data, 0, dtype)?;
        if o.shape != xv.meta.shape.as_slice() {
            return Err(format!(
                "output 0 is {} but scatter makes {}",
                ov.meta.describe(),
                xv.meta.describe()
            ));
        }
        let x = Operand::input(xv.meta, xv.data, 0, dtype)?;
        let ix = Operand::input(iv.meta, iv.data, 1, iv.meta.dtype)?;
        let src = Operand::input(sv.meta, sv.data, 2, dtype)?;
        let si = stage_if_shared(&ix, iv.data, &o, ov.data, false)?;
        let ss = stage_if_shared(&src, sv.data, &o, ov.data, false)?;
        let ix = si.as_ref().map_or(ix, |s| s.operand());
        let src = ss.as_ref().map_or(src, |s| s.operand());
        let size = x.shape.get(d).copied().unwrap_or(1);
        for_each_index(ix.shape, |i| {
            // SAFETY: `i` is inside the checked index operand's shape.
            checked("scatter", unsafe { read_index(at(&ix, i), ix.dtype) }, d, size).map(|_| ())
        })?;
        copy_input_into(&x, xv.data, &o, ov.data)?;
        // A row of the index at a time, as `gather` walks it, with the output in `x`'s part.
        let (si, ss) = (last_step(&ix), last_step(&src));
        let sd = o.strides.get(d).copied().unwrap_or(0) * dtype.size() as isize;
        let along = if d + 1 == o.shape.len() { 0 } else { last_step(&o) };
        let walk = |apply: &mut dyn FnMut(*mut u8, *const u8)| {
            let mut dst: Idx = smallvec![0; o.shape.len()];
            for_each_row(ix.shape, |i, n| {
                dst.copy_from_slice(i);
                if let Some(c) = dst.get_mut(d) {
                    *c = 0;
                }
                let (po, pi, ps) = (at(&o, &dst), at(&ix, i), at(&src, i));
                for j in 0..n as isize {
                    // SAFETY: element `j` of a row of the index lies in its checked storage.
                    let v = unsafe { read_index(pi.wrapping_offset(j * si), ix.dtype) } as isize;
                    apply(po.wrapping_offset(v * sd + j * along), ps.wrapping_offset(j * ss));
                }
                Ok(())
            })
        };
        match reduce {
            Reduce::None => by_size!(dtype.size(), W => walk(&mut |po, ps| {
                // SAFETY: `po` is an element of the output (the index was checked, the rest
                // of the position fits `x`), `ps` one of `src` (the index fits it); `src`
                // does not overlap the output (copied aside otherwise).
                unsafe { po.cast::<W>().write(ps.cast::<W>().read()) }
            })),
            Reduce::Add => dispatch!(dtype, all, T => walk(&mut |po, ps| {
                // SAFETY: as above, elements of `T`.
                unsafe { accumulate::<T>(po, ps, |a, b| a.add(b)) }
            }), Err(format!("scatter: no kernel for {dtype}"))),
            Reduce::Mul => dispatch!(dtype, all, T => walk(&mut |po, ps| {
                // SAFETY: as above, elements of `T`.
                unsafe { accumulate::<T>(po, ps, |a, b| a.mul(b)) }
            }), Err(format!("scatter: no kernel for {dtype}"))),
        }
    }
}

/// `*po = f(*po, *ps)` in `T`'s compute type, rounded once on store.
///
/// # Safety
/// `po` and `ps` address elements of `T` in checked operands; `po` is writable.
#[inline(always)]
unsafe fn accumulate<T: Elem>(po: *mut u8, ps: *const u8, f: impl Fn(T::C, T::C) -> T::C)
where
    T::C: Ring,
{
    // SAFETY: the contract.
    unsafe {
        let (a, b) = (po.cast::<T>().read().load(), ps.cast::<T>().read().load());
        po.cast::<T>().write(T::store(f(a, b)));
    }
}

// ---- index_add ------------------------------------------------------------------------

/// `index_add`: inputs `x` (any dtype), `index` (`i64` or `i32`, 0-d or 1-D) and `source`
/// (`x`'s dtype and shape, but `index`'s length in dimension `dim`); `ints = [dim]`,
/// `scalars = [alpha]` (1 when absent). The output is like `x`: a copy of `x` where, for
/// each `j` in increasing order, `alpha * source`'s slice `j` along `dim` is added to the
/// slice `index[j]`. Works in place.
#[derive(Debug, Clone, Copy, Default)]
pub struct IndexAddKernel;

impl OpKernel for IndexAddKernel {
    fn name(&self) -> &'static str {
        "index_add"
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
        if inputs.len() != 3 {
            return Err(count_error(3, inputs.len()));
        }
        let (x, index, source) = (inputs[0], inputs[1], inputs[2]);
        index_dtype("index_add", "input 1 (the index)", index)?;
        if index.shape.len() > 1 {
            return Err(format!(
                "index_add: input 1 (the index) is {}; it must be 0-d or 1-D",
                index.describe()
            ));
        }
        if source.dtype != x.dtype {
            return Err(format!(
                "index_add: input 2 (source) is {} but input 0 is {}: source must have the input's dtype",
                source.dtype, x.dtype
            ));
        }
        let d = dim_param("index_add", attrs, 0, x.shape.len())?;
        let mut want = x.shape.clone();
        if let Some(s) = want.get_mut(d) {
            *s = index.numel();
        } else if index.numel() != 1 {
            return Err(format!("index_add: a 0-d input takes one index, not {}", index.numel()));
        }
        if source.shape != want && !(want.is_empty() && source.numel() == 1 && source.shape.len() <= 1) {
            return Err(format!(
                "index_add: input 2 (source) is {} but input 0 is {} and the index has {} elements: \
                 source must be {want:?}",
                source.describe(),
                x.describe(),
                index.numel()
            ));
        }
        outputs.push(spec_of(x));
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
        let metas: SmallVec<[&TensorMeta; 3]> = ctx.inputs.iter().map(|v| v.meta).collect();
        let mut specs = OutSpecs::new();
        self.infer(&metas, &[], &ctx.attrs, &mut specs)?;
        let d = dim_param("index_add", &ctx.attrs, 0, metas[0].shape.len())?;
        let alpha = ctx.attrs.params().scalar(0).unwrap_or(crate::vm::Scalar::Int(1));
        let (xv, iv, sv, ov) = (input(ctx, 0)?, input(ctx, 1)?, input(ctx, 2)?, output(ctx, 0)?);
        let dtype = xv.meta.dtype;
        let o = Operand::output(ov.meta, ov.data, 0, dtype)?;
        if o.shape != xv.meta.shape.as_slice() {
            return Err(format!(
                "output 0 is {} but index_add makes {}",
                ov.meta.describe(),
                xv.meta.describe()
            ));
        }
        let x = Operand::input(xv.meta, xv.data, 0, dtype)?;
        let ix = Operand::input(iv.meta, iv.data, 1, iv.meta.dtype)?;
        let src = Operand::input(sv.meta, sv.data, 2, dtype)?;
        let si = stage_if_shared(&ix, iv.data, &o, ov.data, false)?;
        let ss = stage_if_shared(&src, sv.data, &o, ov.data, false)?;
        let ix = si.as_ref().map_or(ix, |s| s.operand());
        let src = ss.as_ref().map_or(src, |s| s.operand());
        let size = x.shape.get(d).copied().unwrap_or(1);
        let mut picks: Vec<usize> = Vec::with_capacity(ix.numel);
        for_each_index(ix.shape, |i| {
            // SAFETY: `i` is inside the checked index operand's shape.
            picks.push(checked("index_add", unsafe { read_index(at(&ix, i), ix.dtype) }, d, size)?);
            Ok(())
        })?;
        copy_input_into(&x, xv.data, &o, ov.data)?;
        if o.shape.is_empty() {
            if picks.is_empty() {
                return Ok(());
            }
            return dispatch!(dtype, all, T => {
                let a = T::compute_scalar(alpha);
                // SAFETY: one element each (0-d output, a one-element source).
                unsafe { accumulate::<T>(o.first, src.first, |p, s| p.add(s.mul(a))) };
                Ok(())
            }, Err(format!("index_add: no kernel for {dtype}")));
        }
        // The source in row-major order: the additions into one element (from source
        // positions that differ only along `dim`) are made in increasing source index.
        let (ss, so) = (last_step(&src), last_step(&o));
        let sd = o.strides[d] * dtype.size() as isize;
        let last = o.shape.len() - 1;
        dispatch!(dtype, all, T => {
            let a = T::compute_scalar(alpha);
            let mut dst: Idx = smallvec![0; o.shape.len()];
            for_each_row(src.shape, |i, n| {
                dst.copy_from_slice(i);
                dst[d] = 0;
                let (base, ps) = (at(&o, &dst), at(&src, i).cast_const());
                for j in 0..n {
                    let to = if d == last {
                        base.wrapping_offset(picks[j] as isize * sd)
                    } else {
                        base.wrapping_offset(picks[i[d]] as isize * sd + j as isize * so)
                    };
                    // SAFETY: element `j` of a row of the source lies in its checked storage;
                    // its target, the same position with the checked index along `dim`, in
                    // the output's; the source does not overlap the output.
                    unsafe { accumulate::<T>(to, ps.wrapping_offset(j as isize * ss), |p, s| p.add(s.mul(a))) };
                }
                Ok(())
            })
        }, Err(format!("index_add: no kernel for {dtype}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, compute_raw, infer_err, run_with, t_f32, t_i64, tensor, values, Owned,
    };
    use crate::vm::{bf16, f16, Scalar};

    /// A small deterministic generator (the tests need no statistical quality).
    struct Lcg(u64);
    impl Lcg {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            self.0 >> 33
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n.max(1) as u64) as usize
        }
    }

    fn dim_attrs(ints: &[i64]) -> Attrs {
        Attrs::default().with_params(ints, &[]).unwrap()
    }

    /// Row-major strides of `shape`.
    fn rm(shape: &[usize]) -> Vec<usize> {
        let mut s = vec![1; shape.len()];
        for d in (0..shape.len().saturating_sub(1)).rev() {
            s[d] = s[d + 1] * shape[d + 1];
        }
        s
    }

    /// Every index of `shape`, row-major.
    fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
        let mut v = Vec::new();
        for_each_index(shape, |i| {
            v.push(i.to_vec());
            Ok(())
        })
        .unwrap();
        v
    }

    fn flat(shape: &[usize], i: &[usize]) -> usize {
        rm(shape).iter().zip(i).map(|(s, i)| s * i).sum()
    }

    /// `t` transposed in its last two dims as a view of a new storage holding the same
    /// logical values (so that the kernel reads a non-contiguous layout).
    fn transposed(shape: &[usize], vals: &[f32]) -> Owned {
        let n = shape.len();
        if n < 2 {
            return t_f32(shape, vals);
        }
        // Storage laid out with the last two dims swapped.
        let mut st = shape.to_vec();
        st.swap(n - 1, n - 2);
        let mut buf = vec![0.0f32; vals.len()];
        for i in indices(shape) {
            let mut j = i.clone();
            j.swap(n - 1, n - 2);
            buf[flat(&st, &j)] = vals[flat(shape, &i)];
        }
        let (meta, data) = t_f32(&st, &buf);
        let mut strides: Vec<isize> = rm(&st).iter().map(|&s| s as isize).collect();
        strides.swap(n - 1, n - 2);
        (meta.with_layout(shape, &strides, 0), data)
    }

    #[test]
    fn cat_joins_along_any_dim_and_skips_empty_vectors() {
        let mut g = Lcg(1);
        for _ in 0..40 {
            let rank = 1 + g.below(3);
            let d = g.below(rank);
            let base: Vec<usize> = (0..rank).map(|_| 1 + g.below(3)).collect();
            let n = 1 + g.below(3);
            let mut parts = Vec::new();
            let mut shapes = Vec::new();
            for k in 0..n {
                let mut s = base.clone();
                s[d] = g.below(3);
                let vals: Vec<f32> = (0..s.iter().product::<usize>()).map(|i| (k * 100 + i) as f32).collect();
                parts.push(if g.below(2) == 0 { transposed(&s, &vals) } else { t_f32(&s, &vals) });
                shapes.push((s, vals));
            }
            if rank > 1 {
                parts.insert(1.min(parts.len()), t_f32(&[0], &[]));
            }
            let neg = d as i64 - rank as i64;
            let out = run_with(&CatKernel, dim_attrs(&[neg]), parts, &[]).unwrap();
            let mut want_shape = base.clone();
            want_shape[d] = shapes.iter().map(|(s, _)| s[d]).sum();
            assert_eq!(out[0].0.shape.as_slice(), want_shape.as_slice());
            let got = as_f32(&out[0]);
            let mut start = 0;
            for (s, vals) in &shapes {
                for i in indices(s) {
                    let mut j = i.clone();
                    j[d] += start;
                    assert_eq!(got[flat(&want_shape, &j)], vals[flat(s, &i)]);
                }
                start += s[d];
            }
        }
    }

    #[test]
    fn cat_refusals() {
        let a = t_f32(&[2, 3], &[0.0; 6]).0;
        let b = t_f32(&[3, 3], &[0.0; 9]).0;
        let i = t_i64(&[2, 3], &[0; 6]).0;
        let s = t_f32(&[], &[0.0]).0;
        let mut specs = OutSpecs::new();
        assert!(CatKernel
            .infer(&[&a, &i], &[], &dim_attrs(&[0]), &mut specs)
            .unwrap_err()
            .contains("cast to one dtype"));
        let e = CatKernel.infer(&[&a, &b], &[], &dim_attrs(&[1]), &mut specs).unwrap_err();
        assert!(e.contains("sizes must match except in dimension 1"), "{e}");
        assert!(CatKernel.infer(&[&s, &s], &[], &dim_attrs(&[0]), &mut specs).unwrap_err().contains("0-d"));
        assert!(CatKernel
            .infer(&[&a], &[], &dim_attrs(&[2]), &mut specs)
            .unwrap_err()
            .contains("out of range"));
        assert!(CatKernel.infer(&[], &[], &dim_attrs(&[0]), &mut specs).is_err());
    }

    #[test]
    fn index_select_matches_a_naive_take() {
        let mut g = Lcg(2);
        for _ in 0..60 {
            let rank = 1 + g.below(3);
            let shape: Vec<usize> = (0..rank).map(|_| g.below(4)).collect();
            let d = g.below(rank);
            let vals: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| i as f32 * 0.5).collect();
            let x = if g.below(2) == 0 { transposed(&shape, &vals) } else { t_f32(&shape, &vals) };
            let n = g.below(5);
            let picks: Vec<i64> = (0..n).map(|_| g.below(shape[d]) as i64).collect();
            if shape[d] == 0 && n > 0 {
                continue;
            }
            let idx = if g.below(2) == 0 {
                t_i64(&[n], &picks)
            } else {
                tensor(&[n], &picks.iter().map(|&v| v as i32).collect::<Vec<_>>())
            };
            let out = run_with(&IndexSelectKernel, dim_attrs(&[d as i64]), vec![x, idx], &[]).unwrap();
            let mut ws = shape.clone();
            ws[d] = n;
            assert_eq!(out[0].0.shape.as_slice(), ws.as_slice());
            let got = as_f32(&out[0]);
            for i in indices(&ws) {
                let mut j = i.clone();
                j[d] = picks[i[d]] as usize;
                assert_eq!(got[flat(&ws, &i)], vals[flat(&shape, &j)]);
            }
        }
    }

    #[test]
    fn indices_out_of_range_fail_at_run_time_naming_the_dim() {
        let x = || t_f32(&[2, 3], &[0.0; 6]);
        for bad in [3i64, -1, i64::MIN] {
            let e = run_with(&IndexSelectKernel, dim_attrs(&[1]), vec![x(), t_i64(&[2], &[0, bad])], &[])
                .unwrap_err();
            assert_eq!(e, format!("index_select: index {bad} is out of range for dimension 1 of size 3"));
            let e =
                run_with(&GatherKernel, dim_attrs(&[1]), vec![x(), t_i64(&[1, 1], &[bad])], &[]).unwrap_err();
            assert_eq!(e, format!("gather: index {bad} is out of range for dimension 1 of size 3"));
            let src = t_f32(&[1, 1], &[1.0]);
            let e = run_with(&ScatterKernel, dim_attrs(&[1, 1]), vec![x(), t_i64(&[1, 1], &[bad]), src], &[])
                .unwrap_err();
            assert!(e.starts_with(&format!("scatter: index {bad} is out")), "{e}");
            let e = run_with(
                &IndexAddKernel,
                dim_attrs(&[0]),
                vec![x(), t_i64(&[1], &[bad]), t_f32(&[1, 3], &[0.0; 3])],
                &[],
            );
            assert_eq!(
                e.unwrap_err(),
                format!("index_add: index {bad} is out of range for dimension 0 of size 2")
            );
        }
        let e = infer_err(&IndexSelectKernel, &[&x().0, &t_f32(&[1], &[0.0]).0], &[]);
        assert!(e.contains("index tensors are int64"), "{e}");
    }

    #[test]
    fn gather_matches_take_along_axis() {
        let mut g = Lcg(3);
        for _ in 0..60 {
            let rank = 1 + g.below(3);
            let shape: Vec<usize> = (0..rank).map(|_| 1 + g.below(4)).collect();
            let d = g.below(rank);
            let vals: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| i as f32).collect();
            let x = if g.below(2) == 0 { transposed(&shape, &vals) } else { t_f32(&shape, &vals) };
            let is: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(k, &s)| if k == d { g.below(5) } else { g.below(s + 1) })
                .collect();
            let n: usize = is.iter().product();
            let picks: Vec<i64> = (0..n).map(|_| g.below(shape[d]) as i64).collect();
            let out =
                run_with(&GatherKernel, dim_attrs(&[d as i64]), vec![x, t_i64(&is, &picks)], &[]).unwrap();
            let got = as_f32(&out[0]);
            for i in indices(&is) {
                let mut j = i.clone();
                j[d] = picks[flat(&is, &i)] as usize;
                assert_eq!(got[flat(&is, &i)], vals[flat(&shape, &j)]);
            }
        }
    }

    /// `vals` (row-major over `shape`, 2-D) as a transposed view of a storage laid out
    /// column-major: the kernels read it with strides `[1, rows]`.
    fn transposed_i64(shape: &[usize], vals: &[i64]) -> Owned {
        let (r, c) = (shape[0], shape[1]);
        let buf: Vec<i64> = (0..r * c).map(|k| vals[(k % r) * c + k / r]).collect();
        let (meta, data) = t_i64(&[c, r], &buf);
        (meta.with_layout(shape, &[1, r as isize], 0), data)
    }

    #[test]
    fn transposed_index_tensors_are_read_as_they_lie() {
        let x = || t_f32(&[3, 4], &(0..12).map(|v| v as f32).collect::<Vec<_>>());
        let picks = [2i64, 0, 1, 3, 3, 1];
        for d in [0usize, 1] {
            let idx = transposed_i64(&[2, 3], &picks.map(|v| v % 3));
            let out = run_with(&GatherKernel, dim_attrs(&[d as i64]), vec![x(), idx], &[]).unwrap();
            let got = as_f32(&out[0]);
            for (p, &pick) in picks.iter().enumerate() {
                let (i, j) = (p / 3, p % 3);
                let v = (pick % 3) as usize;
                let want = if d == 0 { v * 4 + j } else { i * 4 + v };
                assert_eq!(got[p], want as f32, "gather dim {d} at {p}");
            }
            let src = t_f32(&[2, 3], &[10.0, 20.0, 30.0, 40.0, 50.0, 60.0]);
            let idx = transposed_i64(&[2, 3], &picks.map(|v| v % 3));
            let out = run_with(&ScatterKernel, dim_attrs(&[d as i64, 1]), vec![x(), idx, src], &[]).unwrap();
            let mut want: Vec<f32> = (0..12).map(|v| v as f32).collect();
            for (p, &pick) in picks.iter().enumerate() {
                let (i, j) = (p / 3, p % 3);
                let v = (pick % 3) as usize;
                want[if d == 0 { v * 4 + j } else { i * 4 + v }] += (p as f32 + 1.0) * 10.0;
            }
            assert_eq!(as_f32(&out[0]), want, "scatter_add dim {d}");
        }
    }

    #[test]
    fn scatter_add_sums_repeated_indices_in_source_order() {
        // Three additions into element 0 of f16: rounded after each, in source order.
        let x = tensor(&[2], &[f16::from_f32(0.0), f16::from_f32(0.0)]);
        let src = tensor(&[3], &[f16::from_f32(2048.0), f16::from_f32(1.0), f16::from_f32(1.0)]);
        let out =
            run_with(&ScatterKernel, dim_attrs(&[0, 1]), vec![x, t_i64(&[3], &[0, 0, 0]), src], &[]).unwrap();
        // 2048 + 1 rounds to 2048 (ties to even), twice.
        assert_eq!(values::<f16>(&out[0]), [f16::from_f32(2048.0), f16::from_f32(0.0)]);
        let mut g = Lcg(4);
        for _ in 0..40 {
            let rank = 1 + g.below(3);
            let shape: Vec<usize> = (0..rank).map(|_| 1 + g.below(4)).collect();
            let d = g.below(rank);
            let xv: Vec<f32> = (0..shape.iter().product::<usize>()).map(|i| i as f32).collect();
            let is: Vec<usize> = shape
                .iter()
                .enumerate()
                .map(|(k, &s)| if k == d { g.below(5) } else { g.below(s + 1) })
                .collect();
            let n: usize = is.iter().product();
            let picks: Vec<i64> = (0..n).map(|_| g.below(shape[d]) as i64).collect();
            let sv: Vec<f32> = (0..n).map(|i| 1000.0 + i as f32).collect();
            for reduce in [0i64, 1, 2] {
                let out = run_with(
                    &ScatterKernel,
                    dim_attrs(&[d as i64, reduce]),
                    vec![transposed(&shape, &xv), t_i64(&is, &picks), t_f32(&is, &sv)],
                    &[],
                )
                .unwrap();
                let mut want = xv.clone();
                for i in indices(&is) {
                    let mut j = i.clone();
                    j[d] = picks[flat(&is, &i)] as usize;
                    let (t, s) = (flat(&shape, &j), sv[flat(&is, &i)]);
                    want[t] = match reduce {
                        0 => s,
                        1 => want[t] + s,
                        _ => want[t] * s,
                    };
                }
                assert_eq!(as_f32(&out[0]), want, "reduce {reduce}");
            }
        }
    }

    #[test]
    fn scatter_and_index_add_work_in_place_and_read_an_overlapping_source_first() {
        // x.scatter_(0, [1, 0], x): the source is the output itself.
        let x = t_f32(&[2], &[1.0, 2.0]);
        let idx = t_i64(&[2], &[1, 0]);
        compute_raw(
            &ScatterKernel,
            dim_attrs(&[0, 0]),
            &[(&x.0, &x.1), (&idx.0, &idx.1), (&x.0, &x.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        assert_eq!(as_f32(&x), [2.0, 1.0]);
        let x = t_f32(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let idx = t_i64(&[2], &[2, 2]);
        let src = t_f32(&[2, 2], &[1.0, 1.0, 10.0, 10.0]);
        let attrs = Attrs::default().with_params(&[0], &[Scalar::Float(0.5)]).unwrap();
        compute_raw(
            &IndexAddKernel,
            attrs,
            &[(&x.0, &x.1), (&idx.0, &idx.1), (&src.0, &src.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        assert_eq!(as_f32(&x), [1.0, 2.0, 3.0, 4.0, 10.5, 11.5]);
    }

    #[test]
    fn index_add_matches_add_at() {
        let mut g = Lcg(5);
        for _ in 0..40 {
            let rank = 1 + g.below(3);
            let shape: Vec<usize> = (0..rank).map(|_| 1 + g.below(4)).collect();
            let d = g.below(rank);
            let xv: Vec<i64> = (0..shape.iter().product::<usize>() as i64).collect();
            let n = g.below(5);
            let picks: Vec<i64> = (0..n).map(|_| g.below(shape[d]) as i64).collect();
            let mut ss = shape.clone();
            ss[d] = n;
            let sv: Vec<i64> = (0..ss.iter().product::<usize>() as i64).map(|v| v * 7 + 1).collect();
            let attrs = Attrs::default().with_params(&[d as i64], &[Scalar::Int(3)]).unwrap();
            let out = run_with(
                &IndexAddKernel,
                attrs,
                vec![t_i64(&shape, &xv), t_i64(&[n], &picks), t_i64(&ss, &sv)],
                &[],
            )
            .unwrap();
            let mut want = xv.clone();
            for i in indices(&ss) {
                let mut j = i.clone();
                j[d] = picks[i[d]] as usize;
                want[flat(&shape, &j)] += 3 * sv[flat(&ss, &i)];
            }
            assert_eq!(values::<i64>(&out[0]), want);
        }
    }

    #[test]
    fn every_dtype_moves_its_bits() {
        fn check<T: crate::vm::Element + PartialEq + std::fmt::Debug>(v: [T; 3]) {
            let x = || tensor(&[3], &v);
            let out = run_with(&IndexSelectKernel, dim_attrs(&[0]), vec![x(), t_i64(&[3], &[2, 0, 2])], &[])
                .unwrap();
            assert_eq!(values::<T>(&out[0]), [v[2], v[0], v[2]]);
            let out = run_with(&CatKernel, dim_attrs(&[0]), vec![x(), x()], &[]).unwrap();
            assert_eq!(values::<T>(&out[0]).len(), 6);
            let out = run_with(&GatherKernel, dim_attrs(&[0]), vec![x(), t_i64(&[1], &[1])], &[]).unwrap();
            assert_eq!(values::<T>(&out[0]), [v[1]]);
            let out = run_with(
                &ScatterKernel,
                dim_attrs(&[0, 0]),
                vec![x(), t_i64(&[1], &[0]), tensor(&[1], &v[2..])],
                &[],
            )
            .unwrap();
            assert_eq!(values::<T>(&out[0]), [v[2], v[1], v[2]]);
            run_with(
                &ScatterKernel,
                dim_attrs(&[0, 1]),
                vec![x(), t_i64(&[1], &[0]), tensor(&[1], &v[2..])],
                &[],
            )
            .unwrap();
            run_with(
                &IndexAddKernel,
                dim_attrs(&[0]),
                vec![x(), t_i64(&[1], &[0]), tensor(&[1], &v[2..])],
                &[],
            )
            .unwrap();
        }
        check([true, false, true]);
        check([1u8, 2, 255]);
        check([1i32, -2, 3]);
        check([1i64, i64::MIN, 3]);
        check([f16::from_f32(1.5), f16::from_f32(-2.0), f16::INFINITY]);
        check([bf16::from_f32(1.5), bf16::from_f32(-0.0), bf16::INFINITY]);
        check([1.5f32, -0.0, 3.0]);
        check([1.5f64, 2.0, f64::NEG_INFINITY]);
    }

    #[test]
    fn empty_and_zero_d_operands() {
        let out =
            run_with(&IndexSelectKernel, dim_attrs(&[0]), vec![t_f32(&[0, 2], &[]), t_i64(&[0], &[])], &[])
                .unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0, 2]);
        let out =
            run_with(&IndexSelectKernel, dim_attrs(&[0]), vec![t_f32(&[], &[4.0]), t_i64(&[1], &[0])], &[])
                .unwrap();
        assert_eq!(as_f32(&out[0]), [4.0]);
        let out = run_with(&GatherKernel, dim_attrs(&[0]), vec![t_f32(&[], &[4.0]), t_i64(&[], &[0])], &[])
            .unwrap();
        assert_eq!(as_f32(&out[0]), [4.0]);
        let out =
            run_with(&CatKernel, dim_attrs(&[0]), vec![t_f32(&[0], &[]), t_f32(&[0], &[])], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0]);
    }
}
