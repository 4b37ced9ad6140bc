//! The built-in kernels through the VM, end to end: calls on views made by
//! `Tensor::view_layout` on `cpu:0` and `mock:0` (so the builder passes every layout to the
//! kernels as it is, and the engine orders the views' uses), in place, broadcast, across
//! dtypes; and bad calls refused with typed errors naming the op.

use eagervm::ep::mock::MockConfig;
use eagervm::framework::f16;
use eagervm::prelude::*;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

/// `0, 1, 2, ...` as `f32`s.
fn iota(n: usize) -> Vec<f32> {
    (0..n).map(|i| i as f32).collect()
}

/// A transposed input plus a broadcast row, written into every other column of a wider
/// tensor: the output's other elements keep their values.
#[test]
fn strided_broadcast_add_into_a_strided_output() {
    let vm = vm();
    for dev in DEVICES {
        let s = vm.compute_stream(dev).unwrap();
        let add = vm.op("add").unwrap();
        // x: [3, 2] stored, its transpose xt: [2, 3].
        let x = vm.from_slice(&iota(6), &[3, 2], dev).unwrap();
        let xt = x.view_layout(&[2, 3], &[1, 2], 0).unwrap();
        let row = vm.from_slice(&[100.0f32, 200.0, 300.0], &[3], dev).unwrap();
        let wide = vm.from_slice(&[-1.0f32; 12], &[2, 6], dev).unwrap();
        let every_other = wide.view_layout(&[2, 3], &[6, 2], 1).unwrap();
        vm.run(|b| b.call_into(add, &[&xt, &row], &[&every_other], Attrs::default(), s)).unwrap();
        // xt = [[0, 2, 4], [1, 3, 5]].
        assert_eq!(
            wide.to_vec::<f32>().unwrap(),
            [-1.0, 100.0, -1.0, 202.0, -1.0, 304.0, -1.0, 101.0, -1.0, 203.0, -1.0, 305.0],
            "{dev}"
        );
        assert_eq!(every_other.to_vec::<f32>().unwrap(), [100.0, 202.0, 304.0, 101.0, 203.0, 305.0]);
    }
    vm.sync().unwrap();
}

/// `x.add_(y)`, `x[::2].mul_(2)` and `x.masked_fill_(x > 3, 0)`: outputs that are exactly an
/// input.
#[test]
fn in_place_calls_update_their_input() {
    let vm = vm();
    for dev in DEVICES {
        let s = vm.compute_stream(dev).unwrap();
        let (add, mul_scalar, gt_scalar, masked_fill) = (
            vm.op("add").unwrap(),
            vm.op("mul_scalar").unwrap(),
            vm.op("gt_scalar").unwrap(),
            vm.op("masked_fill").unwrap(),
        );
        let x = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[4], dev).unwrap();
        let y = vm.from_slice(&[0.5f32], &[1], dev).unwrap();
        let even = x.view_layout(&[2], &[2], 0).unwrap();
        vm.run(|b| {
            b.call_into(add, &[&x, &y], &[&x], Attrs::default(), s)?;
            b.call_into(mul_scalar, &[&even], &[&even], Attrs::scalar(2.0), s)
        })
        .unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), [3.0, 2.5, 7.0, 4.5], "{dev}");
        let big = vm.run(|b| b.call(gt_scalar, &[&x], Attrs::integer(3), s)).unwrap();
        assert_eq!(big.dtype(), DType::Bool);
        assert_eq!(big.to_vec::<bool>().unwrap(), [false, false, true, true]);
        vm.run(|b| b.call_into(masked_fill, &[&x, &big], &[&x], Attrs::scalar(0.0), s)).unwrap();
        assert_eq!(x.to_vec::<f32>().unwrap(), [3.0, 2.5, 0.0, 0.0], "{dev}");
    }
    vm.sync().unwrap();
}

/// `x[1:3] = y` with `y` broadcast, and a copy from the even elements of a storage to its
/// odd ones (interleaved views of one storage: the builder lets them through, and the
/// kernel reads the old values).
#[test]
fn copies_broadcast_and_read_before_they_write() {
    let vm = vm();
    for dev in DEVICES {
        let s = vm.compute_stream(dev).unwrap();
        let copy = vm.op("copy").unwrap();
        let x = vm.from_slice(&[0i64; 8], &[4, 2], dev).unwrap();
        let rows = x.view_layout(&[2, 2], &[2, 1], 2).unwrap();
        let y = vm.from_slice(&[7i64, 8], &[2], dev).unwrap();
        vm.run(|b| b.call_into(copy, &[&y], &[&rows], Attrs::default(), s)).unwrap();
        assert_eq!(x.to_vec::<i64>().unwrap(), [0, 0, 7, 8, 7, 8, 0, 0], "{dev}");
        let z = vm.from_slice(&iota(6), &[6], dev).unwrap();
        let (even, odd) = (z.view_layout(&[3], &[2], 0).unwrap(), z.view_layout(&[3], &[2], 1).unwrap());
        vm.run(|b| b.call_into(copy, &[&even], &[&odd], Attrs::default(), s)).unwrap();
        assert_eq!(z.to_vec::<f32>().unwrap(), [0.0, 0.0, 2.0, 2.0, 4.0, 4.0], "{dev}");
    }
    vm.sync().unwrap();
}

/// Casts between dtypes, and arithmetic in `f16` (computed in `f32`, rounded once).
#[test]
fn casts_and_half_precision() {
    let vm = vm();
    for dev in DEVICES {
        let s = vm.compute_stream(dev).unwrap();
        let (cast, add, sum) = (vm.op("cast").unwrap(), vm.op("add").unwrap(), vm.op("sum").unwrap());
        let x = vm.from_slice(&[2048.0f32, 1.0, -2.7, f32::NAN], &[4], dev).unwrap();
        let to = |d: DType| Attrs::default().with_dtype(d);
        let (h, i, b) = vm
            .run(|bd| -> Result<_> {
                let h = bd.call(cast, &[&x], to(DType::F16), s)?;
                let i = bd.call(cast, &[&x], to(DType::I32), s)?;
                let b = bd.call(cast, &[&x], to(DType::Bool), s)?;
                Ok((h, i, b))
            })
            .unwrap();
        assert_eq!(i.to_vec::<i32>().unwrap(), [2048, 1, -2, 0], "{dev}");
        assert_eq!(b.to_vec::<bool>().unwrap(), [true; 4]);
        let hv = h.to_vec::<f16>().unwrap();
        assert_eq!(hv[..3], [f16::from_f32(2048.0), f16::ONE, f16::from_f32(-2.7)]);
        // 2048 + 1 is not an f16: it rounds to even, 2048; the sum of the three finite
        // values accumulates in f32 (2046.3...) and rounds once.
        let first3 = h.view_layout(&[3], &[1], 0).unwrap();
        let ones = vm.from_slice(&[f16::ONE], &[], dev).unwrap();
        let (plus, total) = vm
            .run(|bd| -> Result<_> {
                Ok((
                    bd.call(add, &[&first3, &ones], Attrs::default(), s)?,
                    bd.call(sum, &[&first3], Attrs::default(), s)?,
                ))
            })
            .unwrap();
        let minus = f16::from_f32(f16::from_f32(-2.7).to_f32() + 1.0);
        assert_eq!(plus.to_vec::<f16>().unwrap(), [f16::from_f32(2048.0), f16::from_f32(2.0), minus]);
        let want = f16::from_f32(2048.0 + 1.0 + f16::from_f32(-2.7).to_f32());
        assert_eq!(total.to_vec::<f16>().unwrap(), [want], "{dev}");
    }
    vm.sync().unwrap();
}

/// A product of views (a transposed input, a sliced one) equals the transposed product of
/// the stored tensors; `sum` of a transposed view adds in the view's row-major order.
#[test]
fn products_and_sums_of_views() {
    let vm = vm();
    for dev in DEVICES {
        let s = vm.compute_stream(dev).unwrap();
        let (matmul, matmul_tn, sum) =
            (vm.op("matmul").unwrap(), vm.op("matmul_tn").unwrap(), vm.op("sum").unwrap());
        let a = vm.from_slice(&iota(6), &[3, 2], dev).unwrap(); // [k=3, m=2]
        let at = a.view_layout(&[2, 3], &[1, 2], 0).unwrap();
        // b: the first 2 of 4 columns of a [3, 4] tensor.
        let wide = vm.from_slice(&iota(12), &[3, 4], dev).unwrap();
        let b = wide.view_layout(&[3, 2], &[4, 1], 0).unwrap();
        let b_whole = vm.from_slice(&[0.0f32, 1.0, 4.0, 5.0, 8.0, 9.0], &[3, 2], dev).unwrap();
        let (p, q, t) = vm
            .run(|bd| -> Result<_> {
                Ok((
                    bd.call(matmul, &[&at, &b], Attrs::default(), s)?,
                    bd.call(matmul_tn, &[&a, &b_whole], Attrs::default(), s)?,
                    bd.call(sum, &[&at], Attrs::default(), s)?,
                ))
            })
            .unwrap();
        // aᵀ = [[0, 2, 4], [1, 3, 5]], b = [[0, 1], [4, 5], [8, 9]].
        assert_eq!(p.to_vec::<f32>().unwrap(), [40.0, 46.0, 52.0, 61.0], "{dev}");
        assert_eq!(p.to_vec::<f32>().unwrap(), q.to_vec::<f32>().unwrap());
        assert_eq!(t.to_vec::<f32>().unwrap(), [15.0]);
    }
    vm.sync().unwrap();
}

/// Calls the kernels refuse are typed errors at the call, naming the op, and run nothing.
#[test]
fn bad_calls_are_typed_errors_naming_the_op() {
    let vm = vm();
    let s = vm.compute_stream(DeviceId::CPU).unwrap();
    let f = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let i = vm.from_slice(&[1i64, 2], &[2], DeviceId::CPU).unwrap();
    let b = vm.from_slice(&[true, false], &[2], DeviceId::CPU).unwrap();
    let f3 = vm.from_slice(&[1.0f32; 3], &[3], DeviceId::CPU).unwrap();
    let refused = |op: &str, ins: &[&Tensor], attrs: Attrs, want: &str| {
        let k = vm.op(op).unwrap();
        match vm.run(|bd| bd.call(k, ins, attrs, s)) {
            Err(Error::InvalidOperands { op: got, detail }) => {
                assert_eq!(got, op);
                assert!(detail.contains(want), "{op}: {detail}");
            }
            other => panic!("{op}: {other:?}"),
        }
    };
    refused("add", &[&f, &i], Attrs::default(), "input 1 is i64 but input 0 is f32: cast to one dtype first");
    refused("add", &[&f, &f3], Attrs::default(), "the shapes do not broadcast");
    refused(
        "div",
        &[&i, &i],
        Attrs::default(),
        "div of i64 tensors gives floats: cast to a floating dtype first",
    );
    refused("div_scalar", &[&i], Attrs::scalar(2.0), "gives floats");
    refused("sub", &[&b, &b], Attrs::default(), "sub of bool tensors is not supported");
    refused("matmul", &[&b, &b], Attrs::default(), "not supported");
    refused("cast", &[&f], Attrs::default(), "needs the dtype");
    refused("masked_fill", &[&f, &f], Attrs::default(), "takes a bool mask");
    refused(
        "masked_fill",
        &[&f, &vm.from_slice(&[true; 3], &[3], DeviceId::CPU).unwrap()],
        Attrs::default(),
        "does not broadcast",
    );
    refused("relu", &[&b], Attrs::default(), "not supported");
    // A copy keeps the dtype: a given output of another dtype is refused.
    let copy = vm.op("copy").unwrap();
    match vm.run(|bd| bd.call_into(copy, &[&f], &[&i], Attrs::default(), s)) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "copy");
            assert!(detail.contains("cast converts"), "{detail}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(i.to_vec::<i64>().unwrap(), [1, 2]);
    vm.sync().unwrap();
}
