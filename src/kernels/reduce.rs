//! Reductions: `sum` (every element to one) and `sum_rows` (the rows of a matrix to one).
//!
//! Both take any layout and every dtype. Floats add in their compute type (`f32` for
//! `f16`, `bf16` and `f32`; `f64` for `f64`) in a fixed order, and round once on store;
//! `bool` and the integers add as wrapping `i64`s and give an `i64`, as PyTorch's `sum`.

use std::slice;

use super::dtype::{dispatch, int_of, zero, Elem, Ring};
use super::elementwise::rows_cols;
use super::iter::{for_each_slab, Operand, Order, Plan};
use super::loops::{expect_count, input, output};
use super::{expect_inputs, refusal, Dtypes};
use crate::vm::{
    Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta, TensorView, TensorViewMut,
};

/// The dtype of a sum of `dtype` values: `i64` for `bool` and the integers, the dtype itself
/// for floats.
pub(super) fn sum_dtype(dtype: DType) -> DType {
    if dtype.is_floating() {
        dtype
    } else {
        DType::I64
    }
}

/// `sum`: one input; without a parameter list, a scalar output (shape `[]`) holding the sum
/// of all elements; with one (`[dims..., keepdim]`), the sums along those dims
/// (`kernels::reduce_dims`, in the same order per output element). The output is an `i64`
/// for `bool` and the integers, of the input's dtype for floats. Floats add in the order of
/// [`sum_f32`], over the elements in row-major order of their index whatever the layout,
/// which does not depend on the machine; integers wrap (in any order: wrapping addition is
/// associative). The sum of no elements is 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumKernel;

impl OpKernel for SumKernel {
    fn name(&self) -> &'static str {
        "sum"
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
        if !attrs.params().is_empty() {
            return super::reduce_dims::infer_reduce(
                "sum",
                super::reduce_dims::Kind::Sum,
                inputs,
                attrs,
                outputs,
            );
        }
        expect_inputs(inputs, 1)?;
        outputs.push(OutSpec { shape: Default::default(), dtype: sum_dtype(inputs[0].dtype) });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        if !ctx.attrs.params().is_empty() {
            return super::reduce_dims::compute_reduce("sum", super::reduce_dims::Kind::Sum, ctx);
        }
        expect_count(ctx, 1)?;
        let (x, out) = (input(ctx, 0)?, output(ctx, 0)?);
        let dtype = x.meta.dtype;
        dispatch!(dtype, floating, T => sum_float::<T>(x, out),
            dispatch!(dtype, integral, T => sum_int::<T>(x, out), Err(refusal("sum", dtype, Dtypes::All))))
    }
}

/// Sums of up to this many elements add one element at a time in index order (16 KiB of
/// `f32`, in L1: the serial chain costs a few microseconds at most). It keeps every such sum
/// what it was before [`sum_f32`] had partial sums: those of the shipped traces and of the
/// built-in programs at their default sizes among them, whose checksums are exact.
pub const SEQUENTIAL_SUM_MAX: usize = 4096;

/// Partial sums [`sum_f32`] keeps above [`SEQUENTIAL_SUM_MAX`]: enough independent chains
/// to hide the latency of an addition on any core measured (8 SSE registers of 4 lanes,
/// or 2 of AVX-512), so that a large sum runs at memory bandwidth rather than at one
/// addition per latency.
pub(super) const LANES: usize = 32;

/// The `f32` sum of the `sum` kernel, in its exact order, for references that must agree
/// with it bit for bit:
///
/// - up to [`SEQUENTIAL_SUM_MAX`] elements, `((0 + x0) + x1) + ...` in index order;
/// - above, 32 partial sums, partial `j` adding `x[i]` for `i ≡ j (mod 32)` in increasing `i`
///   over the whole 32-element groups, then combined as a tree (partial `j` += partial
///   `j + 16`, then `+ 8`, `+ 4`, `+ 2`, `+ 1`), then the last `len % 32` elements added to
///   the total in index order.
///
/// The order is fixed by this code, not by the SIMD width the compiler picks, so the result
/// is the same on every machine. It is also usually closer to the exact sum than the serial
/// chain is: each partial sum holds a 32nd of the terms. Every float dtype sums in this
/// order, in its compute type.
pub fn sum_f32(x: &[f32]) -> f32 {
    sum_in_order(x)
}

/// [`sum_f32`]'s order in any compute type.
pub(super) fn sum_in_order<C: Ring>(x: &[C]) -> C {
    if x.len() <= SEQUENTIAL_SUM_MAX {
        return x.iter().fold(C::ZERO, |acc, &v| acc.add(v));
    }
    let mut acc = [C::ZERO; LANES];
    let groups = x.chunks_exact(LANES);
    let tail = groups.remainder();
    for g in groups {
        for (a, &v) in acc.iter_mut().zip(g) {
            *a = a.add(v);
        }
    }
    tail.iter().fold(tree(&mut acc), |t, &v| t.add(v))
}

/// The partial sums combined: partial `j` += partial `j + w` for `w` = 16, 8, 4, 2, 1.
fn tree<C: Ring>(acc: &mut [C; LANES]) -> C {
    let mut width = LANES / 2;
    while width > 0 {
        let (lo, hi) = acc.split_at_mut(width);
        for (a, &b) in lo.iter_mut().zip(&hi[..width]) {
            *a = a.add(b);
        }
        width /= 2;
    }
    acc[0]
}

/// [`sum_in_order`] of `n` values given a few at a time, in index order.
pub(super) struct Ordered<C> {
    /// Values below this index go to the partial sums (0 for a sequential sum).
    whole: usize,
    /// The number of values seen.
    pos: usize,
    /// The running total: of everything (sequential), or of the tree and the tail.
    acc: C,
    lanes: [C; LANES],
}

impl<C: Ring> Ordered<C> {
    pub(super) fn new(n: usize) -> Self {
        let whole = if n <= SEQUENTIAL_SUM_MAX { 0 } else { n / LANES * LANES };
        Ordered { whole, pos: 0, acc: C::ZERO, lanes: [C::ZERO; LANES] }
    }

    /// The order above [`SEQUENTIAL_SUM_MAX`] at every length (the lane order of
    /// `softmax`, `log_softmax` and `layer_norm`, which no shipped checksum holds to the
    /// sequential one, and whose rows are short).
    pub(super) fn lanes(n: usize) -> Self {
        Ordered { whole: n / LANES * LANES, pos: 0, acc: C::ZERO, lanes: [C::ZERO; LANES] }
    }

    #[inline(always)]
    pub(super) fn push(&mut self, v: C) {
        if self.pos < self.whole {
            let lane = &mut self.lanes[self.pos % LANES];
            *lane = lane.add(v);
        } else {
            if self.pos == self.whole && self.whole > 0 {
                self.acc = tree(&mut self.lanes);
            }
            self.acc = self.acc.add(v);
        }
        self.pos += 1;
    }

    /// Values `xs`, next in index order.
    pub(super) fn push_slice(&mut self, mut xs: &[C]) {
        while self.pos < self.whole && self.pos % LANES != 0 && !xs.is_empty() {
            self.push(xs[0]);
            xs = &xs[1..];
        }
        if self.pos < self.whole {
            let groups = xs.len().min(self.whole - self.pos) / LANES * LANES;
            for g in xs[..groups].chunks_exact(LANES) {
                for (a, &v) in self.lanes.iter_mut().zip(g) {
                    *a = a.add(v);
                }
            }
            self.pos += groups;
            xs = &xs[groups..];
        }
        for &v in xs {
            self.push(v);
        }
    }

    pub(super) fn finish(mut self) -> C {
        if self.whole > 0 && self.pos == self.whole {
            tree(&mut self.lanes)
        } else {
            self.acc
        }
    }
}

/// The most elements a strided sum copies to a contiguous buffer at a time (256 KiB of
/// `f32`: within L2).
const SLAB: usize = 1 << 16;

/// Values `xs`, next in index order, in their compute type (converted a block at a time
/// where the two types differ).
pub(super) fn push_values<T: Elem>(ord: &mut Ordered<T::C>, xs: &[T])
where
    T::C: Ring,
{
    match T::as_compute(xs) {
        Some(c) => ord.push_slice(c),
        None => {
            let mut buf = [zero::<T>(); 1024];
            for chunk in xs.chunks(buf.len()) {
                for (b, &v) in buf.iter_mut().zip(chunk) {
                    *b = v.load();
                }
                ord.push_slice(&buf[..chunk.len()]);
            }
        }
    }
}

/// Output 0 of a reduction as `dtype`, checked to hold `numel` elements.
fn reduced<'t>(out: &'t TensorViewMut<'t>, dtype: DType, numel: usize) -> Result<Operand<'t>, String> {
    let o = Operand::output(out.meta, out.data, 0, dtype)?;
    if o.numel != numel {
        return Err(format!(
            "output 0 is {} but the reduction writes {numel} element(s)",
            out.meta.describe()
        ));
    }
    Ok(o)
}

fn sum_float<T: Elem>(x: &TensorView<'_>, out: &TensorViewMut<'_>) -> Result<(), String>
where
    T::C: Ring,
{
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let o = reduced(out, T::DTYPE, 1)?;
    let total = if a.numel == 0 {
        zero::<T>()
    } else if a.contiguous {
        // SAFETY: the operand was checked: `numel` elements of `T` from `first`, aligned; the
        // slice is dropped before the output (which may share the storage) is written.
        let xs = unsafe { slice::from_raw_parts(a.first.cast_const().cast::<T>(), a.numel) };
        match T::as_compute(xs) {
            Some(c) => sum_in_order(c),
            None => {
                let mut ord = Ordered::new(xs.len());
                push_values(&mut ord, xs);
                ord.finish()
            }
        }
    } else {
        // Through contiguous slabs: walking a transposed input in its logical order would
        // touch a new cache line (and page) at every element.
        let mut ord = Ordered::new(a.numel);
        let slabbed = for_each_slab(&a, SLAB, |p, n| {
            // SAFETY: `n` elements of `T` of a buffer of the slab's, aligned to 8 bytes.
            push_values(&mut ord, unsafe { slice::from_raw_parts(p.cast::<T>(), n) })
        })?;
        if !slabbed {
            Plan::new(&[&a], Order::Logical).for_each_run(|p, s, n| {
                for i in 0..n as isize {
                    // SAFETY: elements of the checked layout, in row-major order.
                    ord.push(unsafe { p[0].cast::<T>().offset(i * s[0]).read() }.load());
                }
            });
        }
        ord.finish()
    };
    // SAFETY: one element of the checked output; no reference to the input is alive.
    unsafe { o.first.cast::<T>().write(T::store(total)) };
    Ok(())
}

fn sum_int<T: Elem>(x: &TensorView<'_>, out: &TensorViewMut<'_>) -> Result<(), String> {
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let o = reduced(out, DType::I64, 1)?;
    let mut total = 0i64;
    if a.numel > 0 {
        Plan::new(&[&a], Order::Memory).for_each_run(|p, s, n| {
            for i in 0..n as isize {
                // SAFETY: elements of the checked layout.
                total = total.wrapping_add(int_of(unsafe { p[0].cast::<T>().offset(i * s[0]).read() }));
            }
        });
    }
    // SAFETY: one element of the checked output; the input is no longer read.
    unsafe { o.first.cast::<i64>().write(total) };
    Ok(())
}

/// `sum_rows`: input `x: [n, k]`; output `[k]` with `out[j] = sum over i of x[i][j]` (the
/// sum over the rows, that is the column sums: the gradient of a bias added by
/// `add_bias`). Each sum adds in increasing `i` from 0, in the compute type; the sum of no
/// rows is 0. The output's dtype is [`sum`](SumKernel)'s rule.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumRowsKernel;

impl OpKernel for SumRowsKernel {
    fn name(&self) -> &'static str {
        "sum_rows"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        let (_, k) = rows_cols(inputs[0], 0)?;
        outputs.push(OutSpec { shape: [k].into_iter().collect(), dtype: sum_dtype(inputs[0].dtype) });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        expect_count(ctx, 1)?;
        let (x, out) = (input(ctx, 0)?, output(ctx, 0)?);
        let dtype = x.meta.dtype;
        dispatch!(dtype, floating, T => sum_rows::<T, T, _>(x, out, |v: T| v.load()),
            dispatch!(dtype, integral, T => sum_rows::<T, i64, i64>(x, out, int_of),
                Err(refusal("sum_rows", dtype, Dtypes::All))))
    }
}

/// Column sums of `x: [n, k]` of `T`, accumulated in `C` (each value through `load`), stored
/// as `O`.
fn sum_rows<T: Elem, O: Elem<C = C>, C: Ring>(
    x: &TensorView<'_>,
    out: &TensorViewMut<'_>,
    load: impl Fn(T) -> C,
) -> Result<(), String> {
    let (n, k) = rows_cols(x.meta, 0)?;
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let o = reduced(out, O::DTYPE, k)?;
    if o.shape != [k] {
        return Err(format!(
            "output 0 is {} but sum_rows of {} gives [{k}]",
            out.meta.describe(),
            x.meta.describe()
        ));
    }
    if k == 0 {
        return Ok(());
    }
    let mut acc: Vec<C> = Vec::new();
    acc.try_reserve_exact(k).map_err(|e| format!("no memory for {k} column sums: {e}"))?;
    acc.resize(k, C::ZERO);
    if n > 0 {
        let (rs, cs) = (a.strides[0] * T::DTYPE.size() as isize, a.strides[1]);
        let mut row = a.first.cast_const();
        for _ in 0..n {
            if cs == 1 {
                // SAFETY: row `i` of the checked layout: `k` contiguous elements.
                let xs = unsafe { slice::from_raw_parts(row.cast::<T>(), k) };
                for (s, &v) in acc.iter_mut().zip(xs) {
                    *s = s.add(load(v));
                }
            } else {
                for (j, s) in acc.iter_mut().enumerate() {
                    // SAFETY: element `[i, j]` of the checked layout.
                    *s = s.add(load(unsafe { row.cast::<T>().offset(j as isize * cs).read() }));
                }
            }
            row = row.wrapping_offset(rs);
        }
    }
    let os = o.strides[0];
    for (j, &s) in acc.iter().enumerate() {
        // SAFETY: element `j` of the checked output; the input is no longer read.
        unsafe { o.first.cast::<O>().offset(j as isize * os).write(O::store(s)) };
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, as_i64, compute_raw, infer_err, run, t_f32, t_i64, tensor, values,
    };
    use crate::vm::{bf16, f16};

    #[test]
    fn sum_both_dtypes() {
        let out = run(&SumKernel, 0.0, vec![t_f32(&[2, 2], &[1.0, 2.5, -0.5, 4.0])], &[]).unwrap();
        assert!(out[0].0.shape.is_empty());
        assert_eq!(out[0].0.dtype, DType::F32);
        assert_eq!(as_f32(&out[0]), vec![7.0]);
        let out = run(&SumKernel, 0.0, vec![t_i64(&[3], &[i64::MAX, 1, 5])], &[]).unwrap();
        assert_eq!(out[0].0.dtype, DType::I64);
        assert_eq!(as_i64(&out[0]), vec![i64::MIN + 5]);
    }

    #[test]
    fn integral_sums_are_i64() {
        let out = run(&SumKernel, 0.0, vec![tensor(&[3], &[true, false, true])], &[]).unwrap();
        assert_eq!(out[0].0.dtype, DType::I64);
        assert_eq!(as_i64(&out[0]), vec![2]);
        let out = run(&SumKernel, 0.0, vec![tensor(&[2], &[255u8, 255])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![510]);
        let out = run(&SumRowsKernel, 0.0, vec![tensor(&[2, 2], &[i32::MAX, 1, 1, 2])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i32::MAX as i64 + 1, 3]);
    }

    #[test]
    fn half_float_sums_accumulate_in_f32() {
        // 2048 + 1 + 1 in f16 steps would stay 2048 (2049 rounds to even); in f32 it is 2050.
        let x = tensor(&[3], &[f16::from_f32(2048.0), f16::ONE, f16::ONE]);
        let out = run(&SumKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(out[0].0.dtype, DType::F16);
        assert_eq!(values::<f16>(&out[0]), vec![f16::from_f32(2050.0)]);
        let x = tensor(&[2, 1], &[bf16::from_f32(256.0), bf16::ONE]);
        let out = run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(values::<bf16>(&out[0]), vec![bf16::from_f32(257.0)]);
    }

    #[test]
    fn sum_is_sequential_in_f32() {
        // Index order in f32: (1e8 + 1) rounds back to 1e8 each time, then -1e8 leaves 0.
        let x = t_f32(&[4], &[1e8, 1.0, 1.0, -1e8]);
        assert_eq!(as_f32(&run(&SumKernel, 0.0, vec![x], &[]).unwrap()[0]), vec![0.0]);
    }

    /// The documented order, written out the long way.
    fn long_way(x: &[f32]) -> f32 {
        let len = x.len();
        if len <= SEQUENTIAL_SUM_MAX {
            return x.iter().fold(0.0, |a, &v| a + v);
        }
        let mut p = [0.0f32; 32];
        let whole = len / 32 * 32;
        for (i, &v) in x[..whole].iter().enumerate() {
            p[i % 32] += v;
        }
        for w in [16, 8, 4, 2, 1] {
            for j in 0..w {
                p[j] += p[j + w];
            }
        }
        x[whole..].iter().fold(p[0], |t, &v| t + v)
    }

    /// Full-mantissa values of mixed sign and magnitude, so that order shows.
    fn mixed(len: usize) -> Vec<f32> {
        (0..len).map(|i| ((i * 7919) % 1000) as f32 * 0.37 - (i % 3) as f32 * 211.3).collect()
    }

    /// Above the threshold: the documented order, bit for bit.
    #[test]
    fn large_sums_use_32_partial_sums_and_a_tree() {
        for len in [SEQUENTIAL_SUM_MAX + 1, 10_000, 1 << 16, (1 << 16) + 31] {
            let x = mixed(len);
            let want = long_way(&x);
            let got = as_f32(&run(&SumKernel, 0.0, vec![t_f32(&[len], &x)], &[]).unwrap()[0])[0];
            assert_eq!(got.to_bits(), want.to_bits(), "{len}");
            assert_eq!(sum_f32(&x).to_bits(), want.to_bits(), "{len}");
            let exact: f64 = x.iter().map(|&v| v as f64).sum();
            assert!((got as f64 - exact).abs() <= 1e-5 * x.iter().map(|&v| v.abs() as f64).sum::<f64>());
        }
        // Up to the threshold, index order: the cancellation below survives only so.
        let mut x = vec![0.0f32; SEQUENTIAL_SUM_MAX];
        x[0] = 1e8;
        x[1] = 1.0;
        x[2] = -1e8;
        assert_eq!(sum_f32(&x), 0.0);
        // Above it, 1.0 sits in its own partial sum and survives.
        x.push(0.0);
        assert_eq!(sum_f32(&x), 1.0);
    }

    /// A strided input sums in the row-major order of its index, in the same scheme: the
    /// transpose of a matrix gives the sum of the matrix's elements in column order. Sizes
    /// on both sides of the sequential threshold, over several slabs, and a view whose rows
    /// are too long for a slab.
    #[test]
    fn strided_sums_follow_the_logical_order() {
        for (rows, cols) in [(3, 5), (100, 50), (129, 77), (300, 400)] {
            let x = mixed(rows * cols);
            let t = t_f32(&[rows * cols], &x);
            let tr = t.0.with_layout(&[cols, rows], &[1, cols as isize], 0);
            let out = t_f32(&[], &[0.0]);
            compute_raw(&SumKernel, Attrs::default(), &[(&tr, &t.1)], (&out.0, &out.1)).unwrap();
            let logical: Vec<f32> = (0..cols)
                .flat_map(|j| (0..rows).map(move |i| (i, j)))
                .map(|(i, j)| x[i * cols + j])
                .collect();
            assert_eq!(as_f32(&out)[0].to_bits(), long_way(&logical).to_bits(), "{rows}x{cols}");
            // The same values in f16: summed in f32 in the same order, rounded once.
            let h: Vec<f16> = x.iter().map(|&v| f16::from_f32(v / 64.0)).collect();
            let th = tensor(&[rows * cols], &h);
            let trh = th.0.with_layout(&[cols, rows], &[1, cols as isize], 0);
            let outh = tensor(&[], &[f16::ZERO]);
            compute_raw(&SumKernel, Attrs::default(), &[(&trh, &th.1)], (&outh.0, &outh.1)).unwrap();
            let logical: Vec<f32> = (0..cols)
                .flat_map(|j| (0..rows).map(move |i| (i, j)))
                .map(|(i, j)| h[i * cols + j].to_f32())
                .collect();
            assert_eq!(values::<f16>(&outh)[0], f16::from_f32(long_way(&logical)), "{rows}x{cols} f16");
        }
        // Every other element of rows longer than a slab: element by element.
        let (rows, cols) = (2, 2 * SLAB + 6);
        let x = mixed(rows * cols);
        let t = t_f32(&[rows * cols], &x);
        let steps = t.0.with_layout(&[rows, cols / 2], &[cols as isize, 2], 1);
        let out = t_f32(&[], &[0.0]);
        compute_raw(&SumKernel, Attrs::default(), &[(&steps, &t.1)], (&out.0, &out.1)).unwrap();
        let logical: Vec<f32> =
            (0..rows).flat_map(|i| (0..cols / 2).map(move |j| i * cols + 2 * j + 1)).map(|e| x[e]).collect();
        assert_eq!(as_f32(&out)[0].to_bits(), long_way(&logical).to_bits());
    }

    #[test]
    fn ordered_sums_match_given_in_pieces() {
        for len in [0, 1, 4096, 4097, 4128, 5000, 10_007] {
            let x = mixed(len);
            for piece in [1, 7, 32, 1000] {
                let mut ord = Ordered::new(len);
                for c in x.chunks(piece) {
                    ord.push_slice(c);
                }
                assert_eq!(ord.finish().to_bits(), long_way(&x).to_bits(), "{len} {piece}");
            }
            let mut ord = Ordered::new(len);
            x.iter().for_each(|&v| ord.push(v));
            assert_eq!(ord.finish().to_bits(), long_way(&x).to_bits(), "{len}");
        }
    }

    #[test]
    fn large_i64_sums_wrap() {
        let x: Vec<i64> = (0..10_000).map(|i| if i % 2 == 0 { i64::MAX } else { i }).collect();
        let want = x.iter().fold(0i64, |a, &v| a.wrapping_add(v));
        assert_eq!(as_i64(&run(&SumKernel, 0.0, vec![t_i64(&[10_000], &x)], &[]).unwrap()[0]), vec![want]);
    }

    #[test]
    fn sum_of_empty_is_zero() {
        let out = run(&SumKernel, 0.0, vec![t_f32(&[0, 3], &[])], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![0.0]);
        let out = run(&SumKernel, 0.0, vec![t_i64(&[0], &[])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0]);
    }

    #[test]
    fn sum_of_scalar() {
        let out = run(&SumKernel, 0.0, vec![t_i64(&[], &[-9])], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![-9]);
    }

    #[test]
    fn sum_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        assert_eq!(infer_err(&SumKernel, &[], &[]), "expected 1 input, got 0");
        assert_eq!(infer_err(&SumKernel, &[&x, &x], &[]), "expected 1 input, got 2");
    }

    #[test]
    fn sum_rows_gives_column_sums() {
        // [1 2 3]
        // [4 5 6]  ->  [1+4+7, 2+5+8, 3+6+9]
        // [7 8 9]
        let x = t_f32(&[3, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let out = run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[3]);
        assert_eq!(out[0].0.dtype, DType::F32);
        assert_eq!(as_f32(&out[0]), vec![12.0, 15.0, 18.0]);
        let x = t_i64(&[2, 2], &[i64::MAX, 1, 1, 2]);
        let out = run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i64::MIN, 3]);
        // No rows: zeros.
        let out = run(&SumRowsKernel, 0.0, vec![t_f32(&[0, 2], &[])], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![0.0, 0.0]);
    }

    #[test]
    fn sum_rows_of_a_transposed_view() {
        // x = [[1, 2, 3], [4, 5, 6]] stored; its transpose [3, 2] sums to [6, 15].
        let t = t_f32(&[6], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let tr = t.0.with_layout(&[3, 2], &[1, 3], 0);
        let out = t_f32(&[4], &[9.0; 4]);
        // Into every other element of a longer storage.
        let every_other = out.0.with_layout(&[2], &[2], 1);
        compute_raw(&SumRowsKernel, Attrs::default(), &[(&tr, &t.1)], (&every_other, &out.1)).unwrap();
        assert_eq!(as_f32(&out), [9.0, 6.0, 9.0, 15.0]);
    }

    #[test]
    fn sum_rows_adds_in_row_order() {
        // Row order in f32: (1e8 + 1) rounds back to 1e8, then -1e8 leaves 0.
        let x = t_f32(&[3, 1], &[1e8, 1.0, -1e8]);
        assert_eq!(as_f32(&run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap()[0]), vec![0.0]);
    }

    #[test]
    fn sum_rows_infer_errors() {
        let v = t_f32(&[3], &[0.0; 3]).0;
        assert_eq!(infer_err(&SumRowsKernel, &[], &[]), "expected 1 input, got 0");
        assert_eq!(infer_err(&SumRowsKernel, &[&v], &[]), "input 0 is f32[3]: expected a 2-D input [n, k]");
    }
}
