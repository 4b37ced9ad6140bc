//! Every trace shipped in `instructions/` validates, analyses, and replays with its stated
//! checksums (or its stated failure): as recorded, and with synchronisation derived anew on
//! the CPU alone.

use eagervm::trace::{self, DeviceMap, ReplayOptions};

fn shipped() -> Vec<std::path::PathBuf> {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions");
    let mut v: Vec<_> = std::fs::read_dir(&dir)
        .expect("instructions/ exists")
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "trace"))
        .collect();
    v.sort();
    v
}

#[test]
fn every_shipped_trace_replays_with_its_checksums() {
    let traces = shipped();
    assert!(traces.len() >= 2, "instructions/ ships traces: {traces:?}");
    for path in traces {
        let t = trace::load(&path).unwrap_or_else(|e| panic!("{e}"));
        trace::validate(&t, &Default::default()).unwrap_or_else(|e| panic!("{e}"));
        let a = trace::analyze(&t).unwrap_or_else(|e| panic!("{e}"));
        assert!(a.critical_path >= 1 && a.critical_path <= a.instructions, "{}", path.display());
        let states = t
            .lines
            .iter()
            .filter(|l| matches!(l.stmt, trace::Stmt::Expect { .. } | trace::Stmt::ExpectError { .. }))
            .count();
        assert!(states > 0, "{} states what a replay must reproduce", path.display());
        for (resync, device) in
            [(false, DeviceMap::AsRecorded), (true, DeviceMap::Cpu), (true, DeviceMap::Mock)]
        {
            let opts = ReplayOptions { resync, device, ..Default::default() };
            let r =
                trace::replay(&t, &opts).unwrap_or_else(|e| panic!("{} ({device:?}): {e}", path.display()));
            assert_eq!(r.instructions as usize, t.instructions());
            assert!(r.checked > 0 || r.expected_failure.is_some());
        }
    }
}

/// Relative tolerance of the replays below against a replay on cpu:0 (see
/// `ReplayOptions::tolerance`): cuBLAS products and the CUDA `sum` differ from the CPU's by
/// about 1e-6 of a tensor's largest magnitude on these small traces.
const TOLERANCE: f64 = 1e-4;

/// Replay the shipped trace at `path` with soft sync re-derived and its devices mapped by
/// `device`, checking every expected tensor within [`TOLERANCE`] of a replay on cpu:0.
fn replay_within_tolerance(path: &std::path::Path, device: DeviceMap) -> trace::ReplayReport {
    let t = trace::load(path).unwrap_or_else(|e| panic!("{e}"));
    let opts = ReplayOptions { resync: true, device, tolerance: Some(TOLERANCE), ..Default::default() };
    let r = trace::replay(&t, &opts).unwrap_or_else(|e| panic!("{} on {device:?}: {e}", path.display()));
    assert!(r.checked > 0, "{}: nothing compared", path.display());
    r
}

#[test]
fn every_shipped_trace_replays_within_tolerance_on_mock() {
    for path in shipped() {
        replay_within_tolerance(&path, DeviceMap::Mock);
    }
}

/// On a machine with a GPU: every shipped trace with devices besides the host replays with
/// them on CUDA (all on cuda:0 when there is one GPU), each expected tensor within
/// [`TOLERANCE`] of the CPU's.
#[test]
#[ignore = "needs a GPU"]
fn every_shipped_trace_replays_on_cuda_within_tolerance() {
    if let Err(e) = eagervm::ep::cuda::available(0) {
        panic!("this test needs a GPU (cuda:0): {e}");
    }
    let mut on_gpu = 0;
    for path in shipped() {
        let r = replay_within_tolerance(&path, DeviceMap::Cuda);
        let cuda_streams = r.per_stream.iter().filter(|(name, _)| name.starts_with("cuda:")).count();
        println!(
            "{}: {} expected tensors within {TOLERANCE}; {cuda_streams} cuda streams used",
            path.display(),
            r.checked
        );
        on_gpu += usize::from(cuda_streams > 0);
    }
    assert!(on_gpu >= 3, "at least the demo, branches and pipeline traces run on the GPU");
}
