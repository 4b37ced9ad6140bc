//! Indexing, joining and the structured ops on CUDA: `tril`, `triu`, `one_hot`, `cat`,
//! `index_select`, `gather`, `scatter` (with its reductions), `index_add`, `index`,
//! `index_put` and `nonzero`, with the CPU kernels' shape rules and parameter lists (`kernels::index`,
//! `kernels::advanced`, `kernels::creation`).
//!
//! Every kernel takes operands of any layout and runs one thread per element of an index
//! space whose strides [`Layout4`] simplifies, as the elementwise kernels do:
//!
//! | op | one thread per | kernel |
//! | --- | --- | --- |
//! | `tril`, `triu` | output element: its row and column from its position in the index | `tril_<size>`, `triu_<size>` |
//! | `one_hot` | output element: 1 where the class of its row is its column | `one_hot_i64` |
//! | `cat` | element of an input, copied into its part of the output (one launch per input) | `cat_<size>` |
//! | `index_select`, `gather` | output element, reading `x` at the index | `take_<size>_<index dtype>` |
//! | `scatter`, `index_add` | line of the index (all its positions but along `dim`) | `scatter_<mode>_<dtype>_<index dtype>` |
//! | `index` | output element, reading `x` at the offset of its index position (`index_offsets_*` first sums each index tensor's part, one launch per tensor) | `index_<size>` |
//! | `index_put` | position of the output outside the indexed dimensions, walking the index shape in row-major order | `index_put_<set\|add>_<dtype>` |
//! | `nonzero` | chunk of 256 input elements: counted, the counts summed in order by one thread, then the chunk's coordinates written from its first row | `nonzero_count_<dtype>`, `nonzero_scan`, `nonzero_write_<dtype>` |
//!
//! # Order of `scatter` and `index_add`
//!
//! Two positions of the index that differ in a dimension other than `dim` write different
//! elements of the output, so one thread takes a whole line along `dim` and applies its
//! positions in increasing index: the order of the CPU kernels (row-major over the index,
//! or the source), so repeated indices give the CPU's result bit for bit: the last write
//! wins for `scatter`, and the additions (products) into one element are made in that
//! order, each rounded to the dtype as it is stored. No atomics. `index_put` likewise: the
//! positions of the output outside the indexed dimensions are independent, and each thread
//! walks the whole index shape in row-major order, the CPU's.
//!
//! # Indices out of range
//!
//! The CPU kernels check every index before writing and fail the call. On CUDA the indices
//! are in device memory, so the kernels check each index where they use it and report one
//! out of range to the stream's fault record (`ep::fault`; the record's device address is
//! the kernels' `c` operand, or their `fault` argument): `index_select` and `gather` (with
//! the dim), `index_offsets_*` for `index` and `index_put` (the original index, before a
//! negative one is counted from the end), `scatter` and `index_add`, `one_hot` (a class
//! outside `0..C`, reported by the row's first element). These kernels ask for a checked
//! launch (`OpKernel::checks_data`), so the call then fails with the CPU kernel's error
//! once the stream has run it. Meanwhile the element is 0 (all bits clear) for
//! `index_select`, `gather` and `index`, the row zeros for `one_hot`, and `scatter`,
//! `index_add` and `index_put` skip the position: no memory outside an operand is touched.

use cudarc::driver::PushKernelArg;

use super::infer::cpu_infer;
use super::launch::{device_operand, fault_record, launch_config, must_stage, stage, Dev};
use super::layout::Layout4;
use super::ops::bits_type;
use super::source::{arith, compute, load, product, storage, store};
use super::{function, on_stream};
use crate::kernels::index::dim_param;
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, Scalar, TensorMeta};

/// The index dtypes the kernels read.
const INDEX_DTYPES: [DType; 2] = [DType::I64, DType::I32];

/// How a `scatter_*` kernel applies a source element to its target.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `scatter` (reduce 0): the target is set.
    Set,
    /// `scatter` with reduce 1: the source is added.
    Add,
    /// `scatter` with reduce 2: the target is multiplied by the source.
    Mul,
    /// `index_add`: `alpha · source` is added.
    AddScaled,
}

impl Mode {
    const ALL: [Mode; 4] = [Mode::Set, Mode::Add, Mode::Mul, Mode::AddScaled];

    fn name(self) -> &'static str {
        match self {
            Mode::Set => "set",
            Mode::Add => "add",
            Mode::Mul => "mul",
            Mode::AddScaled => "add_scaled",
        }
    }
}

/// The kernel symbol of `scatter` in `mode` on `d` with indices of `ix`.
pub fn scatter_symbol(mode: Mode, d: DType, ix: DType) -> String {
    format!("scatter_{}_{d}_{ix}", mode.name())
}

/// The index space's kernels, as `(module, symbol, CUDA C)`: the ones that move bits by
/// element size go in `bits`, the others in their dtype's module.
pub fn sources() -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    let bits = super::source::BITS.to_string();
    for size in [1usize, 2, 4, 8] {
        let t = bits_type(size);
        for (op, cmp) in [("tril", "<="), ("triu", ">=")] {
            // `s`: columns, `t`: rows, `f`: the diagonal; `i` is the element's position.
            let body = format!(
                "const i64 col = (i64)(i % s); const i64 row = (i64)((i / s) % t); \
                 out[o0] = col - row {cmp} (i64)f ? a[o1] : ({t})0;"
            );
            let sym = format!("{op}_{size}");
            out.push((bits.clone(), sym.clone(), format!("EW3({sym}, {t}, {t}, u8, u8, {body})\n")));
        }
        let sym = format!("cat_{size}");
        out.push((bits.clone(), sym.clone(), format!("EW3({sym}, {t}, {t}, u8, u8, out[o0] = a[o1];)\n")));
        for ix in INDEX_DTYPES {
            // `b` holds the index; `s` is x's stride along `dim`, `t` its size there, `f`
            // the dim; `c` the fault record.
            let sym = format!("take_{size}_{ix}");
            let body = format!(
                "const i64 v = (i64)b[o2]; const bool ok = v >= 0 && v < (i64)t; \
                 if (!ok) report_fault(c, FAULT_INDEX, f, v, (i64)t, (i64)i); \
                 out[o0] = ok ? a[o1 + v * (i64)s] : ({t})0;"
            );
            let line = format!("EW3({sym}, {t}, {t}, {}, u8, {body})\n", storage(ix));
            out.push((bits.clone(), sym, line));
        }
    }
    for ix in INDEX_DTYPES {
        // `index`, `index_put`: the offset into x of each position of the index shape,
        // summed over the index tensors, one launch each (`s`: x's stride along the indexed
        // dimension, `t`: its size; `f` bit 0: negative indices count from the end, bit 1:
        // the first tensor; `f >> 2`: the dimension). An index out of range makes the
        // position's offset `NONE`, and is reported to the fault record `c`.
        let sym = format!("index_offsets_{ix}");
        let body = "const i64 v = (i64)a[o1]; const i64 w = ((f & 1) && v < 0) ? v + (i64)t : v; \
                    const i64 prev = (f & 2) ? 0 : out[o0]; const bool bad = w < 0 || w >= (i64)t; \
                    if (bad) report_fault(c, FAULT_INDEX, f >> 2, v, (i64)t, (i64)i); \
                    out[o0] = (prev == NONE || bad) ? NONE : prev + w * (i64)s;";
        out.push((bits.clone(), sym.clone(), format!("EW3({sym}, i64, {}, u8, u8, {body})\n", storage(ix))));
    }
    for size in [1usize, 2, 4, 8] {
        let t = bits_type(size);
        // `b` holds the position's offset into x.
        let sym = format!("index_{size}");
        let body = format!("const i64 w = b[o2]; out[o0] = w == NONE ? ({t})0 : a[o1 + w];");
        out.push((bits.clone(), sym.clone(), format!("EW3({sym}, {t}, {t}, i64, u8, {body})\n")));
    }
    for d in DType::ALL {
        for acc in [false, true] {
            let sym = index_put_symbol(d, acc);
            out.push((d.name().to_string(), sym.clone(), index_put_kernel(&sym, d, acc)));
        }
    }
    for d in DType::ALL {
        out.push((d.name().to_string(), format!("nonzero_count_{d}"), nonzero_kernel(d, false)));
        out.push((d.name().to_string(), format!("nonzero_write_{d}"), nonzero_kernel(d, true)));
    }
    out.push(("i64".into(), "nonzero_scan".into(), NONZERO_SCAN.into()));
    // `s`: the number of classes; `a` the class of the row; `c` the fault record, told of a
    // class outside `0..s` by the row's first element.
    let body = "const i64 v = a[o1]; const u64 col = i % s; \
                if (col == 0 && (v < 0 || v >= (i64)s)) report_fault(c, FAULT_CLASS, 0, v, (i64)s, (i64)(i / s)); \
                out[o0] = v == (i64)col ? 1 : 0;";
    out.push(("i64".into(), "one_hot_i64".into(), format!("EW3(one_hot_i64, i64, i64, u8, u8, {body})\n")));
    for d in DType::ALL {
        for ix in INDEX_DTYPES {
            for mode in Mode::ALL {
                let sym = scatter_symbol(mode, d, ix);
                out.push((d.name().to_string(), sym.clone(), scatter_kernel(&sym, mode, d, ix)));
            }
        }
    }
    out
}

/// `scatter_<mode>_<d>_<ix>`: thread `q` takes line `q` of the index space (`L`, operands
/// out, index, src at the line's start) and applies positions `j = 0 .. len - 1` in order:
/// index `idx[j·is]`, when inside `0..size`, names target `out[v·os]`, which takes
/// `src[j·ss]` as `mode` says (`alpha`: the scale of `index_add`, in the compute type's bits);
/// one outside is skipped and reported to the fault record `fault` (dimension `dim`).
fn scatter_kernel(sym: &str, mode: Mode, d: DType, ix: DType) -> String {
    let (st, ct) = (storage(d), compute(d));
    let target = "out[o0 + v * os]";
    let source = "src[o2 + j * ss]";
    let p = load(d, target);
    let q = load(d, source);
    let alpha = match ct {
        "float" => "__uint_as_float((u32)alpha)",
        "double" => "__longlong_as_double((i64)alpha)",
        "int" => "(int)(i64)alpha",
        _ => "(i64)alpha",
    };
    let apply = match mode {
        Mode::Set => format!("{target} = {source};"),
        Mode::Add | Mode::Mul => {
            let op = if mode == Mode::Add { super::ops::Arith::Add } else { super::ops::Arith::Mul };
            format!(
                "const {ct} p = {p}; const {ct} q = {q}; {target} = {};",
                store(d, &arith(op, d, "p", "q"))
            )
        }
        Mode::AddScaled => {
            let scaled = product(d, "q", "a");
            let sum = match d {
                DType::Bool => format!("p | (int)({scaled})"),
                DType::I32 | DType::I64 | DType::U8 => format!("(u64)p + (u64)({scaled})"),
                _ => format!("p + {scaled}"),
            };
            format!("const {ct} p = {p}; const {ct} q = {q}; {target} = {};", store(d, &sum))
        }
    };
    format!(
        "extern \"C\" __global__ void {sym}({st}* out, const {ixt}* idx, const {st}* src, Layout4 L,\n\
         \x20   i64 len, i64 is, i64 ss, i64 os, i64 size, u64 alpha, const void* fault, i64 dim) {{\n\
         \x20 const {ct} a = {alpha}; (void)a;\n\
         \x20 for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < L.n; i += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   i64 o0 = (i64)i, o1 = (i64)i, o2 = (i64)i, o3 = 0;\n\
         \x20   if (!L.contiguous) offsets4(L, i, o0, o1, o2, o3);\n\
         \x20   for (i64 j = 0; j < len; ++j) {{\n\
         \x20     const i64 v = (i64)idx[o1 + j * is];\n\
         \x20     if (v < 0 || v >= size) {{ report_fault(fault, FAULT_INDEX, (u64)dim, v, size, (i64)i); continue; }}\n\
         \x20     {apply}\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n",
        ixt = storage(ix),
    )
}

/// Elements of `nonzero`'s input per chunk: one thread counts, then writes, each chunk.
pub const NONZERO_CHUNK: u64 = 256;

/// `nonzero_scan`: one thread turns the chunks' counts into their first output rows (an
/// exclusive prefix sum, in increasing chunk order) and zeroes the output's rows past the
/// total (where the caller's count was too large).
const NONZERO_SCAN: &str = "extern \"C\" __global__ void nonzero_scan(i64* counts, u64 chunks, i64* out, i64 rows, i64 rank, i64 os0, i64 os1) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  i64 total = 0;
  for (u64 c = 0; c < chunks; ++c) {
    const i64 n = counts[c];
    counts[c] = total;
    total += n;
  }
  for (i64 r = total; r < rows; ++r) {
    for (i64 d = 0; d < rank; ++d) out[r * os0 + d * os1] = 0;
  }
}
";

/// `nonzero_count_<d>` (`write` false): thread `c` counts the nonzero elements of chunk `c`
/// (elements `c·chunk ..`, row-major over `L`'s unmerged dimensions, operand 0 the input)
/// into `counts[c]`. `nonzero_write_<d>`: thread `c` walks chunk `c` again and writes the
/// coordinates of each nonzero element into the output's next row from `starts[c]`
/// (rows at or past `rows` are dropped).
fn nonzero_kernel(d: DType, write: bool) -> String {
    let st = storage(d);
    let zero = match compute(d) {
        "float" => "0.0f",
        "double" => "0.0",
        _ => "0",
    };
    let test = format!("{} != {zero}", load(d, "x[o0]"));
    let (name, params, init, found, done) = if write {
        (
            "write",
            "i64* out, const i64* starts, i64 rows, i64 os0, i64 os1",
            "i64 row = starts[c];",
            "if (row < rows) {\n\
             \x20       u64 rest = i;\n\
             \x20       for (int k = L.ndim - 1; k >= 0; --k) {\n\
             \x20         const u64 size = (u64)L.size[k];\n\
             \x20         out[row * os0 + k * os1] = (i64)(rest % size);\n\
             \x20         rest /= size;\n\
             \x20       }\n\
             \x20     }\n\
             \x20     ++row;",
            "",
        )
    } else {
        ("count", "i64* counts", "i64 count = 0;", "++count;", "counts[c] = count;")
    };
    format!(
        "extern \"C\" __global__ void nonzero_{name}_{d}({params}, const {st}* x, Layout4 L, u64 chunk, u64 chunks) {{\n\
         \x20 for (u64 c = blockIdx.x * (u64)blockDim.x + threadIdx.x; c < chunks; c += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   {init}\n\
         \x20   const u64 end = (c + 1) * chunk < L.n ? (c + 1) * chunk : L.n;\n\
         \x20   for (u64 i = c * chunk; i < end; ++i) {{\n\
         \x20     i64 o0, o1, o2, o3;\n\
         \x20     offsets4(L, i, o0, o1, o2, o3);\n\
         \x20     if ({test}) {{\n\
         \x20     {found}\n\
         \x20     }}\n\
         \x20   }}\n\
         \x20   {done}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// The kernel symbol of `index_put` on `d`, accumulating or not.
pub fn index_put_symbol(d: DType, acc: bool) -> String {
    format!("index_put_{}_{d}", if acc { "add" } else { "set" })
}

/// `index_put_<set|add>_<d>`: thread `i` takes one position of the output's dimensions
/// outside the indexed ones (`L` over them, the output's strides), `pf` its prefix and `sf`
/// its suffix in row-major order, and walks the `nb` positions of the index shape in
/// increasing order: offset `offs[b]` (skipped when `NONE`) names the target, which takes
/// the contiguous values' element `(pf · nb + b) · nsuffix + sf`.
fn index_put_kernel(sym: &str, d: DType, acc: bool) -> String {
    let (st, ct) = (storage(d), compute(d));
    let target = "out[o0 + w]";
    let source = "vals[(pf * nb + b) * nsuffix + sf]";
    let apply = if acc {
        let (p, q) = (load(d, target), load(d, source));
        format!(
            "const {ct} p = {p}; const {ct} q = {q}; {target} = {};",
            store(d, &arith(super::ops::Arith::Add, d, "p", "q"))
        )
    } else {
        format!("{target} = {source};")
    };
    format!(
        "extern \"C\" __global__ void {sym}({st}* out, const i64* offs, const {st}* vals, Layout4 L, i64 nb, i64 nsuffix) {{\n\
         \x20 for (u64 i = blockIdx.x * (u64)blockDim.x + threadIdx.x; i < L.n; i += (u64)blockDim.x * gridDim.x) {{\n\
         \x20   i64 o0 = (i64)i, o1 = 0, o2 = 0, o3 = 0;\n\
         \x20   if (!L.contiguous) offsets4(L, i, o0, o1, o2, o3);\n\
         \x20   const i64 pf = (i64)(i / (u64)nsuffix), sf = (i64)(i % (u64)nsuffix);\n\
         \x20   for (i64 b = 0; b < nb; ++b) {{\n\
         \x20     const i64 w = offs[b];\n\
         \x20     if (w == NONE) continue;\n\
         \x20     {apply}\n\
         \x20   }}\n\
         \x20 }}\n\
         }}\n"
    )
}

/// Launch an `EW3` kernel over `shape`: operands as `(address, strides over shape)`,
/// output first, at most three; `record`, a fault record's device address (or 0), as the
/// fourth pointer (`c`), for the kernels that check their indices.
fn launch(
    s: &crate::ep::cuda::CudaEpStream,
    op: &'static str,
    sym: &str,
    shape: &[usize],
    operands: &[(u64, Vec<isize>)],
    scalars: [u64; 3],
    record: u64,
) -> Result<(), String> {
    let n: usize = shape.iter().product();
    if n == 0 {
        return Ok(());
    }
    let lists: Vec<&[isize]> = operands.iter().map(|o| o.1.as_slice()).collect();
    let layout = Layout4::plan(shape, &lists)?;
    let f = function(s, sym)?;
    let addr = |k: usize| operands.get(k).map_or(0, |o| o.0);
    let (o, a, b, c) = (addr(0), addr(1), addr(2), record);
    let [x, y, z] = scalars;
    s.set_label(op);
    let mut l = s.cuda_stream().launch_builder(&f);
    l.arg(&o).arg(&a).arg(&b).arg(&c).arg(&x).arg(&y).arg(&z).arg(&layout);
    // SAFETY: every `EW3` kernel takes (out*, const a*, const b*, const c*, u64, u64, u64,
    // Layout4) (`source::PRELUDE`), matching these arguments. Each operand's strides over
    // `shape` name only elements of its checked layout (the callers build them from the
    // operand's own strides over a shape no larger than its own, or 0), and the kernels
    // that read at an index read there only inside the bound they are given. `c` is 0 or
    // the stream's fault record, which lives as long as the stream, in memory the device
    // may write.
    unsafe { l.launch(launch_config(n)) }.map(|_| ()).map_err(|e| format!("launching {sym}: {e}"))
}

/// An operand's shape and strides, a 0-d one as one element of one dimension (the index
/// ops treat a 0-d tensor as a tensor of one element, as PyTorch does).
fn rank1(m: &TensorMeta) -> (Vec<usize>, Vec<isize>) {
    if m.shape.is_empty() {
        (vec![1], vec![0])
    } else {
        (m.shape.to_vec(), m.strides.to_vec())
    }
}

/// The output the CPU kernel's rule gives for the call, checked against the given one.
fn check_output(name: &str, ctx: &KernelCtx<'_, '_>) -> Result<(), String> {
    let metas: Vec<&TensorMeta> = ctx.inputs.iter().map(|v| v.meta).collect();
    let given: Vec<&TensorMeta> = ctx.outputs.iter().map(|v| v.meta).collect();
    let mut specs = OutSpecs::new();
    cpu_infer(name, &metas, &given, &ctx.attrs, &mut specs)?;
    let out = ctx.outputs.first().ok_or("missing output 0")?;
    let want = specs.first().ok_or("no output inferred")?;
    if out.meta.shape != want.shape || out.meta.dtype != want.dtype {
        return Err(format!(
            "output 0 is {} but {name} makes {}{:?}",
            out.meta.describe(),
            want.dtype,
            want.shape.as_slice()
        ));
    }
    Ok(())
}

/// An input as a device operand, copied aside when it shares bytes with `out` other than
/// element for element.
fn read_side<'a>(
    s: &crate::ep::cuda::CudaEpStream,
    op: &'static str,
    i: usize,
    v: &'a crate::vm::TensorView<'_>,
    out: &Dev<'_>,
) -> Result<Dev<'a>, String> {
    let d = device_operand(s, &format!("input {i}"), v.meta, v.data)?;
    if must_stage(&d, out) {
        stage(s, op, &d)
    } else {
        Ok(d)
    }
}

/// Defines a CUDA kernel struct whose shape rule is the CPU kernel's.
macro_rules! cuda_op {
    ($(#[$doc:meta])* $kernel:ident, $op:literal, $dtypes:expr, in_place: $in_place:literal, checks: $checks:literal, |$ctx:ident| $body:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, Default)]
        pub struct $kernel;

        impl OpKernel for $kernel {
            fn name(&self) -> &'static str {
                $op
            }

            fn dtypes(&self) -> &'static [DType] {
                $dtypes
            }

            fn infer(
                &self,
                inputs: &[&TensorMeta],
                given: &[&TensorMeta],
                attrs: &Attrs,
                out: &mut OutSpecs,
            ) -> Result<(), String> {
                cpu_infer($op, inputs, given, attrs, out)
            }

            fn strided(&self) -> bool {
                true
            }

            fn in_place(&self) -> bool {
                $in_place
            }

            fn checks_data(&self, _: &Attrs) -> bool {
                $checks
            }

            fn compute(&self, $ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
                check_output($op, $ctx)?;
                $body
            }
        }
    };
}

/// `tril` or `triu` (`op`) of the one input.
fn triangle(ctx: &KernelCtx<'_, '_>, op: &'static str) -> Result<(), String> {
    let k = ctx.attrs.params().int_or(0, 0);
    let (x, out) = (ctx.inputs.first().ok_or("missing input 0")?, &ctx.outputs[0]);
    let shape = out.meta.shape.to_vec();
    let r = shape.len();
    let (rows, cols) = (shape[r - 2] as u64, shape[r - 1] as u64);
    let sym = format!("{op}_{}", out.meta.dtype.size());
    on_stream(op, |s| {
        let o = device_operand(s, "output 0", out.meta, out.data)?;
        let a = read_side(s, op, 0, x, &o)?;
        let ops = [(o.addr(), o.meta.strides.to_vec()), (a.addr(), a.meta.strides.to_vec())];
        launch(s, op, &sym, &shape, &ops, [cols, rows, k as u64], 0)
    })
}

cuda_op!(
    /// `tril` on CUDA: the elements above diagonal `k` zeroed.
    CudaTril, "tril", &DType::ALL, in_place: true, checks: false, |ctx| triangle(ctx, "tril")
);
cuda_op!(
    /// `triu` on CUDA: the elements below diagonal `k` zeroed.
    CudaTriu, "triu", &DType::ALL, in_place: true, checks: false, |ctx| triangle(ctx, "triu")
);

cuda_op!(
    /// `one_hot` on CUDA: `i64` class indices to rows of 0 and 1.
    CudaOneHot, "one_hot", &[DType::I64], in_place: false, checks: true, |ctx| {
        let c = ctx.attrs.params().int_or(0, -1);
        let (x, out) = (ctx.inputs.first().ok_or("missing input 0")?, &ctx.outputs[0]);
        let shape = out.meta.shape.to_vec();
        on_stream("one_hot", |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            let a = read_side(s, "one_hot", 0, x, &o)?;
            let mut sa = a.meta.strides.to_vec();
            sa.push(0);
            let ops = [(o.addr(), o.meta.strides.to_vec()), (a.addr(), sa)];
            launch(s, "one_hot", "one_hot_i64", &shape, &ops, [c as u64, 0, 0], fault_record(s))
        })
    }
);

cuda_op!(
    /// `cat` on CUDA: each input copied into its part of the output along `dim`.
    CudaCat, "cat", &DType::ALL, in_place: false, checks: false, |ctx| {
        let out = &ctx.outputs[0];
        // The dim of the first input `cat` keeps (1-D empty inputs are skipped).
        let skipped = |m: &TensorMeta| m.shape.len() == 1 && m.shape[0] == 0;
        let Some(first) = ctx.inputs.iter().find(|v| !skipped(v.meta)) else { return Ok(()) };
        let d = dim_param("cat", &ctx.attrs, 0, first.meta.shape.len())?;
        let sym = format!("cat_{}", out.meta.dtype.size());
        let inputs = ctx.inputs;
        on_stream("cat", |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            let size = out.meta.dtype.size() as i64;
            let mut start = 0usize;
            for (i, v) in inputs.iter().enumerate() {
                if skipped(v.meta) {
                    continue;
                }
                let a = read_side(s, "cat", i, v, &o)?;
                let at = o.addr() as i64 + start as i64 * o.meta.strides[d] as i64 * size;
                let ops = [(at as u64, o.meta.strides.to_vec()), (a.addr(), a.meta.strides.to_vec())];
                launch(s, "cat", &sym, &v.meta.shape, &ops, [0; 3], 0)?;
                start += v.meta.shape[d];
            }
            Ok(())
        })
    }
);

/// `x`'s strides over an output of rank `rank` with the one along `d` cleared, its stride
/// along `d` and its size there (a 0-d `x`: zeros, 0 and 1).
fn along(x: &TensorMeta, rank: usize, d: usize) -> (Vec<isize>, isize, usize) {
    if x.shape.is_empty() || rank == 0 {
        let (sd, n) = (x.strides.get(d).copied().unwrap_or(0), x.shape.get(d).copied().unwrap_or(1));
        return (vec![0; rank], sd, n);
    }
    let mut st = x.strides.to_vec();
    st[d] = 0;
    (st, x.strides[d], x.shape[d])
}

/// `index_select` (`select`) or `gather` of inputs `(x, index)`.
fn take(ctx: &KernelCtx<'_, '_>, op: &'static str, select: bool) -> Result<(), String> {
    let (x, ix, out) = (&ctx.inputs[0], &ctx.inputs[1], &ctx.outputs[0]);
    let d = dim_param(op, &ctx.attrs, 0, x.meta.shape.len())?;
    let shape = out.meta.shape.to_vec();
    let rank = shape.len();
    let sym = format!("take_{}_{}", out.meta.dtype.size(), ix.meta.dtype);
    on_stream(op, |s| {
        let o = device_operand(s, "output 0", out.meta, out.data)?;
        let a = read_side(s, op, 0, x, &o)?;
        let b = read_side(s, op, 1, ix, &o)?;
        let (sx, sd, size) = along(&a.meta, rank, d);
        let si = if select {
            // Position `p` of the output reads index element `p[d]`.
            let mut si = vec![0isize; rank];
            if rank > 0 {
                si[d] = b.meta.strides.first().copied().unwrap_or(0);
            }
            si
        } else if b.meta.shape.is_empty() {
            vec![0; rank]
        } else {
            b.meta.strides.to_vec()
        };
        let ops = [(o.addr(), o.meta.strides.to_vec()), (a.addr(), sx), (b.addr(), si)];
        launch(s, op, &sym, &shape, &ops, [sd as i64 as u64, size as u64, d as u64], fault_record(s))
    })
}

cuda_op!(
    /// `index_select` on CUDA: `x`'s slices along `dim` at the indices.
    CudaIndexSelect, "index_select", &DType::ALL, in_place: false, checks: true, |ctx| take(ctx, "index_select", true)
);
cuda_op!(
    /// `gather` on CUDA: `out[i] = x[i with coordinate dim replaced by index[i]]`.
    CudaGather, "gather", &DType::ALL, in_place: false, checks: true, |ctx| take(ctx, "gather", false)
);

/// `scatter` (`index_add` false) or `index_add` of inputs `(x, index, src)`: `out` = `x`,
/// then the lines of the index applied (see the module docs).
fn scatter(ctx: &KernelCtx<'_, '_>, op: &'static str, index_add: bool) -> Result<(), String> {
    let (x, ix, src, out) = (&ctx.inputs[0], &ctx.inputs[1], &ctx.inputs[2], &ctx.outputs[0]);
    let d = dim_param(op, &ctx.attrs, 0, x.meta.shape.len())?;
    let dtype = out.meta.dtype;
    let (mode, alpha) = if index_add {
        let alpha = ctx.attrs.params().scalar(0).unwrap_or(Scalar::Int(1));
        (Mode::AddScaled, super::elementwise::arith_bits(dtype, alpha))
    } else {
        let mode = match ctx.attrs.params().int_or(1, 0) {
            0 => Mode::Set,
            1 => Mode::Add,
            2 => Mode::Mul,
            r => return Err(format!("scatter: reduce {r} is not one of 0 (none), 1 (add), 2 (multiply)")),
        };
        (mode, 0)
    };
    let sym = scatter_symbol(mode, dtype, ix.meta.dtype);
    let copy = format!("cat_{}", dtype.size());
    on_stream(op, |s| {
        let o = device_operand(s, "output 0", out.meta, out.data)?;
        let xd = device_operand(s, "input 0", x.meta, x.data)?;
        let b = read_side(s, op, 1, ix, &o)?;
        let c = read_side(s, op, 2, src, &o)?;
        // The output starts as x (nothing to do where x is the output itself).
        if must_stage(&xd, &o) {
            let staged = stage(s, op, &xd)?;
            let ops = [(o.addr(), o.meta.strides.to_vec()), (staged.addr(), staged.meta.strides.to_vec())];
            launch(s, op, &copy, &out.meta.shape, &ops, [0; 3], 0)?;
        } else if xd.addr() != o.addr() || xd.meta.strides != o.meta.strides {
            let ops = [(o.addr(), o.meta.strides.to_vec()), (xd.addr(), xd.meta.strides.to_vec())];
            launch(s, op, &copy, &out.meta.shape, &ops, [0; 3], 0)?;
        }
        let (oshape, ostrides) = rank1(&o.meta);
        let (cshape, cstrides) = rank1(&c.meta);
        let d = if x.meta.shape.is_empty() { 0 } else { d };
        // The lines: the index's shape (scatter) or the source's (index_add), 1 along dim.
        let (mut lines, istrides, len, is) = if index_add {
            let is = b.meta.strides.first().copied().unwrap_or(0);
            (cshape.clone(), vec![0isize; cshape.len()], b.meta.numel(), is)
        } else {
            let (ishape, istrides) = rank1(&b.meta);
            (ishape.clone(), istrides.clone(), ishape[d], istrides[d])
        };
        if len == 0 || lines.contains(&0) {
            return Ok(());
        }
        lines[d] = 1;
        let layout = Layout4::plan(&lines, &[&ostrides, &istrides, &cstrides])?;
        let f = function(s, &sym)?;
        let (po, pi, ps) = (o.addr(), b.addr(), c.addr());
        let (len, is, ss, os, size) =
            (len as i64, is as i64, cstrides[d] as i64, ostrides[d] as i64, oshape[d] as i64);
        let (fault, dim) = (fault_record(s), d as i64);
        s.set_label(op);
        let mut l = s.cuda_stream().launch_builder(&f);
        l.arg(&po).arg(&pi).arg(&ps).arg(&layout).arg(&len).arg(&is).arg(&ss).arg(&os).arg(&size).arg(&alpha);
        l.arg(&fault).arg(&dim);
        // SAFETY: `scatter_*` takes (T*, const IX*, const T*, Layout4, i64 x5, u64, const
        // void*, i64), matching these arguments; `fault` is 0 or the stream's fault record,
        // which lives as long as the stream, in memory the device may write. Every line starts at a position inside the index (scatter) or the
        // source (index_add) with coordinate `dim` 0; the index fits the output in every
        // dimension but `dim` and the source in all (the CPU kernel's rule, checked above),
        // so the line's offsets plus `j·is` (`j < len`), `j·ss` and `v·os` (`v` checked in
        // `0..size`) are elements of the checked operands. The index and the source do not
        // overlap the output (copied aside otherwise); each line writes its own elements.
        unsafe { l.launch(launch_config(layout.n as usize)) }
            .map(|_| ())
            .map_err(|e| format!("launching {sym}: {e}"))
    })
}

cuda_op!(
    /// `scatter` on CUDA (reduce 0, 1: add, 2: multiply), in the CPU kernel's order.
    CudaScatter, "scatter", &DType::ALL, in_place: true, checks: true, |ctx| scatter(ctx, "scatter", false)
);
cuda_op!(
    /// `index_add` on CUDA, in the CPU kernel's order.
    CudaIndexAdd, "index_add", &DType::ALL, in_place: true, checks: true, |ctx| scatter(ctx, "index_add", true)
);

/// The offsets into `x` (its `shape` and `strides`) of every position of the index shape
/// `b` (row-major, in a contiguous `i64` temporary), from the index tensors `idx` indexing
/// dimensions `d0 ..` of `x`; `NONE` where an index is out of range.
fn index_offsets(
    s: &crate::ep::cuda::CudaEpStream,
    op: &'static str,
    x: &TensorMeta,
    idx: &[Dev<'_>],
    d0: usize,
    b: &[usize],
    wrap: bool,
) -> Result<Dev<'static>, String> {
    let offs = super::launch::contiguous_temp(s, b, DType::I64)?;
    for (j, t) in idx.iter().enumerate() {
        let st = super::layout::broadcast_strides(&format!("index tensor {j}"), &t.meta, b)?;
        let flags = u64::from(wrap) | u64::from(j == 0) << 1 | ((d0 + j) as u64) << 2;
        let (stride, size) = (x.strides[d0 + j] as i64 as u64, x.shape[d0 + j] as u64);
        let ops = [(offs.addr(), offs.meta.strides.to_vec()), (t.addr(), st)];
        let sym = format!("index_offsets_{}", t.meta.dtype);
        launch(s, op, &sym, b, &ops, [stride, size, flags], fault_record(s))?;
    }
    Ok(offs)
}

/// The index shape `B` of `index` (`index_put`) with output (values) shape `shape` over `x`
/// of rank `rank` with `k` index tensors from `d0`.
fn index_shape(shape: &[usize], rank: usize, k: usize, d0: usize) -> Vec<usize> {
    let nb = shape.len() + k - rank;
    shape[d0..d0 + nb].to_vec()
}

cuda_op!(
    /// `index` on CUDA: `x`'s elements at the index tensors (`ints = [d0]`), negative
    /// indices from the end; the offsets first (one launch per index tensor), then one
    /// thread per output element.
    CudaIndex, "index", &DType::ALL, in_place: false, checks: true, |ctx| {
        let (x, out) = (&ctx.inputs[0], &ctx.outputs[0]);
        let d0 = ctx.attrs.params().int_or(0, 0) as usize;
        let k = ctx.inputs.len() - 1;
        let shape = out.meta.shape.to_vec();
        let b = index_shape(&shape, x.meta.shape.len(), k, d0);
        let nb = b.len();
        let sym = format!("index_{}", out.meta.dtype.size());
        let inputs = ctx.inputs;
        on_stream("index", |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            if o.meta.numel() == 0 {
                return Ok(());
            }
            let a = read_side(s, "index", 0, x, &o)?;
            let idx = (1..=k).map(|j| read_side(s, "index", j, &inputs[j], &o)).collect::<Result<Vec<_>, _>>()?;
            let offs = index_offsets(s, "index", &a.meta, &idx, d0, &b, true)?;
            // x's strides outside the indexed dimensions; the offsets' along the index shape.
            let mut sx: Vec<isize> = a.meta.strides[..d0].to_vec();
            sx.extend(std::iter::repeat_n(0, nb));
            sx.extend_from_slice(&a.meta.strides[d0 + k..]);
            let mut so = vec![0isize; d0];
            so.extend_from_slice(&offs.meta.strides);
            so.extend(std::iter::repeat_n(0, shape.len() - d0 - nb));
            let ops = [(o.addr(), o.meta.strides.to_vec()), (a.addr(), sx), (offs.addr(), so)];
            launch(s, "index", &sym, &shape, &ops, [0; 3], 0)
        })
    }
);

cuda_op!(
    /// `index_put` on CUDA (`ints = [d0, accumulate, strict]`): the output a copy of `x`
    /// with the values written (added) at the indices in row-major order of the index
    /// shape, one thread per position outside the indexed dimensions.
    CudaIndexPut, "index_put", &DType::ALL, in_place: true, checks: true, |ctx| {
        let (x, vals, out) = (&ctx.inputs[0], &ctx.inputs[1], &ctx.outputs[0]);
        let p = ctx.attrs.params();
        let (d0, acc, wrap) = (p.int_or(0, 0) as usize, p.int_or(1, 0) == 1, p.int_or(2, 0) == 0);
        let k = ctx.inputs.len() - 2;
        let dtype = out.meta.dtype;
        let b = index_shape(&vals.meta.shape, x.meta.shape.len(), k, d0);
        let nb: usize = b.iter().product();
        let sym = index_put_symbol(dtype, acc);
        let copy = format!("cat_{}", dtype.size());
        let inputs = ctx.inputs;
        on_stream("index_put", |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            let xd = device_operand(s, "input 0", x.meta, x.data)?;
            let v = device_operand(s, "input 1", vals.meta, vals.data)?;
            let v = if !v.is_contiguous() || must_stage(&v, &o) { stage(s, "index_put", &v)? } else { v };
            let idx = (2..2 + k).map(|j| read_side(s, "index_put", j, &inputs[j], &o)).collect::<Result<Vec<_>, _>>()?;
            // The output starts as x (nothing to do where x is the output itself).
            if must_stage(&xd, &o) {
                let staged = stage(s, "index_put", &xd)?;
                let ops = [(o.addr(), o.meta.strides.to_vec()), (staged.addr(), staged.meta.strides.to_vec())];
                launch(s, "index_put", &copy, &out.meta.shape, &ops, [0; 3], 0)?;
            } else if xd.addr() != o.addr() || xd.meta.strides != o.meta.strides {
                let ops = [(o.addr(), o.meta.strides.to_vec()), (xd.addr(), xd.meta.strides.to_vec())];
                launch(s, "index_put", &copy, &out.meta.shape, &ops, [0; 3], 0)?;
            }
            if v.meta.numel() == 0 {
                return Ok(());
            }
            let offs = index_offsets(s, "index_put", &o.meta, &idx, d0, &b, wrap)?;
            // The output's dimensions outside the indexed ones.
            let mut lines: Vec<usize> = o.meta.shape[..d0].to_vec();
            lines.extend_from_slice(&o.meta.shape[d0 + k..]);
            let mut ls: Vec<isize> = o.meta.strides[..d0].to_vec();
            ls.extend_from_slice(&o.meta.strides[d0 + k..]);
            let nsuffix: usize = o.meta.shape[d0 + k..].iter().product();
            let layout = Layout4::plan(&lines, &[&ls])?;
            let f = function(s, &sym)?;
            let (po, pf, pv) = (o.addr(), offs.addr(), v.addr());
            let (nb, nsuffix) = (nb as i64, nsuffix as i64);
            s.set_label("index_put");
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&po).arg(&pf).arg(&pv).arg(&layout).arg(&nb).arg(&nsuffix);
            // SAFETY: `index_put_*` takes (T*, const i64*, const T*, Layout4, i64, i64),
            // matching these arguments. Each thread's `o0` is an element of the output with
            // the indexed coordinates 0; `offs[b]` (`b < nb`, the temporary's length) is
            // `NONE` or the offset of in-range indexed coordinates in the output's strides,
            // so `o0 + offs[b]` is an element of the output; the values are contiguous of
            // the shape prefix + index shape + suffix, so the element read is inside them.
            // The values and the index tensors do not overlap the output (copied aside
            // otherwise); threads write disjoint elements (they differ outside the indexed
            // dimensions).
            unsafe { l.launch(launch_config(layout.n as usize)) }
                .map(|_| ())
                .map_err(|e| format!("launching {sym}: {e}"))
        })
    }
);

/// `nonzero`'s input as a layout of its own dimensions, unmerged (the kernels compute the
/// coordinates from them), operand 0 its strides; an error past [`super::layout::MAX_DIMS`].
pub fn unmerged(x: &TensorMeta) -> Result<Layout4, String> {
    use super::layout::MAX_DIMS;
    let rank = x.shape.len();
    if rank > MAX_DIMS {
        return Err(format!(
            "nonzero on CUDA takes at most {MAX_DIMS} dimensions; the input is {}",
            x.describe()
        ));
    }
    let mut l = Layout4 {
        n: x.numel() as u64,
        ndim: rank as i32,
        contiguous: 0,
        size: [1; MAX_DIMS],
        stride: [[0; MAX_DIMS]; 4],
    };
    for (k, (&n, &st)) in x.shape.iter().zip(x.strides.iter()).enumerate() {
        l.size[k] = n as i64;
        l.stride[0][k] = st as i64;
    }
    Ok(l)
}

/// `nonzero` on CUDA: the output `i64[n, rank]` given by the caller, who counted `n` first
/// (a read). The input's elements in row-major order are cut into chunks of
/// [`NONZERO_CHUNK`]; one thread counts each chunk, one thread sums the counts in chunk
/// order into each chunk's first row, and one thread per chunk writes its elements'
/// coordinates in order: the CPU's rows, with no atomics. A count other than `n` is not
/// reported (that would need a read): rows past `n` are dropped, missing rows are zeros.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaNonzero;

impl OpKernel for CudaNonzero {
    fn name(&self) -> &'static str {
        "nonzero"
    }

    fn dtypes(&self) -> &'static [DType] {
        &DType::ALL
    }

    fn infer(
        &self,
        inputs: &[&TensorMeta],
        given: &[&TensorMeta],
        attrs: &Attrs,
        out: &mut OutSpecs,
    ) -> Result<(), String> {
        cpu_infer("nonzero", inputs, given, attrs, out)
    }

    fn strided(&self) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        check_output("nonzero", ctx)?;
        let (x, out) = (ctx.inputs.first().ok_or("missing input 0")?, &ctx.outputs[0]);
        let d = x.meta.dtype;
        on_stream("nonzero", |s| {
            let o = device_operand(s, "output 0", out.meta, out.data)?;
            let a = read_side(s, "nonzero", 0, x, &o)?;
            let layout = unmerged(&a.meta)?;
            let (rows, rank) = (o.meta.shape[0] as i64, o.meta.shape[1] as i64);
            let (os0, os1) = (o.meta.strides[0] as i64, o.meta.strides[1] as i64);
            if layout.n == 0 || rank == 0 {
                return Ok(());
            }
            let chunk = NONZERO_CHUNK;
            let chunks = layout.n.div_ceil(chunk);
            let counts = super::launch::temp(s, chunks as usize * 8)?;
            let (pc, px, po) = (counts.addr(), a.addr(), o.addr());
            let grid = launch_config(chunks as usize);
            s.set_label("nonzero");
            let f = function(s, &format!("nonzero_count_{d}"))?;
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&pc).arg(&px).arg(&layout).arg(&chunk).arg(&chunks);
            // SAFETY: `nonzero_count_<d>` takes (i64*, const T*, Layout4, u64, u64): thread
            // `c < chunks` writes `counts[c]` (the temporary holds `chunks`) and reads the
            // input's elements `i < L.n` through its checked strides.
            unsafe { l.launch(grid) }.map_err(|e| format!("launching nonzero_count_{d}: {e}"))?;
            let f = function(s, "nonzero_scan")?;
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&pc).arg(&chunks).arg(&po).arg(&rows).arg(&rank).arg(&os0).arg(&os1);
            // SAFETY: `nonzero_scan` takes (i64*, u64, i64*, i64, i64, i64, i64): one
            // thread rewrites the `chunks` counts and writes output rows below `rows`,
            // columns below `rank`, through the output's checked strides.
            unsafe { l.launch(launch_config(1)) }.map_err(|e| format!("launching nonzero_scan: {e}"))?;
            let f = function(s, &format!("nonzero_write_{d}"))?;
            let mut l = s.cuda_stream().launch_builder(&f);
            l.arg(&po).arg(&pc).arg(&rows).arg(&os0).arg(&os1).arg(&px).arg(&layout).arg(&chunk).arg(&chunks);
            // SAFETY: `nonzero_write_<d>` takes (i64*, const i64*, i64, i64, i64, const T*,
            // Layout4, u64, u64): thread `c` reads `counts[c]` and the input as above, and
            // writes rows below `rows`, columns below `rank` (`L.ndim`) of the output. Rows
            // of different chunks are different (the prefix sums), so no two threads write
            // one element; the input does not overlap the output (copied aside otherwise).
            unsafe { l.launch(grid) }.map(|_| ()).map_err(|e| format!("launching nonzero_write_{d}: {e}"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fault codes of the generated source are `ep::fault`'s, and a fault's message is
    /// the CPU kernel's for the same index.
    #[test]
    fn fault_codes_and_messages_are_the_cpus() {
        use crate::ep::fault::{DataFault, FaultCode};
        let prelude = super::super::source::PRELUDE;
        for (name, code) in
            [("INDEX", FaultCode::Index), ("CLASS", FaultCode::Class), ("TARGET", FaultCode::Target)]
        {
            assert!(prelude.contains(&format!("#define FAULT_{name} {}u\n", code as u32)), "{name}");
        }
        assert!(prelude.contains(
            "struct FaultRecord {\n  u32 code;\n  u32 dim;\n  i64 value;\n  i64 bound;\n  i64 position;\n};"
        ));
        let f = DataFault { code: FaultCode::Index as u32, dim: 1, value: -4, bound: 3, position: 0 };
        assert_eq!(f.message("gather"), crate::kernels::index::out_of_range("gather", -4, 1, 3));
    }

    /// The index kernels' generated CUDA C compiled as C++ on the host (`g++`, one thread
    /// running every element in order: `nn::emulated`): an index out of range reads
    /// nothing, gives 0 or is skipped, and is reported to the fault record with its value,
    /// bound, dimension and position; the first one wins. Needs `g++`:
    /// `cargo test --lib kernels::cuda::index::tests::emulated -- --ignored`.
    #[test]
    #[ignore = "needs g++"]
    fn emulated_kernels_report_indices_out_of_range() {
        use super::super::nn::emulated::module_lib;
        use crate::ep::fault::{DataFault, FaultCode, FaultRecord};
        use std::ffi::c_void;
        type Ew3 = unsafe extern "C" fn(
            *mut c_void,
            *const c_void,
            *const c_void,
            *const c_void,
            u64,
            u64,
            u64,
            Layout4,
        );
        type Scatter = unsafe extern "C" fn(
            *mut c_void,
            *const c_void,
            *const c_void,
            Layout4,
            i64,
            i64,
            i64,
            i64,
            i64,
            u64,
            *const c_void,
            i64,
        );
        let rec = FaultRecord::host();
        let at = rec.device_addr() as *const c_void;
        let fault = |code: FaultCode, dim: u32, value: i64, bound: i64, position: i64| {
            Some(DataFault { code: code as u32, dim, value, bound, position })
        };
        let ptr = |v: &[i64]| v.as_ptr() as *const c_void;

        // take (index_select of x[5] at [0, 7, 2, -1], dim 0): 0 where out of range.
        let bits = module_lib(super::super::source::BITS);
        let take: libloading::Symbol<Ew3> = unsafe { bits.get(b"take_8_i64").unwrap() };
        let (x, idx) = ([10i64, 11, 12, 13, 14], [0i64, 7, 2, -1]);
        let mut out = [99i64; 4];
        let l = Layout4::plan(&[4], &[&[1], &[0], &[1]]).unwrap();
        unsafe { take(out.as_mut_ptr().cast(), ptr(&x), ptr(&idx), at, 1, 5, 0, l) };
        assert_eq!(out, [10, 0, 12, 0]);
        assert_eq!(rec.take(), fault(FaultCode::Index, 0, 7, 5, 1), "the first bad index wins");

        // index_offsets (wrapping, the first tensor, dimension 1; stride 3, size 5).
        let offs: libloading::Symbol<Ew3> = unsafe { bits.get(b"index_offsets_i64").unwrap() };
        let idx = [0i64, -7, -1, 5];
        let mut out = [0i64; 4];
        let l = Layout4::plan(&[4], &[&[1], &[1]]).unwrap();
        unsafe { offs(out.as_mut_ptr().cast(), ptr(&idx), std::ptr::null(), at, 3, 5, 1 | 2 | 1 << 2, l) };
        assert_eq!(out, [0, i64::MIN, 12, i64::MIN], "NONE out of range, -1 from the end");
        assert_eq!(rec.take(), fault(FaultCode::Index, 1, -7, 5, 1));
        // A good call leaves the record clear.
        let idx = [0i64, 4, -5, 1];
        unsafe { offs(out.as_mut_ptr().cast(), ptr(&idx), std::ptr::null(), at, 3, 5, 1 | 2 | 1 << 2, l) };
        assert_eq!((out, rec.take()), ([0, 12, 0, 3], None));

        // one_hot of [1, 4, 3] over 4 classes: the row of the bad class is zeros.
        let i64s = module_lib("i64");
        let one_hot: libloading::Symbol<Ew3> = unsafe { i64s.get(b"one_hot_i64").unwrap() };
        let idx = [1i64, 4, 3];
        let mut out = [9i64; 12];
        let l = Layout4::plan(&[3, 4], &[&[4, 1], &[1, 0]]).unwrap();
        unsafe { one_hot(out.as_mut_ptr().cast(), ptr(&idx), std::ptr::null(), at, 4, 0, 0, l) };
        assert_eq!(out, [0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1]);
        assert_eq!(rec.take(), fault(FaultCode::Class, 0, 4, 4, 1));

        // scatter (set) of src[3] into out[5] at [1, 9, 3], dim 0: the bad position skipped.
        let scatter: libloading::Symbol<Scatter> = unsafe { i64s.get(b"scatter_set_i64_i64").unwrap() };
        let (idx, src) = ([1i64, 9, 3], [7i64, 8, 9]);
        let mut out = [0i64; 5];
        let l = Layout4::plan(&[1], &[&[1], &[1], &[1]]).unwrap();
        unsafe { scatter(out.as_mut_ptr().cast(), ptr(&idx), ptr(&src), l, 3, 1, 1, 1, 5, 0, at, 0) };
        assert_eq!(out, [0, 7, 0, 9, 0]);
        assert_eq!(rec.take(), fault(FaultCode::Index, 0, 9, 5, 0));
        // Without a record (a null pointer) the kernel still skips, and reports nothing.
        unsafe {
            scatter(out.as_mut_ptr().cast(), ptr(&idx), ptr(&src), l, 3, 1, 1, 1, 5, 0, std::ptr::null(), 0)
        };
        assert_eq!(rec.take(), None);
    }

    /// Which calls are checked: exactly those whose kernels read indices (or targets) from
    /// device data, among every CUDA kernel.
    #[test]
    fn the_kernels_that_read_indices_ask_for_a_checked_launch() {
        let failable =
            ["index_select", "gather", "scatter", "index_add", "index", "index_put", "one_hot", "nll_loss"];
        let mut found = 0;
        for k in super::super::kernels() {
            let reads_indices = failable.contains(&k.name());
            assert_eq!(k.checks_data(&Attrs::default()), reads_indices, "{}", k.name());
            found += usize::from(reads_indices);
        }
        assert_eq!(found, failable.len());
    }

    #[test]
    fn kernels_are_generated_for_every_size_and_index_dtype() {
        let all = sources();
        let has = |sym: &str| all.iter().filter(|(_, s, _)| s == sym).count() == 1;
        for size in [1, 2, 4, 8] {
            assert!(
                has(&format!("tril_{size}")) && has(&format!("triu_{size}")) && has(&format!("cat_{size}"))
            );
            assert!(has(&format!("take_{size}_i64")) && has(&format!("take_{size}_i32")));
        }
        assert!(has("one_hot_i64") && has("scatter_add_f16_i32") && has("scatter_add_scaled_bool_i64"));
        let text = |sym: &str| all.iter().find(|(_, s, _)| s == sym).map(|(_, _, t)| t.clone()).unwrap();
        assert!(text("tril_4").contains("col - row <= (i64)f ? a[o1] : (u32)0"));
        assert!(text("triu_2").contains("col - row >= (i64)f"));
        // An index out of range reads nothing, gives 0, and is reported with its dim (`f`).
        let take = text("take_8_i32");
        assert!(take.contains("const bool ok = v >= 0 && v < (i64)t;"), "{take}");
        assert!(take.contains("if (!ok) report_fault(c, FAULT_INDEX, f, v, (i64)t, (i64)i);"), "{take}");
        assert!(take.contains("out[o0] = ok ? a[o1 + v * (i64)s] : (u64)0;"), "{take}");
        let scatter = text("scatter_set_f32_i32");
        assert!(
            scatter.contains(
                "if (v < 0 || v >= size) { report_fault(fault, FAULT_INDEX, (u64)dim, v, size, (i64)i); continue; }"
            ),
            "{scatter}"
        );
        let one_hot = text("one_hot_i64");
        assert!(one_hot.contains("report_fault(c, FAULT_CLASS, 0, v, (i64)s, (i64)(i / s))"), "{one_hot}");
        // Accumulations in the compute type, rounded on each store, in increasing j.
        let add = text("scatter_add_bf16_i64");
        assert!(add.contains("for (i64 j = 0; j < len; ++j)"), "{add}");
        assert!(add.contains("out[o0 + v * os] = f32_to_bf16(p + q);"), "{add}");
        let scaled = text("scatter_add_scaled_f32_i64");
        assert!(scaled.contains("p + __fmul_rn(q, a)"), "{scaled}");
        assert!(text("scatter_mul_i32_i32").contains("(int)((u32)(p) * (u32)(q))"));
        assert!(text("scatter_set_f16_i64").contains("out[o0 + v * os] = src[o2 + j * ss];"));
        assert!(text("scatter_add_scaled_bool_i64").contains("p | (int)("));
        // index: offsets summed per index tensor, negative ones from the end, NONE out of range.
        let offs = text("index_offsets_i32");
        assert!(offs.contains("((f & 1) && v < 0) ? v + (i64)t : v"), "{offs}");
        assert!(offs.contains("const bool bad = w < 0 || w >= (i64)t;"), "{offs}");
        assert!(offs.contains("if (bad) report_fault(c, FAULT_INDEX, f >> 2, v, (i64)t, (i64)i);"), "{offs}");
        assert!(offs.contains("(prev == NONE || bad) ? NONE : prev + w * (i64)s"), "{offs}");
        assert!(text("index_2").contains("w == NONE ? (u16)0 : a[o1 + w]"));
        let put = text(&index_put_symbol(DType::F16, true));
        assert!(
            put.contains("for (i64 b = 0; b < nb; ++b)") && put.contains("if (w == NONE) continue;"),
            "{put}"
        );
        assert!(put.contains("out[o0 + w] = f32_to_f16(p + q);"), "{put}");
        assert!(text("index_put_set_i64").contains("out[o0 + w] = vals[(pf * nb + b) * nsuffix + sf];"));
        // nonzero: counts per chunk, then coordinates row by row from the chunk's first row.
        let count = text("nonzero_count_f16");
        assert!(
            count.contains("if (f16_to_f32(x[o0]) != 0.0f)") && count.contains("counts[c] = count;"),
            "{count}"
        );
        let write = text("nonzero_write_bool");
        assert!(write.contains("i64 row = starts[c];") && write.contains("if (row < rows)"), "{write}");
        assert!(write.contains("out[row * os0 + k * os1] = (i64)(rest % size);"), "{write}");
        assert!(text("nonzero_scan").contains("counts[c] = total;"));
    }

    #[test]
    fn strides_along_the_indexed_dimension() {
        use crate::ep::DeviceId;
        let x = TensorMeta::new(&[3, 4], DType::F32, DeviceId::cuda(0));
        assert_eq!(along(&x, 2, 0), (vec![0, 1], 4, 3));
        assert_eq!(along(&x, 2, 1), (vec![4, 0], 1, 4));
        let scalar = TensorMeta::new(&[], DType::F32, DeviceId::cuda(0));
        assert_eq!(along(&scalar, 0, 0), (vec![], 0, 1));
        assert_eq!(along(&scalar, 1, 0), (vec![0], 0, 1));
        assert_eq!(rank1(&scalar), (vec![1], vec![0]));
        // nonzero's layout keeps every dimension (its coordinates come from them).
        let t = TensorMeta::new(&[4, 3], DType::F32, DeviceId::cuda(0)).with_layout(&[3, 4], &[1, 3], 2);
        let l = unmerged(&t).unwrap();
        assert_eq!(
            (l.n, l.ndim, l.contiguous, &l.size[..2], &l.stride[0][..2]),
            (12, 2, 0, &[3, 4][..], &[1, 3][..])
        );
        let big = TensorMeta::new(&[1; 9], DType::F32, DeviceId::cuda(0));
        assert!(unmerged(&big).unwrap_err().contains("at most 8"));
    }
}
