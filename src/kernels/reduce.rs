//! Reductions: `sum`.

use super::{expect_inputs, input, input_dtype, output, with_num, Num};
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `sum`: one input, a scalar output (shape `[]`, same dtype) holding the sum of all
/// elements. `f32` adds in `f32`, one element at a time in index order, so the result does
/// not depend on the machine; `i64` wraps. The sum of no elements is 0.
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

fn sum<T: Num>(ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    let x = input::<T>(ctx, 0)?;
    let total = x.iter().fold(T::ZERO, |acc, &v| acc.plus(v));
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
