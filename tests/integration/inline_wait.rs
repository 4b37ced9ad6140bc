//! A waiter runs its own work: a batch handed over with the read that waits for it runs on
//! the caller's thread when the VM is idle (`docs/architecture.md`, "A waiter runs its own
//! work"). These tests check when it does and does not, that results and errors are those
//! of the scheduled path, and that claims racing other threads' submissions lose and
//! reorder nothing.

use std::sync::mpsc;
use std::time::Duration;

use eagervm::eager::Context;
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

/// The instructions waiters ran themselves, per stream name.
fn ran_inline(vm: &VirtualMachine, stream: &str) -> u64 {
    let rec = vm.flight_record();
    rec.streams.iter().find(|s| s.name == stream).map_or(0, |s| s.ran_inline)
}

fn total_inline(vm: &VirtualMachine) -> u64 {
    vm.flight_record().streams.iter().map(|s| s.ran_inline).sum()
}

#[test]
fn an_idle_vm_lets_the_waiter_run_its_own_batch() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let (add, cpu) = (vm.op("add").unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
    let mut x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
    vm.sync().unwrap();
    for k in 1..=50 {
        let (y, v) = vm
            .run(|b| -> Result<_> {
                let y = b.call(add, &[&x, &x], Attrs::default(), cpu)?;
                let v = b.to_vec::<f32>(&y)?;
                Ok((y, v))
            })
            .unwrap();
        let scale = (1u64 << k) as f32;
        assert_eq!(v, vec![scale, 2.0 * scale]);
        x = y;
    }
    // Each round trip after the first found the VM idle: its add, its read and the
    // release of the previous `x` ran on this thread.
    let n = ran_inline(&vm, "cpu:0");
    assert!(n >= 2 * 49, "only {n} instructions ran on the waiter");
    assert_eq!(vm.in_flight(), 0);

    // The eager front end's reads take the same path.
    let cx = Context::new(&vm);
    let one = cx.from_slice(&[1.0f32], &[1], DeviceId::CPU).unwrap();
    let mut acc = cx.from_slice(&[0.0f32], &[1], DeviceId::CPU).unwrap();
    cx.sync().unwrap();
    let before = ran_inline(&vm, "cpu:0");
    for k in 1..=50 {
        acc = acc.add(&one).unwrap();
        assert_eq!(acc.item::<f32>().unwrap(), k as f32);
    }
    assert!(ran_inline(&vm, "cpu:0") >= before + 2 * 49);
    vm.sync().unwrap();
}

#[test]
fn device_work_and_profiling_sessions_go_through_the_scheduler() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
    let dev = DeviceId::mock(0);
    let (add, g) = (vm.op("add").unwrap(), vm.compute_stream(dev).unwrap());
    let x = vm.from_slice(&[1.0f32, 2.0], &[2], dev).unwrap();
    vm.sync().unwrap();
    let before = total_inline(&vm);
    for _ in 0..20 {
        let v = vm
            .run(|b| -> Result<_> {
                let y = b.call(add, &[&x, &x], Attrs::default(), g)?;
                b.to_vec::<f32>(&y)
            })
            .unwrap();
        assert_eq!(v, vec![2.0, 4.0]);
    }
    assert_eq!(total_inline(&vm), before, "a batch with device work ran on the waiter");

    // While a profiling session is open every instruction goes through the scheduler, so
    // that the timeline has them all.
    let (cpu, addc) = (vm.compute_stream(DeviceId::CPU).unwrap(), add);
    let h = vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).unwrap();
    vm.start_profiling().unwrap();
    let before = total_inline(&vm);
    for _ in 0..20 {
        vm.run(|b| -> Result<_> {
            let y = b.call(addc, &[&h, &h], Attrs::default(), cpu)?;
            b.to_vec::<f32>(&y)
        })
        .unwrap();
    }
    assert_eq!(total_inline(&vm), before, "an instruction ran on the waiter during a session");
    let profile = vm.stop_profiling().unwrap();
    let adds = profile.instructions().iter().filter(|i| i.name == "add").count();
    assert_eq!(adds, 20, "the timeline misses adds");
}

#[test]
fn failures_and_panics_on_the_waiter_are_values() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (fail, panic, relu) = (vm.op("fail").unwrap(), vm.op("panic").unwrap(), vm.op("relu").unwrap());
    let bad = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    vm.sync().unwrap();
    let before = ran_inline(&vm, "cpu:0");
    let r = vm.run(|b| -> Result<_> {
        b.call_into(fail, &[], &[&bad], Attrs::scalar(3.0), cpu)?;
        let r = b.call(relu, &[&bad], Attrs::default(), cpu)?;
        Ok((b.to_vec::<f32>(&r), r))
    });
    let (read, r) = r.unwrap();
    assert!(ran_inline(&vm, "cpu:0") > before, "the failing batch did not run on the waiter");
    assert!(matches!(read, Err(Error::Kernel { ref op, .. }) if op == "fail"), "{read:?}");
    assert!(matches!(r.to_vec::<f32>(), Err(Error::Kernel { .. })));
    let p = vm.empty(&[1], DType::F32, DeviceId::CPU).unwrap();
    let read = vm.run(|b| -> Result<_> {
        b.call_into(panic, &[], &[&p], Attrs::scalar(5.0), cpu)?;
        b.to_vec::<f32>(&p)
    });
    assert!(matches!(read, Err(Error::Panic { .. })), "{read:?}");
    match vm.sync() {
        Err(Error::Failed { count, .. }) => assert_eq!(count, 2),
        other => panic!("sync should report both failures, got {other:?}"),
    }
    // The VM goes on, on both paths.
    let ok = vm.from_slice(&[-1.0f32, 3.0], &[2], DeviceId::CPU).unwrap();
    let v = vm.run(|b| -> Result<_> {
        let y = b.call(relu, &[&ok], Attrs::default(), cpu)?;
        b.to_vec::<f32>(&y)
    });
    assert_eq!(v.unwrap(), vec![0.0, 3.0]);
    vm.sync().unwrap();
}

/// Four threads share one VM with a mock device: each keeps its own chain on `cpu:0`,
/// reads it often (claims, when the VM is idle), sends some of it through the device
/// (never claimed), and syncs now and then, while the others do the same. Every read sees
/// its own chain's exact value, and nothing hangs.
#[test]
fn claims_racing_other_threads_lose_and_reorder_nothing() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
    let (tx, rx) = mpsc::channel();
    const THREADS: usize = 4;
    const STEPS: usize = 300;
    for t in 0..THREADS {
        // A context keeps its VM running, so the thread needs nothing else of it.
        let (cx, tx) = (Context::new(&vm), tx.clone());
        std::thread::spawn(move || {
            let run = || -> Result<()> {
                let one = cx.from_slice(&[1.0f32], &[1], DeviceId::CPU)?;
                let mut x = cx.from_slice(&[t as f32 * 1000.0], &[1], DeviceId::CPU)?;
                for k in 1..=STEPS {
                    x = x.add(&one)?;
                    let want = (t * 1000 + k) as f32;
                    if k % 7 == 0 {
                        let d = x.to(DeviceId::mock(0))?.add(&x.to(DeviceId::mock(0))?)?;
                        assert_eq!(d.item::<f32>()?, 2.0 * want, "thread {t}, step {k}, device");
                    }
                    if k % 3 == 0 {
                        assert_eq!(x.item::<f32>()?, want, "thread {t}, step {k}");
                    }
                    if k % 50 == 0 {
                        cx.sync()?;
                    }
                }
                assert_eq!(x.item::<f32>()?, (t * 1000 + STEPS) as f32);
                Ok(())
            };
            let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(run));
            tx.send((t, r)).unwrap();
        });
    }
    for _ in 0..THREADS {
        let (t, r) = rx.recv_timeout(Duration::from_secs(120)).expect("a thread hung");
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => panic!("thread {t}: {e}"),
            Err(p) => std::panic::resume_unwind(p),
        }
    }
    vm.sync().unwrap();
    assert_eq!(vm.in_flight(), 0);
}
