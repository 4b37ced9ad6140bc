//! The pointwise ops of two and three inputs (`pow`, `atan2`, the rounding divisions, the
//! logical ops, `where`, `clamp`, `lerp`, `addcmul`, `addcdiv` and their scalar forms) and
//! the structured and indexing ops (`tril`, `triu`, `one_hot`, `cat`, `index_select`,
//! `gather`, `scatter`, `index_add`, `index`, `index_put`) on `cuda:0` against the CPU kernels, over every dtype
//! each takes and every layout of `kernels::LAYS` (contiguous, offset, stepped, transposed,
//! broadcast, reversed), with 0-d and empty tensors and NaN, ±inf, -0.0, subnormals and the
//! integer extremes among the values. Bit for bit (NaNs equal whatever their payload) but
//! `pow` and `atan2` of floats, which use CUDA's `pow` and `atan2` (within 4 units in the
//! last place of the CPU's; for `f16` and `bf16` also one step of the 16-bit type).
//!
//! Integer divisors are kept from zero and indices inside their range, where the CPU
//! kernels fail the call (the CUDA kernels give 0 and skip, `docs/cuda.md`).

use eagervm::framework::Scalar;
use eagervm::prelude::*;

use super::kernels::{call, make_mapped, within_ulps, Lay, LAYS};
use super::reference::Vals;
use super::{gpu_vm, lock};

const GPU: DeviceId = DeviceId::cuda(0);

/// What an input's values are kept to.
#[derive(Debug, Clone, Copy)]
enum Keep {
    /// Any value of the dtype.
    Any,
    /// An index in `0..n` (the values taken modulo `n`).
    Below(i64),
    /// An index in `-n..n` (negative ones count from the end).
    Signed(i64),
    /// Not zero (an integer 0 becomes 1).
    NonZero,
}

impl Keep {
    fn apply(self, v: Scalar) -> Scalar {
        match (self, v) {
            (Keep::Below(n), v) => Scalar::Int(v.as_i64().rem_euclid(n)),
            (Keep::Signed(n), v) => Scalar::Int(v.as_i64().rem_euclid(2 * n) - n),
            (Keep::NonZero, Scalar::Int(0)) => Scalar::Int(1),
            _ => v,
        }
    }
}

/// One input of a call.
#[derive(Debug, Clone, Copy)]
struct In {
    dtype: DType,
    shape: &'static [usize],
    lay: Lay,
    keep: Keep,
}

fn any(dtype: DType, shape: &'static [usize], lay: Lay) -> In {
    In { dtype, shape, lay, keep: Keep::Any }
}

fn index(dtype: DType, shape: &'static [usize], lay: Lay, below: i64) -> In {
    In { dtype, shape, lay, keep: Keep::Below(below) }
}

/// Calls on `cuda:0` and the CPU over the same storages, compared.
struct Runner {
    vm: VirtualMachine,
    calls: usize,
}

impl Runner {
    fn new() -> Runner {
        Runner { vm: gpu_vm(), calls: 0 }
    }

    /// `op` on `inputs` with `attrs` on both devices: equal bit for bit, or within `ulps`.
    fn run(&mut self, op: &str, inputs: &[In], attrs: Attrs, seed: u64, ulps: Option<f64>) {
        let vm = &self.vm;
        let on = |device: DeviceId| {
            let ts: Vec<Tensor> = inputs
                .iter()
                .enumerate()
                .map(|(i, x)| {
                    let keep = x.keep;
                    let map = move |v: Scalar| keep.apply(v);
                    // Values kept as they are (NaN payloads too) unless the input limits them.
                    let map: Option<&dyn Fn(Scalar) -> Scalar> =
                        if matches!(keep, Keep::Any) { None } else { Some(&map) };
                    make_mapped(vm, x.dtype, x.shape, x.lay, device, seed + i as u64, true, map).0
                })
                .collect();
            let refs: Vec<&Tensor> = ts.iter().collect();
            call(vm, op, &refs, None, attrs, device).and_then(|t| Ok((Vals::read(&t)?, t.shape().to_vec())))
        };
        let what = format!("{op} {inputs:?} with {attrs:?}");
        let (gpu, gpu_shape) = on(GPU).unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
        let (cpu, cpu_shape) = on(DeviceId::CPU).unwrap_or_else(|e| panic!("{what} on cpu:0: {e}"));
        assert_eq!(gpu_shape, cpu_shape, "{what}: the output's shape");
        match ulps {
            Some(u) if gpu.dtype.is_floating() => {
                assert_eq!((gpu.dtype, gpu.len()), (cpu.dtype, cpu.len()), "{what}");
                for i in 0..gpu.len() {
                    let (g, c) = (gpu.get(i).as_f64(), cpu.get(i).as_f64());
                    assert!(within_ulps(gpu.dtype, g, c, u), "{what}: element {i}: cuda:0 {g}, cpu:0 {c}");
                }
            }
            _ => {
                if let Some(d) = gpu.first_difference(&cpu) {
                    panic!("{what}: cuda:0 differs from the CPU kernel at {d}");
                }
            }
        }
        self.calls += 1;
    }

    fn report(self, what: &str) {
        println!("{what}: {} calls on cuda:0 agree with the CPU kernels", self.calls);
        assert!(self.calls > 0, "{what}: nothing ran");
        self.vm.sync().unwrap();
    }
}

const NUMERIC: [DType; 7] =
    [DType::U8, DType::I32, DType::I64, DType::F16, DType::BF16, DType::F32, DType::F64];
const FLOATING: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

/// Shapes of two broadcast operands: equal, broadcast either way, 0-d, empty, and one
/// large enough for several blocks.
const PAIRS: [(&[usize], &[usize]); 6] = [
    (&[5, 7], &[5, 7]),
    (&[5, 7], &[7]),
    (&[5, 1], &[1, 7]),
    (&[], &[5, 7]),
    (&[0, 3], &[3]),
    (&[3, 300], &[300]),
];

/// Shapes of three operands broadcast together.
const TRIPLES: [(&[usize], &[usize], &[usize]); 5] = [
    (&[5, 7], &[5, 7], &[5, 7]),
    (&[5, 1], &[1, 7], &[7]),
    (&[], &[5, 7], &[7]),
    (&[0, 3], &[3], &[1, 3]),
    (&[2, 3, 70], &[3, 70], &[2, 1, 70]),
];

/// The layouts of operand `k` of call `j`: every layout in turn, the operands offset.
fn lay(j: usize, k: usize) -> Lay {
    LAYS[(j + 2 * k) % LAYS.len()]
}

#[test]
#[ignore = "needs a GPU"]
fn binary_pointwise_ops_match_the_cpu_kernels() {
    let _g = lock();
    let mut r = Runner::new();
    let ops: [(&str, &[DType]); 9] = [
        ("pow", &NUMERIC),
        ("atan2", &FLOATING),
        ("div_floor", &NUMERIC),
        ("div_trunc", &NUMERIC),
        ("remainder", &NUMERIC),
        ("fmod", &NUMERIC),
        ("logical_and", &DType::ALL),
        ("logical_or", &DType::ALL),
        ("logical_xor", &DType::ALL),
    ];
    for (k, (op, dtypes)) in ops.iter().enumerate() {
        let ulps = matches!(*op, "pow" | "atan2").then_some(4.0);
        let divides = op.starts_with("div") || matches!(*op, "remainder" | "fmod");
        for &d in dtypes.iter() {
            // Every layout of each operand on equal shapes, then the other shapes.
            let cases = (0..LAYS.len()).map(|j| (PAIRS[0], j)).chain(PAIRS.iter().skip(1).map(|&p| (p, 1)));
            for (j, ((sa, sb), l)) in cases.enumerate() {
                let a = any(d, sa, lay(l + j, 0));
                let mut b = any(d, sb, lay(l + j, 1));
                if divides {
                    b.keep = Keep::NonZero;
                }
                r.run(op, &[a, b], Attrs::default(), (k * 1000 + j) as u64, ulps);
            }
        }
    }
    for (j, &d) in NUMERIC.iter().enumerate() {
        for (v, attrs) in [Attrs::integer(3), Attrs::integer(-2), Attrs::integer(0), Attrs::scalar(0.5)]
            .into_iter()
            .enumerate()
        {
            let x = any(d, &[5, 7], lay(j + v, 0));
            r.run("pow_scalar", &[x], attrs, (j * 10 + v) as u64, Some(4.0));
        }
    }
    for (j, &d) in FLOATING.iter().enumerate() {
        for (v, w) in [0.25, 0.75, -1.5].into_iter().enumerate() {
            for (s, (sa, sb)) in PAIRS.iter().enumerate() {
                let (a, b) = (any(d, sa, lay(s + v, 0)), any(d, sb, lay(s + v, 1)));
                r.run("lerp_scalar", &[a, b], Attrs::scalar(w), (j * 100 + v * 10 + s) as u64, None);
            }
        }
    }
    r.report("pointwise ops of two inputs");
}

#[test]
#[ignore = "needs a GPU"]
fn ternary_ops_match_the_cpu_kernels() {
    let _g = lock();
    let mut r = Runner::new();
    for (j, (sa, sb, sc)) in TRIPLES.iter().enumerate() {
        for (i, &d) in DType::ALL.iter().enumerate() {
            let l = i + j;
            let cond = any(DType::Bool, sa, lay(l, 0));
            let (x, y) = (any(d, sb, lay(l, 1)), any(d, sc, lay(l, 2)));
            r.run("where", &[cond, x, y], Attrs::default(), (j * 10 + i) as u64, None);
        }
        for (i, &d) in NUMERIC.iter().enumerate() {
            let l = i + j;
            let ins = [any(d, sa, lay(l, 0)), any(d, sb, lay(l, 1)), any(d, sc, lay(l, 2))];
            r.run("clamp", &ins, Attrs::default(), (100 + j * 10 + i) as u64, None);
            let value = if d.is_floating() { Attrs::scalar(0.5) } else { Attrs::integer(3) };
            r.run("addcmul", &ins, value, (200 + j * 10 + i) as u64, None);
        }
        for (i, &d) in FLOATING.iter().enumerate() {
            let l = i + j + 1;
            let ins = [any(d, sa, lay(l, 0)), any(d, sb, lay(l, 1)), any(d, sc, lay(l, 2))];
            r.run("lerp", &ins, Attrs::default(), (300 + j * 10 + i) as u64, None);
            r.run("addcdiv", &ins, Attrs::scalar(-1.5), (400 + j * 10 + i) as u64, None);
        }
    }
    let bounds: [(&[i64], &[Scalar]); 4] = [
        (&[1, 1], &[Scalar::Float(-2.5), Scalar::Float(3.0)]),
        (&[1, 0], &[Scalar::Int(-3)]),
        (&[0, 1], &[Scalar::Float(0.5)]),
        // min above max: max.
        (&[1, 1], &[Scalar::Int(4), Scalar::Int(-1)]),
    ];
    for (v, (ints, scalars)) in bounds.iter().enumerate() {
        let attrs = Attrs::default().with_params(ints, scalars).unwrap();
        for (i, &d) in NUMERIC.iter().enumerate() {
            for (j, shape) in [&[5usize, 7][..], &[], &[0, 3], &[700]].into_iter().enumerate() {
                let x = any(d, shape, lay(i + j + v, 0));
                r.run("clamp_scalar", &[x], attrs, (v * 100 + i * 10 + j) as u64, None);
            }
        }
    }
    r.report("pointwise ops of three inputs");
}

#[test]
#[ignore = "needs a GPU"]
fn tril_triu_and_one_hot_match_the_cpu_kernels() {
    let _g = lock();
    let mut r = Runner::new();
    let shapes: [&[usize]; 5] = [&[5, 7], &[7, 5], &[2, 3, 4], &[0, 3], &[40, 30]];
    for op in ["tril", "triu"] {
        for (i, &d) in DType::ALL.iter().enumerate() {
            for (j, shape) in shapes.into_iter().enumerate() {
                for k in [0, 2, -1] {
                    let attrs = Attrs::default().with_params(&[k], &[]).unwrap();
                    let x = any(d, shape, lay(i + j + k.unsigned_abs() as usize, 0));
                    r.run(op, &[x], attrs, (i * 100 + j * 10) as u64, None);
                }
            }
        }
    }
    let classes = Attrs::default().with_params(&[6], &[]).unwrap();
    for (j, &l) in LAYS.iter().enumerate() {
        for shape in [&[5usize, 7][..], &[], &[0], &[400]] {
            r.run("one_hot", &[index(DType::I64, shape, l, 6)], classes, j as u64, None);
        }
    }
    let none = Attrs::default().with_params(&[0], &[]).unwrap();
    r.run("one_hot", &[index(DType::I64, &[0], Lay::Contiguous, 1)], none, 7, None);
    r.report("tril, triu and one_hot");
}

#[test]
#[ignore = "needs a GPU"]
fn indexing_ops_match_the_cpu_kernels() {
    let _g = lock();
    let mut r = Runner::new();
    let dim = |d: i64| Attrs::default().with_params(&[d], &[]).unwrap();
    let cats: [(&[&'static [usize]], i64); 6] = [
        (&[&[2, 3], &[4, 3]], 0),
        (&[&[3, 2], &[3, 5]], 1),
        (&[&[3, 2], &[3, 5], &[3, 1]], -1),
        (&[&[0], &[2, 3]], 0),
        (&[&[0, 3], &[2, 3], &[1, 3]], 0),
        (&[&[5], &[300]], 0),
    ];
    for (i, &d) in DType::ALL.iter().enumerate() {
        for (j, (shapes, at)) in cats.iter().enumerate() {
            let ins: Vec<In> = shapes.iter().enumerate().map(|(k, &s)| any(d, s, lay(i + j, k))).collect();
            r.run("cat", &ins, dim(*at), (i * 10 + j) as u64, None);
        }
    }
    for (i, &d) in DType::ALL.iter().enumerate() {
        for (t, ix) in [DType::I64, DType::I32].into_iter().enumerate() {
            let l = |k: usize| lay(i + t, k);
            let seed = (i * 100 + t * 10) as u64;
            // index_select: along each dim, a 0-d index, a 0-d input, across blocks.
            let selects: [(In, In, i64); 6] = [
                (any(d, &[5, 7], l(0)), index(ix, &[4], l(1), 5), 0),
                (any(d, &[5, 7], l(1)), index(ix, &[6], l(2), 7), 1),
                (any(d, &[5, 7], l(2)), index(ix, &[3], l(0), 7), -1),
                (any(d, &[5, 7], l(3)), index(ix, &[], l(1), 5), 0),
                (any(d, &[], l(0)), index(ix, &[], l(0), 1), 0),
                (any(d, &[300, 4], l(4)), index(ix, &[500], l(3), 300), 0),
            ];
            for (k, (x, i, at)) in selects.into_iter().enumerate() {
                r.run("index_select", &[x, i], dim(at), seed + k as u64, None);
            }
            // gather: the index smaller than x but along dim.
            let gathers: [(In, In, i64); 5] = [
                (any(d, &[5, 7], l(0)), index(ix, &[3, 7], l(1), 5), 0),
                (any(d, &[5, 7], l(1)), index(ix, &[5, 4], l(2), 7), 1),
                (any(d, &[5, 7], l(2)), index(ix, &[2, 9], l(3), 7), -1),
                (any(d, &[], l(0)), index(ix, &[], l(0), 1), 0),
                (any(d, &[40, 30], l(4)), index(ix, &[60, 20], l(5), 40), 0),
            ];
            for (k, (x, i, at)) in gathers.into_iter().enumerate() {
                r.run("gather", &[x, i], dim(at), seed + 5 + k as u64, None);
            }
            // scatter, each reduction, with repeated indices.
            let scatters: [(In, In, In, i64); 4] = [
                (any(d, &[5, 7], l(0)), index(ix, &[3, 7], l(1), 5), any(d, &[4, 7], l(2)), 0),
                (any(d, &[5, 7], l(1)), index(ix, &[5, 4], l(2), 7), any(d, &[5, 6], l(3)), 1),
                (any(d, &[], l(0)), index(ix, &[], l(0), 1), any(d, &[], l(0)), 0),
                (any(d, &[30, 3], l(2)), index(ix, &[200, 3], l(4), 30), any(d, &[200, 3], l(5)), 0),
            ];
            for reduce in [0, 1, 2] {
                for (k, (x, i, s, at)) in scatters.into_iter().enumerate() {
                    let attrs = Attrs::default().with_params(&[at, reduce], &[]).unwrap();
                    r.run("scatter", &[x, i, s], attrs, seed + 20 + k as u64, None);
                }
            }
            // index_add, with repeated indices, alpha 1 and another.
            let adds: [(In, In, In, i64); 5] = [
                (any(d, &[5, 7], l(0)), index(ix, &[4], l(1), 5), any(d, &[4, 7], l(2)), 0),
                (any(d, &[5, 7], l(1)), index(ix, &[9], l(2), 7), any(d, &[5, 9], l(3)), 1),
                (any(d, &[5, 7], l(2)), index(ix, &[], l(0), 5), any(d, &[1, 7], l(4)), 0),
                (any(d, &[], l(0)), index(ix, &[], l(0), 1), any(d, &[], l(0)), 0),
                (any(d, &[30, 3], l(3)), index(ix, &[200], l(4), 30), any(d, &[200, 3], l(5)), 0),
            ];
            for (k, (x, i, s, at)) in adds.into_iter().enumerate() {
                r.run("index_add", &[x, i, s], dim(at), seed + 40 + k as u64, None);
                let alpha = if d.is_floating() { Scalar::Float(-2.5) } else { Scalar::Int(3) };
                let attrs = Attrs::default().with_params(&[at], &[alpha]).unwrap();
                r.run("index_add", &[x, i, s], attrs, seed + 50 + k as u64, None);
            }
        }
    }
    r.report("indexing ops");
}

#[test]
#[ignore = "needs a GPU"]
fn advanced_indexing_matches_the_cpu_kernels() {
    let _g = lock();
    let mut r = Runner::new();
    let signed = |dtype, shape, lay, n| In { dtype, shape, lay, keep: Keep::Signed(n) };
    for (i, &d) in DType::ALL.iter().enumerate() {
        for (t, (ix, iy)) in [(DType::I64, DType::I32), (DType::I32, DType::I64)].into_iter().enumerate() {
            let l = |k: usize| lay(i + t, k);
            let seed = (i * 100 + t * 50) as u64;
            // index: one tensor, two broadcast together, from a middle dimension, 0-d, large.
            let calls: [(Vec<In>, i64); 5] = [
                (vec![any(d, &[5, 7], l(0)), signed(ix, &[4], l(1), 5)], 0),
                (vec![any(d, &[5, 7], l(1)), index(ix, &[2, 1], l(2), 5), signed(iy, &[3], l(3), 7)], 0),
                (vec![any(d, &[3, 7, 2], l(2)), signed(ix, &[4], l(0), 7)], 1),
                (vec![any(d, &[5], l(3)), index(ix, &[], l(0), 5)], 0),
                (vec![any(d, &[40, 30], l(4)), index(ix, &[500], l(5), 40)], 0),
            ];
            for (k, (ins, d0)) in calls.into_iter().enumerate() {
                let attrs = Attrs::default().with_params(&[d0], &[]).unwrap();
                r.run("index", &ins, attrs, seed + k as u64, None);
            }
            // index_put, set and accumulate, with repeated indices.
            let puts: [(Vec<In>, i64, i64); 4] = [
                (vec![any(d, &[5, 7], l(0)), any(d, &[4, 7], l(1)), signed(ix, &[4], l(2), 5)], 0, 0),
                (
                    vec![
                        any(d, &[5, 7], l(1)),
                        any(d, &[2, 3], l(2)),
                        index(ix, &[2, 1], l(3), 5),
                        signed(iy, &[3], l(4), 7),
                    ],
                    0,
                    0,
                ),
                (vec![any(d, &[3, 7, 2], l(2)), any(d, &[3, 4, 2], l(3)), index(ix, &[4], l(0), 7)], 1, 1),
                (vec![any(d, &[6], l(3)), any(d, &[300], l(4)), signed(ix, &[300], l(5), 6)], 0, 0),
            ];
            for acc in [0, 1] {
                for (k, (ins, d0, strict)) in puts.iter().enumerate() {
                    let attrs = Attrs::default().with_params(&[*d0, acc, *strict], &[]).unwrap();
                    r.run("index_put", ins, attrs, seed + 10 + k as u64, None);
                }
            }
        }
    }
    r.report("index and index_put");
}

/// Whether `nonzero` counts `v` (`true`, any nonzero number, NaN).
fn is_nonzero(v: Scalar) -> bool {
    match v {
        Scalar::Bool(b) => b,
        Scalar::Int(i) => i != 0,
        Scalar::Float(f) => f != 0.0,
    }
}

/// `nonzero` into an output of the count's rows (the caller counts first, as the front
/// ends do with a read), on every dtype and layout, 0-d, empty and across chunks.
#[test]
#[ignore = "needs a GPU"]
fn nonzero_matches_the_cpu_kernel() {
    let _g = lock();
    let vm = gpu_vm();
    let mut calls = 0;
    let shapes: [&[usize]; 6] = [&[5, 7], &[33], &[2, 3, 4], &[], &[0, 3], &[70, 50]];
    for (i, &d) in DType::ALL.iter().enumerate() {
        for (j, shape) in shapes.into_iter().enumerate() {
            let (l, seed) = (lay(i + j, 0), (i * 10 + j) as u64);
            let (_, logical) = make_mapped(&vm, d, shape, l, DeviceId::CPU, seed, true, None);
            let n = (0..logical.len()).filter(|&k| is_nonzero(logical.get(k))).count();
            let rank = shape.len();
            let on = |device: DeviceId| {
                let (x, _) = make_mapped(&vm, d, shape, l, device, seed, true, None);
                let out =
                    Vals::of(DType::I64, vec![Scalar::Int(-1); n * rank]).tensor(&vm, &[n, rank], device);
                call(&vm, "nonzero", &[&x], Some(&out), Attrs::default(), device).and_then(|t| Vals::read(&t))
            };
            let what = format!("nonzero of {d}{shape:?} laid out {l:?}");
            let gpu = on(GPU).unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
            let cpu = on(DeviceId::CPU).unwrap_or_else(|e| panic!("{what} on cpu:0: {e}"));
            if let Some(diff) = gpu.first_difference(&cpu) {
                panic!("{what}: cuda:0 differs from the CPU kernel at {diff}");
            }
            calls += 1;
        }
    }
    println!("nonzero: {calls} calls on cuda:0 agree with the CPU kernel");
    assert!(calls > 0);
    vm.sync().unwrap();
}
