//! Convolution, pooling and attention with PyTorch's semantics (`torch.nn.functional`'s
//! `conv2d`, `max_pool2d`, `avg_pool2d`, `adaptive_avg_pool2d`,
//! `scaled_dot_product_attention`), each one op (`docs/ops.md`, "Convolution, pooling and
//! attention"). An unbatched `[C, H, W]` input is viewed as a batch of one and the result
//! viewed back, as PyTorch does.

use super::Array;
use crate::framework::{Attrs, Scalar};
use crate::vm::{Error, Result};

/// A refusal of `op` before any call.
fn refuse(op: &str, detail: String) -> Error {
    Error::InvalidOperands { op: op.into(), detail }
}

/// Attributes holding the parameter list `ints`, `scalars` of a call of `op`.
fn params(op: &str, ints: &[i64], scalars: &[Scalar]) -> Result<Attrs> {
    Attrs::default().with_params(ints, scalars).map_err(|e| refuse(op, e.to_string()))
}

/// A size as a parameter.
fn int(v: usize) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

/// `conv2d`'s padding (PyTorch's `padding=` argument).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Padding {
    /// The same padding on both sides of each dimension: `(h, w)` (an int `p` is `(p, p)`).
    Explicit(usize, usize),
    /// No padding (`"valid"`).
    Valid,
    /// As much as keeps the output the input's size (`"same"`, stride 1 only): `dilation ·
    /// (k - 1)` in all along each dimension, half of it (rounded down) before and the rest
    /// after, as PyTorch pads.
    Same,
}

/// `conv2d`'s options besides its operands, PyTorch's defaults by [`Default`]: stride 1, no
/// padding, dilation 1, one group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Conv2dOptions {
    /// The step between windows, `(h, w)`.
    pub stride: (usize, usize),
    /// The padding.
    pub padding: Padding,
    /// The step between a window's taps, `(h, w)`.
    pub dilation: (usize, usize),
    /// The number of groups the channels split into.
    pub groups: usize,
}

impl Default for Conv2dOptions {
    fn default() -> Self {
        Conv2dOptions { stride: (1, 1), padding: Padding::Explicit(0, 0), dilation: (1, 1), groups: 1 }
    }
}

/// `max_pool2d`'s and `avg_pool2d`'s options besides the kernel size, PyTorch's defaults by
/// [`Default`]: stride the kernel size, no padding, dilation 1, rounding down, padding
/// counted in averages, no divisor override.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PoolOptions {
    /// The step between windows, `(h, w)`; `None` for the kernel size.
    pub stride: Option<(usize, usize)>,
    /// The padding on each side, `(h, w)`: at most half the kernel size.
    pub padding: (usize, usize),
    /// The step between a window's taps (`max_pool2d` only); `None` for 1.
    pub dilation: Option<(usize, usize)>,
    /// Round the output size up rather than down.
    pub ceil_mode: bool,
    /// `avg_pool2d`: leave the padding out of each window's count (PyTorch's
    /// `count_include_pad=False`).
    pub exclude_pad: bool,
    /// `avg_pool2d`: divide every window's sum by this rather than by a count.
    pub divisor_override: Option<usize>,
}

impl Array {
    /// `self` as a batch: a `[C, H, W]` array viewed as `[1, C, H, W]` (`true` when it was),
    /// a `[N, C, H, W]` one as it is; other ranks refused.
    fn batch4(&self, op: &str) -> Result<(Array, bool)> {
        match self.ndim() {
            3 => Ok((self.unsqueeze(0)?, true)),
            4 => Ok((self.clone(), false)),
            n => Err(refuse(
                op,
                format!("takes a 3-D [C, H, W] or 4-D [N, C, H, W] input, got {n}-D {:?}", self.shape()),
            )),
        }
    }

    /// PyTorch's `conv2d`: the cross-correlation of `self: [N, C, H, W]` (or `[C, H, W]`)
    /// with `weight: [O, C / groups, kh, kw]`, plus `bias: [O]`; `[N, O, OH, OW]` (or
    /// `[O, OH, OW]`). Floating dtypes; input, weight and bias of one dtype.
    pub fn conv2d(&self, weight: &Array, bias: Option<&Array>, options: Conv2dOptions) -> Result<Array> {
        let (x, unbatched) = self.batch4("conv2d")?;
        if weight.ndim() != 4 {
            return Err(refuse(
                "conv2d",
                format!("takes a 4-D weight [O, C / groups, kh, kw], got {:?}", weight.shape()),
            ));
        }
        let (kh, kw) = (weight.shape()[2], weight.shape()[3]);
        let Conv2dOptions { stride, dilation, groups, .. } = options;
        let pad = match options.padding {
            Padding::Explicit(h, w) => (h, h, w, w),
            Padding::Valid => (0, 0, 0, 0),
            Padding::Same => {
                if stride != (1, 1) {
                    return Err(refuse(
                        "conv2d",
                        "padding='same' is not supported for strided convolutions".into(),
                    ));
                }
                let total = |d: usize, k: usize| d.saturating_mul(k.saturating_sub(1));
                let (th, tw) = (total(dilation.0, kh), total(dilation.1, kw));
                (th / 2, th - th / 2, tw / 2, tw - tw / 2)
            }
        };
        let ints = [
            int(stride.0),
            int(stride.1),
            int(pad.0),
            int(pad.1),
            int(pad.2),
            int(pad.3),
            int(dilation.0),
            int(dilation.1),
            int(groups),
        ];
        let attrs = params("conv2d", &ints, &[])?;
        let y = match bias {
            Some(b) => x.call(self.cx.ops().conv2d, &[&x, weight, b], attrs)?,
            None => x.call(self.cx.ops().conv2d, &[&x, weight], attrs)?,
        };
        if unbatched {
            y.squeeze_dims(&[0])
        } else {
            Ok(y)
        }
    }

    /// The parameters of a max pool.
    fn max_pool_params(&self, kernel_size: (usize, usize), o: PoolOptions) -> Result<Attrs> {
        let s = o.stride.unwrap_or(kernel_size);
        let d = o.dilation.unwrap_or((1, 1));
        let ints = [
            int(kernel_size.0),
            int(kernel_size.1),
            int(s.0),
            int(s.1),
            int(o.padding.0),
            int(o.padding.1),
            int(d.0),
            int(d.1),
            i64::from(o.ceil_mode),
        ];
        params("max_pool2d", &ints, &[])
    }

    /// PyTorch's `max_pool2d` of `self: [N, C, H, W]` (or `[C, H, W]`): the largest element
    /// of each `kernel_size` window (NaN where one is), the padding taking no part. Numeric
    /// dtypes.
    pub fn max_pool2d(&self, kernel_size: (usize, usize), options: PoolOptions) -> Result<Array> {
        let (x, unbatched) = self.batch4("max_pool2d")?;
        let y = x.call(self.cx.ops().max_pool2d, &[&x], self.max_pool_params(kernel_size, options)?)?;
        if unbatched {
            y.squeeze_dims(&[0])
        } else {
            Ok(y)
        }
    }

    /// [`max_pool2d`](Self::max_pool2d) and the index of each maximum in its plane, `h · W +
    /// w` (`i64`; PyTorch's `return_indices=True`).
    pub fn max_pool2d_with_indices(
        &self,
        kernel_size: (usize, usize),
        options: PoolOptions,
    ) -> Result<(Array, Array)> {
        let (x, unbatched) = self.batch4("max_pool2d")?;
        let attrs = self.max_pool_params(kernel_size, options)?;
        let stream = self.compute()?;
        let mut outs = self.cx.call_multi(self.cx.ops().max_pool2d_with_indices, &[&x], attrs, stream)?;
        let (i, v) = (outs.pop(), outs.pop());
        let (Some(mut v), Some(mut i)) = (v, i) else {
            return Err(refuse("max_pool2d", "the op gave fewer than two outputs".into()));
        };
        if unbatched {
            v = v.squeeze_dims(&[0])?;
            i = i.squeeze_dims(&[0])?;
        }
        Ok((v, i))
    }

    /// PyTorch's `avg_pool2d` of `self: [N, C, H, W]` (or `[C, H, W]`): the mean of each
    /// `kernel_size` window (dilation is refused, as PyTorch has none here). Floating dtypes.
    pub fn avg_pool2d(&self, kernel_size: (usize, usize), options: PoolOptions) -> Result<Array> {
        let (x, unbatched) = self.batch4("avg_pool2d")?;
        if options.dilation.is_some_and(|d| d != (1, 1)) {
            return Err(refuse("avg_pool2d", "takes no dilation".into()));
        }
        let s = options.stride.unwrap_or(kernel_size);
        let ints = [
            int(kernel_size.0),
            int(kernel_size.1),
            int(s.0),
            int(s.1),
            int(options.padding.0),
            int(options.padding.1),
            i64::from(options.ceil_mode),
            i64::from(!options.exclude_pad),
            options.divisor_override.map_or(0, int),
        ];
        if options.divisor_override == Some(0) {
            return Err(refuse("avg_pool2d", "divisor_override must be positive".into()));
        }
        let y = x.call(self.cx.ops().avg_pool2d, &[&x], params("avg_pool2d", &ints, &[])?)?;
        if unbatched {
            y.squeeze_dims(&[0])
        } else {
            Ok(y)
        }
    }

    /// PyTorch's `adaptive_avg_pool2d` of `self: [N, C, H, W]` (or `[C, H, W]`) to
    /// `output_size` `(OH, OW)`: output row `i` averages input rows `floor(i·H/OH)` to
    /// `ceil((i+1)·H/OH)` (and so for columns). Floating dtypes.
    pub fn adaptive_avg_pool2d(&self, output_size: (usize, usize)) -> Result<Array> {
        let (x, unbatched) = self.batch4("adaptive_avg_pool2d")?;
        let attrs = params("adaptive_avg_pool2d", &[int(output_size.0), int(output_size.1)], &[])?;
        let y = x.call(self.cx.ops().adaptive_avg_pool2d, &[&x], attrs)?;
        if unbatched {
            y.squeeze_dims(&[0])
        } else {
            Ok(y)
        }
    }

    /// PyTorch's `scaled_dot_product_attention` with `self` the queries `[*, L, E]`, keys
    /// `k: [*, S, E]` and values `v: [*, S, Ev]` (batch dimensions broadcast): `softmax(q
    /// kᵀ · scale + mask) v`, `[*, L, Ev]`. `mask` is `bool` (true takes part) or of the
    /// inputs' dtype (added), broadcast to `[*, L, S]`; `is_causal` masks `j > i` (not with a
    /// mask); `scale` defaults to `1 / sqrt(E)`. `dropout_p` other than 0 is refused: there
    /// is no random generator yet. One op; floating dtypes of one dtype.
    pub fn scaled_dot_product_attention(
        &self,
        k: &Array,
        v: &Array,
        mask: Option<&Array>,
        dropout_p: f64,
        is_causal: bool,
        scale: Option<f64>,
    ) -> Result<Array> {
        const OP: &str = "scaled_dot_product_attention";
        if dropout_p != 0.0 {
            return Err(refuse(OP, format!("dropout_p={dropout_p} needs a random generator, which eagervm does not have yet: pass 0.0")));
        }
        if self.ndim() == 0 {
            return Err(refuse(OP, "the query needs at least 2 dimensions".into()));
        }
        let e = self.shape()[self.ndim() - 1];
        let scale = scale.unwrap_or(1.0 / (e as f64).sqrt());
        let attrs = params(OP, &[i64::from(is_causal)], &[Scalar::Float(scale)])?;
        match mask {
            Some(m) => self.call(self.cx.ops().attention, &[self, k, v, m], attrs),
            None => self.call(self.cx.ops().attention, &[self, k, v], attrs),
        }
    }
}
