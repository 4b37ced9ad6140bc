//! Batched matrix product: `bmm`, over operands of any rank whose batch dimensions broadcast.

use smallvec::SmallVec;

use super::dtype::{dispatch, Elem, Ring};
use super::gemm::{self, Mat};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{expect_count, input, output};
use super::{check_dtype, common_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta};

/// `bmm`: inputs `a: [*A, m, k]` and `b: [*B, k, n]` of one dtype (each of at least two
/// dimensions), output `[*batch, m, n]` where `batch` is the shape `A` and `B` broadcast to
/// (NumPy's rule, aligned at the last batch dimension) and
/// `out[.., i, j] = sum over p of a[.., i, p] * b[.., p, j]` for each batch index.
///
/// PyTorch's `bmm` (`[b, m, k] @ [b, k, n]`) and the batched cases of `matmul`
/// (`[b, 1, m, k] @ [h, k, n]`) are this op; a broadcast batch dimension is read with a
/// stride of 0, nothing is copied. Every dtype but `bool`; operands of any layout. Each batch
/// element's product is `kernels::gemm`'s, with its summation order: plain loops adding in
/// increasing `p` up to 64³ multiply-adds, the `gemm` crate above (for `f32` and `f64`, and
/// `f16` and `bf16` through `f32`). Batch elements are computed one after another in
/// row-major order of the batch index. Integers wrap.
#[derive(Debug, Clone, Copy, Default)]
pub struct BmmKernel;

impl OpKernel for BmmKernel {
    fn name(&self) -> &'static str {
        "bmm"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Numeric.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 2)?;
        let dtype = common_dtype(inputs)?;
        check_dtype("bmm", dtype, Dtypes::Numeric)?;
        let shape = out_shape(inputs[0], inputs[1])?;
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
        expect_count(ctx, 2)?;
        let x = input(ctx, 0)?;
        let shape = out_shape(x.meta, input(ctx, 1)?.meta)?;
        let dtype = x.meta.dtype;
        dispatch!(dtype, numeric, T => typed::<T>(ctx, &shape), Err(refusal("bmm", dtype, Dtypes::Numeric)))
    }
}

/// The output shape of `a @ b` batched, or why there is none.
fn out_shape(a: &TensorMeta, b: &TensorMeta) -> Result<Shape, String> {
    for (i, t) in [a, b].into_iter().enumerate() {
        if t.shape.len() < 2 {
            return Err(format!("input {i} is {}: bmm takes inputs of at least 2 dimensions", t.describe()));
        }
    }
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let (m, k, k2, n) = (a.shape[ra - 2], a.shape[ra - 1], b.shape[rb - 2], b.shape[rb - 1]);
    if k != k2 {
        return Err(format!(
            "input 0 is {} and input 1 is {}: inner dimensions differ ({k} != {k2})",
            a.describe(),
            b.describe()
        ));
    }
    let (ba, bb) = (&a.shape[..ra - 2], &b.shape[..rb - 2]);
    let rank = ba.len().max(bb.len());
    let dim = |s: &[usize], d: usize| (d + s.len()).checked_sub(rank).map_or(1, |i| s[i]);
    let mut shape = Shape::with_capacity(rank + 2);
    for d in 0..rank {
        let (x, y) = (dim(ba, d), dim(bb, d));
        shape.push(match (x, y) {
            _ if x == y => x,
            (1, _) => y,
            (_, 1) => x,
            _ => {
                return Err(format!(
                    "input 0 is {} and input 1 is {}: the batch dimensions do not broadcast (batch \
                     dimension {d}: {x} against {y})",
                    a.describe(),
                    b.describe()
                ))
            }
        });
    }
    shape.push(m);
    shape.push(n);
    Ok(shape)
}

/// The strides of an operand's batch dimensions broadcast to `batch` (stride 0 where the
/// operand has size 1 or lacks the dimension).
pub(super) fn batch_strides(t: &Operand<'_>, batch: &[usize]) -> SmallVec<[isize; 6]> {
    let own = t.shape.len() - 2;
    (0..batch.len())
        .map(|d| match (d + own).checked_sub(batch.len()) {
            Some(i) if t.shape[i] != 1 => t.strides[i],
            _ => 0,
        })
        .collect()
}

fn typed<T: Elem>(ctx: &KernelCtx<'_, '_>, shape: &[usize]) -> Result<(), String>
where
    T::C: Ring,
{
    let (x, y, out) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let b = Operand::input(y.meta, y.data, 1, T::DTYPE)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    if o.shape != shape {
        return Err(format!(
            "output 0 is {} but bmm produces [{}]",
            out.meta.describe(),
            shape.iter().map(|d| d.to_string()).collect::<Vec<_>>().join(", ")
        ));
    }
    if o.numel == 0 {
        return Ok(());
    }
    // An input in the output's memory (a caller that skipped the builder's checks) is read
    // from a copy made first: the product reads each input many times.
    let stage =
        |t: &Operand<'_>, s: Share| if s == Share::Disjoint { Ok(None) } else { Staged::new(t).map(Some) };
    let sa = stage(&a, share(&a, x.data, &o, out.data))?;
    let sb = stage(&b, share(&b, y.data, &o, out.data))?;
    let (a, b) = (sa.as_ref().map_or(a, Staged::operand), sb.as_ref().map_or(b, Staged::operand));
    let r = shape.len();
    let (m, n) = (shape[r - 2], shape[r - 1]);
    let k = a.shape[a.shape.len() - 1];
    let batch = &shape[..r - 2];
    let (bsa, bsb) = (batch_strides(&a, batch), batch_strides(&b, batch));
    let bso = &o.strides[..r - 2];
    let mat = |t: &Operand<'_>, at: isize| {
        let rank = t.shape.len();
        Mat { ptr: t.first.cast::<T>().wrapping_offset(at), rs: t.strides[rank - 2], cs: t.strides[rank - 1] }
    };
    // Row-major over the batch index (an odometer), with each operand's element offset.
    let mut index: SmallVec<[usize; 6]> = SmallVec::from_elem(0, batch.len());
    let (mut oa, mut ob, mut oo) = (0isize, 0isize, 0isize);
    loop {
        // SAFETY: every operand was checked against its storage; the batch index is within
        // the output's batch shape, to which each input's batch dimensions broadcast (their
        // strides 0 where broadcast), so each matrix lies in its operand's checked layout;
        // the inputs are disjoint from the output (staged otherwise); the instruction holds
        // the write access to the output's storage.
        unsafe { gemm::product((m, k, n), mat(&a, oa), mat(&b, ob), mat(&o, oo))? };
        let mut d = batch.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            index[d] += 1;
            oa += bsa[d];
            ob += bsb[d];
            oo += bso[d];
            if index[d] < batch[d] {
                break;
            }
            oa -= bsa[d] * batch[d] as isize;
            ob -= bsb[d] * batch[d] as isize;
            oo -= bso[d] * batch[d] as isize;
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64};

    /// The naive product of row-major `[batch, m, k]` and `[batch, k, n]`, in `f64`.
    fn naive(a: &[f32], b: &[f32], (bt, m, k, n): (usize, usize, usize, usize)) -> Vec<f64> {
        let mut out = vec![0.0; bt * m * n];
        for q in 0..bt {
            for i in 0..m {
                for j in 0..n {
                    out[(q * m + i) * n + j] = (0..k)
                        .map(|p| f64::from(a[(q * m + i) * k + p]) * f64::from(b[(q * k + p) * n + j]))
                        .sum();
                }
            }
        }
        out
    }

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.37).sin()).collect()
    }

    #[test]
    fn batched_products_match_the_naive_ones() {
        for &(bt, m, k, n) in &[(3, 2, 4, 5), (1, 1, 1, 1), (2, 70, 80, 90), (4, 3, 0, 2)] {
            let (av, bv) = (vals(bt * m * k, 0.0), vals(bt * k * n, 1.0));
            let out =
                run(&BmmKernel, 0.0, vec![t_f32(&[bt, m, k], &av), t_f32(&[bt, k, n], &bv)], &[]).unwrap();
            assert_eq!(out[0].0.shape.as_slice(), &[bt, m, n]);
            for (g, w) in as_f32(&out[0]).iter().zip(naive(&av, &bv, (bt, m, k, n))) {
                assert!((f64::from(*g) - w).abs() <= 1e-4 * (1.0 + w.abs()), "{g} against {w}");
            }
        }
    }

    #[test]
    fn batch_dimensions_broadcast() {
        // a: [2, 1, 2, 3], b: [3, 3, 2] -> [2, 3, 2, 2]; each output matrix is a[i] @ b[j].
        let (av, bv) = (vals(12, 0.0), vals(18, 2.0));
        let out = run(&BmmKernel, 0.0, vec![t_f32(&[2, 1, 2, 3], &av), t_f32(&[3, 3, 2], &bv)], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3, 2, 2]);
        let got = as_f32(&out[0]);
        for i in 0..2 {
            for j in 0..3 {
                let want = naive(&av[i * 6..i * 6 + 6], &bv[j * 6..j * 6 + 6], (1, 2, 3, 2));
                let at = (i * 3 + j) * 4;
                for (g, w) in got[at..at + 4].iter().zip(want) {
                    assert!((f64::from(*g) - w).abs() < 1e-5);
                }
            }
        }
        // A 2-D operand is one matrix for every batch element.
        let out = run(&BmmKernel, 0.0, vec![t_i64(&[2, 1, 2], &[1, 2, 3, 4]), t_i64(&[2, 1], &[10, 1])], &[]);
        assert_eq!(as_i64(&out.unwrap()[0]), vec![12, 34]);
    }

    /// A view of `t`'s storage with another layout.
    fn relaid(
        mut t: crate::kernels::testing::Owned,
        shape: &[usize],
        strides: &[isize],
    ) -> crate::kernels::testing::Owned {
        t.0.shape = shape.iter().copied().collect();
        t.0.strides = strides.iter().copied().collect();
        t
    }

    /// Transposed matrices and a batch expanded by stride 0 are read as they lie.
    #[test]
    fn strided_and_expanded_operands() {
        let (av, bv) = (vals(6, 0.0), vals(12, 4.0));
        // a: one [2, 3] matrix stored transposed ([3, 2] row-major), expanded to a batch of 2.
        let a = relaid(t_f32(&[3, 2], &av), &[2, 2, 3], &[0, 1, 2]);
        // b: [2, 3, 2] stored as [2, 2, 3] (each matrix transposed).
        let b = relaid(t_f32(&[2, 2, 3], &bv), &[1, 2, 3, 2], &[0, 6, 1, 3]);
        let out = run(&BmmKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[1, 2, 2, 2]);
        let got = as_f32(&out[0]);
        let at = |i: usize, p: usize| av[p * 2 + i];
        for q in 0..2 {
            let bq = q;
            for i in 0..2 {
                for j in 0..2 {
                    let want: f32 = (0..3).map(|p| at(i, p) * bv[bq * 6 + j * 3 + p]).sum();
                    assert!((got[(q * 2 + i) * 2 + j] - want).abs() < 1e-6);
                }
            }
        }
    }

    #[test]
    fn half_products_round_once_and_nan_propagates() {
        use half::bf16;
        let a: Vec<bf16> = [1.0f32, 2.0, f32::NAN, 1.0].iter().map(|&v| bf16::from_f32(v)).collect();
        let b: Vec<bf16> = [1.0f32 / 3.0, 1.0].iter().map(|&v| bf16::from_f32(v)).collect();
        let out = run(
            &BmmKernel,
            0.0,
            vec![
                crate::kernels::testing::tensor(&[2, 1, 2], &a),
                crate::kernels::testing::tensor(&[2, 1], &b),
            ],
            &[],
        )
        .unwrap();
        let got: Vec<bf16> = crate::kernels::testing::values(&out[0]);
        let want = b[0].to_f32() + 2.0 * b[1].to_f32();
        assert_eq!(got[0], bf16::from_f32(want));
        assert!(got[1].is_nan());
    }

    #[test]
    fn an_empty_batch_writes_nothing() {
        let out =
            run(&BmmKernel, 0.0, vec![t_f32(&[0, 2, 3], &[]), t_f32(&[3, 4], &[0.0; 12])], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0, 2, 4]);
    }

    #[test]
    fn bmm_infer_errors() {
        let f23 = t_f32(&[2, 3], &[0.0; 6]).0;
        let f3 = t_f32(&[3], &[0.0; 3]).0;
        let f234 = t_f32(&[2, 3, 4], &[0.0; 24]).0;
        let f342 = t_f32(&[3, 4, 2], &[0.0; 24]).0;
        let k = &BmmKernel;
        assert_eq!(
            infer_err(k, &[&f23, &f3], &[]),
            "input 1 is f32[3]: bmm takes inputs of at least 2 dimensions"
        );
        assert_eq!(
            infer_err(k, &[&f234, &f342], &[]),
            "input 0 is f32[2, 3, 4] and input 1 is f32[3, 4, 2]: the batch dimensions do not broadcast \
             (batch dimension 0: 2 against 3)"
        );
        assert_eq!(
            infer_err(k, &[&f234, &f23], &[]),
            "input 0 is f32[2, 3, 4] and input 1 is f32[2, 3]: inner dimensions differ (4 != 2)"
        );
    }
}
