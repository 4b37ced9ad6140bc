//! Reductions along dimensions, scans, normalisations and losses of [`Array`]s, with
//! PyTorch's names and semantics (`docs/ops.md`, "Reductions along dimensions").
//!
//! Where PyTorch takes `dim=None` or a tuple, the Rust methods take `Option<&[isize]>` or
//! `&[isize]` (an empty list reduces every dimension, as `None` does); `keepdim` is a
//! plain argument. The whole-tensor forms without arguments keep their short names
//! (`x.mean()`, `x.max()`, `x.argmax(None, false)`); the forms with a dimension that return
//! two arrays are `max_dim` and `min_dim`. A dimension out of range or given twice is
//! refused with [`Error::InvalidOperands`] before any op is built.
//!
//! `cross_entropy` and `mse_loss` are compositions of kernels (`log_softmax`, `nll_loss`,
//! the reductions and the elementwise ops), as PyTorch composes them; every other method
//! here is one op.

use smallvec::SmallVec;

use super::layout;
use super::promote::DEFAULT_FLOAT;
use super::Array;
use crate::framework::{Attrs, DType, Op, Scalar};
use crate::vm::{Error, Result};

/// How a loss reduces its per-element values (PyTorch's `reduction=`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Reduction {
    /// Every element's loss, in the target's shape (`'none'`).
    None,
    /// Their mean (`'mean'`, the default; weighted by the class weights where given).
    #[default]
    Mean,
    /// Their sum (`'sum'`).
    Sum,
}

impl Reduction {
    /// The reduction PyTorch names `name` (`"none"`, `"mean"`, `"sum"`).
    pub fn from_name(name: &str) -> Result<Reduction> {
        match name {
            "none" => Ok(Reduction::None),
            "mean" => Ok(Reduction::Mean),
            "sum" => Ok(Reduction::Sum),
            _ => Err(Error::InvalidOperands {
                op: "loss".into(),
                detail: format!("reduction is 'none', 'mean' or 'sum', not {name:?}"),
            }),
        }
    }

    fn code(self) -> i64 {
        match self {
            Reduction::None => 0,
            Reduction::Mean => 1,
            Reduction::Sum => 2,
        }
    }
}

/// `ignore_index`'s default in PyTorch's losses.
pub const DEFAULT_IGNORE_INDEX: i64 = -100;

fn params(op: &str, ints: &[i64], scalars: &[Scalar]) -> Result<Attrs> {
    Attrs::default()
        .with_params(ints, scalars)
        .map_err(|e| Error::InvalidOperands { op: op.into(), detail: e.to_string() })
}

fn bad(op: &str, detail: String) -> Error {
    Error::InvalidOperands { op: op.into(), detail }
}

impl Array {
    /// The parameter list `[dims..., keepdim]` of a reduction by `op` (`None` or no dims:
    /// every dimension), the dims checked: in range, each once.
    fn dims_params(
        &self,
        op: &str,
        dims: Option<&[isize]>,
        keepdim: bool,
        scalars: &[Scalar],
    ) -> Result<Attrs> {
        let mut ints: SmallVec<[i64; 8]> = SmallVec::new();
        for &d in dims.unwrap_or(&[]) {
            let w = layout::dim(op, d, self.ndim())? as i64;
            if ints.contains(&w) {
                return Err(bad(op, format!("dimension {w} appears more than once in the dims {dims:?}")));
            }
            ints.push(w);
        }
        ints.push(i64::from(keepdim));
        params(op, &ints, scalars)
    }

    fn reduce(
        &self,
        op: Op,
        name: &str,
        dims: Option<&[isize]>,
        keepdim: bool,
        scalars: &[Scalar],
    ) -> Result<Array> {
        let attrs = self.dims_params(name, dims, keepdim, scalars)?;
        self.call(op, &[self], attrs)
    }

    /// The sums along `dims` (every dimension for an empty list), PyTorch's
    /// `x.sum(dim, keepdim)`: `i64` for `bool` and integer arrays, the array's dtype for
    /// floats (accumulated in `f32` for `f16` and `bf16`, in a fixed order).
    pub fn sum_dim(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().sum, "sum", Some(dims), keepdim, &[])
    }

    /// The mean of every element (floating arrays; NaN for none).
    pub fn mean(&self) -> Result<Array> {
        self.mean_dim(&[], false)
    }

    /// The means along `dims` (every dimension for an empty list). Integer arrays are
    /// refused, as PyTorch refuses them: convert first (`to_dtype`).
    pub fn mean_dim(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().mean, "mean", Some(dims), keepdim, &[])
    }

    /// The product of every element (`i64` for `bool` and integer arrays).
    pub fn prod(&self) -> Result<Array> {
        self.reduce(self.cx.ops().prod, "prod", None, false, &[])
    }

    /// The products along `dim`.
    pub fn prod_dim(&self, dim: isize, keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().prod, "prod", Some(&[dim]), keepdim, &[])
    }

    /// The largest elements along `dims` (every dimension for an empty list); NaN where
    /// any is NaN. An empty reduced dimension is refused.
    pub fn amax(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().amax, "amax", Some(dims), keepdim, &[])
    }

    /// The smallest elements along `dims` (as [`amax`](Self::amax)).
    pub fn amin(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().amin, "amin", Some(dims), keepdim, &[])
    }

    /// The largest element, a 0-d array (PyTorch's `x.max()`).
    pub fn max(&self) -> Result<Array> {
        self.amax(&[], false)
    }

    /// The smallest element, a 0-d array (PyTorch's `x.min()`).
    pub fn min(&self) -> Result<Array> {
        self.amin(&[], false)
    }

    fn extreme_dim(&self, op: Op, name: &str, dim: isize, keepdim: bool) -> Result<(Array, Array)> {
        let attrs = self.dims_params(name, Some(&[dim]), keepdim, &[])?;
        let stream = self.compute()?;
        let mut outs = self.cx.call_multi(op, &[self], attrs, stream)?;
        let indices = outs.pop().ok_or_else(|| bad(name, "expected two outputs".into()))?;
        let values = outs.pop().ok_or_else(|| bad(name, "expected two outputs".into()))?;
        Ok((values, indices))
    }

    /// PyTorch's `x.max(dim, keepdim)`: the largest values along `dim` and the `i64` index
    /// of the first of each (of the first NaN, where there is one).
    pub fn max_dim(&self, dim: isize, keepdim: bool) -> Result<(Array, Array)> {
        self.extreme_dim(self.cx.ops().max, "max", dim, keepdim)
    }

    /// PyTorch's `x.min(dim, keepdim)`: the smallest values along `dim` and their first
    /// indices.
    pub fn min_dim(&self, dim: isize, keepdim: bool) -> Result<(Array, Array)> {
        self.extreme_dim(self.cx.ops().min, "min", dim, keepdim)
    }

    /// The `i64` index of the first largest element along `dim`, or in the flattened array
    /// for `None` (a 0-d result; with `keepdim`, every dimension of size 1).
    pub fn argmax(&self, dim: Option<isize>, keepdim: bool) -> Result<Array> {
        let d = dim.map(|d| [d]);
        self.reduce(self.cx.ops().argmax, "argmax", d.as_ref().map(|d| &d[..]), keepdim, &[])
    }

    /// The index of the first smallest element (as [`argmax`](Self::argmax)).
    pub fn argmin(&self, dim: Option<isize>, keepdim: bool) -> Result<Array> {
        let d = dim.map(|d| [d]);
        self.reduce(self.cx.ops().argmin, "argmin", d.as_ref().map(|d| &d[..]), keepdim, &[])
    }

    /// Whether every element is nonzero, a 0-d `bool` array (`u8` for a `u8` array).
    pub fn all(&self) -> Result<Array> {
        self.all_dim(&[], false)
    }

    /// Whether every element along `dims` is nonzero.
    pub fn all_dim(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().all, "all", Some(dims), keepdim, &[])
    }

    /// Whether some element is nonzero, a 0-d `bool` array (`u8` for a `u8` array).
    pub fn any(&self) -> Result<Array> {
        self.any_dim(&[], false)
    }

    /// Whether some element along `dims` is nonzero.
    pub fn any_dim(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().any, "any", Some(dims), keepdim, &[])
    }

    /// The variance along `dims` (`None`: every dimension) with `correction` (PyTorch's
    /// default is 1, Bessel's): the sum of squared deviations over `max(0, n -
    /// correction)`. Floating arrays.
    pub fn var(&self, dims: Option<&[isize]>, correction: f64, keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().var, "var", dims, keepdim, &[Scalar::Float(correction)])
    }

    /// The standard deviation: the square root of [`var`](Self::var).
    pub fn std(&self, dims: Option<&[isize]>, correction: f64, keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().std, "std", dims, keepdim, &[Scalar::Float(correction)])
    }

    /// `log(sum(exp(x)))` along `dims`, computed stably (the maximum taken out first).
    /// `bool` and integer arrays are converted to the default float dtype first, as PyTorch
    /// does.
    pub fn logsumexp(&self, dims: &[isize], keepdim: bool) -> Result<Array> {
        let x = if self.dtype().is_floating() { self.clone() } else { self.to_dtype(DEFAULT_FLOAT)? };
        x.reduce(self.cx.ops().logsumexp, "logsumexp", Some(dims), keepdim, &[])
    }

    /// The vector `p`-norm along `dims` (`None`: of the flattened array), PyTorch's
    /// `torch.linalg.vector_norm(x, ord=p, dim, keepdim)`: `p` = 2, 1, `f64::INFINITY`,
    /// `f64::NEG_INFINITY`, 0 (the count of nonzero elements) or any other real. Floating
    /// arrays.
    pub fn norm(&self, p: f64, dims: Option<&[isize]>, keepdim: bool) -> Result<Array> {
        self.reduce(self.cx.ops().norm, "norm", dims, keepdim, &[Scalar::Float(p)])
    }

    fn along_dim(&self, op: Op, name: &str, dim: isize) -> Result<Array> {
        let d = layout::dim(name, dim, self.ndim())? as i64;
        self.call(op, &[self], params(name, &[d], &[])?)
    }

    /// The running sums along `dim` (`i64` for `bool` and integer arrays).
    pub fn cumsum(&self, dim: isize) -> Result<Array> {
        self.along_dim(self.cx.ops().cumsum, "cumsum", dim)
    }

    /// The running products along `dim` (`i64` for `bool` and integer arrays).
    pub fn cumprod(&self, dim: isize) -> Result<Array> {
        self.along_dim(self.cx.ops().cumprod, "cumprod", dim)
    }

    /// `exp(x) / sum(exp(x))` along `dim`, stably (floating arrays; convert others first,
    /// PyTorch's `dtype=`).
    pub fn softmax(&self, dim: isize) -> Result<Array> {
        self.along_dim(self.cx.ops().softmax, "softmax", dim)
    }

    /// `log(softmax(x))` along `dim`, computed as `x - max - log(sum(exp(x - max)))`.
    pub fn log_softmax(&self, dim: isize) -> Result<Array> {
        self.along_dim(self.cx.ops().log_softmax, "log_softmax", dim)
    }

    /// PyTorch's `layer_norm(x, normalized_shape, weight, bias, eps)`: each group of the
    /// last `normalized_shape.len()` dimensions (which must be `normalized_shape`) scaled
    /// to mean 0 and variance 1 (biased variance; `eps` added to it), then multiplied by
    /// `weight` and offset by `bias` where given (arrays of `normalized_shape`). Floating
    /// arrays; `weight` and `bias` are converted to the array's dtype.
    pub fn layer_norm(
        &self,
        normalized_shape: &[usize],
        weight: Option<&Array>,
        bias: Option<&Array>,
        eps: f64,
    ) -> Result<Array> {
        let k = normalized_shape.len();
        if k == 0 || k > self.ndim() || self.shape()[self.ndim() - k..] != *normalized_shape {
            return Err(bad(
                "layer_norm",
                format!(
                    "normalized_shape {normalized_shape:?} is not the last dimensions of the input's shape {:?}",
                    self.shape()
                ),
            ));
        }
        let dt = self.dtype();
        let w = weight.map(|w| w.to_dtype(dt)).transpose()?;
        let b = bias.map(|b| b.to_dtype(dt)).transpose()?;
        let mut inputs: SmallVec<[&Array; 3]> = SmallVec::new();
        inputs.push(self);
        inputs.extend(w.as_ref());
        inputs.extend(b.as_ref());
        let attrs = params(
            "layer_norm",
            &[k as i64, i64::from(w.is_some()), i64::from(b.is_some())],
            &[Scalar::Float(eps)],
        )?;
        self.call(self.cx.ops().layer_norm, &inputs, attrs)
    }

    /// PyTorch's `nll_loss(input, target, weight, ignore_index, reduction)`: `self` holds
    /// log-probabilities `[N, C]`, `[N, C, d1, ...]` or `[C]`; `target` the `i64` class
    /// indices `[N]`, `[N, d1, ...]` or `[]`; `weight`, where given, `[C]` class weights.
    /// Each target's loss is `-weight[t] * self[.., t, ..]`; targets equal to
    /// `ignore_index` count for nothing; `Mean` divides the sum by the weights of the
    /// targets counted.
    pub fn nll_loss(
        &self,
        target: &Array,
        weight: Option<&Array>,
        ignore_index: i64,
        reduction: Reduction,
    ) -> Result<Array> {
        if self.ndim() == 1 {
            let out = self.unsqueeze(0)?.nll_loss(&target.unsqueeze(0)?, weight, ignore_index, reduction)?;
            return if reduction == Reduction::None { out.squeeze_dims(&[0]) } else { Ok(out) };
        }
        let t = if target.dtype() == DType::I64 { target.clone() } else { target.to_dtype(DType::I64)? };
        let w = weight.map(|w| w.to_dtype(self.dtype())).transpose()?;
        let mut inputs: SmallVec<[&Array; 3]> = SmallVec::new();
        inputs.push(self);
        inputs.push(&t);
        inputs.extend(w.as_ref());
        let attrs = params("nll_loss", &[reduction.code(), ignore_index, i64::from(w.is_some())], &[])?;
        self.call(self.cx.ops().nll_loss, &inputs, attrs)
    }

    /// PyTorch's `cross_entropy(input, target, weight, ignore_index, reduction,
    /// label_smoothing)`: `log_softmax` over the class dimension (1, or 0 for a `[C]`
    /// input), then, for class-index targets (an integer array), `nll_loss`; for
    /// class-probability targets (a floating array of the input's shape), `-sum(weight[c] *
    /// target[c] * logp[c])` over the classes, whose `Mean` divides by the number of
    /// elements but the class dimension. `label_smoothing` in `[0, 1]` mixes the targets
    /// with the uniform distribution as PyTorch does. A composition of kernels.
    pub fn cross_entropy(
        &self,
        target: &Array,
        weight: Option<&Array>,
        ignore_index: i64,
        reduction: Reduction,
        label_smoothing: f64,
    ) -> Result<Array> {
        let op = "cross_entropy";
        if !(0.0..=1.0).contains(&label_smoothing) {
            return Err(bad(
                op,
                format!("label_smoothing must be between 0.0 and 1.0, not {label_smoothing}"),
            ));
        }
        if self.ndim() == 0 {
            return Err(bad(op, "the input is 0-d: expected [C], [N, C] or [N, C, d1, ...]".into()));
        }
        let x = if self.dtype().is_floating() { self.clone() } else { self.to_dtype(DEFAULT_FLOAT)? };
        let cdim: isize = if x.ndim() == 1 { 0 } else { 1 };
        let classes = x.shape()[cdim as usize];
        let logp = x.log_softmax(cdim)?;
        let w = weight.map(|w| w.to_dtype(x.dtype())).transpose()?;
        // The weight broadcast along the class dimension of the input.
        let w_b = match &w {
            Some(w) => {
                let mut shape: SmallVec<[isize; 6]> = SmallVec::from_elem(1, x.ndim());
                shape[cdim as usize] = classes as isize;
                Some(w.view(&shape)?)
            }
            None => None,
        };
        if target.dtype().is_floating() {
            if target.shape() != x.shape() {
                return Err(bad(
                    op,
                    format!(
                        "class-probability targets have the input's shape {:?}, not {:?}",
                        x.shape(),
                        target.shape()
                    ),
                ));
            }
            let mut t = target.to_dtype(x.dtype())?;
            if label_smoothing > 0.0 {
                t = t.mul(1.0 - label_smoothing)?.add(label_smoothing / classes as f64)?;
            }
            let mut prod = logp.mul(&t)?;
            if let Some(w) = &w_b {
                prod = prod.mul(w)?;
            }
            let per = prod.sum_dim(&[cdim], false)?.neg()?;
            return match reduction {
                Reduction::None => Ok(per),
                Reduction::Sum => per.sum(),
                Reduction::Mean => per.sum()?.div((x.numel() / classes.max(1)) as f64),
            };
        }
        let nll = logp.nll_loss(target, w.as_ref(), ignore_index, reduction)?;
        if label_smoothing == 0.0 {
            return Ok(nll);
        }
        // PyTorch's smoothing term: -sum over classes of (weight *) logp, 0 where ignored.
        let mut prod = logp.clone();
        if let Some(w) = &w_b {
            prod = prod.mul(w)?;
        }
        let t = if target.dtype() == DType::I64 { target.clone() } else { target.to_dtype(DType::I64)? };
        let ignored = t.eq(ignore_index)?;
        let smooth = prod.sum_dim(&[cdim], false)?.neg()?.masked_fill(&ignored, 0.0)?;
        let smooth = match reduction {
            Reduction::None => smooth,
            Reduction::Sum => smooth.sum()?,
            Reduction::Mean => {
                // Over the weights of the targets counted, as `nll_loss`'s mean: the weighted
                // count is `nll_loss` of log-probabilities of -1 summed.
                let ones = self.cx.full(logp.shape(), -1.0, logp.dtype(), logp.device())?;
                let count = ones.nll_loss(&t, w.as_ref(), ignore_index, Reduction::Sum)?;
                smooth.sum()?.div(&count)?
            }
        };
        nll.mul(1.0 - label_smoothing)?.add(&smooth.mul(label_smoothing / classes as f64)?)
    }

    /// PyTorch's `mse_loss(input, target, reduction)`: `(input - target)²`, broadcast, then
    /// its mean, its sum, or itself. A composition of `sub`, `mul` and the reductions.
    pub fn mse_loss(&self, target: &Array, reduction: Reduction) -> Result<Array> {
        let d = self.sub(target)?;
        let sq = d.mul(&d)?;
        match reduction {
            Reduction::None => Ok(sq),
            Reduction::Sum => sq.sum(),
            Reduction::Mean => sq.mean(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::eager::Context;
    use crate::ep::mock::MockConfig;
    use crate::ep::DeviceId;
    use crate::framework::VirtualMachine;
    use crate::Config;

    fn setup() -> (VirtualMachine, Context) {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap();
        let cx = Context::new(&vm);
        (vm, cx)
    }

    const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

    fn host(a: &Array) -> Array {
        a.to(DeviceId::CPU).unwrap()
    }

    #[test]
    fn reductions_along_dims_on_cpu_and_mock() {
        let (_vm, cx) = setup();
        for dev in DEVICES {
            let x = cx.from_slice(&[1.0f32, 5.0, 2.0, 7.0, 0.0, -1.0], &[2, 3], dev).unwrap();
            assert_eq!(host(&x.sum_dim(&[1], false).unwrap()).to_vec::<f32>().unwrap(), vec![8.0, 6.0]);
            let k = x.sum_dim(&[-2], true).unwrap();
            assert_eq!(k.shape(), &[1, 3]);
            assert_eq!(host(&k).to_vec::<f32>().unwrap(), vec![8.0, 5.0, 1.0]);
            assert_eq!(host(&x.mean().unwrap()).item::<f32>().unwrap(), 14.0 / 6.0);
            let (v, i) = x.max_dim(0, false).unwrap();
            assert_eq!(host(&v).to_vec::<f32>().unwrap(), vec![7.0, 5.0, 2.0]);
            assert_eq!(host(&i).to_vec::<i64>().unwrap(), vec![1, 0, 0]);
            let (v, i) = x.min_dim(-1, true).unwrap();
            assert_eq!((v.shape(), host(&i).to_vec::<i64>().unwrap()), (&[2usize, 1][..], vec![0, 2]));
            assert_eq!(host(&x.argmax(None, false).unwrap()).item::<i64>().unwrap(), 3);
            assert_eq!(host(&x.max().unwrap()).item::<f32>().unwrap(), 7.0);
            assert_eq!(
                host(&x.t().unwrap().amin(&[1], false).unwrap()).to_vec::<f32>().unwrap(),
                vec![1.0, 0.0, -1.0]
            );
            assert_eq!(
                host(&x.gt(0.5).unwrap().all_dim(&[0], false).unwrap()).to_vec::<bool>().unwrap(),
                vec![true, false, false]
            );
            assert!(host(&x.any().unwrap()).item::<bool>().unwrap());
            assert_eq!(host(&x.prod_dim(1, false).unwrap()).to_vec::<f32>().unwrap(), vec![10.0, -0.0]);
            assert_eq!(
                host(&x.cumsum(1).unwrap()).to_vec::<f32>().unwrap(),
                vec![1.0, 6.0, 8.0, 7.0, 7.0, 6.0]
            );
            let var = host(&x.var(Some(&[1]), 1.0, false).unwrap()).to_vec::<f32>().unwrap();
            assert!((var[0] - 4.333_333).abs() < 1e-5 && (var[1] - 19.0).abs() < 1e-5);
            let n = host(&x.norm(1.0, None, false).unwrap()).item::<f32>().unwrap();
            assert_eq!(n, 16.0);
        }
    }

    #[test]
    fn integer_inputs_and_refusals() {
        let (_vm, cx) = setup();
        let i = cx.from_slice(&[1i32, 2, 3, 4], &[2, 2], DeviceId::CPU).unwrap();
        let s = i.sum_dim(&[0], false).unwrap();
        assert_eq!((s.dtype(), s.to_vec::<i64>().unwrap()), (DType::I64, vec![4, 6]));
        assert!(matches!(i.mean(), Err(Error::InvalidOperands { .. })));
        assert!(
            (i.logsumexp(&[1], false).unwrap().to_vec::<f32>().unwrap()[0] - (1f32.exp() + 2f32.exp()).ln())
                .abs()
                < 1e-6
        );
        for bad in [i.sum_dim(&[0, -2], false), i.sum_dim(&[2], false), i.amax(&[1, 1], true)] {
            assert!(matches!(bad, Err(Error::InvalidOperands { .. })), "{bad:?}");
        }
        let e = cx.zeros(&[0, 2], DType::F32, DeviceId::CPU).unwrap();
        assert!(matches!(e.max_dim(0, false), Err(Error::InvalidOperands { .. })));
        assert_eq!(e.sum_dim(&[0], false).unwrap().to_vec::<f32>().unwrap(), vec![0.0, 0.0]);
    }

    #[test]
    fn softmax_layer_norm_and_losses() {
        let (_vm, cx) = setup();
        for dev in DEVICES {
            let x = cx.from_slice(&[1.0f64, 2.0, 3.0, 1.0, 1.0, 1.0], &[2, 3], dev).unwrap();
            let s = host(&x.softmax(1).unwrap()).to_vec::<f64>().unwrap();
            let z = 1f64.exp() + 2f64.exp() + 3f64.exp();
            assert!((s[2] - 3f64.exp() / z).abs() < 1e-15 && (s[4] - 1.0 / 3.0).abs() < 1e-15);
            let l = host(&x.log_softmax(-1).unwrap()).to_vec::<f64>().unwrap();
            assert!((l[0] - (1.0 - z.ln())).abs() < 1e-15);
            let ln = host(&x.layer_norm(&[3], None, None, 0.0).unwrap()).to_vec::<f64>().unwrap();
            let r = (2.0f64 / 3.0).sqrt();
            assert!((ln[0] + 1.0 / r).abs() < 1e-12 && ln[4].is_nan());
            assert!(matches!(x.layer_norm(&[2], None, None, 1e-5), Err(Error::InvalidOperands { .. })));
            let t = cx.from_slice(&[2i64, 0], &[2], dev).unwrap();
            let ce = host(&x.cross_entropy(&t, None, DEFAULT_IGNORE_INDEX, Reduction::Mean, 0.0).unwrap());
            let want = ((z.ln() - 3.0) + 3f64.ln()) / 2.0;
            assert!((ce.item::<f64>().unwrap() - want).abs() < 1e-12);
            let none =
                host(&x.cross_entropy(&t, None, 0, Reduction::None, 0.0).unwrap()).to_vec::<f64>().unwrap();
            assert!((none[0] - (z.ln() - 3.0)).abs() < 1e-12 && none[1] == 0.0);
            let y = cx.zeros(&[2, 3], DType::F64, dev).unwrap();
            assert_eq!(host(&x.mse_loss(&y, Reduction::Sum).unwrap()).item::<f64>().unwrap(), 17.0);
            assert_eq!(host(&x.mse_loss(&y, Reduction::None).unwrap()).shape(), &[2, 3]);
        }
        assert!(Reduction::from_name("avg").is_err());
    }
}
