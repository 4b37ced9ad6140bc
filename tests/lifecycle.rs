//! Shutdown with work in flight, back-pressure, releases, synchronous mode.

use std::time::{Duration, Instant};

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::vm::ThreadTopology;

#[test]
fn back_pressure_bounds_instructions_in_flight() {
    let mock = MockConfig { launch_delay: Duration::from_micros(50), ..MockConfig::default() };
    let mut c = Config::default().with_mock_devices(1, mock);
    c.high_water = 64;
    c.low_water = 16;
    c.batch_size = 8;
    let vm = VirtualMachine::new(c).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let relu = vm.op("relu").unwrap();
    let x = vm.from_slice(&[1.0f32], &[1], DeviceId::mock(0)).unwrap();
    let ys: Vec<Tensor> = (0..16).map(|_| vm.empty(&[1], DType::F32, DeviceId::mock(0)).unwrap()).collect();
    let mut max_seen = 0;
    let t0 = Instant::now();
    vm.run(|b| {
        for i in 0..1000 {
            b.call_into(relu, &[&x], &[&ys[i % 16]], Attrs::default(), g).unwrap();
            max_seen = max_seen.max(vm.in_flight());
        }
    });
    // The caller was held back: submitting took at least (1000 - 64) device launches' time.
    assert!(max_seen <= 64 + 8 + 1, "in flight peaked at {max_seen}");
    assert!(t0.elapsed() >= Duration::from_micros(50 * 900), "{:?}", t0.elapsed());
    vm.sync().unwrap();
    assert_eq!(ys[3].to_vec::<f32>().unwrap(), vec![1.0]);
}

#[test]
fn dropping_handles_releases_storage_after_its_last_use() {
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let (add, relu) = (vm.op("add").unwrap(), vm.op("relu").unwrap());
    let a = vm.from_slice(&[1.0f32, -2.0], &[2], DeviceId::CPU).unwrap();
    // Temporaries dropped inside the closure are released after the calls that use them.
    let out = vm
        .run(|b| -> Result<Tensor> {
            let mut acc = b.call(relu, &[&a], Attrs::default(), cpu)?;
            for _ in 0..100 {
                let t = b.call(add, &[&acc, &a], Attrs::default(), cpu)?;
                acc = t; // the old `acc` drops here, with its uses still unsubmitted
            }
            Ok(acc)
        })
        .unwrap();
    assert_eq!(out.to_vec::<f32>().unwrap(), vec![101.0, -200.0]);
    vm.sync().unwrap();
}

#[test]
fn synchronous_mode_runs_everything_before_returning() {
    let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
    c.synchronous = true;
    let vm = VirtualMachine::new(c).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let x = vm.from_slice(&[3.0f32, -1.0], &[2], DeviceId::mock(0)).unwrap();
    let y = vm.run(|b| b.call(vm.op("relu").unwrap(), &[&x], Attrs::default(), g)).unwrap();
    assert_eq!(vm.in_flight(), 0);
    assert_eq!(y.to_vec::<f32>().unwrap(), vec![3.0, 0.0]);
    vm.sync().unwrap();
}

#[test]
fn every_thread_topology_runs_the_same_program() {
    let mut results = Vec::new();
    for threads in [ThreadTopology::PerStream, ThreadTopology::PerDevice, ThreadTopology::Single] {
        let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
        c.threads = threads;
        let vm = VirtualMachine::new(c).unwrap();
        let (g, cpu) =
            (vm.compute_stream(DeviceId::mock(0)).unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
        let w = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0], &[2, 2], DeviceId::mock(0)).unwrap();
        let h = vm.from_slice(&[0.5f32, -1.0, 2.0, 1.0], &[2, 2], DeviceId::CPU).unwrap();
        let out = vm
            .run(|b| -> Result<Tensor> {
                let hw = vm.empty(&[2, 2], DType::F32, DeviceId::mock(0))?;
                b.call_into(
                    vm.op("copy")?,
                    &[&h],
                    &[&hw],
                    Attrs::default(),
                    vm.stream(DeviceId::mock(0), StreamType::H2D)?,
                )?;
                let m = b.call(vm.op("matmul")?, &[&w, &hw], Attrs::default(), g)?;
                let back = vm.empty(&[2, 2], DType::F32, DeviceId::CPU)?;
                b.call_into(
                    vm.op("copy")?,
                    &[&m],
                    &[&back],
                    Attrs::default(),
                    vm.stream(DeviceId::mock(0), StreamType::D2H)?,
                )?;
                b.call(vm.op("sum")?, &[&back], Attrs::default(), cpu)
            })
            .unwrap();
        results.push(out.to_vec::<f32>().unwrap());
    }
    // [[1,2],[3,4]] x [[0.5,-1],[2,1]] = [[4.5,1],[9.5,1]]; sum 16.
    assert_eq!(results, vec![vec![16.0]; 3]);
}

/// A thread the VM needs cannot be started: waits return an error instead of hanging, the
/// VM says why at `sync`, and dropping it returns.
#[test]
fn a_missing_watcher_thread_is_an_error_not_a_hang() {
    let mut config = Config::default().with_mock_devices(1, MockConfig::default());
    config.fault.refuse_watcher_threads = true;
    let vm = VirtualMachine::new(config).unwrap();
    let x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::mock(0));
    // The copy to the device can never complete; reading it back must not hang.
    let read = x.and_then(|x| x.to_vec::<f32>());
    assert!(read.is_err(), "read {read:?}");
    let e = vm.sync().unwrap_err();
    assert!(matches!(e, Error::ShutDown | Error::Failed { .. }), "{e}");
    drop(vm);
}

/// The last handle of a tensor dropped on one thread while another thread's builder still
/// holds unsubmitted instructions that use it: the `Release` must follow those
/// instructions, not overtake them.
#[test]
fn a_release_from_another_thread_waits_for_unsubmitted_uses() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let relu = vm.op("relu").unwrap();
    for _ in 0..20 {
        let t = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::CPU).unwrap();
        let elsewhere = t.clone();
        let (built_tx, built_rx) = std::sync::mpsc::channel::<()>();
        let (dropped_tx, dropped_rx) = std::sync::mpsc::channel::<()>();
        let y = std::thread::scope(|s| {
            s.spawn(move || {
                built_rx.recv().unwrap();
                drop(elsewhere); // the last handle, while the other thread's batch is open
                dropped_tx.send(()).unwrap();
            });
            vm.run(|b| {
                let y = b.call(relu, &[&t], Attrs::default(), cpu)?;
                drop(t);
                built_tx.send(()).unwrap();
                dropped_rx.recv().unwrap();
                Ok::<_, Error>(y)
            })
            .unwrap()
        });
        assert_eq!(y.to_vec::<f32>().unwrap(), vec![1.0, 0.0, 3.0]);
    }
    vm.sync().unwrap();
}

/// On an asynchronous stream most launches have no event of their own (`event_interval`):
/// they retire with the next event, at the latest the one recorded when a worker's batch
/// ends. A host wait after fewer launches than the interval still returns, results are
/// those of one event per launch, and nothing stays in flight.
#[test]
fn launches_without_an_event_of_their_own_retire_with_a_later_one() {
    // Run where a hang (a launch no event ever covers) fails the test instead of stalling it.
    let (done, finished) = std::sync::mpsc::channel();
    let body = std::thread::spawn(move || {
        retire_with_a_later_event();
        let _ = done.send(());
    });
    match finished.recv_timeout(Duration::from_secs(60)) {
        Ok(()) => body.join().unwrap(),
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            std::panic::resume_unwind(body.join().expect_err("it panicked"))
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("a host wait never returned: a launch was left without an event")
        }
    }
}

fn retire_with_a_later_event() {
    for interval in [1u32, 3, 1_000_000] {
        let mut c = Config::default().with_mock_devices(1, MockConfig::jittery());
        c.event_interval = interval;
        c.batch_size = 7;
        let vm = VirtualMachine::new(c).unwrap();
        let dev = DeviceId::mock(0);
        let (s, h2d) = (vm.compute_stream(dev).unwrap(), vm.stream(dev, StreamType::H2D).unwrap());
        let (scale, copy) = (vm.op("scale").unwrap(), vm.op("copy").unwrap());
        let a = vm.from_slice(&[1.0f32], &[1], dev).unwrap();
        let b = vm.empty(&[1], DType::F32, dev).unwrap();
        // Five launches, fewer than the interval and than a batch: a host wait must return.
        vm.run(|bld| -> Result<()> {
            for i in 0..5 {
                let (from, to) = if i % 2 == 0 { (&a, &b) } else { (&b, &a) };
                bld.call_into(scale, &[from], &[to], Attrs::scalar(2.0), s)?;
            }
            Ok(())
        })
        .unwrap();
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![32.0], "interval {interval}");
        // Many batches, and a cross-stream reader on the device's H2D stream, which waits
        // for an event recorded on the compute stream in the middle of an interval.
        let host = vm.from_slice(&[0.5f32], &[1], DeviceId::CPU).unwrap();
        vm.run(|bld| -> Result<()> {
            for i in 0..100 {
                let (from, to) = if i % 2 == 0 { (&b, &a) } else { (&a, &b) };
                bld.call_into(scale, &[from], &[to], Attrs::scalar(if i % 2 == 0 { 0.5 } else { 2.0 }), s)?;
                if i % 17 == 0 {
                    bld.call_into(copy, &[&host], &[to], Attrs::default(), h2d)?;
                }
            }
            Ok(())
        })
        .unwrap();
        vm.sync().unwrap();
        // The last copy (i = 85, into b) set 0.5; fourteen more calls halve then double.
        assert_eq!(b.to_vec::<f32>().unwrap(), vec![0.5], "interval {interval}");
        // The count drops once per scheduler loop, just after the waiters are released.
        let deadline = Instant::now() + Duration::from_secs(10);
        while vm.in_flight() > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert_eq!(vm.in_flight(), 0, "interval {interval}: everything retired");
    }
}
