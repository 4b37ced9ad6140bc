//! Tests of the reductions along dims, the ops along one dimension and `nll_loss` against
//! naive references: random shapes, every set of dims, keepdim, transposed, expanded and
//! offset views, 0-d and empty tensors, NaN and infinities, and the dtypes each op takes.

use super::*;
use crate::kernels::testing::{run_with, storage, tensor, values, Owned};
use crate::kernels::{
    CumprodKernel, CumsumKernel, LayerNormKernel, LogSoftmaxKernel, NllLossKernel, SoftmaxKernel, SumKernel,
};
use crate::vm::{bf16, f16, TensorMeta};

/// A small xorshift generator: the tests' values and shapes.
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
    fn float(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 4.0 - 2.0
    }
}

fn attrs(ints: &[i64], scalars: &[Scalar]) -> Attrs {
    Attrs::default().with_params(ints, scalars).unwrap()
}

/// The groups of a row-major tensor of `shape` holding `vals`, by output element (the
/// naive reference: every index in row-major order goes to its kept index's group).
fn groups(shape: &[usize], reduced: &[bool], vals: &[f64]) -> Vec<Vec<f64>> {
    let kept: usize = shape.iter().zip(reduced).filter(|(_, &r)| !r).map(|(&n, _)| n).product();
    let mut out = vec![Vec::new(); kept];
    let mut index = vec![0usize; shape.len()];
    for &v in vals {
        let mut o = 0;
        for d in 0..shape.len() {
            if !reduced[d] {
                o = o * shape[d] + index[d];
            }
        }
        out[o].push(v);
        for d in (0..shape.len()).rev() {
            index[d] += 1;
            if index[d] < shape[d] {
                break;
            }
            index[d] = 0;
        }
    }
    out
}

/// Every subset of `rank` dims as a list (bit `d` of the mask: dim `d`).
fn subsets(rank: usize) -> Vec<Vec<i64>> {
    (0..1u32 << rank).map(|m| (0..rank as i64).filter(|&d| m & (1 << d) != 0).collect()).collect()
}

fn close(a: f64, b: f64, tol: f64) -> bool {
    (a.is_nan() && b.is_nan()) || a == b || (a - b).abs() <= tol * (1.0 + b.abs())
}

fn f64s(t: &Owned) -> Vec<f64> {
    values::<f64>(t)
}

/// Random shapes, every dim set, keepdim or not: each reduction of an `f64` tensor against
/// the reference over its groups, through a contiguous input and through a transposed view
/// of the same values.
#[test]
fn reductions_match_the_reference_over_every_dim_set() {
    let mut rng = Rng(0x2545_F491_4F6C_DD1D);
    type Ref = fn(&[f64]) -> f64;
    let mean: Ref = |g| g.iter().sum::<f64>() / g.len() as f64;
    let var: Ref = |g| {
        let m = g.iter().sum::<f64>() / g.len() as f64;
        g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() as f64 - 1.0).max(0.0)
    };
    let cases: Vec<(&dyn OpKernel, Vec<Scalar>, Ref)> = vec![
        (&SumKernel, vec![], |g| g.iter().sum()),
        (&MeanKernel, vec![], mean),
        (&ProdKernel, vec![], |g| g.iter().product()),
        (&AmaxKernel, vec![], |g| g.iter().copied().fold(f64::NEG_INFINITY, f64::max)),
        (&AminKernel, vec![], |g| g.iter().copied().fold(f64::INFINITY, f64::min)),
        (&VarKernel, vec![], var),
        (&StdKernel, vec![], |g| {
            let m = g.iter().sum::<f64>() / g.len() as f64;
            (g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / (g.len() as f64 - 1.0).max(0.0)).sqrt()
        }),
        (&VarKernel, vec![Scalar::Int(0)], |g| {
            let m = g.iter().sum::<f64>() / g.len() as f64;
            g.iter().map(|v| (v - m) * (v - m)).sum::<f64>() / g.len() as f64
        }),
        (&LogsumexpKernel, vec![], |g| g.iter().map(|v| v.exp()).sum::<f64>().ln()),
        (&NormKernel, vec![], |g| g.iter().map(|v| v * v).sum::<f64>().sqrt()),
        (&NormKernel, vec![Scalar::Float(1.0)], |g| g.iter().map(|v| v.abs()).sum()),
        (&NormKernel, vec![Scalar::Float(3.0)], |g| g.iter().map(|v| v.abs().powi(3)).sum::<f64>().cbrt()),
        (&NormKernel, vec![Scalar::Float(f64::INFINITY)], |g| g.iter().fold(0.0, |m, v| m.max(v.abs()))),
        (&NormKernel, vec![Scalar::Float(0.0)], |g| g.iter().filter(|v| **v != 0.0).count() as f64),
    ];
    for _ in 0..12 {
        let rank = rng.below(4) as usize + 1;
        let shape: Vec<usize> = (0..rank).map(|_| rng.below(4) as usize + 1).collect();
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|_| rng.float()).collect();
        // The same values through a view: stored transposed (reversed dims), read back
        // through reversed strides.
        let rev: Vec<usize> = shape.iter().rev().copied().collect();
        let rev_strides = crate::vm::contiguous_strides(&rev);
        let mut stored = vec![0.0; n];
        let strides: Vec<isize> = rev_strides.iter().rev().copied().collect();
        for (i, &v) in vals.iter().enumerate() {
            let (mut rem, mut at) = (i, 0isize);
            for d in (0..rank).rev() {
                at += (rem % shape[d]) as isize * strides[d];
                rem /= shape[d];
            }
            stored[at as usize] = v;
        }
        for dims in subsets(rank) {
            let reduced: Vec<bool> = (0..rank as i64).map(|d| dims.contains(&d) || dims.is_empty()).collect();
            let want_groups = groups(&shape, &reduced, &vals);
            // Negative dims name the same dimensions.
            let neg: Vec<i64> = dims.iter().map(|&d| d - rank as i64).collect();
            for keepdim in [false, true] {
                for (k, scalars, f) in &cases {
                    for (list, view) in [(&dims, false), (&neg, true)] {
                        let mut ints = list.clone();
                        ints.push(i64::from(keepdim));
                        let x = if view {
                            let t = tensor(&[n], &stored);
                            (t.0.with_layout(&shape, &strides, 0), t.1)
                        } else {
                            tensor(&shape, &vals)
                        };
                        let out = run_with(*k, attrs(&ints, scalars), vec![x], &[]).unwrap();
                        let want_shape: Vec<usize> = shape
                            .iter()
                            .zip(&reduced)
                            .filter_map(|(&s, &r)| if r { keepdim.then_some(1) } else { Some(s) })
                            .collect();
                        assert_eq!(out[0].0.shape.as_slice(), want_shape.as_slice(), "{} {dims:?}", k.name());
                        let got = f64s(&out[0]);
                        for (g, want) in got.iter().zip(want_groups.iter().map(|g| f(g))) {
                            assert!(close(*g, want, 1e-12), "{} {shape:?} {dims:?}: {g} vs {want}", k.name());
                        }
                    }
                }
            }
        }
    }
}

/// `max` and `argmax` along every single dim: the values, and the first index of the
/// extreme in each group (ties are common among small integers).
#[test]
fn max_and_argmax_give_the_first_index() {
    let mut rng = Rng(77);
    for _ in 0..20 {
        let rank = rng.below(3) as usize + 1;
        let shape: Vec<usize> = (0..rank).map(|_| rng.below(5) as usize + 1).collect();
        let n: usize = shape.iter().product();
        let vals: Vec<i32> = (0..n).map(|_| rng.below(4) as i32).collect();
        let fl: Vec<f64> = vals.iter().map(|&v| f64::from(v)).collect();
        for d in 0..rank {
            let reduced: Vec<bool> = (0..rank).map(|e| e == d).collect();
            let gs = groups(&shape, &reduced, &fl);
            for (kernel, max) in [(&MaxKernel as &dyn OpKernel, true), (&MinKernel, false)] {
                let out =
                    run_with(kernel, attrs(&[d as i64, 0], &[]), vec![tensor(&shape, &vals)], &[]).unwrap();
                assert_eq!(out[0].0.dtype, DType::I32);
                assert_eq!(out[1].0.dtype, DType::I64);
                let (v, i) = (values::<i32>(&out[0]), values::<i64>(&out[1]));
                for (k, g) in gs.iter().enumerate() {
                    let best = if max {
                        g.iter().copied().fold(f64::MIN, f64::max)
                    } else {
                        g.iter().copied().fold(f64::MAX, f64::min)
                    };
                    assert_eq!(f64::from(v[k]), best);
                    assert_eq!(i[k], g.iter().position(|&x| x == best).unwrap() as i64);
                }
            }
            let out = run_with(&ArgmaxKernel, attrs(&[d as i64, 1], &[]), vec![tensor(&shape, &vals)], &[])
                .unwrap();
            let i = values::<i64>(&out[0]);
            for (k, g) in gs.iter().enumerate() {
                let best = g.iter().copied().fold(f64::MIN, f64::max);
                assert_eq!(i[k], g.iter().position(|&x| x == best).unwrap() as i64);
            }
        }
    }
    // Over the flattened tensor: no dims.
    let x = tensor(&[2, 3], &[1.0f32, 5.0, 2.0, 5.0, 0.0, -1.0]);
    let out = run_with(&ArgmaxKernel, attrs(&[0], &[]), vec![x], &[]).unwrap();
    assert!(out[0].0.shape.is_empty());
    assert_eq!(values::<i64>(&out[0]), vec![1]);
    let x = tensor(&[2, 3], &[1.0f32, 5.0, 2.0, 5.0, 0.0, -1.0]);
    assert_eq!(values::<i64>(&run_with(&ArgminKernel, Attrs::default(), vec![x], &[]).unwrap()[0]), vec![5]);
}

#[test]
fn nan_propagates_through_the_extremes() {
    let nan = f32::NAN;
    let x = || tensor(&[2, 3], &[1.0f32, nan, 3.0, 4.0, 5.0, nan]);
    let out = run_with(&AmaxKernel, attrs(&[1, 0], &[]), vec![x()], &[]).unwrap();
    let v = values::<f32>(&out[0]);
    assert!(v[0].is_nan() && v[1].is_nan());
    let out = run_with(&MaxKernel, attrs(&[1, 0], &[]), vec![x()], &[]).unwrap();
    assert_eq!(values::<i64>(&out[1]), vec![1, 2]);
    let out = run_with(&AminKernel, attrs(&[0, 0], &[]), vec![x()], &[]).unwrap();
    let v = values::<f32>(&out[0]);
    assert_eq!((v[0], v[1].is_nan(), v[2].is_nan()), (1.0, true, true));
    let out = run_with(&ArgminKernel, attrs(&[0], &[]), vec![x()], &[]).unwrap();
    assert_eq!(values::<i64>(&out[0]), vec![1]);
    // Infinities are ordinary extremes; logsumexp keeps them.
    let y = || tensor(&[3], &[f32::NEG_INFINITY, 1.0, f32::INFINITY]);
    assert_eq!(
        values::<f32>(&run_with(&AmaxKernel, Attrs::default(), vec![y()], &[]).unwrap()[0]),
        vec![f32::INFINITY]
    );
    assert_eq!(
        values::<f32>(&run_with(&LogsumexpKernel, Attrs::default(), vec![y()], &[]).unwrap()[0]),
        vec![f32::INFINITY]
    );
    let z = tensor(&[2], &[f32::NEG_INFINITY; 2]);
    assert_eq!(
        values::<f32>(&run_with(&LogsumexpKernel, Attrs::default(), vec![z], &[]).unwrap()[0]),
        vec![f32::NEG_INFINITY]
    );
    // A large value does not overflow logsumexp: 1000 + log(2).
    let big = tensor(&[2], &[1000.0f32, 1000.0]);
    let v = values::<f32>(&run_with(&LogsumexpKernel, Attrs::default(), vec![big], &[]).unwrap()[0]);
    assert!((v[0] - (1000.0 + 2f32.ln())).abs() < 1e-3);
    // NaN sums are NaN.
    let s = values::<f32>(&run_with(&SumKernel, attrs(&[0, 0], &[]), vec![x()], &[]).unwrap()[0]);
    assert!(s[1].is_nan() && !s[0].is_nan());
}

#[test]
fn empty_and_zero_d_follow_pytorch() {
    // The sum of no elements is 0, the product 1, the mean NaN; all is true, any false.
    let e = || tensor::<f32>(&[0, 3], &[]);
    assert_eq!(
        values::<f32>(&run_with(&SumKernel, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap()[0]),
        vec![0.0; 3]
    );
    assert_eq!(
        values::<f32>(&run_with(&ProdKernel, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap()[0]),
        vec![1.0; 3]
    );
    assert!(values::<f32>(&run_with(&MeanKernel, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap()[0])
        .iter()
        .all(|v| v.is_nan()));
    assert_eq!(
        values::<u8>(&run_with(&AllKernel, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap()[0]),
        vec![1; 3]
    );
    assert_eq!(
        values::<u8>(&run_with(&AnyKernel, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap()[0]),
        vec![0; 3]
    );
    // Along the other dim: an empty output.
    let out = run_with(&AmaxKernel, attrs(&[1, 0], &[]), vec![e()], &[]).unwrap();
    assert_eq!(out[0].0.shape.as_slice(), &[0]);
    // The extremes of an empty dim are refused, by infer and by compute.
    for k in [&AmaxKernel as &dyn OpKernel, &AminKernel, &MaxKernel, &MinKernel, &ArgmaxKernel, &ArgminKernel]
    {
        let err = run_with(k, attrs(&[0, 0], &[]), vec![e()], &[]).unwrap_err();
        assert!(err.contains("empty dimension"), "{err}");
        assert!(run_with(k, Attrs::default(), vec![e()], &[]).is_err());
    }
    let err =
        run_with(&NormKernel, attrs(&[0], &[Scalar::Float(f64::INFINITY)]), vec![e()], &[]).unwrap_err();
    assert!(err.contains("empty dimension"), "{err}");
    // 0-d: dim 0 and -1 are the element itself.
    for d in [0, -1] {
        let out = run_with(&SumKernel, attrs(&[d, 1], &[]), vec![tensor(&[], &[7i32])], &[]).unwrap();
        assert!(out[0].0.shape.is_empty());
        assert_eq!(values::<i64>(&out[0]), vec![7]);
        let out = run_with(&MaxKernel, attrs(&[d, 0], &[]), vec![tensor(&[], &[2.5f64])], &[]).unwrap();
        assert_eq!((values::<f64>(&out[0]), values::<i64>(&out[1])), (vec![2.5], vec![0]));
    }
    assert!(run_with(&SumKernel, attrs(&[1, 0], &[]), vec![tensor(&[], &[7i32])], &[]).is_err());
}

#[test]
fn bad_dims_are_refused() {
    let x = || tensor(&[2, 3], &[0.0f32; 6]);
    let err = run_with(&MeanKernel, attrs(&[1, -1, 0], &[]), vec![x()], &[]).unwrap_err();
    assert!(err.contains("appears more than once"), "{err}");
    let err = run_with(&SumKernel, attrs(&[2, 0], &[]), vec![x()], &[]).unwrap_err();
    assert!(err.contains("out of range"), "{err}");
    let err = run_with(&SumKernel, attrs(&[-3, 0], &[]), vec![x()], &[]).unwrap_err();
    assert!(err.contains("out of range"), "{err}");
    let err = run_with(&MeanKernel, attrs(&[0, 0], &[]), vec![tensor(&[2], &[1i64, 2])], &[]).unwrap_err();
    assert!(err.contains("floating"), "{err}");
    assert!(run_with(&ArgmaxKernel, Attrs::default(), vec![tensor(&[1], &[true])], &[]).is_err());
}

#[test]
fn dtypes_accumulate_and_give_pytorch_output_dtypes() {
    // f16 and bf16 add in f32: 2048 + 1 + 1 is 2050, not 2048.
    let h = tensor(&[1, 3], &[f16::from_f32(2048.0), f16::ONE, f16::ONE]);
    let out = run_with(&SumKernel, attrs(&[1, 0], &[]), vec![h], &[]).unwrap();
    assert_eq!(out[0].0.dtype, DType::F16);
    assert_eq!(values::<f16>(&out[0]), vec![f16::from_f32(2050.0)]);
    let b = tensor(&[3, 1], &[bf16::from_f32(256.0), bf16::ONE, bf16::ONE]);
    let out = run_with(&MeanKernel, attrs(&[0, 0], &[]), vec![b], &[]).unwrap();
    assert_eq!(values::<bf16>(&out[0]), vec![bf16::from_f32(258.0 / 3.0)]);
    // bool and integer sums and products are i64, wrapping.
    let i = tensor(&[2, 2], &[i32::MAX, 1, 1, 2]);
    let out = run_with(&SumKernel, attrs(&[0, 0], &[]), vec![i], &[]).unwrap();
    assert_eq!(out[0].0.dtype, DType::I64);
    assert_eq!(values::<i64>(&out[0]), vec![i32::MAX as i64 + 1, 3]);
    let u = tensor(&[2, 2], &[200u8, 2, 3, 2]);
    assert_eq!(
        values::<i64>(&run_with(&ProdKernel, attrs(&[0, 0], &[]), vec![u], &[]).unwrap()[0]),
        vec![600, 4]
    );
    let t = tensor(&[2, 2], &[true, false, true, true]);
    let out = run_with(&SumKernel, attrs(&[1, 0], &[]), vec![t], &[]).unwrap();
    assert_eq!(values::<i64>(&out[0]), vec![1, 2]);
    // all and any: bool, u8 for u8.
    let t = tensor(&[2, 2], &[true, false, true, true]);
    let out = run_with(&AllKernel, attrs(&[1, 0], &[]), vec![t], &[]).unwrap();
    assert_eq!((out[0].0.dtype, values::<u8>(&out[0])), (DType::Bool, vec![0, 1]));
    let u = tensor(&[3], &[0u8, 7, 0]);
    let out = run_with(&AnyKernel, Attrs::default(), vec![u], &[]).unwrap();
    assert_eq!((out[0].0.dtype, values::<u8>(&out[0])), (DType::U8, vec![1]));
    let f = tensor(&[2], &[f64::NAN, -0.0]);
    assert_eq!(values::<u8>(&run_with(&AnyKernel, Attrs::default(), vec![f], &[]).unwrap()[0]), vec![1]);
    let f = tensor(&[2], &[f64::NAN, -0.0]);
    assert_eq!(values::<u8>(&run_with(&AllKernel, Attrs::default(), vec![f], &[]).unwrap()[0]), vec![0]);
    // Every dtype's extremes.
    for dt in DType::ALL {
        let x = (
            crate::vm::TensorMeta::new(&[2, 2], dt, crate::ep::DeviceId::CPU),
            storage(&vec![1u8; 4 * dt.size()]),
        );
        let out = run_with(&AmaxKernel, attrs(&[0, 0], &[]), vec![x], &[]).unwrap();
        assert_eq!(out[0].0.dtype, dt);
    }
}

/// A sum along dims has the bits of the whole-tensor `sum` of each group, whatever the
/// layout: large groups (above 4096, where the partial sums start), transposed and
/// expanded views, and an offset.
#[test]
fn sums_along_dims_have_the_whole_sum_bits_in_every_layout() {
    let mut rng = Rng(5);
    let (rows, cols) = (3usize, 5000usize);
    let vals: Vec<f32> = (0..rows * cols).map(|_| rng.float() as f32 * 1000.0).collect();
    let whole: Vec<u32> = (0..rows)
        .map(|r| {
            let row = tensor(&[cols], &vals[r * cols..(r + 1) * cols]);
            values::<f32>(&run_with(&SumKernel, Attrs::default(), vec![row], &[]).unwrap()[0])[0].to_bits()
        })
        .collect();
    let along = |x: Owned, ints: &[i64]| -> Vec<u32> {
        values::<f32>(&run_with(&SumKernel, attrs(ints, &[]), vec![x], &[]).unwrap()[0])
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert_eq!(along(tensor(&[rows, cols], &vals), &[1, 0]), whole);
    // Stored transposed: [cols, rows] holding x.T, viewed as [rows, cols] with strides [1, rows].
    let mut tr = vec![0.0f32; rows * cols];
    for r in 0..rows {
        for c in 0..cols {
            tr[c * rows + r] = vals[r * cols + c];
        }
    }
    let t = tensor(&[rows * cols], &tr);
    let view = (t.0.with_layout(&[rows, cols], &[1, rows as isize], 0), t.1);
    assert_eq!(along(view, &[-1, 0]), whole);
    // One group, large and strided: the whole sum of the transposed view is the whole sum
    // in row-major order.
    let t = tensor(&[rows * cols], &tr);
    let view = (t.0.with_layout(&[rows, cols], &[1, rows as isize], 0), t.1);
    let all = values::<f32>(&run_with(&SumKernel, attrs(&[0], &[]), vec![view], &[]).unwrap()[0]);
    let flat = values::<f32>(
        &run_with(&SumKernel, Attrs::default(), vec![tensor(&[rows * cols], &vals)], &[]).unwrap()[0],
    );
    assert_eq!(all[0].to_bits(), flat[0].to_bits());
    // Expanded (stride 0) and offset: row 1 repeated 4 times.
    let t = tensor(&[rows * cols], &vals);
    let view = (t.0.with_layout(&[4, cols], &[0, 1], cols), t.1);
    assert_eq!(along(view, &[1, 0]), vec![whole[1]; 4]);
    // Along the outer dim of a large matrix (slabs of whole groups).
    let big: Vec<f32> = (0..300 * 700).map(|_| rng.float() as f32).collect();
    let got = along(tensor(&[300, 700], &big), &[0, 0]);
    for c in [0usize, 350, 699] {
        let col: Vec<f32> = (0..300).map(|r| big[r * 700 + c]).collect();
        assert_eq!(got[c], crate::kernels::sum_f32(&col).to_bits());
    }
}

#[test]
fn cumsum_and_cumprod_run_along_the_dim() {
    let x = || tensor(&[2, 3], &[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0]);
    let out = run_with(&CumsumKernel, attrs(&[1], &[]), vec![x()], &[]).unwrap();
    assert_eq!(values::<f32>(&out[0]), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    let out = run_with(&CumsumKernel, attrs(&[0], &[]), vec![x()], &[]).unwrap();
    assert_eq!(values::<f32>(&out[0]), vec![1.0, 2.0, 3.0, 5.0, 7.0, 9.0]);
    let out = run_with(&CumprodKernel, attrs(&[-1], &[]), vec![x()], &[]).unwrap();
    assert_eq!(values::<f32>(&out[0]), vec![1.0, 2.0, 6.0, 4.0, 20.0, 120.0]);
    let b = tensor(&[3], &[true, true, false]);
    let out = run_with(&CumsumKernel, attrs(&[0], &[]), vec![b], &[]).unwrap();
    assert_eq!((out[0].0.dtype, values::<i64>(&out[0])), (DType::I64, vec![1, 2, 2]));
    // A transposed view along its dim 1.
    let t = tensor(&[6], &[1.0f64, 4.0, 2.0, 5.0, 3.0, 6.0]);
    let view = (t.0.with_layout(&[2, 3], &[1, 2], 0), t.1);
    let out = run_with(&CumsumKernel, attrs(&[1], &[]), vec![view], &[]).unwrap();
    assert_eq!(values::<f64>(&out[0]), vec![1.0, 3.0, 6.0, 4.0, 9.0, 15.0]);
    assert!(run_with(&CumsumKernel, attrs(&[2], &[]), vec![x()], &[]).is_err());
}

#[test]
fn softmax_and_log_softmax_match_the_reference() {
    let mut rng = Rng(11);
    for _ in 0..10 {
        let shape = [rng.below(4) as usize + 1, rng.below(5) as usize + 1, rng.below(3) as usize + 1];
        let n: usize = shape.iter().product();
        let vals: Vec<f64> = (0..n).map(|_| rng.float() * 30.0).collect();
        for d in 0..3 {
            let reduced: Vec<bool> = (0..3).map(|e| e == d).collect();
            let s = values::<f64>(
                &run_with(&SoftmaxKernel, attrs(&[d as i64], &[]), vec![tensor(&shape, &vals)], &[]).unwrap()
                    [0],
            );
            let l = values::<f64>(
                &run_with(&LogSoftmaxKernel, attrs(&[d as i64 - 3], &[]), vec![tensor(&shape, &vals)], &[])
                    .unwrap()[0],
            );
            // Each group of the outputs, in the same order as the input's groups.
            let (gs, gl, gx) =
                (groups(&shape, &reduced, &s), groups(&shape, &reduced, &l), groups(&shape, &reduced, &vals));
            for ((s, l), x) in gs.iter().zip(&gl).zip(&gx) {
                let m = x.iter().copied().fold(f64::MIN, f64::max);
                let z: f64 = x.iter().map(|v| (v - m).exp()).sum();
                for i in 0..x.len() {
                    assert!(close(s[i], (x[i] - m).exp() / z, 1e-12));
                    assert!(close(l[i], x[i] - m - z.ln(), 1e-12));
                }
                assert!(close(s.iter().sum::<f64>(), 1.0, 1e-12));
            }
        }
    }
    // Large logits do not overflow; a NaN makes its row NaN; f16 computes in f32.
    let x = tensor(&[2, 2], &[1000.0f32, 1000.0, f32::NAN, 0.0]);
    let s = values::<f32>(&run_with(&SoftmaxKernel, attrs(&[1], &[]), vec![x], &[]).unwrap()[0]);
    assert_eq!(&s[..2], &[0.5, 0.5]);
    assert!(s[2].is_nan() && s[3].is_nan());
    let h = tensor(&[2], &[f16::from_f32(0.0), f16::from_f32(0.0)]);
    assert_eq!(
        values::<f16>(&run_with(&LogSoftmaxKernel, attrs(&[0], &[]), vec![h], &[]).unwrap()[0]),
        vec![f16::from_f32(-std::f32::consts::LN_2); 2]
    );
    assert!(run_with(&SoftmaxKernel, attrs(&[0], &[]), vec![tensor(&[2], &[1i64, 2])], &[]).is_err());
}

#[test]
fn layer_norm_matches_the_reference() {
    let mut rng = Rng(3);
    let shape = [3usize, 4, 5];
    let vals: Vec<f64> = (0..60).map(|_| rng.float() * 5.0).collect();
    let w: Vec<f64> = (0..60).map(|_| rng.float()).collect();
    let b: Vec<f64> = (0..60).map(|_| rng.float()).collect();
    let eps = 1e-5;
    for (k, with_w, with_b) in
        [(1usize, false, false), (2, true, true), (2, true, false), (1, false, true), (3, true, true)]
    {
        let n: usize = shape[3 - k..].iter().product();
        let mut inputs = vec![tensor(&shape, &vals)];
        if with_w {
            inputs.push(tensor(&shape[3 - k..], &w[..n]));
        }
        if with_b {
            inputs.push(tensor(&shape[3 - k..], &b[..n]));
        }
        let a = attrs(&[k as i64, i64::from(with_w), i64::from(with_b)], &[Scalar::Float(eps)]);
        let got = values::<f64>(&run_with(&LayerNormKernel, a, inputs, &[]).unwrap()[0]);
        for (g, chunk) in got.chunks(n).zip(vals.chunks(n)) {
            let m = chunk.iter().sum::<f64>() / n as f64;
            let v = chunk.iter().map(|x| (x - m) * (x - m)).sum::<f64>() / n as f64;
            for j in 0..n {
                let mut y = (chunk[j] - m) / (v + eps).sqrt();
                if with_w {
                    y *= w[j];
                }
                if with_b {
                    y += b[j];
                }
                assert!(close(g[j], y, 1e-12), "{g:?}");
            }
        }
    }
    let a = attrs(&[1, 1, 0], &[Scalar::Float(eps)]);
    let err =
        run_with(&LayerNormKernel, a, vec![tensor(&shape, &vals), tensor(&[4], &w[..4])], &[]).unwrap_err();
    assert!(err.contains("normalized shape"), "{err}");
}

#[test]
fn nll_loss_picks_the_targets_log_probabilities() {
    // logp [3, 2, 2] (N, C, d); targets [3, 2].
    let logp: Vec<f64> = (0..12).map(|i| -(i as f64) * 0.25).collect();
    let targets = [0i64, 1, 1, -100, 0, 1];
    let pick = |n: usize, j: usize, c: usize| logp[n * 4 + c * 2 + j];
    let mut losses = vec![];
    let weight = [2.0f64, 0.5];
    let mut wsum = 0.0;
    let mut wloss = 0.0;
    for n in 0..3 {
        for j in 0..2 {
            let t = targets[n * 2 + j];
            if t == -100 {
                losses.push(0.0);
                continue;
            }
            losses.push(-pick(n, j, t as usize));
            wloss += -pick(n, j, t as usize) * weight[t as usize];
            wsum += weight[t as usize];
        }
    }
    let run = |r: i64, w: bool| {
        let mut ins = vec![tensor(&[3, 2, 2], &logp), tensor(&[3, 2], &targets)];
        if w {
            ins.push(tensor(&[2], &weight));
        }
        let out = run_with(&NllLossKernel, attrs(&[r, -100, i64::from(w)], &[]), ins, &[]).unwrap();
        (out[0].0.shape.to_vec(), values::<f64>(&out[0]))
    };
    assert_eq!(run(0, false), (vec![3, 2], losses.clone()));
    let total: f64 = losses.iter().sum();
    assert!(close(run(2, false).1[0], total, 1e-15));
    assert!(close(run(1, false).1[0], total / 5.0, 1e-15));
    assert!(close(run(1, true).1[0], wloss / wsum, 1e-15));
    // Out of range targets fail the call; every target ignored gives NaN for the mean.
    let bad = vec![tensor(&[2, 3], &[0.0f32; 6]), tensor(&[2], &[0i64, 3])];
    let err = run_with(&NllLossKernel, attrs(&[1, -100, 0], &[]), bad, &[]).unwrap_err();
    assert!(err.contains("out of bounds"), "{err}");
    let ignored = vec![tensor(&[2, 3], &[0.0f32; 6]), tensor(&[2], &[-100i64, -100])];
    let v = values::<f32>(&run_with(&NllLossKernel, attrs(&[1, -100, 0], &[]), ignored, &[]).unwrap()[0]);
    assert!(v[0].is_nan());
    let wrong = vec![tensor(&[2, 3], &[0.0f32; 6]), tensor(&[3], &[0i64, 1, 2])];
    assert!(run_with(&NllLossKernel, attrs(&[1, -100, 0], &[]), wrong, &[]).is_err());
}

/// The two ways of reading groups (whole groups, or blocks of groups element by element)
/// give the same bits: sums of short and long groups (the partial sums above 4096), the
/// extremes and their indices, over transposed views.
#[test]
fn blocks_and_whole_groups_agree_bit_for_bit() {
    let mut rng = Rng(99);
    for (shape, stored) in [
        (vec![3usize, 5000], vec![5000usize, 3]),
        (vec![7, 6, 5], vec![5, 6, 7]),
        (vec![40, 130], vec![130, 40]),
        (vec![43, 130], vec![43, 130]),
        (vec![9, 3, 5], vec![9, 3, 5]),
    ] {
        let n: usize = shape.iter().product();
        let vals: Vec<f32> = (0..n).map(|_| (rng.below(7) as f32 - 3.0) * (rng.float() as f32)).collect();
        let t = tensor(&[n], &vals);
        let strides: Vec<isize> = if stored == shape {
            crate::vm::contiguous_strides(&shape).to_vec()
        } else {
            crate::vm::contiguous_strides(&stored).iter().rev().copied().collect()
        };
        let meta = t.0.with_layout(&shape, &strides, 0);
        let a = Operand::input(&meta, &t.1, 0, DType::F32).unwrap();
        for dims in subsets(shape.len()).into_iter().skip(1) {
            let reduced: Vec<bool> = (0..shape.len() as i64).map(|d| dims.contains(&d)).collect();
            let mut whole = Vec::new();
            let mut ext = Vec::new();
            for_each_group::<f32>(&a, &reduced, |xs| {
                whole.push(sum_of(xs).to_bits());
                ext.push(extreme(xs, true));
            })
            .unwrap();
            let blocks: Vec<u32> =
                block_sums::<f32>(&a, &reduced, |v, _| v).unwrap().iter().map(|v| v.to_bits()).collect();
            assert_eq!(blocks, whole, "{shape:?} {dims:?}");
            let be = block_extremes::<f32>(&a, &reduced, true).unwrap();
            assert_eq!(
                be.iter().map(|p| (p.0.to_bits(), p.1)).collect::<Vec<_>>(),
                ext.iter().map(|p| (p.0.to_bits(), p.1)).collect::<Vec<_>>()
            );
        }
    }
}

/// The ops whose `infer` needs a parameter list (so `framework::ops_table`'s probe cannot
/// call them) accept exactly the dtypes they declare.
#[test]
fn ops_with_parameter_lists_accept_their_declared_dtypes() {
    use crate::ep::DeviceId;
    let meta = |shape: &[usize], d: DType| TensorMeta::new(shape, d, DeviceId::CPU);
    for d in DType::ALL {
        let x = meta(&[2, 3], d);
        let accepts = |k: &dyn OpKernel, inputs: &[&TensorMeta], a: Attrs| {
            let mut out = OutSpecs::new();
            let ok = k.infer(inputs, &[], &a, &mut out).is_ok();
            assert_eq!(ok, k.dtypes().contains(&d), "{} of {d}", k.name());
        };
        for k in [&CumsumKernel as &dyn OpKernel, &CumprodKernel, &SoftmaxKernel, &LogSoftmaxKernel] {
            accepts(k, &[&x], attrs(&[1], &[]));
        }
        let w = meta(&[3], d);
        accepts(&LayerNormKernel, &[&x, &w, &w], attrs(&[1, 1, 1], &[Scalar::Float(1e-5)]));
        let t = meta(&[2], DType::I64);
        let cw = meta(&[3], d);
        accepts(&NllLossKernel, &[&x, &t, &cw], attrs(&[1, -100, 1], &[]));
    }
}
