//! 2-D pooling: `max_pool2d`, `max_pool2d_with_indices`, `avg_pool2d`,
//! `adaptive_avg_pool2d`, over `[N, C, H, W]` inputs of any layout.

use super::conv::{at4, window_out, Real};
use super::dtype::{dispatch, Elem, Ring};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{expect_count, input, output};
use super::{check_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta};

/// A window's geometry along the two spatial dimensions.
#[derive(Debug, Clone, Copy)]
struct Window {
    k: (usize, usize),
    stride: (usize, usize),
    pad: (usize, usize),
    dilation: (usize, usize),
    ceil: bool,
}

/// Integer `i` of `op`'s parameter list as a size of at least `min`.
fn param(op: &str, p: &[i64], i: usize, what: &str, min: i64) -> Result<usize, String> {
    let v = p[i];
    if v < min {
        return Err(format!("{op}'s {what} is {v} but must be at least {min}"));
    }
    usize::try_from(v).map_err(|_| format!("{op}'s {what} is out of range: {v}"))
}

/// Check that input 0 is `[N, C, H, W]` of a dtype `dtypes` admits.
fn check_input(op: &str, inputs: &[&TensorMeta], dtypes: Dtypes) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    let x = inputs[0];
    check_dtype(op, x.dtype, dtypes)?;
    if x.shape.len() != 4 {
        return Err(format!("input 0 is {}: {op} takes a 4-D input [N, C, H, W]", x.describe()));
    }
    Ok(())
}

impl Window {
    /// The window of `op`'s parameter list, `[kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode]`
    /// (`dilated`) or `[kh, kw, sh, sw, ph, pw, ceil_mode, ...]` (not).
    fn of(op: &str, attrs: &Attrs, dilated: bool, len: usize) -> Result<Window, String> {
        let p = attrs.params().ints();
        if p.len() != len {
            return Err(format!("{op} takes {len} integer parameters, got {}", p.len()));
        }
        let k = (param(op, p, 0, "kernel size", 1)?, param(op, p, 1, "kernel size", 1)?);
        let stride = (param(op, p, 2, "stride", 1)?, param(op, p, 3, "stride", 1)?);
        let pad = (param(op, p, 4, "padding", 0)?, param(op, p, 5, "padding", 0)?);
        let (dilation, ceil_at) = if dilated {
            ((param(op, p, 6, "dilation", 1)?, param(op, p, 7, "dilation", 1)?), 8)
        } else {
            ((1, 1), 6)
        };
        if pad.0 > k.0 / 2 || pad.1 > k.1 / 2 {
            return Err(format!(
                "{op}'s padding ({}, {}) must be at most half of the kernel size ({}, {})",
                pad.0, pad.1, k.0, k.1
            ));
        }
        Ok(Window { k, stride, pad, dilation, ceil: p[ceil_at] != 0 })
    }

    /// The output shape over input `x`.
    fn out_shape(&self, op: &str, x: &TensorMeta) -> Result<Shape, String> {
        let size = |d: usize, pad, k, s, dil| {
            window_out(x.shape[d], (pad, pad), k, s, dil, self.ceil).filter(|&n| n > 0).ok_or_else(|| {
                format!(
                    "input 0 is {}: the padded input is smaller than {op}'s window (dimension {d})",
                    x.describe()
                )
            })
        };
        let oh = size(2, self.pad.0, self.k.0, self.stride.0, self.dilation.0)?;
        let ow = size(3, self.pad.1, self.k.1, self.stride.1, self.dilation.1)?;
        Ok([x.shape[0], x.shape[1], oh, ow].into_iter().collect())
    }
}

/// Input 0 of a call, staged where it overlaps output `o`, and the output checked to be of
/// `shape`.
fn operands<'c>(
    ctx: &'c KernelCtx<'_, '_>,
    o: &Operand<'_>,
    out_data: &crate::alloc::Storage,
    dtype: DType,
) -> Result<(Operand<'c>, Option<Staged>), String> {
    let t = input(ctx, 0)?;
    let x = Operand::input(t.meta, t.data, 0, dtype)?;
    let staged =
        if share(&x, t.data, o, out_data) == Share::Disjoint { None } else { Some(Staged::new(&x)?) };
    Ok((x, staged))
}

fn check_out(op: &str, o: &Operand<'_>, meta: &TensorMeta, shape: &[usize]) -> Result<(), String> {
    if o.shape != shape {
        return Err(format!("output {} but {op} produces {shape:?}", meta.describe()));
    }
    Ok(())
}

/// `max_pool2d` and `max_pool2d_with_indices`: input `x: [N, C, H, W]` of a numeric dtype;
/// output `[N, C, OH, OW]` of `x`'s dtype, the largest element of each window (NaN where
/// the window holds one), and, for `max_pool2d_with_indices`, a second `i64` output with
/// the index of that element in its plane, `h · W + w` (PyTorch's flattened index); among
/// equal elements the first in row-major order, among NaNs the last.
///
/// The parameter list's integers are `[kh, kw, sh, sw, ph, pw, dh, dw, ceil_mode]`: kernel
/// size, stride, padding (each side; at most half the kernel size, as PyTorch requires),
/// dilation, and `ceil_mode` (0 or 1). The padding takes no part (it is `-∞`). `OH =
/// (H + 2·ph - dh·(kh - 1) - 1) / sh + 1`, rounded up under `ceil_mode`, where a last window
/// that would start in the right padding is dropped.
#[derive(Debug, Clone, Copy, Default)]
pub struct MaxPool2dKernel {
    indices: bool,
}

/// `max_pool2d` (values only).
pub static MAX_POOL2D: MaxPool2dKernel = MaxPool2dKernel { indices: false };
/// `max_pool2d_with_indices` (values and indices).
pub static MAX_POOL2D_WITH_INDICES: MaxPool2dKernel = MaxPool2dKernel { indices: true };

impl MaxPool2dKernel {
    fn op(&self) -> &'static str {
        if self.indices {
            "max_pool2d_with_indices"
        } else {
            "max_pool2d"
        }
    }
}

impl OpKernel for MaxPool2dKernel {
    fn name(&self) -> &'static str {
        self.op()
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Numeric.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        check_input(self.op(), inputs, Dtypes::Numeric)?;
        let shape = Window::of(self.op(), attrs, true, 9)?.out_shape(self.op(), inputs[0])?;
        if self.indices {
            outputs.push(OutSpec { shape: shape.clone(), dtype: inputs[0].dtype });
            outputs.push(OutSpec { shape, dtype: DType::I64 });
        } else {
            outputs.push(OutSpec { shape, dtype: inputs[0].dtype });
        }
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
        let x = input(ctx, 0)?.meta;
        let win = Window::of(self.op(), &ctx.attrs, true, 9)?;
        let shape = win.out_shape(self.op(), x)?;
        let dtype = x.dtype;
        dispatch!(
            dtype,
            numeric,
            T => max_pool::<T>(ctx, self, win, &shape),
            Err(refusal(self.op(), dtype, Dtypes::Numeric))
        )
    }
}

fn max_pool<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    k: &MaxPool2dKernel,
    win: Window,
    shape: &[usize],
) -> Result<(), String>
where
    T::C: Ring,
{
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    check_out(k.op(), &o, out.meta, shape)?;
    let idx = if k.indices {
        let io = output(ctx, 1)?;
        let i = Operand::output(io.meta, io.data, 1, DType::I64)?;
        check_out(k.op(), &i, io.meta, shape)?;
        if share(&i, io.data, &o, out.data) != Share::Disjoint {
            return Err("output 1 shares memory with output 0".into());
        }
        Some((i, io.data))
    } else {
        None
    };
    if o.numel == 0 {
        return Ok(());
    }
    let (x, mut staged) = operands(ctx, &o, out.data, T::DTYPE)?;
    if let Some((i, data)) = &idx {
        let t = input(ctx, 0)?;
        if staged.is_none() && share(&x, t.data, i, data) != Share::Disjoint {
            staged = Some(Staged::new(&x)?);
        }
    }
    let x = staged.as_ref().map_or(x, Staged::operand);
    let (h, w) = (x.shape[2], x.shape[3]);
    let (oh, ow) = (shape[2], shape[3]);
    for n in 0..shape[0] {
        for c in 0..shape[1] {
            for y in 0..oh {
                for xx in 0..ow {
                    let mut best: Option<(T::C, usize)> = None;
                    for i in 0..win.k.0 {
                        let hy = (y * win.stride.0 + i * win.dilation.0) as isize - win.pad.0 as isize;
                        if hy < 0 || hy as usize >= h {
                            continue;
                        }
                        for j in 0..win.k.1 {
                            let wx = (xx * win.stride.1 + j * win.dilation.1) as isize - win.pad.1 as isize;
                            if wx < 0 || wx as usize >= w {
                                continue;
                            }
                            let (hy, wx) = (hy as usize, wx as usize);
                            // SAFETY: an index within the input's shape (checked above).
                            let v = unsafe { at4::<T>(&x, [n, c, hy, wx]).read() }.load();
                            #[allow(clippy::eq_op)]
                            let nan = v != v;
                            if best.is_none_or(|(m, _)| v > m || nan) {
                                best = Some((v, hy * w + wx));
                            }
                        }
                    }
                    // A window wholly in the padding (PyTorch's bound on the padding leaves
                    // none, but a dilated one may skip the input): the padding's value.
                    let (v, at) = match best {
                        Some((v, at)) => (T::store(v), at as i64),
                        None => (lowest::<T>(), -1),
                    };
                    // SAFETY: an index within the outputs' shape; the instruction holds the
                    // write access to their storages, which the input does not share (staged).
                    unsafe { at4::<T>(&o, [n, c, y, xx]).write(v) };
                    if let Some((i, _)) = &idx {
                        // SAFETY: as above.
                        unsafe { at4::<i64>(i, [n, c, y, xx]).write(at) };
                    }
                }
            }
        }
    }
    Ok(())
}

/// The padding's value of a max pool: `-∞`, or an integer type's least value.
fn lowest<T: Elem>() -> T {
    use super::dtype::Wide;
    match T::DTYPE {
        DType::U8 => T::narrow(Wide::Int(0)),
        DType::I32 => T::narrow(Wide::Int(i64::from(i32::MIN))),
        DType::I64 => T::narrow(Wide::Int(i64::MIN)),
        _ => T::narrow(Wide::Float(f64::NEG_INFINITY)),
    }
}

/// `avg_pool2d`: input `x: [N, C, H, W]` of a floating dtype; output `[N, C, OH, OW]`, the
/// mean of each window, PyTorch's rule: the window's elements inside the input summed in
/// row-major order (in `f32` for `f16`, `bf16`), divided by `divisor_override` where given,
/// else by the window's size clipped to the padded input (`count_include_pad`), else by
/// the count of its elements inside the input; a window with none gives 0.
///
/// The parameter list's integers are `[kh, kw, sh, sw, ph, pw, ceil_mode,
/// count_include_pad, divisor_override]` (`divisor_override` 0 for none). The output size
/// is `max_pool2d`'s without dilation.
#[derive(Debug, Clone, Copy, Default)]
pub struct AvgPool2dKernel;

impl OpKernel for AvgPool2dKernel {
    fn name(&self) -> &'static str {
        "avg_pool2d"
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
        check_input("avg_pool2d", inputs, Dtypes::Floating)?;
        let win = Window::of("avg_pool2d", attrs, false, 9)?;
        param("avg_pool2d", attrs.params().ints(), 8, "divisor_override", 0)?;
        let shape = win.out_shape("avg_pool2d", inputs[0])?;
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
        expect_count(ctx, 1)?;
        let x = input(ctx, 0)?.meta;
        let win = Window::of("avg_pool2d", &ctx.attrs, false, 9)?;
        let p = ctx.attrs.params().ints();
        let (include_pad, divisor) = (p[7] != 0, param("avg_pool2d", p, 8, "divisor_override", 0)?);
        let shape = win.out_shape("avg_pool2d", x)?;
        let dtype = x.dtype;
        dispatch!(
            dtype,
            floating,
            T => avg_pool::<T>(ctx, win, (include_pad, divisor), &shape),
            Err(refusal("avg_pool2d", dtype, Dtypes::Floating))
        )
    }
}

fn avg_pool<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    win: Window,
    (include_pad, divisor): (bool, usize),
    shape: &[usize],
) -> Result<(), String>
where
    T::C: Real,
{
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    check_out("avg_pool2d", &o, out.meta, shape)?;
    if o.numel == 0 {
        return Ok(());
    }
    let (x, staged) = operands(ctx, &o, out.data, T::DTYPE)?;
    let x = staged.as_ref().map_or(x, Staged::operand);
    let (h, w) = (x.shape[2] as isize, x.shape[3] as isize);
    let (ph, pw) = (win.pad.0 as isize, win.pad.1 as isize);
    for n in 0..shape[0] {
        for c in 0..shape[1] {
            for y in 0..shape[2] {
                for xx in 0..shape[3] {
                    let h0 = (y * win.stride.0) as isize - ph;
                    let w0 = (xx * win.stride.1) as isize - pw;
                    let (h1, w1) = ((h0 + win.k.0 as isize).min(h + ph), (w0 + win.k.1 as isize).min(w + pw));
                    let pool = (h1 - h0) * (w1 - w0);
                    let (h0, w0, h1, w1) = (h0.max(0), w0.max(0), h1.min(h), w1.min(w));
                    let v = if h0 >= h1 || w0 >= w1 {
                        <T::C as Ring>::ZERO
                    } else {
                        let mut s = <T::C as Ring>::ZERO;
                        for hy in h0..h1 {
                            for wx in w0..w1 {
                                // SAFETY: an index within the input's shape.
                                s = s + unsafe { at4::<T>(&x, [n, c, hy as usize, wx as usize]).read() }
                                    .load();
                            }
                        }
                        let d = if divisor != 0 {
                            divisor as f64
                        } else if include_pad {
                            pool as f64
                        } else {
                            ((h1 - h0) * (w1 - w0)) as f64
                        };
                        s / T::C::of_f64(d)
                    };
                    // SAFETY: an index within the output's shape; the instruction holds the
                    // write access to its storage, which the input does not share (staged).
                    unsafe { at4::<T>(&o, [n, c, y, xx]).write(T::store(v)) };
                }
            }
        }
    }
    Ok(())
}

/// `adaptive_avg_pool2d`: input `x: [N, C, H, W]` of a floating dtype; output `[N, C, OH,
/// OW]` (the parameter list's integers `[OH, OW]`) where output row `i` averages input rows
/// `floor(i·H / OH)` up to `ceil((i + 1)·H / OH)` (PyTorch's rule; so for columns), summed in
/// row-major order (in `f32` for `f16`, `bf16`) and divided by the count.
#[derive(Debug, Clone, Copy, Default)]
pub struct AdaptiveAvgPool2dKernel;

fn adaptive_shape(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<Shape, String> {
    check_input("adaptive_avg_pool2d", inputs, Dtypes::Floating)?;
    let p = attrs.params().ints();
    if p.len() != 2 {
        return Err(format!(
            "adaptive_avg_pool2d takes 2 integer parameters (the output size), got {}",
            p.len()
        ));
    }
    let (oh, ow) = (
        param("adaptive_avg_pool2d", p, 0, "output size", 0)?,
        param("adaptive_avg_pool2d", p, 1, "output size", 0)?,
    );
    let x = inputs[0];
    if (x.shape[2] == 0 && oh > 0) || (x.shape[3] == 0 && ow > 0) {
        return Err(format!("input 0 is {}: adaptive_avg_pool2d of an empty plane", x.describe()));
    }
    Ok([x.shape[0], x.shape[1], oh, ow].into_iter().collect())
}

impl OpKernel for AdaptiveAvgPool2dKernel {
    fn name(&self) -> &'static str {
        "adaptive_avg_pool2d"
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
        let shape = adaptive_shape(inputs, attrs)?;
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
        expect_count(ctx, 1)?;
        let x = input(ctx, 0)?.meta;
        let shape = adaptive_shape(&[x], &ctx.attrs)?;
        let dtype = x.dtype;
        dispatch!(
            dtype,
            floating,
            T => adaptive::<T>(ctx, &shape),
            Err(refusal("adaptive_avg_pool2d", dtype, Dtypes::Floating))
        )
    }
}

fn adaptive<T: Elem>(ctx: &KernelCtx<'_, '_>, shape: &[usize]) -> Result<(), String>
where
    T::C: Real,
{
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    check_out("adaptive_avg_pool2d", &o, out.meta, shape)?;
    if o.numel == 0 {
        return Ok(());
    }
    let (x, staged) = operands(ctx, &o, out.data, T::DTYPE)?;
    let x = staged.as_ref().map_or(x, Staged::operand);
    let (h, w) = (x.shape[2], x.shape[3]);
    let (oh, ow) = (shape[2], shape[3]);
    let start = |i: usize, o: usize, n: usize| (i * n) / o;
    let end = |i: usize, o: usize, n: usize| ((i + 1) * n).div_ceil(o);
    for n in 0..shape[0] {
        for c in 0..shape[1] {
            for y in 0..oh {
                let (h0, h1) = (start(y, oh, h), end(y, oh, h));
                for xx in 0..ow {
                    let (w0, w1) = (start(xx, ow, w), end(xx, ow, w));
                    let mut s = <T::C as Ring>::ZERO;
                    for hy in h0..h1 {
                        for wx in w0..w1 {
                            // SAFETY: an index within the input's shape.
                            s = s + unsafe { at4::<T>(&x, [n, c, hy, wx]).read() }.load();
                        }
                    }
                    let v = s / T::C::of_f64(((h1 - h0) * (w1 - w0)) as f64);
                    // SAFETY: an index within the output's shape, which the input does not share.
                    unsafe { at4::<T>(&o, [n, c, y, xx]).write(T::store(v)) };
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, run_with, t_f32, t_i64};

    fn attrs(ints: &[i64]) -> Attrs {
        Attrs::default().with_params(ints, &[]).unwrap()
    }

    /// `infer` accepts exactly the declared dtypes (the registry's probe cannot call the
    /// pools without their parameters).
    #[test]
    fn infer_accepts_the_declared_dtypes() {
        use crate::ep::DeviceId;
        let cases: [(&dyn OpKernel, &[i64]); 4] = [
            (&MAX_POOL2D, &[2, 2, 1, 1, 0, 0, 1, 1, 0]),
            (&MAX_POOL2D_WITH_INDICES, &[2, 2, 1, 1, 0, 0, 1, 1, 0]),
            (&AvgPool2dKernel, &[2, 2, 1, 1, 0, 0, 0, 1, 0]),
            (&AdaptiveAvgPool2dKernel, &[1, 1]),
        ];
        for (k, ints) in cases {
            let accepted: Vec<DType> = DType::ALL
                .into_iter()
                .filter(|&d| {
                    let x = TensorMeta::new(&[1, 1, 3, 3], d, DeviceId::CPU);
                    k.infer(&[&x], &[], &attrs(ints), &mut OutSpecs::new()).is_ok()
                })
                .collect();
            assert_eq!(accepted, k.dtypes(), "{}", k.name());
        }
    }

    #[test]
    fn max_pool_values_and_indices() {
        // 1 x 1 x 4 x 4, window 2, stride 2.
        let x: Vec<f32> =
            vec![1.0, 5.0, 2.0, 0.0, 3.0, 4.0, 7.0, 7.0, -1.0, -2.0, f32::NAN, 1.0, -3.0, -4.0, 9.0, 2.0];
        let out = run_with(
            &MAX_POOL2D_WITH_INDICES,
            attrs(&[2, 2, 2, 2, 0, 0, 1, 1, 0]),
            vec![t_f32(&[1, 1, 4, 4], &x)],
            &[],
        )
        .unwrap();
        let v = as_f32(&out[0]);
        assert_eq!((v[0], v[1], v[2]), (5.0, 7.0, -1.0));
        assert!(v[3].is_nan());
        assert_eq!(as_i64(&out[1]), vec![1, 6, 8, 10]);
        // Padding 1, window 3, stride 2, ceil mode; integers.
        let xi: Vec<i64> = (0..25).map(|i| (i * 7) % 11).collect();
        let out =
            run_with(&MAX_POOL2D, attrs(&[3, 3, 2, 2, 1, 1, 1, 1, 1]), vec![t_i64(&[1, 1, 5, 5], &xi)], &[])
                .unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[1, 1, 3, 3]);
    }

    /// A transposed input (`H` and `W` swapped in memory) pools as its contiguous copy.
    #[test]
    fn strided_input_pools_as_its_copy() {
        let v: Vec<f32> = (0..30).map(|i| ((i * 7) % 13) as f32 - 6.0).collect();
        let contiguous = || t_f32(&[1, 2, 3, 5], &v);
        // The same values stored as [1, 2, 5, 3], viewed back as [1, 2, 3, 5].
        let mut stored = vec![0.0; 30];
        for c in 0..2 {
            for h in 0..3 {
                for w in 0..5 {
                    stored[c * 15 + w * 3 + h] = v[c * 15 + h * 5 + w];
                }
            }
        }
        let transposed = || {
            let mut t = t_f32(&[1, 2, 5, 3], &stored);
            t.0.shape = [1, 2, 3, 5].into_iter().collect();
            t.0.strides = [30, 15, 1, 3].into_iter().collect();
            t
        };
        let max = |x| {
            run_with(&MAX_POOL2D_WITH_INDICES, attrs(&[2, 2, 1, 2, 1, 1, 1, 1, 1]), vec![x], &[]).unwrap()
        };
        let (a, b) = (max(contiguous()), max(transposed()));
        assert_eq!((as_f32(&a[0]), as_i64(&a[1])), (as_f32(&b[0]), as_i64(&b[1])));
        let avg = |x| {
            as_f32(&run_with(&AvgPool2dKernel, attrs(&[3, 2, 1, 1, 1, 0, 1, 0, 0]), vec![x], &[]).unwrap()[0])
        };
        assert_eq!(avg(contiguous()), avg(transposed()));
        let ada = |x| as_f32(&run_with(&AdaptiveAvgPool2dKernel, attrs(&[2, 3]), vec![x], &[]).unwrap()[0]);
        assert_eq!(ada(contiguous()), ada(transposed()));
    }

    #[test]
    fn avg_pool_divisors_follow_pytorch() {
        let x: Vec<f32> = (1..=9).map(|i| i as f32).collect();
        // Window 2, stride 1, padding 1: the corner window holds x[0] alone.
        let run = |ints: &[i64]| {
            as_f32(&run_with(&AvgPool2dKernel, attrs(ints), vec![t_f32(&[1, 1, 3, 3], &x)], &[]).unwrap()[0])
        };
        assert_eq!(run(&[2, 2, 1, 1, 1, 1, 0, 1, 0])[0], 0.25);
        assert_eq!(run(&[2, 2, 1, 1, 1, 1, 0, 0, 0])[0], 1.0);
        assert_eq!(run(&[2, 2, 1, 1, 1, 1, 0, 0, 2])[0], 0.5);
        assert_eq!(run(&[3, 3, 3, 3, 0, 0, 0, 1, 0]), vec![5.0]);
    }

    #[test]
    fn adaptive_windows_overlap_as_pytorch_says() {
        // H = 5 to 3: rows [0, 2), [1, 4), [3, 5).
        let x: Vec<f32> = (0..5).map(|i| i as f32).collect();
        let out =
            run_with(&AdaptiveAvgPool2dKernel, attrs(&[3, 1]), vec![t_f32(&[1, 1, 5, 1], &x)], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![0.5, 2.0, 3.5]);
    }
}
