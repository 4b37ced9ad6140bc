//! Attention: `scaled_dot_product_attention`, one kernel over `[.., L, E]` operands.

use smallvec::SmallVec;

use super::bmm::batch_strides;
use super::conv::{buffer, Real};
use super::dtype::{dispatch, Bool8, Elem, Ring};
use super::iter::{share, Operand, Share, Staged};
use super::loops::{input, output};
use super::{check_dtype, count_error, refusal, Dtypes};
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Scalar, Shape, TensorMeta};

/// `scaled_dot_product_attention`: inputs `q: [*Bq, L, E]`, `k: [*Bk, S, E]`,
/// `v: [*Bk, S, Ev]` of one floating dtype and, optionally, a mask (`bool`, or the
/// inputs' dtype) that broadcasts to `[*B, L, S]`; output `[*B, L, Ev]`, `B` the shape the
/// batch dimensions of `q`, `k` and `v` broadcast to. For each batch index and row `i`:
///
/// 1. `s[j] = scale · sum over e of q[i, e] · k[j, e]`, adding in increasing `e`;
/// 2. with `is_causal`, `s[j] = -∞` for `j > i` (PyTorch's top-left aligned lower
///    triangle); a `bool` mask sets `s[j] = -∞` where it is false (true takes part); a
///    floating mask is added;
/// 3. `p[j] = exp(s[j] - max s) / sum over j of exp(s[j] - max s)`, the sum in increasing
///    `j` (a row whose every score is `-∞` gives NaN, as PyTorch's math reference does);
/// 4. `out[i, d] = sum over j of p[j] · v[j, d]`, adding in increasing `j`.
///
/// All in `f32` for `f16`, `bf16` and `f32` (each output rounded once) and in `f64` for
/// `f64`: the same bits whatever the threads or the machine. The parameter list: integers
/// `[is_causal]` (0 or 1), scalars `[scale]` (a float). Operands of any layout, broadcast
/// batch dimensions read with stride 0.
#[derive(Debug, Clone, Copy, Default)]
pub struct AttentionKernel;

/// The call's `(is_causal, scale)`.
fn params(attrs: &Attrs) -> Result<(bool, f64), String> {
    let p = attrs.params();
    match (p.ints(), p.scalars()) {
        ([c], [Scalar::Float(s)]) if (0..=1).contains(c) => Ok((*c == 1, *s)),
        _ => Err(format!(
            "scaled_dot_product_attention takes the parameters ints=[is_causal (0 or 1)], \
             scalars=[scale (a float)], got {p}"
        )),
    }
}

/// The output shape and dtype, or why the call is refused.
fn attention_shape(inputs: &[&TensorMeta], attrs: &Attrs) -> Result<(Shape, DType), String> {
    const OP: &str = "scaled_dot_product_attention";
    if !(3..=4).contains(&inputs.len()) {
        return Err(format!("{} (q, k, v and an optional mask)", count_error(3, inputs.len())));
    }
    let (causal, _) = params(attrs)?;
    let dtype = inputs[0].dtype;
    check_dtype(OP, dtype, Dtypes::Floating)?;
    for (i, t) in inputs.iter().enumerate().take(3) {
        if t.dtype != dtype {
            return Err(format!("input {i} is {} but input 0 is {dtype}: cast to one dtype first", t.dtype));
        }
        if t.shape.len() < 2 {
            return Err(format!("input {i} is {}: {OP} takes inputs of at least 2 dimensions", t.describe()));
        }
    }
    let (q, k, v) = (inputs[0], inputs[1], inputs[2]);
    let last = |t: &TensorMeta| (t.shape[t.shape.len() - 2], t.shape[t.shape.len() - 1]);
    let ((l, e), (s, ek), (sv, ev)) = (last(q), last(k), last(v));
    if e != ek {
        return Err(format!(
            "input 0 is {} and input 1 is {}: q and k differ in their last dimension ({e} != {ek})",
            q.describe(),
            k.describe()
        ));
    }
    if s != sv {
        return Err(format!(
            "input 1 is {} and input 2 is {}: k and v differ in their sequence length ({s} != {sv})",
            k.describe(),
            v.describe()
        ));
    }
    let batches =
        [&q.shape[..q.shape.len() - 2], &k.shape[..k.shape.len() - 2], &v.shape[..v.shape.len() - 2]];
    let rank = batches.iter().map(|b| b.len()).max().unwrap_or(0);
    let mut shape = Shape::with_capacity(rank + 2);
    for d in 0..rank {
        let mut size = 1;
        for (i, b) in batches.iter().enumerate() {
            let x = (d + b.len()).checked_sub(rank).map_or(1, |at| b[at]);
            if x != 1 && size != 1 && x != size {
                return Err(format!(
                    "input {i} is {}: its batch dimensions do not broadcast with the others' (batch \
                     dimension {d}: {x} against {size})",
                    inputs[i].describe()
                ));
            }
            if x != 1 {
                size = x;
            }
        }
        shape.push(size);
    }
    if let Some(m) = inputs.get(3) {
        if causal {
            return Err("a mask and is_causal both given: pass one of them".into());
        }
        if m.dtype != DType::Bool && m.dtype != dtype {
            return Err(format!(
                "input 3 (the mask) is {}: a mask is bool or of the inputs' dtype ({dtype})",
                m.dtype
            ));
        }
        let mut full = shape.clone();
        full.push(l);
        full.push(s);
        if !super::iter::fits(&m.shape, &full) {
            return Err(format!(
                "input 3 (the mask) is {}: it does not broadcast to the scores' shape {full:?}",
                m.describe()
            ));
        }
    }
    shape.push(l);
    shape.push(ev);
    Ok((shape, dtype))
}

impl OpKernel for AttentionKernel {
    fn name(&self) -> &'static str {
        "scaled_dot_product_attention"
    }

    fn dtypes(&self) -> &'static [DType] {
        Dtypes::Floating.list()
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        _given: &[&TensorMeta],
        attrs: &Attrs,
        outputs: &mut OutSpecs,
    ) -> Result<(), String> {
        let (shape, dtype) = attention_shape(inputs, attrs)?;
        outputs.push(OutSpec { shape, dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let metas: Vec<&TensorMeta> = ctx.inputs.iter().map(|t| t.meta).collect();
        let (shape, dtype) = attention_shape(&metas, &ctx.attrs)?;
        let (causal, scale) = params(&ctx.attrs)?;
        dispatch!(
            dtype,
            floating,
            T => attend::<T>(ctx, &shape, causal, scale),
            Err(refusal("scaled_dot_product_attention", dtype, Dtypes::Floating))
        )
    }
}

/// A matrix of an operand: its first element's offset (per batch index, added) and its row
/// and column strides.
struct Rows {
    first: *const u8,
    batch: SmallVec<[isize; 6]>,
    rs: isize,
    cs: isize,
}

impl Rows {
    fn of(t: &Operand<'_>, batch: &[usize]) -> Rows {
        let r = t.shape.len();
        Rows { first: t.first, batch: batch_strides(t, batch), rs: t.strides[r - 2], cs: t.strides[r - 1] }
    }

    /// A mask of any rank broadcast to `[*batch, L, S]` (stride 0 along a dimension it has
    /// as 1 or lacks).
    fn mask(t: &Operand<'_>, batch: &[usize]) -> Rows {
        let full = batch.len() + 2;
        let stride = |d: usize| match (d + t.shape.len()).checked_sub(full) {
            Some(i) if t.shape[i] != 1 => t.strides[i],
            _ => 0,
        };
        Rows {
            first: t.first,
            batch: (0..batch.len()).map(stride).collect(),
            rs: stride(full - 2),
            cs: stride(full - 1),
        }
    }

    /// Element `(i, j)` of the matrix at batch offset `at`, as `T`.
    ///
    /// # Safety
    /// `(i, j)` and the batch index that gave `at` lie within the operand's (broadcast)
    /// shape, whose layout was checked.
    #[inline(always)]
    unsafe fn get<T: Elem>(&self, at: isize, i: usize, j: usize) -> T {
        let off = at + i as isize * self.rs + j as isize * self.cs;
        // SAFETY: the caller's contract.
        unsafe { self.first.cast::<T>().offset(off).read() }
    }
}

fn attend<T: Elem>(ctx: &KernelCtx<'_, '_>, shape: &[usize], causal: bool, scale: f64) -> Result<(), String>
where
    T::C: Real,
{
    let out = output(ctx, 0)?;
    let o = Operand::output(out.meta, out.data, 0, T::DTYPE)?;
    if o.shape != shape {
        return Err(format!(
            "output 0 is {} but scaled_dot_product_attention produces {shape:?}",
            out.meta.describe()
        ));
    }
    if o.numel == 0 {
        return Ok(());
    }
    // Inputs in the output's memory (a caller that skipped the builder's checks) are read
    // from copies made first.
    let mut staged = Vec::new();
    for i in 0..ctx.inputs.len() {
        let t = input(ctx, i)?;
        let dt = if i == 3 { t.meta.dtype } else { T::DTYPE };
        let op = Operand::input(t.meta, t.data, i, dt)?;
        staged.push(if share(&op, t.data, &o, out.data) == Share::Disjoint {
            None
        } else {
            Some(Staged::new(&op)?)
        });
    }
    let mut ops = Vec::new();
    for (i, s) in staged.iter().enumerate() {
        let t = input(ctx, i)?;
        let dt = if i == 3 { t.meta.dtype } else { T::DTYPE };
        ops.push(match s {
            Some(s) => s.operand(),
            None => Operand::input(t.meta, t.data, i, dt)?,
        });
    }
    let r = shape.len();
    let batch = &shape[..r - 2];
    let (l, ev) = (shape[r - 2], shape[r - 1]);
    let (q, k, v) = (Rows::of(&ops[0], batch), Rows::of(&ops[1], batch), Rows::of(&ops[2], batch));
    let e = ops[0].shape[ops[0].shape.len() - 1];
    let s = ops[1].shape[ops[1].shape.len() - 2];
    let mask = ops.get(3).map(|m| (Rows::mask(m, batch), m.dtype == DType::Bool));
    let dst = Rows::of(&o, batch);
    let scale = T::C::of_f64(scale);
    let mut scores = buffer::<T::C>(s, "the attention scores")?;
    let mut acc = buffer::<T::C>(ev, "an attention row")?;
    // Each batch element's `k`, `v` and each query row, in the compute type and row-major,
    // so that the loops below read memory in order (the sums' order is unchanged). `k` and
    // `v` hold `s · e` and `s · ev` elements (no batch is empty here: the output is not).
    let mut kbuf = buffer::<T::C>(s * e, "a copy of k")?;
    let mut vbuf = buffer::<T::C>(s * ev, "a copy of v")?;
    let mut qrow = buffer::<T::C>(e, "a query row")?;
    let zero = <T::C as Ring>::ZERO;
    let mut index: SmallVec<[usize; 6]> = SmallVec::from_elem(0, batch.len());
    // Each operand's offset for the batch index; the mask's last.
    let mut at = [0isize; 5];
    loop {
        for j in 0..s {
            for c in 0..e {
                // SAFETY: indices within `k`'s shape (`attention_shape`).
                kbuf[j * e + c] = unsafe { k.get::<T>(at[1], j, c) }.load();
            }
            for d in 0..ev {
                // SAFETY: indices within `v`'s shape.
                vbuf[j * ev + d] = unsafe { v.get::<T>(at[2], j, d) }.load();
            }
        }
        for i in 0..l {
            for (c, x) in qrow.iter_mut().enumerate() {
                // SAFETY: indices within `q`'s shape.
                *x = unsafe { q.get::<T>(at[0], i, c) }.load();
            }
            for (j, sc) in scores.iter_mut().enumerate() {
                let mut dot = zero;
                for (&a, &b) in qrow.iter().zip(&kbuf[j * e..(j + 1) * e]) {
                    dot = dot + a * b;
                }
                let mut x = dot * scale;
                if causal && j > i {
                    x = T::C::NEG_INF;
                }
                if let Some((m, boolean)) = &mask {
                    if *boolean {
                        // SAFETY: indices within the mask broadcast to the scores' shape.
                        if unsafe { m.get::<Bool8>(at[4], i, j) }.0 == 0 {
                            x = T::C::NEG_INF;
                        }
                    } else {
                        // SAFETY: as above.
                        x = x + unsafe { m.get::<T>(at[4], i, j) }.load();
                    }
                }
                *sc = x;
            }
            // The row's largest score (NaN where one is NaN, which then spreads to the row).
            let mut max = T::C::NEG_INF;
            for &x in scores.iter() {
                if x > max || x.nan() {
                    max = x;
                }
            }
            let mut sum = zero;
            for x in scores.iter_mut() {
                *x = (*x - max).exp();
                sum = sum + *x;
            }
            acc.fill(zero);
            for (j, &x) in scores.iter().enumerate() {
                let p = x / sum;
                for (a, &y) in acc.iter_mut().zip(&vbuf[j * ev..(j + 1) * ev]) {
                    *a = *a + p * y;
                }
            }
            for (d, &a) in acc.iter().enumerate() {
                let off = at[3] + i as isize * dst.rs + d as isize * dst.cs;
                // SAFETY: an element of the output (its checked layout), which no input shares
                // (staged); the instruction holds the write access to its storage.
                unsafe { o.first.cast::<T>().offset(off).write(T::store(a)) };
            }
        }
        // The next batch index, row-major.
        let strides = |d: usize| {
            [q.batch[d], k.batch[d], v.batch[d], dst.batch[d], mask.as_ref().map_or(0, |(m, _)| m.batch[d])]
        };
        let mut d = batch.len();
        loop {
            if d == 0 {
                return Ok(());
            }
            d -= 1;
            index[d] += 1;
            let st = strides(d);
            for (a, s) in at.iter_mut().zip(st) {
                *a += s;
            }
            if index[d] < batch[d] {
                break;
            }
            for (a, s) in at.iter_mut().zip(st) {
                *a -= s * batch[d] as isize;
            }
            index[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::testing::{as_f32, run_with, t_f32, tensor};

    fn attrs(causal: bool, scale: f64) -> Attrs {
        Attrs::default().with_params(&[i64::from(causal)], &[Scalar::Float(scale)]).unwrap()
    }

    fn vals(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32 + seed) * 0.73).sin()).collect()
    }

    /// Attention of row-major `[b, l, e]`, `[b, s, e]`, `[b, s, ev]` in `f64`, with an
    /// additive `[l, s]` bias.
    fn naive(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        (b, l, s, e, ev): (usize, usize, usize, usize, usize),
        bias: &[f64],
        scale: f64,
    ) -> Vec<f64> {
        let mut out = vec![0.0; b * l * ev];
        for bi in 0..b {
            for i in 0..l {
                let sc: Vec<f64> = (0..s)
                    .map(|j| {
                        let d: f64 = (0..e)
                            .map(|c| f64::from(q[(bi * l + i) * e + c]) * f64::from(k[(bi * s + j) * e + c]))
                            .sum();
                        d * scale + bias[i * s + j]
                    })
                    .collect();
                let m = sc.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                let ex: Vec<f64> = sc.iter().map(|x| (x - m).exp()).collect();
                let tot: f64 = ex.iter().sum();
                for d in 0..ev {
                    out[(bi * l + i) * ev + d] =
                        (0..s).map(|j| ex[j] / tot * f64::from(v[(bi * s + j) * ev + d])).sum();
                }
            }
        }
        out
    }

    #[test]
    fn attention_matches_the_naive_one() {
        let (b, l, s, e, ev) = (2, 3, 4, 5, 2);
        let (qv, kv, vv) = (vals(b * l * e, 0.0), vals(b * s * e, 1.0), vals(b * s * ev, 2.0));
        let ins = || vec![t_f32(&[b, l, e], &qv), t_f32(&[b, s, e], &kv), t_f32(&[b, s, ev], &vv)];
        let scale = 1.0 / (e as f64).sqrt();
        let check = |got: Vec<f32>, bias: &[f64]| {
            for (g, w) in got.iter().zip(naive(&qv, &kv, &vv, (b, l, s, e, ev), bias, scale)) {
                assert!((f64::from(*g) - w).abs() < 1e-5, "{g} against {w}");
            }
        };
        check(as_f32(&run_with(&AttentionKernel, attrs(false, scale), ins(), &[]).unwrap()[0]), &[0.0; 12]);
        let causal: Vec<f64> = (0..12).map(|x| if x % 4 > x / 4 { f64::NEG_INFINITY } else { 0.0 }).collect();
        check(as_f32(&run_with(&AttentionKernel, attrs(true, scale), ins(), &[]).unwrap()[0]), &causal);
        // A bool mask of [s], broadcast to every row.
        let mut with_mask = ins();
        with_mask.push(tensor(&[s], &[true, false, true, true]));
        let bias: Vec<f64> = (0..12).map(|x| if x % 4 == 1 { f64::NEG_INFINITY } else { 0.0 }).collect();
        check(as_f32(&run_with(&AttentionKernel, attrs(false, scale), with_mask, &[]).unwrap()[0]), &bias);
        // An additive mask of [l, s].
        let add: Vec<f32> = vals(12, 5.0);
        let mut with_mask = ins();
        with_mask.push(t_f32(&[l, s], &add));
        let bias: Vec<f64> = add.iter().map(|&x| f64::from(x)).collect();
        check(as_f32(&run_with(&AttentionKernel, attrs(false, scale), with_mask, &[]).unwrap()[0]), &bias);
    }

    /// Keys and values without batch dimensions serve every query batch (stride 0), and a
    /// transposed query is read as it lies.
    #[test]
    fn broadcast_and_strided_operands() {
        let (b, l, s, e, ev) = (2, 3, 4, 2, 3);
        let (qv, kv, vv) = (vals(b * l * e, 0.0), vals(s * e, 1.0), vals(s * ev, 2.0));
        // q stored as [b, e, l], viewed as [b, l, e].
        let mut stored = vec![0.0; b * l * e];
        for bi in 0..b {
            for i in 0..l {
                for c in 0..e {
                    stored[(bi * e + c) * l + i] = qv[(bi * l + i) * e + c];
                }
            }
        }
        let mut q = t_f32(&[b, e, l], &stored);
        q.0.shape = [b, l, e].into_iter().collect();
        q.0.strides = [(l * e) as isize, 1, l as isize].into_iter().collect();
        let ins = vec![q, t_f32(&[s, e], &kv), t_f32(&[s, ev], &vv)];
        let out = run_with(&AttentionKernel, attrs(false, 0.5), ins, &[]).unwrap();
        assert_eq!(out[0].0.shape.as_slice(), &[b, l, ev]);
        let (k2, v2) = ([kv.clone(), kv].concat(), [vv.clone(), vv].concat());
        for (g, w) in as_f32(&out[0]).iter().zip(naive(&qv, &k2, &v2, (b, l, s, e, ev), &[0.0; 12], 0.5)) {
            assert!((f64::from(*g) - w).abs() < 1e-5, "{g} against {w}");
        }
    }

    /// `infer` accepts exactly the declared dtypes (the registry's probe cannot call it
    /// without its parameters); the mask may be `bool` besides.
    #[test]
    fn infer_accepts_the_declared_dtypes() {
        use crate::ep::DeviceId;
        let takes = |d: DType, mask: Option<DType>| {
            let t = TensorMeta::new(&[2, 2], d, DeviceId::CPU);
            let m = mask.map(|m| TensorMeta::new(&[2, 2], m, DeviceId::CPU));
            let mut ins = vec![&t, &t, &t];
            ins.extend(m.as_ref());
            AttentionKernel.infer(&ins, &[], &attrs(false, 1.0), &mut OutSpecs::new()).is_ok()
        };
        let accepted: Vec<DType> = DType::ALL.into_iter().filter(|&d| takes(d, None)).collect();
        assert_eq!(accepted, AttentionKernel.dtypes());
        assert!(takes(DType::F16, Some(DType::Bool)) && takes(DType::F16, Some(DType::F16)));
        assert!(!takes(DType::F16, Some(DType::F32)) && !takes(DType::F32, Some(DType::I64)));
    }

    #[test]
    fn a_fully_masked_row_is_nan() {
        let ins = vec![
            t_f32(&[1, 1], &[1.0]),
            t_f32(&[1, 1], &[1.0]),
            t_f32(&[1, 1], &[2.0]),
            tensor(&[1, 1], &[false]),
        ];
        let out = run_with(&AttentionKernel, attrs(false, 1.0), ins, &[]).unwrap();
        assert!(as_f32(&out[0])[0].is_nan());
    }
}
