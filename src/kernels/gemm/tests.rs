use super::*;

/// How a test product's operands lie in memory, row-major.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    /// `a` is stored `[k, m]` and used transposed; else `[m, k]`.
    a_trans: bool,
    /// `b` is stored `[n, k]` and used transposed; else `[k, n]`.
    b_trans: bool,
}

const LAYOUTS: [Layout; 4] = [
    Layout { a_trans: false, b_trans: false },
    Layout { a_trans: true, b_trans: false },
    Layout { a_trans: false, b_trans: true },
    Layout { a_trans: true, b_trans: true },
];

/// The operands as matrices: `a` (`[m, k]` or `[k, m]`), `b` (`[k, n]` or `[n, k]`), `out`
/// (`[m, n]`), all row-major slices.
fn mats<T>(
    (m, k, n): (usize, usize, usize),
    a: &[T],
    b: &[T],
    l: Layout,
    out: &mut [T],
) -> (Mat<T>, Mat<T>, Mat<T>) {
    assert!(a.len() >= m * k && b.len() >= k * n && out.len() >= m * n);
    let (m_, k_, n_) = (m as isize, k as isize, n as isize);
    let (a_rs, a_cs) = if l.a_trans { (1, m_) } else { (k_, 1) };
    let (b_rs, b_cs) = if l.b_trans { (1, k_) } else { (n_, 1) };
    (
        Mat { ptr: a.as_ptr().cast_mut(), rs: a_rs, cs: a_cs },
        Mat { ptr: b.as_ptr().cast_mut(), rs: b_rs, cs: b_cs },
        Mat { ptr: out.as_mut_ptr(), rs: n_, cs: 1 },
    )
}

/// [`product`] over slices.
fn prod<T: Elem>(dims: (usize, usize, usize), a: &[T], b: &[T], l: Layout, out: &mut [T])
where
    T::C: Ring,
{
    let (ma, mb, mo) = mats(dims, a, b, l, out);
    // SAFETY: `mats` checked the slices' lengths; `out` is borrowed mutably, apart from both.
    unsafe { product(dims, ma, mb, mo) }.unwrap();
}

/// The crate's product with `threads` threads, without touching the process-wide setting
/// (other tests run in parallel).
fn gemm_with_threads(
    threads: usize,
    dims: (usize, usize, usize),
    a: &[f32],
    b: &[f32],
    l: Layout,
    out: &mut [f32],
) {
    let (ma, mb, mo) = mats(dims, a, b, l, out);
    // SAFETY: as in `prod`.
    unsafe { gemm_float(dims, ma, mb, mo, threads) }.unwrap();
}

/// Deterministic values in [-1, 1) with a full mantissa, so that any change of order or
/// rounding shows in the bits.
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
            prod(dims, &a, &b, l, &mut out);
            for i in 0..m {
                for j in 0..n {
                    let (want, abs) = reference(dims, &a, &b, l, i, j);
                    let got = out[i * n + j] as f64;
                    // The bound of any order of f32 additions, with or without fused
                    // multiply-adds: k units of roundoff (2^-24) of Σ|terms|. A wrong index
                    // or a lost term is off by about a term, far beyond it.
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

/// Up to the threshold, the plain loops: each element is `((0 + a0 b0) + a1 b1) + ...` in
/// f32, bit for bit, in every layout.
#[test]
fn small_products_add_in_increasing_p() {
    let dims @ (m, k, n) = (64, 64, 64);
    assert!(m * k * n <= SEQUENTIAL_MAX_MACS);
    let (a, b) = (values(m * k, 3), values(k * n, 4));
    for l in LAYOUTS {
        let mut out = vec![0.0; m * n];
        prod(dims, &a, &b, l, &mut out);
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

/// Threads split the output, never `p`: one thread and two give the same bits, and so do
/// repeated runs.
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
    prod(dims, &a, &b, l, &mut via);
    assert!(direct.iter().zip(&via).all(|(x, y)| x.to_bits() == y.to_bits()));
}

/// An output that names an element twice goes through a buffer: the product is still
/// computed, whatever element wins.
#[test]
fn an_output_with_repeated_elements_is_written_through_a_buffer() {
    assert!(one_to_one(Mat::<f32> { ptr: std::ptr::null_mut(), rs: 4, cs: 1 }, 3, 4));
    assert!(one_to_one(Mat::<f32> { ptr: std::ptr::null_mut(), rs: 1, cs: 3 }, 3, 4));
    assert!(!one_to_one(Mat::<f32> { ptr: std::ptr::null_mut(), rs: 0, cs: 1 }, 3, 4));
    assert!(!one_to_one(Mat::<f32> { ptr: std::ptr::null_mut(), rs: 2, cs: 1 }, 3, 4));
    assert!(one_to_one(Mat::<f32> { ptr: std::ptr::null_mut(), rs: 0, cs: 0 }, 1, 1));
    let dims @ (m, k, n) = (80, 80, 80);
    let (a, b) = (values(m * k, 9), values(k * n, 10));
    let mut out = vec![0.0f32; n];
    let (ma, mb, _) = mats(dims, &a, &b, LAYOUTS[0], &mut vec![0.0; m * n]);
    // Every row of the output is the one row `out`.
    let mo = Mat { ptr: out.as_mut_ptr(), rs: 0, cs: 1 };
    // SAFETY: every element `mo` names is one of `out`'s `n`.
    unsafe { gemm_float(dims, ma, mb, mo, 1) }.unwrap();
    let mut full = vec![0.0; m * n];
    prod(dims, &a, &b, LAYOUTS[0], &mut full);
    assert!(out.iter().zip(&full[(m - 1) * n..]).all(|(x, y)| x.to_bits() == y.to_bits()));
}

#[test]
fn i64_products_wrap_in_every_layout() {
    for l in LAYOUTS {
        let mut out = [0i64; 1];
        prod((1, 2, 1), &[i64::MAX, 1], &[2, 3], l, &mut out);
        assert_eq!(out[0], i64::MAX.wrapping_mul(2).wrapping_add(3), "{l:?}");
    }
}

#[test]
fn kernel_threads_are_at_least_one() {
    assert!(kernel_threads() >= 1);
}
