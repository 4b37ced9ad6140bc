//! Matrix products with one operand transposed: `matmul_tn` (`aᵀ b`) and `matmul_nt`
//! (`a bᵀ`), the two products a linear layer's backward pass needs (`dW = xᵀ dy`,
//! `dx = dy Wᵀ`). They are `matmul` with `transpose_a` or `transpose_b` set
//! (`kernels::matmul` runs them through this file); the two names stay registered so that
//! traces recorded with them keep replaying.
//!
//! Like `matmul`, they take every dtype but `bool` and operands of any layout, and compute
//! through `kernels::gemm` (the `gemm` crate for large floating products, plain loops
//! otherwise; its docs give the summation order); integers wrap.

use super::matmul::run_product;
use super::{check_dtype, common_dtype, expect_inputs, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// Which operand is transposed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Layout {
    /// `a: [k, m]`, `b: [k, n]`: `aᵀ b`.
    Tn,
    /// `a: [m, k]`, `b: [n, k]`: `a bᵀ`.
    Nt,
}

impl Layout {
    pub(super) fn op(self) -> &'static str {
        match self {
            Layout::Tn => "matmul_tn",
            Layout::Nt => "matmul_nt",
        }
    }

    /// Check the operands' shapes; give `(m, k, n)`.
    pub(super) fn dims(self, a: &TensorMeta, b: &TensorMeta) -> Result<(usize, usize, usize), String> {
        for (i, t) in [a, b].into_iter().enumerate() {
            if t.shape.len() != 2 {
                return Err(format!("input {i} is {}: {} takes 2-D inputs", t.describe(), self.op()));
            }
        }
        let (k_a, k_b, what) = match self {
            Layout::Tn => (a.shape[0], b.shape[0], "first"),
            Layout::Nt => (a.shape[1], b.shape[1], "second"),
        };
        if k_a != k_b {
            return Err(format!(
                "input 0 is {} and input 1 is {}: their {what} dimensions differ ({k_a} != {k_b})",
                a.describe(),
                b.describe()
            ));
        }
        Ok(match self {
            Layout::Tn => (a.shape[1], k_a, b.shape[1]),
            Layout::Nt => (a.shape[0], k_a, b.shape[0]),
        })
    }

    pub(super) fn infer(self, inputs: &[&TensorMeta], outputs: &mut OutSpecs) -> Result<(), String> {
        expect_inputs(inputs, 2)?;
        let dtype = common_dtype(inputs)?;
        check_dtype(self.op(), dtype, Dtypes::Numeric)?;
        let (m, _, n) = self.dims(inputs[0], inputs[1])?;
        outputs.push(OutSpec { shape: [m, n].into_iter().collect(), dtype });
        Ok(())
    }
}

/// `matmul_tn`: inputs `a: [k, m]` and `b: [k, n]` of one dtype, output `[m, n]` with
/// `out[i][j] = sum over p of a[p][i] * b[p][j]` (`aᵀ b`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatmulTnKernel;

impl OpKernel for MatmulTnKernel {
    fn name(&self) -> &'static str {
        Layout::Tn.op()
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
        Layout::Tn.infer(inputs, outputs)
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        run_product(ctx, Layout::Tn.op(), Some(Layout::Tn))
    }
}

/// `matmul_nt`: inputs `a: [m, k]` and `b: [n, k]` of one dtype, output `[m, n]` with
/// `out[i][j] = sum over p of a[i][p] * b[j][p]` (`a bᵀ`).
#[derive(Debug, Clone, Copy, Default)]
pub struct MatmulNtKernel;

impl OpKernel for MatmulNtKernel {
    fn name(&self) -> &'static str {
        Layout::Nt.op()
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
        Layout::Nt.infer(inputs, outputs)
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        run_product(ctx, Layout::Nt.op(), Some(Layout::Nt))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64, within_secs};

    /// As for `matmul`: an empty dimension costs nothing, however large the others are.
    #[test]
    fn an_empty_dimension_costs_nothing() {
        within_secs(10, || {
            let (a, b) = (t_f32(&[1 << 40, 0], &[]), t_f32(&[1 << 40, 0], &[]));
            run(&MatmulTnKernel, 0.0, vec![a, b], &[]).unwrap();
            let (a, b) = (t_f32(&[1 << 40, 0], &[]), t_f32(&[0, 0], &[]));
            run(&MatmulNtKernel, 0.0, vec![a, b], &[]).unwrap();
        });
    }

    #[test]
    fn matmul_tn_by_hand() {
        // a = [1 2]  (k=3, m=2)    aᵀ = [1 3 5]    b = [ 7  8]
        //     [3 4]                     [2 4 6]        [ 9 10]
        //     [5 6]                                    [11 12]
        // aᵀ b = [1*7+3*9+5*11  1*8+3*10+5*12] = [ 89  98]
        //        [2*7+4*9+6*11  2*8+4*10+6*12]   [116 128]
        let a = t_f32(&[3, 2], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t_f32(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        let out = run(&MatmulTnKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2]);
        assert_eq!(as_f32(&out[0]), vec![89.0, 98.0, 116.0, 128.0]);
        let a = t_i64(&[3, 2], &[1, 2, 3, 4, 5, 6]);
        let b = t_i64(&[3, 1], &[1, -1, 2]);
        let out = run(&MatmulTnKernel, 0.0, vec![a, b], &[]).unwrap();
        // [1-3+10, 2-4+12]
        assert_eq!(as_i64(&out[0]), vec![8, 10]);
    }

    #[test]
    fn matmul_nt_by_hand() {
        // a = [1 2 3]   b = [7 9 11]    a bᵀ = [1*7+2*9+3*11  1*8+2*10+3*12] = [ 58  64]
        //     [4 5 6]       [8 10 12]          [4*7+5*9+6*11  4*8+5*10+6*12]   [139 154]
        let a = t_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t_f32(&[2, 3], &[7.0, 9.0, 11.0, 8.0, 10.0, 12.0]);
        let out = run(&MatmulNtKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2]);
        assert_eq!(as_f32(&out[0]), vec![58.0, 64.0, 139.0, 154.0]);
        let a = t_i64(&[1, 2], &[i64::MAX, 1]);
        let b = t_i64(&[1, 2], &[2, 3]);
        let out = run(&MatmulNtKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i64::MAX.wrapping_mul(2).wrapping_add(3)]);
    }

    #[test]
    fn transposed_products_with_empty_inner_dimension_are_zero() {
        let out = run(&MatmulTnKernel, 0.0, vec![t_f32(&[0, 2], &[]), t_f32(&[0, 3], &[])], &[]);
        assert_eq!(as_f32(&out.unwrap()[0]), vec![0.0; 6]);
        let out = run(&MatmulNtKernel, 0.0, vec![t_f32(&[2, 0], &[]), t_f32(&[3, 0], &[])], &[]);
        assert_eq!(as_f32(&out.unwrap()[0]), vec![0.0; 6]);
    }

    #[test]
    fn transposed_products_infer_errors() {
        let f23 = t_f32(&[2, 3], &[0.0; 6]).0;
        let f32_ = t_f32(&[3, 2], &[0.0; 6]).0;
        let f3 = t_f32(&[3], &[0.0; 3]).0;
        let i23 = t_i64(&[2, 3], &[0; 6]).0;
        assert_eq!(
            infer_err(&MatmulTnKernel, &[&f23, &f32_], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[3, 2]: their first dimensions differ (2 != 3)"
        );
        assert_eq!(
            infer_err(&MatmulNtKernel, &[&f23, &f32_], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[3, 2]: their second dimensions differ (3 != 2)"
        );
        assert_eq!(
            infer_err(&MatmulTnKernel, &[&f3, &f23], &[]),
            "input 0 is f32[3]: matmul_tn takes 2-D inputs"
        );
        assert_eq!(
            infer_err(&MatmulNtKernel, &[&f23, &i23], &[]),
            "input 1 is i64 but input 0 is f32: cast to one dtype first"
        );
        assert_eq!(infer_err(&MatmulNtKernel, &[&f23], &[]), "expected 2 inputs, got 1");
    }
}
