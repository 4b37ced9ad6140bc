//! Stream priorities on a worker that serves several streams: of the instructions one
//! completion releases, the higher-priority stream's run first.

use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::ep::{DeviceId, StreamType};
use eagervm::vm::{Attrs, Config, StreamPriorities, ThreadTopology};
use eagervm::VirtualMachine;

const N: usize = 96;

/// With a single worker: two uploads to `mock:0` read `t1` and `t2`; a matmul on the CPU's
/// collective stream then overwrites `t1`, and one on the CPU's compute stream overwrites
/// `t2`. Both wait for the uploads, which one event retires together, so one completion
/// releases both, and the worker runs them one after the other. Returns whether the
/// collective stream's ran first.
fn collective_runs_first(priorities: StreamPriorities) -> bool {
    let config = Config {
        threads: ThreadTopology::Single,
        stream_priorities: priorities,
        profile: true,
        ..Config::default().with_mock_devices(
            1,
            MockConfig { launch_delay: Duration::from_millis(20), ..MockConfig::default() },
        )
    };
    let vm = VirtualMachine::new(config).unwrap();
    let ones = vec![1.0f32; N * N];
    let w = vm.from_slice(&ones, &[N, N], DeviceId::CPU).unwrap();
    let t1 = vm.from_slice(&ones, &[N, N], DeviceId::CPU).unwrap();
    let t2 = vm.from_slice(&ones, &[N, N], DeviceId::CPU).unwrap();
    vm.sync().unwrap();
    let (copy, matmul) = (vm.op("copy").unwrap(), vm.op("matmul").unwrap());
    let h2d = vm.stream(DeviceId::mock(0), StreamType::H2D).unwrap();
    let coll = vm.stream(DeviceId::CPU, StreamType::Collective).unwrap();
    let compute = vm.compute_stream(DeviceId::CPU).unwrap();
    vm.run(|b| {
        b.call(copy, &[&t1], Attrs::default(), h2d)?;
        b.call(copy, &[&t2], Attrs::default(), h2d)?;
        b.call_into(matmul, &[&w, &w], &[&t2], Attrs::default(), compute)?;
        b.call_into(matmul, &[&w, &w], &[&t1], Attrs::default(), coll)
    })
    .unwrap();
    vm.sync().unwrap();
    assert_eq!(t1.to_vec::<f32>().unwrap()[0], N as f32);
    let profile = vm.stop_profiling().unwrap();
    let on = |s| profile.instructions().iter().find(|i| i.name == "matmul" && i.stream == s).unwrap().clone();
    let (c, m) = (on(coll), on(compute));
    // One worker runs them one after the other, whichever order.
    assert!(c.done <= m.launched || m.done <= c.launched, "{c:?} {m:?}");
    c.done <= m.launched
}

#[test]
fn a_higher_priority_stream_runs_first_on_a_shared_worker() {
    // The default: collective streams above the others. Up to three tries: on a loaded
    // machine the watcher can report the two uploads' events apart (its worker pushed the
    // second watch only after the first event was reached), and then program order, with
    // the compute stream's matmul first, is all there is to go by. A scheduler that
    // ignored priorities would run the compute stream's first every time.
    assert!((0..3).any(|_| collective_runs_first(StreamPriorities::default())));
    // Reversed, the compute stream's goes first, although it was issued first either way.
    let compute_first = StreamPriorities::default().with(StreamType::Collective, -1);
    assert!(!collective_runs_first(compute_first));
    // Uniform: no reordering, and no cost (the scheduler skips the sort).
    let _ = collective_runs_first(StreamPriorities([0; 4]));
}
