//! 2-D convolution: `conv2d`, tap by tap over a padded copy of the input (stride 1, many
//! channels) or as blocks of an im2col matrix (widened over a padded copy for stride 1),
//! each a matrix product.
//!
//! Also the shared pieces of the spatial kernels (`conv2d`, the pools, attention): the
//! floating compute types as one trait ([`Real`]), and element access of a 4-D operand by
//! its strides.

use std::ops::{Add, Div, Mul, Sub};

use super::dtype::{dispatch, Elem, Float, Ring};
use super::gemm::{self, Mat};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{input, output};
use super::{check_dtype, common_dtype, count_error, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta};

/// The compute types of the floating dtypes, `f32` (for `f16`, `bf16` and `f32`) and `f64`,
/// with what the spatial kernels need of them.
pub(super) trait Real:
    Elem<C = Self> + Float + Add<Output = Self> + Sub<Output = Self> + Mul<Output = Self> + Div<Output = Self>
{
    /// `-∞`.
    const NEG_INF: Self;
    /// `eˣ`.
    fn exp(self) -> Self;
    /// `v` rounded to this type.
    fn of_f64(v: f64) -> Self;
    /// Whether the value is NaN.
    fn nan(self) -> bool;
}

impl Real for f32 {
    const NEG_INF: Self = f32::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f32::exp(self)
    }
    #[inline(always)]
    fn of_f64(v: f64) -> Self {
        v as f32
    }
    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

impl Real for f64 {
    const NEG_INF: Self = f64::NEG_INFINITY;
    #[inline(always)]
    fn exp(self) -> Self {
        f64::exp(self)
    }
    #[inline(always)]
    fn of_f64(v: f64) -> Self {
        v
    }
    #[inline(always)]
    fn nan(self) -> bool {
        self.is_nan()
    }
}

/// A checked 4-D operand's element `[a, b, c, d]`, as an address.
///
/// Callers keep the index within the operand's shape; the address is then inside the
/// operand's checked layout.
#[inline(always)]
pub(super) fn at4<T>(t: &Operand<'_>, [a, b, c, d]: [usize; 4]) -> *mut T {
    let s = t.strides;
    let off = a as isize * s[0] + b as isize * s[1] + c as isize * s[2] + d as isize * s[3];
    t.first.cast::<T>().wrapping_offset(off)
}

/// The output size of a sliding window along one dimension (PyTorch's rule): `size` padded
/// by `pad` in all, a window of `k` taps `dilation` apart, moved by `stride`; rounded up
/// with `ceil`, where a last window that would start in the right padding is dropped.
/// `None` when no window fits.
pub(super) fn window_out(
    size: usize,
    pad: (usize, usize),
    k: usize,
    stride: usize,
    dilation: usize,
    ceil: bool,
) -> Option<usize> {
    let span = dilation.checked_mul(k.checked_sub(1)?)?.checked_add(1)?;
    let padded = size.checked_add(pad.0)?.checked_add(pad.1)?;
    let room = padded.checked_sub(span)?;
    let mut out = if ceil { room.div_ceil(stride) } else { room / stride } + 1;
    if ceil && (out - 1) * stride >= size + pad.0 {
        out -= 1;
    }
    Some(out)
}

/// `conv2d`'s parameters, from its parameter list.
#[derive(Debug, Clone, Copy)]
struct ConvParams {
    stride: (usize, usize),
    /// Top, bottom, left, right.
    pad: (usize, usize, usize, usize),
    dilation: (usize, usize),
    groups: usize,
}

impl ConvParams {
    fn of(attrs: &Attrs) -> Result<ConvParams, String> {
        let p = attrs.params().ints();
        if p.len() != 9 {
            return Err(format!(
                "conv2d takes 9 integer parameters (stride h, w; padding top, bottom, left, right; \
                 dilation h, w; groups), got {}",
                p.len()
            ));
        }
        let pos = |i: usize, what: &str, min: i64| {
            if p[i] < min {
                Err(format!("conv2d's {what} is {} but must be at least {min}", p[i]))
            } else {
                usize::try_from(p[i]).map_err(|_| format!("conv2d's {what} is out of range: {}", p[i]))
            }
        };
        Ok(ConvParams {
            stride: (pos(0, "stride", 1)?, pos(1, "stride", 1)?),
            pad: (pos(2, "padding", 0)?, pos(3, "padding", 0)?, pos(4, "padding", 0)?, pos(5, "padding", 0)?),
            dilation: (pos(6, "dilation", 1)?, pos(7, "dilation", 1)?),
            groups: pos(8, "groups", 1)?,
        })
    }
}

/// `conv2d`: inputs `x: [N, C, H, W]`, `weight: [O, C / groups, kh, kw]` and, optionally,
/// `bias: [O]`, of one floating dtype; output `[N, O, OH, OW]` with
/// `out[n, o, y, x] = bias[o] + sum over (c, i, j) of x[n, g·C/groups + c, y·sh - top + i·dh,
/// x·sw - left + j·dw] · weight[o, c, i, j]` (`g` the group of `o`; positions in the padding
/// read as 0), PyTorch's cross-correlation.
///
/// The parameter list's integers are, in order: stride (h, w), padding (top, bottom, left,
/// right: asymmetric padding is how PyTorch's `padding="same"` pads an even window), dilation
/// (h, w), groups. `OH = (H + top + bottom - dh·(kh - 1) - 1) / sh + 1` (and so for `OW`).
///
/// The weight is converted to the compute type once (`f16`, `bf16` compute in `f32`). A
/// stride-1 convolution of at least `TAP_MIN_CHANNELS` input channels per group is summed
/// tap by tap (`by_taps`); any other is the product of the weight's rows and blocks of an
/// im2col matrix, by `kernels::gemm`: for stride 1 of whole images with the output rows
/// widened to the padded width (`wide_blocks`), else of `block_cols` positions. The bias is
/// added to the sum and the result stored once. Operands of any layout; the summation
/// orders are in `docs/ops.md`, "Summation order".
#[derive(Debug, Clone, Copy, Default)]
pub struct Conv2dKernel;

impl OpKernel for Conv2dKernel {
    fn name(&self) -> &'static str {
        "conv2d"
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
        let (shape, dtype) = conv_shape(inputs, attrs)?;
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
        let metas: Vec<&TensorMeta> = ctx.inputs.iter().map(|t| t.meta).collect();
        let (shape, dtype) = conv_shape(&metas, &ctx.attrs)?;
        let p = ConvParams::of(&ctx.attrs)?;
        dispatch!(dtype, floating, T => conv::<T>(ctx, &shape, p), Err(refusal("conv2d", dtype, Dtypes::Floating)))
    }
}

/// The output shape and dtype of a `conv2d` call, or why it is refused.
fn conv_shape(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<(Shape, DType), String> {
    if !(2..=3).contains(&inputs.len()) {
        return Err(format!("{} (input, weight and an optional bias)", count_error(2, inputs.len())));
    }
    let dtype = common_dtype(inputs)?;
    check_dtype("conv2d", dtype, Dtypes::Floating)?;
    let p = ConvParams::of(attrs)?;
    let (x, w) = (inputs[0], inputs[1]);
    if x.shape.len() != 4 {
        return Err(format!("input 0 is {}: conv2d takes a 4-D input [N, C, H, W]", x.describe()));
    }
    if w.shape.len() != 4 {
        return Err(format!(
            "input 1 is {}: conv2d takes a 4-D weight [O, C / groups, kh, kw]",
            w.describe()
        ));
    }
    let (c, o) = (x.shape[1], w.shape[0]);
    if c % p.groups != 0 || o % p.groups != 0 {
        return Err(format!(
            "input 0 is {} and input 1 is {}: groups ({}) must divide the input's channels ({c}) and \
             the weight's output channels ({o})",
            x.describe(),
            w.describe(),
            p.groups
        ));
    }
    if w.shape[1] != c / p.groups {
        return Err(format!(
            "input 0 is {} and input 1 is {}: the weight takes {} channels per group but the input \
             has {c} in {} group(s)",
            x.describe(),
            w.describe(),
            w.shape[1],
            p.groups
        ));
    }
    if let Some(b) = inputs.get(2) {
        if b.shape.as_slice() != [o] {
            return Err(format!(
                "input 2 is {}: the bias must be [{o}], one per output channel",
                b.describe()
            ));
        }
    }
    let out = |size, pad, k, s, d, what: &str| {
        window_out(size, pad, k, s, d, false).filter(|&n| n > 0).ok_or_else(|| {
            format!(
                "input 0 is {} and input 1 is {}: the padded {what} ({size} + {} + {}) is smaller than \
                 the dilated kernel ({})",
                x.describe(),
                w.describe(),
                pad.0,
                pad.1,
                d * (k.max(1) - 1) + 1
            )
        })
    };
    let oh = out(x.shape[2], (p.pad.0, p.pad.1), w.shape[2], p.stride.0, p.dilation.0, "height")?;
    let ow = out(x.shape[3], (p.pad.2, p.pad.3), w.shape[3], p.stride.1, p.dilation.1, "width")?;
    if w.shape[2] == 0 || w.shape[3] == 0 {
        return Err(format!("input 1 is {}: the kernel has no taps", w.describe()));
    }
    Ok(([x.shape[0], o, oh, ow].into_iter().collect(), dtype))
}

/// `len` zeros of `C`, or the error of a refused allocation.
pub(super) fn buffer<C: Real>(len: usize, what: &str) -> Result<Vec<C>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| format!("no memory for {what} ({len} elements): {e}"))?;
    v.resize(len, <C as Ring>::ZERO);
    Ok(v)
}

fn conv<T: Elem>(ctx: &KernelCtx<'_, '_>, shape: &[usize], p: ConvParams) -> Result<(), String>
where
    T::C: Real,
{
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    if o.shape != shape {
        return Err(format!("output 0 is {} but conv2d produces {shape:?}", out.meta.describe()));
    }
    if o.numel == 0 {
        return Ok(());
    }
    // Inputs in the output's memory (a caller that skipped the builder's checks) are read
    // from copies made first.
    let mut staged = Vec::new();
    for i in 0..ctx.inputs.len() {
        let t = input(ctx, i)?;
        let op = Operand::input(t.meta, t.data, i, T::DTYPE)?;
        staged.push(if share(&op, t.data, &o, out.data) == Share::Disjoint {
            None
        } else {
            Some(Staged::new(&op)?)
        });
    }
    let mut ops = Vec::new();
    for (i, s) in staged.iter().enumerate() {
        let t = input(ctx, i)?;
        ops.push(match s {
            Some(s) => s.operand(),
            None => Operand::input(t.meta, t.data, i, T::DTYPE)?,
        });
    }
    let (x, w) = (&ops[0], &ops[1]);
    let bias = ops.get(2);
    let (n, c, h, wd) = (x.shape[0], x.shape[1], x.shape[2], x.shape[3]);
    let (oc, kh, kw) = (w.shape[0], w.shape[2], w.shape[3]);
    let (oh, ow) = (shape[2], shape[3]);
    let (cg, og) = (c / p.groups, oc / p.groups);
    let kc = cg * kh * kw;
    let pos = oh * ow;
    // The weight as `[O, C/groups · kh · kw]`, row-major, in the compute type.
    let mut wbuf = buffer::<T::C>(oc * kc, "conv2d's weight")?;
    for oo in 0..oc {
        for ci in 0..cg {
            for i in 0..kh {
                for j in 0..kw {
                    // SAFETY: an index within the weight's shape.
                    wbuf[((oo * cg + ci) * kh + i) * kw + j] =
                        unsafe { at4::<T>(w, [oo, ci, i, j]).read() }.load();
                }
            }
        }
    }
    let mut bvals = buffer::<T::C>(oc, "conv2d's bias")?;
    if let Some(b) = bias {
        for (oo, v) in bvals.iter_mut().enumerate() {
            // SAFETY: element `oo` of the `[O]` bias.
            *v = unsafe { b.first.cast::<T>().wrapping_offset(oo as isize * b.strides[0]).read() }.load();
        }
    }
    let geo = Geometry { p, h, w: wd, kh, kw, oh, ow, cg };
    if p.stride == (1, 1) {
        return if cg >= TAP_MIN_CHANNELS {
            by_taps::<T>(x, &o, &geo, n, &wbuf, &bvals)
        } else {
            wide_blocks::<T>(x, &o, &geo, n, &wbuf, &bvals)
        };
    }
    // Positions over the whole batch, image-major: the output fits in memory and `oc ≥ 1`
    // (it is not empty), so `n · pos` does.
    let total = n * pos;
    let q = block_cols(kc, total);
    let cols_len = kc.checked_mul(q).ok_or("conv2d's im2col block is larger than memory")?;
    let mut cols = buffer::<T::C>(cols_len, "conv2d's im2col block")?;
    let mut obuf = buffer::<T::C>(og * q, "conv2d's product")?;
    for g in 0..p.groups {
        let mut start = 0;
        while start < total {
            let qb = q.min(total - start);
            im2col::<T>(x, &geo, g * cg, start, &mut cols[..kc * qb]);
            let m = |v: &mut Vec<T::C>, at: usize, cols: usize| Mat {
                ptr: v.as_mut_ptr().wrapping_add(at),
                rs: cols as isize,
                cs: 1,
            };
            let wm = m(&mut wbuf, g * og * kc, kc);
            let cm = m(&mut cols, 0, qb);
            let om = m(&mut obuf, 0, qb);
            // SAFETY: three row-major buffers of this function's: the group's `og` weight rows
            // of `kc`, `kc` im2col rows of `qb` (`kc · qb ≤ cols_len`), `og` output rows of
            // `qb` (`og · qb ≤ og · q`); the output buffer is disjoint from the other two.
            unsafe { gemm::product((og, kc, qb), wm, cm, om)? };
            scatter::<T>(&o, &geo, &obuf[..og * qb], (g * og, og), start, &bvals);
            start += qb;
        }
    }
    Ok(())
}

/// The fewest input channels per group for which a stride-1 convolution is computed tap by
/// tap ([`by_taps`]): each tap's product then sums at least this many terms, enough for the
/// `gemm` crate's kernels; below it the im2col blocks are faster.
const TAP_MIN_CHANNELS: usize = 16;

/// A stride-1 convolution without an im2col matrix: per image and group, the input's
/// channels copied once into a zero-bordered buffer `[cg, Hp, Wp]` (the padding included),
/// in which the tap `(i, j)` of every output position `(y, x)` lies at `(y + i·dh)·Wp + x +
/// j·dw`: for each tap, all positions' inputs are one matrix `[cg, (OH - 1)·Wp + OW]` with
/// row stride `Hp·Wp` and column stride 1 (a column per position of the output widened to
/// `Wp`, the columns past `OW` discarded). The output `[og, …]` is the weight's tap-`(i, j)`
/// columns times that matrix, summed over the taps in row-major order, each product the
/// `gemm` crate's (added to the sum of the taps before), then the bias added and the sum
/// stored once.
fn by_taps<T: Elem>(
    x: &Operand<'_>,
    o: &Operand<'_>,
    g: &Geometry,
    n: usize,
    wbuf: &[T::C],
    bias: &[T::C],
) -> Result<(), String>
where
    T::C: Real,
{
    let (cg, kh, kw, oh, ow) = (g.cg, g.kh, g.kw, g.oh, g.ow);
    let (dh, dw) = g.p.dilation;
    let (kc, og) = (cg * kh * kw, o.shape[1] / g.p.groups);
    let (mut xp, plane, wp, wide) = padded::<T::C>(g)?;
    let acc_len = og.checked_mul(wide).ok_or("conv2d's product is larger than memory")?;
    let mut acc = buffer::<T::C>(acc_len, "conv2d's product")?;
    for ni in 0..n {
        for grp in 0..g.p.groups {
            pad_channels::<T>(x, g, [ni, grp * cg], &mut xp, wp);
            for i in 0..kh {
                for j in 0..kw {
                    let a = Mat {
                        ptr: wbuf.as_ptr().cast_mut().wrapping_add(grp * og * kc + i * kw + j),
                        rs: kc as isize,
                        cs: (kh * kw) as isize,
                    };
                    let b = Mat {
                        ptr: xp.as_mut_ptr().wrapping_add(i * dh * wp + j * dw),
                        rs: plane as isize,
                        cs: 1,
                    };
                    let out = Mat { ptr: acc.as_mut_ptr(), rs: wide as isize, cs: 1 };
                    // SAFETY: buffers of this function's: `a` the group's `og` weight rows at
                    // their tap-`(i, j)` column, `cg` of them `kh·kw` apart (within `wbuf`'s
                    // `O·kc`); `b` `cg` planes of `xp` from the tap's offset, whose last
                    // column, `(cg - 1)·plane + (kh - 1)·dh·wp + (kw - 1)·dw + wide - 1`, is
                    // `cg·plane - 1` at most (stride 1: `ow = wp - (kw - 1)·dw`, `oh = hp -
                    // (kh - 1)·dh`); `out` the `[og, wide]` accumulator, row-major, disjoint
                    // from both. `a` and `b` are only read. After the first tap the
                    // accumulator holds the earlier taps' sum.
                    unsafe { gemm::crate_product((og, cg, wide), a, b, out, i + j > 0)? };
                }
            }
            for (oo, row) in acc.chunks_exact(wide).enumerate() {
                let oc = grp * og + oo;
                for y in 0..oh {
                    store_run::<T>(o, g, [ni, oc], y * ow, &row[y * wp..][..ow], bias[oc]);
                }
            }
        }
    }
    Ok(())
}

/// The stride-1 routes' zero-bordered buffer for one image's channels of a group (`cg`
/// planes `Hp·Wp`), its plane size, its width `Wp` and the columns of the output widened to
/// it, `(OH - 1)·Wp + OW` (the last one tap `(kh - 1, kw - 1)`'s last element). A large
/// padding makes it larger than any tensor of the call, so its size is checked.
fn padded<C: Real>(g: &Geometry) -> Result<(Vec<C>, usize, usize, usize), String> {
    let (hp, wp) = (g.h + g.p.pad.0 + g.p.pad.1, g.w + g.p.pad.2 + g.p.pad.3);
    let big = "conv2d's padded input is larger than memory";
    let plane = hp.checked_mul(wp).ok_or(big)?;
    let xp = buffer::<C>(g.cg.checked_mul(plane).ok_or(big)?, "conv2d's padded input")?;
    Ok((xp, plane, wp, (g.oh - 1) * wp + g.ow))
}

/// Copies input channels `c0..c0 + cg` of image `ni` into the interior of `xp`, `cg` planes
/// of `Hp·Wp` (`wp` wide), the padding `top` rows and `left` columns before it. The borders
/// are left as they are: 0 from the allocation, as every call writes the same interior.
fn pad_channels<T: Elem>(x: &Operand<'_>, g: &Geometry, [ni, c0]: [usize; 2], xp: &mut [T::C], wp: usize)
where
    T::C: Real,
{
    let (top, left) = (g.p.pad.0, g.p.pad.2);
    let plane = xp.len() / g.cg;
    for (ci, chan) in xp.chunks_exact_mut(plane).enumerate() {
        for hy in 0..g.h {
            let d = &mut chan[(hy + top) * wp + left..][..g.w];
            let src = at4::<T>(x, [ni, c0 + ci, hy, 0]);
            // SAFETY: the `w` elements of the input's row `[ni, c0 + ci, hy]`, in its checked
            // layout.
            unsafe { gather::<T>(d, src, x.strides[3]) };
        }
    }
}

/// A stride-1 convolution of fewer than `TAP_MIN_CHANNELS` channels per group: im2col
/// blocks of whole images, each image's columns the output positions widened to the padded
/// width `Wp` (`(OH - 1)·Wp + OW` columns, those past `OW` in a row discarded), so that each
/// row `(c, i, j)` of an image's columns is one copy from its zero-bordered copy (as in
/// [`by_taps`]) rather than one per output row. A block holds `max(1, BLOCK_ELEMS / (kc ·
/// columns))` images; its product is `kernels::gemm`'s.
fn wide_blocks<T: Elem>(
    x: &Operand<'_>,
    o: &Operand<'_>,
    g: &Geometry,
    n: usize,
    wbuf: &[T::C],
    bias: &[T::C],
) -> Result<(), String>
where
    T::C: Real,
{
    let (cg, kh, kw, oh, ow) = (g.cg, g.kh, g.kw, g.oh, g.ow);
    let (dh, dw) = g.p.dilation;
    let (kc, og) = (cg * kh * kw, o.shape[1] / g.p.groups);
    let (mut xp, plane, wp, wide) = padded::<T::C>(g)?;
    let big = "conv2d's im2col block is larger than memory";
    let image = kc.checked_mul(wide).ok_or(big)?;
    let per = (BLOCK_ELEMS / image).clamp(1, n.max(1));
    let mut cols = buffer::<T::C>(image.checked_mul(per).ok_or(big)?, "conv2d's im2col block")?;
    let mut obuf = buffer::<T::C>(og.checked_mul(wide * per).ok_or(big)?, "conv2d's product")?;
    for grp in 0..g.p.groups {
        let mut n0 = 0;
        while n0 < n {
            let nb = per.min(n - n0);
            let qb = nb * wide;
            for ln in 0..nb {
                pad_channels::<T>(x, g, [n0 + ln, grp * cg], &mut xp, wp);
                for (r, row) in cols[..kc * qb].chunks_exact_mut(qb).enumerate() {
                    let (ci, i, j) = (r / (kh * kw), r / kw % kh, r % kw);
                    // Ends at `(ci + 1)·plane` at most (stride 1: `(kh - 1)·dh = hp - oh`,
                    // `(kw - 1)·dw = wp - ow`).
                    let src = &xp[ci * plane + i * dh * wp + j * dw..][..wide];
                    row[ln * wide..][..wide].copy_from_slice(src);
                }
            }
            let m = |v: &[T::C], at: usize, cols: usize| Mat {
                ptr: v.as_ptr().cast_mut().wrapping_add(at),
                rs: cols as isize,
                cs: 1,
            };
            let (wm, cm) = (m(wbuf, grp * og * kc, kc), m(&cols, 0, qb));
            let om = Mat { ptr: obuf.as_mut_ptr(), rs: qb as isize, cs: 1 };
            // SAFETY: row-major buffers of this function's: the group's `og` weight rows of
            // `kc`, `kc` im2col rows of `qb` (`kc · qb ≤ image · per`), `og` output rows of
            // `qb`; the output buffer is disjoint from the other two, which are only read.
            unsafe { gemm::product((og, kc, qb), wm, cm, om)? };
            for (oo, orow) in obuf[..og * qb].chunks_exact(qb).enumerate() {
                let oc = grp * og + oo;
                for ln in 0..nb {
                    for y in 0..oh {
                        let vals = &orow[ln * wide + y * wp..][..ow];
                        store_run::<T>(o, g, [n0 + ln, oc], y * ow, vals, bias[oc]);
                    }
                }
            }
            n0 += nb;
        }
    }
    Ok(())
}

/// The im2col block's budget, in elements: a block of `kc` rows gets about this many
/// columns over `kc` (1 MiB of `f32`), so that it stays in a core's L2 cache between being
/// written and being read by the product, and the product is large enough for the `gemm`
/// crate's blocking.
const BLOCK_ELEMS: usize = 1 << 18;

/// The columns (output positions) of one im2col block for `kc` rows out of `total`: at
/// least 64, at most `total`. A function of the shape alone, and so are the products'
/// summation orders.
fn block_cols(kc: usize, total: usize) -> usize {
    (BLOCK_ELEMS / kc.max(1)).max(64).min(total)
}

/// The sizes an im2col block and its scatter need.
struct Geometry {
    p: ConvParams,
    /// The input's height and width.
    h: usize,
    w: usize,
    /// The kernel's height and width.
    kh: usize,
    kw: usize,
    /// The output's height and width.
    oh: usize,
    ow: usize,
    /// Input channels per group.
    cg: usize,
}

/// For each output column `x` of a row, whether tap `j` of the kernel reads inside the
/// input: the range `lo..hi` of such `x` (within `0..ow`), by the width's stride, left
/// padding and dilation.
fn inside(g: &Geometry, j: usize) -> (usize, usize) {
    let (sw, left, off) = (g.p.stride.1, g.p.pad.2, j * g.p.dilation.1);
    // Input column `x·sw + off - left` is `≥ 0` from `lo` on and `< w` below `hi`.
    let lo = left.saturating_sub(off).div_ceil(sw).min(g.ow);
    let hi = (g.w + left).saturating_sub(off).div_ceil(sw).min(g.ow).max(lo);
    (lo, hi)
}

/// Rows `(c, i, j)` (`c` in `0..cg`) of the im2col matrix of input channels `c0..c0 + cg`,
/// for columns `start..start + qb` of the batch's output positions (image-major, then
/// row-major), into `cols` (`[cg·kh·kw, qb]`, row-major, `qb = cols.len() / (cg·kh·kw)`):
/// element `((c, i, j), (n, y, x))` is the input's `[n, c0 + c, y·sh - top + i·dh,
/// x·sw - left + j·dw]`, 0 in the padding. Each output row's span of a tap inside the input
/// is one strided (for stride 1 and a contiguous row, contiguous) copy.
fn im2col<T: Elem>(x: &Operand<'_>, g: &Geometry, c0: usize, start: usize, cols: &mut [T::C])
where
    T::C: Real,
{
    let (pos, zero) = (g.oh * g.ow, <T::C as Ring>::ZERO);
    let rows = g.cg * g.kh * g.kw;
    let qb = cols.len() / rows;
    let end = start + qb;
    // The block's columns as runs along one output row: image, row, first and last column.
    let mut runs: Vec<(usize, usize, usize, usize)> = Vec::with_capacity(qb / g.ow + 2);
    let mut col = start;
    while col < end {
        let (ni, rem) = (col / pos, col % pos);
        let (y, x0) = (rem / g.ow, rem % g.ow);
        let x1 = g.ow.min(x0 + (end - col));
        runs.push((ni, y, x0, x1));
        col += x1 - x0;
    }
    let (sh, dh, top) = (g.p.stride.0, g.p.dilation.0, g.p.pad.0);
    let (sw, dw, left) = (g.p.stride.1, g.p.dilation.1, g.p.pad.2);
    let step = sw as isize * x.strides[3];
    for (r, row) in cols.chunks_exact_mut(qb).enumerate() {
        let (ci, i, j) = (r / (g.kh * g.kw), r / g.kw % g.kh, r % g.kw);
        let (lo, hi) = inside(g, j);
        let mut rest = &mut row[..];
        for &(ni, y, x0, x1) in &runs {
            let (d, tail) = std::mem::take(&mut rest).split_at_mut(x1 - x0);
            rest = tail;
            match (y * sh + i * dh).checked_sub(top).filter(|&hy| hy < g.h) {
                None => d.fill(zero),
                Some(hy) => {
                    let (a, b) = (lo.clamp(x0, x1), hi.clamp(x0, x1));
                    d[..a - x0].fill(zero);
                    d[b - x0..].fill(zero);
                    if a < b {
                        // `a ≥ lo`, so the column is inside the input (`inside`).
                        let wx = a * sw + j * dw - left;
                        let src = at4::<T>(x, [ni, c0 + ci, hy, wx]);
                        // SAFETY: elements `wx + k·sw` for `k < b - a` of the input's row
                        // `[ni, c0 + ci, hy]`, inside its shape (`b ≤ hi`, `inside`), in
                        // its checked layout.
                        unsafe { gather::<T>(&mut d[a - x0..b - x0], src, step) };
                    }
                }
            }
        }
    }
}

/// `dst[k] = src[k·step]`, converted to the compute type.
///
/// # Safety
/// `src + k·step` for `k < dst.len()` are elements of one checked operand.
#[inline(always)]
unsafe fn gather<T: Elem>(dst: &mut [T::C], src: *const T, step: isize) {
    if step == 1 {
        // SAFETY: `dst.len()` consecutive elements (the contract).
        let s = unsafe { std::slice::from_raw_parts(src, dst.len()) };
        for (d, v) in dst.iter_mut().zip(s) {
            *d = v.load();
        }
    } else {
        for (k, d) in dst.iter_mut().enumerate() {
            // SAFETY: element `k` of the strided run (the contract).
            *d = unsafe { src.offset(k as isize * step).read() }.load();
        }
    }
}

/// Stores a block's product (`[og, qb]`, row-major: output channels `o0..o0 + og`, columns
/// `start..start + qb` of the batch's positions) into the output, each value plus its
/// channel's bias, rounded once to `T`.
fn scatter<T: Elem>(
    o: &Operand<'_>,
    g: &Geometry,
    prod: &[T::C],
    (o0, og): (usize, usize),
    start: usize,
    bias: &[T::C],
) where
    T::C: Real,
{
    let pos = g.oh * g.ow;
    let qb = prod.len() / og;
    for (oo, row) in prod.chunks_exact(qb).enumerate() {
        let oc = o0 + oo;
        let mut col = start;
        while col < start + qb {
            let (ni, p0) = (col / pos, col % pos);
            let len = (pos - p0).min(start + qb - col);
            store_run::<T>(o, g, [ni, oc], p0, &row[col - start..][..len], bias[oc]);
            col += len;
        }
    }
}

/// Stores `vals` plus `b`, each rounded once to `T`, at the positions `p0..p0 + vals.len()`
/// (row-major over `[OH, OW]`) of the output's `[ni, oc]`.
fn store_run<T: Elem>(o: &Operand<'_>, g: &Geometry, [ni, oc]: [usize; 2], p0: usize, vals: &[T::C], b: T::C)
where
    T::C: Real,
{
    let s = o.strides;
    // The output's rows follow one another at its column stride: positions are one run.
    if g.oh == 1 || s[2] == g.ow as isize * s[3] {
        let first = at4::<T>(o, [ni, oc, 0, 0]).wrapping_offset(p0 as isize * s[3]);
        if s[3] == 1 {
            // SAFETY: positions `p0..p0 + len` of `[ni, oc]`, consecutive in the output's
            // checked layout (one run, unit column stride); the instruction holds the write
            // access to its storage, which no input shares (staged).
            let dst = unsafe { std::slice::from_raw_parts_mut(first, vals.len()) };
            for (d, &v) in dst.iter_mut().zip(vals) {
                *d = T::store(v + b);
            }
        } else {
            for (k, &v) in vals.iter().enumerate() {
                // SAFETY: as above, position `p0 + k` at the column stride.
                unsafe { first.wrapping_offset(k as isize * s[3]).write(T::store(v + b)) };
            }
        }
    } else {
        for (k, &v) in vals.iter().enumerate() {
            let p = p0 + k;
            // SAFETY: an index within the output's shape; write access as above.
            unsafe { at4::<T>(o, [ni, oc, p / g.ow, p % g.ow]).write(T::store(v + b)) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, run_with, t_f32, tensor, values};

    fn attrs(ints: &[i64]) -> Attrs {
        Attrs::default().with_params(ints, &[]).unwrap()
    }

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.61).sin()).collect()
    }

    /// The naive convolution of row-major operands, in `f64`.
    #[allow(clippy::too_many_arguments)]
    fn naive(
        x: &[f32],
        [n, c, h, w]: [usize; 4],
        wt: &[f32],
        [o, cg, kh, kw]: [usize; 4],
        bias: Option<&[f32]>,
        p: &[i64],
    ) -> (Vec<usize>, Vec<f64>) {
        let (sh, sw, pt, pb, pl, pr, dh, dw, g) = (
            p[0] as usize,
            p[1] as usize,
            p[2] as isize,
            p[3] as usize,
            p[4] as isize,
            p[5] as usize,
            p[6] as usize,
            p[7] as usize,
            p[8] as usize,
        );
        let oh = (h + pt as usize + pb - dh * (kh - 1) - 1) / sh + 1;
        let ow = (w + pl as usize + pr - dw * (kw - 1) - 1) / sw + 1;
        let og = o / g;
        let mut out = vec![0.0; n * o * oh * ow];
        for ni in 0..n {
            for oo in 0..o {
                for y in 0..oh {
                    for xx in 0..ow {
                        let mut s = bias.map_or(0.0, |b| f64::from(b[oo]));
                        for ci in 0..cg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let hy = (y * sh + i * dh) as isize - pt;
                                    let wx = (xx * sw + j * dw) as isize - pl;
                                    if hy < 0 || wx < 0 || hy as usize >= h || wx as usize >= w {
                                        continue;
                                    }
                                    let cin = (oo / og) * cg + ci;
                                    s += f64::from(x[((ni * c + cin) * h + hy as usize) * w + wx as usize])
                                        * f64::from(wt[((oo * cg + ci) * kh + i) * kw + j]);
                                }
                            }
                        }
                        out[((ni * o + oo) * oh + y) * ow + xx] = s;
                    }
                }
            }
        }
        (vec![n, o, oh, ow], out)
    }

    #[test]
    fn conv2d_matches_the_naive_loop() {
        // Input shape, weight shape, parameters, whether a bias is given.
        type Case = ([usize; 4], [usize; 4], [i64; 9], bool);
        let cases: &[Case] = &[
            ([1, 1, 4, 4], [1, 1, 3, 3], [1, 1, 0, 0, 0, 0, 1, 1, 1], false),
            ([2, 3, 7, 6], [4, 3, 3, 2], [2, 1, 1, 1, 0, 2, 1, 1, 1], true),
            ([2, 4, 9, 9], [6, 2, 3, 3], [1, 2, 2, 2, 1, 1, 2, 1, 2], true),
            ([1, 6, 5, 5], [6, 1, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 6], true),
            ([1, 8, 20, 20], [16, 8, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1], true),
            ([0, 2, 3, 3], [2, 2, 1, 1], [1, 1, 0, 0, 0, 0, 1, 1, 1], false),
        ];
        for &(xs, ws, p, with_bias) in cases {
            let (xv, wv, bv) =
                (vals(xs.iter().product(), 0.0), vals(ws.iter().product(), 3.0), vals(ws[0], 7.0));
            let mut ins = vec![t_f32(&xs, &xv), t_f32(&ws, &wv)];
            if with_bias {
                ins.push(t_f32(&[ws[0]], &bv));
            }
            let out = run_with(&Conv2dKernel, attrs(&p), ins, &[]).unwrap();
            let (shape, want) = naive(&xv, xs, &wv, ws, with_bias.then_some(&bv[..]), &p);
            assert_eq!(out[0].0.shape.as_slice(), &shape[..], "{xs:?} {ws:?} {p:?}");
            for (g, w) in as_f32(&out[0]).iter().zip(want) {
                assert!((f64::from(*g) - w).abs() <= 1e-5 * (1.0 + w.abs()), "{g} against {w}");
            }
        }
    }

    /// A small deterministic generator (xorshift64) for the random cases.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        /// Uniform in `[-1, 1)`, never 0 (so that `0 · ∞` never arises from a weight).
        fn value(&mut self) -> f64 {
            let v = (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0;
            if v == 0.0 {
                0.5
            } else {
                v
            }
        }
    }

    /// The naive convolution of row-major `f64` operands, and each output element's sum of
    /// the magnitudes of its terms (bias included).
    #[allow(clippy::too_many_arguments)]
    fn naive_mag(
        x: &[f64],
        [n, c, h, w]: [usize; 4],
        wt: &[f64],
        [o, cg, kh, kw]: [usize; 4],
        bias: Option<&[f64]>,
        p: &[i64],
    ) -> (Vec<usize>, Vec<f64>, Vec<f64>) {
        let u = |i: usize| p[i] as usize;
        let (sh, sw, pt, pb, pl, pr, dh, dw, g) = (u(0), u(1), u(2), u(3), u(4), u(5), u(6), u(7), u(8));
        let oh = (h + pt + pb - dh * (kh - 1) - 1) / sh + 1;
        let ow = (w + pl + pr - dw * (kw - 1) - 1) / sw + 1;
        let og = o / g;
        let (mut out, mut mag) = (vec![0.0; n * o * oh * ow], vec![0.0; n * o * oh * ow]);
        for ni in 0..n {
            for oo in 0..o {
                for y in 0..oh {
                    for xx in 0..ow {
                        let b = bias.map_or(0.0, |b| b[oo]);
                        let (mut s, mut m) = (b, b.abs());
                        for ci in 0..cg {
                            for i in 0..kh {
                                for j in 0..kw {
                                    let hy = (y * sh + i * dh) as isize - pt as isize;
                                    let wx = (xx * sw + j * dw) as isize - pl as isize;
                                    if hy < 0 || wx < 0 || hy as usize >= h || wx as usize >= w {
                                        continue;
                                    }
                                    let cin = (oo / og) * cg + ci;
                                    let t = x[((ni * c + cin) * h + hy as usize) * w + wx as usize]
                                        * wt[((oo * cg + ci) * kh + i) * kw + j];
                                    s += t;
                                    m += t.abs();
                                }
                            }
                        }
                        out[((ni * o + oo) * oh + y) * ow + xx] = s;
                        mag[((ni * o + oo) * oh + y) * ow + xx] = m;
                    }
                }
            }
        }
        (vec![n, o, oh, ow], out, mag)
    }

    /// Row-major index of `idx` in `shape`.
    fn flat(shape: [usize; 4], idx: [usize; 4]) -> usize {
        ((idx[0] * shape[1] + idx[1]) * shape[2] + idx[2]) * shape[3] + idx[3]
    }

    /// Every index of `shape`, row-major.
    fn indices(shape: [usize; 4]) -> impl Iterator<Item = [usize; 4]> {
        (0..shape.iter().product::<usize>()).map(move |mut k| {
            let mut idx = [0; 4];
            for d in (0..4).rev() {
                idx[d] = k % shape[d];
                k /= shape[d];
            }
            idx
        })
    }

    /// The strides of `shape` stored with its dimensions in memory in the order `order`
    /// (outermost first).
    fn strides_of(shape: [usize; 4], order: [usize; 4]) -> [isize; 4] {
        let (mut strides, mut acc) = ([0isize; 4], 1isize);
        for &d in order.iter().rev() {
            strides[d] = acc;
            acc *= shape[d] as isize;
        }
        strides
    }

    /// A tensor of `dtype` (`f32` or `f64`) of logical shape `shape` holding the row-major
    /// values `v`, stored with its dimensions in memory in the order `order`.
    fn laid(v: &[f64], shape: [usize; 4], order: [usize; 4], dtype: DType) -> crate::kernels::testing::Owned {
        let strides = strides_of(shape, order);
        let mut stored = vec![0.0; v.len()];
        for idx in indices(shape) {
            let at: isize = (0..4).map(|d| idx[d] as isize * strides[d]).sum();
            stored[at as usize] = v[flat(shape, idx)];
        }
        let mem: Vec<usize> = order.iter().map(|&d| shape[d]).collect();
        let mut t = if dtype == DType::F32 {
            tensor(&mem, &stored.iter().map(|&v| v as f32).collect::<Vec<_>>())
        } else {
            tensor(&mem, &stored)
        };
        t.0.shape = shape.into_iter().collect();
        t.0.strides = strides.into_iter().collect();
        t
    }

    /// A stored tensor's elements at `strides`, in row-major order of `shape`, as `f64`.
    fn read(t: &crate::kernels::testing::Owned, shape: [usize; 4], strides: [isize; 4]) -> Vec<f64> {
        let all: Vec<f64> = if t.0.dtype == DType::F32 {
            values::<f32>(t).into_iter().map(f64::from).collect()
        } else {
            values::<f64>(t)
        };
        indices(shape)
            .map(|idx| all[(0..4).map(|d| idx[d] as isize * strides[d]).sum::<isize>() as usize])
            .collect()
    }

    /// `got` against the exact result: NaN where it is NaN, the same infinity, else within
    /// `(kc + 1) · ε · Σ|terms|` (the worst-case error of any summation order of `kc` terms
    /// and a bias, with the final rounding; `ε` the dtype's machine epsilon).
    fn check(got: &[f64], want: &[f64], mag: &[f64], kc: usize, dtype: DType, what: &str) {
        assert_eq!(got.len(), want.len(), "{what}");
        let eps = if dtype == DType::F32 { f64::from(f32::EPSILON) } else { f64::EPSILON };
        for (k, ((&g, &w), &m)) in got.iter().zip(want).zip(mag).enumerate() {
            if w.is_nan() {
                assert!(g.is_nan(), "{what}: element {k} is {g}, not NaN");
            } else if w.is_infinite() {
                assert_eq!(g, w, "{what}: element {k}");
            } else {
                let tol = (kc + 1) as f64 * eps * m;
                assert!((g - w).abs() <= tol, "{what}: element {k} is {g} against {w} (tolerance {tol})");
            }
        }
    }

    /// One convolution through the kernel, checked against [`naive_mag`]: the input and the
    /// weight stored in the memory orders `xo` and `wo`.
    #[allow(clippy::too_many_arguments)]
    fn case(
        xs: [usize; 4],
        ws: [usize; 4],
        p: [i64; 9],
        with_bias: bool,
        dtype: DType,
        (xo, wo): ([usize; 4], [usize; 4]),
        xv: &[f64],
        rng: &mut Rng,
    ) {
        let wv: Vec<f64> = (0..ws.iter().product()).map(|_| rng.value()).collect();
        let bv: Vec<f64> = (0..ws[0]).map(|_| rng.value()).collect();
        // The operands' values as the dtype holds them.
        let round = |v: &[f64]| -> Vec<f64> {
            if dtype == DType::F32 {
                v.iter().map(|&v| f64::from(v as f32)).collect()
            } else {
                v.to_vec()
            }
        };
        let (xv, wv, bv) = (round(xv), round(&wv), round(&bv));
        let mut ins = vec![laid(&xv, xs, xo, dtype), laid(&wv, ws, wo, dtype)];
        if with_bias {
            // A bias read at stride 2: the even elements of a tensor twice its length.
            let wide: Vec<f64> = bv.iter().flat_map(|&v| [v, f64::NAN]).collect();
            let mut b = laid(&wide, [1, 1, 1, wide.len()], [0, 1, 2, 3], dtype);
            b.0.shape = [ws[0]].into_iter().collect();
            b.0.strides = [2].into_iter().collect();
            ins.push(b);
        }
        let what = format!("{dtype:?} {xs:?} {ws:?} {p:?} bias {with_bias} orders {xo:?} {wo:?}");
        let out = run_with(&Conv2dKernel, attrs(&p), ins, &[]).unwrap_or_else(|e| panic!("{what}: {e}"));
        let (shape, want, mag) = naive_mag(&xv, xs, &wv, ws, with_bias.then_some(&bv[..]), &p);
        let os: [usize; 4] = shape.clone().try_into().unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &shape[..], "{what}");
        let got = read(&out[0], os, strides_of(os, [0, 1, 2, 3]));
        check(&got, &want, &mag, ws[1] * ws[2] * ws[3], dtype, &what);
    }

    /// `count` random convolutions of `cg` input channels per group drawn from `cgs`, with
    /// random shapes, paddings, dilations, groups and (unless `stride_one`) strides, in `f32`
    /// and `f64`, with contiguous and permuted operands, against the naive loop.
    fn random_cases(seed: u64, count: usize, cgs: (usize, usize), stride_one: bool) {
        let mut rng = Rng(seed);
        let orders = [[0, 1, 2, 3], [0, 2, 3, 1], [3, 2, 1, 0], [1, 0, 3, 2]];
        let mut done = 0;
        while done < count {
            let (groups, cg, og) = (1 + rng.below(3), cgs.0 + rng.below(cgs.1), 1 + rng.below(3));
            let (n, h, w) = (rng.below(4), 1 + rng.below(9), 1 + rng.below(9));
            let (kh, kw) = (1 + rng.below(4), 1 + rng.below(4));
            let mut p = [0i64; 9];
            for (k, v) in p.iter_mut().enumerate() {
                *v = match k {
                    0 | 1 if stride_one => 1,
                    0 | 1 => 1 + rng.below(3) as i64,
                    2..=5 => rng.below(4) as i64,
                    6 | 7 => 1 + rng.below(2) as i64,
                    _ => groups as i64,
                };
            }
            let (span_h, span_w) = (p[6] as usize * (kh - 1) + 1, p[7] as usize * (kw - 1) + 1);
            if h + ((p[2] + p[3]) as usize) < span_h || w + ((p[4] + p[5]) as usize) < span_w {
                continue;
            }
            let xs = [n, groups * cg, h, w];
            let xv: Vec<f64> = (0..xs.iter().product()).map(|_| rng.value()).collect();
            let dtype = if done % 2 == 0 { DType::F32 } else { DType::F64 };
            let layout = (orders[rng.below(4)], orders[rng.below(4)]);
            case(xs, [groups * og, cg, kh, kw], p, rng.below(2) == 0, dtype, layout, &xv, &mut rng);
            done += 1;
        }
    }

    /// Few channels: the im2col blocks.
    #[test]
    fn random_convolutions_match_the_naive_loop() {
        random_cases(0x9e37_79b9_7f4a_7c15, 120, (1, 3), false);
    }

    /// Stride 1 and at least `TAP_MIN_CHANNELS` channels per group: tap by tap.
    #[test]
    fn random_tap_convolutions_match_the_naive_loop() {
        random_cases(0x2545_f491_4f6c_dd1d, 40, (TAP_MIN_CHANNELS, 5), true);
    }

    /// The edges: batch 1, one channel, a kernel larger than the input with padding, an
    /// empty batch, each route over several blocks, and NaN and infinities in the input.
    #[test]
    fn edge_convolutions_match_the_naive_loop() {
        let mut rng = Rng(7);
        let id = [0, 1, 2, 3];
        let nhwc = [0, 2, 3, 1];
        type Edge = ([usize; 4], [usize; 4], [i64; 9]);
        let edges: &[Edge] = &[
            ([1, 1, 5, 5], [1, 1, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1]),
            ([1, 1, 2, 3], [2, 1, 5, 6], [1, 1, 2, 2, 3, 3, 1, 1, 1]),
            ([2, 3, 2, 2], [3, 1, 4, 4], [2, 1, 3, 1, 2, 2, 1, 1, 3]),
            ([0, 2, 6, 6], [4, 2, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1]),
            // Tap by tap, over the `gemm` crate.
            ([3, 16, 30, 30], [8, 16, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1]),
            // Strides other than 1: blocks of positions.
            ([3, 16, 29, 31], [6, 8, 3, 2], [2, 1, 0, 1, 1, 0, 1, 2, 2]),
            // `kc = 144`: blocks of 1820 of the 2025 positions, the first ending inside a
            // row of the ninth image.
            ([9, 16, 30, 30], [8, 16, 3, 3], [2, 2, 1, 1, 1, 1, 1, 1, 1]),
            // Tap by tap: a kernel larger than the input, batch 1, dilation, groups.
            ([1, 16, 2, 3], [4, 16, 4, 5], [1, 1, 2, 1, 2, 3, 1, 1, 1]),
            ([2, 32, 7, 6], [6, 16, 3, 2], [1, 1, 2, 0, 1, 3, 2, 3, 2]),
            // Stride 1, few channels: blocks of 2 widened images, then 1.
            ([3, 8, 40, 40], [4, 8, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1]),
            // LeNet's first layer: `kc = 25`, one block of every image.
            ([4, 1, 32, 32], [6, 1, 5, 5], [1, 1, 0, 0, 0, 0, 1, 1, 1]),
        ];
        for dtype in [DType::F32, DType::F64] {
            for &(xs, ws, p) in edges {
                let xv: Vec<f64> = (0..xs.iter().product()).map(|_| rng.value()).collect();
                for layout in [(id, id), (nhwc, [1, 0, 3, 2])] {
                    case(xs, ws, p, true, dtype, layout, &xv, &mut rng);
                }
            }
            // NaN and both infinities in the input (the weights are finite and nonzero).
            let xs = [2, 2, 7, 7];
            let mut xv: Vec<f64> = (0..xs.iter().product()).map(|_| rng.value()).collect();
            xv[3] = f64::NAN;
            xv[60] = f64::INFINITY;
            xv[61] = f64::NEG_INFINITY;
            xv[150] = f64::INFINITY;
            case(xs, [3, 2, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1], true, dtype, (id, id), &xv, &mut rng);
        }
    }

    /// An output laid out channels-last (a caller's own layout) is written where its strides
    /// say.
    #[test]
    fn a_strided_output_is_written_in_place() {
        use crate::ep::DeviceId;
        let mut rng = Rng(11);
        let (xs, ws, p) = ([2, 3, 6, 5], [4, 3, 2, 2], [1, 1, 1, 0, 0, 1, 1, 1, 1]);
        let xv: Vec<f64> = (0..xs.iter().product()).map(|_| rng.value()).collect();
        let wv: Vec<f64> = (0..ws.iter().product()).map(|_| rng.value()).collect();
        let (x, w) = (laid(&xv, xs, [0, 1, 2, 3], DType::F64), laid(&wv, ws, [0, 1, 2, 3], DType::F64));
        let (shape, want, mag) = naive_mag(&xv, xs, &wv, ws, None, &p);
        let os: [usize; 4] = shape.try_into().unwrap();
        let strides = strides_of(os, [0, 2, 3, 1]);
        let mut meta = TensorMeta::new(&os, DType::F64, DeviceId::CPU);
        meta.strides = strides.into_iter().collect();
        let out = tensor(&[os.iter().product()], &vec![f64::NAN; os.iter().product()]);
        crate::kernels::testing::compute_raw(
            &Conv2dKernel,
            attrs(&p),
            &[(&x.0, &x.1), (&w.0, &w.1)],
            (&meta, &out.1),
        )
        .unwrap();
        let out = (meta, out.1);
        check(&read(&out, os, strides), &want, &mag, 12, DType::F64, "channels-last output");
    }

    #[test]
    fn half_conv_rounds_once() {
        use half::f16;
        let xv: Vec<f16> = vals(16, 0.0).into_iter().map(f16::from_f32).collect();
        let wv: Vec<f16> = vals(4, 1.0).into_iter().map(f16::from_f32).collect();
        let p = [1, 1, 0, 0, 0, 0, 1, 1, 1];
        let out = run_with(
            &Conv2dKernel,
            attrs(&p),
            vec![tensor(&[1, 1, 4, 4], &xv), tensor(&[1, 1, 2, 2], &wv)],
            &[],
        )
        .unwrap();
        let xf: Vec<f32> = xv.iter().map(|v| v.to_f32()).collect();
        let wf: Vec<f32> = wv.iter().map(|v| v.to_f32()).collect();
        let (_, want) = naive(&xf, [1, 1, 4, 4], &wf, [1, 1, 2, 2], None, &p);
        let got: Vec<f16> = values(&out[0]);
        for (g, w) in got.iter().zip(want) {
            assert_eq!(*g, f16::from_f32(w as f32));
        }
    }

    /// `infer` accepts exactly the declared dtypes (the registry's probe cannot call
    /// `conv2d` without its parameters).
    #[test]
    fn infer_accepts_the_declared_dtypes() {
        use crate::ep::DeviceId;
        let accepted: Vec<DType> = DType::ALL
            .into_iter()
            .filter(|&d| {
                let (x, w) = (
                    TensorMeta::new(&[1, 2, 3, 3], d, DeviceId::CPU),
                    TensorMeta::new(&[1, 2, 2, 2], d, DeviceId::CPU),
                );
                let mut specs = OutSpecs::new();
                Conv2dKernel.infer(&[&x, &w], &[], &attrs(&[1, 1, 0, 0, 0, 0, 1, 1, 1]), &mut specs).is_ok()
            })
            .collect();
        assert_eq!(accepted, Conv2dKernel.dtypes());
    }

    #[test]
    fn conv2d_refusals() {
        let x = t_f32(&[1, 4, 5, 5], &[0.0; 100]).0;
        let w = t_f32(&[2, 3, 3, 3], &[0.0; 54]).0;
        let mut specs = OutSpecs::new();
        let e =
            Conv2dKernel.infer(&[&x, &w], &[], &attrs(&[1, 1, 0, 0, 0, 0, 1, 1, 1]), &mut specs).unwrap_err();
        assert!(e.contains("the weight takes 3 channels per group but the input has 4"), "{e}");
        let w = t_f32(&[2, 4, 7, 3], &[0.0; 168]).0;
        let e =
            Conv2dKernel.infer(&[&x, &w], &[], &attrs(&[1, 1, 0, 0, 0, 0, 1, 1, 1]), &mut specs).unwrap_err();
        assert!(e.contains("smaller than the dilated kernel (7)"), "{e}");
        let e = Conv2dKernel.infer(&[&x, &w], &[], &Attrs::default(), &mut specs).unwrap_err();
        assert!(e.contains("takes 9 integer parameters"), "{e}");
    }
}
