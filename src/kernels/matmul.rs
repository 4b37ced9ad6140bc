//! Matrix product: `matmul`, with its transpose flags.

use super::dtype::{dispatch, Elem, Ring};
use super::gemm::{self, Mat};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{expect_count, input, output};
use super::matmul_t::Layout;
use super::{check_dtype, common_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `matmul`: inputs `a: [m, k]` and `b: [k, n]` of one dtype, output `[m, n]` with
/// `out[i][j] = sum over p of a[i][p] * b[p][j]`.
///
/// With `attrs.transpose_a`, `a` is `[k, m]` and the product is `aᵀ b` (what `matmul_tn`
/// computes); with `attrs.transpose_b`, `b` is `[n, k]` and the product is `a bᵀ`
/// (`matmul_nt`). Both flags at once are refused by `infer` (no kernel computes `aᵀ bᵀ`;
/// it is `(b a)ᵀ`).
///
/// Every dtype but `bool`; operands of any layout (a transposed or sliced view is passed to
/// the compute with its strides, uncopied). The compute is `kernels::gemm`'s: the `gemm`
/// crate for `f32` and `f64` products of more than 64³ multiply-adds (`f16` and `bf16`
/// through `f32`), plain loops otherwise (each output element adding its products in
/// increasing `p`, the same bits on every machine); the summation order and what it means
/// for reproducibility are in that module's docs. Integers wrap.
#[derive(Debug, Clone, Copy, Default)]
pub struct MatmulKernel;

impl OpKernel for MatmulKernel {
    fn name(&self) -> &'static str {
        "matmul"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Numeric.list()
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
        check_dtype("matmul", dtype, Dtypes::Numeric)?;
        let (m, n) = dims(inputs[0], inputs[1])?;
        outputs.push(OutSpec { shape: [m, n].into_iter().collect(), dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        run_product(ctx, "matmul", transposed(&ctx.attrs)?)
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

/// The product of a call's two inputs into its output, `aᵀ b` or `a bᵀ` with a layout.
pub(super) fn run_product(ctx: &KernelCtx<'_, '_>, op: &str, layout: Option<Layout>) -> Result<(), String> {
    expect_count(ctx, 2)?;
    let (x, y) = (input(ctx, 0)?, input(ctx, 1)?);
    let dims = match layout {
        None => dims(x.meta, y.meta).map(|(m, n)| (m, x.meta.shape[1], n))?,
        Some(l) => l.dims(x.meta, y.meta)?,
    };
    let dtype = x.meta.dtype;
    dispatch!(dtype, numeric, T => typed::<T>(ctx, op, dims, layout), Err(refusal(op, dtype, Dtypes::Numeric)))
}

fn typed<T: Elem>(
    ctx: &KernelCtx<'_, '_>,
    op: &str,
    (m, k, n): (usize, usize, usize),
    layout: Option<Layout>,
) -> Result<(), String>
where
    T::C: Ring,
{
    let (x, y, out) = (input(ctx, 0)?, input(ctx, 1)?, output(ctx, 0)?);
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let b = Operand::input(y.meta, y.data, 1, T::DTYPE)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    if o.shape != [m, n] {
        return Err(format!("output 0 is {} but {op} produces [{m}, {n}]", out.meta.describe()));
    }
    // An input in the output's memory (a caller that skipped the builder's checks) is read
    // from a copy made first: the product reads each input many times.
    let stage =
        |t: &Operand<'_>, s: Share| if s == Share::Disjoint { Ok(None) } else { Staged::new(t).map(Some) };
    let sa = stage(&a, share(&a, x.data, &o, out.data))?;
    let sb = stage(&b, share(&b, y.data, &o, out.data))?;
    let (a, b) = (sa.as_ref().map_or(a, Staged::operand), sb.as_ref().map_or(b, Staged::operand));
    let mat = |t: &Operand<'_>, transposed: bool| {
        let (rs, cs) = (t.strides[0], t.strides[1]);
        let ptr = t.first.cast::<T>();
        if transposed {
            Mat { ptr, rs: cs, cs: rs }
        } else {
            Mat { ptr, rs, cs }
        }
    };
    let (ta, tb) = match layout {
        None => (false, false),
        Some(Layout::Tn) => (true, false),
        Some(Layout::Nt) => (false, true),
    };
    // SAFETY: every operand was checked against its storage and has the product's shape
    // (`dims`, the output's check), so each matrix's elements lie in its layout; the inputs
    // are disjoint from the output (staged otherwise); the instruction holds the write
    // access to the output's storage.
    unsafe { gemm::product((m, k, n), mat(&a, ta), mat(&b, tb), mat(&o, false)) }
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
        assert_eq!(
            infer_err(k, &[&f23, &i32_], &[]),
            "input 1 is i64 but input 0 is f32: cast to one dtype first"
        );
        assert_eq!(
            infer_err(k, &[&f23, &f42], &[]),
            "input 0 is f32[2, 3] and input 1 is f32[4, 2]: inner dimensions differ (3 != 4)"
        );
        assert_eq!(infer_err(k, &[&f234, &f42], &[]), "input 0 is f32[2, 3, 4]: matmul takes 2-D inputs");
        assert_eq!(infer_err(k, &[&f23, &f3], &[]), "input 1 is f32[3]: matmul takes 2-D inputs");
    }
}
