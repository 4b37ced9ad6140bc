//! Record → replay: programs built directly with `InstructionsBuilder`, recorded while they
//! run, replay with the same results (every host read bit for bit, every final checksum),
//! as recorded and with the synchronisation derived again on another device layout.

mod common;

use common::{decode, execute, vm, Raw};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::trace::{self, DeviceMap, Recorder, ReplayOptions};
use eagervm::vm::ThreadTopology;
use proptest::prelude::*;

fn temp(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("eagervm-trace-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name)
}

fn fast_mock() -> MockConfig {
    MockConfig { launch_delay: std::time::Duration::ZERO, ..MockConfig::default() }
}

fn bits(bytes: &[u8]) -> Vec<u32> {
    bytes
        .chunks_exact(4)
        .map(|c| {
            let v = f32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
            if v.is_nan() {
                u32::MAX
            } else {
                v.to_bits()
            }
        })
        .collect()
}

/// Record `raw`'s program, then replay its trace in every mode; all reads must match.
fn record_replay(name: &str, raw: &Raw) {
    let p = decode(5, raw);
    let path = temp(name);
    let vm = vm(fast_mock(), ThreadTopology::PerStream, false);
    let rec = Recorder::start(&vm, &path).expect("start");
    let outcome = execute(&vm, &p).expect("program runs");
    let summary = rec.finish(&vm, &[], None).expect("finish");
    assert!(summary.failure.is_none());
    let trace = trace::load(&path).expect("the recorded trace parses");
    trace::validate(&trace, &Default::default()).expect("the recorded trace is valid, syncs included");
    let modes = [(false, DeviceMap::AsRecorded), (true, DeviceMap::AsRecorded), (true, DeviceMap::Cpu)];
    for (resync, device) in modes {
        let config = Config { mock: fast_mock(), ..Config::default() };
        let opts = ReplayOptions { resync, device, config, ..Default::default() };
        let report =
            trace::replay(&trace, &opts).unwrap_or_else(|e| panic!("replay {resync} {device:?}: {e}"));
        let reads: Vec<Vec<u32>> =
            report.reads.iter().map(|r| bits(r.result.as_ref().expect("no failures"))).collect();
        assert_eq!(reads, outcome, "replay (resync {resync}, {device:?}) of {p:?}");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]
    #[test]
    fn random_programs_replay_to_the_same_reads(raw in prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 1..40)) {
        record_replay("random.trace", &raw);
    }
}

#[test]
fn expectations_are_written_and_checked() {
    let path = temp("expect.trace");
    let vm = VirtualMachine::new(Config::default().with_mock_devices(1, fast_mock())).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let big: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.0).collect();
    let x = vm.from_slice(&big, &[10, 100], DeviceId::mock(0)).unwrap();
    let w = vm.from_slice(&vec![0.25f32; 100 * 3], &[100, 3], DeviceId::mock(0)).unwrap();
    let g = vm.compute_stream(DeviceId::mock(0)).unwrap();
    let y = vm
        .run(|b| {
            let m = b.call(vm.op("matmul")?, &[&x, &w], Attrs::default(), g)?;
            b.call(vm.op("relu")?, &[&m], Attrs::default(), g)
        })
        .unwrap();
    let want = y.to_vec::<f32>().unwrap();
    let summary = rec.finish(&vm, &[&y], None).unwrap();
    assert_eq!(summary.expects, 1);
    assert!(summary.sidecar.is_some(), "1000 floats go to the sidecar");
    let trace = trace::load(&path).unwrap();
    let report = trace::replay(&trace, &ReplayOptions::default()).unwrap();
    assert_eq!(report.checked, 1);
    assert_eq!(
        bits(report.reads[0].result.as_ref().unwrap()),
        bits(&want.iter().flat_map(|v| v.to_ne_bytes()).collect::<Vec<_>>())
    );

    // A changed checksum is a mismatch naming the line.
    let text = std::fs::read_to_string(&path).unwrap();
    let line = text.lines().position(|l| l.starts_with("expect t")).unwrap() + 1;
    let bad: String = text
        .lines()
        .map(|l| {
            if !l.starts_with("expect t") {
                return format!("{l}\n");
            }
            let flipped = if l.ends_with('0') { '1' } else { '0' };
            format!("{}{flipped}\n", &l[..l.len() - 1])
        })
        .collect();
    let bad_path = temp("expect-bad.trace");
    std::fs::write(&bad_path, &bad).unwrap();
    std::fs::copy(summary.sidecar.as_ref().unwrap(), temp("expect-bad.trace.bin")).unwrap();
    let bad_trace = trace::load(&bad_path).unwrap();
    let e = trace::replay(&bad_trace, &ReplayOptions::default()).unwrap_err();
    assert!(matches!(e, trace::TraceError::Mismatch { .. }), "{e}");
    assert!(e.to_string().contains(&format!(":{line}:")), "{e}");
}

#[test]
fn a_deliberate_failure_is_recorded_and_expected() {
    let path = temp("failure.trace");
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let f = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
    let r = vm
        .run(|b| {
            b.call_into(vm.op("fail")?, &[], &[&f], Attrs::scalar(7.0), cpu)?;
            b.call(vm.op("relu")?, &[&f], Attrs::default(), cpu)
        })
        .unwrap();
    let err = r.to_vec::<f32>().unwrap_err();
    let summary = rec.finish(&vm, &[], Some(&err)).unwrap();
    assert!(summary.failure.as_deref().is_some_and(|f| f.contains("fail")), "{summary:?}");
    let trace = trace::load(&path).unwrap();
    let report = trace::replay(&trace, &ReplayOptions::default()).expect("the failure is expected");
    assert!(report.expected_failure.is_some());
    assert!(!report.failures.is_empty());

    // Without its `expect error` line the same trace fails the replay, naming a line.
    let text = std::fs::read_to_string(&path).unwrap();
    let stripped: String =
        text.lines().filter(|l| !l.starts_with("expect error")).map(|l| format!("{l}\n")).collect();
    let p2 = temp("failure-unexpected.trace");
    std::fs::write(&p2, stripped).unwrap();
    let e = trace::replay(&trace::load(&p2).unwrap(), &ReplayOptions::default()).unwrap_err();
    assert!(matches!(e, trace::TraceError::Vm { .. }), "{e}");
}

#[test]
fn cuda_is_a_typed_unavailable_error() {
    let (t, d) = trace::parse_str(
        "x.trace",
        "eagervm-trace 1\ndevice cpu:0\ndevice cuda:0\nstream s0 cpu:0 compute\nstream s1 cuda:0 compute\n",
    );
    assert!(d.is_empty(), "{d:?}");
    let opts = ReplayOptions { resync: true, device: DeviceMap::Cuda, ..Default::default() };
    if eagervm::ep::cuda::available(0).is_ok() {
        // With a GPU, the trace replays on it as recorded, and mapped onto it.
        trace::replay(&t, &ReplayOptions::default()).expect("replays on cuda:0");
        trace::replay(&t, &opts).expect("replays mapped onto cuda:0");
    } else {
        let e = trace::replay(&t, &ReplayOptions::default()).unwrap_err();
        assert!(matches!(e, trace::TraceError::DeviceUnavailable { .. }), "{e}");
        assert!(matches!(trace::replay(&t, &opts).unwrap_err(), trace::TraceError::DeviceUnavailable { .. }));
    }
    let opts = ReplayOptions { resync: true, device: DeviceMap::Mock, ..Default::default() };
    trace::replay(&t, &opts).expect("cuda maps onto mock with --resync");
    let opts = ReplayOptions { resync: false, device: DeviceMap::Mock, ..Default::default() };
    assert!(
        matches!(trace::replay(&t, &opts).unwrap_err(), trace::TraceError::Invalid { .. }),
        "layout change needs resync"
    );
}

#[test]
fn i64_data_and_panics_round_trip() {
    let path = temp("i64-panic.trace");
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let rec = Recorder::start(&vm, &path).unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let x = vm.from_slice(&[i64::MIN, -1, 0, 7, i64::MAX], &[5], DeviceId::CPU).unwrap();
    let (y, p) = vm
        .run(|b| -> eagervm::Result<_> {
            let y = b.call(vm.op("scale")?, &[&x], Attrs::scalar(-3.0), cpu)?;
            let p = vm.empty(&[1], DType::I64, DeviceId::CPU)?;
            b.call_into(vm.op("panic")?, &[&y], &[&p], Attrs::default(), cpu)?;
            Ok((y, p))
        })
        .unwrap();
    let want = y.to_vec::<i64>().unwrap();
    let summary = rec.finish(&vm, &[&y, &p], None).unwrap();
    assert_eq!(summary.expects, 1, "the panicked output has no checksum");
    assert!(summary.failure.as_deref().is_some_and(|f| f.starts_with("panic")), "{summary:?}");
    let t = trace::load(&path).unwrap();
    assert!(t.to_text().contains("i64 -9223372036854775808 -1 0 7 9223372036854775807"));
    let r = trace::replay(&t, &ReplayOptions::default()).expect("the panic is expected");
    assert_eq!(r.checked, 1);
    assert!(r.expected_failure.as_deref().is_some_and(|f| f.starts_with("panic")));
    assert_eq!(want, vec![i64::MIN.wrapping_mul(-3), 3, 0, -21, i64::MAX.wrapping_mul(-3)]);
}
