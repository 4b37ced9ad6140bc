//! Shutdown with work in flight: dropping the VM drains what was submitted and joins every
//! thread it started. (Run alone in a child process, so that no other test's threads are
//! counted.)

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;

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
