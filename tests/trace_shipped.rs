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
