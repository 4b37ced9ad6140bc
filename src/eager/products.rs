//! Matrix products with PyTorch's semantics: [`Array::matmul`] of any ranks (vectors,
//! matrices, batches that broadcast), `mm`, `bmm`, `addmm`, `baddbmm`, `dot`, `outer` and
//! `linear`.
//!
//! A product of two matrices is the `matmul` op, and so is a batch times one matrix where the
//! batch's rows view as one matrix (as PyTorch folds it); every other case is the `bmm` op
//! over views (a vector becomes a one-row or one-column matrix, a batch dimension that
//! broadcasts is read with stride 0, nothing is copied), its result viewed back to
//! PyTorch's shape.
//! `addmm`, `baddbmm` and `linear` add to the product with the elementwise ops, `outer` is
//! a broadcast `mul`, as PyTorch composes them (`docs/ops.md`, "Products").

use super::math::{Bin, Rhs};
use super::Array;
use crate::framework::{Attrs, Scalar};
use crate::vm::{Error, Result};

/// A refusal of `op` before any call.
fn refuse(op: &str, detail: String) -> Error {
    Error::InvalidOperands { op: op.into(), detail }
}

impl Array {
    /// `self` and `other` in the dtype their product computes in (PyTorch's result type).
    fn promoted(&self, other: &Array) -> Result<(Array, Array)> {
        if self.dtype() == other.dtype() {
            return Ok((self.clone(), other.clone()));
        }
        let dt = self.compute_dtype(Bin::Mul, Rhs::Array(other));
        Ok((self.to_dtype(dt)?, other.to_dtype(dt)?))
    }

    /// The `bmm` op of two operands of at least two dimensions each, batch dimensions
    /// broadcast.
    fn batched(&self, other: &Array) -> Result<Array> {
        let (x, y) = self.promoted(other)?;
        x.call(self.cx.ops().bmm, &[&x, &y], Attrs::default())
    }

    /// PyTorch's `matmul` of any ranks (`self @ other`): two vectors give their dot product
    /// (a 0-d array); a matrix and a vector a vector (`[m, k] @ [k] -> [m]`, `[k] @ [k, n]
    /// -> [n]`); two matrices a matrix (`[m, k] @ [k, n] -> [m, n]`); operands of more
    /// dimensions are batches of matrices whose batch dimensions broadcast (`[b, 1, m, k] @
    /// [h, k, n] -> [b, h, m, n]`), a vector operand taking part as a one-row (left) or
    /// one-column (right) matrix whose extra dimension the result drops. Each operand in
    /// any layout; dtypes promoted. A 0-d operand is refused.
    pub fn matmul(&self, other: &Array) -> Result<Array> {
        let (ra, rb) = (self.ndim(), other.ndim());
        if ra == 0 || rb == 0 {
            return Err(refuse(
                "matmul",
                format!("both arguments need at least 1 dimension, got {ra}-d and {rb}-d tensors"),
            ));
        }
        if ra == 2 && rb == 2 {
            return self.matmul_t(other, false, false);
        }
        let a = if ra == 1 { self.unsqueeze(0)? } else { self.clone() };
        let b = if rb == 1 { other.unsqueeze(-1)? } else { other.clone() };
        if a.shape()[a.ndim() - 1] != b.shape()[b.ndim() - 2] {
            return Err(refuse(
                "matmul",
                format!(
                    "shapes {:?} and {:?} cannot be multiplied ({} != {})",
                    self.shape(),
                    other.shape(),
                    a.shape()[a.ndim() - 1],
                    b.shape()[b.ndim() - 2]
                ),
            ));
        }
        let mut r = if a.ndim() == 2 && b.ndim() == 2 {
            a.matmul_t(&b, false, false)?
        } else if b.ndim() == 2 {
            // A batch times one matrix is one product of all the batch's rows where they
            // can be viewed as one matrix (as PyTorch folds it), else a batched one.
            let k = a.shape()[a.ndim() - 1];
            match a.view(&[-1, k as isize]) {
                Ok(rows) => {
                    let mut shape: Vec<isize> = a.shape().iter().map(|&d| d as isize).collect();
                    *shape.last_mut().expect("dimensions") = b.shape()[1] as isize;
                    rows.matmul_t(&b, false, false)?.view(&shape)?
                }
                Err(_) => a.batched(&b)?,
            }
        } else {
            a.batched(&b)?
        };
        if rb == 1 {
            r = r.squeeze_dims(&[-1])?;
        }
        if ra == 1 {
            r = r.squeeze_dims(&[if rb == 1 { -1 } else { -2 }])?;
        }
        Ok(r)
    }

    /// The product of two matrices, `[m, k] @ [k, n] -> [m, n]` (PyTorch's `mm`: other ranks
    /// are refused).
    pub fn mm(&self, other: &Array) -> Result<Array> {
        if self.ndim() != 2 || other.ndim() != 2 {
            return Err(refuse(
                "mm",
                format!("takes two matrices, got shapes {:?} and {:?}", self.shape(), other.shape()),
            ));
        }
        self.matmul_t(other, false, false)
    }

    /// The batched product `[b, m, k] @ [b, k, n] -> [b, m, n]` (PyTorch's `bmm`: 3-D
    /// operands of one batch size; [`matmul`](Self::matmul) broadcasts).
    pub fn bmm(&self, other: &Array) -> Result<Array> {
        if self.ndim() != 3 || other.ndim() != 3 || self.shape()[0] != other.shape()[0] {
            return Err(refuse(
                "bmm",
                format!(
                    "takes two 3-D tensors of one batch size, got shapes {:?} and {:?}",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        self.batched(other)
    }

    /// `beta · self + alpha · (m1 @ m2)` for matrices `m1: [m, k]`, `m2: [k, n]`, `self`
    /// broadcast to `[m, n]` (PyTorch's `addmm`; with `beta` 0, `self` is not read, so its
    /// NaNs do not propagate). Integer operands take integer `beta` and `alpha`.
    pub fn addmm(
        &self,
        m1: &Array,
        m2: &Array,
        beta: impl Into<Scalar>,
        alpha: impl Into<Scalar>,
    ) -> Result<Array> {
        let p = m1.mm(m2)?;
        self.add_scaled("addmm", p, beta.into(), alpha.into())
    }

    /// `beta · self + alpha · (b1 @ b2)` for batches `b1: [b, m, k]`, `b2: [b, k, n]`, `self`
    /// broadcast to `[b, m, n]` (PyTorch's `baddbmm`; `beta` 0 as in [`addmm`](Self::addmm)).
    pub fn baddbmm(
        &self,
        b1: &Array,
        b2: &Array,
        beta: impl Into<Scalar>,
        alpha: impl Into<Scalar>,
    ) -> Result<Array> {
        let p = b1.bmm(b2)?;
        self.add_scaled("baddbmm", p, beta.into(), alpha.into())
    }

    /// `beta · self + alpha · p`, `self` broadcast to `p`'s shape.
    fn add_scaled(&self, op: &str, p: Array, beta: Scalar, alpha: Scalar) -> Result<Array> {
        let fits = self.ndim() <= p.ndim()
            && self.shape().iter().rev().zip(p.shape().iter().rev()).all(|(&a, &b)| a == b || a == 1);
        if !fits {
            return Err(refuse(
                op,
                format!(
                    "the input of shape {:?} does not broadcast to the product's {:?}",
                    self.shape(),
                    p.shape()
                ),
            ));
        }
        let dt = self.compute_dtype(Bin::Mul, Rhs::Array(&p));
        if !dt.is_floating() && (matches!(beta, Scalar::Float(_)) || matches!(alpha, Scalar::Float(_))) {
            return Err(refuse(op, format!("for {dt} operands, beta and alpha must be integers")));
        }
        let p = p.to_dtype(dt)?;
        let p = if is_one(alpha) { p } else { p.mul(alpha)? };
        if is_zero(beta) {
            return Ok(p);
        }
        let x = if is_one(beta) { self.to_dtype(dt)? } else { self.to_dtype(dt)?.mul(beta)? };
        x.add(&p)
    }

    /// The dot product of two vectors of one length, a 0-d array (PyTorch's `dot`).
    pub fn dot(&self, other: &Array) -> Result<Array> {
        if self.ndim() != 1 || other.ndim() != 1 || self.numel() != other.numel() {
            return Err(refuse(
                "dot",
                format!(
                    "takes two vectors of one length, got shapes {:?} and {:?}",
                    self.shape(),
                    other.shape()
                ),
            ));
        }
        self.matmul(other)
    }

    /// The outer product of two vectors, `[n] x [m] -> [n, m]`: `self[i] · other[j]`
    /// (PyTorch's `outer`, a broadcast `mul`).
    pub fn outer(&self, other: &Array) -> Result<Array> {
        if self.ndim() != 1 || other.ndim() != 1 {
            return Err(refuse(
                "outer",
                format!("takes two vectors, got shapes {:?} and {:?}", self.shape(), other.shape()),
            ));
        }
        self.unsqueeze(1)?.mul(&other.unsqueeze(0)?)
    }

    /// `self @ weightᵀ + bias` (PyTorch's `nn.functional.linear`): `self: [*, in]`,
    /// `weight: [out, in]` (or `[in]`, giving `[*]`), `bias: [out]` (broadcast). A
    /// contiguous `self` of more than two dimensions is one matrix product of its rows.
    pub fn linear(&self, weight: &Array, bias: Option<&Array>) -> Result<Array> {
        if self.ndim() == 0 || weight.ndim() == 0 || weight.ndim() > 2 {
            return Err(refuse(
                "linear",
                format!(
                    "takes an input of at least 1 dimension and a weight of 1 or 2, got shapes {:?} and {:?}",
                    self.shape(),
                    weight.shape()
                ),
            ));
        }
        let wt = weight.t()?;
        let y = if self.ndim() > 2 && weight.ndim() == 2 {
            match self.view(&[-1, self.shape()[self.ndim() - 1] as isize]) {
                Ok(rows) => {
                    let mut shape: Vec<isize> = self.shape().iter().map(|&d| d as isize).collect();
                    *shape.last_mut().expect("dimensions") = weight.shape()[0] as isize;
                    rows.matmul(&wt)?.view(&shape)?
                }
                Err(_) => self.matmul(&wt)?,
            }
        } else {
            self.matmul(&wt)?
        };
        match bias {
            Some(b) => y.add(b),
            None => Ok(y),
        }
    }
}

fn is_one(s: Scalar) -> bool {
    s.as_f64() == 1.0
}

fn is_zero(s: Scalar) -> bool {
    s.as_f64() == 0.0
}

#[cfg(test)]
mod tests {
    use crate::eager::{Context, Conv2dOptions, Padding, PoolOptions};
    use crate::prelude::*;

    /// Row-major `[.., m, k] @ [.., k, n]` of one batch, naive.
    fn naive(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut out = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                out[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        out
    }

    #[test]
    fn matmul_takes_pytorch_s_ranks() -> crate::Result<()> {
        let vm = VirtualMachine::new(Config::default())?;
        let cx = Context::new(&vm);
        let arr = |v: &[f32], s: &[usize]| cx.from_slice(v, s, DeviceId::CPU);
        let vals = |n: usize| (0..n).map(|i| (i % 5) as f32 - 2.0).collect::<Vec<_>>();
        let (u, w) = (arr(&vals(3), &[3])?, arr(&[1.0, 2.0, 3.0], &[3])?);
        let d = u.matmul(&w)?;
        assert_eq!((d.shape(), d.item::<f32>()?), (&[][..], -2.0 - 2.0 + 0.0));
        let m = arr(&vals(6), &[2, 3])?;
        assert_eq!(m.matmul(&w)?.shape(), &[2]);
        assert_eq!(m.matmul(&w)?.to_vec::<f32>()?, naive(&vals(6), &[1.0, 2.0, 3.0], 2, 3, 1));
        assert_eq!(w.matmul(&m.t()?)?.to_vec::<f32>()?, m.matmul(&w)?.to_vec::<f32>()?);
        // [2, 1, 2, 3] @ [4, 3, 5] -> [2, 4, 2, 5]; each matrix is a[i] @ b[j].
        let (av, bv) = (vals(12), vals(60));
        let y = arr(&av, &[2, 1, 2, 3])?.matmul(&arr(&bv, &[4, 3, 5])?)?;
        assert_eq!(y.shape(), &[2, 4, 2, 5]);
        let got = y.to_vec::<f32>()?;
        for i in 0..2 {
            for j in 0..4 {
                let want = naive(&av[i * 6..][..6], &bv[j * 15..][..15], 2, 3, 5);
                assert_eq!(&got[(i * 4 + j) * 10..][..10], &want[..]);
            }
        }
        // A vector on either side of a batch.
        assert_eq!(w.matmul(&arr(&bv, &[4, 3, 5])?)?.shape(), &[4, 5]);
        assert_eq!(arr(&bv, &[4, 5, 3])?.matmul(&w)?.shape(), &[4, 5]);
        assert!(cx.scalar(1.0, DType::F32, DeviceId::CPU)?.matmul(&w).is_err());
        assert!(m.bmm(&m).is_err() && m.mm(&u).is_err());
        Ok(())
    }

    #[test]
    fn compositions_match_their_definitions() -> crate::Result<()> {
        let vm = VirtualMachine::new(Config::default())?;
        let cx = Context::new(&vm);
        let arr = |v: &[f32], s: &[usize]| cx.from_slice(v, s, DeviceId::CPU);
        let x = arr(&[1.0, 2.0, 3.0, 4.0], &[2, 2])?;
        let i = arr(&[10.0, 20.0], &[2])?;
        let y = i.addmm(&x, &x, 0.5, 2.0)?; // 0.5 i + 2 x x, x x = [[7, 10], [15, 22]]
        assert_eq!(y.to_vec::<f32>()?, vec![19.0, 30.0, 35.0, 54.0]);
        let l = x.linear(&x, Some(&i))?; // x xᵀ + i
        assert_eq!(l.to_vec::<f32>()?, vec![15.0, 31.0, 21.0, 45.0]);
        let x3 = arr(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], &[2, 2, 2])?;
        assert_eq!(x3.linear(&x, None)?.shape(), &[2, 2, 2]);
        assert_eq!(
            x3.linear(&x, None)?.to_vec::<f32>()?,
            vec![5.0, 11.0, 11.0, 25.0, 17.0, 39.0, 23.0, 53.0]
        );
        assert_eq!(i.outer(&i)?.to_vec::<f32>()?, vec![100.0, 200.0, 200.0, 400.0]);
        Ok(())
    }

    #[test]
    fn convolution_and_pools_view_unbatched_inputs() -> crate::Result<()> {
        let vm = VirtualMachine::new(Config::default())?;
        let cx = Context::new(&vm);
        let x = cx.ones(&[2, 5, 4], DType::F32, DeviceId::CPU)?;
        let w = cx.ones(&[3, 2, 2, 2], DType::F32, DeviceId::CPU)?;
        let same = Conv2dOptions { padding: Padding::Same, ..Conv2dOptions::default() };
        let y = x.conv2d(&w, None, same)?;
        assert_eq!(y.shape(), &[3, 5, 4]);
        // Padding (0 top, 1 bottom, 0 left, 1 right): the last row and column see 2 taps.
        let v = y.to_vec::<f32>()?;
        assert_eq!((v[0], v[3], v[19]), (8.0, 4.0, 2.0));
        let (m, i) = x.max_pool2d_with_indices((2, 2), PoolOptions::default())?;
        assert_eq!((m.shape(), i.shape(), i.dtype()), (&[2, 2, 2][..], &[2, 2, 2][..], DType::I64));
        assert_eq!(
            x.avg_pool2d((2, 2), PoolOptions { ceil_mode: true, ..PoolOptions::default() })?.shape(),
            &[2, 3, 2]
        );
        assert_eq!(x.adaptive_avg_pool2d((1, 3))?.to_vec::<f32>()?, vec![1.0; 6]);
        let q = cx.ones(&[2, 3, 4], DType::F32, DeviceId::CPU)?;
        assert!(q.scaled_dot_product_attention(&q, &q, None, 0.1, false, None).is_err());
        assert_eq!(
            q.scaled_dot_product_attention(&q, &q, None, 0.0, true, None)?.to_vec::<f32>()?,
            vec![1.0; 24]
        );
        Ok(())
    }
}
