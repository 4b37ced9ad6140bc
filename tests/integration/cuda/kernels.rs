//! The CUDA kernels on every dtype and layout, against the reference of `reference.rs`
//! and against the CPU kernels through the VM wherever the CPU takes the same call: bit for
//! bit (NaNs equal whatever their payload) for every elementwise op, cast and copy, within
//! stated tolerances for `sum` and the matrix products. Each input is laid out in turn
//! contiguously, at an offset, with steps, transposed (or reversed), broadcast (stride 0)
//! and reversed; shapes include 0-d and empty tensors; values include NaN, ±inf, -0.0,
//! subnormals and the integer extremes.

use eagervm::framework::{bf16, f16, Scalar};
use eagervm::prelude::*;

use super::reference::{self as r, contiguous, gather, numel, Vals};
use super::{gpu_vm, lock};

const GPU: DeviceId = DeviceId::cuda(0);

/// `n` storage values of `dtype` from `seed`: a spread of ordinary values and, with
/// `special`, NaN, ±inf, -0.0, subnormals, values past `f16`'s range and integer extremes.
pub(super) fn values(dtype: DType, n: usize, seed: u64, special: bool) -> Vals {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let v = (0..n).map(|_| {
        let r = next();
        let pick = r % 16;
        if dtype.is_floating() {
            let plain = ((r >> 8) % 129) as f64 / 8.0 - 8.0;
            Scalar::Float(match pick {
                0 if special => f64::NAN,
                1 if special => f64::INFINITY,
                2 if special => f64::NEG_INFINITY,
                3 => -0.0,
                4 => 0.0,
                5 if special => 1e-40 * ((r >> 8) % 7) as f64, // subnormal in f32 (0 in f16)
                6 if special => 70000.0 * ((r >> 8) % 5) as f64 - 140000.0, // past f16's range
                7 => (((r >> 8) % 2001) as f64 - 1000.0) / 64.0,
                _ => plain,
            })
        } else if dtype == DType::Bool {
            Scalar::Bool(r & 1 == 1)
        } else {
            Scalar::Int(match pick {
                0 if special => i64::MIN,
                1 if special => i64::MAX,
                2 if special => i64::from(i32::MIN),
                3 if special => i64::from(i32::MAX),
                4 => 255,
                5 => 0,
                6 => 128,
                _ => ((r >> 8) % 41) as i64 - 20,
            })
        }
    });
    Vals::of(dtype, v.collect::<Vec<_>>())
}

/// How an operand lies in its storage.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) enum Lay {
    Contiguous,
    /// Contiguous from element 5.
    Offset,
    /// Every other element, from element 1.
    Stepped,
    /// The transpose of a contiguous tensor of the reversed shape (1-D: reversed).
    Transposed,
    /// The first dimension read with stride 0 (its storage has one row).
    Broadcast,
    /// The last dimension reversed (a negative stride).
    Reversed,
}

pub(super) const LAYS: [Lay; 6] =
    [Lay::Contiguous, Lay::Offset, Lay::Stepped, Lay::Transposed, Lay::Broadcast, Lay::Reversed];

/// A view of `shape` and `dtype` laid out as `lay` on `device` over a storage of `values`
/// from `seed`, with its elements in row-major order.
pub(super) fn make(
    vm: &VirtualMachine,
    dtype: DType,
    shape: &[usize],
    lay: Lay,
    device: DeviceId,
    seed: u64,
    special: bool,
) -> (Tensor, Vals) {
    make_mapped(vm, dtype, shape, lay, device, seed, special, None)
}

/// [`make`] with every storage value passed through `map` where given (indices kept in
/// range, divisors kept from zero).
#[allow(clippy::too_many_arguments)]
pub(super) fn make_mapped(
    vm: &VirtualMachine,
    dtype: DType,
    shape: &[usize],
    lay: Lay,
    device: DeviceId,
    seed: u64,
    special: bool,
    map: Option<&dyn Fn(Scalar) -> Scalar>,
) -> (Tensor, Vals) {
    let (n, rank) = (numel(shape), shape.len());
    let (len, strides, offset): (usize, Vec<isize>, usize) = match lay {
        _ if n == 0 => (0, contiguous(shape), 0),
        Lay::Contiguous => (n, contiguous(shape), 0),
        Lay::Offset => (n + 5, contiguous(shape), 5),
        Lay::Stepped => (2 * n + 1, contiguous(shape).iter().map(|s| 2 * s).collect(), 1),
        Lay::Transposed if rank >= 2 => {
            let rev: Vec<usize> = shape.iter().rev().copied().collect();
            let cs = contiguous(&rev);
            (n, (0..rank).map(|d| cs[rank - 1 - d]).collect(), 0)
        }
        Lay::Broadcast if rank >= 1 && shape[0] > 1 => {
            let mut s = contiguous(shape);
            s[0] = 0;
            (n / shape[0], s, 0)
        }
        Lay::Reversed | Lay::Transposed if rank >= 1 => {
            let mut s = contiguous(shape);
            s[rank - 1] = -1;
            (n, s, shape[rank - 1] - 1)
        }
        _ => (n, contiguous(shape), 0),
    };
    let raw = values(dtype, len, seed, special);
    let storage = match map {
        Some(f) => Vals::of(dtype, (0..raw.len()).map(|i| f(raw.get(i)))),
        None => raw,
    };
    let logical = gather(&storage, shape, &strides, offset);
    if lay == Lay::Contiguous || n == 0 {
        return (logical.tensor(vm, shape, device), logical);
    }
    let owner = storage.tensor(vm, &[len], device);
    (owner.view_layout(shape, &strides, offset).expect("a view inside its storage"), logical)
}

/// Run `op` on `inputs` with `attrs` on `device`'s compute stream, writing `into` when given.
pub(super) fn call(
    vm: &VirtualMachine,
    op: &str,
    inputs: &[&Tensor],
    into: Option<&Tensor>,
    attrs: Attrs,
    device: DeviceId,
) -> Result<Tensor> {
    let (op, s) = (vm.op(op)?, vm.compute_stream(device)?);
    match into {
        Some(out) => vm.run(|b| b.call_into(op, inputs, &[out], attrs, s)).map(|()| out.clone()),
        None => vm.run(|b| b.call(op, inputs, attrs, s)),
    }
}

/// Tallies of the comparisons made.
#[derive(Default, Debug)]
struct Tally {
    calls: usize,
    with_cpu: usize,
    cpu_refused: usize,
}

impl Tally {
    fn report(&self, what: &str) {
        println!(
            "{what}: {} calls on cuda:0 equal the reference; {} of them equal the CPU kernels too, \
             {} are calls the CPU refuses",
            self.calls, self.with_cpu, self.cpu_refused
        );
        assert!(self.calls > 0, "{what}: nothing ran");
    }
}

/// One call of an elementwise op on `cuda:0` and on the CPU, over inputs of `dtypes`,
/// `shapes` and layouts `lays` (output given as `out` when set), checked bit for bit
/// against the reference and the CPU.
#[allow(clippy::too_many_arguments)]
fn check(
    vm: &VirtualMachine,
    tally: &mut Tally,
    op: &str,
    inputs: &[(DType, &[usize], Lay)],
    out: Option<(DType, &[usize], Lay)>,
    attrs: Attrs,
    seed: u64,
) {
    // The same storages (same seeds) on each device; the inputs' elements with the result.
    let on = |device: DeviceId| {
        let made: Vec<(Tensor, Vals)> = inputs
            .iter()
            .enumerate()
            .map(|(i, &(d, shape, lay))| make(vm, d, shape, lay, device, seed + i as u64, true))
            .collect();
        let given = out.map(|(d, shape, lay)| make(vm, d, shape, lay, device, seed + 7, true).0);
        let ts: Vec<&Tensor> = made.iter().map(|(t, _)| t).collect();
        let result =
            call(vm, op, &ts, given.as_ref(), attrs, device).and_then(|t| Vals::read(&t).map(|v| (v, t)));
        (result, made.into_iter().map(|(_, v)| v).collect::<Vec<_>>())
    };
    let what = format!("{op} {inputs:?} into {out:?} with {attrs:?}");
    let (result, logical) = on(GPU);
    let (gpu, t) = result.unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
    let shape = t.shape().to_vec();
    let want_shape = match out {
        Some((_, given, _)) => given.to_vec(),
        None => inputs.iter().fold(Vec::new(), |s, i| r::broadcast(&s, i.1)),
    };
    assert_eq!(shape, want_shape, "{what}: the output's shape");
    let ins: Vec<(&Vals, &[usize])> = logical.iter().zip(inputs).map(|(v, i)| (v, i.1)).collect();
    let want = r::elementwise(op, &ins, attrs, (t.dtype(), &shape));
    if let Some(d) = gpu.first_difference(&want) {
        panic!("{what}: cuda:0 differs from the reference at {d}");
    }
    tally.calls += 1;
    match on(DeviceId::CPU).0 {
        Ok((cpu, _)) => {
            if let Some(d) = gpu.first_difference(&cpu) {
                panic!("{what}: cuda:0 differs from the CPU kernel at {d}");
            }
            tally.with_cpu += 1;
        }
        Err(_) => {
            // A call the CPU kernels refuse: its failure off the record, so that the test's
            // last `sync` reports the GPU's alone.
            let _ = vm.sync();
            tally.cpu_refused += 1;
        }
    }
}

/// Shapes of the operands of a binary op: equal, broadcast either way, 0-d, empty.
const BINARY_SHAPES: [(&[usize], &[usize]); 5] =
    [(&[5, 7], &[5, 7]), (&[5, 7], &[7]), (&[5, 1], &[1, 7]), (&[], &[5, 7]), (&[0, 3], &[3])];
/// Shapes of the operand of a unary op.
const UNARY_SHAPES: [&[usize]; 4] = [&[5, 7], &[], &[0, 3], &[33]];

fn takes(op: &str, d: DType) -> bool {
    match op {
        "sub" | "relu" | "relu_grad" | "scale" | "mul_scalar" | "add_scalar" | "rsub_scalar" => {
            d != DType::Bool
        }
        "div" | "div_scalar" | "rdiv_scalar" => d.is_floating(),
        _ => true,
    }
}

#[test]
#[ignore = "needs a GPU"]
fn binary_ops_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let mut tally = Tally::default();
    let ops = ["add", "sub", "mul", "div", "relu_grad", "eq", "ne", "lt", "le", "gt", "ge"];
    for (k, op) in ops.iter().enumerate() {
        for d in DType::ALL.into_iter().filter(|&d| takes(op, d)) {
            for (j, (sa, sb)) in BINARY_SHAPES.iter().enumerate() {
                for v in 0..LAYS.len() {
                    let (la, lb) = (LAYS[v], LAYS[(v + 3) % LAYS.len()]);
                    let seed = (k * 1000 + j * 10 + v) as u64;
                    check(&vm, &mut tally, op, &[(d, sa, la), (d, sb, lb)], None, Attrs::default(), seed);
                }
            }
        }
    }
    // add_bias: x [n, k] plus b [k].
    for d in DType::ALL {
        for (v, &lay) in LAYS.iter().enumerate() {
            check(
                &vm,
                &mut tally,
                "add_bias",
                &[(d, &[6, 4], lay), (d, &[4], LAYS[(v + 2) % 6])],
                None,
                Attrs::default(),
                v as u64,
            );
        }
    }
    tally.report("binary ops");
    vm.sync().unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn unary_and_scalar_ops_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let mut tally = Tally::default();
    let arith = [Scalar::Float(2.5), Scalar::Int(-3), Scalar::Float(-0.0), Scalar::Int(1 << 40)];
    let compare = [
        Scalar::Float(0.5),
        Scalar::Int(2),
        Scalar::Float(f64::NAN),
        Scalar::Int(300),
        Scalar::Bool(true),
        Scalar::Float(-8.0),
    ];
    let mut cases: Vec<(&str, &[Scalar])> = vec![("relu", &[Scalar::Float(0.0)])];
    for op in ["scale", "mul_scalar", "add_scalar", "rsub_scalar", "div_scalar", "rdiv_scalar"] {
        cases.push((op, &arith));
    }
    for op in ["eq_scalar", "ne_scalar", "lt_scalar", "le_scalar", "gt_scalar", "ge_scalar"] {
        cases.push((op, &compare));
    }
    for (k, (op, scalars)) in cases.iter().enumerate() {
        for d in DType::ALL.into_iter().filter(|&d| takes(op, d)) {
            for (i, &s) in scalars.iter().enumerate() {
                for (j, shape) in UNARY_SHAPES.iter().enumerate() {
                    // Every layout on the 2-D shape, two on the others.
                    let lays: &[Lay] = if j == 0 { &LAYS } else { &[Lay::Stepped, Lay::Reversed] };
                    for (v, &lay) in lays.iter().enumerate() {
                        let seed = (k * 10_000 + i * 100 + j * 10 + v) as u64;
                        check(&vm, &mut tally, op, &[(d, shape, lay)], None, Attrs::of(s), seed);
                    }
                }
            }
        }
    }
    tally.report("unary and scalar ops");
    vm.sync().unwrap();
}

#[test]
#[ignore = "needs a GPU"]
fn fill_masked_fill_and_cast_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let mut tally = Tally::default();
    let scalars = [
        Scalar::Float(2.7),
        Scalar::Int(-300),
        Scalar::Float(f64::NAN),
        Scalar::Bool(true),
        Scalar::Float(1e6),
    ];
    for d in DType::ALL {
        for (i, &s) in scalars.iter().enumerate() {
            for (v, &lay) in LAYS.iter().enumerate() {
                let seed = (i * 10 + v) as u64;
                // An output cannot be broadcast (it would write elements twice).
                let out = if lay == Lay::Broadcast { Lay::Offset } else { lay };
                check(&vm, &mut tally, "fill", &[], Some((d, &[4, 6], out)), Attrs::of(s), seed);
                let mask = (DType::Bool, &[6][..], LAYS[(v + 1) % 6]);
                check(&vm, &mut tally, "masked_fill", &[(d, &[4, 6], lay), mask], None, Attrs::of(s), seed);
            }
            check(&vm, &mut tally, "fill", &[], Some((d, &[], Lay::Contiguous)), Attrs::of(s), 0);
            check(&vm, &mut tally, "fill", &[], Some((d, &[0, 2], Lay::Contiguous)), Attrs::of(s), 0);
        }
    }
    for from in DType::ALL {
        for to in DType::ALL {
            for (v, &lay) in LAYS.iter().enumerate() {
                let attrs = Attrs::default().with_dtype(to);
                check(&vm, &mut tally, "cast", &[(from, &[9, 5], lay)], None, attrs, v as u64);
            }
            check(
                &vm,
                &mut tally,
                "cast",
                &[(from, &[], Lay::Contiguous)],
                None,
                Attrs::default().with_dtype(to),
                1,
            );
        }
    }
    tally.report("fill, masked_fill and cast");
    vm.sync().unwrap();
}

/// Every `f16` and `bf16` value converts to `f32` as `half` converts it, NaN payloads
/// included, and a spread of 2^20 `f32` bit patterns (with every power of two and its
/// neighbours) converts back to both as `half` rounds it.
#[test]
#[ignore = "needs a GPU"]
fn sixteen_bit_conversions_are_halfs() {
    let _g = lock();
    let vm = gpu_vm();
    let cast =
        |t: &Tensor, to: DType| call(&vm, "cast", &[t], None, Attrs::default().with_dtype(to), GPU).unwrap();
    let all: Vec<u16> = (0..=u16::MAX).collect();
    let h: Vec<f16> = all.iter().map(|&b| f16::from_bits(b)).collect();
    let got = cast(&vm.from_slice(&h, &[h.len()], GPU).unwrap(), DType::F32).to_vec::<f32>().unwrap();
    for (x, y) in h.iter().zip(&got) {
        assert_eq!(y.to_bits(), x.to_f32().to_bits(), "f16 {:#06x} to f32", x.to_bits());
    }
    let b: Vec<bf16> = all.iter().map(|&x| bf16::from_bits(x)).collect();
    let got = cast(&vm.from_slice(&b, &[b.len()], GPU).unwrap(), DType::F32).to_vec::<f32>().unwrap();
    for (x, y) in b.iter().zip(&got) {
        assert_eq!(y.to_bits(), x.to_f32().to_bits(), "bf16 {:#06x} to f32", x.to_bits());
    }
    let mut bits: Vec<u32> = (0..1u32 << 20).map(|i| i.wrapping_mul(4099).wrapping_add(i >> 7)).collect();
    for e in 0..256u32 {
        for delta in [0u32, 1, 0x0FFF, 0x1000, 0x1001, 0x7FFF, 0x8000, 0x8001] {
            bits.extend([(e << 23) | delta, (e << 23).wrapping_sub(delta), 0x8000_0000 | (e << 23) | delta]);
        }
    }
    let f: Vec<f32> = bits.iter().map(|&b| f32::from_bits(b)).collect();
    let t = vm.from_slice(&f, &[f.len()], GPU).unwrap();
    let to_h = cast(&t, DType::F16).to_vec::<f16>().unwrap();
    let to_b = cast(&t, DType::BF16).to_vec::<bf16>().unwrap();
    for (i, x) in f.iter().enumerate() {
        assert_eq!(to_h[i].to_bits(), f16::from_f32(*x).to_bits(), "f32 {:#010x} to f16", x.to_bits());
        assert_eq!(to_b[i].to_bits(), bf16::from_f32(*x).to_bits(), "f32 {:#010x} to bf16", x.to_bits());
    }
    vm.sync().unwrap();
}

/// `call_into` with the output equal to input 0 (a view with steps): the result is the
/// reference's on the original values, and the storage elements outside the view are kept.
#[test]
#[ignore = "needs a GPU"]
fn in_place_calls_write_their_input() {
    let _g = lock();
    let vm = gpu_vm();
    let cases: [(&str, DType, Attrs); 7] = [
        ("add", DType::F16, Attrs::default()),
        ("mul", DType::I32, Attrs::default()),
        ("relu", DType::BF16, Attrs::default()),
        ("rsub_scalar", DType::F64, Attrs::scalar(1.5)),
        ("masked_fill", DType::U8, Attrs::integer(9)),
        ("eq", DType::Bool, Attrs::default()),
        ("cast", DType::F32, Attrs::default().with_dtype(DType::F32)),
    ];
    for (op, d, attrs) in cases {
        let shape = [4usize, 3];
        let storage = values(d, 2 * 12 + 1, 11, true);
        let owner = storage.tensor(&vm, &[25], GPU);
        let strides = [6isize, 2];
        let x = owner.view_layout(&shape, &strides, 1).unwrap();
        let before = gather(&storage, &shape, &strides, 1);
        let second_dtype = if op == "masked_fill" { DType::Bool } else { d };
        let (y, y_vals) = make(&vm, second_dtype, &[3], Lay::Stepped, GPU, 5, true);
        let inputs: Vec<&Tensor> = match op {
            "relu" | "rsub_scalar" | "cast" => vec![&x],
            _ => vec![&x, &y],
        };
        call(&vm, op, &inputs, Some(&x), attrs, GPU).unwrap_or_else(|e| panic!("{op} in place: {e}"));
        let ins: Vec<(&Vals, &[usize])> =
            [(&before, &shape[..]), (&y_vals, &[3][..])][..inputs.len()].to_vec();
        let want = r::elementwise(op, &ins, attrs, (d, &shape));
        let got = Vals::read(&x).unwrap();
        if let Some(diff) = got.first_difference(&want) {
            panic!("{op} in place on {d}: {diff}");
        }
        // The elements between the view's are untouched.
        let all = Vals::read(&owner).unwrap();
        let n = d.size();
        for i in (0..25).filter(|i| i % 2 == 0) {
            assert_eq!(all.bytes[i * n..(i + 1) * n], storage.bytes[i * n..(i + 1) * n], "{op}: element {i}");
        }
    }
    vm.sync().unwrap();
}

/// Copies between host and device and within the device, every layout on either side,
/// small (through staging) and large (from and to page-locked host blocks), and copies
/// whose input overlaps the output in the same storage.
#[test]
#[ignore = "needs a GPU"]
fn copies_of_every_layout_between_host_and_device() {
    let _g = lock();
    let vm = gpu_vm();
    let copy = vm.op("copy").unwrap();
    let (h2d, d2h, compute) = (
        vm.stream(GPU, StreamType::H2D).unwrap(),
        vm.stream(GPU, StreamType::D2H).unwrap(),
        vm.compute_stream(GPU).unwrap(),
    );
    let mut calls = 0;
    for (shape, d) in [
        (&[5usize, 7][..], DType::F16),
        (&[300, 301], DType::F32),
        (&[3, 4, 5], DType::I64),
        (&[], DType::Bool),
    ] {
        for (v, &from_lay) in LAYS.iter().enumerate() {
            let to_lay = LAYS[(v + 2) % LAYS.len()];
            // The output is written, so it cannot be broadcast.
            let to_lay = if to_lay == Lay::Broadcast { Lay::Offset } else { to_lay };
            for (from_dev, to_dev, stream) in
                [(DeviceId::CPU, GPU, h2d), (GPU, DeviceId::CPU, d2h), (GPU, GPU, compute)]
            {
                let (src, want) = make(&vm, d, shape, from_lay, from_dev, v as u64, true);
                let (dst, _) = make(&vm, d, shape, to_lay, to_dev, 99, true);
                vm.run(|b| b.call_into(copy, &[&src], &[&dst], Attrs::default(), stream)).unwrap_or_else(
                    |e| panic!("copy {from_lay:?} on {from_dev} to {to_lay:?} on {to_dev}: {e}"),
                );
                let got = Vals::read(&dst).unwrap();
                if let Some(diff) = got.first_difference(&want) {
                    panic!("copy {shape:?} {d} {from_lay:?} on {from_dev} to {to_lay:?} on {to_dev}: {diff}");
                }
                calls += 1;
            }
        }
    }
    // A row broadcast into every row of the output (`copy_` of a row), from each device.
    for (from_dev, to_dev, stream) in
        [(DeviceId::CPU, GPU, h2d), (GPU, DeviceId::CPU, d2h), (GPU, GPU, compute)]
    {
        let row = values(DType::F32, 3, 5, true);
        let src = row.tensor(&vm, &[3], from_dev);
        let (dst, _) = make(&vm, DType::F32, &[2, 3], Lay::Contiguous, to_dev, 7, true);
        vm.run(|b| b.call_into(copy, &[&src], &[&dst], Attrs::default(), stream))
            .unwrap_or_else(|e| panic!("broadcast copy on {from_dev} to {to_dev}: {e}"));
        let mut want = row.clone();
        want.bytes.extend_from_slice(&row.bytes);
        assert_eq!(Vals::read(&dst).unwrap().bytes, want.bytes, "broadcast copy on {from_dev} to {to_dev}");
    }
    // Within one storage: interleaved views that share element 3, which the builder lets
    // through (PyTorch's rule); the input is read before anything is written.
    let storage = values(DType::I32, 8, 3, false);
    let owner = storage.tensor(&vm, &[8], GPU);
    let a = owner.view_layout(&[2, 2], &[2, 3], 0).unwrap();
    let b = owner.view_layout(&[2, 2], &[3, 2], 1).unwrap();
    vm.run(|bd| bd.call_into(copy, &[&a], &[&b], Attrs::default(), compute)).unwrap();
    let mut want = storage.clone();
    for (from, to) in [(0, 1), (3, 3), (2, 4), (5, 6)] {
        want.bytes.copy_within(from * 4..from * 4 + 4, to * 4);
    }
    assert_eq!(Vals::read(&owner).unwrap(), want, "overlapping copy");
    println!("copies: {calls} calls, every layout pair on every device pair");
    vm.sync().unwrap();
}

/// `|got − want| ≤ tol` for floats (NaN where both are NaN), equal for integers.
pub(super) fn close(got: Scalar, want: f64, tol: f64) -> bool {
    match got {
        Scalar::Float(g) => (g.is_nan() && want.is_nan()) || g == want || (g - want).abs() <= tol,
        _ => got.as_f64() == want,
    }
}

/// Relative rounding of one store to `d` (half an ulp), 0 for the exact types.
pub(super) fn store_rounding(d: DType) -> f64 {
    match d {
        DType::F16 => 2f64.powi(-11),
        DType::BF16 => 2f64.powi(-8),
        DType::F32 => 2f64.powi(-24),
        _ => 0.0,
    }
}

/// Accumulation tolerance per unit of the sum of magnitudes.
pub(super) fn accumulation(d: DType) -> f64 {
    if d == DType::F64 {
        1e-13
    } else {
        1e-5
    }
}

/// `sum` and `sum_rows` on every dtype and layout: integers (and `bool`) exactly, floats
/// within `1e-5 · Σ|x|` (`1e-13` for `f64`) plus one rounding to the dtype of the exact
/// sum; `sum_rows` adds in the CPU's order, so it equals a sequential sum bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn sums_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let mut with_cpu = 0;
    for d in DType::ALL {
        let out_d = if d.is_floating() { d } else { DType::I64 };
        for shape in [&[5usize, 7][..], &[10_003], &[], &[0, 3], &[1 << 20, 3]] {
            for (v, &lay) in LAYS.iter().enumerate() {
                if numel(shape) > 100_000 && v > 1 {
                    continue;
                }
                let (x, vals) = make(&vm, d, shape, lay, GPU, v as u64, false);
                let got = Vals::read(&call(&vm, "sum", &[&x], None, Attrs::default(), GPU).unwrap()).unwrap();
                assert_eq!((got.dtype, got.len()), (out_d, 1));
                let got = got.get(0);
                if d.is_floating() {
                    let exact: f64 = (0..vals.len()).map(|i| vals.get(i).as_f64()).sum();
                    let mag: f64 = (0..vals.len()).map(|i| vals.get(i).as_f64().abs()).sum();
                    let tol = accumulation(d) * mag + store_rounding(d) * exact.abs();
                    // A sum past the dtype's range (a broadcast f16 row) is that infinity.
                    let rounded = r::cast(DType::F64, d, Scalar::Float(exact));
                    let fits = rounded.as_f64().is_finite();
                    assert!(
                        if fits { close(got, exact, tol) } else { got == rounded },
                        "sum {shape:?} {d} {lay:?}: {got} against {exact}"
                    );
                } else {
                    let exact = (0..vals.len()).fold(0i64, |a, i| a.wrapping_add(vals.get(i).as_i64()));
                    assert_eq!(got.as_i64(), exact, "sum {shape:?} {d} {lay:?}");
                }
                let (cx, _) = make(&vm, d, shape, lay, DeviceId::CPU, v as u64, false);
                if let Ok(cpu) = call(&vm, "sum", &[&cx], None, Attrs::default(), DeviceId::CPU)
                    .and_then(|t| Vals::read(&t))
                {
                    let c = cpu.get(0).as_f64();
                    let mag: f64 = (0..vals.len()).map(|i| vals.get(i).as_f64().abs()).sum();
                    assert!(
                        close(got, c, accumulation(d) * mag + store_rounding(d) * c.abs()),
                        "sum {shape:?} {d}: {got} against the CPU's {c}"
                    );
                    with_cpu += 1;
                } else {
                    // The CPU refused it (a dtype it lacks): take its failure off the record.
                    let _ = vm.sync();
                }
            }
        }
        // A NaN anywhere makes the sum NaN.
        if d.is_floating() {
            let mut vals = values(d, 9000, 1, false);
            let nan = Vals::of(d, [Scalar::Float(f64::NAN)]);
            vals.bytes[4000 * d.size()..4001 * d.size()].copy_from_slice(&nan.bytes);
            let got = Vals::read(
                &call(&vm, "sum", &[&vals.tensor(&vm, &[9000], GPU)], None, Attrs::default(), GPU).unwrap(),
            )
            .unwrap();
            assert!(got.get(0).as_f64().is_nan(), "sum with a NaN on {d}");
        }
        // sum_rows: each column adds its rows in increasing index from zero.
        for (shape, lays) in [
            (&[37usize, 11][..], &LAYS[..]),
            (&[0, 4], &LAYS[..1]),
            (&[3, 0], &LAYS[..1]),
            (&[5000, 3], &LAYS[..3]),
        ] {
            for (v, &lay) in lays.iter().enumerate() {
                let (x, vals) = make(&vm, d, shape, lay, GPU, 40 + v as u64, false);
                let got =
                    Vals::read(&call(&vm, "sum_rows", &[&x], None, Attrs::default(), GPU).unwrap()).unwrap();
                let (rows, k) = (shape[0], shape[1]);
                let want = Vals::of(
                    out_d,
                    (0..k)
                        .map(|j| {
                            let column = (0..rows).map(|i| vals.get(i * k + j));
                            match d {
                                DType::F16 => Scalar::Float(
                                    f16::from_f32(column.fold(0.0f32, |a, x| a + x.as_f64() as f32)).to_f64(),
                                ),
                                DType::BF16 => Scalar::Float(
                                    bf16::from_f32(column.fold(0.0f32, |a, x| a + x.as_f64() as f32))
                                        .to_f64(),
                                ),
                                DType::F32 => Scalar::Float(f64::from(
                                    column.fold(0.0f32, |a, x| a + x.as_f64() as f32),
                                )),
                                DType::F64 => Scalar::Float(column.fold(0.0f64, |a, x| a + x.as_f64())),
                                _ => Scalar::Int(column.fold(0i64, |a, x| a.wrapping_add(x.as_i64()))),
                            }
                        })
                        .collect::<Vec<_>>(),
                );
                if let Some(diff) = got.first_difference(&want) {
                    panic!("sum_rows {shape:?} {d} {lay:?}: {diff}");
                }
            }
        }
    }
    println!("sums: {with_cpu} compared with the CPU kernels too");
    vm.sync().unwrap();
}

/// Every product (`matmul` with each flag, `matmul_tn`, `matmul_nt`) on every numeric
/// dtype, with inputs contiguous, transposed, stepped, at an offset and broadcast, and
/// outputs contiguous, transposed (cuBLAS writes the transpose) and stepped (through a
/// temporary): integers exactly (wrapping), floats within `1e-5 · Σ|a b|` (`1e-13` for
/// `f64`) plus one rounding to the dtype.
#[test]
#[ignore = "needs a GPU"]
fn matrix_products_on_every_dtype_and_layout() {
    let _g = lock();
    let vm = gpu_vm();
    let (m, n, k) = (13usize, 9usize, 21usize);
    let products: [(&str, Attrs, bool, bool); 5] = [
        ("matmul", Attrs::default(), false, false),
        ("matmul", Attrs::transposed(true, false), true, false),
        ("matmul", Attrs::transposed(false, true), false, true),
        ("matmul_tn", Attrs::default(), true, false),
        ("matmul_nt", Attrs::default(), false, true),
    ];
    let mut calls = 0;
    for d in DType::ALL.into_iter().filter(|&d| d != DType::Bool) {
        for (p, &(op, attrs, ta, tb)) in products.iter().enumerate() {
            let sa: &[usize] = if ta { &[k, m] } else { &[m, k] };
            let sb: &[usize] = if tb { &[n, k] } else { &[k, n] };
            for (v, &la) in LAYS.iter().enumerate() {
                let lb = LAYS[(v + p + 1) % LAYS.len()];
                let lc = [Lay::Contiguous, Lay::Transposed, Lay::Stepped, Lay::Offset][(v + p) % 4];
                let (a, av) = make(&vm, d, sa, la, GPU, 100 + v as u64, false);
                let (b, bv) = make(&vm, d, sb, lb, GPU, 200 + v as u64, false);
                let (c, _) = make(&vm, d, &[m, n], lc, GPU, 300, false);
                let what = format!("{op} {attrs:?} on {d}: a {la:?}, b {lb:?}, c {lc:?}");
                call(&vm, op, &[&a, &b], Some(&c), attrs, GPU).unwrap_or_else(|e| panic!("{what}: {e}"));
                let got = Vals::read(&c).unwrap();
                let at = |x: &Vals, t: bool, rows: usize, i: usize, j: usize| {
                    if t {
                        x.get(j * rows + i)
                    } else {
                        x.get(i * (x.len() / rows.max(1)) + j)
                    }
                };
                for i in 0..m {
                    for j in 0..n {
                        let terms = (0..k).map(|q| (at(&av, ta, m, i, q), at(&bv, tb, k, q, j)));
                        let g = got.get(i * n + j);
                        if d.is_floating() {
                            let (exact, mag) = terms.fold((0.0, 0.0), |(s, t), (x, y)| {
                                (s + x.as_f64() * y.as_f64(), t + (x.as_f64() * y.as_f64()).abs())
                            });
                            let tol = accumulation(d) * mag + store_rounding(d) * exact.abs();
                            assert!(close(g, exact, tol), "{what} [{i}, {j}]: {g} against {exact}");
                        } else {
                            let exact = terms
                                .fold(0i64, |s, (x, y)| s.wrapping_add(x.as_i64().wrapping_mul(y.as_i64())));
                            let want = r::cast(DType::I64, d, Scalar::Int(exact));
                            assert_eq!(g.as_i64(), want.as_i64(), "{what} [{i}, {j}]");
                        }
                    }
                }
                calls += 1;
            }
        }
    }
    // An empty inner dimension gives zeros, into a transposed output too.
    for d in [DType::F32, DType::I64, DType::BF16] {
        let (a, _) = make(&vm, d, &[3, 0], Lay::Contiguous, GPU, 1, false);
        let (b, _) = make(&vm, d, &[0, 2], Lay::Contiguous, GPU, 2, false);
        let (c, _) = make(&vm, d, &[3, 2], Lay::Transposed, GPU, 3, true);
        call(&vm, "matmul", &[&a, &b], Some(&c), Attrs::default(), GPU).unwrap();
        assert_eq!(Vals::read(&c).unwrap(), Vals::of(d, vec![Scalar::Int(0); 6]), "empty product on {d}");
    }
    println!("matrix products: {calls} calls");
    vm.sync().unwrap();
}

/// Refusals are typed errors naming what is wrong.
#[test]
#[ignore = "needs a GPU"]
fn refusals_name_the_operand() {
    let _g = lock();
    let vm = gpu_vm();
    let b = vm.from_slice(&[true, false, true, true], &[4], GPU).unwrap();
    match call(&vm, "sub", &[&b, &b], None, Attrs::default(), GPU) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "sub");
            assert!(detail.contains("not bool"), "{detail}");
        }
        other => panic!("sub on bool: {other:?}"),
    }
    assert!(call(&vm, "cast", &[&b], None, Attrs::default(), GPU).is_err(), "cast without a dtype");
    // Nine dimensions that no merging reduces to eight: the kernel's error names the shape.
    let x = vm.from_slice(&vec![1.0f32; 512], &[512], GPU).unwrap();
    let strides: Vec<isize> = (0..9)
        .map(|d| {
            if d == 8 {
                1
            } else if d % 2 == 0 {
                1 << (7 - d)
            } else {
                1 << (9 - d)
            }
        })
        .collect();
    let v = x.view_layout(&[2; 9], &strides, 0).unwrap();
    let y = call(&vm, "add", &[&v, &v], None, Attrs::default(), GPU).unwrap();
    match y.wait() {
        Err(e) => assert!(e.to_string().contains("[2, 2, 2, 2, 2, 2, 2, 2, 2]"), "{e}"),
        Ok(()) => panic!("nine unmergeable dimensions ran"),
    }
    assert!(vm.sync().is_err());
}

/// Whether `got` (from CUDA) is within `ulps` units in the last place of `want` (from the
/// CPU kernel) in `d`'s precision: NaN where NaN, the same infinity, and otherwise
/// `|got - want| <= ulps · ulp(want)` (for `f16` and `bf16`, also one rounding step of the
/// 16-bit type, since a different `f32` result may round to the neighbour).
pub(super) fn within_ulps(d: DType, got: f64, want: f64, ulps: f64) -> bool {
    if got.is_nan() || want.is_nan() {
        return got.is_nan() && want.is_nan();
    }
    if got.is_infinite() || want.is_infinite() {
        return got == want;
    }
    let eps = match d {
        DType::F64 => f64::EPSILON,
        DType::F16 => 2f64.powi(-10),
        DType::BF16 => 2f64.powi(-7),
        _ => f32::EPSILON as f64,
    };
    // Below the smallest normal number a unit in the last place stays that number's.
    let min_normal = match d {
        DType::F64 => f64::MIN_POSITIVE,
        DType::F16 => 2f64.powi(-14),
        _ => f64::from(f32::MIN_POSITIVE),
    };
    let steps = if matches!(d, DType::F16 | DType::BF16) { ulps.max(1.0) } else { ulps };
    (got - want).abs() <= steps * eps * want.abs().max(min_normal)
}

/// The pointwise math ops on CUDA against the CPU kernels, over every dtype each takes and
/// every layout: the transcendental functions within a few units in the last place (CUDA's
/// `expf` is not Rust's `f32::exp`), the others (`neg`, `abs`, `sign`, `floor`, `ceil`,
/// `round`, the predicates, `maximum`, `minimum`) bit for bit.
#[test]
#[ignore = "needs a GPU"]
fn pointwise_math_matches_the_cpu_kernels() {
    let _g = lock();
    let vm = gpu_vm();
    let float_ops = [
        "exp",
        "exp2",
        "log",
        "log2",
        "log1p",
        "expm1",
        "sqrt",
        "rsqrt",
        "reciprocal",
        "sin",
        "cos",
        "tanh",
        "sigmoid",
        "silu",
        "erf",
        "gelu",
    ];
    let exact_unary =
        ["neg", "abs", "sign", "floor", "ceil", "round", "isnan", "isinf", "isfinite", "logical_not"];
    let mut calls = 0;
    let mut run = |op: &str,
                   inputs: &[(DType, &[usize], Lay)],
                   attrs: Attrs,
                   seed: u64,
                   ulps: Option<f64>| {
        let on = |device: DeviceId| {
            let ts: Vec<Tensor> = inputs
                .iter()
                .enumerate()
                .map(|(i, &(d, shape, lay))| make(&vm, d, shape, lay, device, seed + i as u64, true).0)
                .collect();
            let refs: Vec<&Tensor> = ts.iter().collect();
            call(&vm, op, &refs, None, attrs, device).and_then(|t| Vals::read(&t))
        };
        let what = format!("{op} {inputs:?} with {attrs:?}");
        let gpu = on(GPU).unwrap_or_else(|e| panic!("{what} on cuda:0: {e}"));
        let cpu = on(DeviceId::CPU).unwrap_or_else(|e| panic!("{what} on cpu:0: {e}"));
        match ulps {
            None => {
                if let Some(d) = gpu.first_difference(&cpu) {
                    panic!("{what}: cuda:0 differs from the CPU kernel at {d}");
                }
            }
            Some(u) => {
                assert_eq!(gpu.len(), cpu.len(), "{what}");
                for i in 0..gpu.len() {
                    let (g, c) = (gpu.get(i).as_f64(), cpu.get(i).as_f64());
                    assert!(within_ulps(inputs[0].0, g, c, u), "{what}: element {i}: cuda:0 {g}, cpu:0 {c}");
                }
            }
        }
        calls += 1;
    };
    for (k, op) in float_ops.iter().enumerate() {
        for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
            for (j, shape) in UNARY_SHAPES.iter().enumerate() {
                for (v, &lay) in LAYS.iter().enumerate() {
                    let seed = (k * 1000 + j * 10 + v) as u64;
                    // `gelu`'s `erfc` is CUDA's least exact function here (4 units in the
                    // last place in `f32`, 5 in `f64`), before the two products.
                    let ulps = if *op == "gelu" { 8.0 } else { 4.0 };
                    run(op, &[(d, shape, lay)], Attrs::default(), seed, Some(ulps));
                }
            }
        }
    }
    let tanh_form = Attrs::default().with_params(&[1], &[]).unwrap();
    for d in [DType::F16, DType::BF16, DType::F32, DType::F64] {
        run("gelu", &[(d, &[5, 7], Lay::Stepped)], tanh_form, 99, Some(8.0));
    }
    for (k, op) in exact_unary.iter().enumerate() {
        let numeric = !op.starts_with("is") && *op != "logical_not";
        for d in DType::ALL.into_iter().filter(|&d| !numeric || d != DType::Bool) {
            for (v, &lay) in LAYS.iter().enumerate() {
                run(op, &[(d, &[5, 7], lay)], Attrs::default(), (k * 100 + v) as u64, None);
            }
        }
    }
    for op in ["maximum", "minimum"] {
        for d in DType::ALL {
            for (j, (sa, sb)) in BINARY_SHAPES.iter().enumerate() {
                let (la, lb) = (LAYS[j % LAYS.len()], LAYS[(j + 3) % LAYS.len()]);
                run(op, &[(d, sa, la), (d, sb, lb)], Attrs::default(), j as u64, None);
            }
        }
    }
    println!("pointwise math: {calls} calls on cuda:0 agree with the CPU kernels");
    assert!(calls > 0);
    vm.sync().unwrap();
}
