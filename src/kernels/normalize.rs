//! Ops along one dimension that write every element: `cumsum`, `cumprod`, `softmax`,
//! `log_softmax`, and `layer_norm` (along the last dimensions).
//!
//! Each reads its groups as the reductions do (`kernels::reduce_dims`: the elements along
//! the dimension, in index order, in place where they lie one after another, else copied a
//! slab at a time) and writes the output in the input's index order.
//!
//! **Parameter lists.** `cumsum`, `cumprod`, `softmax`, `log_softmax`: `ints` = `[dim]`.
//! `layer_norm`: `ints` = `[k, has_weight, has_bias]` (the normalized shape is the last `k`
//! dimensions; inputs 1 and 2 are the weight and the bias, where given, of that shape),
//! `scalars` = `[eps]`.
//!
//! **Order.** `cumsum` and `cumprod` accumulate along the dimension in index order in the
//! compute type (`i64` for `bool` and integers, wrapping; `f32` for `f16` and `bf16`),
//! rounding each output once. `softmax` and `log_softmax` take three passes over each
//! group: the maximum, the sum of `exp(x - max)`, then the outputs. `layer_norm` takes the
//! mean and the biased variance (the mean of squared deviations). Their sums are in the
//! lane order at every length (`kernels::sum_f32`'s order above its sequential limit: 32
//! partial sums, a fixed tree, the remainder), where a row's serial chain of additions
//! would cost more than the rest of the work. `f32` rows that lie one after another take
//! the vectorised loops of `kernels::vmath`, in the same order and with the same `exp`, so
//! the layout never changes the bits.

use super::dtype::{dispatch, int_of, Elem};
use super::iter::{share, Operand, Share};
use super::loops::{copy_elements, expect_count, input, output};
use super::reduce::{sum_dtype, Ordered};
use super::reduce_dims::{for_each_group, room, write_output, Dims, Real};
use super::vmath;
use super::{check_dtype, common_dtype, expect_inputs, refusal, spec_of, Dtypes};
use crate::vm::{
    contiguous_strides, Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Scalar, TensorMeta, TensorView,
    TensorViewMut,
};

/// The one dimension of a `[dim]` parameter list over `meta`, as a [`Dims`].
fn along(meta: &TensorMeta, attrs: &Attrs) -> Result<Dims, String> {
    let Some(&d) = attrs.params().ints().first() else {
        return Err("expected a parameter list [dim]".into());
    };
    Dims::new(meta.shape.len(), &[d], true, false)
}

/// Which op along one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Along {
    Cumsum,
    Cumprod,
    Softmax,
    LogSoftmax,
}

fn infer_along(
    op: &str,
    kind: Along,
    inputs: &[&TensorMeta],
    attrs: &Attrs,
    outputs: &mut OutSpecs,
) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    let x = inputs[0];
    along(x, attrs)?;
    match kind {
        Along::Cumsum | Along::Cumprod => {
            outputs.push(OutSpec { shape: x.shape.clone(), dtype: sum_dtype(x.dtype) });
        }
        Along::Softmax | Along::LogSoftmax => {
            check_dtype(op, x.dtype, Dtypes::Floating)?;
            outputs.push(spec_of(x));
        }
    }
    Ok(())
}

fn compute_along(op: &str, kind: Along, ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    expect_count(ctx, 1)?;
    let x = input(ctx, 0)?;
    let dtype = x.meta.dtype;
    let dims = along(x.meta, &ctx.attrs)?;
    let a = Operand::input(x.meta, x.data, 0, dtype)?;
    let out = output(ctx, 0)?;
    let n = x.meta.numel();
    let r = &dims.reduced;
    let no = || {
        Err(refusal(
            op,
            dtype,
            if matches!(kind, Along::Softmax | Along::LogSoftmax) { Dtypes::Floating } else { Dtypes::All },
        ))
    };
    match kind {
        Along::Cumsum | Along::Cumprod => {
            let prod = kind == Along::Cumprod;
            dispatch!(dtype, floating, T => {
                let vals = cum_float::<T>(&a, r, prod, n)?;
                write_output(out, 0, Some(r), &vals)
            }, dispatch!(dtype, integral, T => {
                let mut vals = room::<i64>(n)?;
                for_each_group::<T>(&a, r, |xs| {
                    let mut acc = i64::from(prod);
                    vals.extend(xs.iter().map(|&v| {
                        acc = if prod { acc.wrapping_mul(int_of(v)) } else { acc.wrapping_add(int_of(v)) };
                        acc
                    }));
                })?;
                write_output(out, 0, Some(r), &vals)
            }, no()))
        }
        Along::Softmax | Along::LogSoftmax => {
            let log = kind == Along::LogSoftmax;
            if let Some(rows) = rows_f32(x, out, r)? {
                // SAFETY: the call's operands live through `compute`.
                let (xs, ys) = unsafe { rows.slices() };
                vmath::softmax_rows(xs, ys, rows.len, log);
                return Ok(());
            }
            dispatch!(dtype, floating, T => {
                let mut vals = room::<T>(n)?;
                let mut scratch = Vec::new();
                for_each_group::<T>(&a, r, |xs| softmax_into(xs, log, &mut vals, &mut scratch))?;
                write_output(out, 0, Some(r), &vals)
            }, no())
        }
    }
}

/// `x` and output 0 as rows of `len` values, where the row loops of `kernels::vmath` can
/// take them: both `f32`, contiguous, aligned, in no byte in common, and the `reduced`
/// dimensions (`len > 0` values per group) the last ones but for dimensions of size 1.
#[derive(Clone, Copy)]
struct RowsF32 {
    x: *const f32,
    y: *mut f32,
    numel: usize,
    len: usize,
}

impl RowsF32 {
    /// The input's and the output's values.
    ///
    /// # Safety
    ///
    /// The call's operands, which [`rows_f32`] checked, must live and be the call's while
    /// the slices do (the kernel's `compute`).
    unsafe fn slices<'a>(self) -> (&'a [f32], &'a mut [f32]) {
        // SAFETY: `rows_f32` checked that both operands lie inside their storages and hold
        // `numel` `f32`s one after another from these addresses, aligned, with no byte in
        // common; the instruction holds the write access to the output's storage while the
        // kernel runs, so nothing else reads or writes the output's bytes.
        unsafe {
            (
                std::slice::from_raw_parts(self.x, self.numel),
                std::slice::from_raw_parts_mut(self.y, self.numel),
            )
        }
    }
}

/// `x` and output 0 as [`RowsF32`], where they are such.
fn rows_f32(
    x: &TensorView<'_>,
    out: &TensorViewMut<'_>,
    reduced: &[bool],
) -> Result<Option<RowsF32>, String> {
    if x.meta.dtype != DType::F32 || out.meta.dtype != DType::F32 {
        return Ok(None);
    }
    let a = Operand::input(x.meta, x.data, 0, DType::F32)?;
    let o = Operand::output(out.meta, out.data, 0, DType::F32)?;
    let Some(first) = reduced.iter().position(|&r| r) else {
        return Ok(None);
    };
    let trailing = x.meta.shape.iter().zip(reduced).skip(first).all(|(&d, &r)| r || d == 1);
    let len: usize = x.meta.shape.iter().zip(reduced).filter(|(_, &r)| r).map(|(&d, _)| d).product();
    let aligned = |p: *mut u8| p as usize % std::mem::align_of::<f32>() == 0;
    if !(trailing
        && len > 0
        && a.contiguous
        && o.contiguous
        && a.numel == o.numel
        && a.numel > 0
        && aligned(a.first)
        && aligned(o.first)
        && matches!(share(&a, x.data, &o, out.data), Share::Disjoint))
    {
        return Ok(None);
    }
    Ok(Some(RowsF32 { x: a.first.cast_const().cast::<f32>(), y: o.first.cast::<f32>(), numel: a.numel, len }))
}

/// The running sums (or products, with `prod`) of float elements along each group.
fn cum_float<T: Elem>(a: &Operand<'_>, r: &[bool], prod: bool, n: usize) -> Result<Vec<T>, String>
where
    T::C: Real,
{
    let mut vals = room::<T>(n)?;
    for_each_group::<T>(a, r, |xs| {
        let mut acc = <T::C as Real>::of(if prod { 1.0 } else { 0.0 });
        vals.extend(xs.iter().map(|&v| {
            acc = if prod { acc * v.load() } else { acc + v.load() };
            T::store(acc)
        }));
    })?;
    Ok(vals)
}

/// The softmax (or its logarithm) of `xs`, appended to `out`: `exp(x - m) / s` or `x - m -
/// log(s)`, with `m` the maximum and `s` the sum of `exp(x - m)`. A NaN makes the whole
/// group NaN; a group of only `-inf` is NaN (as PyTorch gives).
fn softmax_into<T: Elem>(xs: &[T], log: bool, out: &mut Vec<T>, scratch: &mut Vec<T::C>)
where
    T::C: Real,
{
    let mut m = <T::C as Real>::NEG_INFINITY;
    for &v in xs {
        let c = v.load();
        if c > m || c.is_nan() {
            m = c;
            if c.is_nan() {
                break;
            }
        }
    }
    if log {
        let s = sum_lanes::<T>(xs, |v| (v - m).exp());
        let shift = m + s.ln();
        out.extend(xs.iter().map(|&v| T::store(v.load() - shift)));
    } else {
        // Each exponential once: kept for the write.
        scratch.clear();
        scratch.extend(xs.iter().map(|&v| (v.load() - m).exp()));
        let mut ord = Ordered::lanes(scratch.len());
        ord.push_slice(scratch);
        let inv = <T::C as Real>::of(1.0) / ord.finish();
        out.extend(scratch.iter().map(|&e| T::store(e * inv)));
    }
}

/// The sum of `f(x)` over `xs` in the lane order at every length (module docs).
fn sum_lanes<T: Elem>(xs: &[T], f: impl Fn(T::C) -> T::C) -> T::C
where
    T::C: Real,
{
    let mut ord = Ordered::lanes(xs.len());
    let mut buf = [<T::C as Real>::of(0.0); 256];
    for chunk in xs.chunks(buf.len()) {
        for (b, &v) in buf.iter_mut().zip(chunk) {
            *b = f(v.load());
        }
        ord.push_slice(&buf[..chunk.len()]);
    }
    ord.finish()
}

macro_rules! along_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $kind:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                match $kind {
                    Along::Cumsum | Along::Cumprod => Dtypes::All.list(),
                    Along::Softmax | Along::LogSoftmax => Dtypes::Floating.list(),
                }
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                infer_along($op, $kind, inputs, attrs, outputs)
            }

            fn strided(&self) -> bool {
                true
            }

            fn writes_outputs(&self) -> bool {
                true
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                compute_along($op, $kind, ctx)
            }
        }
    };
}

along_kernel!(
    /// `cumsum`: the running sums along `ints[0]`; every dtype (`bool` and integers give
    /// `i64`, wrapping).
    CumsumKernel, "cumsum", Along::Cumsum
);
along_kernel!(
    /// `cumprod`: the running products along `ints[0]` (as `cumsum`).
    CumprodKernel, "cumprod", Along::Cumprod
);
along_kernel!(
    /// `softmax`: `exp(x - max) / sum(exp(x - max))` along `ints[0]`; floating dtypes.
    SoftmaxKernel, "softmax", Along::Softmax
);
along_kernel!(
    /// `log_softmax`: `x - max - log(sum(exp(x - max)))` along `ints[0]`; floating dtypes.
    LogSoftmaxKernel, "log_softmax", Along::LogSoftmax
);

/// `layer_norm`: input `x`, then the weight and the bias where `ints[1]` and `ints[2]` say
/// they are given (each of the shape of `x`'s last `ints[0]` dimensions, `x`'s dtype);
/// output like `x`: `(x - mean) / sqrt(var + eps) * weight + bias` over each group of the
/// last `ints[0]` dimensions, `var` biased (over `n`), `eps` = `scalars[0]`. Floating dtypes.
#[derive(Debug, Clone, Copy, Default)]
pub struct LayerNormKernel;

/// `layer_norm`'s parameters: the normalized dimensions' count, whether the weight and the
/// bias are given, and `eps`.
fn layer_norm_params(attrs: &Attrs) -> Result<(usize, bool, bool, f64), String> {
    let p = attrs.params();
    match p.ints() {
        &[k, w, b] if k >= 0 => Ok((k as usize, w != 0, b != 0, p.scalar(0).map_or(1e-5, Scalar::as_f64))),
        _ => Err("expected a parameter list [k, has_weight, has_bias] with scalars [eps]".into()),
    }
}

impl OpKernel for LayerNormKernel {
    fn name(&self) -> &'static str {
        "layer_norm"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Floating.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        let (k, w, b) = {
            let (k, w, b, _) = layer_norm_params(attrs)?;
            (k, w, b)
        };
        expect_inputs(inputs, 1 + usize::from(w) + usize::from(b))?;
        let dtype = common_dtype(inputs)?;
        check_dtype("layer_norm", dtype, Dtypes::Floating)?;
        let x = inputs[0];
        if k == 0 || k > x.shape.len() {
            return Err(format!(
                "input 0 is {}: layer_norm normalizes its last {k} dimension(s), which it does not have",
                x.describe()
            ));
        }
        let tail = &x.shape[x.shape.len() - k..];
        for (i, m) in inputs.iter().enumerate().skip(1) {
            if m.shape.as_slice() != tail {
                return Err(format!(
                    "input {i} is {} but the normalized shape is {tail:?}: the weight and the bias have the \
                     normalized shape",
                    m.describe()
                ));
            }
        }
        outputs.push(spec_of(x));
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let (k, w, b, eps) = layer_norm_params(&ctx.attrs)?;
        expect_count(ctx, 1 + usize::from(w) + usize::from(b))?;
        let x = input(ctx, 0)?;
        let dtype = x.meta.dtype;
        dispatch!(dtype, floating, T => layer_norm::<T>(ctx, k, w, b, eps),
            Err(refusal("layer_norm", dtype, Dtypes::Floating)))
    }
}

/// Input `i` as its values in the compute type, row-major.
fn load_all<T: Elem>(ctx: &KernelCtx<'_, '_>, i: usize) -> Result<Vec<T::C>, String> {
    let t = input(ctx, i)?;
    let a = Operand::input(t.meta, t.data, i, T::DTYPE)?;
    let mut words: Vec<u64> = Vec::new();
    let bytes = a.numel * T::DTYPE.size();
    words.try_reserve_exact(bytes.div_ceil(8)).map_err(|e| format!("no memory for input {i}: {e}"))?;
    words.resize(bytes.div_ceil(8), 0);
    let strides = contiguous_strides(a.shape);
    let dst = Operand::buffer(a.shape, &strides, T::DTYPE, words.as_mut_ptr().cast::<u8>());
    copy_elements(&dst, &a);
    // SAFETY: the buffer holds `numel` elements of `T`, just copied, aligned to 8 bytes.
    let xs = unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<T>(), a.numel) };
    Ok(xs.iter().map(|&v| v.load()).collect())
}

fn layer_norm<T: Elem>(ctx: &KernelCtx<'_, '_>, k: usize, w: bool, b: bool, eps: f64) -> Result<(), String>
where
    T::C: Real,
{
    let x = input(ctx, 0)?;
    let rank = x.meta.shape.len();
    if k == 0 || k > rank {
        return Err(format!("input 0 is {}: it has no last {k} dimension(s)", x.meta.describe()));
    }
    let reduced: Vec<bool> = (0..rank).map(|d| d >= rank - k).collect();
    if let Some(rows) = rows_f32(x, output(ctx, 0)?, &reduced)? {
        let len = rows.len;
        let weight = if w { Some(load_all::<f32>(ctx, 1)?) } else { None };
        let bias = if b { Some(load_all::<f32>(ctx, 1 + usize::from(w))?) } else { None };
        if weight.as_ref().is_some_and(|v| v.len() != len) || bias.as_ref().is_some_and(|v| v.len() != len) {
            return Err(format!("the weight and the bias must hold {len} elements"));
        }
        // SAFETY: the call's operands live through `compute`.
        let (xs, ys) = unsafe { rows.slices() };
        vmath::layer_norm_rows(xs, ys, len, weight.as_deref(), bias.as_deref(), eps as f32);
        return Ok(());
    }
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let weight = if w { Some(load_all::<T>(ctx, 1)?) } else { None };
    let bias = if b { Some(load_all::<T>(ctx, 1 + usize::from(w))?) } else { None };
    let n: usize = x.meta.shape[rank - k..].iter().product();
    if weight.as_ref().is_some_and(|v| v.len() != n) || bias.as_ref().is_some_and(|v| v.len() != n) {
        return Err(format!("the weight and the bias must hold {n} elements"));
    }
    let mut vals = room::<T>(x.meta.numel())?;
    let eps = <T::C as Real>::of(eps);
    let one = <T::C as Real>::of(1.0);
    let len = <T::C as Real>::of(n as f64);
    let normalize = |vals: &mut Vec<T>, xs: &[T], mean: T::C, rstd: T::C| {
        vals.extend(xs.iter().enumerate().map(|(j, &v)| {
            let mut y = (v.load() - mean) * rstd;
            if let Some(w) = &weight {
                y = y * w[j];
            }
            if let Some(b) = &bias {
                y = y + b[j];
            }
            T::store(y)
        }));
    };
    for_each_group::<T>(&a, &reduced, |xs| {
        let mean = sum_lanes::<T>(xs, |v| v) / len;
        let var = sum_lanes::<T>(xs, |v| (v - mean) * (v - mean)) / len;
        normalize(&mut vals, xs, mean, one / (var + eps).sqrt());
    })?;
    write_output(output(ctx, 0)?, 0, None, &vals)
}
