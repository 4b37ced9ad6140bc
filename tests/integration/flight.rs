//! The flight recorder and the watchdog: a hung collective turned into an error on its
//! outputs with a readable dump, the VM living on; the ring's bound; a VM with nothing
//! stuck never firing; the snapshot of a quiet VM.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use eagervm::ep::ccl::mock::MockBackend;
use eagervm::ep::ccl::ReduceOp;
use eagervm::ep::mock::MockConfig;
use eagervm::ep::{DeviceId, StreamType};
use eagervm::vm::flight::{FlightRecord, FlightState};
use eagervm::vm::{Attrs, Config};
use eagervm::{Error, VirtualMachine};

const M0: DeviceId = DeviceId::mock(0);
const M1: DeviceId = DeviceId::mock(1);

/// A dump path of this test's own.
fn dump_path(test: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("eagervm-flight-test-{}-{test}.txt", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn config(mocks: u16, timeout: Option<Duration>, dump: &Path) -> Config {
    Config {
        watchdog_timeout: timeout,
        flight_dump: Some(dump.to_path_buf()),
        ..Config::default().with_mock_devices(mocks, MockConfig::jittery())
    }
}

#[test]
fn the_watchdog_aborts_a_hung_collective_and_the_vm_lives_on() {
    let dump = dump_path("hung");
    let timeout = Duration::from_millis(200);
    let vm = VirtualMachine::new(config(2, Some(timeout), &dump)).unwrap();
    let backend = MockBackend::new(&[M0, M1]).unwrap().hang_at(0);
    let comm = vm.communicator("stuck", Arc::new(backend)).unwrap();
    let a = vm.from_slice(&[1.0f32; 4], &[4], M0).unwrap();
    let b1 = vm.from_slice(&[2.0f32; 4], &[4], M1).unwrap();
    let started = Instant::now();
    let hung = vm.run(|b| b.all_reduce(&comm, &[&a, &b1], ReduceOp::Sum)).unwrap();
    // Outputs are read only after the abort: a read would wait behind the hung collective.
    while comm.aborted().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "the watchdog never fired");
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(started.elapsed() >= timeout, "fired after {:?}, before the timeout", started.elapsed());
    for out in &hung {
        match out.to_vec::<f32>() {
            Err(Error::Kernel { message, .. }) => {
                assert!(message.contains("aborted") && message.contains("watchdog"), "{message}");
                assert!(message.contains("timeout of 200ms"), "{message}");
            }
            other => panic!("expected the abort as a kernel error, got {other:?}"),
        }
    }
    // The dump is there, readable, and names the stuck op, its stream and communicator.
    let text = std::fs::read_to_string(&dump).expect("the watchdog wrote its dump");
    assert!(FlightRecord::is_dump(&text), "{text}");
    assert!(text.contains("STUCK"), "{text}");
    assert!(text.contains("all_reduce.sum@stuck"), "{text}");
    assert!(text.contains("stream mock:0:collective"), "{text}");
    assert!(text.contains("communicator stuck: mock backend, world size 2"), "{text}");
    assert!(text.contains("the last is collective #0"), "{text}");
    // The VM runs other work, on both devices and on the collective stream.
    let c = vm.from_slice(&[5.0f32], &[1], M0).unwrap();
    assert_eq!(c.to_vec::<f32>().unwrap(), [5.0]);
    let ok = vm.mock_communicator("fine", &[M0, M1]).unwrap();
    let sum = vm.run(|b| b.all_reduce(&ok, &[&a, &b1], ReduceOp::Sum)).unwrap();
    assert_eq!(sum[1].to_vec::<f32>().unwrap(), [3.0; 4]);
    // The failure is reported once, then cleared.
    assert!(matches!(vm.sync(), Err(Error::Failed { .. })));
    vm.sync().unwrap();
    // The collective stream made progress again: a snapshot shows it done.
    let snap = vm.flight_record();
    let coll = snap.stream("mock:0:collective").unwrap();
    assert!(coll.entries.iter().any(|e| e.op == "all_reduce.sum@stuck" && e.state == FlightState::Done));
    assert!(snap.quiet(), "{snap}");
    let _ = std::fs::remove_file(&dump);
}

#[test]
fn the_ring_keeps_only_the_last_n() {
    let dump = dump_path("ring");
    let vm =
        VirtualMachine::new(Config { flight_records: 8, flight_all_streams: true, ..config(0, None, &dump) })
            .unwrap();
    let relu = vm.op("relu").unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[1.0f32, -1.0], &[2], DeviceId::CPU).unwrap();
    let ys: Vec<_> = vm
        .run(|b| (0..50).map(|_| b.call(relu, &[&x], Attrs::default(), cpu)).collect::<Result<_, _>>())
        .unwrap();
    vm.sync().unwrap();
    let snap = vm.flight_record();
    assert_eq!(snap.records_per_stream, 8);
    let cpu = snap.stream("cpu:0").unwrap();
    assert_eq!(cpu.entries.len(), 8, "{snap}");
    let positions: Vec<u64> = cpu.entries.iter().map(|e| e.position).collect();
    assert_eq!(positions, (cpu.done - 7..=cpu.done).collect::<Vec<_>>(), "{snap}");
    let last = cpu.entries.last().unwrap();
    assert_eq!(last.op, "relu");
    assert_eq!(last.inputs, [x.id()]);
    assert_eq!(last.outputs, [ys[49].id()]);
    assert!(cpu.entries.iter().all(|e| e.state == FlightState::Done));
    // By default only the collective streams keep slots.
    let vm = VirtualMachine::new(Config { flight_records: 8, ..config(0, None, &dump) }).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).unwrap();
    vm.run(|b| b.call(relu, &[&x], Attrs::default(), cpu)).unwrap();
    vm.sync().unwrap();
    assert!(vm.flight_record().stream("cpu:0").unwrap().entries.is_empty());
    // Off: watermarks only.
    let vm = VirtualMachine::new(Config { flight_records: 0, ..config(0, None, &dump) }).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[1.0f32], &[1], DeviceId::CPU).unwrap();
    vm.run(|b| b.call(relu, &[&x], Attrs::default(), cpu)).unwrap();
    vm.sync().unwrap();
    let snap = vm.flight_record();
    assert!(snap.streams.iter().all(|s| s.entries.is_empty()));
    assert!(snap.quiet());
    assert!(snap.stream("cpu:0").unwrap().done >= 2);
}

#[test]
fn a_run_with_nothing_stuck_never_fires_and_a_quiet_vm_shows_everything_done() {
    let dump = dump_path("quiet");
    let mock = MockConfig { launch_delay: Duration::from_micros(200), ..MockConfig::jittery() };
    let cfg = Config {
        watchdog_timeout: Some(Duration::from_millis(50)),
        flight_dump: Some(dump.clone()),
        ..Config::default().with_mock_devices(2, mock)
    };
    let vm = VirtualMachine::new(cfg).unwrap();
    let comm = vm.mock_communicator("world", &[M0, M1]).unwrap();
    let relu = vm.op("relu").unwrap();
    let (s0, s1) = (vm.compute_stream(M0).unwrap(), vm.compute_stream(M1).unwrap());
    let mut a = vm.from_slice(&[1.0f32; 8], &[8], M0).unwrap();
    let mut b1 = vm.from_slice(&[2.0f32; 8], &[8], M1).unwrap();
    let started = Instant::now();
    // Well over the timeout of steady work, each instruction far shorter than it.
    while started.elapsed() < Duration::from_millis(400) {
        let out = vm
            .run(|b| {
                let r0 = b.call(relu, &[&a], Attrs::default(), s0)?;
                let r1 = b.call(relu, &[&b1], Attrs::default(), s1)?;
                b.all_reduce(&comm, &[&r0, &r1], ReduceOp::Max)
            })
            .unwrap();
        vm.sync().unwrap();
        a = out[0].clone();
        b1 = out[1].clone();
    }
    assert_eq!(a.to_vec::<f32>().unwrap(), [2.0; 8]);
    std::thread::sleep(Duration::from_millis(150));
    assert!(!dump.exists(), "the watchdog fired on a VM with nothing stuck");
    assert!(comm.aborted().is_none());
    let snap = vm.flight_record();
    assert!(snap.quiet(), "{snap}");
    assert_eq!(snap.timeout, Some(Duration::from_millis(50)));
    let coll = snap
        .stream(&vm.streams().iter().find(|s| s.1 == M0 && s.2 == StreamType::Collective).unwrap().3)
        .unwrap();
    assert!(!coll.entries.is_empty());
    for s in &snap.streams {
        assert_eq!(s.stuck_for, None);
        for e in &s.entries {
            assert_eq!(e.state, FlightState::Done, "{snap}");
            assert!(e.admitted.is_some() && e.dispatched.is_some() && e.done.is_some(), "{snap}");
            assert!(e.admitted <= e.dispatched, "{snap}");
        }
    }
    assert!(snap.communicators.iter().any(|c| c.name == "world" && c.issued > 0 && c.aborted.is_none()));
    let text = snap.to_string();
    assert!(FlightRecord::is_dump(&text) && text.contains("all_reduce.max@world"), "{text}");
}
