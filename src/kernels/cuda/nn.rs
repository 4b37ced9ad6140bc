//! The batched product, convolution and pools on CUDA: `bmm`, `conv2d`, `max_pool2d`,
//! `max_pool2d_with_indices`, `avg_pool2d`, `adaptive_avg_pool2d`, under the CPU kernels'
//! names, shape rules (their own `infer`), parameter lists and dtypes, over operands of any
//! layout.
//!
//! # `bmm`
//!
//! Floats go to cuBLAS's `cublasGemmStridedBatchedEx`: `f32` with `CUBLAS_COMPUTE_32F` (no
//! TF32: the handle of [`super::matmul`] is in the default math mode), `f64` with
//! `CUBLAS_COMPUTE_64F`, `f16` and `bf16` with `CUBLAS_COMPUTE_32F` (products and sums in
//! `f32`, each result rounded once). Each batch element's matrices are read as they lie:
//! the transpose flags and leading dimensions come from the last two strides by
//! [`gemm_args`] (an operand cuBLAS cannot read is copied to a contiguous temporary first,
//! an output it cannot write is computed into one). The batch dimensions, with each
//! operand's batch strides (0 where an input is broadcast), are merged where they form one
//! run in every operand ([`merge_batch`]); the innermost that remains is one strided-batched
//! call (strides 0 allowed for inputs), the others a host loop of such calls. The integer
//! dtypes use the generated `bmm_<dtype>` kernel: one thread per output element, products
//! added in increasing `p`, wrapping, through any strides (at most 8 dimensions of
//! `[batch.., m, n]` after merging).
//!
//! # `conv2d`
//!
//! Per chunk of images (as many as keep the temporaries near [`CONV_TEMP_BYTES`]):
//! `im2col_<dtype>` writes the matrix `[nb, C, kh, kw, OH·OW]` of the images (the input's
//! elements, 0 in the padding; in the input's dtype, so a copy), then per group one
//! strided-batched cuBLAS product over the chunk's images computes the group's
//! `[O / groups, OH·OW]` rows as `weight[g] · im2col[n, g]` into a temporary of the
//! compute type (`f32` for `f16`, `bf16` and `f32`; `f64`), and `conv_out_<dtype>` adds
//! the bias (0 without one, as the CPU kernel adds) and rounds once into the output, any
//! strides. The weight is read contiguously (copied first when it is not).
//!
//! # Pools
//!
//! One thread per output element ([`super::nn_source`]): the window's elements in
//! row-major order, as the CPU kernels visit them. `max_pool2d` takes every dtype but
//! `bool` and replaces its best element when a later one is greater or NaN (the first of
//! equal elements, the last NaN), so its values and indices are the CPU's exactly; the
//! average pools sum in the compute type in row-major order from 0 and divide once: the
//! CPU's operations in the CPU's order, so their results are the CPU's bit for bit.

use cudarc::cublas::sys::{cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType};
use cudarc::driver::{DeviceRepr, PushKernelArg};

use super::gemm::{gemm_args, GemmArgs, Input, Product, Trans, Unfit};
use super::launch::{
    contiguous_temp, copy_elements, device_operand, fault_record, launch_config, launch_ew, must_stage,
    stage, temp, Dev,
};
use super::layout::Layout;
use super::CpuTwin;
use super::{function, on_stream};
use crate::ep::cuda::CudaEpStream;
use crate::vm::{Attrs, DType, KernelCtx, OpKernel, OutSpecs, TensorMeta};

/// The bytes of temporaries (im2col matrix and product) one chunk of `conv2d`'s images
/// aims at; a single image may need more.
pub const CONV_TEMP_BYTES: usize = 64 << 20;

/// The most batch elements one cuBLAS strided-batched call gets.
const MAX_BATCH: usize = 65_535;

/// The geometry of a spatial kernel, as the generated source's `struct Geom` (32 `i64`,
/// by value). The slots:
///
/// | slots | what |
/// | --- | --- |
/// | 0–3 | the sizes of the index space `[n, c, OH, OW]` (`im2col`: `[nb, C, OH, OW]`, with `kh`, `kw` in 18, 19) |
/// | 4–7 | the input's strides |
/// | 8–11 | the output's strides |
/// | 12–15 | the indices' strides (`max_pool2d_with_indices`); 12: the bias's stride (`conv_out`) |
/// | 16, 17 | the input's `H`, `W` |
/// | 18, 19 | the window `kh`, `kw` |
/// | 20, 21 | stride |
/// | 22, 23 | padding before (top, left) |
/// | 24, 25 | dilation |
/// | 26 | a flag: indices wanted (`max_pool2d`), `count_include_pad`, a bias given (`conv_out`) |
/// | 27 | `divisor_override` (0: none) |
/// | 28 | the number of elements of the index space |
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geom {
    /// The slots (see the type's docs).
    pub v: [i64; 32],
}

// SAFETY: `Geom` is `repr(C)` plain integers, the `struct Geom` of the generated source
// (`nn_source`), which the kernels take by value.
unsafe impl DeviceRepr for Geom {}

/// Slot of the input's strides.
const XS: usize = 4;
/// Slot of the output's strides.
const OS: usize = 8;
/// Slot of the indices' (or the bias's) strides.
const IS: usize = 12;
/// Slot of `H` (`W` follows).
const H: usize = 16;
/// Slot of `kh` (`kw` follows).
const K: usize = 18;
/// Slot of the stride (h, w).
const STRIDE: usize = 20;
/// Slot of the padding before (top, left).
const PAD: usize = 22;
/// Slot of the dilation (h, w).
const DIL: usize = 24;
/// Slot of the flag.
const FLAG: usize = 26;
/// Slot of `divisor_override`.
const DIV: usize = 27;
/// Slot of the element count.
const COUNT: usize = 28;

impl Geom {
    fn new() -> Geom {
        Geom { v: [0; 32] }
    }

    fn set(&mut self, at: usize, values: &[i64]) {
        self.v[at..at + values.len()].copy_from_slice(values);
    }

    fn strides(&mut self, at: usize, s: &[isize]) {
        for (i, &x) in s.iter().enumerate() {
            self.v[at + i] = x as i64;
        }
    }
}

/// The sizes as `i64` (a layout checked against its storage has sizes that fit).
fn sizes(shape: &[usize]) -> Vec<i64> {
    shape.iter().map(|&x| x as i64).collect()
}

/// The address of element `at` (in elements, may be negative) from `base`.
fn advance(base: u64, at: i64, dtype: DType) -> u64 {
    base.wrapping_add_signed(at.wrapping_mul(dtype.size() as i64))
}

/// Launch spatial kernel `sym` with three pointers and `g`, one thread per element of its
/// index space (`g.v[28]` elements).
fn launch_spatial(s: &CudaEpStream, sym: &str, p: [u64; 3], g: &Geom) -> Result<(), String> {
    let n = g.v[COUNT] as usize;
    if n == 0 {
        return Ok(());
    }
    let f = function(s, sym)?;
    let mut l = s.cuda_stream().launch_builder(&f);
    l.arg(&p[0]).arg(&p[1]).arg(&p[2]).arg(g);
    // SAFETY: every spatial kernel takes (T*, ptr, const T*, Geom) (`nn_source`), matching
    // these arguments. The callers fill `g` from the operands' checked layouts (or
    // contiguous temporaries made for them) and pass each operand's address at its offset,
    // so every element a kernel touches (`g`'s sizes and strides, windows clipped to the
    // input's `H`, `W`) is inside a live block; blocks live until the instruction retires
    // (storages) or this stream is past the work (temporaries). Inputs sharing bytes with
    // an output were staged.
    unsafe { l.launch(launch_config(n)) }.map(|_| ()).map_err(|e| format!("launching {sym}: {e}"))
}

/// The outputs the CPU kernel `cpu` infers for this call, checked against the call's
/// outputs.
fn check_outputs(cpu: &dyn OpKernel, ctx: &KernelCtx<'_, '_>) -> Result<OutSpecs, String> {
    let metas: Vec<&TensorMeta> = ctx.inputs.iter().map(|t| t.meta).collect();
    let mut want = OutSpecs::new();
    cpu.infer(&metas, &[], &ctx.attrs, &mut want)?;
    if ctx.outputs.len() != want.len() {
        return Err(format!("expected {} outputs, got {}", want.len(), ctx.outputs.len()));
    }
    for (i, (o, w)) in ctx.outputs.iter().zip(&want).enumerate() {
        if o.meta.shape != w.shape || o.meta.dtype != w.dtype {
            return Err(format!(
                "output {i} is {} but {} produces {}{:?}",
                o.meta.describe(),
                cpu.name(),
                w.dtype,
                w.shape.as_slice()
            ));
        }
    }
    Ok(want)
}

// ---------------------------------------------------------------------------------------
// bmm

/// `bmm` on CUDA (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaBmm;

/// The strides of `t`'s batch dimensions broadcast to `batch` (0 where `t` has size 1 or
/// lacks the dimension): the CPU kernel's rule.
pub fn batch_strides(t: &TensorMeta, batch: &[usize]) -> Vec<isize> {
    let own = t.shape.len() - 2;
    (0..batch.len())
        .map(|d| match (d + own).checked_sub(batch.len()) {
            Some(i) if t.shape[i] != 1 => t.strides[i],
            _ => 0,
        })
        .collect()
}

/// The batch dimensions `(size, strides)` (one stride per operand), outermost first, with the size-1
/// dimensions dropped and neighbours merged where they are one run of equal steps in all
/// operands.
pub fn merge_batch<const N: usize>(batch: &[usize], st: [&[isize]; N]) -> Vec<(usize, [isize; N])> {
    let mut dims: Vec<(usize, [isize; N])> = Vec::new();
    for (d, &size) in batch.iter().enumerate() {
        if size == 1 {
            continue;
        }
        let s: [isize; N] = std::array::from_fn(|k| st[k][d]);
        match dims.last_mut() {
            Some((outer, os)) if (0..N).all(|k| os[k] == s[k].wrapping_mul(size as isize)) => {
                *outer *= size;
                *os = s;
            }
            _ => dims.push((size, s)),
        }
    }
    dims
}

/// One strided-batched product: the arguments, the three addresses and batch strides
/// (elements of the BLAS operands' own dtypes), and the batch count.
#[derive(Debug, Clone, Copy)]
struct Batched {
    g: GemmArgs,
    a: u64,
    b: u64,
    c: u64,
    strides: [i64; 3],
    count: usize,
}

fn cublas_op(t: Trans) -> cublasOperation_t {
    match t {
        Trans::N => cublasOperation_t::CUBLAS_OP_N,
        Trans::T => cublasOperation_t::CUBLAS_OP_T,
    }
}

/// The cuBLAS data type of the floating dtype `d`.
fn data_type(d: DType) -> Result<cudaDataType, String> {
    Ok(match d {
        DType::F16 => cudaDataType::CUDA_R_16F,
        DType::BF16 => cudaDataType::CUDA_R_16BF,
        DType::F32 => cudaDataType::CUDA_R_32F,
        DType::F64 => cudaDataType::CUDA_R_64F,
        other => return Err(format!("{other} products do not go through cuBLAS")),
    })
}

/// `x.count` products `C = op(A) op(B)` of inputs of the floating dtype `d` into outputs of
/// `out` (`d`, or `f32` for the 16-bit dtypes' `f32` products), `CUBLAS_COMPUTE_64F` for
/// `f64` and `CUBLAS_COMPUTE_32F` otherwise, in calls of at most [`MAX_BATCH`].
fn gemm_batched(s: &CudaEpStream, d: DType, out: DType, x: &Batched) -> Result<(), String> {
    let int = |v: usize| i32::try_from(v).map_err(|_| format!("size {v} exceeds cuBLAS's 32-bit sizes"));
    let g = &x.g;
    let (m, n, k, lda, ldb, ldc) = (int(g.m)?, int(g.n)?, int(g.k)?, int(g.lda)?, int(g.ldb)?, int(g.ldc)?);
    let (ta, tb) = (cublas_op(g.transa), cublas_op(g.transb));
    let (ab_t, c_t) = (data_type(d)?, data_type(out)?);
    let blas = s.blas.get_or_init(|| super::matmul::handle(s)).as_ref().map_err(Clone::clone)?;
    let h = *blas.handle();
    let (one32, zero32, one64, zero64) = (1.0f32, 0.0f32, 1.0f64, 0.0f64);
    let (alpha, beta, compute): (*const std::ffi::c_void, *const std::ffi::c_void, _) = if d == DType::F64 {
        (
            (&one64 as *const f64).cast(),
            (&zero64 as *const f64).cast(),
            cublasComputeType_t::CUBLAS_COMPUTE_64F,
        )
    } else {
        (
            (&one32 as *const f32).cast(),
            (&zero32 as *const f32).cast(),
            cublasComputeType_t::CUBLAS_COMPUTE_32F,
        )
    };
    let [sa, sb, sc] = x.strides;
    let mut done = 0usize;
    while done < x.count {
        let count = (x.count - done).min(MAX_BATCH);
        let at = done as i64;
        let (pa, pb, pc) = (
            advance(x.a, at.wrapping_mul(sa), d),
            advance(x.b, at.wrapping_mul(sb), d),
            advance(x.c, at.wrapping_mul(sc), out),
        );
        // SAFETY: the handle is bound to this stream. `pa`, `pb` and `pc` are the first
        // matrices of this call, and the callers derived the flags, sizes, leading
        // dimensions and batch strides from the operands' checked layouts (or contiguous
        // temporaries made for them, or the temporaries of `conv2d` sized for the call), so
        // cuBLAS reads and writes only their elements; the batch strides of the output name
        // disjoint matrices. `alpha` and `beta` are host scalars of the compute type,
        // alive across the call; the blocks live until the instruction retires or this
        // stream is past the work (temporaries).
        unsafe {
            cudarc::cublas::result::gemm_strided_batched_ex(
                h,
                ta,
                tb,
                m,
                n,
                k,
                alpha,
                pa as *const std::ffi::c_void,
                ab_t,
                lda,
                sa,
                pb as *const std::ffi::c_void,
                ab_t,
                ldb,
                sb,
                beta,
                pc as *mut std::ffi::c_void,
                c_t,
                ldc,
                sc,
                count as i32,
                compute,
                cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
            )
        }
        .map_err(|e| format!("cublasGemmStridedBatchedEx: {e}"))?;
        done += count;
    }
    Ok(())
}

/// The last two strides of a matrix operand.
fn mat_strides(d: &Dev<'_>) -> [isize; 2] {
    let s = &d.meta.strides;
    [s[s.len() - 2], s[s.len() - 1]]
}

impl OpKernel for CudaBmm {
    like_cpu!(kernel crate::kernels::BmmKernel);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        check_outputs(&crate::kernels::BmmKernel, ctx)?;
        let [a, b] = ctx.inputs else { return Err(format!("expected 2 inputs, got {}", ctx.inputs.len())) };
        let out = &ctx.outputs[0];
        on_stream("bmm", |s| {
            let mut ad = device_operand(s, "input 0", a.meta, a.data)?;
            let mut bd = device_operand(s, "input 1", b.meta, b.data)?;
            let od = device_operand(s, "output 0", out.meta, out.data)?;
            let shape = od.meta.shape.to_vec();
            let r = shape.len();
            let (m, n, k) = (shape[r - 2], shape[r - 1], a.meta.shape[a.meta.shape.len() - 1]);
            if od.meta.numel() == 0 {
                return Ok(());
            }
            let d = od.meta.dtype;
            if k == 0 {
                // An empty sum: zeros (all-zero bits in every dtype).
                return launch_ew(s, "bmm", &format!("fill_{}", d.size()), &od, &[], 0);
            }
            // The product reads each input many times: one sharing the output's bytes is
            // read from a copy.
            if must_stage(&ad, &od) {
                ad = stage(s, "bmm", &ad)?;
            }
            if must_stage(&bd, &od) {
                bd = stage(s, "bmm", &bd)?;
            }
            if !d.is_floating() {
                return int_bmm(s, &od, &ad, &bd, k);
            }
            let mut ctemp: Option<Dev<'static>> = None;
            let g = loop {
                let c = ctemp.as_ref().unwrap_or(&od);
                match gemm_args(Product::Nn, (m, n, k), mat_strides(&ad), mat_strides(&bd), mat_strides(c)) {
                    Ok(g) => break g,
                    Err(Unfit::A) => ad = stage(s, "bmm", &ad)?,
                    Err(Unfit::B) => bd = stage(s, "bmm", &bd)?,
                    Err(Unfit::C) if ctemp.is_none() => ctemp = Some(contiguous_temp(s, &shape, d)?),
                    Err(Unfit::C) => {
                        return Err(format!("bmm: a contiguous {shape:?} output did not fit cuBLAS"))
                    }
                }
            };
            let c = ctemp.as_ref().unwrap_or(&od);
            let batch = &shape[..r - 2];
            let (bso, bsa, bsb) = (
                c.meta.strides[..r - 2].to_vec(),
                batch_strides(&ad.meta, batch),
                batch_strides(&bd.meta, batch),
            );
            // BLAS operand 1 and 2 with their batch strides.
            let pick = |i: Input| if i == Input::First { (ad.addr(), &bsa) } else { (bd.addr(), &bsb) };
            let ((pa, sa), (pb, sb)) = (pick(g.a), pick(g.b));
            let mut dims = merge_batch(batch, [&bso, sa, sb]);
            // The innermost dimension goes to one strided-batched call when its strides
            // are not negative; the others are a host loop.
            let inner = match dims.last() {
                Some(&(size, st)) if st.iter().all(|&x| x >= 0) => {
                    dims.pop();
                    (size, st)
                }
                _ => (1, [0; 3]),
            };
            let outer: usize = dims.iter().map(|x| x.0).product();
            let mut index = vec![0usize; dims.len()];
            for _ in 0..outer {
                let mut off = [0i64; 3];
                for (i, &(_, st)) in index.iter().zip(&dims) {
                    for q in 0..3 {
                        off[q] += *i as i64 * st[q] as i64;
                    }
                }
                let call = Batched {
                    g,
                    c: advance(c.addr(), off[0], d),
                    a: advance(pa, off[1], d),
                    b: advance(pb, off[2], d),
                    strides: [inner.1[1] as i64, inner.1[2] as i64, inner.1[0] as i64],
                    count: inner.0,
                };
                gemm_batched(s, d, d, &call)?;
                // The next batch index, row-major.
                for q in (0..dims.len()).rev() {
                    index[q] += 1;
                    if index[q] < dims[q].0 {
                        break;
                    }
                    index[q] = 0;
                }
            }
            match &ctemp {
                Some(t) => copy_elements(s, "bmm", &od, t),
                None => Ok(()),
            }
        })
    }
}

/// The three stride lists of the integer `bmm` kernel's index space `[batch.., m, n]`:
/// the output's, `a`'s at column 0 (stride 0 along `n`) and `b`'s at row 0 (stride 0
/// along `m`).
pub fn int_layout(out: &TensorMeta, a: &TensorMeta, b: &TensorMeta) -> [Vec<isize>; 3] {
    let r = out.shape.len();
    let batch = &out.shape[..r - 2];
    let (ra, rb) = (a.shape.len(), b.shape.len());
    let mut sa = batch_strides(a, batch);
    sa.extend([a.strides[ra - 2], 0]);
    let mut sb = batch_strides(b, batch);
    sb.extend([0, b.strides[rb - 1]]);
    [out.strides.to_vec(), sa, sb]
}

/// `bmm` of an integer dtype with the `bmm_<dtype>` kernel.
fn int_bmm(s: &CudaEpStream, c: &Dev<'_>, a: &Dev<'_>, b: &Dev<'_>, k: usize) -> Result<(), String> {
    let d = c.meta.dtype;
    let [so, sa, sb] = int_layout(&c.meta, &a.meta, &b.meta);
    let layout = Layout::plan(&c.meta.shape, &[&so, &sa, &sb])?;
    let (ra, rb) = (a.meta.shape.len(), b.meta.shape.len());
    let (ak, bk) = (a.meta.strides[ra - 1] as i64, b.meta.strides[rb - 2] as i64);
    let f = function(s, &format!("bmm_{d}"))?;
    let (pc, pa, pb, k64) = (c.addr(), a.addr(), b.addr(), k as u64);
    let mut l = s.cuda_stream().launch_builder(&f);
    l.arg(&pc).arg(&pa).arg(&pb).arg(&layout).arg(&k64).arg(&ak).arg(&bk);
    // SAFETY: `bmm_<d>` takes (T*, const T*, const T*, Layout, u64, i64, i64), matching
    // these arguments. The layout's strides are the output's and the inputs' batch strides
    // (0 where broadcast) with `a`'s row and `b`'s column strides, so `o1 + p·ak` is
    // `a[.., i, p]` and `o2 + p·bk` is `b[.., p, j]` for `p < k`: elements of the checked
    // layouts of live operands (inputs that shared the output's bytes were staged).
    unsafe { l.launch(launch_config(c.meta.numel())) }
        .map(|_| ())
        .map_err(|e| format!("launching bmm_{d}: {e}"))
}

// ---------------------------------------------------------------------------------------
// conv2d

/// `conv2d` on CUDA (see the module docs).
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaConv2d;

/// `conv2d`'s parameter list `[sh, sw, top, bottom, left, right, dh, dw, groups]`, checked
/// by the CPU kernel's `infer` first.
fn conv_params(attrs: &Attrs) -> Result<[i64; 9], String> {
    attrs.params().ints().try_into().map_err(|_| "conv2d takes 9 integer parameters".to_string())
}

/// How many of `n` images one chunk of `conv2d` takes: as many as keep the chunk's
/// temporaries (`per_image` bytes each) within [`CONV_TEMP_BYTES`], at least one.
pub fn conv_chunk(n: usize, per_image: usize) -> usize {
    (CONV_TEMP_BYTES / per_image.max(1)).clamp(1, n.max(1))
}

/// The compute type of a float dtype's products (`f32` for the 16-bit dtypes).
fn compute_dtype(d: DType) -> DType {
    if d == DType::F64 {
        DType::F64
    } else {
        DType::F32
    }
}

/// The geometry of `conv2d`'s `im2col_<d>` and `conv_out_<d>` but the chunk's sizes
/// (slots 0–3) and element count: the strides, the input's plane, the window, and the bias.
pub fn conv_geom(
    p: &[i64; 9],
    x: &TensorMeta,
    w: &TensorMeta,
    bias: Option<&TensorMeta>,
    out: &TensorMeta,
) -> Geom {
    let mut g = Geom::new();
    g.strides(XS, &x.strides);
    g.strides(OS, &out.strides);
    g.set(H, &sizes(&[x.shape[2], x.shape[3], w.shape[2], w.shape[3]]));
    g.set(STRIDE, &[p[0], p[1]]);
    g.set(PAD, &[p[2], p[4]]);
    g.set(DIL, &[p[6], p[7]]);
    if let Some(b) = bias {
        g.v[IS] = b.strides[0] as i64;
        g.v[FLAG] = 1;
    }
    g
}

impl OpKernel for CudaConv2d {
    like_cpu!(kernel crate::kernels::Conv2dKernel);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        check_outputs(&crate::kernels::Conv2dKernel, ctx)?;
        let p = conv_params(&ctx.attrs)?;
        let out = &ctx.outputs[0];
        let inputs = ctx.inputs;
        on_stream("conv2d", |s| {
            let od = device_operand(s, "output 0", out.meta, out.data)?;
            let mut ops = Vec::with_capacity(inputs.len());
            for (i, t) in inputs.iter().enumerate() {
                let mut dv = device_operand(s, &format!("input {i}"), t.meta, t.data)?;
                // The weight is read as a contiguous matrix; an input sharing the output's
                // bytes is read from a copy.
                if must_stage(&dv, &od) || (i == 1 && !dv.is_contiguous()) {
                    dv = stage(s, "conv2d", &dv)?;
                }
                ops.push(dv);
            }
            if od.meta.numel() == 0 {
                return Ok(());
            }
            let (xd, wd, bias) = (&ops[0], &ops[1], ops.get(2));
            let d = od.meta.dtype;
            let ct = compute_dtype(d);
            let (n, c) = (xd.meta.shape[0], xd.meta.shape[1]);
            let (o, kh, kw) = (wd.meta.shape[0], wd.meta.shape[2], wd.meta.shape[3]);
            let (oh, ow) = (od.meta.shape[2], od.meta.shape[3]);
            let groups = p[8] as usize;
            let (og, kc, pos) = (o / groups, (c / groups) * kh * kw, oh * ow);
            let col_image = c * kh * kw * pos;
            let per_image = col_image * d.size() + o * pos * ct.size();
            let nb = conv_chunk(n, per_image);
            let col = temp(s, nb * col_image * d.size())?;
            let prod = temp(s, nb * o * pos * ct.size())?;
            let mut g = conv_geom(&p, &xd.meta, &wd.meta, bias.map(|b| &*b.meta), &od.meta);
            let mut n0 = 0;
            while n0 < n {
                let nb = nb.min(n - n0);
                let x0 = advance(xd.addr(), n0 as i64 * xd.meta.strides[0] as i64, d);
                let o0 = advance(od.addr(), n0 as i64 * od.meta.strides[0] as i64, d);
                g.set(0, &[nb as i64, c as i64, oh as i64, ow as i64]);
                g.v[COUNT] = (nb * col_image) as i64;
                launch_spatial(s, &format!("im2col_{d}"), [col.addr(), x0, 0], &g)?;
                if kc == 0 {
                    // No channels: every product is an empty sum.
                    // SAFETY: `prod` is a live temporary of at least this many bytes, and
                    // the memset is enqueued on this stream before the kernels that read it.
                    unsafe {
                        cudarc::driver::result::memset_d8_async(
                            prod.addr(),
                            0,
                            nb * o * pos * ct.size(),
                            s.cuda_stream().cu_stream(),
                        )
                    }
                    .map_err(|e| format!("clearing conv2d's product: {e}"))?;
                }
                for grp in (0..groups).filter(|_| kc > 0) {
                    // Row-major `prod[n, g·og .. (g+1)·og, pos] = weight[g] · col[n, g]`, as
                    // column-major `prodᵀ = colᵀ · weightᵀ`.
                    let gm = GemmArgs {
                        transa: Trans::N,
                        transb: Trans::N,
                        m: pos,
                        n: og,
                        k: kc,
                        a: Input::Second,
                        lda: pos,
                        b: Input::First,
                        ldb: kc,
                        ldc: pos,
                    };
                    let call = Batched {
                        g: gm,
                        a: advance(col.addr(), (grp * kc * pos) as i64, d),
                        b: advance(wd.addr(), (grp * og * kc) as i64, d),
                        c: advance(prod.addr(), (grp * og * pos) as i64, ct),
                        strides: [col_image as i64, 0, (o * pos) as i64],
                        count: nb,
                    };
                    gemm_batched(s, d, ct, &call)?;
                }
                g.set(0, &[nb as i64, o as i64, oh as i64, ow as i64]);
                g.v[COUNT] = (nb * o * pos) as i64;
                let pb = bias.map_or(0, |b| b.addr());
                launch_spatial(s, &format!("conv_out_{d}"), [o0, prod.addr(), pb], &g)?;
                n0 += nb;
            }
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------
// Pools

/// Which pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pool {
    /// `max_pool2d`.
    Max,
    /// `max_pool2d_with_indices`.
    MaxWithIndices,
    /// `avg_pool2d`.
    Avg,
    /// `adaptive_avg_pool2d`.
    Adaptive,
}

/// A pool on CUDA (see the module docs).
#[derive(Debug, Clone, Copy)]
pub struct CudaPool(pub Pool);

/// `max_pool2d` on CUDA.
pub static CUDA_MAX_POOL2D: CudaPool = CudaPool(Pool::Max);
/// `max_pool2d_with_indices` on CUDA.
pub static CUDA_MAX_POOL2D_WITH_INDICES: CudaPool = CudaPool(Pool::MaxWithIndices);
/// `avg_pool2d` on CUDA.
pub static CUDA_AVG_POOL2D: CudaPool = CudaPool(Pool::Avg);
/// `adaptive_avg_pool2d` on CUDA.
pub static CUDA_ADAPTIVE_AVG_POOL2D: CudaPool = CudaPool(Pool::Adaptive);

impl CudaPool {
    /// The CPU kernel of the same op (its shape rules and dtypes).
    fn cpu(&self) -> &'static dyn OpKernel {
        match self.0 {
            Pool::Max => &crate::kernels::MAX_POOL2D,
            Pool::MaxWithIndices => &crate::kernels::MAX_POOL2D_WITH_INDICES,
            Pool::Avg => &crate::kernels::AvgPool2dKernel,
            Pool::Adaptive => &crate::kernels::AdaptiveAvgPool2dKernel,
        }
    }

    /// The kernel's name stem.
    fn kernel(&self) -> &'static str {
        match self.0 {
            Pool::Max | Pool::MaxWithIndices => "max_pool2d",
            Pool::Avg => "avg_pool2d",
            Pool::Adaptive => "adaptive_avg_pool2d",
        }
    }
}

/// The window slots of `g` from a pool's parameter list (checked by the CPU kernel's
/// `infer` first): `[kh, kw, sh, sw, ph, pw, dh, dw, ceil]` for the max pools, `[kh, kw,
/// sh, sw, ph, pw, ceil, count_include_pad, divisor_override]` for `avg_pool2d`.
pub fn pool_window(pool: Pool, p: &[i64], g: &mut Geom) -> Result<(), String> {
    match (pool, p) {
        (Pool::Max | Pool::MaxWithIndices, &[kh, kw, sh, sw, ph, pw, dh, dw, _]) => {
            g.set(K, &[kh, kw]);
            g.set(STRIDE, &[sh, sw]);
            g.set(PAD, &[ph, pw]);
            g.set(DIL, &[dh, dw]);
            g.v[FLAG] = i64::from(pool == Pool::MaxWithIndices);
        }
        (Pool::Avg, &[kh, kw, sh, sw, ph, pw, _, include_pad, divisor]) => {
            g.set(K, &[kh, kw]);
            g.set(STRIDE, &[sh, sw]);
            g.set(PAD, &[ph, pw]);
            g.set(DIL, &[1, 1]);
            g.v[FLAG] = i64::from(include_pad != 0);
            g.v[DIV] = divisor;
        }
        (Pool::Adaptive, &[_, _]) => {}
        _ => return Err(format!("unexpected parameter list {p:?}")),
    }
    Ok(())
}

/// The geometry of a pool's kernel over input `x`, output `out` and, for
/// `max_pool2d_with_indices`, the indices `idx`, from the parameter list `p`.
pub fn pool_geom(
    pool: Pool,
    p: &[i64],
    x: &TensorMeta,
    out: &TensorMeta,
    idx: Option<&TensorMeta>,
) -> Result<Geom, String> {
    let mut g = Geom::new();
    pool_window(pool, p, &mut g)?;
    g.set(0, &sizes(&out.shape));
    g.strides(XS, &x.strides);
    g.strides(OS, &out.strides);
    if let Some(i) = idx {
        g.strides(IS, &i.strides);
    }
    g.set(H, &[x.shape[2] as i64, x.shape[3] as i64]);
    g.v[COUNT] = out.numel() as i64;
    Ok(g)
}

impl CpuTwin for CudaPool {
    fn cpu_twin(&self) -> &'static dyn OpKernel {
        self.cpu()
    }
}

impl OpKernel for CudaPool {
    like_cpu!(twin);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        let op = self.cpu().name();
        check_outputs(self.cpu(), ctx)?;
        let x = ctx.inputs.first().ok_or("missing input 0")?;
        let params = ctx.attrs.params().ints().to_vec();
        let pool = self.0;
        let outputs = &*ctx.outputs;
        on_stream(op, |s| {
            let mut xd = device_operand(s, "input 0", x.meta, x.data)?;
            let od = device_operand(s, "output 0", outputs[0].meta, outputs[0].data)?;
            let id = match outputs.get(1) {
                Some(t) => Some(device_operand(s, "output 1", t.meta, t.data)?),
                None => None,
            };
            if od.meta.numel() == 0 {
                return Ok(());
            }
            if let Some(i) = &id {
                if must_stage(i, &od) {
                    return Err("output 1 shares memory with output 0".into());
                }
            }
            if must_stage(&xd, &od) || id.as_ref().is_some_and(|i| must_stage(&xd, i)) {
                xd = stage(s, op, &xd)?;
            }
            let g = pool_geom(pool, &params, &xd.meta, &od.meta, id.as_ref().map(|i| &*i.meta))?;
            let d = od.meta.dtype;
            let pi = id.as_ref().map_or(0, |i| i.addr());
            launch_spatial(s, &format!("{}_{d}", self.kernel()), [od.addr(), pi, xd.addr()], &g)
        })
    }
}

// ---------------------------------------------------------------------------------------
// scaled_dot_product_attention

/// `scaled_dot_product_attention` on CUDA: the `attention_<dtype>` kernel, one thread per
/// query row, in the CPU kernel's operations and order (see [`super::nn_source`]); the
/// scores of a chunk of rows in a temporary of the compute type.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaAttention;

/// The geometry of `attention_<dtype>`: 64 `i64` by value, as the source's `struct Attn`.
///
/// | slots | what |
/// | --- | --- |
/// | 0 | the rows of this launch |
/// | 1–4 | `L`, `S`, `E`, `Ev` |
/// | 5, 6 | causal (0, 1); the mask: 0 none, 1 `bool`, 2 of the inputs' dtype |
/// | 7 | the scale, an `f64`'s bits |
/// | 8, 9–14 | the batch dimensions left after merging (at most 6) and their sizes |
/// | 16 + 8·o .. | operand `o` (`q`, `k`, `v`, the output, the mask): 6 batch strides, then its row and column strides |
/// | 57 | the first row of this launch |
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Attn {
    /// The slots (see the type's docs).
    pub v: [i64; 64],
}

// SAFETY: `Attn` is `repr(C)` plain integers, the `struct Attn` of the generated source
// (`nn_source`), which `attention_<d>` takes by value.
unsafe impl DeviceRepr for Attn {}

/// The most batch dimensions `attention_<d>` takes after merging.
pub const ATTN_BATCH_DIMS: usize = 6;

/// The bytes of scores one launch of `attention_<d>` aims at.
const ATTN_SCORE_BYTES: usize = 64 << 20;

/// The strides of a mask of any rank broadcast to `[*batch, L, S]` (0 along a dimension
/// it has as 1 or lacks): the CPU kernel's rule.
pub fn mask_strides(m: &TensorMeta, full: usize) -> Vec<isize> {
    (0..full)
        .map(|d| match (d + m.shape.len()).checked_sub(full) {
            Some(i) if m.shape[i] != 1 => m.strides[i],
            _ => 0,
        })
        .collect()
}

/// The slots of [`Attn`] but the row range, for the output `out: [*batch, L, Ev]` and the
/// operands `q`, `k`, `v` and the mask (`None`: none); an error when more than
/// [`ATTN_BATCH_DIMS`] batch dimensions remain after merging.
pub fn attention_geometry(
    out: &TensorMeta,
    q: &TensorMeta,
    k: &TensorMeta,
    v: &TensorMeta,
    mask: Option<&TensorMeta>,
    causal: bool,
    scale: f64,
) -> Result<Attn, String> {
    let r = out.shape.len();
    let batch = &out.shape[..r - 2];
    let mat = |t: &TensorMeta| {
        let n = t.strides.len();
        (batch_strides(t, batch), [t.strides[n - 2], t.strides[n - 1]])
    };
    let (mut ops, mut mats) = (Vec::new(), Vec::new());
    for t in [q, k, v, out] {
        let (b, m) = mat(t);
        ops.push(b);
        mats.push(m);
    }
    match mask {
        Some(m) => {
            let s = mask_strides(m, r);
            ops.push(s[..r - 2].to_vec());
            mats.push([s[r - 2], s[r - 1]]);
        }
        None => {
            ops.push(vec![0; r - 2]);
            mats.push([0, 0]);
        }
    }
    let dims = merge_batch(batch, [&ops[0][..], &ops[1], &ops[2], &ops[3], &ops[4]]);
    if dims.len() > ATTN_BATCH_DIMS {
        return Err(format!(
            "scaled_dot_product_attention of {} keeps {} batch dimensions after merging the \
             contiguous ones: CUDA takes at most {ATTN_BATCH_DIMS} (make the operands contiguous first)",
            out.describe(),
            dims.len()
        ));
    }
    let mut a = Attn { v: [0; 64] };
    let (qn, kn, vn) = (q.shape.len(), k.shape.len(), v.shape.len());
    a.v[1..5].copy_from_slice(&[
        out.shape[r - 2] as i64,
        k.shape[kn - 2] as i64,
        q.shape[qn - 1] as i64,
        v.shape[vn - 1] as i64,
    ]);
    a.v[5] = i64::from(causal);
    a.v[6] = match mask {
        None => 0,
        Some(m) if m.dtype == DType::Bool => 1,
        Some(_) => 2,
    };
    a.v[7] = scale.to_bits() as i64;
    a.v[8] = dims.len() as i64;
    for (d, (size, st)) in dims.iter().enumerate() {
        a.v[9 + d] = *size as i64;
        for (o, &x) in st.iter().enumerate() {
            a.v[16 + 8 * o + d] = x as i64;
        }
    }
    for (o, m) in mats.iter().enumerate() {
        a.v[16 + 8 * o + 6] = m[0] as i64;
        a.v[16 + 8 * o + 7] = m[1] as i64;
    }
    Ok(a)
}

/// The call's `(is_causal, scale)` (checked by the CPU kernel's `infer` first).
fn attention_params(attrs: &Attrs) -> Result<(bool, f64), String> {
    let p = attrs.params();
    match (p.ints(), p.scalars()) {
        ([c], [crate::vm::Scalar::Float(s)]) => Ok((*c == 1, *s)),
        _ => Err(format!("unexpected parameter list {p}")),
    }
}

impl OpKernel for CudaAttention {
    like_cpu!(kernel crate::kernels::AttentionKernel);

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        const OP: &str = "scaled_dot_product_attention";
        check_outputs(&crate::kernels::AttentionKernel, ctx)?;
        let (causal, scale) = attention_params(&ctx.attrs)?;
        let out = &ctx.outputs[0];
        let inputs = ctx.inputs;
        on_stream(OP, |s| {
            let od = device_operand(s, "output 0", out.meta, out.data)?;
            let mut ops = Vec::with_capacity(inputs.len());
            for (i, t) in inputs.iter().enumerate() {
                let mut dv = device_operand(s, &format!("input {i}"), t.meta, t.data)?;
                if must_stage(&dv, &od) {
                    dv = stage(s, OP, &dv)?;
                }
                ops.push(dv);
            }
            if od.meta.numel() == 0 {
                return Ok(());
            }
            let mask = ops.get(3);
            let mut a = attention_geometry(
                &od.meta,
                &ops[0].meta,
                &ops[1].meta,
                &ops[2].meta,
                mask.map(|m| &*m.meta),
                causal,
                scale,
            )?;
            let d = od.meta.dtype;
            let ct = compute_dtype(d);
            let r = od.meta.shape.len();
            let rows = od.meta.numel() / od.meta.shape[r - 1];
            let s_len = a.v[2] as usize;
            let chunk = (ATTN_SCORE_BYTES / (s_len * ct.size()).max(1)).clamp(1, rows);
            let scores = temp(s, chunk * s_len * ct.size())?;
            let f = function(s, &format!("attention_{d}"))?;
            let p = [od.addr(), ops[0].addr(), ops[1].addr(), ops[2].addr(), mask.map_or(0, |m| m.addr())];
            let sc = scores.addr();
            let mut first = 0;
            while first < rows {
                let count = chunk.min(rows - first);
                a.v[0] = count as i64;
                a.v[57] = first as i64;
                let mut l = s.cuda_stream().launch_builder(&f);
                l.arg(&p[0]).arg(&p[1]).arg(&p[2]).arg(&p[3]).arg(&p[4]).arg(&sc).arg(&a);
                // SAFETY: `attention_<d>` takes (T*, const T* ×3, const void*, acc*, Attn),
                // matching these arguments. `attention_geometry` took every size and stride
                // from the operands' checked layouts (the mask's and the inputs' batch
                // strides 0 where broadcast), so the rows `first .. first + count` touch only
                // their elements; `scores` holds `count · S` accumulators. Inputs sharing the
                // output's bytes were staged; blocks live until the instruction retires or
                // this stream is past the work (temporaries).
                unsafe { l.launch(launch_config(count)) }
                    .map_err(|e| format!("launching attention_{d}: {e}"))?;
                first += count;
            }
            Ok(())
        })
    }
}

// ---------------------------------------------------------------------------------------
// nll_loss

/// `nll_loss` on CUDA: `nll_loss_<dtype>` computes each target's loss and weight (one
/// thread each) and, with `'none'`, stores the loss; with `'sum'` or `'mean'` it keeps both
/// in a temporary of the compute type, and `nll_sum_<dtype>` adds them in the CPU's
/// `sum_in_order` (see [`super::nn_source`]), so the results are the CPU's bit for bit. A
/// target outside `0..C` that is not `ignore_index` is reported to the stream's fault
/// record (`ep::fault`), and the call fails as on the CPU once the stream has run it (a
/// checked launch: `OpKernel::checks_data`); its loss and weight are NaN meanwhile.
#[derive(Debug, Clone, Copy, Default)]
pub struct CudaNllLoss;

/// The layout of `nll_loss_<dtype>` over the targets' shape: the targets' strides, `x`'s
/// without its class dimension (1), and the output's (`'none'`) or zeros.
pub fn nll_layout(x: &TensorMeta, targets: &TensorMeta, out: Option<&TensorMeta>) -> Result<Layout, String> {
    let xs: Vec<isize> = x.strides.iter().enumerate().filter(|&(d, _)| d != 1).map(|(_, &s)| s).collect();
    let os = out.map_or_else(|| vec![0; targets.shape.len()], |o| o.strides.to_vec());
    Layout::plan(&targets.shape, &[&targets.strides, &xs, &os])
}

impl OpKernel for CudaNllLoss {
    like_cpu!(kernel crate::kernels::NllLossKernel);

    fn checks_data(&self, _: &Attrs) -> bool {
        true
    }

    fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
        const OP: &str = "nll_loss";
        check_outputs(&crate::kernels::NllLossKernel, ctx)?;
        let (reduction, ignore, has_w) = match ctx.attrs.params().ints() {
            &[r, ignore, w] => (r, ignore, w != 0),
            _ => return Err("expected a parameter list [reduction, ignore_index, has_weight]".into()),
        };
        let out = &ctx.outputs[0];
        let inputs = ctx.inputs;
        on_stream(OP, |s| {
            let od = device_operand(s, "output 0", out.meta, out.data)?;
            let mut ops = Vec::with_capacity(inputs.len());
            for (i, t) in inputs.iter().enumerate() {
                let mut dv = device_operand(s, &format!("input {i}"), t.meta, t.data)?;
                if must_stage(&dv, &od) {
                    dv = stage(s, OP, &dv)?;
                }
                ops.push(dv);
            }
            let (xd, td) = (&ops[0], &ops[1]);
            let d = od.meta.dtype;
            let ct = compute_dtype(d);
            let none = reduction == 0;
            let layout = nll_layout(&xd.meta, &td.meta, none.then_some(&*od.meta))?;
            let n = td.meta.numel();
            let parts = if none { None } else { Some(temp(s, 2 * n * ct.size())?) };
            if n > 0 {
                let f = function(s, &format!("nll_loss_{d}"))?;
                let (po, pp, px, pt) =
                    (od.addr(), parts.as_ref().map_or(0, |p| p.addr()), xd.addr(), td.addr());
                let pw = ops.get(2).filter(|_| has_w).map_or(0, |w| w.addr());
                let ws = ops.get(2).map_or(0, |w| w.meta.strides[0] as i64);
                let (classes, xcs) = (xd.meta.shape[1] as i64, xd.meta.strides[1] as i64);
                let (hw, nn, fault) = (i32::from(has_w), i32::from(none), fault_record(s));
                let mut l = s.cuda_stream().launch_builder(&f);
                l.arg(&po).arg(&pp).arg(&px).arg(&pt).arg(&pw).arg(&layout);
                l.arg(&classes).arg(&xcs).arg(&ws).arg(&ignore).arg(&hw).arg(&nn).arg(&fault);
                // SAFETY: `nll_loss_<d>` takes (T*, acc*, const T*, const i64*, const T*,
                // Layout, i64 ×4, int, int, const void*), matching these arguments; `fault`
                // is 0 or the stream's fault record, which lives as long as the stream, in
                // memory the device may write. The layout's strides
                // are the targets', `x`'s (its class dimension left out) and the output's
                // (zeros without `'none'`), all checked against their storages; a class is
                // read only when `0 <= t < classes` (`x[o1 + t·xcs]`, `w[t·ws]`); `parts`
                // holds `2·n` accumulators when the output is not written. Inputs sharing the
                // output's bytes were staged; blocks live as the module docs say.
                unsafe { l.launch(launch_config(n)) }.map_err(|e| format!("launching nll_loss_{d}: {e}"))?;
            }
            if let Some(p) = &parts {
                let f = function(s, &format!("nll_sum_{d}"))?;
                let (po, pp, n64, mean) = (od.addr(), p.addr(), n as u64, i32::from(reduction == 1));
                let mut l = s.cuda_stream().launch_builder(&f);
                l.arg(&po).arg(&pp).arg(&n64).arg(&mean);
                let one_block = cudarc::driver::LaunchConfig {
                    grid_dim: (1, 1, 1),
                    block_dim: (32, 1, 1),
                    shared_mem_bytes: 0,
                };
                // SAFETY: `nll_sum_<d>` takes (T*, const acc*, u64, int), matching these
                // arguments; `parts` holds the `2·n` accumulators `nll_loss_<d>` wrote before
                // it on this stream, and the output is one element of `d` (0-d).
                unsafe { l.launch(one_block) }.map_err(|e| format!("launching nll_sum_{d}: {e}"))?;
            }
            Ok(())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::DeviceId;

    fn meta(shape: &[usize], strides: &[isize]) -> TensorMeta {
        let mut m = TensorMeta::new(shape, DType::I32, DeviceId::cuda(0));
        m.strides = strides.iter().copied().collect();
        m
    }

    #[test]
    fn batch_strides_follow_broadcasting() {
        let a = meta(&[3, 1, 4, 5], &[20, 20, 5, 1]);
        assert_eq!(batch_strides(&a, &[3, 2]), vec![20, 0]);
        let b = meta(&[5, 6], &[6, 1]);
        assert_eq!(batch_strides(&b, &[3, 2]), vec![0, 0]);
        let c = meta(&[2, 5, 6], &[30, 6, 1]);
        assert_eq!(batch_strides(&c, &[3, 2]), vec![0, 30]);
    }

    #[test]
    fn batch_dimensions_merge_where_every_operand_runs_on() {
        // Contiguous [2, 3] batches of 4×5 outputs, a of 4×6, b broadcast.
        let dims = merge_batch(&[2, 3], [&[60, 20], &[72, 24], &[0, 0]]);
        assert_eq!(dims, vec![(6, [20, 24, 0])]);
        // b broadcast along the outer dimension only: no merge.
        let dims = merge_batch(&[2, 3], [&[60, 20], &[72, 24], &[0, 30]]);
        assert_eq!(dims, vec![(2, [60, 72, 0]), (3, [20, 24, 30])]);
        // Size-1 dimensions vanish.
        assert_eq!(merge_batch(&[1, 4, 1], [&[9, 9, 9], &[1, 2, 3], &[0, 5, 0]]), vec![(4, [9, 2, 5])]);
        assert!(merge_batch(&[], [&[], &[], &[]]).is_empty());
    }

    /// The integer kernel's layout: at element `[q, i, j]` the output's offset, `a`'s
    /// offset of `[q, i, 0]` and `b`'s of `[q, 0, j]`.
    #[test]
    fn int_layout_points_at_rows_and_columns() {
        let out = meta(&[2, 3, 4], &[12, 4, 1]);
        let a = meta(&[2, 3, 5], &[1, 10, 2]);
        let b = meta(&[5, 4], &[4, 1]);
        let [so, sa, sb] = int_layout(&out, &a, &b);
        let layout = Layout::plan(&out.shape, &[&so, &sa, &sb]).unwrap();
        for q in 0..2 {
            for i in 0..3 {
                for j in 0..4 {
                    let t = (q * 12 + i * 4 + j) as u64;
                    let o = layout.offsets(t);
                    assert_eq!(o, [t as i64, (q + i * 10) as i64, j as i64], "[{q}, {i}, {j}]");
                }
            }
        }
    }

    #[test]
    fn conv_chunks_stay_near_the_budget() {
        assert_eq!(conv_chunk(10, 1 << 20), 10);
        assert_eq!(conv_chunk(1000, 1 << 20), 64);
        assert_eq!(conv_chunk(3, CONV_TEMP_BYTES * 2), 1);
        assert_eq!(conv_chunk(0, 100), 1);
    }

    #[test]
    fn pool_parameter_lists_fill_the_window() {
        let mut g = Geom::new();
        pool_window(Pool::MaxWithIndices, &[3, 2, 2, 1, 1, 0, 2, 1, 1], &mut g).unwrap();
        assert_eq!(&g.v[K..K + 8], &[3, 2, 2, 1, 1, 0, 2, 1]);
        assert_eq!(g.v[FLAG], 1);
        let mut g = Geom::new();
        pool_window(Pool::Avg, &[3, 3, 2, 2, 1, 1, 0, 1, 5], &mut g).unwrap();
        assert_eq!(&g.v[K..K + 8], &[3, 3, 2, 2, 1, 1, 1, 1]);
        assert_eq!((g.v[FLAG], g.v[DIV]), (1, 5));
        assert!(pool_window(Pool::Avg, &[3, 3], &mut g).is_err());
    }

    /// The slots of `attention_<d>`: a broadcast `k` and `v` batch, a mask broadcast over
    /// the batch and the rows, the row and column strides of each operand.
    #[test]
    fn attention_slots_follow_the_layouts() {
        let f = |shape: &[usize], strides: &[isize], d: DType| {
            let mut m = TensorMeta::new(shape, d, DeviceId::cuda(0));
            m.strides = strides.iter().copied().collect();
            m
        };
        let q = f(&[2, 3, 5, 4], &[60, 20, 4, 1], DType::F32);
        let k = f(&[3, 7, 4], &[28, 4, 1], DType::F32);
        let v = f(&[3, 7, 6], &[1, 18, 3], DType::F32);
        let out = f(&[2, 3, 5, 6], &[90, 30, 6, 1], DType::F32);
        let mask = f(&[7], &[1], DType::Bool);
        let a = attention_geometry(&out, &q, &k, &v, Some(&mask), false, 0.5).unwrap();
        assert_eq!(&a.v[1..9], &[5, 7, 4, 6, 0, 1, 0.5f64.to_bits() as i64, 2]);
        assert_eq!(&a.v[9..11], &[2, 3]);
        let op = |o: usize| &a.v[16 + 8 * o..24 + 8 * o];
        assert_eq!(op(0), &[60, 20, 0, 0, 0, 0, 4, 1]);
        assert_eq!(op(1), &[0, 28, 0, 0, 0, 0, 4, 1]);
        assert_eq!(op(2), &[0, 1, 0, 0, 0, 0, 18, 3]);
        assert_eq!(op(3), &[90, 30, 0, 0, 0, 0, 6, 1]);
        assert_eq!(op(4), &[0, 0, 0, 0, 0, 0, 0, 1]);
        // Contiguous operands merge into one batch dimension.
        let k2 = f(&[2, 3, 7, 4], &[84, 28, 4, 1], DType::F32);
        let v2 = f(&[2, 3, 7, 6], &[126, 42, 6, 1], DType::F32);
        let a = attention_geometry(&out, &q, &k2, &v2, None, true, 1.0).unwrap();
        assert_eq!((a.v[5], a.v[6], a.v[8], a.v[9]), (1, 0, 1, 6));
        assert_eq!(&a.v[16..17], &[20]);
        assert_eq!(std::mem::size_of::<Attn>(), 512);
    }

    /// `nll_loss`'s layout: at target `[n, y]` the target's offset, `x`'s at `[n, 0, y]`
    /// and the output's.
    #[test]
    fn nll_layout_leaves_out_the_classes() {
        let x = meta(&[2, 5, 3], &[15, 3, 1]);
        let t = meta(&[2, 3], &[1, 2]);
        let o = meta(&[2, 3], &[3, 1]);
        let layout = nll_layout(&x, &t, Some(&o)).unwrap();
        for n in 0..2 {
            for y in 0..3 {
                let at = layout.offsets((n * 3 + y) as u64);
                assert_eq!(at, [(n + 2 * y) as i64, (15 * n + y) as i64, (3 * n + y) as i64]);
            }
        }
        let layout = nll_layout(&x, &t, None).unwrap();
        assert_eq!(layout.offsets(4)[2], 0);
    }

    /// `conv2d`'s slots: strides, plane and window, stride, top and left padding (bottom
    /// and right only shape the output), dilation, the bias's stride and flag.
    #[test]
    fn conv_geometry_takes_top_and_left_padding() {
        let f = |shape: &[usize]| TensorMeta::new(shape, DType::F32, DeviceId::cuda(0));
        let (x, w, b) = (f(&[2, 4, 10, 9]), f(&[6, 2, 3, 2]), meta(&[6], &[-1]));
        let out = f(&[2, 6, 4, 10]);
        let g = conv_geom(&[2, 1, 0, 1, 2, 0, 2, 1, 2], &x, &w, Some(&b), &out);
        assert_eq!(&g.v[XS..XS + 4], &[360, 90, 9, 1]);
        assert_eq!(&g.v[OS..OS + 4], &[240, 40, 10, 1]);
        assert_eq!(&g.v[H..H + 4], &[10, 9, 3, 2]);
        assert_eq!(&g.v[STRIDE..DIL + 2], &[2, 1, 0, 2, 2, 1]);
        assert_eq!((g.v[IS], g.v[FLAG]), (-1, 1));
        let g = conv_geom(&[1; 9], &x, &w, None, &out);
        assert_eq!((g.v[IS], g.v[FLAG]), (0, 0));
    }

    #[test]
    fn geom_is_the_c_struct() {
        assert_eq!(std::mem::size_of::<Geom>(), 256);
        assert_eq!(advance(1000, -3, DType::F32), 988);
    }
}

/// The generated CUDA C of this family compiled as C++ on the host (`g++`, one thread per
/// block: every grid-stride loop runs whole in one call; `nll_sum`'s 32 threads one after
/// another, thread 0 last) and run on the geometry the kernels above compute, against the
/// CPU kernels: the pools, `nll_loss` and integer `bmm` bit for bit, attention bit for bit
/// (the host's `exp` on both sides), `conv2d` (with a host product in place of cuBLAS)
/// within rounding. It checks the kernels' index arithmetic and formulas, not the launches.
/// Needs `g++`: `cargo test --lib kernels::cuda::nn::emulated -- --ignored`.
#[cfg(test)]
pub(super) mod emulated {
    use super::*;
    use crate::ep::DeviceId;
    use crate::kernels::testing::{run_with, storage, Owned};
    use std::ffi::c_void;

    const SHIM: &str = r#"
#include <math.h>
#include <string.h>
struct U3 { unsigned x, y, z; };
static U3 blockIdx = {0,0,0}, threadIdx = {0,0,0}, blockDim = {1,1,1}, gridDim = {1,1,1};
extern "C" void emu_set_thread(unsigned t, unsigned n) { threadIdx.x = t; blockDim.x = n; }
#define __global__
#define __device__
#define __forceinline__ inline
#define __shared__ static
static inline void __syncthreads() {}
static inline unsigned atomicCAS(unsigned* p, unsigned c, unsigned v) { unsigned o = *p; if (o == c) *p = v; return o; }
static inline void __threadfence_system() {}
static inline float __int_as_float(int u) { float f; memcpy(&f, &u, 4); return f; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline double __longlong_as_double(long long u) { double f; memcpy(&f, &u, 8); return f; }
static inline float __fmul_rn(float a, float b) { return a * b; }
static inline float __fadd_rn(float a, float b) { return a + b; }
static inline double __dmul_rn(double a, double b) { return a * b; }
static inline double __dadd_rn(double a, double b) { return a + b; }
"#;

    /// The module of dtype `d` compiled by `g++` into a shared library (once per text).
    fn lib(d: DType) -> libloading::Library {
        module_lib(d.name())
    }

    /// The module `name` compiled by `g++` into a shared library (once per text).
    pub(in crate::kernels::cuda) fn module_lib(name: &str) -> libloading::Library {
        use std::hash::{Hash, Hasher};
        // The tests compile one at a time: two writing one source file would race.
        static COMPILING: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let _one = COMPILING.lock().unwrap_or_else(|p| p.into_inner());
        let src = super::super::source::source();
        let m = src.modules.iter().find(|m| m.name == name).expect("a module of that name");
        let text = format!("{SHIM}{}", m.text);
        let mut h = std::collections::hash_map::DefaultHasher::new();
        text.hash(&mut h);
        let dir = std::env::temp_dir();
        let (c, so) = (
            dir.join(format!("eagervm_emulated_{name}_{:x}.cpp", h.finish())),
            dir.join(format!("eagervm_emulated_{name}_{:x}.so", h.finish())),
        );
        if !so.exists() {
            std::fs::write(&c, text).expect("writing the C++ source");
            let tmp = so.with_extension(format!("{}.tmp", std::process::id()));
            let st = std::process::Command::new("g++")
                .args(["-O1", "-w", "-shared", "-fPIC", "-ffp-contract=off", "-x", "c++"])
                .arg(&c)
                .arg("-o")
                .arg(&tmp)
                .status()
                .expect("running g++");
            assert!(st.success(), "g++ failed on {}", c.display());
            std::fs::rename(&tmp, &so).expect("placing the library");
        }
        // SAFETY: a library of this test's own making, with no initialisers beyond C++
        // statics of plain data.
        unsafe { libloading::Library::new(&so).expect("loading the library") }
    }

    fn vals_f32(n: usize, seed: u32) -> Vec<f32> {
        let mut x = seed.wrapping_mul(2654435761) | 1;
        (0..n)
            .map(|i| {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                match x % 23 {
                    0 if seed % 2 == 0 => f32::NAN,
                    1 if seed % 2 == 0 => f32::INFINITY,
                    2 if seed % 2 == 0 => f32::NEG_INFINITY,
                    3 => -0.0,
                    _ => ((x >> 8) % 129) as f32 / 8.0 - 8.0 + i as f32 * 0.0,
                }
            })
            .collect()
    }

    /// A tensor of `shape` and dtype `d` from f32 values, laid out transposed (reversed dims) when `t`.
    fn make(d: DType, shape: &[usize], v: &[f32], t: bool) -> Owned {
        let mut meta = TensorMeta::new(shape, d, DeviceId::CPU);
        let n = meta.numel();
        let bytes: Vec<u8> = match d {
            DType::F32 => v[..n].iter().flat_map(|x| x.to_ne_bytes()).collect(),
            DType::F64 => v[..n].iter().flat_map(|x| f64::from(*x).to_ne_bytes()).collect(),
            DType::F16 => v[..n].iter().flat_map(|x| half::f16::from_f32(*x).to_ne_bytes()).collect(),
            DType::I32 => v[..n]
                .iter()
                .flat_map(|x| (if x.is_finite() { (*x * 8.0) as i32 } else { i32::MIN }).to_ne_bytes())
                .collect(),
            DType::I64 => v[..n]
                .iter()
                .flat_map(|x| (if x.is_finite() { (*x * 8.0) as i64 } else { 3 }).to_ne_bytes())
                .collect(),
            _ => unreachable!(),
        };
        if t {
            let rev: Vec<usize> = shape.iter().rev().copied().collect();
            let cs = crate::vm::contiguous_strides(&rev);
            let r = shape.len();
            meta.strides = (0..r).map(|k| cs[r - 1 - k]).collect();
        }
        (meta, storage(&bytes))
    }

    fn same(a: &[u8], b: &[u8], d: DType, what: &str) {
        let n = d.size();
        assert_eq!(a.len(), b.len(), "{what}");
        for i in 0..a.len() / n {
            let (x, y) = (&a[i * n..(i + 1) * n], &b[i * n..(i + 1) * n]);
            let nan = |z: &[u8]| match d {
                DType::F32 => f32::from_ne_bytes(z.try_into().unwrap()).is_nan(),
                DType::F64 => f64::from_ne_bytes(z.try_into().unwrap()).is_nan(),
                DType::F16 => half::f16::from_ne_bytes(z.try_into().unwrap()).is_nan(),
                _ => false,
            };
            assert!(x == y || (nan(x) && nan(y)), "{what}: element {i}: {x:?} vs {y:?}");
        }
    }

    type PoolFn = unsafe extern "C" fn(*mut c_void, *mut i64, *const c_void, Geom);

    #[test]
    #[ignore = "needs g++"]
    fn emulated_pools_equal_the_cpu() {
        let mut n = 0;
        for d in [DType::F32, DType::F16, DType::I32, DType::F64] {
            let l = lib(d);
            for (pool, cpu, xs, p) in [
                (
                    Pool::MaxWithIndices,
                    &crate::kernels::MAX_POOL2D_WITH_INDICES as &dyn OpKernel,
                    [2usize, 3, 11, 9],
                    vec![3i64, 3, 2, 2, 1, 1, 1, 1, 0],
                ),
                (
                    Pool::MaxWithIndices,
                    &crate::kernels::MAX_POOL2D_WITH_INDICES,
                    [2, 3, 11, 9],
                    vec![3, 2, 2, 1, 1, 0, 2, 1, 1],
                ),
                (Pool::Max, &crate::kernels::MAX_POOL2D, [1, 2, 10, 10], vec![2, 2, 2, 2, 0, 0, 1, 1, 0]),
                (Pool::Avg, &crate::kernels::AvgPool2dKernel, [2, 3, 11, 9], vec![3, 3, 2, 2, 1, 1, 0, 1, 0]),
                (Pool::Avg, &crate::kernels::AvgPool2dKernel, [2, 3, 11, 9], vec![3, 2, 2, 1, 1, 1, 1, 0, 0]),
                (Pool::Avg, &crate::kernels::AvgPool2dKernel, [2, 3, 11, 9], vec![2, 2, 2, 2, 0, 0, 1, 0, 3]),
                (Pool::Adaptive, &crate::kernels::AdaptiveAvgPool2dKernel, [2, 3, 11, 9], vec![4, 5]),
                (Pool::Adaptive, &crate::kernels::AdaptiveAvgPool2dKernel, [1, 2, 40, 30], vec![13, 7]),
            ] {
                if d == DType::I32 && !matches!(pool, Pool::Max | Pool::MaxWithIndices) {
                    continue;
                }
                for (seed, t) in [(2u32, false), (4, true), (5, true)] {
                    let v = vals_f32(xs.iter().product(), seed);
                    let x = make(d, &xs, &v, t);
                    let attrs = Attrs::default().with_params(&p, &[]).unwrap();
                    let outs =
                        run_with(cpu, attrs, vec![(x.0.clone(), storage(x.1.as_bytes()))], &[]).unwrap();
                    let om = &outs[0].0;
                    let im = outs.get(1).map(|o| &o.0);
                    let g = pool_geom(pool, &p, &x.0, om, im).unwrap();
                    let mut out = vec![0u8; om.bytes()];
                    let mut idx = vec![0i64; om.numel()];
                    let sym = format!("{}_{d}", CudaPool(pool).kernel());
                    let f: libloading::Symbol<PoolFn> = unsafe { l.get(sym.as_bytes()).unwrap() };
                    let xp = unsafe { x.1.as_ptr().add(x.0.offset * d.size()) };
                    unsafe { f(out.as_mut_ptr().cast(), idx.as_mut_ptr(), xp.cast(), g) };
                    same(&out, outs[0].1.as_bytes(), d, &format!("{sym} {p:?} seed {seed} t {t}"));
                    if let Some(o) = outs.get(1) {
                        let want: Vec<i64> = crate::kernels::testing::values(o);
                        assert_eq!(idx, want, "{sym} indices {p:?} {seed}");
                    }
                    n += 1;
                }
            }
        }
        println!("{n} pool calls emulated");
    }

    type AttnFn = unsafe extern "C" fn(
        *mut c_void,
        *const c_void,
        *const c_void,
        *const c_void,
        *const c_void,
        *mut c_void,
        Attn,
    );

    #[test]
    #[ignore = "needs g++"]
    fn emulated_attention_equals_the_cpu() {
        let mut n = 0;
        for d in [DType::F32, DType::F16, DType::F64] {
            let l = lib(d);
            let f: libloading::Symbol<AttnFn> =
                unsafe { l.get(format!("attention_{d}").as_bytes()).unwrap() };
            type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], Option<(&'a [usize], bool)>, i64);
            let cases: [Case; 4] = [
                (&[2, 3, 5, 4], &[3, 7, 4], &[3, 7, 6], None, 0),
                (&[2, 5, 4], &[2, 5, 4], &[2, 5, 3], None, 1),
                (&[2, 3, 5, 4], &[2, 3, 7, 4], &[2, 3, 7, 6], Some((&[5, 7], true)), 0),
                (&[2, 3, 5, 4], &[2, 3, 7, 4], &[2, 3, 7, 6], Some((&[2, 1, 5, 7], false)), 0),
            ];
            for (qs, ks, vs, mask, causal) in cases {
                for t in [false, true] {
                    let q = make(d, qs, &vals_f32(200, 3), t);
                    let k = make(d, ks, &vals_f32(200, 5), !t);
                    let v = make(d, vs, &vals_f32(300, 7), t);
                    let mut ins = vec![q, k, v];
                    if let Some((ms, boolean)) = mask {
                        let vals = vals_f32(300, 9);
                        if boolean {
                            let bytes: Vec<u8> = vals[..ms.iter().product::<usize>()]
                                .iter()
                                .map(|x| u8::from(*x > -6.0))
                                .collect();
                            ins.push((TensorMeta::new(ms, DType::Bool, DeviceId::CPU), storage(&bytes)));
                        } else {
                            ins.push(make(d, ms, &vals, false));
                        }
                    }
                    let attrs =
                        Attrs::default().with_params(&[causal], &[crate::vm::Scalar::Float(0.5)]).unwrap();
                    let copy: Vec<Owned> =
                        ins.iter().map(|(m, s)| (m.clone(), storage(s.as_bytes()))).collect();
                    let outs = run_with(&crate::kernels::AttentionKernel, attrs, copy, &[]).unwrap();
                    let om = &outs[0].0;
                    let mut a = attention_geometry(
                        om,
                        &ins[0].0,
                        &ins[1].0,
                        &ins[2].0,
                        ins.get(3).map(|m| &m.0),
                        causal == 1,
                        0.5,
                    )
                    .unwrap();
                    let rows = om.numel() / om.shape[om.shape.len() - 1];
                    let s_len = a.v[2] as usize;
                    let mut out = vec![0u8; om.bytes()];
                    let mut scores = vec![0f64; rows * s_len];
                    // two launches: rows split
                    let half = rows / 2;
                    for (first, count) in [(0, half), (half, rows - half)] {
                        a.v[0] = count as i64;
                        a.v[57] = first as i64;
                        let p = |i: usize| unsafe {
                            ins[i].1.as_ptr().add(ins[i].0.offset * ins[i].0.dtype.size())
                        } as *const c_void;
                        let mp = if ins.len() > 3 { p(3) } else { std::ptr::null() };
                        unsafe {
                            f(out.as_mut_ptr().cast(), p(0), p(1), p(2), mp, scores.as_mut_ptr().cast(), a)
                        };
                    }
                    // exp is the same libm on both sides here: bits agree.
                    same(&out, outs[0].1.as_bytes(), d, &format!("attention {d} {qs:?} {mask:?} {t}"));
                    n += 1;
                }
            }
        }
        println!("{n} attention calls emulated");
    }

    type Spatial = unsafe extern "C" fn(*mut c_void, *const c_void, *const c_void, Geom);

    #[test]
    #[ignore = "needs g++"]
    fn emulated_conv_equals_the_cpu() {
        let mut n = 0;
        for d in [DType::F32, DType::F64, DType::F16] {
            let l = lib(d);
            let im2col: libloading::Symbol<Spatial> =
                unsafe { l.get(format!("im2col_{d}").as_bytes()).unwrap() };
            let conv_out: libloading::Symbol<Spatial> =
                unsafe { l.get(format!("conv_out_{d}").as_bytes()).unwrap() };
            let ct = compute_dtype(d);
            for (xs, ws, p, has_bias) in [
                ([2usize, 3, 9, 8], [4usize, 3, 3, 3], [1i64, 1, 1, 1, 1, 1, 1, 1, 1], true),
                ([2, 4, 10, 9], [6, 2, 3, 2], [2, 1, 0, 1, 2, 0, 2, 1, 2], false),
                ([1, 6, 5, 5], [6, 1, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 6], true),
                ([3, 2, 7, 6], [5, 2, 1, 1], [1, 1, 0, 0, 0, 0, 1, 1, 1], true),
            ] {
                for t in [false, true] {
                    let x = make(d, &xs, &vals_f32(2000, 3), t);
                    let w = make(d, &ws, &vals_f32(2000, 5), false);
                    let b = make(d, &[ws[0]], &vals_f32(20, 7), false);
                    let mut ins = vec![x, w];
                    if has_bias {
                        ins.push(b);
                    }
                    let attrs = Attrs::default().with_params(&p, &[]).unwrap();
                    let copy: Vec<Owned> =
                        ins.iter().map(|(m, s)| (m.clone(), storage(s.as_bytes()))).collect();
                    let outs = run_with(&crate::kernels::Conv2dKernel, attrs, copy, &[]).unwrap();
                    let om = &outs[0].0;
                    let mut g = conv_geom(&p, &ins[0].0, &ins[1].0, ins.get(2).map(|b| &b.0), om);
                    let (nb, c) = (xs[0], xs[1]);
                    let (o, kh, kw) = (ws[0], ws[2], ws[3]);
                    let (oh, ow) = (om.shape[2], om.shape[3]);
                    let groups = p[8] as usize;
                    let (og, kc, pos) = (o / groups, (c / groups) * kh * kw, oh * ow);
                    let col_image = c * kh * kw * pos;
                    let mut col = vec![0u8; nb * col_image * d.size()];
                    g.set(0, &[nb as i64, c as i64, oh as i64, ow as i64]);
                    g.v[COUNT] = (nb * col_image) as i64;
                    let ptr = |i: usize| unsafe { ins[i].1.as_ptr().add(ins[i].0.offset * d.size()) }
                        as *const c_void;
                    unsafe { im2col(col.as_mut_ptr().cast(), ptr(0), std::ptr::null(), g) };
                    // The products as the column-major call computes them, in f64.
                    let ld = |buf: &[u8], i: usize| -> f64 {
                        match d {
                            DType::F32 => {
                                f64::from(f32::from_ne_bytes(buf[i * 4..i * 4 + 4].try_into().unwrap()))
                            }
                            DType::F64 => f64::from_ne_bytes(buf[i * 8..i * 8 + 8].try_into().unwrap()),
                            _ => half::f16::from_ne_bytes(buf[i * 2..i * 2 + 2].try_into().unwrap()).to_f64(),
                        }
                    };
                    let wb = ins[1].1.as_bytes();
                    let mut prod = vec![0u8; nb * o * pos * ct.size()];
                    for img in 0..nb {
                        for grp in 0..groups {
                            let a0 = img * col_image + grp * kc * pos;
                            let b0 = grp * og * kc;
                            let c0 = img * o * pos + grp * og * pos;
                            for jj in 0..og {
                                for ii in 0..pos {
                                    let mut acc = 0.0f64;
                                    for q in 0..kc {
                                        acc += ld(&col, a0 + ii + q * pos) * ld(wb, b0 + q + jj * kc);
                                    }
                                    let at = c0 + ii + jj * pos;
                                    if ct == DType::F64 {
                                        prod[at * 8..at * 8 + 8].copy_from_slice(&acc.to_ne_bytes());
                                    } else {
                                        prod[at * 4..at * 4 + 4].copy_from_slice(&(acc as f32).to_ne_bytes());
                                    }
                                }
                            }
                        }
                    }
                    g.set(0, &[nb as i64, o as i64, oh as i64, ow as i64]);
                    g.v[COUNT] = (nb * o * pos) as i64;
                    let mut out = vec![0u8; om.bytes()];
                    let bp = if has_bias { ptr(2) } else { std::ptr::null() };
                    unsafe { conv_out(out.as_mut_ptr().cast(), prod.as_ptr().cast(), bp, g) };
                    let want = outs[0].1.as_bytes();
                    for i in 0..om.numel() {
                        let (a, b) = (ld(&out, i), ld(want, i));
                        let tol = 1e-5 * (1.0 + b.abs()) + if d == DType::F16 { 2e-3 * b.abs() } else { 0.0 };
                        assert!((a - b).abs() <= tol, "conv {d} {xs:?} {p:?} t {t} element {i}: {a} vs {b}");
                    }
                    n += 1;
                }
            }
        }
        println!("{n} conv calls emulated");
    }

    type NllFn = unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        *const c_void,
        *const i64,
        *const c_void,
        Layout,
        i64,
        i64,
        i64,
        i64,
        i32,
        i32,
        *const c_void,
    );
    type NllSumFn = unsafe extern "C" fn(*mut c_void, *const c_void, u64, i32);
    type SetThread = unsafe extern "C" fn(u32, u32);

    #[test]
    #[ignore = "needs g++"]
    fn emulated_nll_equals_the_cpu() {
        let mut n = 0;
        for d in [DType::F32, DType::F64, DType::F16] {
            let l = lib(d);
            let loss: libloading::Symbol<NllFn> =
                unsafe { l.get(format!("nll_loss_{d}").as_bytes()).unwrap() };
            let sum: libloading::Symbol<NllSumFn> =
                unsafe { l.get(format!("nll_sum_{d}").as_bytes()).unwrap() };
            let set: libloading::Symbol<SetThread> = unsafe { l.get(b"emu_set_thread").unwrap() };
            let ct = compute_dtype(d);
            let faults = crate::ep::fault::FaultRecord::host();
            for xs in [vec![6usize, 5], vec![3, 4, 5, 2], vec![5000, 3], vec![100, 3, 50]] {
                let classes = xs[1];
                let ts: Vec<usize> =
                    xs.iter().enumerate().filter(|&(i, _)| i != 1).map(|(_, &s)| s).collect();
                let nt: usize = ts.iter().product();
                let tv: Vec<i64> =
                    (0..nt).map(|i| if i % 5 == 3 { 1 } else { ((i * 7 + 3) % classes) as i64 }).collect();
                for reduction in 0..3i64 {
                    for (ignore, weighted) in [(-100i64, false), (1, true)] {
                        for t in [false, true] {
                            let x = make(d, &xs, &vals_f32(xs.iter().product(), 3), t);
                            let tt = (
                                TensorMeta::new(&ts, DType::I64, DeviceId::CPU),
                                storage(&tv.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<u8>>()),
                            );
                            let w = make(d, &[classes], &vals_f32(10, 5), false);
                            let mut ins = vec![x, tt];
                            if weighted {
                                ins.push(w);
                            }
                            let attrs = Attrs::default()
                                .with_params(&[reduction, ignore, i64::from(weighted)], &[])
                                .unwrap();
                            let copy: Vec<Owned> =
                                ins.iter().map(|(m, s)| (m.clone(), storage(s.as_bytes()))).collect();
                            let outs = run_with(&crate::kernels::NllLossKernel, attrs, copy, &[]).unwrap();
                            let om = &outs[0].0;
                            let none = reduction == 0;
                            let layout = nll_layout(&ins[0].0, &ins[1].0, none.then_some(om)).unwrap();
                            let mut out = vec![0u8; om.bytes()];
                            let mut parts = vec![0u8; 2 * nt * ct.size()];
                            let ptr = |i: usize| unsafe {
                                ins[i].1.as_ptr().add(ins[i].0.offset * ins[i].0.dtype.size())
                            } as *const c_void;
                            let wp = if weighted { ptr(2) } else { std::ptr::null() };
                            unsafe {
                                set(0, 1);
                                loss(
                                    out.as_mut_ptr().cast(),
                                    parts.as_mut_ptr().cast(),
                                    ptr(0),
                                    ptr(1).cast(),
                                    wp,
                                    layout,
                                    classes as i64,
                                    ins[0].0.strides[1] as i64,
                                    1,
                                    ignore,
                                    i32::from(weighted),
                                    i32::from(none),
                                    faults.device_addr() as *const c_void,
                                );
                            }
                            assert_eq!(faults.take(), None, "every target is in range");
                            if !none {
                                for th in (0..32).rev() {
                                    unsafe {
                                        set(th, 32);
                                        sum(
                                            out.as_mut_ptr().cast(),
                                            parts.as_ptr().cast(),
                                            nt as u64,
                                            i32::from(reduction == 1),
                                        );
                                    }
                                }
                                unsafe { set(0, 1) };
                            }
                            same(
                                &out,
                                outs[0].1.as_bytes(),
                                d,
                                &format!("nll {d} {xs:?} r {reduction} ig {ignore} w {weighted} t {t}"),
                            );
                            n += 1;
                        }
                    }
                }
            }
        }
        println!("{n} nll calls emulated");
    }

    /// A target out of range (not the ignored one) among good ones: reported to the fault
    /// record with its value, the number of classes and its position; its loss is NaN.
    #[test]
    #[ignore = "needs g++"]
    fn emulated_nll_reports_a_target_out_of_range() {
        let l = lib(DType::F32);
        let loss: libloading::Symbol<NllFn> = unsafe { l.get(b"nll_loss_f32").unwrap() };
        let set: libloading::Symbol<SetThread> = unsafe { l.get(b"emu_set_thread").unwrap() };
        let faults = crate::ep::fault::FaultRecord::host();
        let (rows, classes) = (6usize, 5usize);
        let x = make(DType::F32, &[rows, classes], &vals_f32(rows * classes, 3), false);
        let tv: [i64; 6] = [0, -100, 4, 7, 1, -2];
        let tm = TensorMeta::new(&[rows], DType::I64, DeviceId::CPU);
        let om = TensorMeta::new(&[rows], DType::F32, DeviceId::CPU);
        let layout = nll_layout(&x.0, &tm, Some(&om)).unwrap();
        let mut out = vec![0f32; rows];
        unsafe {
            set(0, 1);
            loss(
                out.as_mut_ptr().cast(),
                std::ptr::null_mut(),
                x.1.as_ptr().cast(),
                tv.as_ptr(),
                std::ptr::null(),
                layout,
                classes as i64,
                1,
                1,
                -100,
                0,
                1,
                faults.device_addr() as *const c_void,
            );
        }
        // One thread runs every element in order: the first bad target wins.
        let f = faults.take().expect("a fault");
        assert_eq!((f.value, f.bound, f.position, f.dim), (7, 5, 3, 1));
        assert_eq!(f.message("nll_loss"), "target 7 is out of bounds: the classes are 0 to 4");
        assert!(out[3].is_nan() && out[5].is_nan() && out[1] == 0.0 && !out[0].is_nan(), "{out:?}");
        assert_eq!(faults.take(), None, "taken once");
    }

    type BmmFn = unsafe extern "C" fn(*mut c_void, *const c_void, *const c_void, Layout, u64, i64, i64);

    #[test]
    #[ignore = "needs g++"]
    fn emulated_int_bmm_equals_the_cpu() {
        let l = lib(DType::I32);
        let f: libloading::Symbol<BmmFn> = unsafe { l.get(b"bmm_i32").unwrap() };
        let mut n = 0;
        for (sa, sb) in [
            (vec![3usize, 13, 21], vec![3usize, 21, 9]),
            (vec![2, 1, 5, 7], vec![3, 7, 4]),
            (vec![4, 6], vec![2, 6, 5]),
        ] {
            for (ta, tb) in [(false, false), (true, false), (false, true)] {
                let a = make(DType::I32, &sa, &vals_f32(2000, 3), ta);
                let b = make(DType::I32, &sb, &vals_f32(2000, 5), tb);
                let ins = [a, b];
                let copy: Vec<Owned> = ins.iter().map(|(m, s)| (m.clone(), storage(s.as_bytes()))).collect();
                let outs = run_with(&crate::kernels::BmmKernel, Attrs::default(), copy, &[]).unwrap();
                let om = &outs[0].0;
                let [so, xa, xb] = int_layout(om, &ins[0].0, &ins[1].0);
                let layout = Layout::plan(&om.shape, &[&so, &xa, &xb]).unwrap();
                let (ra, rb) = (sa.len(), sb.len());
                let k = sa[ra - 1] as u64;
                let (ak, bk) = (ins[0].0.strides[ra - 1] as i64, ins[1].0.strides[rb - 2] as i64);
                let mut out = vec![0u8; om.bytes()];
                let ptr = |i: usize| unsafe { ins[i].1.as_ptr().add(ins[i].0.offset * 4) } as *const c_void;
                unsafe { f(out.as_mut_ptr().cast(), ptr(0), ptr(1), layout, k, ak, bk) };
                same(&out, outs[0].1.as_bytes(), DType::I32, &format!("bmm {sa:?} {sb:?} {ta} {tb}"));
                n += 1;
            }
        }
        println!("{n} bmm calls emulated");
    }
}
