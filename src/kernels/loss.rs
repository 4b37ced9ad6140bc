//! `nll_loss`: the negative log-likelihood of class indices, the kernel under the front
//! ends' `nll_loss` and `cross_entropy`.
//!
//! **Operands.** Input 0, the log-probabilities `[N, C, d1, ...]` (floating); input 1, the
//! targets `[N, d1, ...]` (`i64` class indices); input 2, where `ints[2]` says it is given,
//! the class weights `[C]` of input 0's dtype.
//!
//! **Parameter list.** `ints` = `[reduction, ignore_index, has_weight]`, `reduction` 0 for
//! `'none'` (the output has the targets' shape), 1 for `'mean'`, 2 for `'sum'` (a 0-d
//! output).
//!
//! Each target `t` that is not `ignore_index` gives the loss `-w[t] * x[t]` and the weight
//! `w[t]` (1 without weights); an ignored one gives 0 and 0. `'sum'` adds the losses,
//! `'mean'` divides that by the sum of the weights (NaN when every target is ignored), both
//! sums in the order of `kernels::sum_f32` over the targets in row-major order, in the
//! compute type. A target outside `0..C` (and not `ignore_index`) fails the call.

use super::dtype::{dispatch, Elem};
use super::iter::Operand;
use super::loops::{copy_elements, expect_count, input, output};
use super::reduce::sum_in_order;
use super::reduce_dims::{for_each_group, room, write_output, Real};
use super::{check_dtype, expect_inputs, refusal, Dtypes};
use crate::vm::{
    contiguous_strides, Attrs, DType, KernelCtx, OpKernel, OutSpec, OutSpecs, Shape, TensorMeta,
};

/// `nll_loss` (module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct NllLossKernel;

/// The parameters: reduction (0, 1, 2), `ignore_index`, whether a weight is given.
fn params(attrs: &Attrs) -> Result<(i64, i64, bool), String> {
    match attrs.params().ints() {
        &[r, ignore, w] if (0..=2).contains(&r) => Ok((r, ignore, w != 0)),
        _ => {
            Err("expected a parameter list [reduction (0 none, 1 mean, 2 sum), ignore_index, has_weight]"
                .into())
        }
    }
}

impl OpKernel for NllLossKernel {
    fn name(&self) -> &'static str {
        "nll_loss"
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
        let (reduction, _, w) = params(attrs)?;
        expect_inputs(inputs, 2 + usize::from(w))?;
        let (x, t) = (inputs[0], inputs[1]);
        check_dtype("nll_loss", x.dtype, Dtypes::Floating)?;
        if x.shape.len() < 2 {
            return Err(format!("input 0 is {}: expected log-probabilities [N, C, ...]", x.describe()));
        }
        if t.dtype != DType::I64 {
            return Err(format!("input 1 is {}: the targets are i64 class indices", t.describe()));
        }
        let want: Shape = x.shape.iter().enumerate().filter(|&(d, _)| d != 1).map(|(_, &n)| n).collect();
        if t.shape != want {
            return Err(format!(
                "input 1 is {} but input 0 is {}: the targets' shape is the input's without dimension 1, {want:?}",
                t.describe(),
                x.describe()
            ));
        }
        if w {
            let m = inputs[2];
            if m.dtype != x.dtype || m.shape.as_slice() != [x.shape[1]] {
                return Err(format!(
                    "input 2 is {} but input 0 is {}: the weight is [{}] of the input's dtype",
                    m.describe(),
                    x.describe(),
                    x.shape[1]
                ));
            }
        }
        let shape = if reduction == 0 { want } else { Shape::new() };
        outputs.push(OutSpec { shape, dtype: x.dtype });
        Ok(())
    }

    fn strided(&self) -> bool {
        true
    }

    fn writes_outputs(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let (reduction, ignore, w) = params(&ctx.attrs)?;
        expect_count(ctx, 2 + usize::from(w))?;
        let dtype = input(ctx, 0)?.meta.dtype;
        dispatch!(dtype, floating, T => nll::<T>(ctx, reduction, ignore, w),
            Err(refusal("nll_loss", dtype, Dtypes::Floating)))
    }
}

/// Input `i`'s elements of `T`, row-major, in a new vector.
fn gather<T: Elem>(ctx: &KernelCtx<'_, '_>, i: usize) -> Result<Vec<T>, String> {
    let t = input(ctx, i)?;
    let a = Operand::input(t.meta, t.data, i, T::DTYPE)?;
    let bytes = a.numel * T::DTYPE.size();
    let mut words: Vec<u64> = Vec::new();
    words.try_reserve_exact(bytes.div_ceil(8)).map_err(|e| format!("no memory for input {i}: {e}"))?;
    words.resize(bytes.div_ceil(8), 0);
    let strides = contiguous_strides(a.shape);
    copy_elements(&Operand::buffer(a.shape, &strides, T::DTYPE, words.as_mut_ptr().cast::<u8>()), &a);
    // SAFETY: the buffer holds `numel` elements of `T`, just copied, aligned to 8 bytes.
    Ok(unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<T>(), a.numel) }.to_vec())
}

fn nll<T: Elem>(ctx: &KernelCtx<'_, '_>, reduction: i64, ignore: i64, w: bool) -> Result<(), String>
where
    T::C: Real,
{
    let x = input(ctx, 0)?;
    if x.meta.shape.len() < 2 {
        return Err(format!("input 0 is {}: expected [N, C, ...]", x.meta.describe()));
    }
    let classes = x.meta.shape[1];
    let a = Operand::input(x.meta, x.data, 0, T::DTYPE)?;
    let targets = gather::<i64>(ctx, 1)?;
    let weight: Option<Vec<T::C>> =
        if w { Some(gather::<T>(ctx, 2)?.into_iter().map(Elem::load).collect()) } else { None };
    if weight.as_ref().is_some_and(|v| v.len() != classes) {
        return Err(format!("input 2 must hold {classes} class weights"));
    }
    let zero = <T::C as Real>::of(0.0);
    let (mut losses, mut weights) = (room::<T::C>(targets.len())?, room::<T::C>(targets.len())?);
    let mut bad: Option<i64> = None;
    let reduced: Vec<bool> = (0..x.meta.shape.len()).map(|d| d == 1).collect();
    for_each_group::<T>(&a, &reduced, |row| {
        let Some(&t) = targets.get(losses.len()) else { return };
        if t == ignore {
            losses.push(zero);
            weights.push(zero);
            return;
        }
        match usize::try_from(t).ok().and_then(|c| row.get(c).map(|v| (c, v.load()))) {
            Some((c, v)) => {
                let wt = weight.as_ref().map_or(<T::C as Real>::of(1.0), |w| w[c]);
                losses.push(-(wt * v));
                weights.push(wt);
            }
            None => {
                bad.get_or_insert(t);
                losses.push(zero);
                weights.push(zero);
            }
        }
    })?;
    if let Some(t) = bad {
        return Err(format!("target {t} is out of bounds: the classes are 0 to {}", classes as i64 - 1));
    }
    if losses.len() != targets.len() {
        return Err(format!("input 1 holds {} targets for {} rows", targets.len(), losses.len()));
    }
    let out = output(ctx, 0)?;
    match reduction {
        0 => {
            let vals: Vec<T> = losses.into_iter().map(T::store).collect();
            write_output(out, 0, None, &vals)
        }
        r => {
            let total = sum_in_order(&losses);
            let v = if r == 1 { total / sum_in_order(&weights) } else { total };
            write_output(out, 0, None, &[T::store(v)])
        }
    }
}
