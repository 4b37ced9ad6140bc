//! Reductions: `sum`.

use super::{expect_inputs, input, input_dtype, output, with_num, Num};
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `sum`: one input, a scalar output (shape `[]`, same dtype) holding the sum of all
/// elements. `f32` adds in `f32` in the order of [`sum_f32`], which does not depend on the
/// machine; `i64` wraps (in any order: wrapping addition is associative). The sum of no
/// elements is 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumKernel;

impl OpKernel for SumKernel {
    fn name(&self) -> &'static str {
        "sum"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        outputs.push(OutSpec { shape: Default::default(), dtype: inputs[0].dtype });
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        with_num!(input_dtype(ctx, 0)?, T => sum::<T>(ctx))
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
const LANES: usize = 32;

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
/// chain is: each partial sum holds a 32nd of the terms.
pub fn sum_f32(x: &[f32]) -> f32 {
    if x.len() <= SEQUENTIAL_SUM_MAX {
        return x.iter().fold(0.0, |acc, &v| acc + v);
    }
    let mut acc = [0.0f32; LANES];
    let groups = x.chunks_exact(LANES);
    let tail = groups.remainder();
    for g in groups {
        for (a, &v) in acc.iter_mut().zip(g) {
            *a += v;
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        let (lo, hi) = acc.split_at_mut(width);
        for (a, &b) in lo.iter_mut().zip(&hi[..width]) {
            *a += b;
        }
        width /= 2;
    }
    tail.iter().fold(acc[0], |t, &v| t + v)
}

fn sum<T: Num>(ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    let x = input::<T>(ctx, 0)?;
    let total = T::sum(x);
    match output::<T>(ctx, 0)? {
        (_, [out]) => {
            *out = total;
            Ok(())
        }
        (meta, _) => Err(format!("output 0 is {} but sum writes one element", meta.describe())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64};
    use crate::vm::DType;

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
    fn sum_is_sequential_in_f32() {
        // Index order in f32: (1e8 + 1) rounds back to 1e8 each time, then -1e8 leaves 0.
        let x = t_f32(&[4], &[1e8, 1.0, 1.0, -1e8]);
        assert_eq!(as_f32(&run(&SumKernel, 0.0, vec![x], &[]).unwrap()[0]), vec![0.0]);
    }

    /// Above the threshold: the documented order, bit for bit, written out the long way.
    #[test]
    fn large_sums_use_32_partial_sums_and_a_tree() {
        for len in [SEQUENTIAL_SUM_MAX + 1, 10_000, 1 << 16, (1 << 16) + 31] {
            // Full-mantissa values of mixed sign and magnitude, so that order shows.
            let x: Vec<f32> =
                (0..len).map(|i| ((i * 7919) % 1000) as f32 * 0.37 - (i % 3) as f32 * 211.3).collect();
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
            let want = x[whole..].iter().fold(p[0], |t, &v| t + v);
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
}
