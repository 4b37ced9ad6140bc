//! Matrix product: `matmul`, with its transpose flags.

use super::gemm;
use super::matmul_t::{product, Layout};
use super::{common_dtype, expect_inputs, input, input_dtype, output, with_num, Num};
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `matmul`: inputs `a: [m, k]` and `b: [k, n]` of one dtype, output `[m, n]` with
/// `out[i][j] = sum over p of a[i][p] * b[p][j]`.
///
/// With `attrs.transpose_a`, `a` is `[k, m]` and the product is `aᵀ b` (what `matmul_tn`
/// computes); with `attrs.transpose_b`, `b` is `[n, k]` and the product is `a bᵀ`
/// (`matmul_nt`). Both flags at once are refused by `infer` (no kernel computes `aᵀ bᵀ`;
/// it is `(b a)ᵀ`).
///
/// The compute is `kernels::gemm`'s: the `gemm` crate for `f32` products of more than
/// 64³ multiply-adds, plain loops otherwise (each output element adding its products in
/// increasing `p`, the same bits on every machine); the summation order and what it means
/// for reproducibility are in that module's docs. `i64` wraps.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatmulKernel;

impl OpKernel for MatmulKernel {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        if let Some(layout) = transposed(attrs)? {
            return layout.infer(inputs, outputs);
        }
        expect_inputs(inputs, 2)?;
        let dtype = common_dtype(inputs)?;
        let (m, n) = dims(inputs[0], inputs[1])?;
        outputs.push(OutSpec { shape: [m, n].into_iter().collect(), dtype });
        Ok(())
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        match transposed(&ctx.attrs)? {
            None => with_num!(input_dtype(ctx, 0)?, T => matmul::<T>(ctx)),
            Some(layout) => with_num!(input_dtype(ctx, 0)?, T => product::<T>(ctx, layout)),
        }
    }
}

/// The transposed product the flags ask for; `None` for the plain one.
fn transposed(attrs: &Attrs) -> Result<Option<Layout>, String> {
    match (attrs.transpose_a, attrs.transpose_b) {
        (false, false) => Ok(None),
        (true, false) => Ok(Some(Layout::Tn)),
        (false, true) => Ok(Some(Layout::Nt)),
        (true, true) => Err("transpose_a and transpose_b both set: matmul computes a b, aᵀ b or a bᵀ \
                             (for aᵀ bᵀ, compute (b a)ᵀ)"
            .into()),
    }
}

/// Check that `a` is `[m, k]` and `b` is `[k, n]`; give `(m, n)`.
fn dims(a: &TensorMeta, b: &TensorMeta) -> Result<(usize, usize), String> {
    for (i, t) in [a, b].into_iter().enumerate() {
        if t.shape.len() != 2 {
            return Err(format!("input {i} is {}: matmul takes 2-D inputs", t.describe()));
        }
    }
    if a.shape[1] != b.shape[0] {
        return Err(format!(
            "input 0 is {} and input 1 is {}: inner dimensions differ ({} != {})",
            a.describe(),
            b.describe(),
            a.shape[1],
            b.shape[0]
        ));
    }
    Ok((a.shape[0], b.shape[1]))
}

fn matmul<T: Num>(ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    let (ma, mb) = match ctx.inputs {
        [a, b] => (a.meta, b.meta),
        _ => return Err(format!("expected 2 inputs, got {}", ctx.inputs.len())),
    };
    let (m, n) = dims(ma, mb)?;
    let k = ma.shape[1];
    let a = input::<T>(ctx, 0)?;
    let b = input::<T>(ctx, 1)?;
    let (meta, out) = output::<T>(ctx, 0)?;
    if meta.shape.as_slice() != [m, n] {
        return Err(format!("output 0 is {} but matmul produces [{m}, {n}]", meta.describe()));
    }
    // The output may hold an earlier value (a reused tensor): `product` ignores it.
    gemm::product((m, k, n), a, b, gemm::Layout { a_trans: false, b_trans: false }, out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64, within_secs};

    /// A product with an empty dimension costs nothing, however large the others are (a
    /// `[2^40, 0]` tensor holds no element).
    #[test]
    fn an_empty_dimension_costs_nothing() {
        let out = within_secs(10, || {
            let a = t_f32(&[1 << 40, 0], &[]);
            let b = t_f32(&[0, 0], &[]);
            run(&MatmulKernel, 0.0, vec![a, b], &[]).unwrap()
        });
        assert_eq!(out[0].0.shape.as_slice(), &[1 << 40, 0]);
    }

    #[test]
    fn matmul_2x3_by_3x2() {
        // [1 2 3]   [ 7  8]   [1*7+2*9+3*11  1*8+2*10+3*12]   [ 58  64]
        // [4 5 6] x [ 9 10] = [4*7+5*9+6*11  4*8+5*10+6*12] = [139 154]
        //           [11 12]
        let a = t_f32(&[2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]);
        let b = t_f32(&[3, 2], &[7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        let out = run(&MatmulKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2]);
        assert_eq!(as_f32(&out[0]), vec![58.0, 64.0, 139.0, 154.0]);

        let a = t_i64(&[2, 3], &[1, 2, 3, 4, 5, 6]);
        let b = t_i64(&[3, 2], &[7, 8, 9, 10, 11, 12]);
        let out = run(&MatmulKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![58, 64, 139, 154]);
    }

    #[test]
    fn matmul_i64_wraps() {
        let a = t_i64(&[1, 2], &[i64::MAX, 1]);
        let b = t_i64(&[2, 1], &[2, 3]);
        let out = run(&MatmulKernel, 0.0, vec![a, b], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![i64::MAX.wrapping_mul(2).wrapping_add(3)]);
    }

    #[test]
    fn matmul_empty_dims() {
        // k = 0: every output element is an empty sum.
        let out = run(&MatmulKernel, 0.0, vec![t_f32(&[2, 0], &[]), t_f32(&[0, 3], &[])], &[]);
        assert_eq!(as_f32(&out.unwrap()[0]), vec![0.0; 6]);
        let out = run(&MatmulKernel, 0.0, vec![t_i64(&[0, 2], &[]), t_i64(&[2, 1], &[1, 2])], &[]);
        assert!(as_i64(&out.unwrap()[0]).is_empty());
    }

    #[test]
    fn matmul_infer_errors() {
        let f23 = t_f32(&[2, 3], &[0.0; 6]).0;
        let f42 = t_f32(&[4, 2], &[0.0; 8]).0;
        let f3 = t_f32(&[3], &[0.0; 3]).0;
        let f234 = t_f32(&[2, 3, 4], &[0.0; 24]).0;
        let i32_ = t_i64(&[3, 2], &[0; 6]).0;
        let k = &MatmulKernel;
        assert_eq!(infer_err(k, &[&f23], &[]), "expected 2 inputs, got 1");
        assert_eq!(infer_err(k, &[&f23, &i32_], &[]), "input 1 is i64 but input 0 is f32");
        assert_eq!(
            infer_err(k, &[&f23, &f42], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[4, 2]: inner dimensions differ (3 != 4)"
        );
        assert_eq!(infer_err(k, &[&f234, &f42], &[]), "input 0 is f32[2, 3, 4]: matmul takes 2-D inputs");
        assert_eq!(infer_err(k, &[&f23, &f3], &[]), "input 1 is f32[3]: matmul takes 2-D inputs");
    }
}
