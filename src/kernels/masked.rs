//! `masked_fill`: a tensor with the scalar argument where a `bool` mask is true.

use super::dtype::{dispatch, Bool8, Elem};
use super::elementwise::input_dtype;
use super::iter::fits;
use super::loops::zip;
use super::{expect_inputs, refusal, spec_of, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// `masked_fill`: inputs `x` (any dtype) and `mask` (`bool`, broadcast to `x`'s shape);
/// the output is like `x`, holding `attrs.value()` (converted to `x`'s dtype by the
/// conversion rule) where the mask is true and `x` elsewhere. Works in place (the output
/// exactly `x`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MaskedFillKernel;

impl OpKernel for MaskedFillKernel {
    fn name(&self) -> &'static str {
        "masked_fill"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 2)?;
        let (x, mask) = (inputs[0], inputs[1]);
        if mask.dtype != DType::Bool {
            return Err(format!("input 1 (the mask) is {}: masked_fill takes a bool mask", mask.dtype));
        }
        if !fits(&mask.shape, &x.shape) {
            return Err(format!(
                "input 1 (the mask) is {} but input 0 is {}: the mask does not broadcast to the input's shape",
                mask.describe(),
                x.describe()
            ));
        }
        outputs.push(spec_of(x));
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn pointwise(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let dtype = input_dtype(ctx)?;
        let value = ctx.attrs.value().into();
        dispatch!(dtype, all, T => {
            let v = T::narrow(value);
            zip::<T, T, Bool8>(ctx, move |x: T, m: Bool8| if m.0 != 0 { v } else { x })
        }, Err(refusal("masked_fill", dtype, Dtypes::All)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, compute_raw, infer_err, run_with, t_f32, t_i64, tensor};

    #[test]
    fn fills_where_the_mask_is_true() {
        let x = t_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let mask = tensor(&[3], &[true, false, true]);
        let out = run_with(&MaskedFillKernel, Attrs::scalar(-1.0), vec![x, mask], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [-1.0, 2.0, -1.0, -1.0, 5.0, -1.0]);
    }

    #[test]
    fn in_place_and_non_canonical_mask_bytes() {
        let x = t_f32(&[3], &[1.0, 2.0, 3.0]);
        // A mask byte other than 0 or 1 (an imported buffer) reads as true.
        let mask = tensor(&[3], &[0u8, 7, 1]);
        let mask_meta = mask.0.with_layout(&[3], &[1], 0);
        let mask_meta = TensorMeta { dtype: DType::Bool, ..mask_meta };
        compute_raw(
            &MaskedFillKernel,
            Attrs::scalar(0.0),
            &[(&x.0, &x.1), (&mask_meta, &mask.1)],
            (&x.0, &x.1),
        )
        .unwrap();
        assert_eq!(as_f32(&x), [1.0, 0.0, 0.0]);
    }

    #[test]
    fn infer_errors() {
        let x = t_f32(&[2, 3], &[0.0; 6]).0;
        let i = t_i64(&[3], &[0; 3]).0;
        let m2 = tensor(&[2], &[true, false]).0;
        assert_eq!(
            infer_err(&MaskedFillKernel, &[&x, &i], &[]),
            "input 1 (the mask) is i64: masked_fill takes a bool mask"
        );
        assert!(infer_err(&MaskedFillKernel, &[&x, &m2], &[]).contains("the mask does not broadcast"));
    }
}
