//! The eager front end: every op against a plain Rust reference on the CPU and on the mock
//! device, the errors it refuses calls with, and its batching.

use eagervm::eager::{Array, Context, ContextOptions};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(2, MockConfig::default())).unwrap()
}

const DEVICES: [DeviceId; 2] = [DeviceId::CPU, DeviceId::mock(0)];

/// Deterministic values in [-2, 2) with a few exact zeros (to exercise relu at 0).
fn values(n: usize, seed: u64) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|i| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            if i % 7 == 3 {
                0.0
            } else {
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            }
        })
        .collect()
}

fn matmul_ref(a: &[f32], b: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; m * n];
    for i in 0..m {
        for p in 0..k {
            for j in 0..n {
                out[i * n + j] += a[i * k + p] * b[p * n + j];
            }
        }
    }
    out
}

fn transpose(a: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut t = vec![0.0; a.len()];
    for r in 0..rows {
        for c in 0..cols {
            t[c * rows + r] = a[r * cols + c];
        }
    }
    t
}

fn read(a: &Array) -> Vec<f32> {
    a.to(DeviceId::CPU).unwrap().to_vec::<f32>().unwrap()
}

fn close(got: &[f32], want: &[f32]) {
    assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!((g - w).abs() <= 1e-4 * (1.0 + w.abs()), "element {i}: {g} != {w}");
    }
}

#[test]
fn every_op_matches_a_plain_reference_on_cpu_and_mock() {
    let vm = vm();
    for dev in DEVICES {
        let cx = Context::new(&vm);
        let (m, k, n) = (5, 4, 3);
        let (av, bv, cv) = (values(m * k, 1), values(k * n, 2), values(m * k, 3));
        let a = cx.from_slice(&av, &[m, k], dev).unwrap();
        let b = cx.from_slice(&bv, &[k, n], dev).unwrap();
        let c = cx.from_slice(&cv, &[m, k], dev).unwrap();
        assert_eq!((a.shape(), a.dtype(), a.device()), (&[m, k][..], DType::F32, dev));

        let zip = |f: fn(f32, f32) -> f32| av.iter().zip(&cv).map(|(&x, &y)| f(x, y)).collect::<Vec<_>>();
        assert_eq!(read(&a.add(&c).unwrap()), zip(|x, y| x + y), "add on {dev}");
        assert_eq!(read(&a.sub(&c).unwrap()), zip(|x, y| x - y), "sub on {dev}");
        assert_eq!(read(&a.mul(&c).unwrap()), zip(|x, y| x * y), "mul on {dev}");
        assert_eq!(
            read(&c.relu_grad(&a).unwrap()),
            zip(|dy, x| if x > 0.0 { dy } else { 0.0 }),
            "relu_grad on {dev}"
        );
        let scaled: Vec<f32> = av.iter().map(|x| x * 0.5).collect();
        assert_eq!(read(&a.scale(0.5).unwrap()), scaled, "scale on {dev}");
        let relu: Vec<f32> = av.iter().map(|&x| if x < 0.0 { 0.0 } else { x }).collect();
        assert_eq!(read(&a.relu().unwrap()), relu, "relu on {dev}");
        assert_eq!(read(&a.sum().unwrap()), vec![av.iter().fold(0.0f32, |s, &x| s + x)], "sum on {dev}");

        close(&read(&a.matmul(&b).unwrap()), &matmul_ref(&av, &bv, m, k, n));
        // aᵀ c: [m, k]ᵀ x [m, k] = [k, k]; a btᵀ with bt = bᵀ: [m, k] x [n, k]ᵀ = a b.
        close(&read(&a.matmul_tn(&c).unwrap()), &matmul_ref(&transpose(&av, m, k), &cv, k, m, k));
        let bt = cx.from_slice(&transpose(&bv, k, n), &[n, k], dev).unwrap();
        close(&read(&a.matmul_nt(&bt).unwrap()), &matmul_ref(&av, &bv, m, k, n));

        let bias = values(k, 4);
        let bias_a = cx.from_slice(&bias, &[k], dev).unwrap();
        let want: Vec<f32> = av.iter().enumerate().map(|(i, x)| x + bias[i % k]).collect();
        assert_eq!(read(&a.add_bias(&bias_a).unwrap()), want, "add_bias on {dev}");
        let mut cols = vec![0.0f32; k];
        for (i, x) in av.iter().enumerate() {
            cols[i % k] += x;
        }
        assert_eq!(read(&a.sum_rows().unwrap()), cols, "sum_rows on {dev}");

        assert_eq!(read(&cx.zeros(&[2, 3], DType::F32, dev).unwrap()), vec![0.0; 6]);
        assert_eq!(read(&cx.full(&[4], 2.5, DType::F32, dev).unwrap()), vec![2.5; 4]);
        let i = cx.full(&[3], -1.9, DType::I64, dev).unwrap();
        assert_eq!(i.to(DeviceId::CPU).unwrap().to_vec::<i64>().unwrap(), vec![-1; 3]);
    }
}

#[test]
fn i64_arrays_work_too() {
    let vm = vm();
    let cx = Context::new(&vm);
    let a = cx.from_slice(&[1i64, -2, 3, 4], &[2, 2], DeviceId::mock(0)).unwrap();
    let b = cx.from_slice(&[5i64, 6], &[2], DeviceId::mock(0)).unwrap();
    let y = a.add_bias(&b).unwrap().matmul(&a).unwrap().sub(&a).unwrap();
    // a + b = [6 4; 8 10]; (a + b) a = [6+12 -12+16; 8+30 -16+40] = [18 4; 38 24]; minus a.
    assert_eq!(y.to(DeviceId::CPU).unwrap().to_vec::<i64>().unwrap(), vec![17, 6, 35, 20]);
    assert_eq!(y.sum().unwrap().to(DeviceId::CPU).unwrap().item::<i64>().unwrap(), 78);
}

#[test]
fn copies_move_between_host_and_devices() {
    let vm = vm();
    let cx = Context::new(&vm);
    let v = values(64, 9);
    let h = cx.from_slice(&v, &[8, 8], DeviceId::CPU).unwrap();
    let d0 = h.to(DeviceId::mock(0)).unwrap();
    let d1 = d0.to(DeviceId::mock(1)).unwrap();
    assert_eq!(d1.device(), DeviceId::mock(1));
    let back = d1.scale(2.0).unwrap().to(DeviceId::CPU).unwrap();
    assert_eq!(back.device(), DeviceId::CPU);
    let want: Vec<f32> = v.iter().map(|x| x * 2.0).collect();
    assert_eq!(back.to_vec::<f32>().unwrap(), want);
    // `to` the device an array is on already is the same array.
    assert_eq!(h.to(DeviceId::CPU).unwrap().id(), h.id());
    // Reading a device array directly goes through its D2H stream too.
    assert_eq!(d0.to_vec::<f32>().unwrap(), v);
}

#[test]
fn bad_calls_are_refused_at_the_call_with_typed_errors() {
    let vm = vm();
    let cx = Context::new(&vm);
    let a = cx.zeros(&[2, 3], DType::F32, DeviceId::CPU).unwrap();
    let b = cx.zeros(&[3, 2], DType::F32, DeviceId::CPU).unwrap();
    let before = cx.stats().calls;

    match a.add(&b) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "add");
            assert!(detail.contains("the shapes do not broadcast"), "{detail}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    match a.matmul(&a) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "matmul");
            assert!(detail.contains("inner dimensions differ (3 != 2)"), "{detail}");
        }
        other => panic!("expected a shape error, got {other:?}"),
    }
    let bad_bias = cx.zeros(&[2], DType::F32, DeviceId::CPU).unwrap();
    assert!(matches!(a.add_bias(&bad_bias), Err(Error::InvalidOperands { .. })));
    // Mixed dtypes promote (PyTorch's rule); subtracting bools is refused, as in PyTorch.
    let ints = cx.zeros(&[2, 3], DType::I64, DeviceId::CPU).unwrap();
    assert_eq!(a.sub(&ints).unwrap().dtype(), DType::F32);
    let flags = cx.zeros(&[2, 3], DType::Bool, DeviceId::CPU).unwrap();
    match flags.sub(&flags) {
        Err(Error::InvalidOperands { op, detail }) => {
            assert_eq!(op, "sub");
            assert!(detail.contains("sub of bool tensors is not supported"), "{detail}")
        }
        other => panic!("expected a dtype error, got {other:?}"),
    }
    let on_mock = a.to(DeviceId::mock(0)).unwrap();
    match a.add(&on_mock) {
        Err(Error::WrongDevice { op, tensor, tensor_device, stream_device }) => {
            assert_eq!((op.as_str(), tensor), ("add", on_mock.id()));
            assert_eq!((tensor_device, stream_device), (DeviceId::mock(0), DeviceId::CPU));
        }
        other => panic!("expected a device error, got {other:?}"),
    }
    assert!(matches!(a.to(DeviceId::mock(7)), Err(Error::Device(_))));
    assert!(matches!(cx.from_slice(&[1.0f32; 5], &[2, 3], DeviceId::CPU), Err(Error::Access { .. })));
    assert!(matches!(a.to_vec::<i64>(), Err(Error::DType { expected: DType::F32, found: DType::I64 })));
    assert!(matches!(a.item::<f32>(), Err(Error::Access { .. })));
    // Refused calls queue nothing; the accepted ones do: three `zeros`, the mixed-dtype
    // `sub` (a cast, then the op), the copy.
    assert_eq!(cx.stats().calls, before + 6);
    // The context keeps working after refusals.
    assert_eq!(a.add(&a).unwrap().to_vec::<f32>().unwrap(), vec![0.0; 6]);
}

#[test]
fn a_released_array_is_refused_in_every_clone() {
    let vm = vm();
    let cx = Context::new(&vm);
    let a = cx.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let kept = a.scale(3.0).unwrap(); // queued before the release: still computed
    let clone = a.clone();
    a.release().unwrap();
    match clone.relu() {
        Err(Error::Released { tensor }) => assert_eq!(tensor, a.id()),
        other => panic!("expected a released error, got {other:?}"),
    }
    assert!(matches!(a.to_vec::<f32>(), Err(Error::Released { .. })));
    assert!(matches!(kept.add(&clone), Err(Error::Released { .. })));
    assert_eq!(kept.to_vec::<f32>().unwrap(), vec![3.0, 6.0]);
    cx.sync().unwrap();
}

#[test]
fn calls_are_batched_until_a_flush_point() {
    let vm = vm();
    let cx = Context::with_options(&vm, ContextOptions { flush_every: 4 });
    let a = cx.full(&[3], 1.0, DType::F32, DeviceId::CPU).unwrap();
    let mut x = a.clone();
    for _ in 0..9 {
        x = x.add(&a).unwrap();
    }
    // 10 calls: flushed at 4 and 8, two queued.
    let s = cx.stats();
    assert_eq!((s.calls, s.flushes, s.pending), (10, 2, 2));
    assert_eq!(x.to_vec::<f32>().unwrap(), vec![10.0; 3]);
    assert_eq!(cx.stats().pending, 0);
    assert_eq!(cx.stats().flushes, 3);

    // One call per flush gives the same values.
    let one = Context::with_options(&vm, ContextOptions { flush_every: 1 });
    let b = one.full(&[3], 1.0, DType::F32, DeviceId::CPU).unwrap();
    let y = b.add(&b).unwrap().add(&b).unwrap();
    assert_eq!(one.stats().pending, 0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0; 3]);
}

#[test]
fn arrays_of_two_contexts_combine_in_order() {
    let vm = vm();
    let first = Context::new(&vm);
    let second = Context::new(&vm);
    let a = first.from_slice(&[1.0f32, -1.0], &[2], DeviceId::mock(0)).unwrap();
    let b = second.full(&[2], 2.0, DType::F32, DeviceId::mock(0)).unwrap();
    // `a`'s writes are still queued in `first`; using it from `second` flushes `first`.
    let c = b.mul(&a).unwrap();
    assert_eq!(first.stats().pending, 0);
    assert_eq!(read(&c), vec![2.0, -2.0]);
    drop(a);
    drop(c);
    // The low-level handle works with `vm.run` once taken (taking it flushes).
    let d = b.scale(0.25).unwrap();
    let t = d.tensor().unwrap().clone();
    let relu = vm.op("relu").unwrap();
    let s = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let r = vm.run(|bld| bld.call(relu, &[&t], Attrs::default(), s)).unwrap();
    assert_eq!(second.wrap(r).to_vec::<f32>().unwrap(), vec![0.5, 0.5]);
    vm.sync().unwrap();
}

#[test]
fn a_failed_kernel_poisons_what_it_feeds_only() {
    let vm = vm();
    let cx = Context::new(&vm);
    for dev in DEVICES {
        let x = cx.from_slice(&[1.0f32, -2.0], &[2], dev).unwrap();
        let spec = eagervm::framework::OutSpec { shape: [2].into_iter().collect(), dtype: DType::F32 };
        let bad = cx.call("fail", &[&x], Attrs::scalar(5.0), &[spec], dev).unwrap().pop().unwrap();
        let worse = bad.add(&x).unwrap().relu().unwrap();
        let good = x.relu().unwrap();
        for t in [&bad, &worse] {
            match t.to_vec::<f32>() {
                Err(Error::Kernel { op, message, .. }) => {
                    assert_eq!((op.as_str(), message.as_str()), ("fail", "fail op: 5"))
                }
                other => panic!("expected the kernel's error on {dev}, got {other:?}"),
            }
        }
        assert!(worse.wait().is_err());
        assert_eq!(read(&good), vec![1.0, 0.0]);
        assert!(matches!(cx.sync(), Err(Error::Failed { .. })));
        cx.sync().unwrap();
    }
}

/// The case: `a` made in `cx1`; in `cx2`, `c = x + a` and an unrelated `d = 2x` are
/// accepted and queued; then `a` is released through `cx1`. The release waits for the uses
/// `cx2` accepted, and `cx2`'s flush neither refuses `c` nor drops `d`.
#[test]
fn a_release_in_one_context_waits_for_uses_queued_in_another() {
    let vm = vm();
    for dev in DEVICES {
        let cx1 = Context::new(&vm);
        let cx2 = Context::new(&vm);
        let a = cx1.from_slice(&[1.0f32, 2.0], &[2], dev).unwrap();
        let x = cx2.from_slice(&[10.0f32, 20.0], &[2], dev).unwrap();
        let c = x.add(&a).unwrap();
        let d = x.scale(2.0).unwrap();
        assert!(cx2.stats().pending > 0, "the uses are queued, not yet handed to the VM");
        vm.start_profiling().unwrap();
        a.release().unwrap();
        assert_eq!(read(&c), vec![11.0, 22.0], "on {dev}");
        assert_eq!(read(&d), vec![20.0, 40.0], "on {dev}");
        // Calls made after the release are refused at the call, in every context.
        assert!(matches!(x.add(&a), Err(Error::Released { tensor }) if tensor == a.id()));
        cx1.sync().unwrap();
        cx2.sync().unwrap();
        // `a`'s `Release` went to the VM after `cx2`'s flush, behind the use it held back.
        let p = vm.stop_profiling().unwrap();
        let at = |name: &str| {
            p.instructions()
                .iter()
                .find(|i| i.name == name && i.tensors.contains(&a.id()))
                .map(|i| i.program)
                .unwrap_or_else(|| panic!("no {name} of a on {dev}"))
        };
        assert!(at("add") < at("Release"), "on {dev}");
    }
}

/// A call the builder would refuse (more inputs than an instruction counts) is refused at
/// the call, like every other, not at the flush, and the context goes on.
#[test]
fn a_call_the_builder_would_refuse_is_refused_at_the_call() {
    let vm = vm();
    let cx = Context::new(&vm);
    let a = cx.full(&[2], 1.0, DType::F32, DeviceId::CPU).unwrap();
    let many: Vec<&Array> = vec![&a; eagervm::framework::MAX_INPUTS + 1];
    let spec = eagervm::framework::OutSpec { shape: [2].into_iter().collect(), dtype: DType::F32 };
    let r = cx.call("noop", &many, Attrs::default(), &[spec], DeviceId::CPU);
    assert!(
        matches!(&r, Err(Error::InvalidOperands { detail, .. }) if detail.contains("at most 255")),
        "{r:?}"
    );
    assert_eq!(a.scale(3.0).unwrap().to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    cx.sync().unwrap();
}

/// Arrays and contexts are owned handles: `Clone + Send + Sync + 'static`, so a model keeps
/// its weights in a struct beside its VM.
#[test]
fn arrays_are_owned_handles_that_live_beside_their_vm() {
    fn owned<T: Clone + Send + Sync + 'static>() {}
    owned::<Array>();
    owned::<Context>();

    struct Model {
        vm: VirtualMachine,
        w: Array,
        b: Array,
    }
    impl Model {
        fn forward(&self, x: &Array) -> eagervm::Result<Array> {
            x.matmul(&self.w)?.add_bias(&self.b)?.relu()
        }
    }
    let vm = vm();
    let cx = Context::new(&vm);
    let w = cx.from_slice(&[1.0f32, -1.0, 2.0, 0.5], &[2, 2], DeviceId::CPU).unwrap();
    let b = cx.from_slice(&[0.5f32, -10.0], &[2], DeviceId::CPU).unwrap();
    let m = Model { vm, w, b };
    let x = cx.from_slice(&[1.0f32, 2.0, -1.0, 1.0], &[2, 2], DeviceId::CPU).unwrap();
    // [1 2; -1 1] @ [1 -1; 2 0.5] = [5 0; 1 1.5], plus [0.5, -10], relu.
    assert_eq!(m.forward(&x).unwrap().to_vec::<f32>().unwrap(), vec![5.5, 0.0, 1.5, 0.0]);
    m.vm.sync().unwrap();
}

/// Arrays move to other threads and are used there, concurrently, through one context.
#[test]
fn arrays_are_used_from_several_threads() {
    let vm = vm();
    let cx = Context::with_options(&vm, ContextOptions { flush_every: 3 });
    for dev in DEVICES {
        let x = cx.from_slice(&values(64, 1), &[8, 8], dev).unwrap();
        let want = matmul_ref(&values(64, 1), &values(64, 1), 8, 8, 8);
        let sums: Vec<Vec<f32>> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..4)
                .map(|i| {
                    let x = x.clone();
                    s.spawn(move || {
                        let mut y = x.matmul(&x).unwrap();
                        for _ in 0..i {
                            y = y.scale(1.0).unwrap();
                        }
                        read(&y)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for got in sums {
            close(&got, &want);
        }
    }
    cx.sync().unwrap();
}

/// Arrays keep their VM running: dropping the `VirtualMachine` first returns at once, the
/// arrays keep working, and the VM shuts down (its threads joined) when the last goes.
#[test]
fn arrays_keep_their_vm_running_after_it_is_dropped() {
    let vm = vm();
    let cx = Context::new(&vm);
    let x = cx.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::mock(0)).unwrap();
    let low = x.tensor().unwrap().clone();
    drop(vm);
    let y = x.relu().unwrap().scale(2.0).unwrap();
    assert_eq!(read(&y), vec![2.0, 0.0, 6.0]);
    assert_eq!(low.to_vec::<f32>().unwrap(), vec![1.0, -2.0, 3.0], "the VM is still running");
    drop(cx);
    let z = y.add(&y).unwrap();
    drop((x, y));
    // The last handle: `z`'s call is drained before the VM stops.
    let z_tensor = z.tensor().unwrap().clone();
    drop(z);
    // Every handle of the VM is gone: it has shut down, and a low-level handle says so.
    assert_eq!(low.to_vec::<f32>(), Err(Error::ShutDown));
    assert_eq!(z_tensor.wait(), Err(Error::ShutDown));
}

/// The in-place and `out=` forms give the values the plain forms give, keep the order of
/// every use (a read made before an in-place update sees the old value), and refuse what
/// the plain forms refuse.
#[test]
fn in_place_and_out_forms_match_the_plain_ones() {
    let vm = vm();
    let cx = Context::new(&vm);
    for dev in DEVICES {
        let (a, b) = (values(12, 3), values(12, 4));
        let xa = cx.from_slice(&a, &[3, 4], dev).unwrap();
        let xb = cx.from_slice(&b, &[3, 4], dev).unwrap();
        let bias = cx.from_slice(&values(4, 5), &[4], dev).unwrap();
        let plain = [
            xa.add(&xb).unwrap(),
            xa.sub(&xb).unwrap(),
            xa.mul(&xb).unwrap(),
            xa.add_bias(&bias).unwrap(),
            xa.scale(-1.5).unwrap(),
            xa.relu().unwrap(),
        ];
        // out=: written into existing arrays.
        let mut outs: Vec<Array> = (0..6).map(|_| cx.zeros(&[3, 4], DType::F32, dev).unwrap()).collect();
        xa.add_into(&xb, &mut outs[0]).unwrap();
        xa.sub_into(&xb, &mut outs[1]).unwrap();
        xa.mul_into(&xb, &mut outs[2]).unwrap();
        xa.add_bias_into(&bias, &mut outs[3]).unwrap();
        xa.scale_into(-1.5, &mut outs[4]).unwrap();
        xa.relu_into(&mut outs[5]).unwrap();
        // In place: on copies of `xa`, each read before its update.
        let mut ins: Vec<Array> = Vec::new();
        let mut before = Vec::new();
        for i in 0..6 {
            let mut y = xa.add(&cx.zeros(&[3, 4], DType::F32, dev).unwrap()).unwrap();
            before.push(y.scale(1.0).unwrap());
            let alias = y.clone();
            match i {
                0 => y.add_(&xb).map(|_| ()),
                1 => y.sub_(&xb).map(|_| ()),
                2 => y.mul_(&xb).map(|_| ()),
                3 => y.add_bias_(&bias).map(|_| ()),
                4 => y.scale_(-1.5).map(|_| ()),
                _ => y.relu_().map(|_| ()),
            }
            .unwrap();
            ins.push(alias); // another handle of the array updated: it sees the update
        }
        for i in 0..6 {
            let want = read(&plain[i]);
            assert_eq!(read(&outs[i]), want, "out= form {i} on {dev}");
            assert_eq!(read(&ins[i]), want, "in-place form {i} on {dev}");
            assert_eq!(read(&before[i]), a, "a read made before the in-place update {i} on {dev}");
        }
        // The products, the transposed ones through `matmul`'s flags.
        let (m, k, n) = (3, 4, 2);
        let (p, q) = (values(m * k, 6), values(k * n, 7));
        let xp = cx.from_slice(&p, &[m, k], dev).unwrap();
        let xq = cx.from_slice(&q, &[k, n], dev).unwrap();
        let mut out = cx.zeros(&[m, n], DType::F32, dev).unwrap();
        xp.matmul_into(&xq, &mut out).unwrap();
        close(&read(&out), &matmul_ref(&p, &q, m, k, n));
        let xpt = cx.from_slice(&transpose(&p, m, k), &[k, m], dev).unwrap();
        let xqt = cx.from_slice(&transpose(&q, k, n), &[n, k], dev).unwrap();
        assert_eq!(read(&xpt.matmul_t(&xq, true, false).unwrap()), read(&out));
        assert_eq!(read(&xp.matmul_t(&xqt, false, true).unwrap()), read(&out));
        assert_eq!(read(&xpt.matmul_tn(&xq).unwrap()), read(&out));
        assert!(matches!(xpt.matmul_t(&xqt, true, true), Err(Error::InvalidOperands { .. })));
        // Refusals: a wrong shape, an output that is an input, the wrong dtype.
        let mut small = cx.zeros(&[2], DType::F32, dev).unwrap();
        assert!(matches!(xa.add_into(&xb, &mut small), Err(Error::OutputMismatch { .. })));
        // An output that is an input, to an op that does not work in place (`add` does).
        let square = cx.from_slice(&values(4, 8), &[2, 2], dev).unwrap();
        let mut alias = square.clone();
        assert!(matches!(square.matmul_into(&square, &mut alias), Err(Error::Aliased { .. })));
        let mut ints = cx.zeros(&[3, 4], DType::I64, dev).unwrap();
        assert!(matches!(xa.relu_into(&mut ints), Err(Error::OutputMismatch { .. })));
        assert!(matches!(small.add_(&xb), Err(Error::InvalidOperands { .. })));
        assert_eq!(read(&small), vec![0.0, 0.0], "a refused in-place call changes nothing");
    }
    cx.sync().unwrap();
}

/// The builder's short forms: default attributes on the compute stream of the first
/// input's device, `.with(attrs)` and `.on(stream)`; a call with no input names its stream.
#[test]
fn the_builder_takes_defaults() {
    let vm = vm();
    let gpu = DeviceId::mock(0);
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], gpu).unwrap();
    let (relu, scale, fill) = (vm.op("relu").unwrap(), vm.op("scale").unwrap(), vm.op("fill").unwrap());
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (y, z) = vm
        .run(|b| {
            let r = b.apply(relu, &[&x])?; // mock:0's compute stream
            let y = b.apply(scale.with(Attrs::scalar(2.0)), &[&r])?;
            let h = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU)?;
            let z = b.apply(scale.with(Attrs::scalar(-1.0)).on(cpu), &[&h])?;
            Ok::<_, Error>((y, z))
        })
        .unwrap();
    assert_eq!(y.device(), gpu, "on the input's device");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![2.0, 0.0, 6.0]);
    assert_eq!(z.to_vec::<f32>().unwrap(), vec![-1.0, -2.0]);
    let r = vm.run(|b| b.apply(fill.with(Attrs::scalar(1.0)), &[]));
    assert!(
        matches!(&r, Err(Error::InvalidOperands { detail, .. }) if detail.contains(".on(stream)")),
        "{r:?}"
    );
    vm.sync().unwrap();
}

/// A program that calls `matmul` with its transpose flags is recorded with them
/// (`transpose_a=true`), validates, and replays to the recorded checksums, as recorded and
/// on the CPU; an old trace's `matmul_tn` replays to the same bits.
#[test]
fn transpose_flags_are_recorded_and_replayed() {
    use eagervm::trace::{self, DeviceMap, Recorder, ReplayOptions};
    let dir = std::env::temp_dir().join(format!("eagervm-eager-flags-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("flags.trace");
    let vm = vm();
    let rec = Recorder::start(&vm, &path).unwrap();
    let cx = Context::new(&vm);
    let x = cx.from_slice(&values(12, 9), &[4, 3], DeviceId::mock(0)).unwrap();
    let y = cx.from_slice(&values(8, 10), &[4, 2], DeviceId::mock(0)).unwrap();
    let g = x.matmul_tn(&y).unwrap(); // [3, 2]
    let h = g.matmul_nt(&g).unwrap(); // [3, 3]
    let outs = [g.tensor().unwrap(), h.tensor().unwrap()];
    let summary = rec.finish(&vm, &outs, None).unwrap();
    assert_eq!(summary.expects, 2);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.lines().any(|l| l.contains(" matmul ") && l.ends_with("transpose_a=true")), "{text}");
    assert!(text.lines().any(|l| l.contains(" matmul ") && l.ends_with("transpose_b=true")), "{text}");
    let parsed = trace::load(&path).unwrap();
    for (device, resync) in [(DeviceMap::AsRecorded, false), (DeviceMap::Cpu, true)] {
        let report = trace::replay(&parsed, &ReplayOptions { resync, device, ..Default::default() }).unwrap();
        assert_eq!(report.checked, 2, "on {device:?}");
        assert!(report.failures.is_empty());
    }
    // The same trace with the old op names replays to the same checksums.
    let old = text
        .replace("matmul in=", "OP in=")
        .replace(" transpose_a=true", "")
        .replace(" transpose_b=true", "");
    let mut ops = ["matmul_tn", "matmul_nt"].into_iter();
    let old: String = old
        .lines()
        .map(|l| {
            if l.contains(" OP ") {
                l.replace(" OP ", &format!(" {} ", ops.next().unwrap()))
            } else {
                l.into()
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n";
    let (old, diags) = trace::parse_str("old.trace", &old);
    assert!(diags.is_empty(), "{diags:?}");
    let report = trace::replay(&old, &ReplayOptions::default()).unwrap();
    assert_eq!(report.checked, 2);
    std::fs::remove_dir_all(&dir).unwrap();
}
