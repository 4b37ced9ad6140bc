//! The reductions along dims (`sum` with dims, `mean`, `prod`, `amax`, `amin`, `max`,
//! `min`, `argmax`, `argmin`, `all`, `any`, `var`, `std`, `logsumexp`, `norm`) and the ops
//! along one dimension (`softmax`, `log_softmax`, `cumsum`, `cumprod`, `layer_norm`) on
//! `cuda:0` against the CPU kernels, over every dtype each takes and every layout, with the
//! same storages on both devices.
//!
//! Bit for bit (any two NaNs equal): the extremes and their indices, `all`, `any`, the
//! integer and `bool` sums and products, the scans, and the floating ops without a
//! function of the math library (`sum`, `mean`, `prod`, `var`, `std`, `norm` of order 0, 1,
//! 2, ±inf, `layer_norm`) over groups of up to 16 elements, which one thread folds in the
//! CPU's order. Otherwise within `1e-5 · scale` (`1e-13` for `f64`) plus one rounding
//! step of the 16-bit dtypes, where `scale` bounds what the order or the math library can
//! change: `Σ|x|` for `sum`, `mean(|x|)` for `mean`, the result for the sums of positive
//! terms (`norm`, `softmax`, products of values near 1), the result plus the largest
//! magnitude in play for `logsumexp`, `log_softmax`, `var`, `std` and `layer_norm`.

use eagervm::framework::Scalar;
use eagervm::prelude::*;

use super::kernels::{make, Lay, LAYS};
use super::reference::{numel, Vals};
use super::{gpu_vm, lock};

const GPU: DeviceId = DeviceId::cuda(0);
const FLOATS: [DType; 4] = [DType::F16, DType::BF16, DType::F32, DType::F64];

/// The outputs (shape and values) of `op` on `device` over inputs made by `make` from
/// `seed` (the same storages on every device).
fn outputs(
    vm: &VirtualMachine,
    op: &str,
    inputs: &[(DType, &[usize], Lay)],
    attrs: Attrs,
    device: DeviceId,
    seed: u64,
    special: bool,
) -> Result<Vec<(Vec<usize>, Vals)>> {
    let made: Vec<Tensor> = inputs
        .iter()
        .enumerate()
        .map(|(i, &(d, shape, lay))| make(vm, d, shape, lay, device, seed + i as u64, special).0)
        .collect();
    let refs: Vec<&Tensor> = made.iter().collect();
    let (o, s) = (vm.op(op)?, vm.compute_stream(device)?);
    let ts = vm.run(|b| b.call_multi(o, &refs, attrs, s))?;
    ts.iter().map(|t| Vals::read(t).map(|v| (t.shape().to_vec(), v))).collect()
}

/// One CPU call's first output.
fn on_cpu(vm: &VirtualMachine, op: &str, inputs: &[&Tensor], attrs: Attrs) -> Vals {
    let (o, s) = (vm.op(op).unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
    let t = vm.run(|b| b.call(o, inputs, attrs, s)).unwrap_or_else(|e| panic!("{op} on the CPU: {e}"));
    Vals::read(&t).unwrap()
}

/// Whether `g` (cuda:0) is within `1e-5 · max(scale, |c|)` (`1e-13` for `f64`) of `c` (the
/// CPU), plus one rounding step of `d` where it is a 16-bit float; NaN where NaN, the same
/// infinity where one is infinite.
fn near(d: DType, g: f64, c: f64, scale: f64) -> bool {
    if g.is_nan() || c.is_nan() {
        return g.is_nan() && c.is_nan();
    }
    if g.is_infinite() || c.is_infinite() {
        return g == c;
    }
    let (acc, step, min_normal) = match d {
        DType::F64 => (1e-13, 0.0, 0.0),
        DType::F16 => (1e-5, 2f64.powi(-10), 2f64.powi(-14)),
        DType::BF16 => (1e-5, 2f64.powi(-7), f64::from(f32::MIN_POSITIVE)),
        _ => (1e-5, 0.0, 0.0),
    };
    (g - c).abs() <= acc * scale.abs().max(c.abs()) + step * c.abs().max(min_normal)
}

/// Compare the outputs of cuda:0 with the CPU's: bit for bit where `scale` is `None`, else
/// output 0 within [`near`] of `scale(i, c)` for element `i` of value `c`.
fn compare(
    what: &str,
    gpu: &[(Vec<usize>, Vals)],
    cpu: &[(Vec<usize>, Vals)],
    scale: Option<&dyn Fn(usize, f64) -> f64>,
) {
    assert_eq!(gpu.len(), cpu.len(), "{what}: the number of outputs");
    for (k, ((gs, g), (cs, c))) in gpu.iter().zip(cpu).enumerate() {
        assert_eq!(gs, cs, "{what}: the shape of output {k}");
        match scale {
            Some(f) if k == 0 => {
                assert_eq!((g.dtype, g.len()), (c.dtype, c.len()), "{what}");
                for i in 0..g.len() {
                    let (x, y) = (g.get(i).as_f64(), c.get(i).as_f64());
                    assert!(near(g.dtype, x, y, f(i, y)), "{what}: element {i}: cuda:0 {x}, cpu:0 {y}");
                }
            }
            _ => {
                if let Some(d) = g.first_difference(c) {
                    panic!("{what}: output {k}: cuda:0 differs from the CPU kernel at {d}");
                }
            }
        }
    }
}

/// The dims cases: the input's shape and the parameter list `[dims..., keepdim]`.
const DIMS: [(&[usize], &[i64]); 16] = [
    (&[5, 7], &[1, 0]),
    (&[5, 7], &[0, 1]),
    (&[5, 7], &[0]),
    (&[3, 4, 5], &[0, 2, 0]),
    (&[3, 4, 5], &[-1, -3, 1]),
    (&[], &[0]),
    (&[], &[0, 1]),
    (&[0, 3], &[0, 0]),
    (&[4, 0], &[0, 0]),
    (&[6, 300], &[1, 0]),
    (&[3, 2000], &[-1, 1]),
    (&[2000, 3], &[0, 0]),
    (&[33, 65], &[1, 0]),
    (&[1500, 5], &[1, 0]),
    (&[70, 40, 3], &[0, 2, 0]),
    (&[4, 3, 5], &[1, 2, 0]),
];

/// The layouts of an input of `n` elements: all of them for small inputs.
fn lays(n: usize) -> &'static [Lay] {
    if n <= 400 {
        &LAYS
    } else {
        &[Lay::Contiguous, Lay::Stepped, Lay::Transposed, Lay::Broadcast]
    }
}

/// The elements each group reduces under `ints` over `shape`.
fn group_len(shape: &[usize], ints: &[i64]) -> usize {
    let dims = &ints[..ints.len().saturating_sub(1)];
    if dims.is_empty() {
        return numel(shape);
    }
    let rank = shape.len().max(1) as i64;
    dims.iter().map(|&d| shape.get(((d + rank) % rank) as usize).copied().unwrap_or(1)).product()
}

/// The reductions, each with its scalars, the dtypes it takes, and whether it is exact at
/// any length on floats.
fn reductions() -> Vec<(&'static str, Vec<Scalar>, Vec<DType>, bool)> {
    let all = DType::ALL.to_vec();
    let numeric: Vec<DType> = DType::ALL.into_iter().filter(|&d| d != DType::Bool).collect();
    let f = FLOATS.to_vec();
    let p = |v: f64| vec![Scalar::Float(v)];
    vec![
        ("amax", vec![], all.clone(), true),
        ("amin", vec![], all.clone(), true),
        ("max", vec![], all.clone(), true),
        ("min", vec![], all.clone(), true),
        ("argmax", vec![], numeric.clone(), true),
        ("argmin", vec![], numeric, true),
        ("all", vec![], all.clone(), true),
        ("any", vec![], all.clone(), true),
        ("sum", vec![], all.clone(), false),
        ("prod", vec![], all, false),
        ("mean", vec![], f.clone(), false),
        ("var", vec![], f.clone(), false),
        ("var", p(0.0), f.clone(), false),
        ("std", vec![], f.clone(), false),
        ("std", p(2.0), f.clone(), false),
        ("logsumexp", vec![], f.clone(), false),
        ("norm", vec![], f.clone(), false),
        ("norm", p(1.0), f.clone(), false),
        ("norm", p(3.0), f.clone(), false),
        ("norm", p(0.0), f.clone(), true),
        ("norm", p(f64::INFINITY), f.clone(), true),
        ("norm", p(f64::NEG_INFINITY), f, true),
    ]
}

/// Whether `op` (with `scalars`) on floats of groups of `len` is computed in the CPU's
/// order with IEEE operations alone (module docs).
fn exact_at(op: &str, scalars: &[Scalar], len: usize) -> bool {
    let transcendental =
        op == "logsumexp" || (op == "norm" && scalars.first().is_some_and(|p| p.as_f64() == 3.0));
    len <= 16 && !transcendental
}

/// Every reduction along dims on every dtype it takes, every dims case and layout, against
/// the CPU kernel (module docs).
#[test]
#[ignore = "needs a GPU"]
fn reductions_along_dims_match_the_cpu_kernels() {
    let _g = lock();
    let vm = gpu_vm();
    let (mut exact, mut within, mut refused) = (0, 0, 0);
    for (k, (op, scalars, dtypes, always_exact)) in reductions().into_iter().enumerate() {
        for d in dtypes {
            for (j, &(shape, ints)) in DIMS.iter().enumerate() {
                let len = group_len(shape, ints);
                // Long products of floats overflow in an order-dependent way: products of
                // values near 1 are checked below.
                if op == "prod" && d.is_floating() && len > 16 {
                    continue;
                }
                let attrs = Attrs::default().with_params(ints, &scalars).unwrap();
                for (v, &lay) in lays(numel(shape)).iter().enumerate() {
                    for special in [true, false] {
                        let seed = (k * 10_000 + j * 100 + v * 2 + usize::from(special)) as u64;
                        let what =
                            format!("{op} {scalars:?} {d}{shape:?} {lay:?} dims {ints:?} special {special}");
                        let x = [(d, shape, lay)];
                        let cpu = outputs(&vm, op, &x, attrs, DeviceId::CPU, seed, special);
                        let gpu = outputs(&vm, op, &x, attrs, GPU, seed, special);
                        let cpu = match cpu {
                            Ok(c) => c,
                            Err(e) => {
                                assert!(gpu.is_err(), "{what}: the CPU refuses ({e}) but cuda:0 runs it");
                                refused += 1;
                                continue;
                            }
                        };
                        let gpu = gpu.unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
                        if always_exact || !d.is_floating() || exact_at(op, &scalars, len) {
                            compare(&what, &gpu, &cpu, None);
                            exact += 1;
                            continue;
                        }
                        // The scale of each output element (module docs), from the CPU.
                        let (cx, _) = make(&vm, d, shape, lay, DeviceId::CPU, seed, special);
                        let plain = Attrs::default().with_params(ints, &[]).unwrap();
                        let abs = || {
                            let (o, s) = (vm.op("abs").unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
                            vm.run(|b| b.call(o, &[&cx], Attrs::default(), s)).unwrap()
                        };
                        let of = |v: &Vals, i: usize| v.get(i).as_f64().abs();
                        let scale: Box<dyn Fn(usize, f64) -> f64> = match op {
                            "sum" => {
                                let m = on_cpu(&vm, "sum", &[&abs()], plain);
                                Box::new(move |i: usize, _: f64| of(&m, i))
                            }
                            "mean" => {
                                let m = on_cpu(&vm, "mean", &[&abs()], plain);
                                Box::new(move |i: usize, _: f64| of(&m, i))
                            }
                            "var" | "std" => {
                                let m = on_cpu(&vm, "mean", &[&abs()], plain);
                                let var = op == "var";
                                Box::new(move |i: usize, c: f64| {
                                    let a = of(&m, i);
                                    c.abs() + if var { a * a } else { a }
                                })
                            }
                            "logsumexp" => Box::new(|_: usize, c: f64| 1.0 + c.abs()),
                            _ => Box::new(|_: usize, c: f64| c.abs()),
                        };
                        compare(&what, &gpu, &cpu, Some(&*scale));
                        within += 1;
                    }
                }
            }
        }
    }
    // Long products of values near 1, in a fixed order on each device.
    for d in FLOATS {
        let vals =
            Vals::of(d, (0..6000).map(|i| Scalar::Float(1.0 + ((i * 37 % 201) as f64 - 100.0) / 1000.0)));
        for (shape, ints) in [(&[3usize, 2000][..], &[1i64, 0][..]), (&[2000, 3], &[0, 1]), (&[6000], &[0])] {
            let attrs = Attrs::default().with_params(ints, &[]).unwrap();
            let run = |device: DeviceId| {
                let t = vals.tensor(&vm, shape, device);
                let (o, s) = (vm.op("prod").unwrap(), vm.compute_stream(device).unwrap());
                let t = vm.run(|b| b.call(o, &[&t], attrs, s)).unwrap();
                vec![(t.shape().to_vec(), Vals::read(&t).unwrap())]
            };
            let what = format!("prod {d}{shape:?} dims {ints:?} of values near 1");
            compare(&what, &run(GPU), &run(DeviceId::CPU), Some(&|_: usize, c: f64| c.abs()));
            within += 1;
        }
    }
    // A dtype the op does not take is refused on cuda:0 as on the CPU.
    let (xi, _) = make(&vm, DType::I32, &[3, 4], Lay::Contiguous, GPU, 1, false);
    let (o, s) = (vm.op("mean").unwrap(), vm.compute_stream(GPU).unwrap());
    let attrs = Attrs::default().with_params(&[1, 0], &[]).unwrap();
    assert!(vm.run(|b| b.call(o, &[&xi], attrs, s)).is_err(), "mean of i32 on cuda:0");
    println!(
        "reductions along dims: {exact} calls on cuda:0 equal the CPU kernels bit for bit, {within} within \
         their tolerance; {refused} calls both refuse"
    );
    assert!(exact > 1000 && within > 100);
    vm.sync().unwrap();
}

/// `softmax`, `log_softmax`, `cumsum` and `cumprod` on every dtype each takes, along each
/// dimension of several shapes and every layout, against the CPU kernels: the scans bit
/// for bit (one thread per group, the CPU's order), the normalisations within the module's
/// tolerance.
#[test]
#[ignore = "needs a GPU"]
fn ops_along_one_dimension_match_the_cpu_kernels() {
    let _g = lock();
    let vm = gpu_vm();
    let cases: [(&[usize], i64); 11] = [
        (&[5, 7], 1),
        (&[5, 7], 0),
        (&[5, 7], -1),
        (&[], 0),
        (&[0, 3], 1),
        (&[3, 0], 1),
        (&[4, 300], 1),
        (&[2, 3000], -1),
        (&[3000, 2], 0),
        (&[6, 5, 40], 1),
        (&[40, 33], 1),
    ];
    let (mut exact, mut within) = (0, 0);
    for (k, op) in ["cumsum", "cumprod", "softmax", "log_softmax"].into_iter().enumerate() {
        let scan = op.starts_with("cum");
        let dtypes: &[DType] = if scan { &DType::ALL } else { &FLOATS };
        for &d in dtypes {
            for (j, &(shape, dim)) in cases.iter().enumerate() {
                let attrs = Attrs::default().with_params(&[dim], &[]).unwrap();
                for (v, &lay) in lays(numel(shape)).iter().enumerate() {
                    for special in [true, false] {
                        let seed = (k * 10_000 + j * 100 + v * 2 + usize::from(special)) as u64;
                        let what = format!("{op} {d}{shape:?} {lay:?} dim {dim} special {special}");
                        let x = [(d, shape, lay)];
                        let cpu = outputs(&vm, op, &x, attrs, DeviceId::CPU, seed, special)
                            .unwrap_or_else(|e| panic!("{what} on the CPU: {e}"));
                        let gpu = outputs(&vm, op, &x, attrs, GPU, seed, special)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        if scan {
                            compare(&what, &gpu, &cpu, None);
                            exact += 1;
                            continue;
                        }
                        // The largest finite magnitude of the input bounds the shift of
                        // `log_softmax` (`max + log(sum)`).
                        let (_, logical) = make(&vm, d, shape, lay, DeviceId::CPU, seed, special);
                        let big = (0..logical.len())
                            .map(|i| logical.get(i).as_f64().abs())
                            .filter(|a| a.is_finite())
                            .fold(0.0, f64::max);
                        let shift = if op == "log_softmax" { 2.0 * big + 1.0 } else { 0.0 };
                        compare(&what, &gpu, &cpu, Some(&|_: usize, c: f64| c.abs() + shift));
                        within += 1;
                    }
                }
            }
        }
    }
    println!(
        "ops along one dimension: {exact} calls on cuda:0 equal the CPU kernels bit for bit, {within} within \
         their tolerance"
    );
    assert!(exact > 100 && within > 100);
    vm.sync().unwrap();
}

/// `layer_norm` over the last 1 or 2 dimensions, with and without the weight and the bias
/// (each laid out in turn too), on every floating dtype and layout, against the CPU kernel:
/// bit for bit over groups of up to 16 elements, within the module's tolerance above.
#[test]
#[ignore = "needs a GPU"]
fn layer_norm_matches_the_cpu_kernel() {
    let _g = lock();
    let vm = gpu_vm();
    let cases: [(&[usize], usize); 7] = [
        (&[4, 6], 1),
        (&[3, 4, 5], 2),
        (&[5], 1),
        (&[3, 16], 1),
        (&[2, 3, 300], 1),
        (&[2, 2000], 1),
        (&[0, 4], 1),
    ];
    let (mut exact, mut within) = (0, 0);
    for d in FLOATS {
        for (j, &(shape, k)) in cases.iter().enumerate() {
            let tail = &shape[shape.len() - k..];
            let len = numel(tail);
            for (f, (hw, hb)) in
                [(false, false), (true, false), (true, true), (false, true)].into_iter().enumerate()
            {
                let eps = if f % 2 == 0 { 1e-5 } else { 0.1 };
                let attrs = Attrs::default()
                    .with_params(&[k as i64, i64::from(hw), i64::from(hb)], &[Scalar::Float(eps)])
                    .unwrap();
                for (v, &lay) in lays(numel(shape)).iter().enumerate() {
                    for special in [true, false] {
                        let seed = (j * 1000 + f * 100 + v * 2 + usize::from(special)) as u64;
                        let mut x = vec![(d, shape, lay)];
                        let params = LAYS[(v + f + 1) % LAYS.len()];
                        if hw {
                            x.push((d, tail, params));
                        }
                        if hb {
                            x.push((d, tail, LAYS[(v + f + 3) % LAYS.len()]));
                        }
                        let what = format!("layer_norm {d}{shape:?} k {k} {lay:?} weight {hw} bias {hb} eps {eps} special {special}");
                        let cpu = outputs(&vm, "layer_norm", &x, attrs, DeviceId::CPU, seed, special)
                            .unwrap_or_else(|e| panic!("{what} on the CPU: {e}"));
                        let gpu = outputs(&vm, "layer_norm", &x, attrs, GPU, seed, special)
                            .unwrap_or_else(|e| panic!("{what}: {e}"));
                        if len <= 16 {
                            compare(&what, &gpu, &cpu, None);
                            exact += 1;
                            continue;
                        }
                        // The bias's magnitude bounds what a different scale of the
                        // normalized value changes (module docs).
                        let big = x
                            .iter()
                            .enumerate()
                            .skip(1)
                            .map(|(i, &(d, s, l))| {
                                let (_, v) = make(&vm, d, s, l, DeviceId::CPU, seed + i as u64, special);
                                (0..v.len())
                                    .map(|e| v.get(e).as_f64().abs())
                                    .filter(|a| a.is_finite())
                                    .fold(0.0, f64::max)
                            })
                            .fold(1.0, f64::max);
                        let bound = big * (1.0 + (len as f64).sqrt());
                        compare(&what, &gpu, &cpu, Some(&|_: usize, c: f64| c.abs() + bound));
                        within += 1;
                    }
                }
            }
        }
    }
    println!(
        "layer_norm: {exact} calls on cuda:0 equal the CPU kernel bit for bit, {within} within the tolerance"
    );
    assert!(exact > 50 && within > 50);
    vm.sync().unwrap();
}
