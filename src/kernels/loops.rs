//! The elementwise drivers: each checks a call's operands ([`Operand`]), copies an input
//! that overlaps the output other than element for element ([`Staged`]), and runs a typed
//! inner loop over every run of a [`Plan`]: [`fill`] (no input), [`map`] (one input),
//! [`zip`] (two inputs), [`copy_elements`] (bytes, any dtype).
//!
//! The inner loops take the operands as addresses and strides. Where every stride is 1 they
//! loop over slices, which the compiler vectorises; an input that is exactly the output
//! (in place) is then read through the output's slice, element by element before the write,
//! since a shared and a mutable slice of the same memory may not coexist. An input of
//! stride 0 along the run (broadcast) is read once. Any other run is a loop over addresses.

use std::slice;

use super::dtype::Elem;
use super::iter::{broadcasts_to, same_shape, share, Operand, Order, Plan, Share, Staged};
use crate::alloc::Storage;
use crate::vm::{DType, KernelCtx, TensorMeta, TensorView, TensorViewMut};

/// Input `i` of a call.
#[inline]
pub(crate) fn input<'c, 't>(ctx: &'c KernelCtx<'_, 't>, i: usize) -> Result<&'c TensorView<'t>, String> {
    ctx.inputs.get(i).ok_or_else(|| missing("input", i))
}

/// Output `i` of a call.
#[inline]
pub(crate) fn output<'c, 't>(ctx: &'c KernelCtx<'_, 't>, i: usize) -> Result<&'c TensorViewMut<'t>, String> {
    ctx.outputs.get(i).ok_or_else(|| missing("output", i))
}

#[cold]
#[inline(never)]
fn missing(kind: &str, i: usize) -> String {
    format!("missing {kind} {i}")
}

/// Refuse a call whose input count is not `n` (a caller that skipped `infer`).
#[inline]
pub(crate) fn expect_count(ctx: &KernelCtx<'_, '_>, n: usize) -> Result<(), String> {
    if ctx.inputs.len() == n {
        Ok(())
    } else {
        Err(super::count_error(n, ctx.inputs.len()))
    }
}

/// Set every element of output 0 to `v`.
pub(crate) fn fill<O: Elem>(ctx: &KernelCtx<'_, '_>, v: O) -> Result<(), String> {
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, O::DTYPE)?;
    if o.numel == 0 {
        return Ok(());
    }
    if o.contiguous {
        // SAFETY: the operand was checked to lie in its storage: `numel` elements of `O`
        // from `first`, aligned (storages are aligned to 8 bytes at least, offsets count
        // whole elements). The instruction holds the write access to the storage, and no
        // other reference to these bytes is alive (inputs are not read).
        unsafe { slice::from_raw_parts_mut(o.first.cast::<O>(), o.numel) }.fill(v);
        return Ok(());
    }
    Plan::new(&[&o], Order::Memory).for_each_run(|p, s, n| {
        for i in 0..n as isize {
            // SAFETY: each run's elements lie in the checked layout.
            unsafe { *p[0].cast::<O>().offset(i * s[0]) = v };
        }
    });
    Ok(())
}

/// `out = f(x)` elementwise: input 0 broadcast to output 0's shape.
///
/// Out of line: a kernel's `compute` is a `match` over dtypes calling one of these, so that
/// each dtype's checks and loops keep a small frame of their own (inlined, eight dtypes'
/// operands shared one frame, copied through the stack on every call).
#[inline(never)]
pub(crate) fn map<O: Elem, A: Elem>(ctx: &KernelCtx<'_, '_>, f: impl Fn(A) -> O) -> Result<(), String> {
    expect_count(ctx, 1)?;
    let (x, out) = (input(ctx, 0)?, output(ctx, 0)?);
    if let Some(n) = dense(out.meta, out.data, O::DTYPE) {
        if same_dense(x.meta, x.data, A::DTYPE, (out.meta, out.data), n) {
            // SAFETY: both operands are contiguous from element 0 of storages that hold
            // their `n` elements (`dense`, `same_dense`); the input is exactly the output's
            // elements, of its type, or disjoint from them (`same_dense`).
            unsafe { unary_run(out.data.as_mut_ptr().cast::<O>(), 1, x.data.as_ptr().cast::<A>(), 1, n, &f) };
            return Ok(());
        }
    }
    let o = Operand::output(out.meta, out.data, 0, O::DTYPE)?;
    let a = Operand::input(x.meta, x.data, 0, A::DTYPE)?;
    let same = same_shape(a.shape, o.shape);
    if !same {
        broadcasts_to(0, x.meta, o.shape)?;
    }
    if o.numel == 0 {
        return Ok(());
    }
    let sa = share(&a, x.data, &o, out.data);
    if sa != Share::Overlap && o.contiguous && a.contiguous && same {
        // SAFETY: both operands were checked against their storages; `a` is disjoint from
        // the output or exactly it (`unary_run`'s contract).
        unsafe { unary_run(o.first.cast::<O>(), 1, a.first.cast::<A>(), 1, o.numel, &f) };
        return Ok(());
    }
    let staged = if sa == Share::Overlap { Some(Staged::new(&a)?) } else { None };
    let a = staged.as_ref().map_or(a, Staged::operand);
    Plan::new(&[&o, &a], Order::Memory).for_each_run(|p, s, n| {
        // SAFETY: as above, per run; an overlapping input was staged.
        unsafe { unary_run(p[0].cast::<O>(), s[0], p[1].cast::<A>(), s[1], n, &f) }
    });
    Ok(())
}

/// `out = f(a, b)` elementwise: inputs 0 and 1 broadcast to output 0's shape. Out of line,
/// as [`map`].
#[inline(never)]
pub(crate) fn zip<O: Elem, A: Elem, B: Elem>(
    ctx: &KernelCtx<'_, '_>,
    f: impl Fn(A, B) -> O,
) -> Result<(), String> {
    expect_count(ctx, 2)?;
    let (x, y, out) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
    if let Some(n) = dense(out.meta, out.data, O::DTYPE) {
        if same_dense(x.meta, x.data, A::DTYPE, (out.meta, out.data), n)
            && same_dense(y.meta, y.data, B::DTYPE, (out.meta, out.data), n)
        {
            // SAFETY: as in `map`'s dense case, for both inputs.
            unsafe {
                binary_run(
                    (out.data.as_mut_ptr().cast::<O>(), 1),
                    (x.data.as_ptr().cast::<A>(), 1),
                    (y.data.as_ptr().cast::<B>(), 1),
                    n,
                    &f,
                )
            };
            return Ok(());
        }
    }
    let o = Operand::output(out.meta, out.data, 0, O::DTYPE)?;
    let a = Operand::input(x.meta, x.data, 0, A::DTYPE)?;
    let b = Operand::input(y.meta, y.data, 1, B::DTYPE)?;
    let same = same_shape(a.shape, o.shape) && same_shape(b.shape, o.shape);
    if !same {
        broadcasts_to(0, x.meta, o.shape)?;
        broadcasts_to(1, y.meta, o.shape)?;
    }
    if o.numel == 0 {
        return Ok(());
    }
    let (sa, sb) = (share(&a, x.data, &o, out.data), share(&b, y.data, &o, out.data));
    if sa != Share::Overlap && sb != Share::Overlap && o.contiguous && a.contiguous && b.contiguous && same {
        // SAFETY: every operand was checked against its storage; each input is disjoint
        // from the output or exactly it (`binary_run`'s contract).
        unsafe {
            binary_run(
                (o.first.cast::<O>(), 1),
                (a.first.cast::<A>(), 1),
                (b.first.cast::<B>(), 1),
                o.numel,
                &f,
            )
        };
        return Ok(());
    }
    let stage =
        |op: &Operand<'_>, s: Share| if s == Share::Overlap { Staged::new(op).map(Some) } else { Ok(None) };
    let (ta, tb) = (stage(&a, sa)?, stage(&b, sb)?);
    let a = ta.as_ref().map_or(a, Staged::operand);
    let b = tb.as_ref().map_or(b, Staged::operand);
    Plan::new(&[&o, &a, &b], Order::Memory).for_each_run(|p, s, n| {
        // SAFETY: as above, per run; overlapping inputs were staged.
        unsafe { binary_run((p[0].cast(), s[0]), (p[1].cast(), s[1]), (p[2].cast(), s[2]), n, &f) }
    });
    Ok(())
}

/// The element count of `meta` if it is the common case of an eager loop, checked cheaply:
/// a non-empty tensor of `dtype` whose elements lie in row-major order from element 0 of
/// `data`, which holds them all. `None` sends the kernel down its general path (which
/// checks everything again, and reports what is wrong).
#[inline(always)]
fn dense(meta: &TensorMeta, data: &Storage, dtype: DType) -> Option<usize> {
    if meta.dtype != dtype || meta.offset != 0 || meta.strides.len() != meta.shape.len() {
        return None;
    }
    let mut expected = 1usize;
    for (&d, &st) in meta.shape.iter().zip(&meta.strides).rev() {
        if d != 1 && st != expected as isize {
            return None;
        }
        expected = expected.checked_mul(d)?;
    }
    (expected != 0 && expected.checked_mul(dtype.size())? <= data.len()).then_some(expected)
}

/// Whether input `meta` over `data` is dense (as [`dense`]) with the shape of output `out`
/// over `out_data`, `n` elements (so element `i` of each is at index `i`), and either exactly
/// the output's elements (the same address and dtype) or disjoint from them.
#[inline(always)]
fn same_dense(
    meta: &TensorMeta,
    data: &Storage,
    dtype: DType,
    (out, out_data): (&TensorMeta, &Storage),
    n: usize,
) -> bool {
    let (p, o) = (data.as_ptr() as usize, out_data.as_ptr() as usize);
    // `n` elements of the output's dtype fit in its storage (`dense`), so no overflow.
    let (bytes, out_bytes) = (n * dtype.size(), n * out.dtype.size());
    meta.dtype == dtype
        && meta.offset == 0
        && meta.shape.len() == out.shape.len()
        // Element by element: a slice comparison calls `memcmp`, which costs more than the
        // whole of a one-element kernel.
        && meta.shape.iter().zip(&out.shape).all(|(a, b)| a == b)
        && dense(meta, data, dtype).is_some()
        && bytes <= data.len()
        && if p == o { dtype == out.dtype } else { p + bytes <= o || o + out_bytes <= p }
}

/// Whether an input's address is the output's.
#[inline(always)]
fn same_address<A, O>(a: *const A, o: *mut O) -> bool {
    std::ptr::eq(a.cast::<u8>(), o.cast_const().cast::<u8>())
}

/// `n` elements: `out[i·so] = f(a[i·sa])`.
///
/// # Safety
/// Each address plus every multiple of its stride below `n` is an element of a checked
/// layout; the instruction holds the write access to the output's storage; the input is
/// either disjoint from the output's elements or exactly them (the same address and
/// stride, and so the same type).
#[inline(always)]
unsafe fn unary_run<O: Elem, A: Elem>(
    po: *mut O,
    so: isize,
    pa: *const A,
    sa: isize,
    n: usize,
    f: &impl Fn(A) -> O,
) {
    match (so, sa) {
        (1, 1) => {
            // SAFETY: `n` elements from `po` (the contract); this is the only reference to
            // them while it lives (the input is disjoint, or read through it).
            let out = unsafe { slice::from_raw_parts_mut(po, n) };
            if same_address(pa, po) {
                for o in out.iter_mut() {
                    // SAFETY: the input is exactly the output: the same element, same type.
                    let x = unsafe { (o as *mut O).cast::<A>().read() };
                    *o = f(x);
                }
            } else {
                // SAFETY: `n` elements from `pa`, disjoint from the output's.
                let a = unsafe { slice::from_raw_parts(pa, n) };
                for (o, &x) in out.iter_mut().zip(a) {
                    *o = f(x);
                }
            }
        }
        (1, 0) => {
            // SAFETY: one input element, disjoint from the output (a stride of 0 is not the
            // output's), read before any write; `n` output elements as above.
            let v = f(unsafe { pa.read() });
            unsafe { slice::from_raw_parts_mut(po, n) }.fill(v);
        }
        _ => {
            for i in 0..n as isize {
                // SAFETY: elements of the checked layouts; an element shared with the output
                // is read before it is written.
                unsafe { po.offset(i * so).write(f(pa.offset(i * sa).read())) };
            }
        }
    }
}

/// `n` elements: `out[i·so] = f(a[i·sa], b[i·sb])`.
///
/// # Safety
/// As [`unary_run`], for both inputs.
#[inline(always)]
unsafe fn binary_run<O: Elem, A: Elem, B: Elem>(
    (po, so): (*mut O, isize),
    (pa, sa): (*const A, isize),
    (pb, sb): (*const B, isize),
    n: usize,
    f: &impl Fn(A, B) -> O,
) {
    let (a_is_out, b_is_out) = (same_address(pa, po), same_address(pb, po));
    match (so, sa, sb) {
        (1, 1, 1) => {
            // SAFETY: `n` output elements; no other reference to them while this lives
            // (each input is disjoint, or read through this slice).
            let out = unsafe { slice::from_raw_parts_mut(po, n) };
            // SAFETY (the reads below): an input that is the output is the same element of
            // the same type; one that is not is `n` elements disjoint from the output's.
            match (a_is_out, b_is_out) {
                (false, false) => {
                    let (a, b) = unsafe { (slice::from_raw_parts(pa, n), slice::from_raw_parts(pb, n)) };
                    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
                        *o = f(x, y);
                    }
                }
                (true, false) => {
                    let b = unsafe { slice::from_raw_parts(pb, n) };
                    for (o, &y) in out.iter_mut().zip(b) {
                        let x = unsafe { (o as *mut O).cast::<A>().read() };
                        *o = f(x, y);
                    }
                }
                (false, true) => {
                    let a = unsafe { slice::from_raw_parts(pa, n) };
                    for (o, &x) in out.iter_mut().zip(a) {
                        let y = unsafe { (o as *mut O).cast::<B>().read() };
                        *o = f(x, y);
                    }
                }
                (true, true) => {
                    for o in out.iter_mut() {
                        let p = o as *mut O;
                        let (x, y) = unsafe { (p.cast::<A>().read(), p.cast::<B>().read()) };
                        *o = f(x, y);
                    }
                }
            }
        }
        // One input broadcast along the run: read once (a stride of 0 is never the
        // output's, so that input is disjoint from it).
        (1, 1, 0) => {
            // SAFETY: as in the first arm.
            let (out, y) = unsafe { (slice::from_raw_parts_mut(po, n), pb.read()) };
            if a_is_out {
                for o in out.iter_mut() {
                    *o = f(unsafe { (o as *mut O).cast::<A>().read() }, y);
                }
            } else {
                for (o, &x) in out.iter_mut().zip(unsafe { slice::from_raw_parts(pa, n) }) {
                    *o = f(x, y);
                }
            }
        }
        (1, 0, 1) => {
            // SAFETY: as in the first arm.
            let (out, x) = unsafe { (slice::from_raw_parts_mut(po, n), pa.read()) };
            if b_is_out {
                for o in out.iter_mut() {
                    *o = f(x, unsafe { (o as *mut O).cast::<B>().read() });
                }
            } else {
                for (o, &y) in out.iter_mut().zip(unsafe { slice::from_raw_parts(pb, n) }) {
                    *o = f(x, y);
                }
            }
        }
        _ => {
            for i in 0..n as isize {
                // SAFETY: elements of the checked layouts; an element shared with the output
                // is read before it is written.
                unsafe {
                    let v = f(pa.offset(i * sa).read(), pb.offset(i * sb).read());
                    po.offset(i * so).write(v);
                }
            }
        }
    }
}

/// Copy `src`'s elements to `dst`'s (one element size; `src` broadcast to `dst`'s shape),
/// bit for bit. `src` is disjoint from `dst` or exactly it.
pub(crate) fn copy_elements(dst: &Operand<'_>, src: &Operand<'_>) {
    if dst.numel == 0 {
        return;
    }
    let size = dst.dtype.size();
    if dst.contiguous && src.contiguous && same_shape(dst.shape, src.shape) {
        if dst.first != src.first {
            // SAFETY: `numel` elements of each operand, checked against their storages, and
            // disjoint (the contract); the instruction holds the write access to `dst`'s.
            unsafe { std::ptr::copy_nonoverlapping(src.first, dst.first, dst.numel * size) };
        }
        return;
    }
    let plan = Plan::new(&[dst, src], Order::Memory);
    // Elements move as unsigned integers of their width: every bit pattern is kept.
    match size {
        1 => plan.for_each_run(|p, s, n| unsafe { move_run::<u8>(p, s, n) }),
        2 => plan.for_each_run(|p, s, n| unsafe { move_run::<u16>(p, s, n) }),
        4 => plan.for_each_run(|p, s, n| unsafe { move_run::<u32>(p, s, n) }),
        _ => plan.for_each_run(|p, s, n| unsafe { move_run::<u64>(p, s, n) }),
    }
}

/// One run of [`copy_elements`].
///
/// # Safety
/// As [`unary_run`]: `p[0]` and `p[1]` with strides `s[0]`, `s[1]` name `n` elements of `T`
/// each of checked layouts, disjoint or the same.
#[inline(always)]
unsafe fn move_run<T: Copy>(p: [*mut u8; 3], s: [isize; 3], n: usize) {
    let (po, pa) = (p[0].cast::<T>(), p[1].cast_const().cast::<T>());
    match (s[0], s[1]) {
        (1, 1) if po.cast_const() == pa => {}
        // SAFETY: disjoint runs of `n` elements (the contract).
        (1, 1) => unsafe { std::ptr::copy_nonoverlapping(pa, po, n) },
        // SAFETY: one input element, `n` output elements, disjoint.
        (1, 0) => unsafe { slice::from_raw_parts_mut(po, n).fill(pa.read()) },
        _ => {
            for i in 0..n as isize {
                // SAFETY: elements of the checked layouts.
                unsafe { po.offset(i * s[0]).write(pa.offset(i * s[1]).read()) };
            }
        }
    }
}
