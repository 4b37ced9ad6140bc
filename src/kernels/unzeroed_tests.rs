//! The kernels that write their outputs whole (`OpKernel::writes_outputs`), whose outputs
//! the VM allocates without zeroing (`alloc::request`, "Unzeroed blocks"): which they are,
//! and a sweep that calls each of them on many operands, on zeroed outputs and on outputs
//! whose every byte is `0xFF`, and compares the two (`testing::run_with` makes both calls).
//! Every unit test of a kernel that calls it through `testing::run`/`run_with` makes the same
//! comparison on its own operands.

use super::testing::{run_with, tensor, Owned};
use super::BUILTINS;
use crate::vm::{bf16, f16, Attrs, DType, Element, Scalar, TensorMeta};

/// The built-in kernels that keep zeroed outputs: the diagnostics, which write nothing
/// (`noop`) or fail, and `nonzero`, whose output the caller sizes from a count it read
/// earlier (it writes every element when that count holds; a rare op, left zeroed).
const ZEROED: &[&str] = &["noop", "fail", "panic", "nonzero"];

#[test]
fn every_built_in_kernel_but_the_listed_ones_writes_its_outputs_whole() {
    let zeroed: Vec<&str> = BUILTINS.iter().filter(|k| !k.writes_outputs()).map(|k| k.name()).collect();
    assert_eq!(zeroed, ZEROED);
}

/// Deterministic values of `dtype`, `n` of them: floats of both signs with NaN, infinities
/// and signed zeros among them, integers 0 (a valid index and class for every dimension),
/// booleans of both values.
fn values(dtype: DType, n: usize, seed: u64) -> Vec<u8> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = || {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        s
    };
    let floats: Vec<f64> = (0..n)
        .map(|_| match next() % 16 {
            0 => f64::NAN,
            1 => f64::INFINITY,
            2 => -0.0,
            3 => 0.0,
            r => (r as f64 - 9.5) * 0.37 + (next() % 100) as f64 / 100.0,
        })
        .collect();
    match dtype {
        DType::F32 => f32::to_bytes(&floats.iter().map(|&x| x as f32).collect::<Vec<_>>()),
        DType::F64 => f64::to_bytes(&floats),
        DType::F16 => f16::to_bytes(&floats.iter().map(|&x| f16::from_f64(x)).collect::<Vec<_>>()),
        DType::BF16 => bf16::to_bytes(&floats.iter().map(|&x| bf16::from_f64(x)).collect::<Vec<_>>()),
        DType::I64 => i64::to_bytes(&vec![0; n]),
        DType::I32 => i32::to_bytes(&vec![0; n]),
        DType::U8 => (0..n).map(|_| (next() % 256) as u8).collect(),
        DType::Bool => (0..n).map(|_| (next() % 2) as u8).collect(),
    }
}

fn operand(shape: &[usize], dtype: DType, seed: u64) -> Owned {
    let n: usize = shape.iter().product();
    let mut t = tensor::<u8>(&[n * dtype.size()], &values(dtype, n, seed));
    t.0 = TensorMeta::new(shape, dtype, crate::ep::DeviceId::CPU);
    t
}

/// Calls of every opted-in kernel on inputs from a pool of shapes and dtypes (lists of up to
/// three) and attributes from a pool of the parameter lists the kernels take, each made by
/// `run_with` on zeroed and on `0xFF` outputs and compared; every such kernel is called
/// successfully at least once.
#[test]
fn kernels_that_write_outputs_whole_give_the_same_bytes_on_dirty_outputs() {
    use DType::*;
    let pool: Vec<(&[usize], DType)> = vec![
        (&[2, 3], F32),
        (&[3], F32),
        (&[], F32),
        (&[2, 1], F32),
        (&[2, 3, 4], F32),
        (&[1, 2, 5, 5], F32),
        (&[3, 2, 3, 3], F32),
        (&[0, 3], F32),
        (&[2, 3], F16),
        (&[2, 3], F64),
        (&[2, 3], I64),
        (&[2], I64),
        (&[], I64),
        (&[2, 3], I32),
        (&[2, 3], U8),
        (&[2, 3], Bool),
        (&[1, 2, 3, 4], F32),
        (&[1, 2, 4, 4], F32),
        (&[1, 1, 3, 4], Bool),
    ];
    // The lists of three inputs come from the first few (and the index and mask ones).
    let triples: Vec<usize> = vec![0, 1, 2, 3, 10, 11, 15, 16];
    let params = |ints: &[i64], scalars: &[Scalar]| Attrs::default().with_params(ints, scalars).unwrap();
    let f = Scalar::Float;
    let attrs: Vec<Attrs> = vec![
        Attrs::default(),
        Attrs::scalar(0.5),
        Attrs::integer(2),
        Attrs::default().with_dtype(F64),
        Attrs::default().with_dtype(I32),
        Attrs::default().with_dtype(Bool),
        Attrs::transposed(true, false),
        Attrs::transposed(false, true),
        params(&[0], &[]),
        params(&[1], &[]),
        params(&[-1], &[]),
        params(&[3], &[]),
        params(&[1, 1], &[]),
        params(&[0, 0], &[]),
        params(&[2, 3], &[]),
        params(&[0, 1], &[]),
        params(&[0, 2], &[]),
        params(&[0, 0, 0], &[]),
        params(&[0, 1, 0], &[]),
        params(&[1, 1, 1], &[f(1e-5)]),
        params(&[1, -100, 0], &[]),
        params(&[0, 1, 1], &[]),
        params(&[1], &[f(0.0)]),
        params(&[0], &[f(2.0)]),
        params(&[0], &[f(0.5)]),
        params(&[1], &[f(0.5)]),
        params(&[1, 1, 0, 0, 0, 0, 1, 1, 1], &[]),
        params(&[2, 2, 1, 1, 1, 1, 1, 1, 1], &[]),
        params(&[2, 2, 2, 2, 0, 0, 1, 1, 0], &[]),
        params(&[3, 3, 2, 2, 1, 1, 1, 1, 1], &[]),
        params(&[2, 2, 1, 1, 0, 0, 0, 1, 0], &[]),
        params(&[3, 3, 2, 2, 1, 1, 1, 0, 0], &[]),
    ];
    let mut calls: Vec<Vec<usize>> = vec![vec![]];
    calls.extend((0..pool.len()).map(|i| vec![i]));
    for i in 0..pool.len() {
        calls.extend((0..pool.len()).map(|j| vec![i, j]));
    }
    for &i in &triples {
        for &j in &triples {
            calls.extend(triples.iter().map(|&k| vec![i, j, k]));
        }
    }
    let given = [TensorMeta::new(&[2, 3], F32, crate::ep::DeviceId::CPU)];
    let mut missed = Vec::new();
    for k in BUILTINS.iter().filter(|k| k.writes_outputs()) {
        let mut ran = 0;
        'calls: for call in &calls {
            for (a, &attrs) in attrs.iter().enumerate() {
                let metas: Vec<TensorMeta> = call
                    .iter()
                    .map(|&i| TensorMeta::new(pool[i].0, pool[i].1, crate::ep::DeviceId::CPU))
                    .collect();
                let refs: Vec<&TensorMeta> = metas.iter().collect();
                let giv: &[TensorMeta] = if call.is_empty() { &given } else { &[] };
                let giv_refs: Vec<&TensorMeta> = giv.iter().collect();
                if k.infer(&refs, &giv_refs, &attrs, &mut Default::default()).is_err() {
                    continue;
                }
                let inputs: Vec<Owned> = call
                    .iter()
                    .enumerate()
                    .map(|(j, &i)| operand(pool[i].0, pool[i].1, (j * 131 + a * 7 + i) as u64))
                    .collect();
                // `run_with` compares the call on zeroed and on dirty outputs.
                if run_with(*k, attrs, inputs, giv).is_ok() {
                    ran += 1;
                    if ran == 24 {
                        break 'calls;
                    }
                }
            }
        }
        if ran == 0 {
            missed.push(k.name());
        }
    }
    assert!(missed.is_empty(), "no call of the pool ran: {missed:?}");
}
