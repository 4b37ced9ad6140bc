//! The instruction timeline: a program on cpu:0 and a mock device, profiled, written as
//! Chrome trace-event JSON and read back.

use std::collections::{BTreeSet, HashMap};
use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::profile::{FlowKind, Profile, ProfileError};
use serde_json::Value;

fn mock_config() -> Config {
    // A launch delay keeps the device copy unfinished when the CPU op that reads its result
    // is received, so that op gets a done-edge (a dependency arrow) from it.
    let mock = MockConfig { launch_delay: Duration::from_micros(500), ..MockConfig::default() };
    Config::default().with_mock_devices(1, mock)
}

/// Host → mock:0 (h2d), relu and scale on mock:0's compute stream (a device-side event
/// wait), back to the host (d2h), then CPU work on the result, a sync, and more CPU work.
fn program(vm: &VirtualMachine) -> Result<Vec<f32>> {
    let dev = DeviceId::mock(0);
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let g = vm.compute_stream(dev)?;
    let d2h = vm.stream(dev, StreamType::D2H)?;
    let (relu, scale, add, copy) = (vm.op("relu")?, vm.op("scale")?, vm.op("add")?, vm.op("copy")?);
    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[4], dev)?;
    let h = vm.empty(&[4], DType::F32, DeviceId::CPU)?;
    let z = vm.run(|b| -> Result<Tensor> {
        let r = b.call(relu, &[&x], Attrs::default(), g)?;
        let s = b.call(scale, &[&r], Attrs::scalar(2.0), g)?;
        b.call_into(copy, &[&s], &[&h], Attrs::default(), d2h)?;
        b.call(add, &[&h, &h], Attrs::default(), cpu)
    })?;
    vm.sync()?;
    let w = vm.run(|b| b.call(add, &[&z, &z], Attrs::default(), cpu))?;
    w.to_vec::<f32>()
}

fn events(p: &Profile) -> Vec<Value> {
    let mut buf = Vec::new();
    p.write_chrome_json_to(&mut buf).unwrap();
    let v: Value = serde_json::from_slice(&buf).expect("the trace is valid JSON");
    v["traceEvents"].as_array().expect("traceEvents is an array").clone()
}

fn us(v: &Value) -> f64 {
    v.as_f64().expect("a number of microseconds")
}

#[test]
fn a_profiled_run_gives_a_valid_timeline_with_tracks_slices_arrows_and_counters() {
    let vm = VirtualMachine::new(Config { profile: true, ..mock_config() }).unwrap();
    assert!(vm.is_profiling());
    assert_eq!(program(&vm).unwrap(), vec![8.0, 0.0, 24.0, 0.0]);
    let p = vm.stop_profiling().unwrap();
    assert!(!vm.is_profiling());
    let evs = events(&p);

    // Every event is well formed for its phase.
    for e in &evs {
        let ph = e["ph"].as_str().expect("every event has a phase");
        assert!(["M", "X", "i", "s", "f", "C"].contains(&ph), "unexpected phase in {e}");
        assert!(e["pid"].is_u64() && e["name"].is_string(), "{e}");
        if ph != "M" {
            assert!(us(&e["ts"]) >= 0.0, "{e}");
        }
        if ph == "X" {
            assert!(us(&e["dur"]) >= 0.0 && e["tid"].is_u64(), "{e}");
        }
    }

    // Track names: (pid, tid) -> name.
    let names: HashMap<(u64, u64), String> = evs
        .iter()
        .filter(|e| e["ph"] == "M" && e["name"] == "thread_name")
        .map(|e| {
            (
                (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()),
                e["args"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    let tracks: BTreeSet<&str> = names.values().map(String::as_str).collect();
    for want in [
        "cpu:0",
        "mock:0:compute",
        "mock:0:h2d",
        "mock:0:d2h",
        "eagervm-scheduler",
        "eagervm-worker-0",
        "eagervm-worker-3",
        "eagervm-watch-mock:0:compute",
        "eagervm-watch-mock:0:d2h",
    ] {
        assert!(tracks.contains(want), "no track named {want}: {tracks:?}");
    }

    // One slice per instruction, on its stream's track, with ordered timestamps.
    let slices: Vec<&Value> = evs.iter().filter(|e| e["ph"] == "X" && e["cat"] == "instruction").collect();
    assert_eq!(slices.len(), p.instructions().len());
    let mut seen = BTreeSet::new();
    for s in &slices {
        let a = &s["args"];
        let program = a["program"].as_u64().unwrap();
        assert!(seen.insert(program), "two slices for instruction #{program}");
        // On its stream's track, or one of the stream's further lanes.
        let track = &names[&(s["pid"].as_u64().unwrap(), s["tid"].as_u64().unwrap())];
        let stream = a["stream"].as_str().unwrap();
        let lane = a["lane"].as_u64().unwrap();
        let want = if lane == 0 { stream.to_string() } else { format!("{stream} lane {lane}") };
        assert_eq!(track, &want, "{s}");
        let (q, d, l, f) =
            (us(&a["queued_us"]), us(&a["dispatched_us"]), us(&a["launched_us"]), us(&a["done_us"]));
        assert!(q <= d && d <= l && l <= f, "#{program}: queued {q} dispatched {d} launched {l} done {f}");
        assert_eq!(us(&s["ts"]), l);
        assert!((us(&s["dur"]) - (f - l)).abs() < 1e-6, "{s}");
        assert!(a["tensors"].is_array());
    }
    let on = |name: &str, stream: &str| {
        slices.iter().filter(|s| s["name"] == name && s["args"]["stream"] == stream).count()
    };
    assert_eq!(on("relu", "mock:0:compute"), 1);
    assert_eq!(on("scale", "mock:0:compute"), 1);
    assert_eq!(on("add", "cpu:0"), 2);
    assert_eq!((on("copy", "mock:0:h2d"), on("copy", "mock:0:d2h")), (1, 1));
    assert!(on("StreamWaitEvent", "mock:0:compute") >= 1);
    assert!(on("RecordEvent", "mock:0:h2d") >= 1);

    // Nothing is missing: every program number up to the last instruction is a slice or a
    // barrier.
    let barriers: BTreeSet<u64> = evs
        .iter()
        .filter(|e| e["ph"] == "i" && e["name"] == "Barrier")
        .map(|e| e["args"]["program"].as_u64().unwrap())
        .collect();
    assert!(!barriers.is_empty(), "the sync's barrier is on the scheduler track");
    let last = *seen.last().unwrap();
    for k in 1..=last {
        assert!(seen.contains(&k) || barriers.contains(&k), "instruction #{k} is missing");
    }
    assert_eq!(p.incomplete(), 0);

    // Arrows pair up: one `s` and one `f` per id, the `f` no earlier than the `s`.
    let mut flows: HashMap<u64, (Vec<f64>, Vec<f64>)> = HashMap::new();
    for e in evs.iter().filter(|e| e["ph"] == "s" || e["ph"] == "f") {
        let entry = flows.entry(e["id"].as_u64().unwrap()).or_default();
        if e["ph"] == "s" { &mut entry.0 } else { &mut entry.1 }.push(us(&e["ts"]));
    }
    assert!(!flows.is_empty());
    for (id, (s, f)) in &flows {
        assert!(s.len() == 1 && f.len() == 1, "flow {id}: {} starts, {} finishes", s.len(), f.len());
        assert!(s[0] <= f[0], "flow {id} goes back in time");
    }
    let kinds: Vec<FlowKind> = p.flows().iter().map(|f| f.kind).collect();
    assert!(kinds.contains(&FlowKind::EventWait), "{kinds:?}");
    assert!(kinds.contains(&FlowKind::Dependency), "{kinds:?}");
    for f in p.flows().iter().filter(|f| f.kind == FlowKind::EventWait) {
        let name = |prog| p.instructions().iter().find(|i| i.program == prog).unwrap().name;
        assert_eq!((name(f.from), name(f.to)), ("RecordEvent", "StreamWaitEvent"));
    }

    // Counters and thread slices.
    let counters: BTreeSet<&str> =
        evs.iter().filter(|e| e["ph"] == "C").map(|e| e["name"].as_str().unwrap()).collect();
    assert!(counters.contains("in flight"), "{counters:?}");
    assert!(counters.contains("allocator cpu:0 (bytes in use)"), "{counters:?}");
    assert!(counters.contains("allocator mock:0 (bytes in use)"), "{counters:?}");
    let thread_slice = |name: &str, track: &str| {
        evs.iter().any(|e| {
            e["ph"] == "X"
                && e["name"] == name
                && names.get(&(e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap())).map(String::as_str)
                    == Some(track)
        })
    };
    assert!(thread_slice("intake", "eagervm-scheduler"));
    assert!(thread_slice("completions", "eagervm-scheduler"));
    assert!(thread_slice("execute", "eagervm-worker-0"));
    assert!(thread_slice("watch", "eagervm-watch-mock:0:compute"));

    // The summary counts each stream's instructions.
    let sum = p.summary();
    let cpu = sum.streams.iter().find(|s| s.name == "cpu:0").unwrap();
    assert_eq!(cpu.instructions, p.instructions().iter().filter(|i| i.stream.index() == 0).count());
    assert!(sum.streams.iter().all(|s| s.busy <= sum.span));
    let g = sum.streams.iter().find(|s| s.name == "mock:0:compute").unwrap();
    assert!(g.busy >= Duration::from_micros(500), "relu alone waits out a launch delay: {:?}", g.busy);
    assert!(sum.to_string().contains("mock:0:compute"));
}

#[test]
fn without_a_session_nothing_is_recorded_and_stopping_is_an_error() {
    let vm = VirtualMachine::new(mock_config()).unwrap();
    assert!(!vm.is_profiling());
    program(&vm).unwrap();
    assert!(matches!(vm.stop_profiling(), Err(ProfileError::NotProfiling)));
}

#[test]
fn a_session_covers_only_what_was_submitted_while_it_was_open() {
    let vm = VirtualMachine::new(mock_config()).unwrap();
    program(&vm).unwrap();
    vm.sync().unwrap();
    vm.start_profiling().unwrap();
    let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
    let relu = vm.op("relu").unwrap();
    let a = vm.from_slice(&[-1.0f32], &[1], DeviceId::CPU).unwrap();
    let r = vm.run(|b| b.call(relu, &[&a], Attrs::default(), cpu)).unwrap();
    let p = vm.stop_profiling().unwrap();
    let names: Vec<&str> = p.instructions().iter().map(|i| i.name).collect();
    // `from_slice`'s host write (an Access) and the relu; nothing of the earlier program.
    assert_eq!(names, vec!["Access", "relu"]);
    assert_eq!(r.to_vec::<f32>().unwrap(), vec![0.0]);
    assert!(matches!(vm.stop_profiling(), Err(ProfileError::NotProfiling)));
}

#[test]
fn profiling_in_synchronous_mode_is_refused() {
    let c = Config { synchronous: true, ..Config::default() };
    let vm = VirtualMachine::new(c.clone()).unwrap();
    assert!(matches!(vm.start_profiling(), Err(ProfileError::Synchronous)));
    assert!(VirtualMachine::new(Config { profile: true, ..c }).is_err());
}

#[test]
fn a_failed_write_names_the_file() {
    let vm = VirtualMachine::new(Config { profile: true, ..Config::default() }).unwrap();
    let p = vm.stop_profiling().unwrap();
    let path = std::env::temp_dir().join("eagervm-no-such-dir").join("out.json");
    let e = p.write_chrome_json(&path).unwrap_err();
    assert!(matches!(e, ProfileError::Write { .. }));
    assert!(e.to_string().contains("eagervm-no-such-dir"), "{e}");
    let ok = std::env::temp_dir().join(format!("eagervm-profile-{}.json", std::process::id()));
    p.write_chrome_json(&ok).unwrap();
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&ok).unwrap()).unwrap();
    assert!(v["traceEvents"].is_array());
    std::fs::remove_file(&ok).unwrap();
}
