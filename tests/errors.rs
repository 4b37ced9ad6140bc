//! Errors are values: failures and panics in kernels, propagation to readers, refusal of bad
//! calls by the builder, out of memory (real and injected), and a VM that keeps running.

use eagervm::ep::mock::MockConfig;
use eagervm::ep::EpError;
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

/// A VM whose tensors may be as large as a request gets: with no cap on one tensor's bytes,
/// a request beyond the machine reaches the allocators. (Where `Config` caps a tensor's
/// bytes, raise that cap to its largest value here.)
fn uncapped_vm() -> VirtualMachine {
    VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::default())).unwrap()
}

/// Element counts of `f32` tensors that no allocation on this machine can serve, refused by
/// the system at once without touching memory: 2^46 elements (256 TiB) lie beyond the
/// 128 TiB of address space of a 64-bit Linux process, under every overcommit policy; the
/// issue's 10^12 elements (4 TB) are refused at once under the default heuristic policy
/// (`/proc/sys/vm/overcommit_memory` 0) and the strict one (2) on any machine with less
/// memory and swap, but granted (and then never backed) under policy 1, so only tried where
/// the policy is not 1.
fn sizes_beyond_the_machine() -> Vec<usize> {
    let mut sizes = vec![1usize << 46];
    let policy = std::fs::read_to_string("/proc/sys/vm/overcommit_memory").unwrap_or_default();
    if policy.trim() != "1" {
        sizes.push(1_000_000_000_000);
    }
    sizes
}

/// `t` carries `Error::Alloc` from instruction `op` for the storage of tensor `culprit` of
/// `bytes` bytes on `device`, on every read and wait.
fn assert_out_of_memory(t: &Tensor, op: &str, culprit: &Tensor, bytes: usize, device: DeviceId) {
    for _ in 0..2 {
        match t.to_vec::<f32>() {
            Err(Error::Alloc {
                op: o, stream, source: EpError::OutOfMemory { device: d, detail }, ..
            }) => {
                assert_eq!((o.as_str(), d), (op, device), "{detail}");
                assert!(stream.starts_with(&device.to_string()), "{stream}");
                let want = format!("tensor {}: out of memory allocating {bytes} bytes", culprit.id());
                assert!(detail.starts_with(&want), "{detail:?} should start with {want:?}");
            }
            other => panic!("expected out of memory on tensor {}, got {other:?}", t.id()),
        }
        assert!(matches!(t.wait(), Err(Error::Alloc { .. })));
    }
}

/// The body of [`allocations_beyond_the_machine_fail_as_errors_and_the_vm_runs_on`], run
/// in a child process of its own so that an allocator that aborts cannot take this test
/// binary down with it.
#[test]
#[ignore = "run in a child process by allocations_beyond_the_machine_fail_as_errors_and_the_vm_runs_on"]
fn child_allocations_beyond_the_machine() {
    let vm = uncapped_vm();
    let (fill, relu, matmul) = (vm.op("fill").unwrap(), vm.op("relu").unwrap(), vm.op("matmul").unwrap());
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let s = vm.compute_stream(device).unwrap();
        let small = vm.from_slice(&[1.0f32, -2.0], &[2], device).unwrap();
        for n in sizes_beyond_the_machine() {
            // A tensor too large for the machine, written and read: the abort.
            let big = vm.empty(&[n], DType::F32, device).unwrap();
            let (reader, other) = vm
                .run(|b| -> Result<_> {
                    b.call_into(fill, &[], &[&big], Attrs::scalar(1.0), s)?;
                    let reader = b.call(relu, &[&big], Attrs::default(), s)?;
                    let other = b.call(relu, &[&small], Attrs::default(), s)?;
                    Ok((reader, other))
                })
                .unwrap();
            assert_out_of_memory(&big, "fill", &big, n * 4, device);
            assert_out_of_memory(&reader, "fill", &big, n * 4, device);
            assert_eq!(other.to_vec::<f32>().unwrap(), vec![1.0, 0.0]);
            match vm.sync() {
                Err(Error::Failed { count: 1, first }) => assert!(matches!(*first, Error::Alloc { .. })),
                other => panic!("sync should count the one failed allocation, got {other:?}"),
            }

            // A matmul of small operands whose output has `n` elements.
            let m = (n as f64).sqrt() as usize;
            assert_eq!(m * m, n);
            let (a, b) = (
                vm.empty(&[m, 1], DType::F32, device).unwrap(),
                vm.empty(&[1, m], DType::F32, device).unwrap(),
            );
            let product = vm
                .run(|bld| -> Result<_> {
                    bld.call_into(fill, &[], &[&a], Attrs::scalar(2.0), s)?;
                    bld.call_into(fill, &[], &[&b], Attrs::scalar(3.0), s)?;
                    bld.call(matmul, &[&a, &b], Attrs::default(), s)
                })
                .unwrap();
            assert_out_of_memory(&product, "matmul", &product, n * 4, device);
            // Its operands are intact, and the VM runs on.
            let ones = vm.run(|bld| bld.call(relu, &[&a], Attrs::default(), s)).unwrap();
            assert_eq!(ones.to_vec::<f32>().unwrap().len(), m);
            assert!(ones.to_vec::<f32>().unwrap().iter().all(|&x| x == 2.0));
            assert!(matches!(vm.sync(), Err(Error::Failed { count: 1, .. })));
            // A later write of the tensor tries again, and fails again the same way.
            vm.run(|bld| bld.call_into(fill, &[], &[&big], Attrs::scalar(5.0), s)).unwrap();
            assert_out_of_memory(&big, "fill", &big, n * 4, device);
            assert!(matches!(vm.sync(), Err(Error::Failed { count: 1, .. })));
        }
        assert_eq!(small.to_vec::<f32>().unwrap(), vec![1.0, -2.0]);
    }
    vm.sync().unwrap();
}

/// Issue 19, defect 1: a tensor larger than the machine, and a matmul whose output is, on
/// `cpu:0` and `mock:0`. The allocation used to abort the process ("memory allocation of N
/// bytes failed"); now the instruction's outputs carry `Error::Alloc` and the VM runs on.
/// The body runs in a child process (this test binary, re-run on that one test), whose
/// exit status and output are checked here.
#[test]
fn allocations_beyond_the_machine_fail_as_errors_and_the_vm_runs_on() {
    let name = "child_allocations_beyond_the_machine";
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--ignored", "--exact", name, "--test-threads=1", "--nocapture"])
        .output()
        .expect("the test binary runs again");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && stdout.contains("1 passed"),
        "{name} in a child process: {}\n--- stdout\n{stdout}\n--- stderr\n{stderr}",
        out.status
    );
}

/// `FaultInjection::fail_alloc_one_in`: the tensors it chooses cannot get storage, on the
/// host and on the mock device, through calls, copies and host writes; exactly those
/// tensors and their readers carry `Error::Alloc`, every other value is right, and `sync`
/// counts each failed allocation once.
#[test]
fn injected_allocation_failures_poison_exactly_the_chosen_tensors() {
    let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
    c.fault.fail_alloc_one_in = 3;
    c.fault.fail_alloc_seed = 0x00DD_BA11;
    let vm = VirtualMachine::new(c).unwrap();
    let chosen = |t: &Tensor| vm.config().fault.fails_alloc(t.id());
    let (fill, scale, copy) = (vm.op("fill").unwrap(), vm.op("scale").unwrap(), vm.op("copy").unwrap());
    let d2h = vm.stream(DeviceId::mock(0), StreamType::D2H).unwrap();
    let mut failures = 0;
    let mut seen = [false; 2];
    for device in [DeviceId::CPU, DeviceId::mock(0)] {
        let s = vm.compute_stream(device).unwrap();
        let on = |_| vm.empty(&[2], DType::F32, device).unwrap();
        let xs: Vec<Tensor> = (0..24).map(on).collect();
        let ys: Vec<Tensor> = (0..24).map(on).collect();
        // Device tensors are read through host tensors of known ids.
        let hs: Vec<Tensor> = (0..24).map(|_| vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap()).collect();
        vm.run(|b| -> Result<()> {
            for i in 0..24 {
                b.call_into(fill, &[], &[&xs[i]], Attrs::scalar(i as f64), s)?;
                b.call_into(scale, &[&xs[i]], &[&ys[i]], Attrs::scalar(2.0), s)?;
                if !device.is_host() {
                    b.call_into(copy, &[&ys[i]], &[&hs[i]], Attrs::default(), d2h)?;
                }
            }
            Ok(())
        })
        .unwrap();
        for i in 0..24 {
            let read = if device.is_host() { &ys[i] } else { &hs[i] };
            let (op, culprit) = if chosen(&xs[i]) {
                ("fill", &xs[i])
            } else if chosen(&ys[i]) {
                ("scale", &ys[i])
            } else if !device.is_host() && chosen(&hs[i]) {
                ("copy", &hs[i])
            } else {
                assert_eq!(read.to_vec::<f32>().unwrap(), vec![2.0 * i as f32; 2], "tensor {i} on {device}");
                continue;
            };
            seen[0] = true;
            failures += 1;
            let store = if op == "copy" { DeviceId::CPU } else { device };
            match read.to_vec::<f32>() {
                Err(Error::Alloc { op: o, source: EpError::OutOfMemory { device: d, detail }, .. }) => {
                    assert_eq!((o.as_str(), d), (op, store), "tensor {i} on {device}: {detail}");
                    let want = format!("tensor {}: out of memory allocating 8 bytes (injected", culprit.id());
                    assert!(detail.starts_with(&want), "{detail:?}");
                }
                other => panic!("tensor {i} on {device}: expected {op}'s allocation to fail, got {other:?}"),
            }
            // (A wait on a device tensor copies it to a new host tensor, which may be chosen
            // too: checked on the host only.)
            if device.is_host() && !chosen(&xs[i]) {
                assert_eq!(
                    xs[i].to_vec::<f32>().unwrap(),
                    vec![i as f32; 2],
                    "the inputs of a failed allocation are intact"
                );
            }
        }
    }
    match vm.sync() {
        Err(Error::Failed { count, .. }) => assert_eq!(count, failures),
        other => panic!("sync should count {failures} failed allocations, got {other:?}"),
    }
    // Host writes: a chosen tensor's write fails (it carries the error instead of the
    // values); any other is written.
    let hosts: Vec<Tensor> = (0..24).map(|_| vm.empty(&[2], DType::I64, DeviceId::CPU).unwrap()).collect();
    vm.run(|b| hosts.iter().try_for_each(|t| b.write(t, &[7i64, -7]))).unwrap();
    let mut written = 0;
    for t in &hosts {
        match t.to_vec::<i64>() {
            Ok(v) => {
                assert!(!chosen(t));
                assert_eq!(v, vec![7, -7]);
                written += 1;
            }
            Err(Error::Alloc { op, .. }) => {
                assert!(chosen(t), "tensor {} was not chosen", t.id());
                assert_eq!(op, "Access");
                seen[1] = true;
            }
            Err(e) => panic!("{e}"),
        }
    }
    assert!(seen == [true, true] && written > 0, "the seed chooses some tensors of each kind, not all");
    assert!(matches!(vm.sync(), Err(Error::Failed { count, .. }) if count == 24 - written));
    // Off by default.
    assert!((0..1000).all(|t| !Config::default().fault.fails_alloc(t)));
}
