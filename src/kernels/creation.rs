//! Ops that make structured tensors from others: `tril` and `triu` (a batch of matrices
//! with the elements above or below a diagonal zeroed) and `one_hot` (class indices to
//! rows of 0 and 1).

use super::dtype::{dispatch, Elem};
use super::elementwise::input_dtype;
use super::iter::{share, Operand, Share, Staged};
use super::loops::{expect_count, input, output};
use super::pointwise::{strides_over, walk};
use super::{expect_inputs, refusal, spec_of, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorMeta};

/// `out = x` where `keep(row, col)`, else 0, over the last two dimensions of input 0.
fn triangle<T: Elem>(ctx: &KernelCtx<'_, '_>, keep: impl Fn(i64, i64) -> bool) -> Result<(), String> {
    expect_count(ctx, 1)?;
    let (x, out) = (input(ctx, 0)?, output(ctx, 0)?);
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    if a.shape != o.shape || o.shape.len() < 2 {
        return Err(format!(
            "input 0 is {} but the output is {}: expected one shape of at least 2 dimensions",
            x.meta.describe(),
            out.meta.describe()
        ));
    }
    if o.numel == 0 {
        return Ok(());
    }
    let staged =
        if share(&a, x.data, &o, out.data) == Share::Overlap { Some(Staged::new(&a)?) } else { None };
    let a = staged.as_ref().map_or(a, Staged::operand);
    let (po, pa) = (o.first.cast::<T>(), a.first.cast::<T>());
    let r = o.shape.len() - 2;
    let zero = T::narrow(super::dtype::Wide::Int(0));
    walk(o.shape, &[strides_over(&o, o.shape), strides_over(&a, o.shape)], |idx, at, st, n| {
        let row = idx[r] as i64;
        for j in 0..n as isize {
            // SAFETY: offsets of elements of the checked layouts; the input is the output
            // itself (each element read before it is written), disjoint, or staged.
            unsafe {
                let v = if keep(row, j as i64) { pa.offset(at[1] + j * st[1]).read() } else { zero };
                po.offset(at[0] + j * st[0]).write(v);
            }
        }
    });
    Ok(())
}

/// Input 0 of at least 2 dimensions; the output is like it.
fn infer_matrices(op: &str, inputs: &[&TensorMeta], outputs: &mut OutSpecs) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    if inputs[0].shape.len() < 2 {
        return Err(format!(
            "input 0 is {}: {op} takes a tensor of at least 2 dimensions",
            inputs[0].describe()
        ));
    }
    outputs.push(spec_of(inputs[0]));
    Ok(())
}

macro_rules! triangle_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, |$i:ident, $j:ident, $k:ident| $keep:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
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
                infer_matrices($op, inputs, outputs)
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
                let dtype = input_dtype(ctx)?;
                let $k = ctx.attrs.params().int_or(0, 0);
                dispatch!(dtype, all, T => triangle::<T>(ctx, |$i, $j| $keep), Err(refusal($op, dtype, Dtypes::All)))
            }
        }
    };
}

triangle_kernel!(
    /// `tril`: input `x` of at least 2 dimensions, every dtype; the output is like `x` with
    /// the elements above diagonal `k` (integer parameter 0, default 0: `col - row > k`)
    /// of each matrix (the last two dimensions) zeroed.
    TrilKernel, "tril", |i, j, k| j.saturating_sub(i) <= k
);
triangle_kernel!(
    /// `triu`: as `tril`, zeroing the elements below diagonal `k` (`col - row < k`).
    TriuKernel, "triu", |i, j, k| j.saturating_sub(i) >= k
);

/// `one_hot`: input `x` of `i64` class indices, any shape; integer parameter 0 is the
/// number of classes `C` (at least 0). The output is `i64` of `x`'s shape plus a last
/// dimension `C`: 1 at `[..., x[...]]`, 0 elsewhere. An index outside `0..C` fails the
/// kernel (PyTorch raises).
#[derive(Debug, Clone, Copy, Default)]
pub struct OneHotKernel;

fn classes(attrs: &Attrs) -> Result<usize, String> {
    let c = attrs.params().int_or(0, -1);
    usize::try_from(c).map_err(|_| format!("one_hot: the number of classes is {c}: it must be at least 0"))
}

impl OpKernel for OneHotKernel {
    fn name(&self) -> &'static str {
        "one_hot"
    }

    fn dtypes(&self) -> &'static [DType] {
        &[DType::I64]
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        if inputs[0].dtype != DType::I64 {
            return Err(format!("input 0 is {}: one_hot takes i64 class indices", inputs[0].dtype));
        }
        let mut shape = inputs[0].shape.clone();
        shape.push(classes(attrs)?);
        outputs.push(OutSpec { shape, dtype: DType::I64 });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        expect_count(ctx, 1)?;
        let c = classes(&ctx.attrs)?;
        let (x, out) = (input(ctx, 0)?, output(ctx, 0)?);
        let a = Operand::input(x.meta, x.data, 0, DType::I64)?;
        let o = Operand::output(out.meta, out.data, 0, DType::I64)?;
        if o.shape.split_last().map(|(&l, rest)| (l, rest)) != Some((c, a.shape)) {
            return Err(format!(
                "input 0 is {} but the output is {}: expected the input's shape and {c} classes",
                x.meta.describe(),
                out.meta.describe()
            ));
        }
        // Check every index before writing: a failed call writes nothing.
        if a.numel > 0 {
            let pa = a.first.cast::<i64>();
            let mut bad = None;
            walk(a.shape, &[strides_over(&a, a.shape)], |_, at, st, n| {
                for i in 0..n as isize {
                    // SAFETY: an element of the checked layout.
                    let v = unsafe { pa.offset(at[0] + i * st[0]).read() };
                    if bad.is_none() && (v < 0 || v as u64 >= c as u64) {
                        bad = Some(v);
                    }
                }
            });
            if let Some(v) = bad {
                return Err(format!("one_hot: class index {v} is outside 0..{c} (num_classes={c})"));
            }
        }
        if o.numel == 0 {
            return Ok(());
        }
        // The output is new or given; an input in its storage is read from a copy.
        let staged =
            if share(&a, x.data, &o, out.data) != Share::Disjoint { Some(Staged::new(&a)?) } else { None };
        let a = staged.as_ref().map_or(a, Staged::operand);
        let (po, pa) = (o.first.cast::<i64>(), a.first.cast::<i64>());
        let mut sa = strides_over(&a, a.shape);
        sa.push(0);
        walk(o.shape, &[strides_over(&o, o.shape), sa], |_, at, st, n| {
            // SAFETY: an element of the checked (or staged) input, read once per row.
            let v = unsafe { pa.offset(at[1]).read() };
            for j in 0..n as isize {
                // SAFETY: an element of the checked output layout.
                unsafe { po.offset(at[0] + j * st[0]).write(i64::from(v == j as i64)) };
            }
        });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, compute_raw, infer_err, run_with, t_f32, t_i64};

    fn diag(k: i64) -> Attrs {
        Attrs::default().with_params(&[k], &[]).unwrap()
    }

    #[test]
    fn tril_and_triu_of_a_batch() {
        let x = || t_f32(&[2, 2, 3], &[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0]);
        let out = run_with(&TrilKernel, diag(0), vec![x()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [1.0, 0.0, 0.0, 4.0, 5.0, 0.0, 7.0, 0.0, 0.0, 10.0, 11.0, 0.0]);
        let out = run_with(&TriuKernel, diag(1), vec![x()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [0.0, 2.0, 3.0, 0.0, 0.0, 6.0, 0.0, 8.0, 9.0, 0.0, 0.0, 12.0]);
        let out = run_with(&TrilKernel, diag(-1), vec![x()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), [0.0, 0.0, 0.0, 4.0, 0.0, 0.0, 0.0, 0.0, 0.0, 10.0, 0.0, 0.0]);
        // In place on a transposed view.
        let m = t_i64(&[2, 2], &[1, 2, 3, 4]);
        let mt = m.0.with_layout(&[2, 2], &[1, 2], 0);
        compute_raw(&TriuKernel, diag(0), &[(&mt, &m.1)], (&mt, &m.1)).unwrap();
        // mt = [[1, 3], [2, 4]] -> [[1, 3], [0, 4]]; m = [[1, 0], [3, 4]].
        assert_eq!(as_i64(&m), [1, 0, 3, 4]);
        assert!(infer_err(&TrilKernel, &[&t_f32(&[3], &[0.0; 3]).0], &[]).contains("at least 2 dimensions"));
    }

    /// `one_hot` takes no parameterless probe (`framework::ops_table`): its declared dtypes
    /// are checked here.
    #[test]
    fn one_hot_accepts_the_dtypes_it_declares() {
        for d in DType::ALL {
            let x = TensorMeta::new(&[2], d, crate::ep::DeviceId::CPU);
            let mut specs = OutSpecs::new();
            let ok = OneHotKernel.infer(&[&x], &[], &diag(3), &mut specs).is_ok();
            assert_eq!(ok, OneHotKernel.dtypes().contains(&d), "{d}");
        }
    }

    #[test]
    fn one_hot_rows() {
        let x = t_i64(&[2, 2], &[0, 2, 1, 2]);
        let out = run_with(&OneHotKernel, diag(3), vec![x], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[2, 2, 3]);
        assert_eq!(as_i64(&out[0]), [1, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 1]);
        let err = run_with(&OneHotKernel, diag(2), vec![t_i64(&[2], &[0, 2])], &[]).unwrap_err();
        assert_eq!(err, "one_hot: class index 2 is outside 0..2 (num_classes=2)");
        let err = run_with(&OneHotKernel, diag(2), vec![t_i64(&[1], &[-1])], &[]).unwrap_err();
        assert!(err.contains("class index -1"));
        let out = run_with(&OneHotKernel, diag(4), vec![t_i64(&[0], &[])], &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[0, 4]);
        assert!(infer_err(&OneHotKernel, &[&t_f32(&[1], &[0.0]).0], &[]).contains("i64"));
    }
}
