//! The compute of every matrix product of the CPU and mock kernels (`matmul`, `matmul_tn`,
//! `matmul_nt`): one function, [`product`], that the kernels call with the operands' layout,
//! and the process-wide number of threads a product may use ([`set_kernel_threads`]).
//!
//! **Which code runs.** An `f32` product of more than [`SEQUENTIAL_MAX_MACS`] multiply-adds
//! goes to the `gemm` crate (sarah-ek/gemm: packed, cache-blocked, with SIMD micro-kernels
//! picked at run time: AVX-512 where the CPU has it, else AVX2/FMA, SSE or NEON), chosen over
//! `matrixmultiply` by measurement (`docs/performance.md`, "CPU kernels", has both against
//! PyTorch). Smaller `f32` products, and every `i64` product (no GEMM crate multiplies
//! integers), run the plain loops below.
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

use super::Num;

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

/// How a product's operands lie in memory (row-major).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Layout {
    /// `a` is stored `[k, m]` and used transposed; else `[m, k]`.
    pub a_trans: bool,
    /// `b` is stored `[n, k]` and used transposed; else `[k, n]`.
    pub b_trans: bool,
}

/// `out = op(a) · op(b)`, `out` being `[m, n]` row-major, `op` transposing where `layout`
/// says; `out`'s earlier contents are ignored. The summation order is in the module docs.
///
/// Refuses operands shorter than their dimensions say (what `compute` would otherwise index
/// out of bounds); with an empty dimension, writes zeros (or nothing) and costs nothing
/// however large the others are.
pub(crate) fn product<T: Num>(
    (m, k, n): (usize, usize, usize),
    a: &[T],
    b: &[T],
    layout: Layout,
    out: &mut [T],
) -> Result<(), String> {
    let need = |x: usize, y: usize| x.checked_mul(y).ok_or("the product's dimensions overflow");
    let (na, nb, nout) = (need(m, k)?, need(k, n)?, need(m, n)?);
    if a.len() < na || b.len() < nb || out.len() < nout {
        return Err(format!(
            "a [{m}, {k}] product with [{k}, {n}] into [{m}, {n}] got {}, {} and {} elements",
            a.len(),
            b.len(),
            out.len()
        ));
    }
    let (a, b, out) = (&a[..na], &b[..nb], &mut out[..nout]);
    out.fill(T::ZERO);
    // With no product to add, the zeros are the result; and the loops below would run `m`
    // or `m * k` times over nothing, unbounded by the tensors' sizes (`[2^40, 0]` holds no
    // element).
    if m == 0 || n == 0 || k == 0 {
        return Ok(());
    }
    // `m·k·n` fits: each of the three pairs does, and one of the tensors holds two of them.
    let macs = m.saturating_mul(k).saturating_mul(n);
    if let Some(f) = T::as_f32_operands(a, b, out) {
        if macs > SEQUENTIAL_MAX_MACS {
            return gemm_f32((m, k, n), f, layout, kernel_threads());
        }
    }
    sequential((m, k, n), a, b, layout, out);
    Ok(())
}

/// An `f32` product's operands, `(a, b, out)`.
pub(crate) type F32Operands<'x> = (&'x [f32], &'x [f32], &'x mut [f32]);

/// The `gemm` crate's product, on the calling thread or, with `threads > 1` and a product
/// large enough, the kernel pool.
fn gemm_f32(
    (m, k, n): (usize, usize, usize),
    (a, b, out): F32Operands<'_>,
    layout: Layout,
    threads: usize,
) -> Result<(), String> {
    // Strides in elements, row then column, of each operand as `product` documents them.
    // Every dimension is at most a slice's length here (none is empty), so below isize::MAX.
    let (m_, k_, n_) = (m as isize, k as isize, n as isize);
    let (a_rs, a_cs) = if layout.a_trans { (1, m_) } else { (k_, 1) };
    let (b_rs, b_cs) = if layout.b_trans { (1, k_) } else { (n_, 1) };
    let mut run = |parallelism: gemm::Parallelism| {
        // SAFETY: `product` checked that `a` holds `m·k`, `b` `k·n` and `out` `m·n`
        // elements, and the strides above address exactly those (row-major `[m, k]` or
        // `[k, m]`, `[k, n]` or `[n, k]`, `[m, n]`), so every read and write is in bounds;
        // `out` is borrowed mutably, so it aliases neither input. `read_dst = false`: the
        // output's earlier contents are not read, and `out = 1 · a·b` (beta = 1).
        unsafe {
            gemm::gemm(
                m,
                n,
                k,
                out.as_mut_ptr(),
                1,
                n_,
                false,
                a.as_ptr(),
                a_cs,
                a_rs,
                b.as_ptr(),
                b_cs,
                b_rs,
                0.0f32,
                1.0f32,
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

/// The plain loops: each output element adds its products one at a time in increasing `p`.
/// `out` is zeroed and every slice has exactly its dimensions' elements.
fn sequential<T: Num>((m, k, n): (usize, usize, usize), a: &[T], b: &[T], layout: Layout, out: &mut [T]) {
    match (layout.a_trans, layout.b_trans) {
        // i-p-j: the inner loop walks rows of `b` and `out` contiguously.
        (false, false) => {
            for (i, row) in out.chunks_exact_mut(n).enumerate() {
                for p in 0..k {
                    let x = a[i * k + p];
                    for (o, &y) in row.iter_mut().zip(&b[p * n..(p + 1) * n]) {
                        *o = o.plus(x.times(y));
                    }
                }
            }
        }
        // p outermost: row p of `a` and of `b` are contiguous, and every output element
        // still accumulates in increasing p.
        (true, false) => {
            for p in 0..k {
                let brow = &b[p * n..(p + 1) * n];
                for (i, row) in out.chunks_exact_mut(n).enumerate() {
                    let x = a[p * m + i];
                    for (o, &y) in row.iter_mut().zip(brow) {
                        *o = o.plus(x.times(y));
                    }
                }
            }
        }
        // A dot product of row i of `a` with row j of `b`, both contiguous.
        (false, true) => {
            for (i, row) in out.chunks_exact_mut(n).enumerate() {
                let arow = &a[i * k..(i + 1) * k];
                for (j, o) in row.iter_mut().enumerate() {
                    let brow = &b[j * k..(j + 1) * k];
                    *o = arow.iter().zip(brow).fold(T::ZERO, |acc, (&x, &y)| acc.plus(x.times(y)));
                }
            }
        }
        // Both transposed: no kernel asks for it today; element by element.
        (true, true) => {
            for (i, row) in out.chunks_exact_mut(n).enumerate() {
                for (j, o) in row.iter_mut().enumerate() {
                    *o = (0..k).fold(T::ZERO, |acc, p| acc.plus(a[p * m + i].times(b[j * k + p])));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Deterministic values in [-1, 1) with a full mantissa, so that any change of order
    /// or rounding shows in the bits.
    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        (0..len)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                (s >> 40) as f32 / (1u64 << 23) as f32 - 1.0
            })
            .collect()
    }

    /// The product computed in f64, element `(i, j)`, and `Σ_p |a_ip b_pj|`.
    fn reference(
        (m, k, n): (usize, usize, usize),
        a: &[f32],
        b: &[f32],
        l: Layout,
        i: usize,
        j: usize,
    ) -> (f64, f64) {
        (0..k).fold((0.0, 0.0), |(s, abs), p| {
            let x = if l.a_trans { a[p * m + i] } else { a[i * k + p] } as f64;
            let y = if l.b_trans { b[j * k + p] } else { b[p * n + j] } as f64;
            (s + x * y, abs + (x * y).abs())
        })
    }

    const LAYOUTS: [Layout; 4] = [
        Layout { a_trans: false, b_trans: false },
        Layout { a_trans: true, b_trans: false },
        Layout { a_trans: false, b_trans: true },
        Layout { a_trans: true, b_trans: true },
    ];

    /// Every layout, on both sides of the threshold, on shapes that are not multiples of any
    /// SIMD width or block, with vectors among them: within `1e-6 · Σ|terms|` of f64.
    #[test]
    #[cfg_attr(miri, ignore = "millions of multiply-adds through SIMD code: hours under miri")]
    fn every_layout_matches_f64_on_odd_shapes() {
        for dims in
            [(3, 5, 7), (1, 300, 1), (1, 129, 77), (77, 129, 1), (65, 64, 64), (67, 301, 45), (200, 3, 150)]
        {
            let (m, k, n) = dims;
            for l in LAYOUTS {
                let a = values(m * k, 1);
                let b = values(k * n, 2);
                let mut out = vec![f32::NAN; m * n];
                product(dims, &a, &b, l, &mut out).unwrap();
                for i in 0..m {
                    for j in 0..n {
                        let (want, abs) = reference(dims, &a, &b, l, i, j);
                        let got = out[i * n + j] as f64;
                        // The bound of any order of f32 additions, with or without fused
                        // multiply-adds: k units of roundoff (2^-24) of Σ|terms|. A wrong
                        // index or a lost term is off by about a term, far beyond it.
                        let bound = k as f64 * 2f64.powi(-24) * 1.01 * abs;
                        assert!(
                            (got - want).abs() <= bound,
                            "{dims:?} {l:?} ({i}, {j}): {got} against {want} (Σ|terms| {abs})"
                        );
                    }
                }
            }
        }
    }

    /// Up to the threshold, the plain loops: each element is `((0 + a0 b0) + a1 b1) + ...`
    /// in f32, bit for bit, in every layout.
    #[test]
    fn small_products_add_in_increasing_p() {
        let dims @ (m, k, n) = (64, 64, 64);
        assert!(m * k * n <= SEQUENTIAL_MAX_MACS);
        let (a, b) = (values(m * k, 3), values(k * n, 4));
        for l in LAYOUTS {
            let mut out = vec![0.0; m * n];
            product(dims, &a, &b, l, &mut out).unwrap();
            for (i, j) in [(0, 0), (5, 63), (63, 17)] {
                let want = (0..k).fold(0.0f32, |s, p| {
                    let x = if l.a_trans { a[p * m + i] } else { a[i * k + p] };
                    let y = if l.b_trans { b[j * k + p] } else { b[p * n + j] };
                    s + x * y
                });
                assert_eq!(out[i * n + j].to_bits(), want.to_bits(), "{l:?} ({i}, {j})");
            }
        }
    }

    /// Threads split the output, never `p`: one thread and two give the same bits, and so
    /// do repeated runs.
    #[test]
    #[cfg_attr(miri, ignore = "millions of multiply-adds through SIMD code: hours under miri")]
    fn threads_do_not_change_the_bits() {
        let dims @ (m, k, n) = (192, 300, 170);
        assert!(m * k * n >= PARALLEL_MIN_MACS);
        let (a, b) = (values(m * k, 5), values(k * n, 6));
        for l in LAYOUTS {
            let one = {
                let mut out = vec![0.0; m * n];
                gemm_with_threads(1, dims, &a, &b, l, &mut out);
                out
            };
            for threads in [2, 3, 1] {
                let mut out = vec![0.0; m * n];
                gemm_with_threads(threads, dims, &a, &b, l, &mut out);
                assert!(one.iter().zip(&out).all(|(x, y)| x.to_bits() == y.to_bits()), "{l:?} {threads}");
            }
        }
    }

    /// The crate's product with `threads` threads, without touching the process-wide
    /// setting (other tests run in parallel).
    fn gemm_with_threads(
        threads: usize,
        dims: (usize, usize, usize),
        a: &[f32],
        b: &[f32],
        l: Layout,
        out: &mut [f32],
    ) {
        gemm_f32(dims, (a, b, out), l, threads).unwrap();
    }

    /// The kernel's path through the pool gives what the calling thread gives.
    #[test]
    #[cfg_attr(miri, ignore = "millions of multiply-adds through SIMD code: hours under miri")]
    fn gemm_f32_through_the_pool_matches_one_thread() {
        let dims @ (m, k, n) = (130, 140, 150);
        let (a, b) = (values(m * k, 7), values(k * n, 8));
        let l = LAYOUTS[0];
        let mut direct = vec![0.0; m * n];
        gemm_with_threads(1, dims, &a, &b, l, &mut direct);
        let mut via = vec![0.0; m * n];
        product(dims, &a, &b, l, &mut via).unwrap();
        assert!(direct.iter().zip(&via).all(|(x, y)| x.to_bits() == y.to_bits()));
    }

    #[test]
    fn short_operands_are_refused() {
        let mut out = vec![0.0f32; 4];
        let err = product((2, 2, 2), &[1.0; 3], &[1.0; 4], LAYOUTS[0], &mut out).unwrap_err();
        assert!(err.contains("got 3, 4 and 4 elements"), "{err}");
        let err = product((2, 2, 2), &[1.0; 4], &[1.0; 4], LAYOUTS[0], &mut out[..3]).unwrap_err();
        assert!(err.contains("[2, 2]"), "{err}");
    }

    #[test]
    fn i64_products_wrap_in_every_layout() {
        for l in LAYOUTS {
            let mut out = [0i64; 1];
            product((1, 2, 1), &[i64::MAX, 1], &[2, 3], l, &mut out).unwrap();
            assert_eq!(out[0], i64::MAX.wrapping_mul(2).wrapping_add(3), "{l:?}");
        }
    }

    #[test]
    fn kernel_threads_are_at_least_one() {
        assert!(kernel_threads() >= 1);
    }
}
