//! Kernels that set or move values: `fill`, `copy` and `cast`.

use super::dtype::{dispatch, Elem};
use super::iter::{broadcasts_to, share, Operand, Share, Staged};
use super::loops::{self, expect_count, input, output};
use super::{expect_inputs, spec_of};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `fill`: no inputs; sets every element of the one output, whose shape, dtype and layout
/// the caller gives, to `attrs.value()` converted to the dtype by the conversion rule
/// (`kernels::dtype`: an `Int` exactly, a `Float` to an integer truncated toward zero).
#[derive(Debug, Clone, Copy, Default)]
pub struct FillKernel;

impl OpKernel for FillKernel {
    fn name(&self) -> &'static str {
        "fill"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 0)?;
        match given {
            [out] => {
                outputs.push(spec_of(out));
                Ok(())
            }
            [] => Err("the output must be given: its shape and dtype are the caller's".into()),
            _ => Err(format!("writes one output, {} were given", given.len())),
        }
    }

    fn strided(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let value = ctx.attrs.value().into();
        let dtype = output(ctx, 0)?.meta.dtype;
        dispatch!(dtype, all, T => loops::fill::<T>(ctx, T::narrow(value)), unreachable_dtype(dtype))
    }
}

/// A dtype outside every group (there is none: the groups cover all eight).
#[cold]
fn unreachable_dtype(dtype: crate::vm::DType) -> Result<(), String> {
    Err(format!("no kernel for {dtype}"))
}

/// `copy`: one input; the output holds its values, in any layout. Without a given output
/// it is like the input; a given output may have any shape the input broadcasts to
/// (`x[1:3] = y`), and must have the input's dtype (`cast` converts). The input may live on
/// another device than the stream (host to device and back); here both sides are
/// host-addressable memory. Works in place; an input that overlaps the output other than
/// element for element is copied aside first, so the output gets the input's old values.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyKernel;

impl OpKernel for CopyKernel {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        let x = inputs[0];
        match given {
            [out] if out.shape != x.shape || out.dtype != x.dtype => {
                if out.dtype != x.dtype {
                    return Err(format!(
                        "input 0 is {} but output 0 is {}: copy keeps the dtype (cast converts)",
                        x.dtype, out.dtype
                    ));
                }
                broadcasts_to(0, x, &out.shape)?;
                outputs.push(spec_of(out));
            }
            _ => outputs.push(spec_of(x)),
        }
        Ok(())
    }

    fn cross_device(&self) -> bool {
        true
    }

    fn strided(&self) -> bool {
        true
    }

    fn in_place(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        expect_count(ctx, 1)?;
        let (src, dst) = (input(ctx, 0)?, output(ctx, 0)?);
        let o = Operand::output(dst.meta, dst.data, 0, dst.meta.dtype)?;
        let a = Operand::input(src.meta, src.data, 0, dst.meta.dtype)?;
        broadcasts_to(0, src.meta, o.shape)?;
        match share(&a, src.data, &o, dst.data) {
            Share::Same => {}
            Share::Disjoint => loops::copy_elements(&o, &a),
            Share::Overlap => loops::copy_elements(&o, &Staged::new(&a)?.operand()),
        }
        Ok(())
    }
}

/// `cast`: one input; the output has its shape and the dtype `attrs.dtype()` (required; a
/// given output must be of that dtype), each value converted by the conversion rule
/// (`kernels::dtype`): float to float rounds to nearest even (`f64` to `f16` or `bf16`
/// through `f32`, as PyTorch); float to integer
/// truncates toward zero and saturates, NaN giving 0; integer to integer wraps; anything
/// to `bool` is `!= 0`; `bool` to a number is 0 or 1. A cast to the input's own dtype
/// copies the bits. The output never shares the input's storage.
#[derive(Debug, Clone, Copy, Default)]
pub struct CastKernel;

impl OpKernel for CastKernel {
    fn name(&self) -> &'static str {
        "cast"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        let to = attrs.dtype().ok_or("cast needs the dtype to convert to (attrs.dtype)")?;
        if let Some(out) = given.first() {
            if out.dtype != to {
                return Err(format!("output 0 is {} but the cast is to {to}", out.dtype));
            }
        }
        outputs.push(OutSpec { shape: inputs[0].shape.clone(), dtype: to });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn pointwise(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        expect_count(ctx, 1)?;
        let (from, to) = (input(ctx, 0)?.meta.dtype, output(ctx, 0)?.meta.dtype);
        if ctx.attrs.dtype() != Some(to) {
            return Err(format!("output 0 is {to} but the cast is to {:?}", ctx.attrs.dtype()));
        }
        if from == to {
            return CopyKernel.compute(ctx);
        }
        dispatch!(from, all, S => dispatch!(to, all, D => cast::<D, S>(ctx), unreachable_dtype(to)),
            unreachable_dtype(from))
    }
}

/// Output 0 as input 0 converted to `D`.
fn cast<D: Elem, S: Elem>(ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    loops::map::<D, S>(ctx, |x| D::narrow(x.widen()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{
        as_f32, as_i64, compute_raw, infer_err, run, run_with, t_f32, t_i64, values,
    };
    use crate::vm::{DType, TensorViewMut};

    #[test]
    fn fill_values_both_dtypes() {
        let out = run(&FillKernel, -2.5, vec![], &[t_f32(&[2, 2], &[9.0; 4]).0]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![-2.5; 4]);
        let out = run(&FillKernel, -2.5, vec![], &[t_i64(&[3], &[0; 3]).0]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![-2; 3]);
        let out = run(&FillKernel, 0.75, vec![], &[t_i64(&[2], &[0; 2]).0]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0; 2]);
        let out = run(&FillKernel, 1e30, vec![], &[t_i64(&[1], &[0]).0]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i64::MAX]);
        // An integer scalar is exact, beyond f64's 53 bits.
        let big = (1i64 << 62) + 1;
        let out = run_with(&FillKernel, Attrs::integer(big), vec![], &[t_i64(&[1], &[0]).0]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![big]);
    }

    #[test]
    fn fill_overwrites_reused_storage() {
        // `run` allocates outputs fresh; check that fill writes every element even when the
        // storage already holds something, as a reused tensor's does.
        let (meta, data) = t_f32(&[3], &[1.0, 2.0, 3.0]);
        let mut outs = [TensorViewMut { meta: &meta, data: &data }];
        let mut ctx = KernelCtx { attrs: Attrs::scalar(0.5), inputs: &[], outputs: &mut outs };
        FillKernel.compute(&mut ctx).unwrap();
        assert_eq!(data.as_f32(), &[0.5; 3]);
    }

    #[test]
    fn fill_writes_a_strided_view_only() {
        let t = t_f32(&[3, 4], &[0.0; 12]);
        // Column 1: elements 1, 5, 9.
        let col = t.0.with_layout(&[3], &[4], 1);
        compute_raw(&FillKernel, Attrs::scalar(7.0), &[], (&col, &t.1)).unwrap();
        let want: Vec<f32> = (0..12).map(|i| if i % 4 == 1 { 7.0 } else { 0.0 }).collect();
        assert_eq!(as_f32(&t), want);
    }

    #[test]
    fn fill_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        let err = infer_err(&FillKernel, &[], &[]);
        assert!(err.contains("output must be given"), "{err}");
        let err = infer_err(&FillKernel, &[&x], &[&x]);
        assert_eq!(err, "expected 0 inputs, got 1");
        let err = infer_err(&FillKernel, &[], &[&x, &x]);
        assert!(err.contains("one output, 2 were given"), "{err}");
    }

    #[test]
    fn copy_values_both_dtypes() {
        let out = run(&CopyKernel, 0.0, vec![t_f32(&[3], &[1.5, -2.0, 3.25])], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![1.5, -2.0, 3.25]);
        let out = run(&CopyKernel, 0.0, vec![t_i64(&[2, 1], &[i64::MIN, 7])], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 1]);
        assert_eq!(as_i64(&out[0]), vec![i64::MIN, 7]);
        assert!(CopyKernel.cross_device());
    }

    #[test]
    fn copy_broadcasts_into_a_given_output() {
        let given = t_f32(&[2, 3], &[0.0; 6]).0;
        let out = run(&CopyKernel, 0.0, vec![t_f32(&[3], &[1.0, 2.0, 3.0])], &[given]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![1.0, 2.0, 3.0, 1.0, 2.0, 3.0]);
    }

    /// Copies between interleaved and shifted views of one storage read the old values.
    #[test]
    fn copy_within_one_storage_reads_the_old_values() {
        let t = t_f32(&[6], &[0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
        let (even, odd) = (t.0.with_layout(&[3], &[2], 0), t.0.with_layout(&[3], &[2], 1));
        compute_raw(&CopyKernel, Attrs::default(), &[(&even, &t.1)], (&odd, &t.1)).unwrap();
        assert_eq!(as_f32(&t), [0.0, 0.0, 2.0, 2.0, 4.0, 4.0]);
        // Shifted by one (the builder refuses it; the kernel still reads before it writes).
        let t = t_f32(&[5], &[0.0, 1.0, 2.0, 3.0, 4.0]);
        let (a, b) = (t.0.with_layout(&[4], &[1], 0), t.0.with_layout(&[4], &[1], 1));
        compute_raw(&CopyKernel, Attrs::default(), &[(&a, &t.1)], (&b, &t.1)).unwrap();
        assert_eq!(as_f32(&t), [0.0, 0.0, 1.0, 2.0, 3.0]);
        // Reversed onto itself.
        let t = t_f32(&[4], &[0.0, 1.0, 2.0, 3.0]);
        let rev = t.0.with_layout(&[4], &[-1], 3);
        compute_raw(&CopyKernel, Attrs::default(), &[(&rev, &t.1)], (&t.0, &t.1)).unwrap();
        assert_eq!(as_f32(&t), [3.0, 2.0, 1.0, 0.0]);
    }

    #[test]
    fn copy_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        let y = t_f32(&[3], &[0.0; 3]).0;
        let i = t_i64(&[2], &[0; 2]).0;
        assert_eq!(infer_err(&CopyKernel, &[], &[]), "expected 1 input, got 0");
        assert_eq!(infer_err(&CopyKernel, &[&x, &x], &[]), "expected 1 input, got 2");
        assert_eq!(
            infer_err(&CopyKernel, &[&x], &[&y]),
            "input 0 is f32[2] but the output is [3]: it does not broadcast to the output's shape"
        );
        assert_eq!(
            infer_err(&CopyKernel, &[&x], &[&i]),
            "input 0 is f32 but output 0 is i64: copy keeps the dtype (cast converts)"
        );
    }

    #[test]
    fn cast_converts_by_the_rule() {
        let cast = |x, to| run_with(&CastKernel, Attrs::default().with_dtype(to), vec![x], &[]).unwrap();
        let out = cast(t_f32(&[5], &[-2.9, 2.9, f32::NAN, 1e20, -0.0]), DType::I64);
        assert_eq!(out[0].0.dtype, DType::I64);
        assert_eq!(as_i64(&out[0]), vec![-2, 2, 0, i64::MAX, 0]);
        let out = cast(t_i64(&[3], &[257, -1, 0]), DType::U8);
        assert_eq!(values::<u8>(&out[0]), vec![1, 255, 0]);
        let out = cast(t_f32(&[3], &[0.0, -0.0, f32::NAN]), DType::Bool);
        assert_eq!(values::<u8>(&out[0]), vec![0, 0, 1]);
        let out = cast(t_i64(&[2], &[(1 << 24) + 1, 3]), DType::F32);
        assert_eq!(as_f32(&out[0]), vec![16_777_216.0, 3.0]);
        // Same dtype: the bits, NaN payloads included.
        let nan = f32::from_bits(0x7FC0_1234);
        let out = cast(t_f32(&[1], &[nan]), DType::F32);
        assert_eq!(as_f32(&out[0])[0].to_bits(), 0x7FC0_1234);
    }

    #[test]
    fn cast_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        let i = t_i64(&[2], &[0; 2]).0;
        assert!(infer_err(&CastKernel, &[&x], &[]).contains("needs the dtype"));
        let mut specs = OutSpecs::new();
        let err = CastKernel.infer(&[&x], &[&i], &Attrs::default().with_dtype(DType::F64), &mut specs);
        assert_eq!(err.unwrap_err(), "output 0 is i64 but the cast is to f64");
    }
}
