//! Errors are values: failures and panics in kernels, propagation to readers, refusal of bad
//! calls by the builder, and a VM that keeps running.

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

fn vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap()
}

#[test]
fn a_failed_kernel_poisons_its_outputs_and_their_readers_every_time() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (fail, relu, add) = (vm.op("fail").unwrap(), vm.op("relu").unwrap(), vm.op("add").unwrap());
    let good = vm.from_slice(&[1.0f32, -1.0], &[2], DeviceId::CPU).unwrap();
    let bad = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let (r, s, g) = vm
        .run(|b| -> Result<_> {
            b.call_into(fail, &[], &[&bad], Attrs::scalar(3.0), cpu)?;
            let r = b.call(relu, &[&bad], Attrs::default(), cpu)?;
            let s = b.call(add, &[&r, &good], Attrs::default(), cpu)?;
            let g = b.call(relu, &[&good], Attrs::default(), cpu)?;
            Ok((r, s, g))
        })
        .unwrap();
    for t in [&bad, &r, &s] {
        for _ in 0..2 {
            match t.to_vec::<f32>() {
                Err(Error::Kernel { op, message, .. }) => {
                    assert_eq!(op, "fail");
                    assert!(message.contains('3'), "{message}");
                }
                other => panic!("expected the kernel's error, got {other:?}"),
            }
            assert!(matches!(t.wait(), Err(Error::Kernel { .. })));
        }
    }
    // Unaffected tensors keep working; sync reports the failure once.
    assert_eq!(g.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
    match vm.sync() {
        Err(Error::Failed { count, first }) => {
            assert_eq!(count, 1, "readers that skip do not count as new failures");
            assert!(matches!(*first, Error::Kernel { .. }));
        }
        other => panic!("sync should report the failure, got {other:?}"),
    }
    vm.sync().unwrap();
    // A later successful write clears the error.
    let fill = vm.op("fill").unwrap();
    vm.run(|b| b.call_into(fill, &[], &[&bad], Attrs::scalar(2.0), cpu)).unwrap();
    assert_eq!(bad.to_vec::<f32>().unwrap(), vec![2.0, 2.0]);
}

/// Calls with more operands than an instruction keeps inline (three): their operands lie in
/// the batch's arena, move with the instruction when it waits (here for fills on another
/// stream of the device, with jitter) and when it is launched on a device. Exactly one of
/// eight inputs carries an error, so the output carries that error only if every operand
/// was read from the right place.
#[test]
fn wide_calls_read_every_operand_wherever_it_lies() {
    let vm = vm();
    let (fill, fail, noop) = (vm.op("fill").unwrap(), vm.op("fail").unwrap(), vm.op("noop").unwrap());
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let compute = vm.compute_stream(device).unwrap();
        let side = vm.stream(device, StreamType::H2D).unwrap();
        for bad in [0usize, 5, 7] {
            let ins: Vec<Tensor> = (0..8).map(|_| vm.empty(&[2], DType::F32, device).unwrap()).collect();
            let (out, clean) =
                (vm.empty(&[2], DType::F32, device).unwrap(), vm.empty(&[2], DType::F32, device).unwrap());
            vm.run(|b| -> Result<()> {
                for (k, t) in ins.iter().enumerate() {
                    let (op, s) = if k == bad { (fail, side) } else { (fill, side) };
                    b.call_into(op, &[], &[t], Attrs::scalar(k as f64), s)?;
                }
                let refs: Vec<&Tensor> = ins.iter().collect();
                b.call_into(noop, &refs, &[&out], Attrs::default(), compute)?;
                let good: Vec<&Tensor> =
                    refs.iter().copied().enumerate().filter(|(k, _)| *k != bad).map(|(_, t)| t).collect();
                b.call_into(noop, &good, &[&clean], Attrs::default(), compute)
            })
            .unwrap();
            match out.wait() {
                Err(Error::Kernel { message, .. }) => {
                    assert_eq!(message, format!("fail op: {bad}"), "on {device}")
                }
                other => panic!("on {device}: expected input {bad}'s failure, got {other:?}"),
            }
            clean
                .wait()
                .unwrap_or_else(|e| panic!("on {device}: a call without the failed input failed: {e}"));
        }
        assert!(vm.sync().is_err());
    }
}

/// Panics in the middle of one batch: each fails its own instruction only, everything after
/// it in the batch still runs, and a reader of a panicked output carries that panic on.
#[test]
fn panics_inside_a_batch_fail_only_their_own_instructions() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (panic, fill, add) = (vm.op("panic").unwrap(), vm.op("fill").unwrap(), vm.op("add").unwrap());
    let t = |_| vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let [p1, p2, good, sum, poisoned, last]: [Tensor; 6] = std::array::from_fn(t);
    vm.run(|b| -> Result<()> {
        b.call_into(fill, &[], &[&good], Attrs::scalar(1.5), cpu)?;
        b.call_into(panic, &[], &[&p1], Attrs::scalar(1.0), cpu)?;
        b.call_into(add, &[&good, &good], &[&sum], Attrs::default(), cpu)?;
        b.call_into(panic, &[], &[&p2], Attrs::scalar(2.0), cpu)?;
        b.call_into(add, &[&p2, &good], &[&poisoned], Attrs::default(), cpu)?;
        b.call_into(add, &[&sum, &good], &[&last], Attrs::default(), cpu)
    })
    .unwrap();
    let panicked_with = |x: &Tensor| match x.to_vec::<f32>() {
        Err(Error::Panic { message, .. }) => message,
        other => panic!("expected a panic as an error, got {other:?}"),
    };
    assert!(panicked_with(&p1).contains('1'));
    assert!(panicked_with(&p2).contains('2'));
    assert!(panicked_with(&poisoned).contains('2'), "a reader carries the panic it read");
    assert_eq!(sum.to_vec::<f32>().unwrap(), vec![3.0, 3.0]);
    assert_eq!(last.to_vec::<f32>().unwrap(), vec![4.5, 4.5]);
    match vm.sync() {
        Err(Error::Failed { count, .. }) => assert_eq!(count, 2),
        other => panic!("sync should report both panics, got {other:?}"),
    }
}

#[test]
fn a_panicking_kernel_is_caught_on_cpu_and_on_the_mock_device() {
    let vm = vm();
    let panic = vm.op("panic").unwrap();
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let s = vm.compute_stream(device).unwrap();
        let t = vm.empty(&[1], DType::F32, device).unwrap();
        vm.run(|b| b.call_into(panic, &[], &[&t], Attrs::scalar(5.0), s)).unwrap();
        match t.to_vec::<f32>() {
            Err(Error::Panic { op, message, stream, .. }) => {
                assert_eq!(op, "panic");
                assert!(message.contains('5'), "{message}");
                assert!(stream.starts_with(&device.to_string()), "{stream}");
            }
            other => panic!("expected the panic as an error, got {other:?}"),
        }
        assert!(vm.sync().is_err());
    }
    // The VM still runs work on both devices.
    let x = vm.from_slice(&[4i64, -5], &[2], DeviceId::mock(0)).unwrap();
    let y = vm
        .run(|b| {
            b.call(
                vm.op("relu").unwrap(),
                &[&x],
                Attrs::default(),
                vm.compute_stream(DeviceId::mock(0)).unwrap(),
            )
        })
        .unwrap();
    assert_eq!(y.to_vec::<i64>().unwrap(), vec![4, 0]);
    vm.sync().unwrap();
}

#[test]
fn the_builder_refuses_bad_calls_before_anything_runs() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let gpu = vm.compute_stream(DeviceId::mock(0)).unwrap();
    assert!(matches!(vm.op("conv9d"), Err(Error::UnknownOp { .. })));
    let add = vm.op("add").unwrap();
    let a = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let b3 = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU).unwrap();
    let i = vm.from_slice(&[1i64, 2], &[2], DeviceId::CPU).unwrap();
    let on_gpu = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::mock(0)).unwrap();
    let out = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let wrong_shape = vm.empty(&[3], DType::F32, DeviceId::CPU).unwrap();
    let sink = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    vm.run(|b| {
        assert!(matches!(b.call(add, &[&a, &b3], Attrs::default(), cpu), Err(Error::InvalidOperands { .. })));
        assert!(matches!(b.call(add, &[&a, &i], Attrs::default(), cpu), Err(Error::InvalidOperands { .. })));
        assert!(matches!(b.call(add, &[&a], Attrs::default(), cpu), Err(Error::InvalidOperands { .. })));
        assert!(matches!(b.call(add, &[&a, &on_gpu], Attrs::default(), cpu), Err(Error::WrongDevice { .. })));
        assert!(matches!(b.call(add, &[&a, &a], Attrs::default(), gpu), Err(Error::WrongDevice { .. })));
        assert!(matches!(
            b.call_into(add, &[&a, &a], &[&wrong_shape], Attrs::default(), cpu),
            Err(Error::OutputMismatch { index: 0, .. })
        ));
        assert!(matches!(
            b.call_into(add, &[&a, &out], &[&out], Attrs::default(), cpu),
            Err(Error::Aliased { .. })
        ));
        assert!(matches!(b.write(&on_gpu, &[1.0f32, 2.0]), Err(Error::Access { .. })));
        assert!(matches!(b.write(&a, &[1i64, 2]), Err(Error::DType { .. })));
        // An OpCall counts its inputs in a byte: more are refused, not truncated.
        let noop = vm.op("noop").unwrap();
        let many: Vec<&Tensor> = vec![&a; eagervm::framework::MAX_INPUTS + 1];
        let r = b.call_into(noop, &many, &[&sink], Attrs::default(), cpu);
        assert!(
            matches!(&r, Err(Error::InvalidOperands { detail, .. }) if detail.contains("at most 255")),
            "{r:?}"
        );
        assert!(b.call_into(noop, &many[1..], &[&sink], Attrs::default(), cpu).is_ok());
    });
    // Nothing of the refused calls ran: `out` was never written.
    assert!(matches!(out.to_vec::<f32>(), Err(Error::Uninitialized { .. })));
    vm.sync().unwrap();
}

/// The builder remembers signatures it has checked; a remembered signature must not let a
/// call through that differs in shapes, outputs or operand identity.
#[test]
fn a_checked_signature_does_not_let_a_different_call_through() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let add = vm.op("add").unwrap();
    let a = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let b3 = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU).unwrap();
    let out = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let wrong_shape = vm.empty(&[3], DType::F32, DeviceId::CPU).unwrap();
    vm.run(|b| {
        for _ in 0..3 {
            b.call_into(add, &[&a, &a], &[&out], Attrs::default(), cpu).unwrap();
            b.call(add, &[&a, &a], Attrs::default(), cpu).unwrap();
        }
        assert!(matches!(b.call(add, &[&a, &b3], Attrs::default(), cpu), Err(Error::InvalidOperands { .. })));
        assert!(matches!(
            b.call_into(add, &[&a, &a], &[&wrong_shape], Attrs::default(), cpu),
            Err(Error::OutputMismatch { index: 0, .. })
        ));
        assert!(matches!(
            b.call_into(add, &[&a, &out], &[&out], Attrs::default(), cpu),
            Err(Error::Aliased { .. })
        ));
    });
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
    vm.sync().unwrap();
}

/// The checks that depend on a tensor's state run on every call, cached signature or not:
/// a released operand, and one last used on another stream (which needs soft sync first).
#[test]
fn a_checked_signature_still_checks_each_operands_state() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (scale, copy) = (vm.op("scale").unwrap(), vm.op("copy").unwrap());
    let cx = eagervm::eager::Context::new(&vm);
    let a = cx.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let t = a.tensor().unwrap().clone();
    let out = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    vm.run(|b| {
        for _ in 0..3 {
            b.call_into(scale, &[&t], &[&out], Attrs::scalar(2.0), cpu).unwrap();
        }
    });
    a.release().unwrap();
    vm.run(|b| {
        let r = b.call_into(scale, &[&t], &[&out], Attrs::scalar(2.0), cpu);
        assert!(matches!(r, Err(Error::Released { tensor }) if tensor == t.id()), "{r:?}");
    });
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);

    // `x` is written on a mock device's device-to-host stream, then read on the CPU with a
    // signature the builder checked before: the call must still see that `x` was last used
    // on another stream and emit the `RecordEvent` the CPU waits on, and wait for it.
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let d2h = vm.stream(DeviceId::mock(0), StreamType::D2H).unwrap();
    let m = vm.from_slice(&[3.0f32, 4.0], &[2], DeviceId::mock(0)).unwrap();
    let x = vm.from_slice(&[0.0f32, 0.0], &[2], DeviceId::CPU).unwrap();
    let y = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    vm.run(|b| b.call_into(scale, &[&x], &[&y], Attrs::scalar(1.0), cpu)).unwrap();
    vm.sync().unwrap();
    vm.start_profiling().unwrap();
    vm.run(|b| -> Result<()> {
        b.call_into(copy, &[&m], &[&x], Attrs::default(), d2h)?;
        b.call_into(scale, &[&x], &[&y], Attrs::scalar(1.0), cpu)
    })
    .unwrap();
    vm.sync().unwrap();
    let p = vm.stop_profiling().unwrap();
    let names: Vec<(&str, StreamId)> = p.instructions().iter().map(|i| (i.name, i.stream)).collect();
    // (Before the copy: the synchronisation with the stream that wrote `m`.)
    assert!(names.ends_with(&[("copy", d2h), ("RecordEvent", d2h), ("scale", cpu)]), "{names:?}");
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
    vm.sync().unwrap();
}

/// The same for a call of more operands than a packed signature key holds (eight inputs),
/// whose cached signature is found operand by operand: an aliased output, a released
/// operand and one last used on another stream are each still seen on a call whose
/// signature passed before.
#[test]
fn a_checked_wide_signature_still_checks_each_operands_state() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (noop, copy) = (vm.op("noop").unwrap(), vm.op("copy").unwrap());
    let cx = eagervm::eager::Context::new(&vm);
    let a = cx.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let t = a.tensor().unwrap().clone();
    let ins: Vec<Tensor> =
        (0..7).map(|_| vm.from_slice(&[0.0f32, 0.0], &[2], DeviceId::CPU).unwrap()).collect();
    let out = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let mut refs: Vec<&Tensor> = ins.iter().collect();
    refs.push(&t);
    vm.run(|b| {
        for _ in 0..3 {
            b.call_into(noop, &refs, &[&out], Attrs::default(), cpu).unwrap();
        }
        let r = b.call_into(noop, &refs, &[&ins[3]], Attrs::default(), cpu);
        assert!(matches!(r, Err(Error::Aliased { tensor, .. }) if tensor == ins[3].id()), "{r:?}");
    });
    vm.sync().unwrap();
    a.release().unwrap();
    vm.run(|b| {
        let r = b.call_into(noop, &refs, &[&out], Attrs::default(), cpu);
        assert!(matches!(r, Err(Error::Released { tensor }) if tensor == t.id()), "{r:?}");
    });
    refs.pop();
    refs.push(&out);
    let wide_out = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    vm.run(|b| b.call_into(noop, &refs, &[&wide_out], Attrs::default(), cpu)).unwrap();
    vm.sync().unwrap();

    // Input 2 is written on a mock device's device-to-host stream just before the wide call.
    let d2h = vm.stream(DeviceId::mock(0), StreamType::D2H).unwrap();
    let m = vm.from_slice(&[3.0f32, 4.0], &[2], DeviceId::mock(0)).unwrap();
    vm.sync().unwrap();
    vm.start_profiling().unwrap();
    vm.run(|b| -> Result<()> {
        b.call_into(copy, &[&m], &[&ins[2]], Attrs::default(), d2h)?;
        b.call_into(noop, &refs, &[&wide_out], Attrs::default(), cpu)
    })
    .unwrap();
    vm.sync().unwrap();
    let p = vm.stop_profiling().unwrap();
    let names: Vec<(&str, StreamId)> = p.instructions().iter().map(|i| (i.name, i.stream)).collect();
    assert!(names.ends_with(&[("copy", d2h), ("RecordEvent", d2h), ("noop", cpu)]), "{names:?}");
    assert_eq!(ins[2].to_vec::<f32>().unwrap(), vec![3.0, 4.0]);
    vm.sync().unwrap();
}

#[test]
fn reading_a_tensor_nothing_wrote_is_an_error_of_that_instruction() {
    let vm = vm();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let y = vm.run(|b| b.call(vm.op("relu").unwrap(), &[&x], Attrs::default(), cpu)).unwrap();
    assert!(matches!(y.to_vec::<f32>(), Err(Error::Uninitialized { tensor, .. }) if tensor == x.id()));
    assert!(vm.sync().is_err());
}

#[test]
fn reading_with_the_wrong_element_type_is_refused() {
    let vm = vm();
    let t = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    assert!(matches!(t.to_vec::<i64>(), Err(Error::DType { expected: DType::F32, found: DType::I64 })));
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
}

#[test]
fn a_copy_called_onto_a_device_makes_its_output_there() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(2, MockConfig::jittery())).unwrap();
    let h2d = vm.stream(DeviceId::mock(0), StreamType::H2D).unwrap();
    let d2h = vm.stream(DeviceId::mock(0), StreamType::D2H).unwrap();
    let copy = vm.op("copy").unwrap();
    let host = vm.from_slice(&[1.5f32, -2.0, 3.0], &[3], DeviceId::CPU).unwrap();
    let other = vm.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::mock(1)).unwrap();
    let sink = vm.empty(&[3], DType::F32, DeviceId::CPU).unwrap();
    let (up, back) = vm
        .run(|b| -> Result<(Tensor, Tensor)> {
            // No operand on mock:0 yet: the output `call` makes lands on the stream's device.
            let up = b.call(copy, &[&host], Attrs::default(), h2d)?;
            let back = b.call(copy, &[&up], Attrs::default(), d2h)?;
            // With every given operand off the stream's device, a copy is still refused.
            let r = b.call_into(copy, &[&other], &[&sink], Attrs::default(), h2d);
            assert!(matches!(r, Err(Error::WrongDevice { .. })), "{r:?}");
            Ok((up, back))
        })
        .unwrap();
    assert_eq!(up.device(), DeviceId::mock(0));
    assert_eq!(back.device(), DeviceId::mock(0));
    assert_eq!(up.to_vec::<f32>().unwrap(), vec![1.5, -2.0, 3.0]);
    vm.sync().unwrap();
}

/// A tensor belongs to the VM that made it: another VM's builder refuses it on every path,
/// fast or not, before anything is emitted (its dependence object is the other scheduler's).
#[test]
fn a_tensor_of_another_vm_is_refused_on_every_path() {
    let (vm_a, vm_b) = (vm(), vm());
    let (add, noop) = (vm_b.op("add").unwrap(), vm_b.op("noop").unwrap());
    // Made in the same order on both VMs, so that their metas get the same numbers: the
    // inference cache of `vm_b` knows the signature of a call with `t` in place of `u`.
    let t = vm_a.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let u = vm_b.from_slice(&[3.0f32, 4.0], &[2], DeviceId::CPU).unwrap();
    let out = vm_b.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let cpu = vm_b.compute_stream(DeviceId::CPU).unwrap();
    let wide: Vec<&Tensor> = vec![&u; 8];
    vm_b.run(|b| {
        // Warm the cache: the same signatures with `vm_b`'s own tensors pass.
        b.call_into(add, &[&u, &u], &[&out], Attrs::default(), cpu).unwrap();
        b.call_into(noop, &wide, &[&out], Attrs::default(), cpu).unwrap();
        let mut foreign_wide = wide.clone();
        foreign_wide[5] = &t;
        let refusals = [
            ("call_into", b.call_into(add, &[&u, &t], &[&out], Attrs::default(), cpu)),
            ("call_into, output", b.call_into(add, &[&u, &u], &[&t], Attrs::default(), cpu)),
            ("call_into, wide", b.call_into(noop, &foreign_wide, &[&out], Attrs::default(), cpu)),
            ("call", b.call(add, &[&t, &u], Attrs::default(), cpu).map(drop)),
            ("call_multi", b.call_multi(add, &[&u, &t], Attrs::default(), cpu).map(drop)),
            ("write", b.write(&t, &[5.0f32, 6.0])),
        ];
        for (path, r) in refusals {
            match r {
                Err(Error::ForeignTensor { op, tensor }) => {
                    let want = if path == "write" {
                        "write"
                    } else if path.contains("wide") {
                        "noop"
                    } else {
                        "add"
                    };
                    assert_eq!((op.as_str(), tensor), (want, t.id()), "{path}");
                }
                other => panic!("{path}: a tensor of another VM was not refused as such: {other:?}"),
            }
        }
    });
    // Nothing of the refused calls ran: `out` holds the first call's sum, `t` its own values.
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![6.0, 8.0]);
    assert_eq!(t.to_vec::<f32>().unwrap(), vec![1.0, 2.0]);
    vm_a.sync().unwrap();
    vm_b.sync().unwrap();

    // The eager front end: an array of a context on another VM, and a wrapped tensor of
    // another VM, are refused at the call, and the context goes on.
    let (cx_a, cx_b) = (eagervm::eager::Context::new(&vm_a), eagervm::eager::Context::new(&vm_b));
    let x = cx_a.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    let y = cx_b.from_slice(&[3.0f32, 4.0], &[2], DeviceId::CPU).unwrap();
    let r = y.add(&x);
    assert!(
        matches!(&r, Err(Error::ForeignTensor { op, tensor }) if op == "add" && *tensor == x.id()),
        "{r:?}"
    );
    let wrapped = cx_b.wrap(t.clone());
    let r = wrapped.relu();
    assert!(
        matches!(&r, Err(Error::ForeignTensor { op, tensor }) if op == "relu" && *tensor == t.id()),
        "{r:?}"
    );
    assert_eq!(y.add(&y).unwrap().to_vec::<f32>().unwrap(), vec![6.0, 8.0]);
    cx_b.sync().unwrap();
}

/// A device tensor that nothing wrote reads as a host tensor does: `wait` passes, `to_vec`
/// reports the tensor uninitialized by the access (not by the copy the read makes), and
/// neither counts as a failure for `sync`.
#[test]
fn a_tensor_nothing_wrote_reads_alike_on_the_host_and_on_a_device() {
    let vm = vm();
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let t = vm.empty(&[2], DType::F32, device).unwrap();
        assert_eq!(t.wait(), Ok(()), "wait on {device}");
        match t.to_vec::<f32>() {
            Err(Error::Uninitialized { op, tensor, .. }) => {
                assert_eq!((op.as_str(), tensor), ("Access", t.id()), "to_vec on {device}")
            }
            other => panic!("to_vec on {device}: expected Uninitialized, got {other:?}"),
        }
        assert_eq!(t.wait(), Ok(()), "wait on {device}, again");
        assert_eq!(vm.sync(), Ok(()), "sync after reads of an unwritten tensor on {device}");
    }
}
