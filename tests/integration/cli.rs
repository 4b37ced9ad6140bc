//! The `eagervm` binary end to end: record → validate → analyze → replay, help on every
//! command, and non-zero exits with file, line and cause on bad input.

use std::process::{Command, Output};

fn eagervm(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_eagervm")).args(args).output().expect("the binary runs")
}

fn text(o: &Output) -> String {
    format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr))
}

fn temp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("eagervm-cli-tests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name).display().to_string()
}

#[test]
fn record_validate_analyze_replay() {
    let path = temp("branches.trace");
    let o = eagervm(&["record", "branches", "-o", &path]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("instructions"), "{}", text(&o));
    let o = eagervm(&["validate", &path]);
    assert!(o.status.success(), "{}", text(&o));
    let dot = temp("branches.dot");
    let o = eagervm(&["analyze", &path, "--dot", &dot]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("critical path") && out.contains("available parallelism"), "{out}");
    assert!(std::fs::read_to_string(&dot).unwrap().starts_with("digraph"));
    for args in
        [vec!["replay", &path], vec!["replay", &path, "--resync", "--device", "cpu"], vec!["run", &path]]
    {
        let o = eagervm(&args);
        assert!(o.status.success(), "{args:?}: {}", text(&o));
        assert!(text(&o).contains("expected checksums matched: 2"), "{}", text(&o));
    }
    let o = eagervm(&["record", "demo", "-o", &temp("demo.trace"), "--overhead", "2"]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("recording overhead over 2 runs"), "{}", text(&o));
    let o = eagervm(&["replay", &path, "--resync", "--device", "cuda", "--tolerance", "1e-4"]);
    if eagervm::ep::cuda::available(0).is_ok() {
        assert!(o.status.success(), "{}", text(&o));
        assert!(text(&o).contains("expected tensors within 0.0001 of a replay on cpu:0: 2"), "{}", text(&o));
    } else {
        assert!(!o.status.success());
        assert!(text(&o).contains("not available"), "{}", text(&o));
    }
}

#[test]
fn bad_traces_exit_non_zero_naming_file_line_and_cause() {
    let path = temp("bad.trace");
    std::fs::write(
        &path,
        "eagervm-trace 1\ndevice cpu:0\nstream s0 cpu:0 compute\ncall s0 nope out=t1\nrelease s0 t4\n",
    )
    .unwrap();
    for cmd in ["validate", "replay", "analyze"] {
        let o = eagervm(&[cmd, &path]);
        assert_eq!(o.status.code(), Some(1), "{cmd}: {}", text(&o));
        let out = text(&o);
        assert!(out.contains(&format!("{path}:4:9: unknown op `nope`")), "{cmd}: {out}");
        assert!(out.contains(&format!("{path}:5:")), "{cmd} reports every problem: {out}");
    }
    let o = eagervm(&["replay", "/nonexistent.trace"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("/nonexistent.trace"));
    let o = eagervm(&["run", "no-such-program"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o).contains("demo"), "lists the programs: {}", text(&o));
}

/// The error message of a failing command went out through `eprintln!`, which panics (exit
/// status 101) when standard error is a pipe whose reader has gone.
#[test]
fn an_error_on_a_closed_standard_error_exits_with_status_one() {
    let bin = env!("CARGO_BIN_EXE_eagervm");
    // `true` has exited before the command writes its error, so the write fails.
    let script = format!(
        "exec 4>&1; {{ sleep 0.3; '{bin}' run no-such-program; echo \"status $?.\" >&4; }} 2>&1 >/dev/null | true"
    );
    let o = Command::new("bash").arg("-c").arg(&script).output().expect("bash runs");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "status 1.", "{}", text(&o));
}

#[test]
fn every_command_has_help() {
    for cmd in ["run", "record", "replay", "validate", "analyze", "bench", "demo", "programs"] {
        let o = eagervm(&[cmd, "--help"]);
        assert!(o.status.success(), "{cmd}");
        assert!(text(&o).contains("Usage"), "{cmd}: {}", text(&o));
    }
    let o = eagervm(&["programs"]);
    assert!(text(&o).contains("demo") && text(&o).contains("branches"));
    // The command line lists the library's one registry, every program once, in its order.
    let listed: Vec<String> = String::from_utf8_lossy(&o.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next().map(Into::into))
        .collect();
    let mut registry: Vec<&str> = eagervm::programs::all().map(|p| p.name()).collect();
    // And the data-parallel MLP, which runs on a communicator rather than by name.
    registry.push("mlp-dp");
    assert_eq!(listed, registry);
    for p in eagervm::programs::all() {
        assert!(text(&o).contains(p.about()), "{}: {}", p.name(), text(&o));
    }
    let o = eagervm(&["run", "demo"]);
    assert!(o.status.success(), "{}", text(&o));
}

#[test]
fn the_mlp_program_prints_its_loss_falling() {
    let o = eagervm(&["run", "mlp"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("fell by more than half") && out.contains("step   60"), "{out}");
    // The summary has per-stream busy time.
    assert!(out.contains("busy ms"), "{out}");
}

#[test]
fn replay_writes_a_timeline_with_profile() {
    let path = temp("pipeline-profile.json");
    let o = eagervm(&["replay", "instructions/pipeline.trace", "--profile", &path]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for stream in ["mock:0:compute", "mock:0:h2d", "mock:0:d2h"] {
        assert!(out.contains(stream), "{stream} missing from the summary: {out}");
    }
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().expect("Trace Event Format");
    assert!(events.iter().filter(|e| e["ph"] == "X").count() >= 966, "a slice per instruction");
    // A file that cannot be written is an error that names it.
    let o = eagervm(&["replay", "instructions/failure.trace", "--profile", "/nonexistent/dir/p.json"]);
    assert!(!o.status.success());
    assert!(text(&o).contains("/nonexistent/dir/p.json"), "{}", text(&o));
}

#[test]
fn rust_log_shows_sync_and_shutdown_and_stays_quiet_unset() {
    let run = |rust_log: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_eagervm"));
        c.args(["run", "branches"]).env_remove("RUST_LOG");
        if let Some(v) = rust_log {
            c.env("RUST_LOG", v);
        }
        c.output().expect("the binary runs")
    };
    let o = run(Some("eagervm=debug"));
    assert!(o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    for want in
        ["VM started", "worker started", "sync{", "barrier{", "stop_workers{", "shutdown{", "VM shut down"]
    {
        assert!(err.contains(want), "no {want:?} in:\n{err}");
    }
    // Batches are TRACE: not shown at DEBUG.
    assert!(!err.contains("batch{"), "{err}");
    let o = run(Some("eagervm=trace"));
    assert!(String::from_utf8_lossy(&o.stderr).contains("batch{worker="), "{}", text(&o));
    let o = run(None);
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stderr.is_empty(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(String::from_utf8_lossy(&o.stdout).contains("errors: 0"), "{}", text(&o));
}

#[test]
fn logging_to_a_closed_standard_error_neither_hangs_nor_panics() {
    let bin = env!("CARGO_BIN_EXE_eagervm");
    // `head` closes the pipe after the first line while every VM thread goes on logging
    // each batch; a thread that panicked on the failed write would hang the program (the
    // `timeout` turns a hang into status 124).
    let script = format!(
        "exec 4>&1; {{ RUST_LOG=eagervm=trace timeout 60 '{bin}' run noops; echo \"status $?.\" >&4; }} 2>&1 >/dev/null | head -n 1 >/dev/null"
    );
    let o = Command::new("bash").arg("-c").arg(&script).output().expect("bash runs");
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "status 0.", "{}", text(&o));
}

#[test]
fn mlp_dp_matches_one_rank_and_writes_an_overlapping_timeline() {
    let path = temp("mlp-dp-profile.json");
    let o = eagervm(&["run", "mlp-dp", "--ranks", "4", "--steps", "10", "--profile", &path]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    for want in [
        "on 4 mock devices",
        "mock:3:compute",
        "mock:0:collective",
        "all-reduces followed by compute work overlapped it",
        "agree bit for bit",
        "largest relative difference",
    ] {
        assert!(out.contains(want), "{want} missing: {out}");
    }
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let events = json["traceEvents"].as_array().expect("Trace Event Format");
    assert!(
        events.iter().any(|e| e["ph"] == "X" && e["name"] == "all_reduce.mean@dp"),
        "collectives on the timeline"
    );
    // The other backends are refused with what is missing; options are checked.
    let o = eagervm(&["run", "mlp-dp", "--backend", "mpi"]);
    assert!(!o.status.success() && text(&o).contains("`mpi` feature"), "{}", text(&o));
    let o = eagervm(&["run", "mlp-dp", "--backend", "nccl"]);
    assert!(!o.status.success() && text(&o).contains("NCCL"), "{}", text(&o));
    let o = eagervm(&["run", "mlp", "--ranks", "2"]);
    assert!(!o.status.success() && text(&o).contains("apply to `mlp-dp`"), "{}", text(&o));
    let o = eagervm(&["run", "mlp-dp", "--ranks", "0"]);
    assert!(!o.status.success(), "{}", text(&o));
}

#[test]
fn mlp_dp_compare_says_why_its_figures_are_what_they_are() {
    let o = eagervm(&["run", "mlp-dp", "--ranks", "4", "--steps", "20", "--compare"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("x one rank"), "{out}");
    // What the mock device charges for, and what the ranks share on this machine.
    assert!(out.contains("why: a mock launch sleeps"), "{out}");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    assert!(out.contains(&format!("4 ranks on {cores} cores: ")), "{out}");
}

#[test]
fn run_shows_the_streams_a_program_used_and_names_the_others() {
    let o = eagervm(&["run", "mlp"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    // `mlp` runs on `cpu:0` alone; the VM's collective stream ran nothing.
    let rows: Vec<&str> = out.lines().map(str::trim_start).filter(|l| l.starts_with("cpu:0")).collect();
    assert_eq!(rows.len(), 1, "{out}");
    assert!(out.contains("not shown, having run nothing: cpu:0:collective"), "{out}");
}

#[test]
fn replay_says_where_it_ran_and_what_its_counts_count() {
    let mlp = concat!(env!("CARGO_MANIFEST_DIR"), "/instructions/mlp.trace");
    // A trace on `cpu:0` alone, with CUDA asked for: it ran on the host, and says why.
    let o = eagervm(&["replay", mlp, "--device", "cuda"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = text(&o);
    assert!(out.contains("--device cuda, ran on cpu:0: the trace uses no device but the host"), "{out}");
    // The reads are the trace's `access ... read` statements (one per step), the checksums
    // its `expect` statements (one per result): two counts of two different things.
    assert!(out.contains("host reads: 60 (`access ... read` statements)"), "{out}");
    assert!(out.contains("expected checksums matched: 64 (`expect` statements, checked after"), "{out}");
    let o = eagervm(&["replay", mlp]);
    assert!(text(&o).contains("(as recorded; devices as recorded: cpu:0)"), "{}", text(&o));
}

#[test]
fn flight_prints_a_flight_record_and_refuses_anything_else() {
    let vm = eagervm::VirtualMachine::new(eagervm::Config::default()).unwrap();
    let x = vm.from_slice(&[1.0f32], &[1], eagervm::ep::DeviceId::CPU).unwrap();
    drop(x);
    vm.sync().unwrap();
    let dump = temp("flight.txt");
    std::fs::write(&dump, vm.flight_record().to_string()).unwrap();
    let o = eagervm(&["flight", &dump]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(
        text(&o).starts_with("eagervm flight record v1") && text(&o).contains("stream cpu:0"),
        "{}",
        text(&o)
    );
    let other = temp("not-flight.txt");
    std::fs::write(&other, "hello\n").unwrap();
    let o = eagervm(&["flight", &other]);
    assert!(!o.status.success());
    assert!(text(&o).contains("not a flight record"), "{}", text(&o));
}
