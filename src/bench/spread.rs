//! Medians and the agreement of repetitions.
//!
//! On the 2-core machine the same workload runs at one of two speeds from one run to the
//! next (`docs/performance.md`, "Method"). A verdict taken from repetitions that disagree by
//! more than [`DISAGREEMENT`] says more about the machine than about the VM, so the bench
//! prints a warning instead of a verdict.

/// Repetitions whose fastest is more than this many times their slowest disagree.
pub const DISAGREEMENT: f64 = 2.0;

/// The median of `v` (sorts it); NaN for an empty slice.
pub fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let k = v.len();
    match k {
        0 => f64::NAN,
        _ if k % 2 == 1 => v[k / 2],
        _ => 0.5 * (v[k / 2 - 1] + v[k / 2]),
    }
}

/// The slowest and fastest of `v` (rates: higher is faster), `[lowest, highest]`.
pub fn range(v: &[f64]) -> [f64; 2] {
    [v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max)]
}

/// Highest over lowest of positive figures `v`: 1 when they agree; infinite when one is
/// zero (a repetition too short for the clock). Fewer than two figures agree with themselves.
pub fn spread(v: &[f64]) -> f64 {
    if v.len() < 2 {
        return 1.0;
    }
    let [lo, hi] = range(v);
    if lo <= 0.0 {
        return f64::INFINITY;
    }
    hi / lo
}

/// Whether the repetitions `v` disagree by more than [`DISAGREEMENT`].
pub fn disagree(v: &[f64]) -> bool {
    spread(v) > DISAGREEMENT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn medians_of_odd_even_and_empty_sets() {
        assert_eq!(median(&mut [3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&mut [4.0, 1.0, 3.0, 2.0]), 2.5);
        assert!(median(&mut []).is_nan());
    }

    #[test]
    fn repetitions_within_twice_agree_and_beyond_it_disagree() {
        assert!(!disagree(&[]));
        assert!(!disagree(&[5.0]));
        assert!(!disagree(&[10.0, 12.0, 19.9]));
        assert!(!disagree(&[10.0, 20.0]), "exactly 2x is still agreement");
        assert!(disagree(&[10.0, 20.5]));
        // The two speeds of W3/W4: one fast repetition among slow ones.
        assert!(disagree(&[40e6, 42e6, 95e6]));
        assert!(disagree(&[0.0, 1.0]), "a zero among positive figures");
        assert_eq!(spread(&[2.0, 8.0, 4.0]), 4.0);
    }
}
