//! The row loops of `softmax`, `log_softmax` and `layer_norm` in `f32`, over rows that lie
//! one after another in memory (the common case: the last dimension of a contiguous
//! tensor), written so that the compiler vectorises them, and compiled three times: for
//! AVX-512, for AVX2 and for the baseline, the widest the processor has picked at run time.
//!
//! The three versions give the same bits: they do the same IEEE operations (no fused
//! multiply-add, which Rust never forms unasked) in the same order, which the code fixes
//! and the vector width does not change. The orders are those of the module docs of
//! `kernels::normalize`.
//!
//! `exp` here is a branch-free polynomial (Cephes' `expf`: Cody-Waite range reduction by
//! `ln 2`, a degree-7 polynomial, the power of two built from its bits), within one unit in
//! the last place of the exact result (tested against `f64`), since std's `f32::exp` is a
//! call per element that no compiler vectorises. No crate offers a vector `exp` chosen at
//! run time on stable Rust.

/// `e^x` in `f32` as every kernel computes it for `f32`, `f16` and `bf16` (`exp`,
/// `sigmoid`, `silu`, `softmax`, `logsumexp`, ...), in a form that vectorises: within one
/// unit in the last place of the exact result (tested over every 97th float of the range);
/// `exp(-inf)` is 0, `exp(inf)` infinity, NaN stays NaN, results below the smallest normal
/// number are subnormal (rounded twice) or 0. References that must agree with the kernels
/// bit for bit use it.
#[inline(always)]
pub fn exp_f32(x: f32) -> f32 {
    // 1.5 · 2^23: adding it rounds to an integer, which lands in the low bits of the sum.
    const MAGIC: f32 = 12_582_912.0;
    const MAGIC_BITS: i32 = 0x4b40_0000;
    // ln 2 in two parts: `LN2_HI` has 9 significant bits, so `n · LN2_HI` is exact for the
    // `n` that occur (|n| ≤ 159).
    const LN2_HI: f32 = 0.693_359_4;
    const LN2_LO: f32 = -2.121_944_4e-4;
    // Beyond these `e^x` is infinite or rounds to 0; a NaN stays NaN.
    let x = x.clamp(-110.0, 89.0);
    let t = x * std::f32::consts::LOG2_E + MAGIC;
    let n = t - MAGIC;
    let r = (x - n * LN2_HI) - n * LN2_LO;
    let mut p = 1.987_569_1e-4_f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let e = (p * (r * r) + r) + 1.0;
    // 2^n as two normal powers of two (n ∈ [-159, 128]), so that results near the ends of
    // the range neither overflow early nor flush to 0.
    let k = (t.to_bits() as i32).wrapping_sub(MAGIC_BITS);
    let k1 = k >> 1;
    let k2 = k - k1;
    let s1 = f32::from_bits(((k1 + 127) as u32) << 23);
    let s2 = f32::from_bits(((k2 + 127) as u32) << 23);
    e * s1 * s2
}

/// Partial sums of the lane order (`kernels::reduce::sum_f32`'s order above its
/// sequential limit).
const LANES: usize = 32;

/// The sum of `f(x)` over `xs` in the lane order at every length: 32 partial sums, partial
/// `j` adding `f(x[i])` for `i ≡ j (mod 32)` over the whole 32-element groups in increasing
/// `i`, combined as a tree (partial `j` += partial `j + 16`, then `+ 8`, ... `+ 1`), then
/// the last `len % 32` values added to the total in index order.
#[inline(always)]
pub(super) fn sum_lanes(xs: &[f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let groups = xs.chunks_exact(LANES);
    let tail = groups.remainder();
    for g in groups {
        for (a, &v) in acc.iter_mut().zip(g) {
            *a += f(v);
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for j in 0..width {
            acc[j] += acc[j + width];
        }
        width /= 2;
    }
    tail.iter().fold(acc[0], |s, &v| s + f(v))
}

/// `ys[i] = f(xs[i])`, returning the sum of the `ys` in the lane order ([`sum_lanes`]):
/// one pass where two would read the values again.
#[inline(always)]
fn store_and_sum_lanes(xs: &[f32], ys: &mut [f32], f: impl Fn(f32) -> f32) -> f32 {
    let mut acc = [0.0f32; LANES];
    let whole = xs.len() / LANES * LANES;
    let (x_groups, x_tail) = xs.split_at(whole);
    let (y_groups, y_tail) = ys.split_at_mut(whole);
    for (g, o) in x_groups.chunks_exact(LANES).zip(y_groups.chunks_exact_mut(LANES)) {
        for ((a, &v), o) in acc.iter_mut().zip(g).zip(o) {
            let e = f(v);
            *o = e;
            *a += e;
        }
    }
    let mut width = LANES / 2;
    while width > 0 {
        for j in 0..width {
            acc[j] += acc[j + width];
        }
        width /= 2;
    }
    x_tail.iter().zip(y_tail).fold(acc[0], |s, (&v, o)| {
        let e = f(v);
        *o = e;
        s + e
    })
}

/// The largest value of `xs` that is not NaN (`-inf` for none); NaNs are left to the
/// callers, whose sums they make NaN.
#[inline(always)]
fn max_not_nan(xs: &[f32]) -> f32 {
    let mut acc = [f32::NEG_INFINITY; LANES];
    let groups = xs.chunks_exact(LANES);
    let tail = groups.remainder();
    for g in groups {
        for (a, &v) in acc.iter_mut().zip(g) {
            *a = if v > *a { v } else { *a };
        }
    }
    let m = acc.iter().fold(f32::NEG_INFINITY, |m, &v| if v > m { v } else { m });
    tail.iter().fold(m, |m, &v| if v > m { v } else { m })
}

/// The widest version of the loops the processor runs: 2 for AVX-512, 1 for AVX2, 0 for the
/// baseline. Tests may lower it on their thread ([`cap_level`]) to run every version.
#[cfg(target_arch = "x86_64")]
#[inline]
pub(super) fn widest_level() -> u8 {
    let detected = if std::arch::is_x86_feature_detected!("avx512f") {
        2
    } else if std::arch::is_x86_feature_detected!("avx2") {
        1
    } else {
        0
    };
    #[cfg(test)]
    let detected = detected.min(LEVEL_CAP.with(std::cell::Cell::get));
    detected
}

#[cfg(test)]
thread_local! {
    /// The widest version tests let [`widest_level`] pick on this thread.
    static LEVEL_CAP: std::cell::Cell<u8> = const { std::cell::Cell::new(2) };
}

/// Run `f` with the loops of this thread held to version `level` at most (0 the baseline,
/// 1 AVX2, 2 AVX-512).
#[cfg(test)]
pub(super) fn cap_level<R>(level: u8, f: impl FnOnce() -> R) -> R {
    let before = LEVEL_CAP.with(|c| c.replace(level));
    let r = f();
    LEVEL_CAP.with(|c| c.set(before));
    r
}

/// The versions of the loops this processor runs (0 the baseline, 1 AVX2, 2 AVX-512).
#[cfg(test)]
pub(super) fn levels() -> Vec<u8> {
    #[cfg(target_arch = "x86_64")]
    {
        (0..=cap_level(2, widest_level)).collect()
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        vec![0]
    }
}

/// Defines `$name`, which runs `$body` (a function of the same arguments, inlined into
/// each version) in the widest version the processor supports.
macro_rules! widest {
    ($(#[$doc:meta])* fn $name:ident($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        $(#[$doc])*
        pub(super) fn $name($($arg: $ty),*) {
            #[inline(always)]
            fn body($($arg: $ty),*) $body
            #[cfg(target_arch = "x86_64")]
            {
                #[target_feature(enable = "avx512f")]
                fn avx512($($arg: $ty),*) {
                    body($($arg),*)
                }
                #[target_feature(enable = "avx2")]
                fn avx2($($arg: $ty),*) {
                    body($($arg),*)
                }
                match $crate::kernels::vmath::widest_level() {
                    // SAFETY: level 2 is given only where the processor has AVX-512F.
                    2 => return unsafe { avx512($($arg),*) },
                    // SAFETY: level 1 is given only where the processor has AVX2.
                    1 => return unsafe { avx2($($arg),*) },
                    _ => {}
                }
            }
            body($($arg),*)
        }
    };
}
pub(super) use widest;

widest!(
    /// `softmax` (or with `log`, `log_softmax`) of each row of `n` values of `xs` into the
    /// same row of `ys` (`xs.len() == ys.len()`, a multiple of `n`; `n > 0`). The maximum
    /// `m` of the row's values that are not NaN; the sum `s` of `exp(x - m)` in the lane
    /// order; then `exp(x - m) · (1 / s)` or `x - (m + ln s)`. A NaN in a row makes its sum,
    /// and so the whole row, NaN; so does a row of `-inf` or one holding `+inf`.
    fn softmax_rows(xs: &[f32], ys: &mut [f32], n: usize, log: bool) {
        for (x, y) in xs.chunks_exact(n).zip(ys.chunks_exact_mut(n)) {
            let m = max_not_nan(x);
            if log {
                let s = sum_lanes(x, |v| exp_f32(v - m));
                let shift = m + s.ln();
                for (o, &v) in y.iter_mut().zip(x) {
                    *o = v - shift;
                }
            } else {
                let inv = 1.0 / store_and_sum_lanes(x, y, |v| exp_f32(v - m));
                for o in y.iter_mut() {
                    *o *= inv;
                }
            }
        }
    }
);

widest!(
    /// `layer_norm` of each row of `n` values of `xs` into the same row of `ys`: the mean
    /// `μ` (the sum in the lane order, over `n`), the biased variance `σ²` (the sum of
    /// `(x - μ)²` in the lane order, over `n`), then `(x - μ) · (1 / sqrt(σ² + eps))`,
    /// times `weight` and plus `bias` (each of `n` values) where given.
    fn layer_norm_rows(
        xs: &[f32],
        ys: &mut [f32],
        n: usize,
        weight: Option<&[f32]>,
        bias: Option<&[f32]>,
        eps: f32,
    ) {
        let len = n as f32;
        for (x, y) in xs.chunks_exact(n).zip(ys.chunks_exact_mut(n)) {
            let mean = sum_lanes(x, |v| v) / len;
            let var = sum_lanes(x, |v| (v - mean) * (v - mean)) / len;
            let rstd = 1.0 / (var + eps).sqrt();
            // One pass per case, each `((x - μ) · rstd) · w + b` in that order.
            match (weight, bias) {
                (Some(w), Some(b)) => {
                    for (((o, &v), &w), &b) in y.iter_mut().zip(x).zip(w).zip(b) {
                        *o = (v - mean) * rstd * w + b;
                    }
                }
                (Some(w), None) => {
                    for ((o, &v), &w) in y.iter_mut().zip(x).zip(w) {
                        *o = (v - mean) * rstd * w;
                    }
                }
                (None, Some(b)) => {
                    for ((o, &v), &b) in y.iter_mut().zip(x).zip(b) {
                        *o = (v - mean) * rstd + b;
                    }
                }
                (None, None) => {
                    for (o, &v) in y.iter_mut().zip(x) {
                        *o = (v - mean) * rstd;
                    }
                }
            }
        }
    }
);

#[cfg(test)]
mod tests {
    use super::*;

    /// The distance from `got` to `want` in units in the last place of `want`'s binade
    /// (of the smallest normal binade below it).
    fn ulps(got: f32, want: f64) -> f64 {
        let w = want as f32;
        let ulp = if w.abs() < f32::MIN_POSITIVE {
            f64::from(f32::from_bits(1))
        } else {
            let b = w.abs().to_bits() & 0x7f80_0000;
            f64::from(f32::from_bits(b)) * f64::from(f32::EPSILON)
        };
        (f64::from(got) - want).abs() / ulp
    }

    #[test]
    fn exp_is_within_one_ulp_everywhere() {
        let mut worst = (0.0f64, 0.0f32);
        // Every 97th float from -110 to 89, both signs: about 20 million values.
        let mut bits = 0u32;
        while bits < 0x7f80_0000 {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                if !(-110.0..=89.0).contains(&x) {
                    continue;
                }
                let want = f64::from(x).exp();
                if want > f64::from(f32::MAX) {
                    assert_eq!(exp_f32(x), f32::INFINITY, "exp({x})");
                    continue;
                }
                let u = ulps(exp_f32(x), want);
                if u > worst.0 {
                    worst = (u, x);
                }
            }
            bits += 97;
        }
        assert!(worst.0 <= 1.0, "exp({}) is {} ulps off", worst.1, worst.0);
    }

    #[test]
    fn exp_of_special_values() {
        assert_eq!(exp_f32(0.0), 1.0);
        assert_eq!(exp_f32(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_f32(-200.0), 0.0);
        assert_eq!(exp_f32(f32::INFINITY), f32::INFINITY);
        assert_eq!(exp_f32(89.0), f32::INFINITY);
        assert!(exp_f32(f32::NAN).is_nan());
        assert!(exp_f32(88.72) < f32::INFINITY);
        assert!(exp_f32(-103.0) > 0.0, "subnormal results are kept");
    }

    /// The lane order, written out.
    fn lanes_reference(xs: &[f32]) -> f32 {
        let whole = xs.len() / 32 * 32;
        let mut acc = [0.0f32; 32];
        for (i, &v) in xs[..whole].iter().enumerate() {
            acc[i % 32] += v;
        }
        for w in [16, 8, 4, 2, 1] {
            for j in 0..w {
                acc[j] += acc[j + w];
            }
        }
        xs[whole..].iter().fold(acc[0], |s, &v| s + v)
    }

    #[test]
    fn sums_follow_the_lane_order() {
        for n in [0, 1, 31, 32, 33, 100, 1024, 1031] {
            let xs: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.001 + 1e-4 * i as f32).collect();
            assert_eq!(sum_lanes(&xs, |v| v).to_bits(), lanes_reference(&xs).to_bits(), "n = {n}");
        }
    }

    #[test]
    fn every_version_gives_the_same_bits() {
        // The body run directly (the baseline's code) against the dispatched version.
        let n = 37;
        let xs: Vec<f32> = (0..n * 5).map(|i| ((i * 37) % 101) as f32 * 0.17 - 8.0).collect();
        for log in [false, true] {
            let mut ys = vec![0.0; xs.len()];
            softmax_rows(&xs, &mut ys, n, log);
            for (x, y) in xs.chunks(n).zip(ys.chunks(n)) {
                let m = max_not_nan(x);
                let s = lanes_reference(&x.iter().map(|&v| exp_f32(v - m)).collect::<Vec<_>>());
                for (&v, &o) in x.iter().zip(y) {
                    let want = if log { v - (m + s.ln()) } else { exp_f32(v - m) * (1.0 / s) };
                    assert_eq!(o.to_bits(), want.to_bits());
                }
            }
        }
    }
}
