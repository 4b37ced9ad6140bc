//! The CUDA C of the batched products', convolution's and pools' kernels
//! ([`super::nn`]), one per dtype each takes, placed in that dtype's module of
//! [`super::source`].
//!
//! | kernel | dtypes | one thread per | computes |
//! | --- | --- | --- | --- |
//! | `bmm_<d>` | `u8`, `i32`, `i64` | output element | `Σ_p a[.., i, p] b[.., p, j]` in increasing `p`, modulo 2^64, stored wrapped |
//! | `im2col_<d>` | floats | element of the im2col matrix | the input element under the tap, or 0 in the padding (a copy: no rounding) |
//! | `conv_out_<d>` | floats | output element | the product (`f32`, or `f64`) plus the bias (0 without one), rounded once to `d` |
//! | `max_pool2d_<d>` | all but `bool` | output element | the window's largest element and its plane index (the CPU's ties and NaNs) |
//! | `avg_pool2d_<d>` | floats | output element | the window's sum in row-major order, divided once |
//! | `adaptive_avg_pool2d_<d>` | floats | output element | the region's sum in row-major order, divided by its count |
//! | `nll_loss_<d>` | floats | target | `-(w[t]·x[t])` and `w[t]` in the compute type (0 and 0 for `ignore_index`; NaN for a target out of range, which is reported to the fault record), stored with `'none'` |
//! | `nll_sum_<d>` | floats | (32 threads) | the losses' sum (and the weights') in the CPU's `sum_in_order`, divided for `'mean'`, rounded once |
//! | `attention_<d>` | floats | query row | scores, masked softmax and the weighted sum of `v`, in the CPU kernel's operations and order |
//!
//! The spatial kernels take their geometry as one `struct Geom` of 32 `i64` by value
//! ([`super::nn::Geom`] names the slots); each thread loops over its output elements
//! grid-stride and decomposes the element number itself. No kernel multiplies and adds in
//! one expression where a float's rounding matters, so no contraction into FMA changes a
//! result: the sums are single additions in the compute type, in the CPU kernels' order.

use std::fmt::Write as _;

use super::source::storage;
use crate::vm::DType;

/// The guarded definition of `struct Geom` that every spatial kernel's text starts with (a
/// module holds several of them).
const GEOM: &str = "#ifndef EAGERVM_GEOM\n\
#define EAGERVM_GEOM\n\
// Sizes, strides and window of a spatial kernel: kernels::cuda::nn::Geom names the slots.\n\
struct Geom { i64 v[32]; };\n\
#endif\n";

/// The C type a dtype's values are computed in (floats: `float` or `double`; integers:
/// `int` or `i64`).
fn compute(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 | DType::I32 => "int",
        DType::I64 => "i64",
        DType::F16 | DType::BF16 | DType::F32 => "float",
        DType::F64 => "double",
    }
}

/// The stored element `e` as a compute value (as `source` loads it).
fn load(d: DType, e: &str) -> String {
    match d {
        DType::Bool => format!("(int)({e} != 0)"),
        DType::U8 => format!("(int){e}"),
        DType::F16 => format!("f16_to_f32({e})"),
        DType::BF16 => format!("bf16_to_f32({e})"),
        _ => e.to_string(),
    }
}

/// The compute value `v` as a stored element, rounded once (as `source` stores it).
fn store(d: DType, v: &str) -> String {
    match d {
        DType::Bool => format!("(u8)(({v}) != 0)"),
        DType::F16 => format!("f32_to_f16({v})"),
        DType::BF16 => format!("f32_to_bf16({v})"),
        _ => format!("({})({v})", storage(d)),
    }
}

/// The stored bits of a max pool's padding: `-∞`, or an integer type's least value (the
/// CPU kernel's `lowest`).
fn lowest(d: DType) -> &'static str {
    match d {
        DType::Bool | DType::U8 => "(u8)0",
        DType::I32 => "(int)0x80000000u",
        DType::I64 => "(i64)0x8000000000000000ULL",
        DType::F16 => "(u16)0xFC00u",
        DType::BF16 => "(u16)0xFF80u",
        DType::F32 => "__uint_as_float(0xFF800000u)",
        DType::F64 => "__longlong_as_double((i64)0xFFF0000000000000ULL)",
    }
}

/// The dtypes the integer batched product kernel takes (floats go to cuBLAS).
pub const INT_BMM: [DType; 3] = [DType::U8, DType::I32, DType::I64];
/// The dtypes of the convolution's and the average pools' kernels.
pub const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];
/// The dtypes of `max_pool2d`'s kernel.
pub const MAX_POOL: [DType; 7] =
    [DType::U8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];

/// Every kernel of this family as `(module, symbol, definition)`.
pub fn kernels() -> Vec<(&'static str, String, String)> {
    let mut out = Vec::new();
    for d in INT_BMM {
        out.push((d.name(), format!("bmm_{d}"), int_bmm(d)));
    }
    for d in FLOATS {
        out.push((d.name(), format!("im2col_{d}"), im2col(d)));
        out.push((d.name(), format!("conv_out_{d}"), conv_out(d)));
        out.push((d.name(), format!("avg_pool2d_{d}"), avg_pool(d)));
        out.push((d.name(), format!("adaptive_avg_pool2d_{d}"), adaptive_avg_pool(d)));
    }
    for d in MAX_POOL {
        out.push((d.name(), format!("max_pool2d_{d}"), max_pool(d)));
    }
    for d in FLOATS {
        out.push((d.name(), format!("attention_{d}"), attention(d)));
        out.push((d.name(), format!("nll_loss_{d}"), nll_loss(d)));
        out.push((d.name(), format!("nll_sum_{d}"), nll_sum(d)));
    }
    out
}

/// `nll_loss_<d>`: target element `i` (the layout `L` over the targets' shape: the
/// target's offset, `x`'s at class 0 of its row, the output's) gives the loss
/// `-(w[t]·x[t])` and the weight `w[t]` (1 without weights; 0 and 0 where `t` is
/// `ignore`; NaN and NaN where `t` is outside `0..classes`, reported to the fault record
/// `fault`): stored to `out` with `none`, else kept in the compute type as `parts[i]` and
/// `parts[n + i]`.
fn nll_loss(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let (zero, one, nan) = if ct == "double" {
        ("0.0", "1.0", "__longlong_as_double((i64)0x7FF8000000000000ULL)")
    } else {
        ("0.0f", "1.0f", "__uint_as_float(0x7FC00000u)")
    };
    format!(
        "extern \"C\" __global__ void nll_loss_{d}({st}* out, {ct}* parts, const {st}* x, const i64* tgt, const {st}* w, Layout L,\n\
         \x20   i64 classes, i64 xcs, i64 ws, i64 ignore, int has_w, int none, const void* fault) {{\n\
         \x20 for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < L.n; i += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   i64 o0 = (i64)i, o1 = (i64)i, o2 = (i64)i;\n\
         \x20   if (!L.contiguous) offsets(L, i, o0, o1, o2);\n\
         \x20   const i64 t = tgt[o0];\n\
         \x20   {ct} loss = {zero}, wt = {zero};\n\
         \x20   if (t != ignore) {{\n\
         \x20     if (t < 0 || t >= classes) {{\n\
         \x20       loss = {nan}; wt = {nan};\n\
         \x20       report_fault(fault, FAULT_TARGET, 1, t, classes, (i64)i);\n\
         \x20     }} else {{\n\
         \x20       wt = has_w ? {wv} : {one};\n\
         \x20       loss = -(wt * {xv});\n\
         \x20     }}\n\
         \x20   }}\n\
         \x20   if (none) out[o2] = {store};\n\
         \x20   else {{ parts[i] = loss; parts[L.n + i] = wt; }}\n\
         \x20 }}\n\
         }}\n",
        wv = load(d, "w[t * ws]"),
        xv = load(d, "x[o1 + t * xcs]"),
        store = store(d, "loss"),
    )
}

/// `nll_sum_<d>`, one block of 32 threads: the sum of `parts[0..n]` (and with `mean` of
/// `parts[n..2n]`, the divisor) in the CPU's `sum_in_order`: up to 4096 terms one after
/// another from 0; above, thread `j` adds the terms `i ≡ j (mod 32)` of the whole groups of
/// 32 in increasing `i`, the 32 partial sums are added as a tree (`p[j] += p[j + 16]`,
/// then `+ 8`, ..., `+ 1`), and the last `n mod 32` terms are added to it in order.
fn nll_sum(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let zero = if ct == "double" { "0.0" } else { "0.0f" };
    format!(
        "extern \"C\" __global__ void nll_sum_{d}({st}* out, const {ct}* parts, u64 n, int mean) {{\n\
         \x20 __shared__ {ct} lanes[2][32];\n\
         \x20 const unsigned j = threadIdx.x;\n\
         \x20 const u64 whole = n <= 4096 ? 0 : n / 32 * 32;\n\
         \x20 for (int s = 0; s < 2; ++s) {{\n\
         \x20   {ct} acc = {zero};\n\
         \x20   for (u64 i = j; i < whole; i += 32) acc = acc + parts[s * n + i];\n\
         \x20   lanes[s][j] = acc;\n\
         \x20 }}\n\
         \x20 __syncthreads();\n\
         \x20 if (j != 0) return;\n\
         \x20 {ct} total[2];\n\
         \x20 for (int s = 0; s < 2; ++s) {{\n\
         \x20   {ct} t = {zero};\n\
         \x20   if (whole > 0) {{\n\
         \x20     for (unsigned w = 16; w > 0; w >>= 1)\n\
         \x20       for (unsigned k = 0; k < w; ++k) lanes[s][k] = lanes[s][k] + lanes[s][k + w];\n\
         \x20     t = lanes[s][0];\n\
         \x20   }}\n\
         \x20   for (u64 i = whole; i < n; ++i) t = t + parts[s * n + i];\n\
         \x20   total[s] = t;\n\
         \x20 }}\n\
         \x20 out[0] = {store};\n\
         }}\n",
        store = store(d, "mean ? total[0] / total[1] : total[0]"),
    )
}

/// The guarded definition of `struct Attn`, the geometry of `attention_<d>`.
const ATTN: &str = "#ifndef EAGERVM_ATTN\n\
#define EAGERVM_ATTN\n\
// Sizes, strides and parameters of attention: kernels::cuda::nn::Attn names the slots.\n\
struct Attn { i64 v[64]; };\n\
#endif\n";

/// `attention_<d>`: one thread per query row `first + t` (of `[batch.., L]`, row-major),
/// in the CPU kernel's operations and order: `s[j] = (Σ_e q[i, e]·k[j, e]) · scale` adding
/// in increasing `e`; `-∞` above the diagonal with `causal`, where a `bool` mask is false;
/// a float mask added; the row's maximum (NaN where a score is NaN); `exp(s[j] − max)` and
/// their sum in increasing `j`; `out[i, d] = Σ_j (s[j] / sum)·v[j, d]` in increasing `j`,
/// rounded once. Products and sums go through `__fmul_rn` and `__fadd_rn` (`__dmul_rn`,
/// `__dadd_rn`), which are never contracted into FMA, so only `exp` differs from the
/// CPU's. The scores of row `t` are kept in `scores[t·S ..]`.
fn attention(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let (mul, add, exp, zero, ninf) = if ct == "double" {
        ("__dmul_rn", "__dadd_rn", "exp", "0.0", "__longlong_as_double((i64)0xFFF0000000000000ULL)")
    } else {
        ("__fmul_rn", "__fadd_rn", "expf", "0.0f", "__uint_as_float(0xFF800000u)")
    };
    let mut k = String::from(ATTN);
    let _ = write!(
        k,
        "extern \"C\" __global__ void attention_{d}({st}* out, const {st}* q, const {st}* k, const {st}* v, const void* mask, {ct}* scores, Attn A) {{\n\
         \x20 const u64 count = (u64)A.v[0];\n\
         \x20 const i64 L = A.v[1], S = A.v[2], E = A.v[3], EV = A.v[4];\n\
         \x20 const {ct} scale = ({ct})__longlong_as_double(A.v[7]);\n\
         \x20 for (u64 t = blockIdx.x * (u64)blockDim.x + threadIdx.x; t < count; t += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   const u64 row = (u64)A.v[57] + t;\n\
         \x20   const i64 i = (i64)(row % (u64)L);\n\
         \x20   u64 r = row / (u64)L;\n\
         \x20   i64 off[5] = {{0, 0, 0, 0, 0}};\n\
         \x20   for (int dim = (int)A.v[8] - 1; dim >= 0; --dim) {{\n\
         \x20     const u64 size = (u64)A.v[9 + dim];\n\
         \x20     const i64 at = (i64)(r % size);\n\
         \x20     r /= size;\n\
         \x20     for (int o = 0; o < 5; ++o) off[o] += at * A.v[16 + 8 * o + dim];\n\
         \x20   }}\n\
         \x20   const {st}* qr = q + off[0] + i * A.v[22];\n\
         \x20   {ct}* sc = scores + t * (u64)S;\n\
         \x20   for (i64 j = 0; j < S; ++j) {{\n\
         \x20     const {st}* kr = k + off[1] + j * A.v[30];\n\
         \x20     {ct} dot = {zero};\n\
         \x20     for (i64 e = 0; e < E; ++e) dot = {add}(dot, {mul}({qe}, {ke}));\n\
         \x20     {ct} x = {mul}(dot, scale);\n\
         \x20     if (A.v[5] && j > i) x = {ninf};\n\
         \x20     const i64 m = off[4] + i * A.v[54] + j * A.v[55];\n\
         \x20     if (A.v[6] == 1 && ((const u8*)mask)[m] == 0) x = {ninf};\n\
         \x20     if (A.v[6] == 2) x = {add}(x, {me});\n\
         \x20     sc[j] = x;\n\
         \x20   }}\n\
         \x20   {ct} mx = {ninf};\n\
         \x20   for (i64 j = 0; j < S; ++j) if (sc[j] > mx || sc[j] != sc[j]) mx = sc[j];\n\
         \x20   {ct} sum = {zero};\n\
         \x20   for (i64 j = 0; j < S; ++j) {{ sc[j] = {exp}(sc[j] - mx); sum = {add}(sum, sc[j]); }}\n\
         \x20   for (i64 c = 0; c < EV; ++c) {{\n\
         \x20     {ct} a = {zero};\n\
         \x20     for (i64 j = 0; j < S; ++j) a = {add}(a, {mul}(sc[j] / sum, {ve}));\n\
         \x20     out[off[3] + i * A.v[46] + c * A.v[47]] = {store};\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n",
        qe = load(d, "qr[e * A.v[23]]"),
        ke = load(d, "kr[e * A.v[31]]"),
        me = load(d, &format!("((const {st}*)mask)[m]")),
        ve = load(d, "v[off[2] + j * A.v[38] + c * A.v[39]]"),
        store = store(d, "a"),
    );
    k
}

/// `bmm_<d>` for an integer `d`: element `t` of the output's index space (`L`: the output,
/// `a` at row `i` and column 0 of its batch, `b` at row 0 and column `j`, see
/// `nn::int_layout`) adds `a[o1 + p·ak] · b[o2 + p·bk]` for `p < k` modulo 2^64.
fn int_bmm(d: DType) -> String {
    let st = storage(d);
    format!(
        "extern \"C\" __global__ void bmm_{d}({st}* c, const {st}* a, const {st}* b, Layout L, u64 k, i64 ak, i64 bk) {{\n\
         \x20 for (u64 t = blockIdx.x * (u64)blockDim.x + threadIdx.x; t < L.n; t += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   i64 o0 = (i64)t, o1 = (i64)t, o2 = (i64)t;\n\
         \x20   if (!L.contiguous) offsets(L, t, o0, o1, o2);\n\
         \x20   u64 acc = 0;\n\
         \x20   for (i64 p = 0; p < (i64)k; ++p) acc += (u64)(i64)a[o1 + p * ak] * (u64)(i64)b[o2 + p * bk];\n\
         \x20   c[o0] = ({st})acc;\n\
         \x20 }}\n\
         }}\n"
    )
}

/// The grid-stride loop over `G.v[28]` elements, the element number `t` and a copy `r` to
/// decompose.
const LOOP: &str = "  const u64 count = (u64)G.v[28];\n\
\x20 for (u64 t = blockIdx.x * (u64)blockDim.x + threadIdx.x; t < count; t += (u64)blockDim.x * gridDim.x) {\n\
\x20   u64 r = t;\n";

/// Decompose `r` into `[b, c, oy, ox]` over the sizes `G.v[0..4]`.
const NCHW: &str = "    const i64 ox = (i64)(r % (u64)G.v[3]); r /= (u64)G.v[3];\n\
\x20   const i64 oy = (i64)(r % (u64)G.v[2]); r /= (u64)G.v[2];\n\
\x20   const i64 c = (i64)(r % (u64)G.v[1]); r /= (u64)G.v[1];\n\
\x20   const i64 b = (i64)r;\n";

/// `im2col_<d>`: the matrix `[nb, C, kh, kw, OH, OW]` (row-major, `col[t]`) of the images
/// from `x`: the element at `x[b, c, oy·sh + i·dh − top, ox·sw + j·dw − left]`, or 0 in the
/// padding.
fn im2col(d: DType) -> String {
    let st = storage(d);
    let mut k = String::from(GEOM);
    let _ = write!(
        k,
        "extern \"C\" __global__ void im2col_{d}({st}* col, const {st}* x, const {st}* unused, Geom G) {{\n\
         \x20 (void)unused;\n\
         {LOOP}\
         \x20   const i64 ox = (i64)(r % (u64)G.v[3]); r /= (u64)G.v[3];\n\
         \x20   const i64 oy = (i64)(r % (u64)G.v[2]); r /= (u64)G.v[2];\n\
         \x20   const i64 j = (i64)(r % (u64)G.v[19]); r /= (u64)G.v[19];\n\
         \x20   const i64 i = (i64)(r % (u64)G.v[18]); r /= (u64)G.v[18];\n\
         \x20   const i64 c = (i64)(r % (u64)G.v[1]); r /= (u64)G.v[1];\n\
         \x20   const i64 b = (i64)r;\n\
         \x20   const i64 hy = oy * G.v[20] + i * G.v[24] - G.v[22];\n\
         \x20   const i64 wx = ox * G.v[21] + j * G.v[25] - G.v[23];\n\
         \x20   const bool inside = hy >= 0 && hy < G.v[16] && wx >= 0 && wx < G.v[17];\n\
         \x20   col[t] = inside ? x[b * G.v[4] + c * G.v[5] + hy * G.v[6] + wx * G.v[7]] : ({st})0;\n\
         \x20 }}\n\
         }}\n"
    );
    k
}

/// `conv_out_<d>`: output element `[b, o, oy, ox]` (strides `G.v[8..12]`) is the product's
/// element `t` (contiguous `[nb, O, OH, OW]`, in the compute type) plus `bias[o]` (stride
/// `G.v[12]`; 0 where `G.v[26]` says there is none), rounded once.
fn conv_out(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let zero = if ct == "double" { "0.0" } else { "0.0f" };
    let mut k = String::from(GEOM);
    let _ = write!(
        k,
        "extern \"C\" __global__ void conv_out_{d}({st}* out, const {ct}* prod, const {st}* bias, Geom G) {{\n\
         {LOOP}{NCHW}\
         \x20   const {ct} bv = G.v[26] ? {bias} : {zero};\n\
         \x20   out[b * G.v[8] + c * G.v[9] + oy * G.v[10] + ox * G.v[11]] = {out};\n\
         \x20 }}\n\
         }}\n",
        bias = load(d, "bias[c * G.v[12]]"),
        out = store(d, "prod[t] + bv"),
    );
    k
}

/// `max_pool2d_<d>`: the largest element of the window of output `[b, c, oy, ox]` (a later
/// element replaces the best when greater, or when NaN: the first of equal elements, the
/// last NaN), and with `G.v[26]` its plane index `hy·W + wx` into `idx` (strides
/// `G.v[12..16]`); a window with no element inside the input gives the lowest value and -1.
fn max_pool(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let mut k = String::from(GEOM);
    let _ = write!(
        k,
        "extern \"C\" __global__ void max_pool2d_{d}({st}* out, i64* idx, const {st}* x, Geom G) {{\n\
         {LOOP}{NCHW}\
         \x20   const {st}* xp = x + b * G.v[4] + c * G.v[5];\n\
         \x20   int found = 0;\n\
         \x20   {ct} best = 0;\n\
         \x20   i64 at = -1;\n\
         \x20   for (i64 i = 0; i < G.v[18]; ++i) {{\n\
         \x20     const i64 hy = oy * G.v[20] + i * G.v[24] - G.v[22];\n\
         \x20     if (hy < 0 || hy >= G.v[16]) continue;\n\
         \x20     for (i64 j = 0; j < G.v[19]; ++j) {{\n\
         \x20       const i64 wx = ox * G.v[21] + j * G.v[25] - G.v[23];\n\
         \x20       if (wx < 0 || wx >= G.v[17]) continue;\n\
         \x20       const {ct} v = {v};\n\
         \x20       if (!found || v > best || v != v) {{ found = 1; best = v; at = hy * G.v[17] + wx; }}\n\
         \x20     }}\n\
         \x20   }}\n\
         \x20   out[b * G.v[8] + c * G.v[9] + oy * G.v[10] + ox * G.v[11]] = found ? {best} : {lowest};\n\
         \x20   if (G.v[26]) idx[b * G.v[12] + c * G.v[13] + oy * G.v[14] + ox * G.v[15]] = at;\n\
         \x20 }}\n\
         }}\n",
        v = load(d, "xp[hy * G.v[6] + wx * G.v[7]]"),
        best = store(d, "best"),
        lowest = lowest(d),
    );
    k
}

/// `avg_pool2d_<d>`: the window of output `[b, c, oy, ox]` clipped to the padded input
/// (`pool` elements) and then to the input; its elements summed in row-major order from 0
/// and divided by `G.v[27]` when nonzero (`divisor_override`), else by `pool` with
/// `G.v[26]` (`count_include_pad`), else by the count inside; no element inside gives 0.
fn avg_pool(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let zero = if ct == "double" { "0.0" } else { "0.0f" };
    let mut k = String::from(GEOM);
    let _ = write!(
        k,
        "extern \"C\" __global__ void avg_pool2d_{d}({st}* out, i64* idx, const {st}* x, Geom G) {{\n\
         \x20 (void)idx;\n\
         {LOOP}{NCHW}\
         \x20   const {st}* xp = x + b * G.v[4] + c * G.v[5];\n\
         \x20   i64 h0 = oy * G.v[20] - G.v[22], w0 = ox * G.v[21] - G.v[23];\n\
         \x20   i64 h1 = h0 + G.v[18] < G.v[16] + G.v[22] ? h0 + G.v[18] : G.v[16] + G.v[22];\n\
         \x20   i64 w1 = w0 + G.v[19] < G.v[17] + G.v[23] ? w0 + G.v[19] : G.v[17] + G.v[23];\n\
         \x20   const i64 pool = (h1 - h0) * (w1 - w0);\n\
         \x20   h0 = h0 < 0 ? 0 : h0; w0 = w0 < 0 ? 0 : w0;\n\
         \x20   h1 = h1 < G.v[16] ? h1 : G.v[16]; w1 = w1 < G.v[17] ? w1 : G.v[17];\n\
         \x20   {ct} v = {zero};\n\
         \x20   if (h0 < h1 && w0 < w1) {{\n\
         \x20     {ct} s = {zero};\n\
         \x20     for (i64 hy = h0; hy < h1; ++hy)\n\
         \x20       for (i64 wx = w0; wx < w1; ++wx) s = s + {x};\n\
         \x20     const i64 n = G.v[27] != 0 ? G.v[27] : G.v[26] ? pool : (h1 - h0) * (w1 - w0);\n\
         \x20     v = s / ({ct})(double)n;\n\
         \x20   }}\n\
         \x20   out[b * G.v[8] + c * G.v[9] + oy * G.v[10] + ox * G.v[11]] = {out};\n\
         \x20 }}\n\
         }}\n",
        x = load(d, "xp[hy * G.v[6] + wx * G.v[7]]"),
        out = store(d, "v"),
    );
    k
}

/// `adaptive_avg_pool2d_<d>`: output `[b, c, oy, ox]` averages input rows
/// `⌊oy·H / OH⌋ .. ⌈(oy + 1)·H / OH⌉` and likewise columns, summed in row-major order from
/// 0 and divided by their count.
fn adaptive_avg_pool(d: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let zero = if ct == "double" { "0.0" } else { "0.0f" };
    let mut k = String::from(GEOM);
    let _ = write!(
        k,
        "extern \"C\" __global__ void adaptive_avg_pool2d_{d}({st}* out, i64* idx, const {st}* x, Geom G) {{\n\
         \x20 (void)idx;\n\
         {LOOP}{NCHW}\
         \x20   const {st}* xp = x + b * G.v[4] + c * G.v[5];\n\
         \x20   const i64 h0 = oy * G.v[16] / G.v[2], h1 = ((oy + 1) * G.v[16] + G.v[2] - 1) / G.v[2];\n\
         \x20   const i64 w0 = ox * G.v[17] / G.v[3], w1 = ((ox + 1) * G.v[17] + G.v[3] - 1) / G.v[3];\n\
         \x20   {ct} s = {zero};\n\
         \x20   for (i64 hy = h0; hy < h1; ++hy)\n\
         \x20     for (i64 wx = w0; wx < w1; ++wx) s = s + {x};\n\
         \x20   out[b * G.v[8] + c * G.v[9] + oy * G.v[10] + ox * G.v[11]] = {out};\n\
         \x20 }}\n\
         }}\n",
        x = load(d, "xp[hy * G.v[6] + wx * G.v[7]]"),
        out = store(d, &format!("s / ({ct})(double)((h1 - h0) * (w1 - w0))")),
    );
    k
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_its_dtypes_module_once() {
        let all = kernels();
        let mut names: Vec<&str> = all.iter().map(|(_, s, _)| s.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), all.len());
        assert_eq!(all.len(), 3 + 4 * 4 + 7 + 4 * 3);
        for (module, sym, text) in &all {
            assert!(sym.ends_with(&format!("_{module}")), "{sym} in {module}");
            assert_eq!(text.matches(&format!("void {sym}(")).count(), 1, "{sym}");
            assert_eq!(text.matches("__global__ void").count(), 1, "{sym}");
        }
    }

    /// The formulas the CPU kernels use, in the generated text: the max pool's tie and NaN
    /// rule, the average's divisor, one rounding on store, the 16-bit loads.
    #[test]
    fn kernels_compute_what_the_cpu_kernels_do() {
        let k = max_pool(DType::F16);
        assert!(k.contains("if (!found || v > best || v != v)"), "{k}");
        assert!(k.contains("found ? f32_to_f16(best) : (u16)0xFC00u"), "{k}");
        assert!(k.contains("const float v = f16_to_f32(xp[hy * G.v[6] + wx * G.v[7]]);"), "{k}");
        assert!(max_pool(DType::I32).contains("found ? (int)(best) : (int)0x80000000u"));
        let a = avg_pool(DType::BF16);
        assert!(a.contains("v = s / (float)(double)n;"), "{a}");
        assert!(a.contains("out[b * G.v[8] + c * G.v[9] + oy * G.v[10] + ox * G.v[11]] = f32_to_bf16(v);"));
        let c = conv_out(DType::F16);
        assert!(c.contains("const float* prod"), "{c}");
        assert!(c.contains("= f32_to_f16(prod[t] + bv);"), "{c}");
        assert!(conv_out(DType::F64).contains("const double* prod"));
        let ad = adaptive_avg_pool(DType::F32);
        assert!(ad.contains("(float)(s / (float)(double)((h1 - h0) * (w1 - w0)))"), "{ad}");
        assert!(int_bmm(DType::U8).contains("c[o0] = (u8)acc;"));
        let nl = nll_loss(DType::F16);
        assert!(nl.contains("loss = -(wt * f16_to_f32(x[o1 + t * xcs]));"), "{nl}");
        assert!(nl.contains("if (none) out[o2] = f32_to_f16(loss);"), "{nl}");
        let ns = nll_sum(DType::F64);
        assert!(ns.contains("const u64 whole = n <= 4096 ? 0 : n / 32 * 32;"), "{ns}");
        assert!(ns.contains("out[0] = (double)(mean ? total[0] / total[1] : total[0]);"), "{ns}");
        let at = attention(DType::BF16);
        assert!(at.contains("dot = __fadd_rn(dot, __fmul_rn(bf16_to_f32(qr[e * A.v[23]]), bf16_to_f32(kr[e * A.v[31]])));"), "{at}");
        assert!(at.contains("x = __fmul_rn(dot, scale);"), "{at}");
        assert!(at.contains("sc[j] = expf(sc[j] - mx); sum = __fadd_rn(sum, sc[j]);"), "{at}");
        assert!(at.contains("= f32_to_bf16(a);"), "{at}");
        assert!(attention(DType::F64)
            .contains("a = __dadd_rn(a, __dmul_rn(sc[j] / sum, v[off[2] + j * A.v[38] + c * A.v[39]]));"));
    }
}
