//! The vectorised paths against the general path, bit for bit: random shapes (lengths off
//! the vector widths, dims of 0 and 1, groups above 4096 rows), every set of dims, keepdim,
//! NaN, infinities and signed zeros in every place, `f32` and `f64`, and every version of
//! the loops this processor runs.

use std::cell::Cell;

use super::super::*;
use crate::kernels::testing::{run_with, tensor, values, Owned};
use crate::kernels::vmath::{cap_level, levels};
use crate::kernels::SumKernel;
use crate::vm::Element;

thread_local! {
    /// Whether the reductions on this thread skip the vectorised paths.
    pub(super) static GENERAL_ONLY: Cell<bool> = const { Cell::new(false) };
    /// How many reductions on this thread took a vectorised path.
    pub(super) static TAKEN: Cell<usize> = const { Cell::new(0) };
}

/// A small xorshift generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn attrs(ints: &[i64], scalars: &[Scalar]) -> Attrs {
    Attrs::default().with_params(ints, scalars).unwrap()
}

/// Every kernel with a vectorised path, with its scalars.
fn kernels() -> Vec<(&'static dyn OpKernel, Vec<Scalar>)> {
    vec![
        (&SumKernel, vec![]),
        (&MeanKernel, vec![]),
        (&ProdKernel, vec![]),
        (&AmaxKernel, vec![]),
        (&AminKernel, vec![]),
        (&MaxKernel, vec![]),
        (&MinKernel, vec![]),
        (&ArgmaxKernel, vec![]),
        (&ArgminKernel, vec![]),
        (&VarKernel, vec![]),
        (&StdKernel, vec![Scalar::Int(0)]),
        (&LogsumexpKernel, vec![]),
        (&NormKernel, vec![]),
        (&NormKernel, vec![Scalar::Float(1.0)]),
        (&NormKernel, vec![Scalar::Float(0.0)]),
        (&NormKernel, vec![Scalar::Float(3.0)]),
        (&NormKernel, vec![Scalar::Float(f64::INFINITY)]),
    ]
}

/// The outputs' bits (each output's bytes).
/// The outputs' bytes, every float NaN written as one NaN: where several NaNs meet in a
/// sum or a product, which one's sign and payload the result carries depends on the order
/// the machine code gives the operands of each addition (x86 returns the first operand's
/// NaN, and the compiler orders the operands of a commutative operation freely), so it
/// may differ between loop versions and processors. Every other bit must agree.
fn bits(outs: &[Owned]) -> Vec<Vec<u8>> {
    outs.iter()
        .map(|(meta, data)| {
            let b = data.as_bytes();
            match meta.dtype {
                DType::F32 => b
                    .chunks_exact(4)
                    .flat_map(|c| {
                        let v = f32::from_le_bytes(c.try_into().unwrap());
                        if v.is_nan() { f32::NAN } else { v }.to_le_bytes()
                    })
                    .collect(),
                DType::F64 => b
                    .chunks_exact(8)
                    .flat_map(|c| {
                        let v = f64::from_le_bytes(c.try_into().unwrap());
                        if v.is_nan() { f64::NAN } else { v }.to_le_bytes()
                    })
                    .collect(),
                _ => b.to_vec(),
            }
        })
        .collect()
}

/// Values of mixed sign and size, ties, and (where `special`) NaN, infinities and signed
/// zeros.
fn value(rng: &mut Rng, special: bool) -> f64 {
    if special {
        match rng.below(24) {
            0 => return f64::NAN,
            1 => return f64::INFINITY,
            2 => return f64::NEG_INFINITY,
            3 => return -0.0,
            4 => return 0.0,
            _ => {}
        }
    }
    match rng.below(3) {
        0 => (rng.below(7) as f64 - 3.0) * 0.5,
        _ => (rng.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0,
    }
}

/// Each kernel over `x` (`shape`, `f32` or `f64`) along every set of dims and keepdim:
/// the vectorised paths give the general path's bits. Returns how many calls took them.
fn check<T: Element + Copy>(shape: &[usize], vals: &[T]) -> usize {
    let rank = shape.len();
    let mut taken = 0;
    for mask in 1..1u32 << rank {
        let dims: Vec<i64> = (0..rank as i64).filter(|&d| mask & (1 << d) != 0).collect();
        let empty = dims.iter().any(|&d| shape[d as usize] == 0);
        for keepdim in [false, true] {
            let mut ints = dims.clone();
            ints.push(i64::from(keepdim));
            for (k, scalars) in kernels() {
                let refuses_empty = matches!(k.name(), "amax" | "amin" | "max" | "min" | "argmax" | "argmin")
                    || (k.name() == "norm" && scalars.first().is_some_and(|s| s.as_f64().is_infinite()));
                if empty && refuses_empty {
                    continue;
                }
                let a = attrs(&ints, &scalars);
                let general = GENERAL_ONLY.with(|g| {
                    g.set(true);
                    let out = run_with(k, a, vec![tensor(shape, vals)], &[]);
                    g.set(false);
                    out
                });
                let before = TAKEN.with(Cell::get);
                let fast = run_with(k, a, vec![tensor(shape, vals)], &[]);
                taken += TAKEN.with(Cell::get) - before;
                let (general, fast) = (general.unwrap(), fast.unwrap());
                assert_eq!(
                    bits(&fast),
                    bits(&general),
                    "{} {scalars:?} of {shape:?} along {dims:?}",
                    k.name()
                );
            }
        }
    }
    taken
}

#[test]
fn vectorised_paths_give_the_general_bits() {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15);
    let mut taken = 0;
    for case in 0..30 {
        let rank = rng.below(3) as usize + 1;
        let shape: Vec<usize> = (0..rank)
            .map(|_| match rng.below(8) {
                0 => 1,
                1 => 0,
                2 => rng.below(4) as usize + 1,
                _ => rng.below(70) as usize + 1,
            })
            .map(|n| if case < 4 { n.max(1) } else { n })
            .collect();
        let n: usize = shape.iter().product();
        if n > 12_000 {
            continue;
        }
        let special = case % 2 == 0;
        let vals: Vec<f64> = (0..n).map(|_| value(&mut rng, special)).collect();
        taken += check(&shape, &vals);
        let vals: Vec<f32> = vals.iter().map(|&v| v as f32).collect();
        taken += check(&shape, &vals);
    }
    assert!(taken > 500, "the vectorised paths ran {taken} times");
}

/// Above 4096 rows the column sums keep 32 accumulators per column, as `sum_f32`'s
/// partial sums: the general path's bits, the tail of rows included; and the rows of a
/// long group.
#[test]
fn long_groups_give_the_general_bits() {
    let mut rng = Rng(7);
    for shape in [vec![4096usize + 37, 9], vec![4200, 2, 8], vec![3, 4100]] {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| value(&mut rng, false) as f32).collect();
        assert!(check(&shape, &vals) > 0);
    }
}

/// `sum(dim=0)` of `[rows, k]` is each column's sum in `sum_f32`'s order, bit for bit.
#[test]
fn column_sums_follow_the_sum_order() {
    let mut rng = Rng(11);
    for (rows, k) in [(4096usize, 24usize), (4097, 17), (4096 + 64 + 5, 40), (9000, 8)] {
        let vals: Vec<f32> = (0..rows * k).map(|_| value(&mut rng, false) as f32 * 1e3).collect();
        let out = run_with(&SumKernel, attrs(&[0, 0], &[]), vec![tensor(&[rows, k], &vals)], &[]).unwrap();
        let got = values::<f32>(&out[0]);
        for (j, g) in got.iter().enumerate() {
            let col: Vec<f32> = (0..rows).map(|i| vals[i * k + j]).collect();
            assert_eq!(g.to_bits(), crate::kernels::sum_f32(&col).to_bits(), "{rows}x{k} column {j}");
        }
    }
}

/// Signed zeros and NaN in the extremes: the first of equal extremes keeps its sign, the
/// first NaN (its bits) and its index win, along the rows and along the columns.
#[test]
fn extremes_keep_the_first_zero_and_the_first_nan() {
    let n = 100;
    for (place, v) in [(0usize, -0.0f32), (40, 0.0), (99, -0.0)] {
        let mut row = vec![-1.0f32; n];
        row[place] = v;
        row[(place + 50) % n] = -v;
        let m = tensor(&[1, n], &row);
        let out = run_with(&MaxKernel, attrs(&[1, 0], &[]), vec![m], &[]).unwrap();
        let first = place.min((place + 50) % n);
        assert_eq!(values::<f32>(&out[0])[0].to_bits(), row[first].to_bits());
        assert_eq!(values::<i64>(&out[1]), vec![first as i64]);
        let t = tensor(&[n, 8], &row.iter().flat_map(|&v| [v; 8]).collect::<Vec<f32>>());
        let out = run_with(&AmaxKernel, attrs(&[0, 0], &[]), vec![t], &[]).unwrap();
        assert!(values::<f32>(&out[0]).iter().all(|r| r.to_bits() == row[first].to_bits()));
    }
    let quiet = f32::from_bits(0x7fc0_0001);
    let mut row = vec![1.0f32; n];
    row[70] = f32::INFINITY;
    row[33] = quiet;
    row[60] = f32::NAN;
    let out = run_with(&MinKernel, attrs(&[0, 0], &[]), vec![tensor(&[n], &row)], &[]).unwrap();
    assert_eq!(values::<f32>(&out[0])[0].to_bits(), quiet.to_bits());
    assert_eq!(values::<i64>(&out[1]), vec![33]);
    let t = tensor(&[n, 8], &row.iter().flat_map(|&v| [v; 8]).collect::<Vec<f32>>());
    let out = run_with(&ArgmaxKernel, attrs(&[0, 0], &[]), vec![t], &[]).unwrap();
    assert_eq!(values::<i64>(&out[0]), vec![33; 8]);
}

/// Each version of the loops (AVX-512, AVX2, the baseline, those this processor runs)
/// gives the same bits.
#[test]
fn every_version_gives_the_same_bits() {
    let mut rng = Rng(5);
    for shape in [vec![37usize, 45], vec![4100, 9], vec![6, 5, 33]] {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| value(&mut rng, true) as f32).collect();
        let wide: Vec<f64> = vals.iter().map(|&v| f64::from(v)).collect();
        for d in 0..shape.len() as i64 {
            for (k, scalars) in kernels() {
                let a = attrs(&[d, 0], &scalars);
                let run = |level| {
                    cap_level(level, || {
                        let s = bits(&run_with(k, a, vec![tensor(&shape, &vals)], &[]).unwrap());
                        let w = bits(&run_with(k, a, vec![tensor(&shape, &wide)], &[]).unwrap());
                        (s, w)
                    })
                };
                let base = run(0);
                for level in levels() {
                    assert!(run(level) == base, "{} along {d} of {shape:?}, version {level}", k.name());
                }
            }
        }
    }
}
