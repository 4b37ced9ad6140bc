//! Shutdown with work in flight: dropping the VM drains what was submitted and joins every
//! thread it started, without waiting out a simulated device's delays and without a busy
//! core while it waits for real work. (Run alone in a child process, so that no other
//! test's threads or processor time are counted.)

use std::sync::Arc;
use std::time::{Duration, Instant};

use eagervm::ep::ccl::mock::MockBackend;
use eagervm::ep::ccl::ReduceOp;
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

/// Processor time this process has used so far, every thread counted.
fn cpu_time() -> Duration {
    // SAFETY: `getrusage` writes the `rusage` it is given and reads nothing else; an
    // all-zero `rusage` is a valid value of the plain C struct.
    let ru = unsafe {
        let mut ru: libc::rusage = std::mem::zeroed();
        assert_eq!(libc::getrusage(libc::RUSAGE_SELF, &mut ru), 0);
        ru
    };
    let tv =
        |t: libc::timeval| Duration::from_secs(t.tv_sec as u64) + Duration::from_micros(t.tv_usec as u64);
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// Wall-clock time and processor time `f` took.
fn timed(f: impl FnOnce()) -> (Duration, Duration) {
    let (cpu, wall) = (cpu_time(), Instant::now());
    f();
    (wall.elapsed(), cpu_time() - cpu)
}

fn threads_named_eagervm() -> usize {
    std::fs::read_dir("/proc/self/task")
        .map(|d| {
            d.filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
                .filter(|n| n.starts_with("eagervm") || n.starts_with("mock"))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn drop_drains_work_in_flight_and_joins_every_thread() {
    if !crate::common::alone(module_path!(), "drop_drains_work_in_flight_and_joins_every_thread", &[]) {
        return;
    }
    let mock = MockConfig { launch_delay: Duration::from_micros(300), ..MockConfig::default() };
    let before = threads_named_eagervm();
    let result;
    {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(2, mock)).unwrap();
        let g = vm.compute_stream(DeviceId::mock(1)).unwrap();
        let scale = vm.op("scale").unwrap();
        let mut x = vm.from_slice(&[1.0f32; 8], &[8], DeviceId::mock(1)).unwrap();
        vm.run(|b| {
            for _ in 0..200 {
                x = b.call(scale, &[&x], Attrs::scalar(2.0), g).unwrap();
            }
        });
        assert!(vm.in_flight() > 0, "the device is slow enough that work is still in flight");
        result = x;
        // `vm` drops here with ~60 ms of device work queued.
    }
    // Every thread the VM started has exited; the last write completed before shutdown.
    std::thread::sleep(Duration::from_millis(20));
    assert_eq!(threads_named_eagervm(), before);
    assert!(matches!(result.to_vec::<f32>(), Err(Error::ShutDown)));
}

#[test]
fn a_drop_runs_queued_delayed_work_without_waiting_out_its_delays() {
    if !crate::common::alone(
        module_path!(),
        "a_drop_runs_queued_delayed_work_without_waiting_out_its_delays",
        &[],
    ) {
        return;
    }
    // 40 items of 100 ms each: 4 s of simulated device time queued (what a user who set
    // `mock_launch_delay_us` and pressed Ctrl-C leaves behind).
    let mock = MockConfig { launch_delay: Duration::from_millis(100), ..MockConfig::default() };
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, mock)).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let scale = vm.op("scale").unwrap();
    let mut x = vm.from_slice(&[1.0f32; 8], &[8], DeviceId::mock(0)).unwrap();
    vm.run(|b| {
        for _ in 0..40 {
            x = b.call(scale, &[&x], Attrs::scalar(2.0), g).unwrap();
        }
    });
    assert!(vm.in_flight() > 30, "the work is queued behind the delays");
    let (wall, cpu) = timed(|| drop(vm));
    assert!(wall < Duration::from_secs(1), "the drop waited out the delays: {wall:?} for 4 s of them");
    assert!(cpu < Duration::from_millis(500), "the drop used {cpu:?} of processor time in {wall:?}");
    drop(x);
}

#[test]
fn a_drop_that_waits_for_work_sleeps() {
    if !crate::common::alone(module_path!(), "a_drop_that_waits_for_work_sleeps", &[]) {
        return;
    }
    // A collective that waits for a peer that never comes: the drop waits until the
    // watchdog aborts it, which is real time, not simulated.
    let timeout = Duration::from_millis(600);
    let config = Config {
        watchdog_timeout: Some(timeout),
        ..Config::default().with_mock_devices(2, MockConfig::default())
    };
    let vm = VirtualMachine::new(config).unwrap();
    let (m0, m1) = (DeviceId::mock(0), DeviceId::mock(1));
    let comm = vm.communicator("stuck", Arc::new(MockBackend::new(&[m0, m1]).unwrap().hang_at(0))).unwrap();
    let a = vm.from_slice(&[1.0f32; 4], &[4], m0).unwrap();
    let b = vm.from_slice(&[2.0f32; 4], &[4], m1).unwrap();
    let hung = vm.run(|bld| bld.all_reduce(&comm, &[&a, &b], ReduceOp::Sum)).unwrap();
    let (wall, cpu) = timed(|| drop(vm));
    assert!(wall >= timeout / 2, "the drop did not wait for the collective: {wall:?}");
    // A core kept busy while waiting would show processor time close to the wall time.
    assert!(cpu < wall / 4, "the drop used {cpu:?} of processor time in {wall:?} of waiting");
    drop((hung, a, b, comm));
}
