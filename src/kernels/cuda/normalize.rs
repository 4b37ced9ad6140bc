//! The ops along one dimension that write every element, on CUDA: `softmax`,
//! `log_softmax`, `cumsum`, `cumprod`, and `layer_norm` (along the last dimensions), with
//! the CPU kernels' names, parameter lists and rules (`kernels::normalize`), on operands of
//! any layout.
//!
//! **Order.** The groups are split from the layout as the reductions split them
//! ([`super::reduce_dims::Plan`]). `softmax`, `log_softmax` and `layer_norm` give each
//! group a team of threads, as the reductions do ([`super::reduce_dims::team`]: the width
//! from the group's length alone, lane `t` folding elements `t, t + W, ...`, then a fixed
//! tree): `softmax` and `log_softmax` take the maximum (a NaN wins), the sum of
//! `exp(x − max)`, then write `exp(x − max) · (1 / sum)` or `x − (max + log(sum))`, the CPU's
//! formulas; `layer_norm` takes the mean, the biased variance (the mean of squared
//! deviations), then writes `(x − mean) · (1 / sqrt(var + eps)) · weight + bias`, each
//! product rounded on its own (never fused). `cumsum` and `cumprod` give each group one
//! thread that accumulates in index order in the compute type (`f32` for `f16` and `bf16`;
//! `i64` modulo 2^64 for `bool` and the integers) and rounds each output once: the CPU's
//! order, so their results are the CPU's bit for bit.

use cudarc::driver::PushKernelArg;

use super::launch::{device_operand, launch_config};
use super::ops::sum_dtype;
use super::reduce_dims::{
    cfn, check_outputs, each, element_offsets, extreme_fold, fold, infinity, mul, shared_c, team,
    team_config, team_kernel, Plan,
};
use super::source::{compute, lit, load, storage, store, zero};
use super::CpuTwin;
use super::{function, on_stream};
use crate::kernels::reduce_dims::Dims;
use crate::vm::{DType, KernelCtx, OpKernel, Scalar};

/// An op along one dimension.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Along {
    Softmax,
    LogSoftmax,
    Cumsum,
    Cumprod,
}

impl Along {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            Along::Softmax => "softmax",
            Along::LogSoftmax => "log_softmax",
            Along::Cumsum => "cumsum",
            Along::Cumprod => "cumprod",
        }
    }

    fn cpu(self) -> &'static dyn OpKernel {
        use crate::kernels as k;
        match self {
            Along::Softmax => &k::SoftmaxKernel,
            Along::LogSoftmax => &k::LogSoftmaxKernel,
            Along::Cumsum => &k::CumsumKernel,
            Along::Cumprod => &k::CumprodKernel,
        }
    }

    /// The kernel of this op on inputs of `d`, where the op takes `d`.
    pub fn symbol(self, d: DType) -> Option<String> {
        match self {
            Along::Softmax | Along::LogSoftmax if !d.is_floating() => None,
            _ => Some(format!("{}_{d}", self.name())),
        }
    }
}

/// An op along one dimension on CUDA (module docs).
#[derive(Debug, Clone, Copy)]
pub struct CudaAlong(pub Along);

/// The CUDA kernels of the ops along one dimension.
pub const ALONG: [CudaAlong; 4] = [
    CudaAlong(Along::Softmax),
    CudaAlong(Along::LogSoftmax),
    CudaAlong(Along::Cumsum),
    CudaAlong(Along::Cumprod),
];

impl CpuTwin for CudaAlong {
    fn cpu_twin(&self) -> &'static dyn OpKernel {
        self.0.cpu()
    }
}

impl OpKernel for CudaAlong {
    like_cpu!(twin);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let op = self.0;
        let name = op.name();
        check_outputs(name, op.cpu(), ctx)?;
        let x = ctx.inputs.first().ok_or("missing input 0")?;
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let d = x.meta.dtype;
        let sym = op.symbol(d).ok_or_else(|| format!("{name} takes no {d} input"))?;
        let &dim = ctx.attrs.params().ints().first().ok_or("expected a parameter list [dim]")?;
        let dims = Dims::new(x.meta.shape.len(), &[dim], true, false)?;
        let (xs, os) = (&x.meta.strides[..], &out.meta.strides[..]);
        let plan = Plan::new(&x.meta.shape, &dims.reduced, &[xs, os], &[xs, os])?;
        on_stream(name, |s| {
            let (xd, od) = (
                device_operand(s, "input 0", x.meta, x.data)?,
                device_operand(s, "output 0", out.meta, out.data)?,
            );
            if plan.groups == 0 || plan.len == 0 {
                return Ok(());
            }
            let f = function(s, &sym)?;
            let (o, xa) = (od.addr(), xd.addr());
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&o).arg(&xa).arg(&plan.kept).arg(&plan.inner).arg(&plan.groups).arg(&plan.len);
            let w = team(plan.len);
            let config = match op {
                Along::Softmax | Along::LogSoftmax => {
                    l.arg(&w);
                    team_config(plan.groups, w)
                }
                Along::Cumsum | Along::Cumprod => launch_config(plan.groups as usize),
            };
            // SAFETY: `softmax_<d>` and `log_softmax_<d>` take (T*, const T*, Layout, Layout,
            // u64, u64, u32), `cumsum_<d>` and `cumprod_<d>` the same without the last, as
            // pushed. Both operands were checked against their storages and the output has
            // the input's shape (checked above), so the plan's offsets of group `g < groups`
            // and element `i < len` are inside both; the output does not overlap the input
            // (the builder refuses it for kernels that are not in place). The storages live
            // until the instruction retires.
            unsafe { l.launch(config) }.map_err(|e| format!("launching {sym}: {e}"))?;
            Ok(())
        })
    }
}

/// `layer_norm` on CUDA (module docs): `ints` = `[k, has_weight, has_bias]`, `scalars` =
/// `[eps]`.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaLayerNorm;

impl OpKernel for CudaLayerNorm {
    like_cpu!(kernel crate::kernels::LayerNormKernel);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        check_outputs("layer_norm", &crate::kernels::LayerNormKernel, ctx)?;
        let p = ctx.attrs.params();
        let (k, hw, hb) = match p.ints() {
            &[k, w, b] if k >= 0 => (k as usize, w != 0, b != 0),
            _ => return Err("expected a parameter list [k, has_weight, has_bias] with scalars [eps]".into()),
        };
        let eps = p.scalar(0).map_or(1e-5, Scalar::as_f64);
        let x = ctx.inputs.first().ok_or("missing input 0")?;
        let out = ctx.outputs.first().ok_or("missing output 0")?;
        let weight = if hw { Some(ctx.inputs.get(1).ok_or("missing input 1 (the weight)")?) } else { None };
        let bias = if hb {
            Some(ctx.inputs.get(1 + usize::from(hw)).ok_or("missing the bias input")?)
        } else {
            None
        };
        let d = x.meta.dtype;
        let rank = x.meta.shape.len();
        if k == 0 || k > rank {
            return Err(format!("input 0 is {}: it has no last {k} dimension(s)", x.meta.describe()));
        }
        let reduced: Vec<bool> = (0..rank).map(|i| i >= rank - k).collect();
        let (xs, os) = (&x.meta.strides[..], &out.meta.strides[..]);
        let plan = Plan::new(&x.meta.shape, &reduced, &[xs, os], &[xs, os])?;
        // The weight's and the bias's strides over the normalized dimensions.
        let tail = |t: Option<&crate::vm::TensorView<'_>>| -> Vec<isize> {
            let mut v = vec![0isize; rank - k];
            v.extend(t.map_or_else(|| vec![0; k], |t| t.meta.strides.to_vec()));
            v
        };
        let (ws, bs) = (tail(weight), tail(bias));
        let params = Plan::new(&x.meta.shape, &reduced, &[xs], &[&ws, &bs])?.inner;
        let sym = format!("layer_norm_{d}");
        on_stream("layer_norm", |s| {
            let (xd, od) = (
                device_operand(s, "input 0", x.meta, x.data)?,
                device_operand(s, "output 0", out.meta, out.data)?,
            );
            let wd = weight.map(|t| device_operand(s, "input 1", t.meta, t.data)).transpose()?;
            let bd = bias.map(|t| device_operand(s, "the bias", t.meta, t.data)).transpose()?;
            if plan.groups == 0 || plan.len == 0 {
                return Ok(());
            }
            let f = function(s, &sym)?;
            let (o, xa) = (od.addr(), xd.addr());
            let (wa, ba) = (wd.as_ref().map_or(0u64, |t| t.addr()), bd.as_ref().map_or(0u64, |t| t.addr()));
            let (hw, hb) = (i32::from(hw), i32::from(hb));
            let w = team(plan.len);
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&o).arg(&xa).arg(&wa).arg(&ba).arg(&plan.kept).arg(&plan.inner).arg(&params);
            l.arg(&plan.groups).arg(&plan.len).arg(&w).arg(&eps).arg(&hw).arg(&hb);
            // SAFETY: `layer_norm_<d>` takes (T*, const T*, const T*, const T*, Layout,
            // Layout, Layout, u64, u64, u32, double, int, int), as pushed. Every operand was
            // checked against its storage; the weight and the bias have the normalized shape
            // (the CPU kernel's rule, checked above), so `params` indexes them by the
            // element's number within a group; the kernel reads them only where `hw`, `hb`
            // say they were given. The output has the input's shape and does not overlap
            // it. The storages live until the instruction retires.
            unsafe { l.launch(team_config(plan.groups, w)) }.map_err(|e| format!("launching {sym}: {e}"))?;
            Ok(())
        })
    }
}

// ---- The CUDA C ---------------------------------------------------------------------

/// The kernels of the ops along one dimension and `layer_norm` on inputs of `d`: (symbol,
/// CUDA C).
pub fn sources(d: DType) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (st, ct) = (storage(d), compute(d));
    // cumsum and cumprod: one thread per group, in index order.
    for prod in [false, true] {
        let name = if prod { "cumprod" } else { "cumsum" };
        let c = if prod { "*" } else { "+" };
        let (acc_t, init, addend, put) = if d.is_floating() {
            (ct, lit(d, if prod { 1.0 } else { 0.0 }), "v".to_string(), store(d, "acc"))
        } else {
            ("u64", format!("{}ULL", u8::from(prod)), "(u64)(i64)v".to_string(), "(i64)acc".to_string())
        };
        let sym = format!("{name}_{d}");
        let text = format!(
            "extern \"C\" __global__ void {sym}({out_st}* out, const {st}* x, Layout G, Layout R, u64 groups, u64 len) {{\n\
             \x20 for (u64 g = blockIdx.x * (u64)blockDim.x + threadIdx.x; g < groups; g += (u64)blockDim.x * gridDim.x) {{\n\
             \x20   i64 g0, g1, g2;\n\
             \x20   offsets(G, g, g0, g1, g2);\n\
             \x20   {acc_t} acc = {init};\n\
             \x20   for (u64 i = 0; i < len; ++i) {{\n\
             \x20     {offs}\n\
             \x20     const {ct} v = {x};\n\
             \x20     acc = acc {c} {addend};\n\
             \x20     out[g1 + e1] = {put};\n\
             \x20   }}\n\
             \x20 }}\n\
             }}\n",
            offs = element_offsets("R", "i", ["e0", "e1", "e2"]),
            out_st = storage(sum_dtype(d)),
            x = load(d, "x[g0 + e0]"),
        );
        out.push((sym, text));
    }
    if !d.is_floating() {
        return out;
    }
    let z = zero(d);
    let sum_of =
        |res: &str, term: &str| fold(d, res, ct, "sh_c", z, &format!("acc = acc + ({term});"), "a + b");
    let exp = cfn(d, "exp");
    // softmax and log_softmax.
    for log in [false, true] {
        let sym = format!("{}_{d}", if log { "log_softmax" } else { "softmax" });
        let write = if log {
            format!(
                "const {ct} shift = m + {}(s); {}",
                cfn(d, "log"),
                each(d, &format!("out[g1 + e1] = {};", store(d, "v - shift")))
            )
        } else {
            format!(
                "const {ct} inv = {} / s; {}",
                lit(d, 1.0),
                each(d, &format!("out[g1 + e1] = {};", store(d, &mul(d, &format!("{exp}(v - m)"), "inv"))))
            )
        };
        let body = extreme_fold(d, "m", "v", true, infinity(d, false))
            + &sum_of("s", &format!("{exp}(v - m)"))
            + &format!("    if (live) {{ {write} }}\n");
        let params = format!("{st}* out, const {st}* x, Layout G, Layout R, u64 groups, u64 len, u32 W");
        out.push((sym.clone(), team_kernel(&sym, &params, &shared_c(d), &body)));
    }
    // layer_norm: `P` holds the weight's (operand 0) and the bias's (operand 1) strides over
    // a group's elements.
    let n = format!("({ct})(double)len");
    let y = format!(
        "{{ {} (void)p2; \
         {ct} y = {}; if (hw) y = {}; if (hb) y = y + {}; out[g1 + e1] = {}; }}",
        element_offsets("P", "i", ["p0", "p1", "p2"]),
        mul(d, "(v - mean)", "rstd"),
        mul(d, "y", &load(d, "wt[p0]")),
        load(d, "bs[p1]"),
        store(d, "y"),
    );
    let body = sum_of("s", "v")
        + &format!("    const {ct} mean = s / {n};\n")
        + &sum_of("ss", &mul(d, "(v - mean)", "(v - mean)"))
        + &format!(
            "    const {ct} rstd = {} / {}(ss / {n} + ({ct})eps);\n    if (live) {{ {} }}\n",
            lit(d, 1.0),
            cfn(d, "sqrt"),
            each(d, &y)
        );
    let params = format!(
        "{st}* out, const {st}* x, const {st}* wt, const {st}* bs, Layout G, Layout R, Layout P, \
         u64 groups, u64 len, u32 W, double eps, int hw, int hb"
    );
    let sym = format!("layer_norm_{d}");
    out.push((sym.clone(), team_kernel(&sym, &params, &shared_c(d), &body)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_op_has_its_kernel_for_every_dtype_it_takes() {
        let src = super::super::source::source();
        for k in ALONG {
            for d in DType::ALL {
                let takes = k.0.cpu().dtypes().contains(&d);
                assert_eq!(k.0.symbol(d).is_some(), takes, "{} on {d}", k.0.name());
                if let Some(sym) = k.0.symbol(d) {
                    assert!(src.module_of(&sym).is_some(), "{sym}");
                }
            }
        }
        for d in DType::ALL {
            let takes = CudaLayerNorm.dtypes().contains(&d);
            assert_eq!(src.module_of(&format!("layer_norm_{d}")).is_some(), takes, "layer_norm on {d}");
        }
    }

    #[test]
    fn the_kernels_compute_the_cpus_formulas() {
        let f32s: String = sources(DType::F32).into_iter().map(|(_, t)| t).collect();
        assert!(f32s.contains("out[g1 + e1] = (float)(__fmul_rn(expf(v - m), inv));"), "{f32s}");
        assert!(f32s.contains("const float shift = m + logf(s);"));
        assert!(f32s.contains("const float rstd = 1.0f / sqrtf(ss / (float)(double)len + (float)eps);"));
        assert!(f32s.contains("if (hw) y = __fmul_rn(y, wt[p0]); if (hb) y = y + bs[p1];"));
        let bf16s: String = sources(DType::BF16).into_iter().map(|(_, t)| t).collect();
        assert!(bf16s.contains("out[g1 + e1] = f32_to_bf16(acc);"), "cumsum rounds each output once");
        let bools: String = sources(DType::Bool).into_iter().map(|(_, t)| t).collect();
        assert!(bools.contains("acc = acc * (u64)(i64)v;") && !bools.contains("softmax"));
    }
}
