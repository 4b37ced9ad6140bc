//! The reductions along dims on CUDA (`sum` with a parameter list, `mean`, `prod`, `amax`,
//! `amin`, `max`, `min`, `argmax`, `argmin`, `all`, `any`, `var`, `std`, `logsumexp`,
//! `norm`): the CPU kernels' op names, parameter lists (`kernels::reduce_dims`), shape and
//! dtype rules, on operands of any layout.
//!
//! # Groups and teams
//!
//! The host splits the input's dimensions into the kept ones and the reduced ones
//! ([`Plan`]): each output element reduces its *group*, the elements that share its index
//! in the kept dimensions, numbered `0 .. len` in row-major order of the reduced
//! dimensions. Both index spaces are [`Layout`]s (any strides, merged where they can be),
//! so a group's elements are found from its number and their numbers alone.
//!
//! A group is reduced by a *team* of `W` threads of one block, `W` chosen from the group's
//! length alone ([`team`]): 1 for up to 16 elements, 32 for up to 1024, 256 above. Lane `t`
//! of the team folds elements `t, t + W, t + 2W, ...` in increasing order, then the `W`
//! partial results are combined as a fixed tree in shared memory (`p[t] ∘= p[t + W/2]`,
//! then `+ W/4`, ... `+ 1`). So a result depends on the shape only, never on the layout, the
//! launch or the GPU. With one thread per team (groups of up to 16) the order is the CPU
//! kernels' (`sum_f32` adds one term at a time up to 4096 terms), so those floating results
//! equal the CPU's bit for bit up to the functions of the math library.
//!
//! # What each op folds
//!
//! Floating ops compute in `f32` (`f16`, `bf16`, `f32`) or `f64` and round once on store.
//! `sum`, `mean`: the sum (`mean`: over the count). `prod`: the product. `var`, `std`: the
//! mean first, then the sum of squared deviations over `max(0, n − correction)` (two passes,
//! as the CPU). `logsumexp`: the maximum (NaN wins), then `log(Σ exp(x − m)) + m` with an
//! infinite maximum counted as 0. `norm`: `sqrt(Σ x²)`, `Σ |x|`, the count of nonzeros,
//! the largest or smallest `|x|` (NaN wins) or `(Σ |x|^p)^(1/p)`. `bool` and the integers
//! sum and multiply modulo 2^64 (the wrapping `i64` result in any order: exact). Every
//! product that feeds a sum is an `__fmul_rn`/`__dmul_rn`, which the compiler never
//! contracts into a fused multiply-add the CPU would not do.
//!
//! The extremes (`amax`, `amin`, `max`, `min`, `argmax`, `argmin`) fold (value, index)
//! pairs: a NaN beats any number, and between equal values (or two NaNs) the smaller index
//! wins, so the result is the CPU's exactly: the first extreme in row-major order of the
//! reduced dimensions, or the first NaN. `all` and `any` fold truth values (NaN is true).

use cudarc::driver::{LaunchConfig, PushKernelArg};

use super::launch::{device_operand, Dev};
use super::layout::Layout;
use super::ops::sum_dtype;
use super::source::{compute, lit, load, storage, store, zero, THREADS};
use super::CpuTwin;
use super::{function, on_stream};
use crate::kernels::reduce_dims::Dims;
use crate::vm::{DType, KernelCtx, OpKernel, OutSpecs, Scalar, TensorMeta};

/// The most blocks a team launch uses; the blocks loop over the remaining groups.
pub const MAX_TEAM_BLOCKS: u64 = 16_384;

/// The threads that reduce one group of `len` elements (see the module docs): a function of
/// the length alone, so that the order of every fold is.
pub fn team(len: u64) -> u32 {
    if len <= 16 {
        1
    } else if len <= 1024 {
        32
    } else {
        THREADS
    }
}

/// The launch of teams of `w` threads over `groups` groups: blocks of [`THREADS`] threads,
/// `THREADS / w` teams each, at most [`MAX_TEAM_BLOCKS`] blocks (each loops over groups
/// `first, first + grid · teams, ...` in rounds that every thread of the block takes).
pub fn team_config(groups: u64, w: u32) -> LaunchConfig {
    let per = u64::from(THREADS / w);
    let blocks = groups.div_ceil(per).clamp(1, MAX_TEAM_BLOCKS) as u32;
    LaunchConfig { grid_dim: (blocks, 1, 1), block_dim: (THREADS, 1, 1), shared_mem_bytes: 0 }
}

/// The index spaces of a reduction: the groups (the kept dimensions) and the elements of
/// one group (the reduced dimensions), each with the strides of the operands over it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    /// The number of groups (output elements).
    pub groups: u64,
    /// The elements of each group.
    pub len: u64,
    /// The kept dimensions, row-major; operand `k`'s strides from `kept[k]`.
    pub kept: Layout,
    /// The reduced dimensions, row-major; operand `k`'s strides from `inner[k]`.
    pub inner: Layout,
}

impl Plan {
    /// The plan of an input of `shape` reduced along `reduced`: `kept` and `inner` hold
    /// up to three stride lists each, of `shape`'s rank (entries of the other kind of
    /// dimension are ignored).
    pub fn new(
        shape: &[usize],
        reduced: &[bool],
        kept: &[&[isize]],
        inner: &[&[isize]],
    ) -> Result<Plan, String> {
        if reduced.len() != shape.len() || kept.iter().chain(inner).any(|s| s.len() != shape.len()) {
            return Err(format!("a reduction plan of shape {shape:?} needs masks and strides of its rank"));
        }
        let part = |want: bool, lists: &[&[isize]]| -> Result<(Layout, u64), String> {
            let dims: Vec<usize> = (0..shape.len()).filter(|&d| reduced[d] == want).collect();
            let sizes: Vec<usize> = dims.iter().map(|&d| shape[d]).collect();
            let strides: Vec<Vec<isize>> =
                lists.iter().map(|l| dims.iter().map(|&d| l[d]).collect()).collect();
            let refs: Vec<&[isize]> = strides.iter().map(Vec::as_slice).collect();
            let layout = Layout::plan(&sizes, &refs)?;
            Ok((layout, layout.n))
        };
        let (kept, groups) = part(false, kept)?;
        let (inner, len) = part(true, inner)?;
        Ok(Plan { groups, len, kept, inner })
    }
}

/// The strides of an output of a reduction over each of the input's dimensions: the
/// output's own stride for a kept dimension, 0 for a reduced one (`keepdim` says whether the
/// output has the reduced dimensions, of size 1).
pub fn output_strides(out: &[isize], reduced: &[bool], keepdim: bool) -> Result<Vec<isize>, String> {
    let mut full = Vec::with_capacity(reduced.len());
    let mut j = 0;
    for (d, &r) in reduced.iter().enumerate() {
        let at = if keepdim { d } else { j };
        if r {
            full.push(0);
        } else {
            full.push(*out.get(at).ok_or("the output has fewer dimensions than the input keeps")?);
        }
        if keepdim || !r {
            j += 1;
        }
    }
    if (keepdim && out.len() != reduced.len()) || (!keepdim && j != out.len()) {
        return Err("the output's dimensions are not those the reduction keeps".into());
    }
    Ok(full)
}

/// A reduction along dims.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Red {
    Sum,
    Mean,
    Prod,
    Amax,
    Amin,
    Max,
    Min,
    Argmax,
    Argmin,
    All,
    Any,
    Var,
    Std,
    Logsumexp,
    Norm,
}

impl Red {
    /// The op's name.
    pub fn name(self) -> &'static str {
        match self {
            Red::Sum => "sum",
            Red::Mean => "mean",
            Red::Prod => "prod",
            Red::Amax => "amax",
            Red::Amin => "amin",
            Red::Max => "max",
            Red::Min => "min",
            Red::Argmax => "argmax",
            Red::Argmin => "argmin",
            Red::All => "all",
            Red::Any => "any",
            Red::Var => "var",
            Red::Std => "std",
            Red::Logsumexp => "logsumexp",
            Red::Norm => "norm",
        }
    }

    /// The CPU kernel of the op: its shape and dtype rules are these kernels'.
    fn cpu(self) -> &'static dyn OpKernel {
        use crate::kernels as k;
        match self {
            Red::Sum => &k::SumKernel,
            Red::Mean => &k::MeanKernel,
            Red::Prod => &k::ProdKernel,
            Red::Amax => &k::AmaxKernel,
            Red::Amin => &k::AminKernel,
            Red::Max => &k::MaxKernel,
            Red::Min => &k::MinKernel,
            Red::Argmax => &k::ArgmaxKernel,
            Red::Argmin => &k::ArgminKernel,
            Red::All => &k::AllKernel,
            Red::Any => &k::AnyKernel,
            Red::Var => &k::VarKernel,
            Red::Std => &k::StdKernel,
            Red::Logsumexp => &k::LogsumexpKernel,
            Red::Norm => &k::NormKernel,
        }
    }

    /// The kernel of this op on inputs of `d`, where the op takes `d`.
    pub fn symbol(self, d: DType) -> Option<String> {
        let float = d.is_floating();
        let base = match self {
            Red::Sum => "sum_dims",
            Red::Prod => "prod_dims",
            Red::Amax | Red::Max => "max_dims",
            Red::Amin | Red::Min => "min_dims",
            Red::Argmax if d != DType::Bool => "max_dims",
            Red::Argmin if d != DType::Bool => "min_dims",
            Red::Argmax | Red::Argmin => return None,
            Red::All => "all_dims",
            Red::Any => "any_dims",
            Red::Mean if float => "mean_dims",
            Red::Var | Red::Std if float => "var_dims",
            Red::Logsumexp if float => "logsumexp_dims",
            Red::Norm if float => "norm_dims",
            Red::Mean | Red::Var | Red::Std | Red::Logsumexp | Red::Norm => return None,
        };
        Some(format!("{base}_{d}"))
    }

    /// Which outputs the kernel writes: (values, indices) as output numbers.
    fn outputs(self) -> (Option<usize>, Option<usize>) {
        match self {
            Red::Max | Red::Min => (Some(0), Some(1)),
            Red::Argmax | Red::Argmin => (None, Some(0)),
            _ => (Some(0), None),
        }
    }
}

/// A reduction along dims on CUDA (module docs).
#[derive(Debug, Clone, Copy)]
pub struct CudaReduce(pub Red);

/// The CUDA kernels of the reductions along dims (`sum` along dims is [`super::CudaSum`]'s).
pub const REDUCTIONS: [CudaReduce; 14] = [
    CudaReduce(Red::Mean),
    CudaReduce(Red::Prod),
    CudaReduce(Red::Amax),
    CudaReduce(Red::Amin),
    CudaReduce(Red::Max),
    CudaReduce(Red::Min),
    CudaReduce(Red::Argmax),
    CudaReduce(Red::Argmin),
    CudaReduce(Red::All),
    CudaReduce(Red::Any),
    CudaReduce(Red::Var),
    CudaReduce(Red::Std),
    CudaReduce(Red::Logsumexp),
    CudaReduce(Red::Norm),
];

impl CpuTwin for CudaReduce {
    fn cpu_twin(&self) -> &'static dyn OpKernel {
        self.0.cpu()
    }
}

impl OpKernel for CudaReduce {
    like_cpu!(twin);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        reduce(self.0, ctx)
    }
}

/// Check that the outputs of `ctx` are those `cpu`'s rules infer for its inputs.
pub(super) fn check_outputs(op: &str, cpu: &dyn OpKernel, ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    let inputs: Vec<&TensorMeta> = ctx.inputs.iter().map(|t| t.meta).collect();
    let mut want = OutSpecs::new();
    cpu.infer(&inputs, &[], &ctx.attrs, &mut want)?;
    if want.len() != ctx.outputs.len() {
        return Err(format!("{op} writes {} output(s), {} were given", want.len(), ctx.outputs.len()));
    }
    for (i, (w, o)) in want.iter().zip(ctx.outputs.iter()).enumerate() {
        if o.meta.shape != w.shape || o.meta.dtype != w.dtype {
            return Err(format!(
                "output {i} is {} but {op} of these inputs is {}{:?}",
                o.meta.describe(),
                w.dtype,
                w.shape.as_slice()
            ));
        }
    }
    Ok(())
}

/// `compute` of reduction `op` (also `sum` with a parameter list).
pub(super) fn reduce(op: Red, ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    let name = op.name();
    check_outputs(name, op.cpu(), ctx)?;
    let x = ctx.inputs.first().ok_or("missing input 0")?;
    let d = x.meta.dtype;
    let sym = op.symbol(d).ok_or_else(|| format!("{name} takes no {d} input"))?;
    let dims = Dims::from_params(x.meta, &ctx.attrs)?;
    let rank = x.meta.shape.len();
    let (value, index) = op.outputs();
    let strides_of = |i: Option<usize>| -> Result<Vec<isize>, String> {
        match i.and_then(|i| ctx.outputs.get(i)) {
            Some(o) => output_strides(&o.meta.strides, &dims.reduced, dims.keepdim),
            None => Ok(vec![0; rank]),
        }
    };
    let (vs, is) = (strides_of(value)?, strides_of(index)?);
    let xs = &x.meta.strides[..];
    let plan = Plan::new(&x.meta.shape, &dims.reduced, &[xs, &vs, &is], &[xs])?;
    // `p` and `q` of the kernels (see `source`): the divisor of `var`, whether to take the
    // root (`std`); the order of `norm` and its reciprocal.
    let (p, q) = match op {
        Red::Var | Red::Std => {
            let correction = ctx.attrs.params().scalar(0).map_or(1.0, Scalar::as_f64);
            ((plan.len as f64 - correction).max(0.0), if op == Red::Std { 1.0 } else { 0.0 })
        }
        Red::Norm => {
            let p = ctx.attrs.params().scalar(0).map_or(2.0, Scalar::as_f64);
            (p, 1.0 / p)
        }
        _ => (0.0, 0.0),
    };
    if plan.len == 0 && matches!(op, Red::Amax | Red::Amin | Red::Max | Red::Min | Red::Argmax | Red::Argmin)
    {
        return Err(format!("{name} of an empty dimension has no value"));
    }
    if plan.len == 0 && op == Red::Norm && p.is_infinite() {
        return Err("norm of order ±inf of an empty dimension has no value".into());
    }
    on_stream(name, |s| {
        let xd = device_operand(s, "input 0", x.meta, x.data)?;
        let mut outs: Vec<Dev<'_>> = Vec::new();
        for (i, o) in ctx.outputs.iter().enumerate() {
            outs.push(device_operand(s, &format!("output {i}"), o.meta, o.data)?);
        }
        if plan.groups == 0 {
            return Ok(());
        }
        let addr = |i: Option<usize>| i.and_then(|i| outs.get(i)).map_or(0u64, |o| o.addr());
        let (vo, io, xa) = (addr(value), addr(index), xd.addr());
        let w = team(plan.len);
        let f = function(s, &sym)?;
        let mut l = s.cuda_stream().launch_builder(&f);
        l.arg(&vo).arg(&io).arg(&xa).arg(&plan.kept).arg(&plan.inner).arg(&plan.groups).arg(&plan.len);
        l.arg(&w).arg(&p).arg(&q);
        // SAFETY: the `*_dims_<d>` kernels take (void*, i64*, const T*, Layout, Layout, u64,
        // u64, u32, double, double), matching these arguments. Every operand was checked
        // against its storage; the plan's strides are the operands' own over the input's
        // index space (the outputs' with 0 along the reduced dimensions), so every offset of
        // a group `g < groups` and element `i < len` is inside them. The kernel writes
        // output values only where `vo` is not null and indices only where `io` is not (the
        // outputs this op has, of the dtypes checked above). The storages live until the
        // instruction retires.
        unsafe { l.launch(team_config(plan.groups, w)) }.map_err(|e| format!("launching {sym}: {e}"))?;
        Ok(())
    })
}

// ---- The CUDA C ---------------------------------------------------------------------

/// Negative (or, with `positive`, positive) infinity in the compute type of `d`.
pub(super) fn infinity(d: DType, positive: bool) -> &'static str {
    match (compute(d), positive) {
        ("double", false) => "__longlong_as_double((i64)0xFFF0000000000000ULL)",
        ("double", true) => "__longlong_as_double((i64)0x7FF0000000000000ULL)",
        (_, false) => "__int_as_float((int)0xFF800000u)",
        (_, true) => "__int_as_float(0x7F800000)",
    }
}

/// `a · b` in the compute type of the floating `d`, never contracted into an FMA.
pub(super) fn mul(d: DType, a: &str, b: &str) -> String {
    if compute(d) == "double" {
        format!("__dmul_rn({a}, {b})")
    } else {
        format!("__fmul_rn({a}, {b})")
    }
}

/// The C math function `name` of the compute type of `d` (`expf` or `exp`).
pub(super) fn cfn(d: DType, name: &str) -> String {
    if compute(d) == "double" {
        name.to_string()
    } else {
        format!("{name}f")
    }
}

/// A team kernel: `sym(params)` whose `body` runs once per group `g` of the round with
/// `live` (whether `g` is a group), `lane` and `tb` (the team's first thread), and `g0`,
/// `g1`, `g2` the offsets of the group in operands 0, 1 and 2 of layout `G`. Every thread
/// of a block takes the same rounds, so the body's `__syncthreads` are uniform.
pub(super) fn team_kernel(sym: &str, params: &str, shared: &str, body: &str) -> String {
    format!(
        "extern \"C\" __global__ void {sym}({params}) {{\n\
         {shared}\
         \x20 const u32 lane = threadIdx.x & (W - 1u);\n\
         \x20 const u32 tb = threadIdx.x - lane;\n\
         \x20 (void)tb;\n\
         \x20 const u64 per = blockDim.x / W;\n\
         \x20 for (u64 first = (u64)blockIdx.x * per; first < groups; first += (u64)gridDim.x * per) {{\n\
         \x20   const u64 g = first + threadIdx.x / W;\n\
         \x20   const bool live = g < groups;\n\
         \x20   i64 g0 = 0, g1 = 0, g2 = 0;\n\
         \x20   if (live) offsets(G, g, g0, g1, g2);\n\
         \x20   (void)g1; (void)g2;\n\
         {body}\
         \x20   __syncthreads();\n\
         \x20 }}\n\
         }}\n"
    )
}

/// `o0`, `o1`, `o2`: the offsets of element `i` in operands 0, 1 and 2 of layout `l`
/// (declared here), by one product where the layout has one dimension (a group that lies
/// at one stride: no division), else by `offsets`.
pub(super) fn element_offsets(l: &str, i: &str, o: [&str; 3]) -> String {
    let [a, b, c] = o;
    format!(
        "i64 {a}, {b}, {c}; if ({l}.ndim == 1) {{ {a} = (i64){i} * {l}.stride[0][0]; \
         {b} = (i64){i} * {l}.stride[1][0]; {c} = (i64){i} * {l}.stride[2][0]; }} \
         else offsets({l}, {i}, {a}, {b}, {c});"
    )
}

/// A loop over the team's elements of its group: `v` is element `i` (from `x`) in the
/// compute type, `e0`, `e1`, `e2` its offsets in operands 0, 1 and 2 of layout `R`.
pub(super) fn each(d: DType, what: &str) -> String {
    format!(
        "for (u64 i = lane; i < len; i += W) {{ \
         {offs} (void)e1; (void)e2; \
         const {ct} v = {x}; (void)v; {what} }}",
        offs = element_offsets("R", "i", ["e0", "e1", "e2"]),
        ct = compute(d),
        x = load(d, "x[g0 + e0]"),
    )
}

/// A fold of the team into `res` (type `acc_t`, shared array `sh`): each lane folds its
/// elements from `init` with `step` (on `acc` and `v`), then the lanes' results are
/// combined as a tree with `combine` (of `a`, the lower lane's, and `b`); every lane gets
/// the result.
pub(super) fn fold(
    d: DType,
    res: &str,
    acc_t: &str,
    sh: &str,
    init: &str,
    step: &str,
    combine: &str,
) -> String {
    format!(
        "    {acc_t} {res};\n\
         \x20   {{\n\
         \x20     {acc_t} acc = {init};\n\
         \x20     if (live) {{ {each} }}\n\
         \x20     {sh}[threadIdx.x] = acc;\n\
         \x20     __syncthreads();\n\
         \x20     for (u32 w = W >> 1; w > 0; w >>= 1) {{\n\
         \x20       if (lane < w) {{\n\
         \x20         const {acc_t} a = {sh}[threadIdx.x], b = {sh}[threadIdx.x + w];\n\
         \x20         {sh}[threadIdx.x] = {combine};\n\
         \x20       }}\n\
         \x20       __syncthreads();\n\
         \x20     }}\n\
         \x20     {res} = {sh}[tb];\n\
         \x20     __syncthreads();\n\
         \x20   }}\n",
        each = each(d, step),
    )
}

/// The team's maximum of `expr` (of `v`) in the compute type into `res`, a NaN winning
/// (`max`), or its minimum (`!max`), from `init`.
pub(super) fn extreme_fold(d: DType, res: &str, expr: &str, max: bool, init: &str) -> String {
    let c = if max { ">" } else { "<" };
    fold(
        d,
        res,
        compute(d),
        "sh_c",
        init,
        &format!(
            "{{ const {} u = {expr}; acc = (acc != acc) ? acc : (u != u || u {c} acc) ? u : acc; }}",
            compute(d)
        ),
        &format!("(a != a) ? a : (b != b || b {c} a) ? b : a"),
    )
}

/// The shared array of the compute type of `d`.
pub(super) fn shared_c(d: DType) -> String {
    format!("  __shared__ {} sh_c[{THREADS}];\n", compute(d))
}

/// The kernels' parameters of a reduction over inputs of `d`.
fn params(d: DType) -> String {
    format!(
        "void* out, i64* idx, const {} * x, Layout G, Layout R, u64 groups, u64 len, u32 W, double p, double q",
        storage(d)
    )
}

/// Store `v` (a value of the compute type of `d`, or of `out_t` where given) to output 0.
fn put(out_t: &str, v: &str) -> String {
    format!("    if (live && lane == 0) (({out_t}*)out)[g1] = {v};\n    (void)idx; (void)p; (void)q;\n")
}

/// The kernels of the reductions along dims on inputs of `d`: (symbol, CUDA C).
pub fn sources(d: DType) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let (st, ct, float) = (storage(d), compute(d), d.is_floating());
    let z = zero(d);
    let mut add = |sym: String, shared: String, body: String| {
        let text = team_kernel(&sym, &params(d), &shared, &body);
        out.push((sym, text));
    };
    let acc_u = format!("  __shared__ u64 sh_u[{THREADS}];\n");
    // sum and prod.
    for prod in [false, true] {
        let sym = format!("{}_dims_{d}", if prod { "prod" } else { "sum" });
        let (o, c) = if prod { ("1", "*") } else { ("0", "+") };
        if float {
            let body = fold(
                d,
                "s",
                ct,
                "sh_c",
                &lit(d, if prod { 1.0 } else { 0.0 }),
                &format!("acc = acc {c} v;"),
                &format!("a {c} b"),
            ) + &put(st, &store(sum_dtype(d), "s"));
            add(sym, shared_c(d), body);
        } else {
            let body = fold(
                d,
                "s",
                "u64",
                "sh_u",
                &format!("{o}ULL"),
                &format!("acc = acc {c} (u64)(i64)v;"),
                &format!("a {c} b"),
            ) + &put("i64", "(i64)s");
            add(sym, acc_u.clone(), body);
        }
    }
    // all and any.
    for all in [true, false] {
        let sym = format!("{}_dims_{d}", if all { "all" } else { "any" });
        let (init, c) = if all { ("1", "&&") } else { ("0", "||") };
        let body =
            fold(d, "s", "int", "sh_i", init, &format!("acc = acc {c} (v != {z});"), &format!("a {c} b"))
                + &put("u8", "(u8)s");
        add(sym, format!("  __shared__ int sh_i[{THREADS}];\n"), body);
    }
    // The extremes: (value, index) pairs.
    for max in [true, false] {
        let sym = format!("{}_dims_{d}", if max { "max" } else { "min" });
        let c = if max { ">" } else { "<" };
        let better = if float { format!("(u != u && b == b) || u {c} b") } else { format!("u {c} b") };
        let prefer = if float {
            format!("(vb != vb) ? (va == va || ib < ia) : (va == va && (vb {c} va || (vb == va && ib < ia)))")
        } else {
            format!("vb {c} va || (vb == va && ib < ia)")
        };
        let body = format!(
            "    {ct} bv = {z}; i64 bi = -1;\n\
             \x20   if (live) {{ {each} }}\n\
             \x20   sh_c[threadIdx.x] = bv; sh_x[threadIdx.x] = bi;\n\
             \x20   __syncthreads();\n\
             \x20   for (u32 w = W >> 1; w > 0; w >>= 1) {{\n\
             \x20     if (lane < w) {{\n\
             \x20       const {ct} va = sh_c[threadIdx.x], vb = sh_c[threadIdx.x + w];\n\
             \x20       const i64 ia = sh_x[threadIdx.x], ib = sh_x[threadIdx.x + w];\n\
             \x20       if (ib >= 0 && (ia < 0 || ({prefer}))) {{ sh_c[threadIdx.x] = vb; sh_x[threadIdx.x] = ib; }}\n\
             \x20     }}\n\
             \x20     __syncthreads();\n\
             \x20   }}\n\
             \x20   if (live && lane == 0) {{\n\
             \x20     if (out) (({st}*)out)[g1] = {sv};\n\
             \x20     if (idx) idx[g2] = sh_x[tb];\n\
             \x20   }}\n\
             \x20   (void)p; (void)q;\n",
            each = each(d, &format!("{{ const {ct} u = v, b = bv; if (bi < 0 || {better}) {{ bv = u; bi = (i64)i; }} }}")),
            sv = store(d, "sh_c[tb]"),
        );
        add(sym, shared_c(d) + &format!("  __shared__ i64 sh_x[{THREADS}];\n"), body);
    }
    if !float {
        return out;
    }
    let n = format!("({ct})(double)len");
    let (one, zero_c) = (lit(d, 1.0), z);
    let sum_of =
        |res: &str, term: &str| fold(d, res, ct, "sh_c", zero_c, &format!("acc = acc + ({term});"), "a + b");
    // mean.
    add(format!("mean_dims_{d}"), shared_c(d), sum_of("s", "v") + &put(st, &store(d, &format!("s / {n}"))));
    // var and std: the mean, then the squared deviations; `p` is the divisor, `q` says std.
    let var = sum_of("s", "v")
        + &format!("    const {ct} mean = s / {n};\n")
        + &sum_of("ss", &mul(d, "(v - mean)", "(v - mean)"))
        + &format!("    {ct} r = ss / ({ct})p;\n    if (q != 0.0) r = {}(r);\n", cfn(d, "sqrt"))
        + &put(st, &store(d, "r"));
    add(format!("var_dims_{d}"), shared_c(d), var);
    // logsumexp.
    let lse = extreme_fold(d, "mx", "v", true, infinity(d, false))
        + &format!("    const {ct} m = (mx == mx && mx - mx != mx - mx) ? {zero_c} : mx;\n")
        + &sum_of("s", &format!("{}(v - m)", cfn(d, "exp")))
        + &put(st, &store(d, &format!("mx != mx ? mx : {}(s) + m", cfn(d, "log"))));
    add(format!("logsumexp_dims_{d}"), shared_c(d), lse);
    // norm: `p` the order, `q` its reciprocal.
    let abs = format!("{}(v)", cfn(d, "fabs"));
    let norm = format!(
        "    {ct} r;\n\
         \x20   if (p == 2.0) {{\n{two}    r = {sqrt}(s);\n    }} else if (p == 1.0) {{\n{l1}    r = s;\n\
         \x20   }} else if (p == 0.0) {{\n{l0}    r = s;\n    }} else if (p - p != p - p && p > 0.0) {{\n{inf}    r = mx;\n\
         \x20   }} else if (p - p != p - p) {{\n{ninf}    r = mx;\n    }} else {{\n{lp}    r = {pow}(s, ({ct})q);\n    }}\n",
        two = sum_of("s", &mul(d, "v", "v")),
        sqrt = cfn(d, "sqrt"),
        l1 = sum_of("s", &abs),
        l0 = sum_of("s", &format!("v != {zero_c} ? {one} : {}", mul(d, "v", "v"))),
        inf = extreme_fold(d, "mx", &abs, true, zero_c),
        ninf = extreme_fold(d, "mx", &abs, false, infinity(d, true)),
        lp = sum_of("s", &format!("{}({abs}, ({ct})p)", cfn(d, "pow"))),
        pow = cfn(d, "pow"),
    ) + &put(st, &store(d, "r"));
    add(format!("norm_dims_{d}"), shared_c(d), norm);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn teams_depend_on_the_length_alone() {
        assert_eq!((team(0), team(1), team(16), team(17)), (1, 1, 1, 32));
        assert_eq!((team(1024), team(1025), team(1 << 30)), (32, 256, 256));
        for w in [1, 32, 256] {
            assert_eq!(THREADS % w, 0);
        }
        let c = team_config(1000, 32);
        assert_eq!((c.grid_dim.0, c.block_dim.0), (125, 256));
        assert_eq!(team_config(0, 1).grid_dim.0, 1);
        assert_eq!(team_config(u64::MAX / 2, 256).grid_dim.0, MAX_TEAM_BLOCKS as u32);
    }

    #[test]
    fn plans_split_kept_and_reduced_dimensions() {
        // x [2, 3, 4] contiguous, reducing dims 0 and 2: groups along dim 1.
        let x = [12, 4, 1];
        let out = output_strides(&[1], &[true, false, true], false).unwrap();
        assert_eq!(out, vec![0, 1, 0]);
        let p = Plan::new(&[2, 3, 4], &[true, false, true], &[&x, &out], &[&x]).unwrap();
        assert_eq!((p.groups, p.len), (3, 8));
        assert_eq!(p.kept.offsets(2), [8, 2, 0]);
        // Element 5 of a group is [1, 1] of the reduced [2, 4]: 12 + 1.
        assert_eq!(p.inner.offsets(5)[0], 13);
        // keepdim: the output [1, 3, 1] with its own strides.
        let out = output_strides(&[3, 1, 1], &[true, false, true], true).unwrap();
        assert_eq!(out, vec![0, 1, 0]);
        // A transposed input: the order of a group is row-major of the reduced dims still.
        let t = [1, 2, 6];
        let p = Plan::new(&[2, 3, 4], &[false, true, true], &[&t], &[&t]).unwrap();
        assert_eq!((p.groups, p.len), (2, 12));
        let offs: Vec<i64> = (0..12).map(|i| p.inner.offsets(i)[0]).collect();
        assert_eq!(offs, vec![0, 6, 12, 18, 2, 8, 14, 20, 4, 10, 16, 22]);
        // 0-d: one group of one element.
        let p = Plan::new(&[], &[], &[&[], &[]], &[&[]]).unwrap();
        assert_eq!((p.groups, p.len), (1, 1));
        // Every dimension reduced: one group; an empty reduced dimension: empty groups.
        let p = Plan::new(&[3, 0], &[false, true], &[&[1, 3]], &[&[1, 3]]).unwrap();
        assert_eq!((p.groups, p.len), (3, 0));
        assert!(output_strides(&[1, 1], &[true], false).is_err());
        assert!(Plan::new(&[2], &[true, false], &[&[1]], &[&[1]]).is_err());
    }

    #[test]
    fn every_reduction_has_its_kernel_for_every_dtype_it_takes() {
        let src = super::super::source::source();
        for k in REDUCTIONS.iter().chain([&CudaReduce(Red::Sum)]) {
            for d in DType::ALL {
                let takes = k.0.cpu().dtypes().contains(&d);
                match k.0.symbol(d) {
                    Some(sym) => assert!(src.module_of(&sym).is_some(), "{sym}"),
                    None => assert!(!takes, "{} on {d}", k.0.name()),
                }
                if takes {
                    assert!(k.0.symbol(d).is_some(), "{} on {d}", k.0.name());
                }
            }
        }
    }

    #[test]
    fn the_folds_are_written_as_the_module_docs_say() {
        let src: String = sources(DType::F16).into_iter().map(|(_, t)| t).collect();
        assert!(src.contains("for (u64 i = lane; i < len; i += W)"));
        // A group at one stride is indexed by a product, any other through `offsets`.
        assert!(src.contains("if (R.ndim == 1) { e0 = (i64)i * R.stride[0][0];"), "{src}");
        assert!(src.contains("for (u32 w = W >> 1; w > 0; w >>= 1)"));
        // Squares feeding sums are never fused; 16-bit floats computed in f32, one store.
        assert!(src.contains("acc = acc + (__fmul_rn((v - mean), (v - mean)));"), "{src}");
        assert!(src.contains("f32_to_f16(s / (float)(double)len)"));
        // Ties go to the smaller index; a NaN wins.
        assert!(src.contains(
            "(ia < 0 || ((vb != vb) ? (va == va || ib < ia) : (va == va && (vb > va || (vb == va && ib < ia))))))"
        ));
        let ints: String = sources(DType::I32).into_iter().map(|(_, t)| t).collect();
        assert!(ints.contains("acc = acc * (u64)(i64)v;") && ints.contains("((i64*)out)[g1] = (i64)s;"));
        assert!(!ints.contains("mean_dims"));
        let f64s: String = sources(DType::F64).into_iter().map(|(_, t)| t).collect();
        assert!(f64s.contains("__dmul_rn(v, v)") && f64s.contains("pow(fabs(v), (double)p)"));
    }
}
