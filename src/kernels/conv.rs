//! 2-D convolution: `conv2d`, as im2col and a matrix product per image and group.
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
/// Each image and group is computed as one matrix product: the weight's rows (converted to
/// the compute type once) times the im2col matrix of the image (`[C/groups · kh · kw, OH ·
/// OW]`, in the compute type), by `kernels::gemm` (plain loops adding in increasing
/// `(c, i, j)` up to 64³ multiply-adds, the `gemm` crate above), the bias added to the sum
/// and the result stored once (`f16`, `bf16` through `f32`). Operands of any layout.
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
    // The weight and the output fit in memory, so `oc · kc` and `og · pos` do; the im2col
    // matrix, their product's size, may not.
    let cols_len = kc.checked_mul(pos).ok_or("conv2d's im2col matrix is larger than memory")?;
    let mut cols = buffer::<T::C>(cols_len, "conv2d's im2col matrix")?;
    let mut obuf = buffer::<T::C>(og * pos, "conv2d's product")?;
    let (top, left) = (p.pad.0 as isize, p.pad.2 as isize);
    for ni in 0..n {
        for g in 0..p.groups {
            for ci in 0..cg {
                for i in 0..kh {
                    for j in 0..kw {
                        let row = &mut cols[((ci * kh + i) * kw + j) * pos..][..pos];
                        for y in 0..oh {
                            let hy = (y * p.stride.0 + i * p.dilation.0) as isize - top;
                            for xx in 0..ow {
                                let wx = (xx * p.stride.1 + j * p.dilation.1) as isize - left;
                                row[y * ow + xx] =
                                    if hy >= 0 && (hy as usize) < h && wx >= 0 && (wx as usize) < wd {
                                        // SAFETY: an index within the input's shape (checked above).
                                        unsafe {
                                            at4::<T>(x, [ni, g * cg + ci, hy as usize, wx as usize]).read()
                                        }
                                        .load()
                                    } else {
                                        <T::C as Ring>::ZERO
                                    };
                            }
                        }
                    }
                }
            }
            let m = |v: &mut Vec<T::C>, at: usize, cols: usize| Mat {
                ptr: v.as_mut_ptr().wrapping_add(at),
                rs: cols as isize,
                cs: 1,
            };
            let wm = m(&mut wbuf, g * og * kc, kc);
            let cm = m(&mut cols, 0, pos);
            let om = m(&mut obuf, 0, pos);
            // SAFETY: three row-major buffers of this function's: the group's `og` weight rows
            // of `kc`, `kc` im2col rows of `pos`, `og` output rows of `pos`; the output buffer
            // is disjoint from the other two.
            unsafe { gemm::product((og, kc, pos), wm, cm, om)? };
            for oo in 0..og {
                let oc_i = g * og + oo;
                for y in 0..oh {
                    for xx in 0..ow {
                        let v = obuf[oo * pos + y * ow + xx] + bvals[oc_i];
                        // SAFETY: an index within the output's shape; the instruction holds the
                        // write access to its storage, which no input shares (staged).
                        unsafe { at4::<T>(&o, [ni, oc_i, y, xx]).write(T::store(v)) };
                    }
                }
            }
        }
    }
    Ok(())
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
