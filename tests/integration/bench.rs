//! `eagervm bench`: its flags, its JSON, and the workloads beyond W1–W4 giving the results a
//! sequential run gives.

use std::process::{Command, Output};

use eagervm::bench::mlp::{self, MlpShape};
use eagervm::bench::ops::{self, OpsWorkload};
use eagervm::bench::Progress;
use eagervm::prelude::*;
use eagervm::programs::mlp::MlpOptions;

fn eagervm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eagervm")).args(args).output().expect("the binary runs")
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// Standard output of `bench --json`, each line one JSON object.
fn json_lines(o: &Output) -> Vec<serde_json::Value> {
    String::from_utf8_lossy(&o.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line one JSON object"))
        .collect()
}

#[test]
fn zero_instructions_and_zero_repetitions_are_usage_errors() {
    for (args, flag) in [
        (&["bench", "-n", "0"][..], "--n"),
        (&["bench", "-r", "0"], "--reps"),
        (&["bench", "-n", "1e0x"], "--n"),
    ] {
        let o = eagervm(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        assert!(stderr(&o).contains(flag), "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?} printed a table: {}", String::from_utf8_lossy(&o.stdout));
    }
}

#[test]
fn cuda_only_flags_without_cuda_say_so() {
    for flag in ["--chain", "--chunks", "--steps"] {
        let o = eagervm(&["bench", flag, "5"]);
        assert_eq!(o.status.code(), Some(2), "{flag}");
        let err = stderr(&o);
        assert!(err.contains(flag) && err.contains("add --cuda"), "{flag}: {err}");
        assert!(o.stdout.is_empty());
    }
}

#[test]
fn counts_in_powers_are_accepted_and_unknown_workloads_refused() {
    let o = eagervm(&["bench", "-n", "10^3", "-r", "1", "-w", "6", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!((v["workload"].as_str(), v["ops"].as_u64()), (Some("W6"), Some(1000)));
    let o = eagervm(&["bench", "-w", "12"]);
    assert!(!o.status.success());
    assert!(stderr(&o).contains("unknown workload `12`"), "{}", stderr(&o));
}

#[test]
fn cuda_json_is_one_object_per_report_even_when_skipped() {
    let o = eagervm(&["bench", "--cuda", "--json", "--chain", "10", "--chunks", "1", "--steps", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let first = text.lines().next().expect("a line");
    let v: serde_json::Value = serde_json::from_str(first).expect("JSON");
    assert_eq!(v["bench"], "cuda");
    match eagervm::ep::cuda::available(0) {
        Err(e) => {
            assert_eq!(v["skipped"], serde_json::json!(e.to_string()));
            assert!(v["overhead"].is_null() && v["mlp"].is_null());
            assert_eq!(text.lines().count(), 1, "one report: the skip");
        }
        Ok(()) => {
            assert!(v["skipped"].is_null());
            assert!(v["overhead"]["ratio"].as_f64().is_some());
            assert_eq!(v["mlp_steps"].as_array().map(Vec::len), Some(2));
        }
    }
}

#[test]
fn json_has_one_object_per_workload_with_its_figures() {
    let o = eagervm(&["bench", "-n", "2000", "-r", "2", "-w", "1,5,9,mlp", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 4);
    let w1 = &lines[0];
    assert_eq!(w1["workload"], "W1");
    for field in ["e2e_instr_per_s", "floor_instr_per_s", "of_floor", "ratio"] {
        assert!(w1[field].as_f64().is_some_and(|x| x > 0.0), "{field}: {w1}");
    }
    assert!(w1["noisy"].is_boolean() && w1["meets_target"].is_boolean());
    assert_eq!((lines[1]["workload"].as_str(), lines[1]["ops"].as_u64()), (Some("W5"), Some(200)));
    assert_eq!((lines[2]["workload"].as_str(), lines[2]["ops"].as_u64()), (Some("W9"), Some(100)));
    for l in &lines[1..3] {
        assert_eq!(l["checked"], true, "{l}");
        assert!(l["ns_per_op"].as_f64().is_some_and(|x| x > 0.0));
    }
    let m = &lines[3];
    assert_eq!(m["workload"], "mlp");
    assert_eq!(m["shape"], serde_json::json!({"samples": 64, "inputs": 8, "hidden": 32}));
    assert!(m["step_us"].as_f64().is_some_and(|x| x > 0.0) && m["step_us_loss_read"].as_f64().is_some());
}

#[test]
fn the_table_gives_a_verdict_without_shouting() {
    let o = eagervm(&["bench", "-n", "5000", "-r", "1", "-w", "2,7"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let w2 = text.lines().find(|l| l.starts_with("W2 ")).expect("a W2 row");
    assert!(["met", "below", "noisy"].iter().any(|v| w2.contains(v)), "{w2}");
    assert!(!text.contains("MISSED"), "{text}");
    assert!(text.lines().any(|l| l.starts_with("W7 ") && l.contains("InstructionsBuilder::call")), "{text}");
}

#[test]
fn every_new_workload_matches_its_sequential_reference() {
    for w in OpsWorkload::ALL {
        let r = ops::measure(w, 3000, 2, &Config::default(), &Progress::hidden()).expect("measured");
        assert!(r.checked, "{}: the result differs from a sequential run", w.name());
        assert_eq!(r.ops, w.ops(3000) as u64);
        assert!(r.ns_per_op > 0.0 && r.ns_range[0] <= r.ns_range[1], "{r:?}");
    }
}

#[test]
fn the_benchmarked_mlp_step_is_run_mlps_step_bit_for_bit() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let opts = MlpOptions { steps: 30, ..Default::default() };
    let program = eagervm::programs::mlp::mlp(&vm, &opts).unwrap().losses;
    assert_eq!(mlp::losses(&vm, &opts).unwrap(), program);
    // And at another shape.
    let opts = MlpOptions { steps: 5, samples: 16, inputs: 24, hidden: 40, ..Default::default() };
    assert_eq!(mlp::losses(&vm, &opts).unwrap(), eagervm::programs::mlp::mlp(&vm, &opts).unwrap().losses);
}

#[test]
fn the_mlp_figures_are_per_step_and_training_stays_finite() {
    let vm = VirtualMachine::new(Config::default()).unwrap();
    let shape = MlpShape { samples: 32, inputs: 16, hidden: 8 };
    let r = mlp::measure(&vm, DeviceId::CPU, shape, 20, 2, &Progress::hidden()).unwrap();
    assert_eq!((r.steps, r.reps), (20, 2));
    assert!(r.last_loss.is_finite() && r.last_loss > 0.0, "{r:?}");
    assert!(r.step_us > 0.0 && r.step_us_loss_read > 0.0);
    assert_eq!(MlpShape::SMALL.steps(1_000_000), 2000);
    assert_eq!(MlpShape::LARGE.steps(1_000_000), 10);
    assert_eq!(MlpShape::LARGE.steps(1), 2);
}

#[test]
fn busy_loops_are_counted_in_every_json_line_with_the_load_average() {
    let o = eagervm(&["bench", "-w", "6,9", "-n", "2000", "-r", "1", "--busy", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let lines = json_lines(&o);
    assert_eq!(lines.len(), 2);
    let readable = std::path::Path::new("/proc/loadavg").exists();
    for l in &lines {
        assert_eq!(l["busy"], 1, "{l}");
        for field in ["load_1m_start", "load_1m_end"] {
            match readable {
                true => assert!(l[field].as_f64().is_some_and(|x| x >= 0.0), "{field}: {l}"),
                false => assert!(l.get(field).is_none(), "{field} without /proc/loadavg: {l}"),
            }
        }
    }
    // One workload's end is the next one's start: together they cover the run.
    assert_eq!(lines[0]["load_1m_end"], lines[1]["load_1m_start"]);
    // Without --busy: none, and said so.
    let o = eagervm(&["bench", "-w", "6", "-n", "2000", "-r", "1", "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_slice(&o.stdout).expect("one JSON object");
    assert_eq!(v["busy"], 0, "{v}");
}

#[test]
fn the_table_says_how_many_busy_loops_ran_and_the_load() {
    let o = eagervm(&["bench", "-w", "7", "-n", "2000", "-r", "1", "--busy", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    let line = text.lines().find(|l| l.starts_with("competition:")).unwrap_or_else(|| panic!("{text}"));
    assert!(line.contains("2 busy loop(s)") && line.contains("1-minute load average"), "{line}");
    let o = eagervm(&["bench", "-w", "7", "-n", "2000", "-r", "1"]);
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.lines().any(|l| l.starts_with("competition: no busy loop")), "{text}");
}

#[test]
fn busy_takes_a_count_and_not_with_cuda() {
    for args in [&["bench", "--busy", "x"][..], &["bench", "--busy", "-1"], &["bench", "--busy", "1025"]] {
        let o = eagervm(args);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", stderr(&o));
        // clap takes `-1` for an unknown flag and names it, not --busy.
        assert!(stderr(&o).contains("--busy") || args[2] == "-1", "{args:?}: {}", stderr(&o));
        assert!(o.stdout.is_empty(), "{args:?}");
    }
    let o = eagervm(&["bench", "--cuda", "--busy", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    assert!(stderr(&o).contains("--busy") && stderr(&o).contains("--cuda"), "{}", stderr(&o));
}
