//! Elementwise kernels: `fill`, `copy`, `add`, `mul`, `scale`, `relu`.

use super::{common_dtype, expect_inputs, input, input_dtype, output, output_dtype, spec_of, with_num, Num};
use crate::alloc::Storage;
use crate::vm::{Attrs, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// `fill`: no inputs; sets every element of the one output, whose shape and dtype the
/// caller gives, to `attrs.scalar` (cast with `as`: `i64` truncates toward zero).
#[derive(Debug, Clone, Copy, Default)]
pub struct FillKernel;

impl OpKernel for FillKernel {
    fn name(&self) -> &'static str {
        "fill"
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

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let scalar = ctx.attrs.float();
        with_num!(output_dtype(ctx, 0)?, T => {
            output::<T>(ctx, 0)?.1.fill(T::from_scalar(scalar));
            Ok(())
        })
    }
}

/// `copy`: one input, one output of the same shape and dtype holding the same values, each
/// in any layout. The input may live on another device than the stream (host to device and
/// back); here both sides are host-addressable memory. Works in place: an output that shares
/// its storage with the input is written from a copy of the input's elements.
#[derive(Debug, Clone, Copy, Default)]
pub struct CopyKernel;

impl OpKernel for CopyKernel {
    fn name(&self) -> &'static str {
        "copy"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        expect_inputs(inputs, 1)?;
        outputs.push(spec_of(inputs[0]));
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

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let src = ctx.inputs.first().ok_or("missing input 0")?;
        let dst = ctx.outputs.first().ok_or("missing output 0")?;
        if src.meta.dtype != dst.meta.dtype || src.meta.shape != dst.meta.shape {
            return Err(format!(
                "input 0 is {} but output 0 is {}",
                src.meta.describe(),
                dst.meta.describe()
            ));
        }
        for (what, v, len) in [("input 0", src.meta, src.data.len()), ("output 0", dst.meta, dst.data.len())]
        {
            let elems = len / v.dtype.size();
            v.check_layout(elems).map_err(|e| format!("{what}: {e}"))?;
        }
        strided_copy(src.meta, src.data, dst.meta, dst.data);
        Ok(())
    }
}

/// Copy the elements `src`'s layout names in `from` to those `dst`'s names in `to` (one
/// dtype, one shape; both layouts checked against their storages), in row-major order of
/// the index. Contiguous runs are copied whole; storages shared with the output are read
/// from a copy first, so that an overlap cannot change what is read.
pub(crate) fn strided_copy(src: &TensorMeta, from: &Storage, dst: &TensorMeta, to: &Storage) {
    let size = src.dtype.size();
    let n = src.numel();
    if n == 0 {
        return;
    }
    let staged;
    let (from_ptr, src_meta): (*const u8, std::borrow::Cow<'_, TensorMeta>) =
        if std::ptr::eq(from.as_ptr(), to.as_ptr()) && !from.is_empty() {
            // Shared storage: gather the input first (in index order), then scatter.
            let mut buf = vec![0u8; n * size];
            gather(src, from.as_ptr(), size, buf.as_mut_ptr());
            staged = buf;
            (staged.as_ptr(), std::borrow::Cow::Owned(TensorMeta::new(&src.shape, src.dtype, src.device)))
        } else {
            (from.as_ptr(), std::borrow::Cow::Borrowed(src))
        };
    let (rank, src_meta) = (dst.shape.len(), &*src_meta);
    // Both contiguous: one run.
    if src_meta.is_contiguous() && dst.is_contiguous() {
        // SAFETY: both layouts were checked against their storages (the caller), so `n`
        // elements from each offset lie inside them; the output is written by this
        // instruction alone and the input was staged if it shares the storage.
        unsafe {
            std::ptr::copy_nonoverlapping(
                from_ptr.add(src_meta.offset * size),
                to.as_mut_ptr().add(dst.offset * size),
                n * size,
            )
        };
        return;
    }
    let mut index = vec![0usize; rank];
    for _ in 0..n {
        let (mut a, mut b) = (src_meta.offset as isize, dst.offset as isize);
        for ((&i, &sa), &sb) in index.iter().zip(&src_meta.strides).zip(&dst.strides) {
            a += i as isize * sa;
            b += i as isize * sb;
        }
        // SAFETY: as above: every index within the shape names an element inside each
        // storage (checked layouts).
        unsafe {
            std::ptr::copy_nonoverlapping(
                from_ptr.offset(a * size as isize),
                to.as_mut_ptr().offset(b * size as isize),
                size,
            )
        };
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < dst.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// The elements `m` names at `from` (elements of `size` bytes) into `out`, contiguous, in
/// row-major order of the index.
fn gather(m: &TensorMeta, from: *const u8, size: usize, out: *mut u8) {
    let rank = m.shape.len();
    let mut index = vec![0usize; rank];
    for k in 0..m.numel() {
        let a =
            m.offset as isize + index.iter().zip(&m.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
        // SAFETY: the layout was checked against its storage by the caller; `out` holds
        // `numel * size` bytes.
        unsafe { std::ptr::copy_nonoverlapping(from.offset(a * size as isize), out.add(k * size), size) };
        for d in (0..rank).rev() {
            index[d] += 1;
            if index[d] < m.shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
}

/// Defines a kernel over two inputs of one shape and dtype that combines them element by
/// element: `binary_kernel!(doc, Name, "op", T => |a: T, b: T| -> T)`, where `T` is the
/// element type (any [`Num`]).
macro_rules! binary_kernel {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $t:ident => $f:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                _given: &[&TensorMeta],
                _attrs: &Attrs,
                outputs: &mut OutSpecs,
            ) -> Result<(), String> {
                $crate::kernels::elementwise::infer_binary(inputs, outputs)
            }

            fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                with_num!(input_dtype(ctx, 0)?, $t => $crate::kernels::elementwise::zip::<$t>(ctx, $f))
            }
        }
    };
}
pub(crate) use binary_kernel;

binary_kernel!(
    /// `add`: two inputs of one shape and dtype, elementwise sum (wrapping for `i64`).
    AddKernel, "add", T => T::plus
);

binary_kernel!(
    /// `mul`: two inputs of one shape and dtype, elementwise product (wrapping for `i64`).
    MulKernel, "mul", T => T::times
);

/// `scale`: one input, output `x * attrs.scalar`. The scalar is cast to the dtype first
/// (`as`), so an `i64` tensor is multiplied by the scalar truncated toward zero, wrapping.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScaleKernel;

impl OpKernel for ScaleKernel {
    fn name(&self) -> &'static str {
        "scale"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        infer_unary(inputs, outputs)
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let scalar = ctx.attrs.float();
        with_num!(input_dtype(ctx, 0)?, T => {
            let s = T::from_scalar(scalar);
            map::<T>(ctx, |x| x.times(s))
        })
    }
}

/// `relu`: one input, output `max(x, 0)`. Negative values become 0; NaN stays NaN (as in
/// the usual frameworks) and `-0.0` stays `-0.0`.
#[derive(Debug, Clone, Copy, Default)]
pub struct ReluKernel;

impl OpKernel for ReluKernel {
    fn name(&self) -> &'static str {
        "relu"
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        _attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        infer_unary(inputs, outputs)
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        with_num!(input_dtype(ctx, 0)?, T => {
            map::<T>(ctx, |x| if x < T::ZERO { T::ZERO } else { x })
        })
    }
}

/// One input; the output is like it.
fn infer_unary(inputs: &[&TensorMeta], outputs: &mut OutSpecs) -> Result<(), String> {
    expect_inputs(inputs, 1)?;
    outputs.push(spec_of(inputs[0]));
    Ok(())
}

/// Two inputs of one dtype and one shape; the output is like them.
pub(super) fn infer_binary(inputs: &[&TensorMeta], outputs: &mut OutSpecs) -> Result<(), String> {
    expect_inputs(inputs, 2)?;
    common_dtype(inputs)?;
    let (a, b) = (inputs[0], inputs[1]);
    if a.shape != b.shape {
        return Err(format!(
            "input 0 is {} and input 1 is {}: shapes must be equal (no broadcasting)",
            a.describe(),
            b.describe()
        ));
    }
    outputs.push(spec_of(a));
    Ok(())
}

/// `out[i] = f(x[i])`.
fn map<T: Num>(ctx: &mut KernelCtx<'_, '_>, f: impl Fn(T) -> T) -> Result<(), String> {
    let x = input::<T>(ctx, 0)?;
    let (meta, out) = output::<T>(ctx, 0)?;
    if out.len() != x.len() {
        return Err(format!("output 0 is {} but input 0 has {} elements", meta.describe(), x.len()));
    }
    for (o, &v) in out.iter_mut().zip(x) {
        *o = f(v);
    }
    Ok(())
}

/// `out[i] = f(a[i], b[i])`.
pub(super) fn zip<T: Num>(ctx: &mut KernelCtx<'_, '_>, f: impl Fn(T, T) -> T) -> Result<(), String> {
    let a = input::<T>(ctx, 0)?;
    let b = input::<T>(ctx, 1)?;
    let (meta, out) = output::<T>(ctx, 0)?;
    if a.len() != b.len() || out.len() != a.len() {
        return Err(format!(
            "output 0 is {} but the inputs have {} and {} elements",
            meta.describe(),
            a.len(),
            b.len()
        ));
    }
    for ((o, &x), &y) in out.iter_mut().zip(a).zip(b) {
        *o = f(x, y);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, as_i64, infer_err, run, t_f32, t_i64, Owned};
    use crate::vm::{TensorView, TensorViewMut};

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
    }

    #[test]
    fn fill_overwrites_reused_storage() {
        // `run` allocates outputs fresh; check that fill writes every element even when the
        // storage already holds something, as a reused tensor's does.
        let (meta, mut data) = t_f32(&[3], &[1.0, 2.0, 3.0]);
        let mut outs = [TensorViewMut { meta: &meta, data: &mut data }];
        let mut ctx = KernelCtx { attrs: Attrs::scalar(0.5), inputs: &[], outputs: &mut outs };
        FillKernel.compute(&mut ctx).unwrap();
        assert_eq!(data.as_f32(), &[0.5; 3]);
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
    fn copy_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        assert_eq!(infer_err(&CopyKernel, &[], &[]), "expected 1 input, got 0");
        assert_eq!(infer_err(&CopyKernel, &[&x, &x], &[]), "expected 1 input, got 2");
    }

    #[test]
    fn add_mul_values_both_dtypes() {
        let a = || t_f32(&[2, 2], &[1.0, -2.0, 0.5, 4.0]);
        let b = || t_f32(&[2, 2], &[3.0, 2.0, 0.25, -1.0]);
        let out = run(&AddKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![4.0, 0.0, 0.75, 3.0]);
        let out = run(&MulKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![3.0, -4.0, 0.125, -4.0]);

        let a = || t_i64(&[3], &[1, -2, i64::MAX]);
        let b = || t_i64(&[3], &[5, 3, 2]);
        let out = run(&AddKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![6, 1, i64::MIN + 1]);
        let out = run(&MulKernel, 0.0, vec![a(), b()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![5, -6, -2]);
    }

    #[test]
    fn binary_infer_errors() {
        let f23 = t_f32(&[2, 3], &[0.0; 6]).0;
        let f32_ = t_f32(&[3, 2], &[0.0; 6]).0;
        let i23 = t_i64(&[2, 3], &[0; 6]).0;
        for k in [&AddKernel as &dyn OpKernel, &MulKernel] {
            assert_eq!(infer_err(k, &[&f23], &[]), "expected 2 inputs, got 1");
            assert_eq!(infer_err(k, &[&f23, &i23], &[]), "input 1 is i64 but input 0 is f32");
            assert_eq!(infer_err(k, &[&i23, &f23], &[]), "input 1 is f32 but input 0 is i64");
            assert_eq!(
                infer_err(k, &[&f23, &f32_], &[]),
                "input 0 is f32[2, 3] and input 1 is f32[3, 2]: shapes must be equal \
                 (no broadcasting)"
            );
        }
    }

    #[test]
    fn scale_negative_and_fractional() {
        let x = || t_f32(&[3], &[1.0, -2.0, 4.0]);
        let out = run(&ScaleKernel, -0.5, vec![x()], &[]).unwrap();
        assert_eq!(as_f32(&out[0]), vec![-0.5, 1.0, -2.0]);
        let x = || t_i64(&[3], &[1, -2, i64::MAX]);
        let out = run(&ScaleKernel, -3.0, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![-3, 6, i64::MAX.wrapping_mul(-3)]);
        // i64 multiplies by the scalar truncated toward zero.
        let out = run(&ScaleKernel, 2.9, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![2, -4, -2]);
        let out = run(&ScaleKernel, -0.5, vec![x()], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0; 3]);
    }

    #[test]
    fn relu_both_dtypes() {
        let x = t_f32(&[5], &[-1.0, 0.0, 2.5, f32::NEG_INFINITY, f32::NAN]);
        let out = as_f32(&run(&ReluKernel, 0.0, vec![x], &[]).unwrap()[0]);
        assert_eq!(&out[..4], &[0.0, 0.0, 2.5, 0.0]);
        assert!(out[4].is_nan());
        let x = t_i64(&[4], &[-5, 0, 3, i64::MIN]);
        let out = run(&ReluKernel, 0.0, vec![x], &[]).unwrap();
        assert_eq!(as_i64(&out[0]), vec![0, 0, 3, 0]);
    }

    #[test]
    fn unary_infer_errors() {
        let x = t_f32(&[2], &[0.0; 2]).0;
        for k in [&ScaleKernel as &dyn OpKernel, &ReluKernel] {
            assert_eq!(infer_err(k, &[], &[]), "expected 1 input, got 0");
            assert_eq!(infer_err(k, &[&x, &x], &[]), "expected 1 input, got 2");
        }
    }

    /// Call `compute` directly on hand-made operands, skipping `infer` as a buggy caller
    /// would.
    fn compute_raw(k: &dyn OpKernel, ins: &[&Owned], out: &mut Owned) -> Result<(), String> {
        let views: Vec<TensorView<'_>> = ins.iter().map(|(meta, data)| TensorView { meta, data }).collect();
        let mut outs = [TensorViewMut { meta: &out.0, data: &mut out.1 }];
        k.compute(&mut KernelCtx { attrs: Attrs::default(), inputs: &views, outputs: &mut outs })
    }

    #[test]
    fn compute_refuses_bad_operands_without_panicking() {
        let f2 = t_f32(&[2], &[1.0, 2.0]);
        let i2 = t_i64(&[2], &[1, 2]);
        let mut f3 = t_f32(&[3], &[0.0; 3]);
        let err = compute_raw(&AddKernel, &[&f2, &i2], &mut f3).unwrap_err();
        assert_eq!(err, "input 1 is i64 but the kernel ran for f32");
        let err = compute_raw(&ReluKernel, &[&f2], &mut f3).unwrap_err();
        assert_eq!(err, "output 0 is f32[3] but input 0 has 2 elements");
        let err = compute_raw(&CopyKernel, &[&f2], &mut f3).unwrap_err();
        assert_eq!(err, "input 0 is f32[2] but output 0 is f32[3]");
        let err = compute_raw(&AddKernel, &[&f2], &mut f3).unwrap_err();
        assert_eq!(err, "missing input 1");
        // Storage shorter than the shape.
        f3.0.shape[0] = 100;
        let err = compute_raw(&FillKernel, &[], &mut f3).unwrap_err();
        assert_eq!(err, "output 0 (f32[100]) has storage for only 3 elements");
    }
}
