//! The compute of every matrix product of the CPU and mock kernels (`matmul`, `matmul_tn`,
//! `matmul_nt`): one function, [`product`], that the kernels call with each operand as an
//! address and a row and a column stride ([`Mat`]: a transposed or sliced view needs no
//! copy), and the process-wide number of threads a product may use ([`set_kernel_threads`]).
//! `conv2d`'s taps call [`crate_product`], the `gemm` crate's product at every size, which may
//! add to its output.
//!
//! **Which code runs.** An `f32` or `f64` product of more than [`SEQUENTIAL_MAX_MACS`]
//! multiply-adds goes to the `gemm` crate (sarah-ek/gemm: packed, cache-blocked, with SIMD
//! micro-kernels picked at run time: AVX-512 where the CPU has it, else AVX2/FMA, SSE or
//! NEON), which takes every operand's strides as they are, chosen over `matrixmultiply` by
//! measurement (`docs/performance.md`, "CPU kernels", has both against PyTorch). An `f16` or
//! `bf16` product that large is computed the same way in `f32` (the operands converted,
//! exactly, and each result rounded once). Smaller products, and every integer product (no
//! GEMM crate multiplies integers; they wrap), run the plain loops below, in the compute
//! type (`f32` for `f16` and `bf16`, rounded once on store).
//!
//! **Summation order.** The plain loops add each output element's products one at a time in
//! increasing `p`, starting from zero, with a rounding after each multiply and each add: the
//! same bits on every machine, which the shipped traces' checksums rely on. `gemm` splits
//! `p` into blocks whose size follows the CPU's caches, accumulates each block with fused
//! multiply-adds in SIMD registers, and adds the blocks in increasing `p`; where one operand
//! is a vector it uses several partial sums. Its results are the same for any number of
//! threads (threads split the rows and columns of the output, never `p`) and from run to run
//! on one machine, but may differ in the last bits between machines whose SIMD width or
//! caches differ, as any BLAS's do: about `1e-7 · Σ_p |a_ip b_pj|`.
//!
//! **Threads.** A product runs on the calling thread (the stream's worker) unless
//! [`kernel_threads`] is above 1 and the product has at least [`PARALLEL_MIN_MACS`]
//! multiply-adds; it then runs on a rayon pool of the machine's CPU count, started at the
//! first such product, while the worker waits on it (asleep, not spinning).
//! `docs/tuning.md` ("Kernel threads") has the measurements behind the default, 1.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

use std::slice;

use super::dtype::{float_of, Elem, Ring, Wide};
use crate::vm::DType;

/// The largest product (in multiply-adds, `m·k·n`) that runs the plain loops rather than
/// the `gemm` crate: 64·64·64. Up to it the results stay those of the plain loops, the same
/// bits on every machine (`docs/performance.md`, "CPU kernels", measures what it costs).
pub const SEQUENTIAL_MAX_MACS: usize = 64 * 64 * 64;

/// The smallest product (in multiply-adds) that may use more than one thread: 128·128·128,
/// tens of microseconds on one AVX-512 core. Below it, waking a pool thread (a futex round trip, and on a
/// busy machine a wait for a core) is a large share of the product (`docs/tuning.md`).
pub const PARALLEL_MIN_MACS: usize = 128 * 128 * 128;

/// The environment variable that sets [`kernel_threads`] when [`set_kernel_threads`] has
/// not been called: a positive integer.
pub const KERNEL_THREADS_ENV: &str = "EAGERVM_KERNEL_THREADS";

/// The process's kernel thread count; 0 until first read.
static THREADS: AtomicUsize = AtomicUsize::new(0);

/// How many threads one CPU kernel may use: [`set_kernel_threads`]'s value, else
/// `EAGERVM_KERNEL_THREADS`, else 1. Process-wide, like `torch.set_num_threads`: every VM
/// in the process and every stream share it.
pub fn kernel_threads() -> usize {
    match THREADS.load(Ordering::Relaxed) {
        0 => {
            let n = std::env::var(KERNEL_THREADS_ENV)
                .ok()
                .and_then(|v| v.trim().parse::<usize>().ok())
                .filter(|&n| n > 0)
                .unwrap_or(1);
            // A concurrent `set_kernel_threads` wins over the environment.
            match THREADS.compare_exchange(0, n, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => n,
                Err(set) => set,
            }
        }
        n => n,
    }
}

/// Let each CPU kernel use up to `n` threads (0 counts as 1), for every VM in the process
/// from the next kernel on. Only the matrix products of at least [`PARALLEL_MIN_MACS`]
/// multiply-adds use more than one; the elementwise kernels and reductions are bound by
/// memory bandwidth, which one core of the machines measured nearly fills.
pub fn set_kernel_threads(n: usize) {
    THREADS.store(n.max(1), Ordering::Relaxed);
}

/// The pool multi-threaded products run on: one thread per CPU, started at the first
/// product that uses it. Its idle threads sleep (rayon's sleep protocol: a few yields, then a
/// condition variable), so between products it costs nothing.
fn pool() -> Result<&'static rayon::ThreadPool, String> {
    static POOL: OnceLock<Result<rayon::ThreadPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        rayon::ThreadPoolBuilder::new()
            .num_threads(cpus)
            .thread_name(|i| format!("eagervm-kernel-{i}"))
            .build()
            .map_err(|e| format!("cannot start the kernel thread pool: {e}"))
    })
    .as_ref()
    .map_err(Clone::clone)
}

/// The pool a product of `macs` multiply-adds runs on with `threads` kernel threads, or
/// `None` for the calling thread. A pool the system refused to start (no threads left) is
/// logged once and the product runs on the calling thread: the same result, later.
fn pool_for(threads: usize, macs: usize) -> Option<&'static rayon::ThreadPool> {
    if threads <= 1 || macs < PARALLEL_MIN_MACS {
        return None;
    }
    match pool() {
        Ok(p) => Some(p),
        Err(e) => {
            static LOGGED: std::sync::Once = std::sync::Once::new();
            LOGGED.call_once(|| tracing::warn!("{e}; matrix products run on one thread"));
            None
        }
    }
}

/// A matrix operand: element `(i, j)` at `ptr + i·rs + j·cs` (in elements).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Mat<T> {
    /// Element `(0, 0)`.
    pub ptr: *mut T,
    /// Elements between rows.
    pub rs: isize,
    /// Elements between columns.
    pub cs: isize,
}

impl<T> Mat<T> {
    /// The address of element `(i, j)`.
    ///
    /// # Safety
    /// `(i, j)` is within the matrix's dimensions, whose elements lie in one allocation.
    #[inline(always)]
    unsafe fn at(self, i: usize, j: usize) -> *mut T {
        // SAFETY: the caller's contract.
        unsafe { self.ptr.offset(i as isize * self.rs + j as isize * self.cs) }
    }
}

/// Whether an `[m, n]` layout names each element once (so that a product may write it in
/// any order from any thread): two dimensions, the outer stepping over the inner whole.
fn one_to_one<T>(out: Mat<T>, m: usize, n: usize) -> bool {
    let (rows, cols) = ((m, out.rs.unsigned_abs()), (n, out.cs.unsigned_abs()));
    match (m > 1, n > 1) {
        (false, false) => true,
        (true, false) => rows.1 != 0,
        (false, true) => cols.1 != 0,
        (true, true) => {
            let (inner, outer) = if rows.1 <= cols.1 { (rows, cols) } else { (cols, rows) };
            inner.1 != 0 && outer.1 >= inner.1.saturating_mul(inner.0)
        }
    }
}

/// `out = a · b`, `a` being `[m, k]`, `b` `[k, n]` and `out` `[m, n]`; `out`'s earlier
/// contents are ignored. The summation order is in the module docs. With an empty
/// dimension it writes zeros (or nothing) and costs nothing however large the others are.
///
/// # Safety
/// Every element of each matrix (indices within its dimensions) lies in a layout checked
/// against its storage; `out` shares no element with `a` or `b`; the instruction holds the
/// write access to `out`'s storage.
pub(crate) unsafe fn product<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
) -> Result<(), String>
where
    T::C: Ring,
{
    // With no product to add, zeros are the result; and the loops below would run `m` or
    // `m * k` times over nothing, unbounded by the tensors' sizes (`[2^40, 0]` holds no
    // element).
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        let zero = T::store(<T::C as Ring>::ZERO);
        for i in 0..m {
            for j in 0..n {
                // SAFETY: an element of `out` (the contract).
                unsafe { out.at(i, j).write(zero) };
            }
        }
        return Ok(());
    }
    // `m·k·n` fits: each of the three pairs does, and one of the tensors holds two of them.
    let macs = m.saturating_mul(k).saturating_mul(n);
    if macs > SEQUENTIAL_MAX_MACS {
        match T::DTYPE {
            // SAFETY: the contract, passed on.
            DType::F32 | DType::F64 => return unsafe { gemm_float((m, k, n), a, b, out, kernel_threads()) },
            // SAFETY: as above.
            DType::F16 | DType::BF16 => return unsafe { through_f32((m, k, n), a, b, out) },
            _ => {}
        }
    }
    // SAFETY: as above.
    unsafe { sequential((m, k, n), a, b, out) }
}

/// The `gemm` crate's product (`T` is `f32` or `f64`), on the calling thread or, with
/// `threads > 1` and a product large enough, the kernel pool. An output that names some
/// element twice is computed into a contiguous buffer and copied out.
///
/// # Safety
/// As [`product`], with no dimension empty.
unsafe fn gemm_float<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
    threads: usize,
) -> Result<(), String> {
    // SAFETY: the contract, passed on.
    unsafe { gemm_float_into((m, k, n), a, b, out, threads, false) }
}

/// [`gemm_float`], adding the product to `out`'s contents where `accumulate`
/// (`out = out + a·b`, `out` then naming each of its elements once).
///
/// # Safety
/// As [`gemm_float`]; with `accumulate`, `out` is initialised.
unsafe fn gemm_float_into<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
    threads: usize,
    accumulate: bool,
) -> Result<(), String> {
    if !one_to_one(out, m, n) {
        if accumulate {
            return Err("an accumulating product needs an output that names each element once".into());
        }
        let mut tmp = buffer::<T>(m * n)?;
        let t = Mat { ptr: tmp.as_mut_ptr(), rs: n as isize, cs: 1 };
        // SAFETY: `tmp` holds `m·n` elements, row-major, and is this function's alone.
        unsafe { gemm_float((m, k, n), a, b, t, threads)? };
        for i in 0..m {
            for j in 0..n {
                // SAFETY: elements of `tmp` and of `out` (the contract).
                unsafe { out.at(i, j).write(t.at(i, j).read()) };
            }
        }
        return Ok(());
    }
    let (zero, one) = (T::narrow(Wide::Int(0)), T::narrow(Wide::Int(1)));
    // Addresses as integers, so that the closure may run on the pool's threads.
    let (po, pa, pb) = (out.ptr as usize, a.ptr as usize, b.ptr as usize);
    let run = |parallelism: gemm::Parallelism| {
        // SAFETY: every element the dimensions and strides address lies in a checked
        // layout (the contract); `out` names each of its elements once and overlaps neither
        // input. `read_dst = accumulate`: without it the output's earlier contents are not
        // read, and `out = 1 · a·b` (beta = 1); with it `out = 1 · out + 1 · a·b` (alpha =
        // 1). `T` is
        // `f32` or `f64` (the caller), which the crate multiplies.
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                po as *mut T,
                out.cs,
                out.rs,
                accumulate,
                pa as *const T,
                a.cs,
                a.rs,
                pb as *const T,
                b.cs,
                b.rs,
                if accumulate { one } else { zero },
                one,
                false,
                false,
                false,
                parallelism,
            )
        }
    };
    let macs = m.saturating_mul(k).saturating_mul(n);
    match pool_for(threads, macs) {
        Some(pool) => pool.install(|| run(gemm::Parallelism::Rayon(threads))),
        None => run(gemm::Parallelism::None),
    }
    Ok(())
}

/// `out = a·b`, or with `add` `out = out + a·b`, by the `gemm` crate whatever the size, for
/// `f32` and `f64` (the compute types of the floating dtypes): for a product computed in
/// parts (`conv2d`'s taps) that keeps one summation scheme for every part, however small.
/// Each output element adds the crate's sum of its `k` products (module docs) to its earlier
/// value. Other dtypes are refused.
///
/// # Safety
/// As [`product`]; with `add`, `out` is initialised and names each of its elements once.
pub(crate) unsafe fn crate_product<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
    add: bool,
) -> Result<(), String> {
    if !matches!(T::DTYPE, DType::F32 | DType::F64) {
        return Err(format!("the gemm crate's product of {:?} (f32 and f64 only)", T::DTYPE));
    }
    if m == 0 || n == 0 || (k == 0 && add) {
        return Ok(());
    }
    // SAFETY: the contract, passed on; `T` is `f32` or `f64`. The crate writes zeros for
    // `k = 0` without `add`.
    unsafe { gemm_float_into((m, k, n), a, b, out, kernel_threads(), add) }
}

/// `len` elements of `T`, or the error of a refused allocation.
fn buffer<T: Elem>(len: usize) -> Result<Vec<T>, String> {
    let mut v = Vec::new();
    v.try_reserve_exact(len).map_err(|e| format!("no memory for a {len}-element product buffer: {e}"))?;
    v.resize(len, T::narrow(Wide::Int(0)));
    Ok(v)
}

/// An `f16` or `bf16` product through `f32`: the operands converted (exactly) to contiguous
/// `f32` buffers, multiplied by [`gemm_float`], each result rounded once on store.
///
/// # Safety
/// As [`product`], with no dimension empty.
unsafe fn through_f32<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
) -> Result<(), String> {
    let widen = |x: Mat<T>, rows: usize, cols: usize| -> Result<Vec<f32>, String> {
        let mut v = buffer::<f32>(rows * cols)?;
        for i in 0..rows {
            for j in 0..cols {
                // SAFETY: an element of `x` (the contract).
                v[i * cols + j] = float_of(unsafe { x.at(i, j).read() }) as f32;
            }
        }
        Ok(v)
    };
    let (mut wa, mut wb, mut wo) = (widen(a, m, k)?, widen(b, k, n)?, buffer::<f32>(m * n)?);
    let mat = |v: &mut Vec<f32>, cols: usize| Mat { ptr: v.as_mut_ptr(), rs: cols as isize, cs: 1 };
    let (fa, fb, fo) = (mat(&mut wa, k), mat(&mut wb, n), mat(&mut wo, n));
    // SAFETY: three row-major buffers of this function's, of the dimensions' sizes.
    unsafe { gemm_float((m, k, n), fa, fb, fo, kernel_threads())? };
    for i in 0..m {
        for j in 0..n {
            // SAFETY: an element of `out` (the contract).
            unsafe { out.at(i, j).write(T::narrow(Wide::Float(f64::from(wo[i * n + j])))) };
        }
    }
    Ok(())
}

/// The plain loops: each output element adds its products one at a time in increasing `p`
/// from zero, in the compute type, and is stored once. Row `i` accumulates in the output
/// where its row is contiguous and of the compute type, else in a buffer (so that `f16` and
/// `bf16` accumulate in `f32`), walking row `p` of `b` for each `p` (contiguous where `b`'s
/// rows are).
///
/// # Safety
/// As [`product`], with no dimension empty.
unsafe fn sequential<T: Elem>(
    (m, k, n): (usize, usize, usize),
    a: Mat<T>,
    b: Mat<T>,
    out: Mat<T>,
) -> Result<(), String>
where
    T::C: Ring,
{
    let mut buf: Vec<T::C> = Vec::new();
    for i in 0..m {
        // A contiguous output row of the compute type accumulates in place; any other in
        // a buffer, stored once at the end.
        let direct = if out.cs == 1 {
            // SAFETY: row `i` of `out`: `n` contiguous elements, which overlap neither input;
            // no other reference to them is alive while this one is.
            T::as_compute_mut(unsafe { slice::from_raw_parts_mut(out.at(i, 0), n) })
        } else {
            None
        };
        let buffered = direct.is_none();
        let row: &mut [T::C] = match direct {
            Some(r) => r,
            None => {
                if buf.is_empty() {
                    buf.try_reserve_exact(n).map_err(|e| format!("no memory for a {n}-element row: {e}"))?;
                    buf.resize(n, <T::C as Ring>::ZERO);
                }
                &mut buf
            }
        };
        row.fill(<T::C as Ring>::ZERO);
        for p in 0..k {
            // SAFETY: elements of `a` and `b` (the contract).
            let x = unsafe { a.at(i, p).read() }.load();
            let brow = unsafe { b.at(p, 0) };
            if b.cs == 1 {
                // SAFETY: row `p` of `b`: `n` contiguous elements.
                let ys = unsafe { slice::from_raw_parts(brow.cast_const(), n) };
                for (r, &y) in row.iter_mut().zip(ys) {
                    *r = r.add(x.mul(y.load()));
                }
            } else {
                for (j, r) in row.iter_mut().enumerate() {
                    // SAFETY: element `(p, j)` of `b`.
                    let y = unsafe { brow.offset(j as isize * b.cs).read() }.load();
                    *r = r.add(x.mul(y));
                }
            }
        }
        if buffered {
            for (j, &r) in buf.iter().enumerate() {
                // SAFETY: element `(i, j)` of `out`, which overlaps neither input.
                unsafe { out.at(i, j).write(T::store(r)) };
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
