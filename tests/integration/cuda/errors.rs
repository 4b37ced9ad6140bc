//! Errors that depend on data, on `cuda:0` as on the CPU: each op whose kernel reads an
//! index or a target from device data (`index_select`, `gather`, `scatter`, `index_add`,
//! `index`, `index_put`, `one_hot`, `nll_loss`), given one bad value among good ones, fails
//! with the CPU kernel's error (the kernel reports it to the stream's fault record, and
//! the checked launch turns it into the call's error: `docs/cuda.md`, "Errors"). A call
//! that reads the failed output fails with the same error, a tensor computed after it
//! reads fine, and the next call with good data gives the CPU's values.

use eagervm::framework::Scalar;
use eagervm::prelude::*;

use super::kernels::call;
use super::reference::Vals;
use super::{gpu_vm, lock};

const GPU: DeviceId = DeviceId::cuda(0);

/// One input: dtype, shape, and its values with the bad one and with it made good.
struct In {
    dtype: DType,
    shape: &'static [usize],
    bad: Vec<i64>,
    good: Vec<i64>,
}

fn data(dtype: DType, shape: &'static [usize], v: &[i64]) -> In {
    In { dtype, shape, bad: v.to_vec(), good: v.to_vec() }
}

/// An index input whose element `at` is `bad`, `good` in the good call.
fn index(dtype: DType, shape: &'static [usize], v: &[i64], at: usize, bad: i64) -> In {
    let mut b = v.to_vec();
    b[at] = bad;
    In { dtype, shape, bad: b, good: v.to_vec() }
}

/// `n` float values 0.5, 1.5, ...
fn floats(n: usize) -> Vec<i64> {
    (0..n as i64).collect()
}

fn tensor(vm: &VirtualMachine, i: &In, good: bool, device: DeviceId) -> Tensor {
    let v = if good { &i.good } else { &i.bad };
    let vals = if i.dtype.is_floating() {
        Vals::of(i.dtype, v.iter().map(|&x| Scalar::Float(x as f64 + 0.5)))
    } else {
        Vals::of(i.dtype, v.iter().map(|&x| Scalar::Int(x)))
    };
    vals.tensor(vm, i.shape, device)
}

/// `op` on `inputs` (the bad or the good values) on `device`.
fn run(vm: &VirtualMachine, op: &str, inputs: &[In], attrs: Attrs, good: bool, device: DeviceId) -> Tensor {
    let ts: Vec<Tensor> = inputs.iter().map(|i| tensor(vm, i, good, device)).collect();
    let refs: Vec<&Tensor> = ts.iter().collect();
    call(vm, op, &refs, None, attrs, device).unwrap_or_else(|e| panic!("{op} on {device} refused: {e}"))
}

/// The op and message of a read that fails with a kernel error.
fn kernel_error(r: Result<Vals>, what: &str) -> (String, String) {
    match r {
        Err(Error::Kernel { op, message, .. }) => (op, message),
        other => panic!("{what}: expected a kernel error, got {other:?}"),
    }
}

fn params(ints: &[i64]) -> Attrs {
    Attrs::default().with_params(ints, &[]).unwrap()
}

/// The cases: op, inputs, attributes, and the CPU kernel's message for the bad call.
fn cases() -> Vec<(&'static str, Vec<In>, Attrs, &'static str)> {
    let x = || data(DType::F32, &[5, 3], &floats(15));
    let mut out = Vec::new();
    for ix in [DType::I64, DType::I32] {
        out.push((
            "index_select",
            vec![x(), index(ix, &[4], &[0, 3, 2, 4], 1, 7)],
            params(&[0]),
            "index_select: index 7 is out of range for dimension 0 of size 5",
        ));
        out.push((
            "gather",
            vec![x(), index(ix, &[2, 3], &[0, 1, 2, 2, 1, 0], 4, 9)],
            params(&[1]),
            "gather: index 9 is out of range for dimension 1 of size 3",
        ));
        out.push((
            "scatter",
            vec![x(), index(ix, &[2, 3], &[0, 1, 2, 3, 4, 0], 2, -1), data(DType::F32, &[2, 3], &floats(6))],
            params(&[0, 0]),
            "scatter: index -1 is out of range for dimension 0 of size 5",
        ));
        out.push((
            "index_add",
            vec![x(), index(ix, &[4], &[4, 0, 2, 1], 3, 5), data(DType::F32, &[4, 3], &floats(12))],
            params(&[0]),
            "index_add: index 5 is out of range for dimension 0 of size 5",
        ));
        out.push((
            "index",
            vec![x(), index(ix, &[3], &[0, -1, 1], 1, -7)],
            params(&[0]),
            "index: index -7 is out of range for dimension 0 of size 5",
        ));
        out.push((
            "index_put",
            vec![x(), data(DType::F32, &[3, 3], &floats(9)), index(ix, &[3], &[0, 4, 1], 1, 5)],
            params(&[0, 0, 0]),
            "index_put: index 5 is out of range for dimension 0 of size 5",
        ));
    }
    out.push((
        "one_hot",
        vec![index(DType::I64, &[4], &[0, 2, 1, 2], 1, 3)],
        params(&[3]),
        "one_hot: class index 3 is outside 0..3 (num_classes=3)",
    ));
    for reduction in [0, 1] {
        out.push((
            "nll_loss",
            vec![data(DType::F32, &[4, 3], &floats(12)), index(DType::I64, &[4], &[0, 2, 1, -100], 2, 5)],
            params(&[reduction, -100, 0]),
            "target 5 is out of bounds: the classes are 0 to 2",
        ));
    }
    out
}

#[test]
#[ignore = "needs a GPU"]
fn a_bad_index_fails_the_call_as_on_the_cpu() {
    let _g = lock();
    let vm = gpu_vm();
    let add = |t: &Tensor, device| call(&vm, "add", &[t, t], None, Attrs::default(), device).unwrap();
    let mut checked = 0;
    for (op, inputs, attrs, message) in cases() {
        let what = format!("{op} ({:?} indices, {attrs:?})", inputs.last().map(|i| i.dtype));
        // The bad call, a call that reads its output, and an independent one after both.
        let bad = run(&vm, op, &inputs, attrs, false, GPU);
        let downstream = add(&bad, GPU);
        let fresh = Vals::of(DType::F32, [Scalar::Float(1.5), Scalar::Float(-2.0)]).tensor(&vm, &[2], GPU);
        let independent = add(&fresh, GPU);
        let cpu = run(&vm, op, &inputs, attrs, false, DeviceId::CPU);
        let want = kernel_error(Vals::read(&cpu), &format!("{what} on the CPU"));
        assert_eq!(want.1, message, "{what}: the CPU's message");
        assert_eq!(kernel_error(Vals::read(&bad), &what), want, "{what}");
        assert_eq!(kernel_error(Vals::read(&downstream), &format!("{what}, downstream")), want, "{what}");
        let sum =
            Vals::read(&independent).unwrap_or_else(|e| panic!("{what}: an independent call failed: {e}"));
        assert_eq!(sum, Vals::of(DType::F32, [Scalar::Float(3.0), Scalar::Float(-4.0)]), "{what}");
        match vm.sync() {
            Err(Error::Failed { count: 2, .. }) => {}
            other => panic!("{what}: the GPU's and the CPU's calls fail, nothing else: {other:?}"),
        }
        // The next call, with good data: no fault is left over, and the values are the CPU's.
        let good = Vals::read(&run(&vm, op, &inputs, attrs, true, GPU))
            .unwrap_or_else(|e| panic!("{what}: the good call after the bad one failed: {e}"));
        let cpu = Vals::read(&run(&vm, op, &inputs, attrs, true, DeviceId::CPU)).unwrap();
        if let Some(diff) = good.first_difference(&cpu) {
            panic!("{what}: the good call differs from the CPU at {diff}");
        }
        vm.sync().unwrap_or_else(|e| panic!("{what}: the good calls failed: {e}"));
        checked += 1;
    }
    println!("{checked} ops on cuda:0 fail on bad data with the CPU's error and recover");
}

/// Bad and good calls of one op interleaved in one run: each answers for its own data.
#[test]
#[ignore = "needs a GPU"]
fn each_call_answers_for_its_own_indices() {
    let _g = lock();
    let vm = gpu_vm();
    let x = Vals::of(DType::F32, (0..15).map(|v| Scalar::Float(v as f64))).tensor(&vm, &[5, 3], GPU);
    let idx = |v: i64| Vals::of(DType::I64, [Scalar::Int(v)]).tensor(&vm, &[1], GPU);
    let (good, bad) = (idx(2), idx(5));
    let (op, s) = (vm.op("index_select").unwrap(), vm.compute_stream(GPU).unwrap());
    let outs = vm
        .run(|b| {
            (0..16)
                .map(|k| b.call(op, &[&x, if k % 3 == 1 { &bad } else { &good }], params(&[0]), s))
                .collect::<Result<Vec<_>>>()
        })
        .unwrap();
    for (k, o) in outs.iter().enumerate() {
        if k % 3 == 1 {
            let (op, message) = kernel_error(Vals::read(o), &format!("call {k}"));
            assert_eq!(op, "index_select");
            assert_eq!(message, "index_select: index 5 is out of range for dimension 0 of size 5");
        } else {
            let v = o.to_vec::<f32>().unwrap_or_else(|e| panic!("call {k}: {e}"));
            assert_eq!(v, [6.0, 7.0, 8.0], "call {k}");
        }
    }
    assert!(matches!(vm.sync(), Err(Error::Failed { count: 5, .. })));
}

/// With `check_data` off, a bad index is not reported: the element is 0, as before checks.
#[test]
#[ignore = "needs a GPU"]
fn without_the_check_a_bad_index_gives_zero() {
    let _g = lock();
    let vm = match VirtualMachine::new(Config { check_data: false, ..Config::default() }.with_cuda_devices(1))
    {
        Ok(vm) => vm,
        Err(e) => panic!("this test needs a GPU (cuda:0): {e}"),
    };
    let x = Vals::of(DType::F32, (0..6).map(|v| Scalar::Float(v as f64 + 1.0))).tensor(&vm, &[3, 2], GPU);
    let i = Vals::of(DType::I64, [Scalar::Int(2), Scalar::Int(9)]).tensor(&vm, &[2], GPU);
    let y = call(&vm, "index_select", &[&x, &i], None, params(&[0]), GPU).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [5.0, 6.0, 0.0, 0.0]);
    vm.sync().unwrap();
    // The record the kernel wrote is not read by this VM; a new VM's streams start clean.
    drop(vm);
    let vm = gpu_vm();
    let x = Vals::of(DType::F32, [Scalar::Float(1.0)]).tensor(&vm, &[1], GPU);
    let i = Vals::of(DType::I64, [Scalar::Int(0)]).tensor(&vm, &[1], GPU);
    let y = call(&vm, "index_select", &[&x, &i], None, params(&[0]), GPU).unwrap();
    assert_eq!(y.to_vec::<f32>().unwrap(), [1.0]);
}
