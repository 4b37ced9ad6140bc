//! Kernels for training small networks by hand-written backward passes: `sub`,
//! `relu_grad`, `add_bias` and `sum_rows`.
//!
//! They follow the rules of the module docs: one dtype per call, `f32` arithmetic in a fixed
//! order (so CPU and mock results agree bit for bit), wrapping `i64` arithmetic.

use super::elementwise::binary_kernel;
use super::{common_dtype, expect_inputs, input, input_dtype, output, spec_of, with_num, Num};
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

binary_kernel!(
    /// `sub`: two inputs of one shape and dtype, elementwise difference `a - b` (wrapping
    /// for `i64`). No broadcasting.
    SubKernel, "sub", T => T::minus
);

binary_kernel!(
    /// `relu_grad`: inputs `dy` (the gradient of `relu(x)`) and `x`, of one shape and
    /// dtype; the output is the gradient with respect to `x`: `dy` where `x > 0`, 0
    /// elsewhere (at `x == 0`, and where `x` is NaN, the gradient is 0).
    ReluGradKernel, "relu_grad", T => |dy, x| if x > T::ZERO { dy } else { T::ZERO }
);

/// `add_bias`: inputs `x: [n, k]` and `b: [k]` of one dtype; output `[n, k]` with
/// `out[i][j] = x[i][j] + b[j]` (the bias is broadcast over the rows).
#[derive(Debug, Clone, Copy, Default)]
pub struct AddBiasKernel;

impl OpKernel for AddBiasKernel {
    fn name(&self) -> &'static str {
        "add_bias"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 2)?;
        common_dtype(inputs)?;
        bias_dims(inputs[0], inputs[1])?;
        outputs.push(spec_of(inputs[0]));
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        with_num!(input_dtype(ctx, 0)?, T => add_bias::<T>(ctx))
    }
}

/// `sum_rows`: input `x: [n, k]`; output `[k]` with `out[j] = sum over i of x[i][j]` (the
/// sum over the rows, that is the column sums: the gradient of a bias added by
/// `add_bias`). Each sum adds in increasing `i`; the sum of no rows is 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct SumRowsKernel;

impl OpKernel for SumRowsKernel {
    fn name(&self) -> &'static str {
        "sum_rows"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        let (_, k) = rows_cols(inputs[0], 0)?;
        outputs.push(OutSpec { shape: [k].into_iter().collect(), dtype: inputs[0].dtype });
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        with_num!(input_dtype(ctx, 0)?, T => sum_rows::<T>(ctx))
    }
}

/// `(n, k)` of a 2-D operand, or an error naming input `i`.
fn rows_cols(m: &TensorMeta, i: usize) -> Result<(usize, usize), String> {
    match m.shape.as_slice() {
        &[n, k] => Ok((n, k)),
        _ => Err(format!("input {i} is {}: expected a 2-D input [n, k]", m.describe())),
    }
}

/// Check that `x` is `[n, k]` and `b` is `[k]`; give `(n, k)`.
fn bias_dims(x: &TensorMeta, b: &TensorMeta) -> Result<(usize, usize), String> {
    let (n, k) = rows_cols(x, 0)?;
    if b.shape.as_slice() != [k] {
        return Err(format!(
            "input 0 is {} and input 1 is {}: the bias must be 1-D with {k} elements",
            x.describe(),
            b.describe()
        ));
    }
    Ok((n, k))
}

fn add_bias<T: Num>(ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    let (mx, mb) = match ctx.inputs {
        [x, b] => (x.meta, b.meta),
        _ => return Err(format!("expected 2 inputs, got {}", ctx.inputs.len())),
    };
    let (_, k) = bias_dims(mx, mb)?;
    let x = input::<T>(ctx, 0)?;
    let b = input::<T>(ctx, 1)?;
    let (meta, out) = output::<T>(ctx, 0)?;
    if out.len() != x.len() {
        return Err(format!("output 0 is {} but input 0 is {}", meta.describe(), mx.describe()));
    }
    if k == 0 {
        return Ok(());
    }
    for (orow, xrow) in out.chunks_exact_mut(k).zip(x.chunks_exact(k)) {
        for ((o, &v), &bias) in orow.iter_mut().zip(xrow).zip(b) {
            *o = v.plus(bias);
        }
    }
    Ok(())
}

fn sum_rows<T: Num>(ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    let mx = ctx.inputs.first().ok_or("missing input 0")?.meta;
    let (_, k) = rows_cols(mx, 0)?;
    let x = input::<T>(ctx, 0)?;
    let (meta, out) = output::<T>(ctx, 0)?;
    if out.len() != k {
        return Err(format!(
            "output 0 is {} but sum_rows of {} has {k} elements",
            meta.describe(),
            mx.describe()
        ));
    }
    // The output may hold an earlier value (a reused tensor): start from zero.
    out.fill(T::ZERO);
    if k == 0 {
        return Ok(());
    }
    for row in x.chunks_exact(k) {
        for (o, &v) in out.iter_mut().zip(row) {
            *o = o.plus(v);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64};
    use crate::vm::DType;

    #[test]
    fn sub_both_dtypes() {
        let a = t_f32(&[2, 2], &[1.0, -2.0, 0.5, 4.0]);
        let b = t_f32(&[2, 2], &[3.0, 2.0, 0.25, -1.0]);
        let out = run(&SubKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2]);
        assert_eq!(as_f32(&out[0]), vec![-2.0, -4.0, 0.25, 5.0]);
        let a = t_i64(&[3], &[1, i64::MIN, 10]);
        let b = t_i64(&[3], &[5, 1, -3]);
        let out = run(&SubKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![-4, i64::MAX, 13]);
    }

    #[test]
    fn relu_grad_passes_dy_where_x_is_positive() {
        let dy = t_f32(&[5], &[1.0, 2.0, 3.0, 4.0, 5.0]);
        let x = t_f32(&[5], &[0.5, -1.0, 0.0, f32::NAN, 1e-30]);
        let out = run(&ReluGradKernel, 0.0, vec![dy, x], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![1.0, 0.0, 0.0, 0.0, 5.0]);
        let dy = t_i64(&[3], &[7, 8, 9]);
        let x = t_i64(&[3], &[-1, 0, 2]);
        let out = run(&ReluGradKernel, 0.0, vec![dy, x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0, 0, 9]);
    }

    #[test]
    fn same_shape_infer_errors() {
        let f2 = t_f32(&[2], &[0.0; 2]).0;
        let f3 = t_f32(&[3], &[0.0; 3]).0;
        let i2 = t_i64(&[2], &[0; 2]).0;
        for k in [&SubKernel as &dyn OpKernel, &ReluGradKernel] {
            assert_eq!(infer_err(k, &[&f2], &[]), "expected 2 inputs, got 1");
            assert_eq!(infer_err(k, &[&f2, &i2], &[]), "input 1 is i64 but input 0 is f32");
            assert_eq!(
                infer_err(k, &[&f2, &f3], &[]),
                "input 0 is f32[2] and input 1 is f32[3]: shapes must be equal (no broadcasting)"
            );
        }
    }

    #[test]
    fn add_bias_broadcasts_over_rows() {
        let x = t_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t_f32(&[3], &[10.0, -1.0, 0.5]);
        let out = run(&AddBiasKernel, 0.0, vec![x, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 3]);
        assert_eq!(as_f32(&out[0]), vec![11.0, 1.0, 3.5, 14.0, 4.0, 6.5]);
        let x = t_i64(&[3, 1], &[1, 2, i64::MAX]);
        let b = t_i64(&[1], &[1]);
        let out = run(&AddBiasKernel, 0.0, vec![x, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![2, 3, i64::MIN]);
        let out = run(&AddBiasKernel, 0.0, vec![t_f32(&[2, 0], &[]), t_f32(&[0], &[])], &[]).unwrap();
        assert!(as_f32(&out[0]).is_empty());
    }

    #[test]
    fn add_bias_infer_errors() {
        let x = t_f32(&[2, 3], &[0.0; 6]).0;
        let b2 = t_f32(&[2], &[0.0; 2]).0;
        let b13 = t_f32(&[1, 3], &[0.0; 3]).0;
        let bi = t_i64(&[3], &[0; 3]).0;
        let k = &AddBiasKernel;
        assert_eq!(
            infer_err(k, &[&x, &b2], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[2]: the bias must be 1-D with 3 elements"
        );
        assert!(infer_err(k, &[&x, &b13], &[]).contains("the bias must be 1-D"));
        assert_eq!(infer_err(k, &[&x, &bi], &[]), "input 1 is i64 but input 0 is f32");
        assert_eq!(infer_err(k, &[&b2, &b2], &[]), "input 0 is f32[2]: expected a 2-D input [n, k]");
    }

    #[test]
    fn sum_rows_gives_column_sums() {
        // [1 2 3]
        // [4 5 6]  ->  [1+4+7, 2+5+8, 3+6+9]
        // [7 8 9]
        let x = t_f32(&[3, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0]);
        let out = run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[3]);
        assert_eq!(out[0].0.dtype, DType::F32);
        assert_eq!(as_f32(&out[0]), vec![12.0, 15.0, 18.0]);
        let x = t_i64(&[2, 2], &[i64::MAX, 1, 1, 2]);
        let out = run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i64::MIN, 3]);
        // No rows: zeros.
        let out = run(&SumRowsKernel, 0.0, vec![t_f32(&[0, 2], &[])], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![0.0, 0.0]);
    }

    #[test]
    fn sum_rows_adds_in_row_order() {
        // Row order in f32: (1e8 + 1) rounds back to 1e8, then -1e8 leaves 0.
        let x = t_f32(&[3, 1], &[1e8, 1.0, -1e8]);
        assert_eq!(as_f32(&run(&SumRowsKernel, 0.0, vec![x], &[]).unwrap()[0]), vec![0.0]);
    }

    #[test]
    fn sum_rows_infer_errors() {
        let v = t_f32(&[3], &[0.0; 3]).0;
        assert_eq!(infer_err(&SumRowsKernel, &[], &[]), "expected 1 input, got 0");
        assert_eq!(infer_err(&SumRowsKernel, &[&v], &[]), "input 0 is f32[3]: expected a 2-D input [n, k]");
    }
}
