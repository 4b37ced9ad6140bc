//! The timeline as Perfetto imports it, the op table, and the replay summary.
//!
//! Perfetto's `trace_processor` (the importer behind ui.perfetto.dev) cannot run here: the
//! `perfetto` Python package downloads its binary at run time. So [`import`] applies the
//! rules of its JSON importer (`src/trace_processor/importers/json/json_trace_parser_impl.cc`,
//! `importers/common/slice_tracker.cc` and `flow_tracker.cc`) to the JSON of real replays:
//!
//! - events are read in timestamp order (microseconds, rounded to whole nanoseconds), ties
//!   in file order;
//! - an `X` slice (and a thread-scoped instant, a slice of no length) first closes the
//!   slices of its track that ended before it (or when it begins, unless both have no
//!   length); if it then begins inside the topmost open slice and ends after it, it is
//!   dropped (`slice_drop_overlapping_complete_event`);
//! - `B`/`E` open and close slices by name; an `E` with nothing open, or a `B` never
//!   closed, is an error here (we write none);
//! - a flow's `s` binds to the topmost open slice of its track as it is read, without
//!   closing ended slices first; a flow's `f` with `bp: "e"` binds the same way and needs
//!   its `s` read before it (else `flow_end_without_start`); a flow event on a track with
//!   no open slice is `flow_no_enclosing_slice`; an id started twice is
//!   `flow_duplicate_id`.
//!
//! On top of what the importer accepts, the tests check what it means: every instruction's
//! slice survives, every arrow binds to the slices of the instructions it joins, and each
//! flow event lies inside the slice it binds to.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::profile::Profile;
use eagervm::trace::{self, DeviceMap, ReplayOptions};
use proptest::prelude::*;
use serde_json::Value;

use crate::common;

/// A slice as the importer keeps it.
#[derive(Debug, Clone)]
struct Slice {
    ts: i64,
    dur: i64,
    name: String,
    /// The instruction's program number, for instruction slices.
    program: Option<u64>,
}

/// What importing a trace gave.
#[derive(Debug, Default)]
struct Imported {
    slices: Vec<Slice>,
    /// Flows by id: (out slice, in slice), indices into `slices`.
    flows: HashMap<u64, (usize, usize)>,
    /// What the importer would have counted as errors, with the offending event.
    errors: Vec<String>,
}

fn ns(v: &Value) -> i64 {
    (v.as_f64().expect("a number") * 1000.0).round() as i64
}

/// Import the Chrome JSON `json` by the rules in the module docs.
fn import(json: &[u8]) -> Imported {
    let v: Value = serde_json::from_slice(json).expect("valid JSON");
    let events = v["traceEvents"].as_array().expect("traceEvents");
    let mut order: Vec<(i64, usize)> =
        events.iter().enumerate().filter(|(_, e)| e["ph"] != "M").map(|(k, e)| (ns(&e["ts"]), k)).collect();
    order.sort();
    let mut out = Imported::default();
    let mut stacks: HashMap<(u64, u64), Vec<usize>> = HashMap::new();
    let mut open_b: HashMap<(u64, u64), Vec<(String, i64)>> = HashMap::new();
    let mut starts: HashMap<u64, usize> = HashMap::new();
    let mut ended: HashMap<u64, usize> = HashMap::new();
    for (ts, k) in order {
        let e = &events[k];
        let ph = e["ph"].as_str().unwrap_or_default();
        let track = (e["pid"].as_u64().unwrap_or(0), e["tid"].as_u64().unwrap_or(0));
        let stack = stacks.entry(track).or_default();
        let slice = match ph {
            "X" => Some(ns(&e["dur"])),
            "i" | "I" if e["s"].as_str().is_none_or(|s| s == "t") => Some(0),
            _ => None,
        };
        if let Some(dur) = slice {
            if dur < 0 {
                out.errors.push(format!("negative duration: {e}"));
                continue;
            }
            let mut dropped = false;
            while let Some(&top) = stack.last() {
                let t = &out.slices[top];
                let end = t.ts + t.dur;
                if end < ts || (end == ts && !(t.dur == 0 && dur == 0)) {
                    stack.pop();
                    continue;
                }
                if ts < end && ts + dur > end {
                    out.errors.push(format!("slice_drop_overlapping_complete_event: {e} over {t:?}"));
                    dropped = true;
                }
                break;
            }
            if !dropped {
                out.slices.push(Slice {
                    ts,
                    dur,
                    name: e["name"].as_str().unwrap_or_default().into(),
                    program: e["args"]["program"].as_u64().filter(|_| e["cat"] == "instruction"),
                });
                stack.push(out.slices.len() - 1);
            }
            continue;
        }
        match ph {
            "B" => open_b.entry(track).or_default().push((e["name"].as_str().unwrap_or_default().into(), ts)),
            "E" => match open_b.entry(track).or_default().pop() {
                Some((_, b)) if b <= ts => {}
                _ => out.errors.push(format!("unbalanced E: {e}")),
            },
            "s" | "f" => {
                let id = e["id"].as_u64().expect("numeric flow id");
                let Some(&top) = stack.last() else {
                    out.errors.push(format!("flow_no_enclosing_slice: {e}"));
                    continue;
                };
                let s = &out.slices[top];
                if ts < s.ts || ts > s.ts + s.dur {
                    out.errors.push(format!("flow event outside the slice it binds to ({s:?}): {e}"));
                }
                if ph == "s" {
                    if starts.insert(id, top).is_some() {
                        out.errors.push(format!("flow_duplicate_id: {e}"));
                    }
                } else {
                    if e["bp"] != "e" {
                        out.errors.push(format!("flow end not bound to its enclosing slice: {e}"));
                    }
                    match starts.get(&id) {
                        Some(&from) => {
                            if ended.insert(id, top).is_some() {
                                out.errors.push(format!("flow ended twice: {e}"));
                            }
                            out.flows.insert(id, (from, top));
                        }
                        None => out.errors.push(format!("flow_end_without_start: {e}")),
                    }
                }
            }
            "C" => {
                if !e["args"].as_object().is_some_and(|a| a.values().all(Value::is_number)) {
                    out.errors.push(format!("counter without numeric args: {e}"));
                }
            }
            other => out.errors.push(format!("unexpected phase {other}: {e}")),
        }
    }
    for (track, open) in open_b {
        if !open.is_empty() {
            out.errors.push(format!("B never closed on {track:?}: {open:?}"));
        }
    }
    for id in starts.keys() {
        if !ended.contains_key(id) {
            out.errors.push(format!("flow {id} never ends"));
        }
    }
    out
}

fn chrome_json(p: &Profile) -> Vec<u8> {
    let mut buf = Vec::new();
    p.write_chrome_json_to(&mut buf).unwrap();
    buf
}

/// Import `p`'s JSON and check that Perfetto would keep all of it, as meant.
fn check_timeline(p: &Profile) {
    let json = chrome_json(p);
    let got = import(&json);
    assert!(
        got.errors.is_empty(),
        "{} importer errors, the first: {:#?}",
        got.errors.len(),
        &got.errors[..got.errors.len().min(5)]
    );
    // Every instruction has its slice.
    let by_program: HashMap<u64, &Slice> =
        got.slices.iter().filter_map(|s| s.program.map(|p| (p, s))).collect();
    assert_eq!(by_program.len(), p.instructions().len(), "instruction slices lost");
    for i in p.instructions() {
        let s = by_program[&i.program];
        assert_eq!(s.name, i.name);
    }
    // Every arrow joins the slices of its two instructions.
    assert_eq!(got.flows.len(), p.flows().len(), "arrows lost");
    let v: Value = serde_json::from_slice(&json).unwrap();
    let ids: Vec<u64> = v["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["ph"] == "s")
        .map(|e| e["id"].as_u64().unwrap())
        .collect();
    for (id, f) in ids.iter().zip(p.flows()) {
        let (from, to) = got.flows[id];
        assert_eq!(
            (got.slices[from].program, got.slices[to].program),
            (Some(f.from), Some(f.to)),
            "arrow {id} ({:?}) binds to the wrong slices",
            f.kind
        );
    }
}

fn shipped(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("instructions").join(name)
}

fn replay_profiled(name: &str, resync: bool, device: DeviceMap) -> trace::ReplayReport {
    let t = trace::load(&shipped(name)).unwrap();
    let opts = ReplayOptions { profile: true, resync, device, ..ReplayOptions::default() };
    trace::replay(&t, &opts).unwrap()
}

#[test]
fn the_checker_rejects_what_perfetto_drops() {
    let bad = br#"{"traceEvents":[
        {"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":5.0},
        {"ph":"X","name":"b","pid":1,"tid":1,"ts":3.0,"dur":5.0},
        {"ph":"s","name":"x","cat":"flow","id":1,"pid":1,"tid":2,"ts":2.0},
        {"ph":"f","name":"x","cat":"flow","id":2,"bp":"e","pid":1,"tid":1,"ts":2.0},
        {"ph":"E","name":"c","pid":1,"tid":3,"ts":9.0}
    ]}"#;
    let got = import(bad);
    let has = |what: &str| got.errors.iter().any(|e| e.starts_with(what));
    assert!(has("slice_drop_overlapping_complete_event"), "{:#?}", got.errors);
    assert!(has("flow_no_enclosing_slice"), "{:#?}", got.errors);
    assert!(has("flow_end_without_start"), "{:#?}", got.errors);
    assert!(has("unbalanced E"), "{:#?}", got.errors);
    assert_eq!(got.slices.len(), 1);
    // Nested and disjoint slices, touching ones included, are kept.
    let good = br#"{"traceEvents":[
        {"ph":"X","name":"a","pid":1,"tid":1,"ts":1.0,"dur":5.0},
        {"ph":"X","name":"b","pid":1,"tid":1,"ts":2.0,"dur":1.0},
        {"ph":"X","name":"c","pid":1,"tid":1,"ts":6.0,"dur":1.0}
    ]}"#;
    let got = import(good);
    assert!(got.errors.is_empty() && got.slices.len() == 3, "{got:?}");
}

#[test]
fn the_pipeline_timeline_keeps_every_slice_and_arrow() {
    let r = replay_profiled("pipeline.trace", false, DeviceMap::AsRecorded);
    let p = r.profile.as_ref().unwrap();
    assert_eq!(p.incomplete(), 0);
    assert!(p.flows().len() > 10, "the pipeline has cross-stream arrows");
    check_timeline(p);
    // Planted: every stream's lanes folded onto one track, as a timeline without lanes
    // would have it. The device slices overlap there, and the importer drops them.
    let mut v: Value = serde_json::from_slice(&chrome_json(p)).unwrap();
    for e in v["traceEvents"].as_array_mut().unwrap() {
        if e["pid"] == 1 {
            if let Some(tid) = e["tid"].as_u64() {
                e["tid"] = (tid % 100_000).into();
            }
        }
    }
    let got = import(&serde_json::to_vec(&v).unwrap());
    let dropped = got.errors.iter().filter(|e| e.starts_with("slice_drop_overlapping")).count();
    assert!(dropped > 0, "the planted overlap went unnoticed");
}

#[test]
fn the_mlp_timeline_keeps_every_slice_and_arrow() {
    let r = replay_profiled("mlp.trace", false, DeviceMap::AsRecorded);
    check_timeline(r.profile.as_ref().unwrap());
    // On the mock device, with the synchronisation derived anew.
    let r = replay_profiled("mlp.trace", true, DeviceMap::Mock);
    check_timeline(r.profile.as_ref().unwrap());
}

fn raw_program() -> impl Strategy<Value = (usize, common::Raw)> {
    (6usize..=12, prop::collection::vec(any::<(u8, u8, u8, u8, u8, i8)>(), 20..200))
}

proptest! {
    #![proptest_config(common::proptest_config(6))]

    /// A random program over cpu:0 and the compute, H2D and D2H streams of mock:0 and
    /// mock:1, with launch delays and jitter so that device work piles up.
    #[test]
    fn a_random_program_on_several_mock_streams_gives_an_importable_timeline((tensors, raw) in raw_program()) {
        let p = common::decode(tensors, &raw);
        let mock = MockConfig { launch_delay: Duration::from_micros(20), ..MockConfig::jittery() };
        let vm = common::vm(mock, eagervm::vm::ThreadTopology::PerStream, false);
        vm.start_profiling().unwrap();
        // Kernel failures are part of the programs; the timeline is what is checked.
        let _ = common::execute(&vm, &p);
        let _ = vm.sync();
        let profile = vm.stop_profiling().unwrap();
        check_timeline(&profile);
    }
}

#[test]
fn the_op_table_adds_up_to_the_profile() {
    for (name, resync, device) in [
        ("pipeline.trace", false, DeviceMap::AsRecorded),
        ("failure.trace", false, DeviceMap::AsRecorded),
        ("branches.trace", false, DeviceMap::AsRecorded),
    ] {
        let r = replay_profiled(name, resync, device);
        let p = r.profile.as_ref().unwrap();
        let table = p.op_table();
        // Every instruction is counted once, in the row of its op and stream.
        let count: usize = table.rows.iter().map(|r| r.count).sum();
        assert_eq!(count, p.instructions().len(), "{name}");
        let mut per_op: HashMap<(&str, u32), usize> = HashMap::new();
        for i in p.instructions() {
            *per_op.entry((i.name, i.stream.index() as u32)).or_default() += 1;
        }
        assert_eq!(per_op.len(), table.rows.len(), "{name}");
        for row in &table.rows {
            assert_eq!(per_op[&(row.name, row.stream.index() as u32)], row.count, "{name}: {row:?}");
            assert!(row.min <= row.mean() && row.mean() <= row.max, "{name}: {row:?}");
            assert!(row.total >= row.max, "{name}: {row:?}");
            // No instruction's time exceeds its slice.
            let longest = p
                .instructions()
                .iter()
                .filter(|i| i.name == row.name && i.stream == row.stream)
                .map(|i| i.done - i.launched)
                .max()
                .unwrap();
            assert!(row.max <= longest, "{name}: {row:?}");
        }
        // Each stream's rows add up to its busy time, and all of them to the table's total.
        let summary = p.summary();
        for s in &summary.streams {
            let total: Duration = table.rows.iter().filter(|r| r.stream == s.stream).map(|r| r.total).sum();
            assert_eq!(total, s.busy, "{name}: {}", s.name);
        }
        assert_eq!(table.total, summary.streams.iter().map(|s| s.busy).sum::<Duration>(), "{name}");
        let shares: f64 = table.rows.iter().map(|r| r.share).sum();
        assert!((shares - 100.0).abs() < 1e-6, "{name}: shares add up to {shares}");
        assert!(table.rows.windows(2).all(|w| w[0].total >= w[1].total), "{name}: sorted by total");
        let text = table.to_string();
        assert!(text.lines().count() == table.rows.len() + 2, "{text}");
        assert!(text.lines().next().unwrap().starts_with("op"), "{text}");
    }
}

#[test]
fn the_replay_counts_per_stream_agree_with_the_timeline() {
    for (name, resync, device) in [
        ("failure.trace", false, DeviceMap::AsRecorded),
        ("branches.trace", false, DeviceMap::AsRecorded),
        ("branches.trace", true, DeviceMap::Cpu),
        ("demo.trace", true, DeviceMap::Mock),
    ] {
        let r = replay_profiled(name, resync, device);
        let summary = r.profile.as_ref().unwrap().summary();
        let timed: Vec<(String, u64)> = summary
            .streams
            .iter()
            .filter(|s| s.instructions > 0)
            .map(|s| (s.name.clone(), s.instructions as u64))
            .collect();
        assert_eq!(r.per_stream, timed, "{name} (resync {resync})");
    }
    // The failure trace's two barriers are counted as replayed, on no stream.
    let r = replay_profiled("failure.trace", false, DeviceMap::AsRecorded);
    assert_eq!(r.barriers, 2);
    let on_streams: u64 = r.per_stream.iter().map(|(_, n)| n).sum();
    assert_eq!(r.instructions, on_streams + r.barriers);
}

/// A directory of its own under the temporary directory, emptied first.
#[test]
fn operands_that_are_views_are_named_with_their_storage() {
    let r = replay_profiled("views.trace", false, DeviceMap::AsRecorded);
    let p = r.profile.as_ref().unwrap();
    check_timeline(p);
    let mut views = 0;
    for i in p.instructions() {
        let names = i.operand_names();
        assert_eq!((names.len(), i.storages.len()), (i.tensors.len(), i.tensors.len()), "{i:?}");
        for ((n, t), s) in names.iter().zip(&i.tensors).zip(&i.storages) {
            let want = if t == s { format!("t{t}") } else { format!("t{t} (view of t{s})") };
            assert_eq!(*n, want, "{i:?}");
            views += usize::from(t != s);
        }
    }
    // The five views' copies and releases, the view read in place (`first` has none).
    assert!(views >= 8, "{views} operands are views");
    let json: Value = serde_json::from_slice(&chrome_json(p)).unwrap();
    let named = json["traceEvents"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| e["args"]["operands"].as_array())
        .flatten()
        .filter(|o| o.as_str().is_some_and(|o| o.contains(" (view of t")))
        .count();
    assert_eq!(named, views, "the timeline's `operands` name the views");
    // `replay` and `analyze` say which dtypes the trace declares.
    let dtypes = "tensors by dtype: i64 4 (and 1 view), bf16 2 (and 2 views), f32 6 (and 2 views)";
    for cmd in ["replay", "analyze"] {
        let o = eagervm(&[cmd, shipped("views.trace").to_str().unwrap()], &[]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert!(o.status.success() && out.contains(dtypes), "{cmd}: {out}");
    }
}

fn scratch(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("eagervm-timeline-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

#[test]
fn a_trace_copied_with_its_sidecar_under_a_new_name_replays() {
    let d = scratch("copy");
    std::fs::copy(shipped("pipeline.trace"), d.join("b.trace")).unwrap();
    std::fs::copy(shipped("pipeline.trace.bin"), d.join("b.trace.bin")).unwrap();
    let t = trace::load(&d.join("b.trace")).unwrap();
    trace::validate(&t, &eagervm::trace::ValidateOptions::default()).unwrap();
    let r = trace::replay(&t, &ReplayOptions::default()).unwrap();
    assert_eq!(r.checked, 32);
    // Without its own sidecar, the trace reads the one it names, and says which is missing.
    std::fs::remove_file(d.join("b.trace.bin")).unwrap();
    let e = trace::replay(&trace::load(&d.join("b.trace")).unwrap(), &ReplayOptions::default()).unwrap_err();
    assert!(e.to_string().contains("pipeline.trace.bin"), "{e}");
    std::fs::remove_dir_all(&d).unwrap();
}

fn eagervm(args: &[&str], env: &[(&str, &str)]) -> std::process::Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eagervm"));
    c.args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("the binary runs")
}

#[test]
fn caught_kernel_panics_are_reported_in_the_summary_and_not_printed() {
    let d = scratch("panic");
    let path = d.join("panic.trace");
    std::fs::write(
        &path,
        "eagervm-trace 1\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
         tensor t0 f32[4] cpu:0\ncall s0 panic out=t0 scalar=3.0\n\
         tensor t1 f32[4] mock:0\ncall s1 fill out=t1 scalar=1.0\n\
         expect error panic op=panic message=\"panic op: 3\"\n",
    )
    .unwrap();
    for env in [&[][..], &[("RUST_BACKTRACE", "1")][..]] {
        let o = eagervm(&["replay", path.to_str().unwrap()], env);
        let (out, err) = (String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert!(o.status.success(), "{out}{err}");
        assert!(!err.contains("panicked at") && !err.contains("backtrace"), "stderr: {err}");
        assert!(out.contains("kernel panics caught: 1"), "{out}");
        assert!(out.contains("`panic` on cpu:0) panicked: panic op: 3"), "{out}");
    }
    std::fs::remove_dir_all(&d).unwrap();
}

#[test]
fn profile_summary_prints_the_op_table() {
    let o = eagervm(&["replay", shipped("failure.trace").to_str().unwrap(), "--profile-summary"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("ops by total time"), "{out}");
    assert!(out.lines().any(|l| l.trim_start().starts_with("fail ") && l.contains("cpu:0")), "{out}");
    // One per-stream table, whose counts are the VM's.
    assert!(out.contains("cpu:0                          33"), "{out}");
    assert!(out.contains("barriers: 2"), "{out}");
    let o = eagervm(&["run", "demo", "--profile-summary"], &[]);
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("ops by total time") && out.contains("mock:0:compute"),
        "{out}"
    );
}

#[test]
fn writes_to_a_full_disk_fail_naming_the_file() {
    // Linux's always-full device: every write to it fails with ENOSPC.
    assert!(Path::new("/dev/full").exists(), "this test needs /dev/full (Linux)");
    let o = eagervm(&["replay", shipped("demo.trace").to_str().unwrap(), "--profile", "/dev/full"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success(), "a profile written to a full disk must fail");
    assert!(err.contains("/dev/full") && err.contains("No space left"), "{err}");
    let o = eagervm(&["run", "demo", "--profile", "/dev/full"], &[]);
    assert!(!o.status.success() && String::from_utf8_lossy(&o.stderr).contains("/dev/full"));
    // The recorder: the trace itself.
    let o = eagervm(&["record", "demo", "-o", "/dev/full"], &[]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!o.status.success() && err.contains("/dev/full"), "{err}");
    // And its sidecar (`branches` writes one), through a link to the full device.
    #[cfg(unix)]
    {
        let d = scratch("full");
        std::os::unix::fs::symlink("/dev/full", d.join("b.trace.bin")).unwrap();
        let o = eagervm(&["record", "branches", "-o", d.join("b.trace").to_str().unwrap()], &[]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && err.contains("b.trace.bin"), "{err}");
        std::fs::remove_dir_all(&d).unwrap();
    }
}
