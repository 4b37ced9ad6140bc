//! Element-wise reductions over host buffers, as host backends combine ranks' values.
//!
//! The buffers are the tensors' bytes in native byte order. Sums are taken in rank order
//! (`((r0 + r1) + r2) + ...`), so a host backend's result is the same bit for bit however
//! its ranks arrive; the property tests compare it with a sequential interpreter that adds
//! in the same order.

use super::{ReduceOp, ScalarType};

/// `acc[i] = acc[i] op x[i]` for every element (`Mean` accumulates as `Sum`; finish it with
/// [`finish`]).
pub fn combine(acc: &mut [u8], x: &[u8], dtype: ScalarType, op: ReduceOp) {
    debug_assert_eq!(acc.len(), x.len());
    match dtype {
        ScalarType::F32 => {
            for (a, b) in acc.chunks_exact_mut(4).zip(x.chunks_exact(4)) {
                let (l, r) = (
                    f32::from_ne_bytes(a[..4].try_into().unwrap()),
                    f32::from_ne_bytes(b.try_into().unwrap()),
                );
                let v = match op {
                    ReduceOp::Sum | ReduceOp::Mean => l + r,
                    ReduceOp::Max => max_f32(l, r),
                    ReduceOp::Min => min_f32(l, r),
                };
                a.copy_from_slice(&v.to_ne_bytes());
            }
        }
        ScalarType::I64 => {
            for (a, b) in acc.chunks_exact_mut(8).zip(x.chunks_exact(8)) {
                let (l, r) = (
                    i64::from_ne_bytes(a[..8].try_into().unwrap()),
                    i64::from_ne_bytes(b.try_into().unwrap()),
                );
                let v = match op {
                    ReduceOp::Sum | ReduceOp::Mean => l.wrapping_add(r),
                    ReduceOp::Max => l.max(r),
                    ReduceOp::Min => l.min(r),
                };
                a.copy_from_slice(&v.to_ne_bytes());
            }
        }
    }
}

/// Finish a reduction of `ranks` contributions: divide by `ranks` for `Mean`, nothing for
/// the others. `Mean` of integers is refused before a collective is issued.
pub fn finish(acc: &mut [u8], dtype: ScalarType, op: ReduceOp, ranks: usize) {
    if op != ReduceOp::Mean {
        return;
    }
    if let ScalarType::F32 = dtype {
        let n = ranks as f32;
        for a in acc.chunks_exact_mut(4) {
            let v = f32::from_ne_bytes(a[..4].try_into().unwrap()) / n;
            a.copy_from_slice(&v.to_ne_bytes());
        }
    }
}

/// The larger of two floats, NaN if either is (as NCCL and MPI propagate it on the GPU and
/// the host alike, rather than `f32::max`'s "the other one").
fn max_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.max(b)
    }
}

/// The smaller of two floats, NaN if either is.
fn min_f32(a: f32, b: f32) -> f32 {
    if a.is_nan() || b.is_nan() {
        f32::NAN
    } else {
        a.min(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_ne_bytes()).collect()
    }

    fn back(b: &[u8]) -> Vec<f32> {
        b.chunks_exact(4).map(|c| f32::from_ne_bytes(c.try_into().unwrap())).collect()
    }

    #[test]
    fn each_reduction_of_floats() {
        for (op, want) in [
            (ReduceOp::Sum, vec![5.0, -1.0]),
            (ReduceOp::Max, vec![4.0, 1.0]),
            (ReduceOp::Min, vec![1.0, -2.0]),
            (ReduceOp::Mean, vec![2.5, -0.5]),
        ] {
            let mut acc = f32s(&[1.0, 1.0]);
            combine(&mut acc, &f32s(&[4.0, -2.0]), ScalarType::F32, op);
            finish(&mut acc, ScalarType::F32, op, 2);
            assert_eq!(back(&acc), want, "{op:?}");
        }
    }

    #[test]
    fn integers_and_nan() {
        let mut acc: Vec<u8> = [3i64, -7].iter().flat_map(|x| x.to_ne_bytes()).collect();
        combine(
            &mut acc,
            &[5i64, 2].iter().flat_map(|x| x.to_ne_bytes()).collect::<Vec<_>>(),
            ScalarType::I64,
            ReduceOp::Max,
        );
        let got: Vec<i64> = acc.chunks_exact(8).map(|c| i64::from_ne_bytes(c.try_into().unwrap())).collect();
        assert_eq!(got, [5, 2]);
        let mut acc = f32s(&[f32::NAN, 0.0]);
        combine(&mut acc, &f32s(&[1.0, f32::NAN]), ScalarType::F32, ReduceOp::Max);
        assert!(back(&acc).iter().all(|x| x.is_nan()));
    }
}
