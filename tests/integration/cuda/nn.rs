//! The batched product, convolution and pools on `cuda:0` against the CPU kernels (through
//! the VM, on the same values and layouts) and, for the products, against an exact host
//! sum: `bmm` of integers and every pool bit for bit; `bmm` and `conv2d` of floats within
//! `1e-5 · Σ|terms|` (`1e-13` for `f64`) plus half an ulp of the dtype of the exact value
//! (cuBLAS adds in another order than the CPU), and within twice that of the CPU's result.
//! `scaled_dot_product_attention` within a stated tolerance of the CPU (only `exp` differs).
//! Inputs are laid out contiguously, at an offset, with steps, transposed, broadcast
//! (stride 0) and reversed; outputs contiguously, transposed, with steps and at an offset;
//! shapes include empty batches and empty inner sizes; the pools' values include NaN, ±inf
//! and the integer extremes.

use eagervm::framework::Scalar;
use eagervm::prelude::*;

use super::kernels::{accumulation, close, make, store_rounding, Lay, LAYS};
use super::reference::{self as r, numel, Vals};
use super::{gpu_vm, lock};

const GPU: DeviceId = DeviceId::cuda(0);

/// The layouts an output is given in.
const OUT_LAYS: [Lay; 4] = [Lay::Contiguous, Lay::Transposed, Lay::Stepped, Lay::Offset];

fn params(ints: &[i64]) -> Attrs {
    Attrs::default().with_params(ints, &[]).expect("a parameter list")
}

/// Run `op` on `device`'s compute stream, writing the given outputs; their values.
fn run_into(
    vm: &VirtualMachine,
    op: &str,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    attrs: Attrs,
    device: DeviceId,
) -> Result<Vec<Vals>> {
    let (o, s) = (vm.op(op)?, vm.compute_stream(device)?);
    vm.run(|b| b.call_into(o, inputs, outputs, attrs, s))?;
    outputs.iter().map(|t| Vals::read(t)).collect()
}

/// One call of `op` on `cuda:0` and on the CPU over the same inputs (`(dtype, shape, lay)`,
/// values from `seed`) into outputs of the given kinds: both results, and the inputs'
/// values in row-major order.
#[allow(clippy::type_complexity)]
fn both(
    vm: &VirtualMachine,
    op: &str,
    inputs: &[(DType, &[usize], Lay)],
    outputs: &[(DType, &[usize], Lay)],
    attrs: Attrs,
    seed: u64,
    special: bool,
) -> (Vec<Vals>, Vec<Vals>, Vec<Vals>) {
    let what = format!("{op} {inputs:?} into {outputs:?} with {:?}", attrs.params());
    let on = |device: DeviceId| {
        let ins: Vec<(Tensor, Vals)> = inputs
            .iter()
            .enumerate()
            .map(|(i, &(d, shape, lay))| make(vm, d, shape, lay, device, seed + i as u64, special))
            .collect();
        let outs: Vec<Tensor> = outputs
            .iter()
            .enumerate()
            .map(|(i, &(d, shape, lay))| make(vm, d, shape, lay, device, seed + 50 + i as u64, true).0)
            .collect();
        let ts: Vec<&Tensor> = ins.iter().map(|(t, _)| t).collect();
        let os: Vec<&Tensor> = outs.iter().collect();
        let got =
            run_into(vm, op, &ts, &os, attrs, device).unwrap_or_else(|e| panic!("{what} on {device}: {e}"));
        (got, ins.into_iter().map(|(_, v)| v).collect::<Vec<_>>())
    };
    let (gpu, vals) = on(GPU);
    let (cpu, _) = on(DeviceId::CPU);
    (gpu, cpu, vals)
}

/// `bmm` on every numeric dtype with every input layout, outputs of four layouts,
/// broadcast batches, empty batches and an empty inner size: integers exactly, floats
/// within the products' tolerance of the exact sum and of the CPU's result.
#[test]
#[ignore = "needs a GPU"]
fn bmm_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let cases: [(&[usize], &[usize]); 7] = [
        (&[3, 13, 21], &[3, 21, 9]),
        (&[2, 1, 5, 7], &[3, 7, 4]),
        (&[4, 6], &[2, 6, 5]),
        (&[2, 3, 1, 8], &[1, 3, 8, 1]),
        (&[2, 300, 40], &[2, 40, 20]),
        (&[0, 3, 4], &[0, 4, 2]),
        (&[2, 3, 0], &[2, 0, 4]),
    ];
    let (mut calls, mut elements) = (0, 0);
    for d in DType::ALL.into_iter().filter(|&d| d != DType::Bool) {
        for (ci, &(sa, sb)) in cases.iter().enumerate() {
            let (ra, rb) = (sa.len(), sb.len());
            let (m, k, n) = (sa[ra - 2], sa[ra - 1], sb[rb - 1]);
            let batch = r::broadcast(&sa[..ra - 2], &sb[..rb - 2]);
            let mut out_shape = batch.clone();
            out_shape.extend([m, n]);
            let big = numel(&out_shape) * k > 100_000;
            for (v, &la) in LAYS.iter().enumerate() {
                if big && v > 2 {
                    continue;
                }
                let lb = LAYS[(v + ci + 1) % LAYS.len()];
                let lc = OUT_LAYS[(v + ci) % OUT_LAYS.len()];
                let what = format!("bmm {sa:?} {la:?} @ {sb:?} {lb:?} into {lc:?} on {d}");
                let (gpu, cpu, vals) = both(
                    &vm,
                    "bmm",
                    &[(d, sa, la), (d, sb, lb)],
                    &[(d, &out_shape, lc)],
                    Attrs::default(),
                    10 + v as u64,
                    false,
                );
                let (g, c) = (&gpu[0], &cpu[0]);
                if !d.is_floating() {
                    if let Some(diff) = g.first_difference(c) {
                        panic!("{what}: cuda:0 differs from the CPU at {diff}");
                    }
                }
                let nb = numel(&batch);
                for q in 0..nb {
                    let (qa, qb) = (
                        r::broadcast_index(&batch, &sa[..ra - 2], q),
                        r::broadcast_index(&batch, &sb[..rb - 2], q),
                    );
                    for i in 0..m {
                        for j in 0..n {
                            let terms = (0..k).map(|p| {
                                (vals[0].get((qa * m + i) * k + p), vals[1].get((qb * k + p) * n + j))
                            });
                            let at = (q * m + i) * n + j;
                            let got = g.get(at);
                            if d.is_floating() {
                                let (exact, mag) = terms.fold((0.0, 0.0), |(s, t), (x, y)| {
                                    (s + x.as_f64() * y.as_f64(), t + (x.as_f64() * y.as_f64()).abs())
                                });
                                let tol = accumulation(d) * mag + store_rounding(d) * exact.abs();
                                assert!(
                                    close(got, exact, tol),
                                    "{what} [{q}, {i}, {j}]: {got} against {exact}"
                                );
                                let cv = c.get(at).as_f64();
                                assert!(
                                    close(got, cv, 2.0 * tol),
                                    "{what} [{q}, {i}, {j}]: {got} against the CPU's {cv}"
                                );
                            } else {
                                let exact = terms.fold(0i64, |s, (x, y)| {
                                    s.wrapping_add(x.as_i64().wrapping_mul(y.as_i64()))
                                });
                                let want = r::cast(DType::I64, d, Scalar::Int(exact));
                                assert_eq!(got.as_i64(), want.as_i64(), "{what} [{q}, {i}, {j}]");
                            }
                            elements += 1;
                        }
                    }
                }
                calls += 1;
            }
        }
        // A NaN in `a` makes its row of the product NaN, on the GPU as on the CPU.
        if d.is_floating() {
            let mut a = Vals::of(d, (0..2 * 3 * 4).map(|i| Scalar::Float(i as f64 / 4.0)));
            let nan = Vals::of(d, [Scalar::Float(f64::NAN)]);
            a.bytes[5 * d.size()..6 * d.size()].copy_from_slice(&nan.bytes); // [0, 1, 1]
            let b = Vals::of(d, (0..2 * 4 * 2).map(|i| Scalar::Float(1.0 - i as f64 / 8.0)));
            for device in [GPU, DeviceId::CPU] {
                let (ta, tb) = (a.tensor(&vm, &[2, 3, 4], device), b.tensor(&vm, &[2, 4, 2], device));
                let o = Vals::tensor(&Vals::of(d, vec![Scalar::Float(0.0); 12]), &vm, &[2, 3, 2], device);
                let got = run_into(&vm, "bmm", &[&ta, &tb], &[&o], Attrs::default(), device).unwrap();
                for at in 0..12 {
                    let nan_row = at / 2 == 1;
                    assert_eq!(got[0].get(at).as_f64().is_nan(), nan_row, "bmm NaN on {d} {device} at {at}");
                }
            }
        }
    }
    println!("bmm: {calls} calls on cuda:0, {elements} elements, each against the exact sum and the CPU");
    vm.sync().unwrap();
}

/// The exact `conv2d` of row-major values, with the sum of the terms' magnitudes.
#[allow(clippy::too_many_arguments)]
fn conv_exact(
    x: &Vals,
    [n, c, h, w]: [usize; 4],
    wt: &Vals,
    [o, cg, kh, kw]: [usize; 4],
    bias: Option<&Vals>,
    p: &[i64; 9],
    [oh, ow]: [usize; 2],
) -> Vec<(f64, f64)> {
    let (sh, sw, top, left, dh, dw, groups) = (p[0], p[1], p[2], p[4], p[6], p[7], p[8] as usize);
    let og = o / groups;
    let mut out = Vec::with_capacity(n * o * oh * ow);
    for ni in 0..n {
        for oo in 0..o {
            let g = oo / og;
            for y in 0..oh {
                for xx in 0..ow {
                    let b = bias.map_or(0.0, |b| b.get(oo).as_f64());
                    let (mut s, mut mag) = (b, b.abs());
                    for ci in 0..cg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let hy = y as i64 * sh + i as i64 * dh - top;
                                let wx = xx as i64 * sw + j as i64 * dw - left;
                                if hy < 0 || hy >= h as i64 || wx < 0 || wx >= w as i64 {
                                    continue;
                                }
                                let xi = ((ni * c + g * cg + ci) * h + hy as usize) * w + wx as usize;
                                let t =
                                    x.get(xi).as_f64() * wt.get(((oo * cg + ci) * kh + i) * kw + j).as_f64();
                                s += t;
                                mag += t.abs();
                            }
                        }
                    }
                    out.push((s, mag));
                }
            }
        }
    }
    out
}

/// `conv2d` on every float dtype: strides, asymmetric padding, dilation, groups (depthwise
/// too), with and without a bias, inputs of every layout and outputs of four, within the
/// products' tolerance of the exact sum and of the CPU's result.
#[test]
#[ignore = "needs a GPU"]
fn conv2d_on_every_float_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    // (input, weight, parameters, bias)
    type Case = ([usize; 4], [usize; 4], [i64; 9], bool);
    let cases: [Case; 6] = [
        ([2, 3, 9, 8], [4, 3, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 1], true),
        ([2, 4, 10, 9], [6, 2, 3, 2], [2, 1, 0, 1, 2, 0, 2, 1, 2], false),
        ([1, 6, 5, 5], [6, 1, 3, 3], [1, 1, 1, 1, 1, 1, 1, 1, 6], true),
        ([3, 2, 20, 20], [5, 2, 1, 1], [1, 1, 0, 0, 0, 0, 1, 1, 1], true),
        ([2, 3, 7, 7], [2, 3, 7, 7], [1, 1, 0, 0, 0, 0, 1, 1, 1], false),
        ([0, 3, 5, 5], [2, 3, 3, 3], [1, 1, 0, 0, 0, 0, 1, 1, 1], true),
    ];
    let (mut calls, mut elements) = (0, 0);
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for (ci, &(xs, ws, p, has_bias)) in cases.iter().enumerate() {
            let oh = ((xs[2] as i64 + p[2] + p[3] - p[6] * (ws[2] as i64 - 1) - 1) / p[0] + 1) as usize;
            let ow = ((xs[3] as i64 + p[4] + p[5] - p[7] * (ws[3] as i64 - 1) - 1) / p[1] + 1) as usize;
            let out_shape = [xs[0], ws[0], oh, ow];
            for (v, &lx) in LAYS.iter().enumerate() {
                let lw = LAYS[(v + ci + 2) % LAYS.len()];
                let lb = [Lay::Contiguous, Lay::Stepped, Lay::Reversed][v % 3];
                let lo = OUT_LAYS[(v + ci) % OUT_LAYS.len()];
                let bias_shape = [ws[0]];
                let mut inputs: Vec<(DType, &[usize], Lay)> = vec![(d, &xs, lx), (d, &ws, lw)];
                if has_bias {
                    inputs.push((d, &bias_shape, lb));
                }
                let what = format!("conv2d {inputs:?} {p:?} into {lo:?}");
                let (gpu, cpu, vals) =
                    both(&vm, "conv2d", &inputs, &[(d, &out_shape, lo)], params(&p), 20 + v as u64, false);
                let want = conv_exact(&vals[0], xs, &vals[1], ws, vals.get(2), &p, [oh, ow]);
                assert_eq!(gpu[0].len(), want.len(), "{what}");
                for (at, &(exact, mag)) in want.iter().enumerate() {
                    let got = gpu[0].get(at);
                    let tol = accumulation(d) * mag + store_rounding(d) * exact.abs();
                    assert!(close(got, exact, tol), "{what} element {at}: {got} against {exact}");
                    let cv = cpu[0].get(at).as_f64();
                    assert!(close(got, cv, 2.0 * tol), "{what} element {at}: {got} against the CPU's {cv}");
                    elements += 1;
                }
                calls += 1;
            }
        }
    }
    println!("conv2d: {calls} calls on cuda:0, {elements} elements, each against the exact sum and the CPU");
    vm.sync().unwrap();
}

/// The output shape of a pool of `x` with window `k`, stride `s`, padding `pad`, dilation
/// `dil` (PyTorch's rule, `ceil` as the CPU's `window_out`).
fn pool_out(x: usize, k: i64, s: i64, pad: i64, dil: i64, ceil: bool) -> usize {
    let room = x as i64 + 2 * pad - dil * (k - 1) - 1;
    let mut out = if ceil { (room + s - 1) / s } else { room / s } + 1;
    if ceil && (out - 1) * s >= x as i64 + pad {
        out -= 1;
    }
    out as usize
}

/// Every pool on every dtype it takes, inputs of every layout with NaN, ±inf and the
/// integer extremes, outputs of four layouts: bit for bit the CPU's (values and indices).
#[test]
#[ignore = "needs a GPU"]
fn pools_equal_the_cpu_kernels() {
    let _g = lock();
    let vm = gpu_vm();
    let mut calls = 0;
    // (op, input shape, parameters)
    let mut cases: Vec<(&str, [usize; 4], Vec<i64>)> = Vec::new();
    for op in ["max_pool2d", "max_pool2d_with_indices"] {
        cases.push((op, [2, 3, 11, 9], vec![3, 3, 2, 2, 1, 1, 1, 1, 0]));
        cases.push((op, [2, 3, 11, 9], vec![3, 2, 2, 1, 1, 0, 2, 1, 1]));
        cases.push((op, [1, 2, 40, 40], vec![2, 2, 2, 2, 0, 0, 1, 1, 0]));
        cases.push((op, [0, 2, 4, 4], vec![2, 2, 2, 2, 0, 0, 1, 1, 0]));
    }
    cases.push(("avg_pool2d", [2, 3, 11, 9], vec![3, 3, 2, 2, 1, 1, 0, 1, 0]));
    cases.push(("avg_pool2d", [2, 3, 11, 9], vec![3, 2, 2, 1, 1, 1, 1, 0, 0]));
    cases.push(("avg_pool2d", [2, 3, 11, 9], vec![2, 2, 2, 2, 0, 0, 1, 0, 3]));
    cases.push(("avg_pool2d", [1, 2, 40, 40], vec![2, 2, 2, 2, 0, 0, 0, 1, 0]));
    cases.push(("adaptive_avg_pool2d", [2, 3, 11, 9], vec![4, 5]));
    cases.push(("adaptive_avg_pool2d", [2, 3, 7, 7], vec![1, 1]));
    cases.push(("adaptive_avg_pool2d", [1, 2, 40, 30], vec![13, 7]));
    cases.push(("adaptive_avg_pool2d", [2, 3, 5, 5], vec![0, 3]));
    for (ci, (op, xs, p)) in cases.iter().enumerate() {
        let out_shape = match *op {
            "adaptive_avg_pool2d" => [xs[0], xs[1], p[0] as usize, p[1] as usize],
            _ => {
                let (dil, ceil) =
                    if op.starts_with("max") { ((p[6], p[7]), p[8] != 0) } else { ((1, 1), p[6] != 0) };
                [
                    xs[0],
                    xs[1],
                    pool_out(xs[2], p[0], p[2], p[4], dil.0, ceil),
                    pool_out(xs[3], p[1], p[3], p[5], dil.1, ceil),
                ]
            }
        };
        let dtypes: Vec<DType> = if op.starts_with("max") {
            DType::ALL.into_iter().filter(|&d| d != DType::Bool).collect()
        } else {
            vec![DType::F16, DType::BF16, DType::F32, DType::F64]
        };
        for d in dtypes {
            for (v, &lx) in LAYS.iter().enumerate() {
                let lo = OUT_LAYS[(v + ci) % OUT_LAYS.len()];
                let mut outputs: Vec<(DType, &[usize], Lay)> = vec![(d, &out_shape, lo)];
                if *op == "max_pool2d_with_indices" {
                    outputs.push((DType::I64, &out_shape, OUT_LAYS[(v + ci + 1) % OUT_LAYS.len()]));
                }
                let what = format!("{op} {d} {xs:?} {lx:?} {p:?} into {outputs:?}");
                let (gpu, cpu, _) = both(&vm, op, &[(d, xs, lx)], &outputs, params(p), 30 + v as u64, true);
                for (k, (g, c)) in gpu.iter().zip(&cpu).enumerate() {
                    assert_eq!(g.len(), numel(&out_shape), "{what}");
                    if let Some(diff) = g.first_difference(c) {
                        panic!("{what}: output {k} on cuda:0 differs from the CPU's at {diff}");
                    }
                }
                calls += 1;
            }
        }
    }
    println!("pools: {calls} calls on cuda:0 equal the CPU kernels bit for bit");
    vm.sync().unwrap();
}

/// `scaled_dot_product_attention` on every float dtype: broadcast batches, causal rows,
/// `bool` and float masks broadcast to the scores, empty batches and sequences, inputs of
/// every layout and outputs of four. The scores are the CPU's operations in the CPU's
/// order; only `exp` differs (CUDA's `expf` and `exp` are within 2 ulps), so every
/// element is within `1e-5 · 4 · max|v|` (`1e-13 · 4 · max|v|` for `f64`) plus one
/// rounding step of the dtype at the CPU's value of the CPU's result, NaN where it is NaN.
#[test]
#[ignore = "needs a GPU"]
fn attention_matches_the_cpu_kernel() {
    let _g = lock();
    let vm = gpu_vm();
    // (q, k, v, mask (dtype: None bool, Some float), causal)
    type Case<'a> = (&'a [usize], &'a [usize], &'a [usize], Option<(&'a [usize], bool)>, i64);
    let cases: [Case; 8] = [
        (&[2, 3, 5, 4], &[3, 7, 4], &[3, 7, 6], None, 0),
        (&[2, 5, 4], &[2, 5, 4], &[2, 5, 3], None, 1),
        (&[2, 3, 5, 4], &[2, 3, 7, 4], &[2, 3, 7, 6], Some((&[5, 7], true)), 0),
        (&[2, 3, 5, 4], &[2, 3, 7, 4], &[2, 3, 7, 6], Some((&[2, 1, 5, 7], false)), 0),
        (&[4, 300, 8], &[4, 50, 8], &[4, 50, 8], None, 1),
        (&[0, 5, 4], &[0, 7, 4], &[0, 7, 6], None, 0),
        (&[2, 0, 4], &[2, 7, 4], &[2, 7, 6], None, 0),
        (&[2, 5, 4], &[2, 0, 4], &[2, 0, 6], None, 0),
    ];
    let mut calls = 0;
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for (ci, &(qs, ks, vs, mask, causal)) in cases.iter().enumerate() {
            let bq = &qs[..qs.len() - 2];
            let bk = r::broadcast(&ks[..ks.len() - 2], &vs[..vs.len() - 2]);
            let mut out_shape = r::broadcast(bq, &bk);
            out_shape.extend([qs[qs.len() - 2], vs[vs.len() - 1]]);
            let scale = 1.0 / (qs[qs.len() - 1] as f64).sqrt();
            let attrs = Attrs::default().with_params(&[causal], &[Scalar::Float(scale)]).expect("parameters");
            for (v, &lq) in LAYS.iter().enumerate() {
                let (lk, lv, lm) = (LAYS[(v + 1) % 6], LAYS[(v + 2) % 6], LAYS[(v + 3) % 6]);
                let lo = OUT_LAYS[(v + ci) % OUT_LAYS.len()];
                let mut inputs: Vec<(DType, &[usize], Lay)> = vec![(d, qs, lq), (d, ks, lk), (d, vs, lv)];
                if let Some((ms, boolean)) = mask {
                    inputs.push((if boolean { DType::Bool } else { d }, ms, lm));
                }
                let what = format!("attention {inputs:?} causal {causal} into {lo:?}");
                let (gpu, cpu, vals) = both(
                    &vm,
                    "scaled_dot_product_attention",
                    &inputs,
                    &[(d, &out_shape, lo)],
                    attrs,
                    40 + v as u64,
                    false,
                );
                let vmax = (0..vals[2].len()).map(|i| vals[2].get(i).as_f64().abs()).fold(0.0, f64::max);
                assert_eq!(gpu[0].len(), numel(&out_shape), "{what}");
                for at in 0..gpu[0].len() {
                    let (g, c) = (gpu[0].get(at), cpu[0].get(at).as_f64());
                    let tol = 4.0 * accumulation(d) * vmax + 2.0 * store_rounding(d) * c.abs();
                    assert!(close(g, c, tol), "{what} element {at}: {g} against the CPU's {c}");
                }
                calls += 1;
            }
        }
    }
    println!("scaled_dot_product_attention: {calls} calls on cuda:0 within the tolerance of the CPU kernel");
    vm.sync().unwrap();
}

/// `nll_loss` targets of `shape` (classes below `classes`, every fifth `ignore` when it is
/// a class) on `device`: contiguous, or with `stepped` every other element of a storage.
fn targets(
    vm: &VirtualMachine,
    shape: &[usize],
    classes: usize,
    ignore: i64,
    stepped: bool,
    device: DeviceId,
) -> Tensor {
    let n = numel(shape);
    let t: Vec<Scalar> = (0..n)
        .map(|i| {
            Scalar::Int(if i % 5 == 3 && ignore >= 0 {
                ignore
            } else {
                ((i * 7 + 3) % classes.max(1)) as i64
            })
        })
        .collect();
    if !stepped || n == 0 {
        return Vals::of(DType::I64, t).tensor(vm, shape, device);
    }
    let storage: Vec<Scalar> = t.iter().flat_map(|&x| [Scalar::Int(-1), x]).collect();
    let owner = Vals::of(DType::I64, storage).tensor(vm, &[2 * n], device);
    let strides: Vec<isize> = r::contiguous(shape).iter().map(|s| 2 * s).collect();
    owner.view_layout(shape, &strides, 1).expect("a view inside its storage")
}

/// `nll_loss` on every float dtype, every reduction, with and without weights and an
/// ignored class, inputs of every layout, more targets than the sequential sum takes:
/// bit for bit the CPU's (the same operations in the same order). A target out of range
/// fails the call on `cuda:0` with the CPU kernel's error (`errors.rs` has more).
#[test]
#[ignore = "needs a GPU"]
fn nll_loss_equals_the_cpu_kernel() {
    let _g = lock();
    let vm = gpu_vm();
    let mut calls = 0;
    let shapes: [&[usize]; 4] = [&[6, 5], &[3, 4, 5, 2], &[5000, 3], &[0, 4]];
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        for (si, &xs) in shapes.iter().enumerate() {
            let classes = xs[1];
            let ts: Vec<usize> = xs.iter().enumerate().filter(|&(i, _)| i != 1).map(|(_, &s)| s).collect();
            for (v, &lx) in LAYS.iter().enumerate() {
                if xs[0] == 5000 && v > 2 {
                    continue;
                }
                for reduction in 0..3i64 {
                    for (ignore, weighted) in [(-100i64, false), (2, true), (1, false)] {
                        let lw = [Lay::Contiguous, Lay::Stepped, Lay::Reversed][(v + si) % 3];
                        let attrs = params(&[reduction, ignore, i64::from(weighted)]);
                        let out_shape: &[usize] = if reduction == 0 { &ts } else { &[] };
                        let run = |device: DeviceId| {
                            let (x, _) = make(&vm, d, xs, lx, device, 60 + v as u64, false);
                            let t = targets(&vm, &ts, classes, ignore, v % 2 == 1, device);
                            let w = make(&vm, d, &[classes], lw, device, 70, false).0;
                            let o = make(&vm, d, out_shape, OUT_LAYS[v % 4], device, 80, true).0;
                            let mut ins = vec![&x, &t];
                            if weighted {
                                ins.push(&w);
                            }
                            run_into(&vm, "nll_loss", &ins, &[&o], attrs, device)
                        };
                        let what = format!("nll_loss {d} {xs:?} {lx:?} reduction {reduction} ignore {ignore} weighted {weighted}");
                        let gpu = run(GPU).unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
                        let cpu = run(DeviceId::CPU).unwrap_or_else(|e| panic!("{what} on the CPU: {e}"));
                        if let Some(diff) = gpu[0].first_difference(&cpu[0]) {
                            panic!("{what}: cuda:0 differs from the CPU at {diff}");
                        }
                        calls += 1;
                    }
                }
            }
        }
        // A target out of range: the CPU kernel's error on cuda:0.
        let x = make(&vm, d, &[2, 3], Lay::Contiguous, GPU, 1, false).0;
        let t = Vals::of(DType::I64, [Scalar::Int(0), Scalar::Int(3)]).tensor(&vm, &[2], GPU);
        let o = make(&vm, d, &[], Lay::Contiguous, GPU, 2, false).0;
        match run_into(&vm, "nll_loss", &[&x, &t], &[&o], params(&[2, -100, 0]), GPU) {
            Err(Error::Kernel { op, message, .. }) => {
                assert_eq!(
                    (op.as_str(), message.as_str()),
                    ("nll_loss", "target 3 is out of bounds: the classes are 0 to 2")
                )
            }
            other => panic!("nll_loss of a target out of range on {d}: {other:?}"),
        }
    }
    // The failed calls are counted; nothing else failed.
    assert!(matches!(vm.sync(), Err(Error::Failed { count: 4, .. })));
    println!("nll_loss: {calls} calls on cuda:0 equal the CPU kernel bit for bit");
    vm.sync().unwrap();
}
