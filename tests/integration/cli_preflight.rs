//! The `eagervm` command's checks before any work, and its exit statuses: output files that
//! cannot be written, a timeline asked of synchronous mode, a bad `--tolerance`, bad
//! `EAGERVM_*` values, each refused with the right status before the work starts (the trace
//! they are given takes seconds to replay, and standard output stays empty); a misspelt
//! variable is a warning. Exit statuses: 0, 1, 2 here, 130 in `cli_interactive`.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn temp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("eagervm-cli-preflight-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name).display().to_string()
}

/// A trace that replays in about 2 s with a launch delay of 1 ms (2000 no-ops on mock:0).
fn slow_trace() -> String {
    let mut text = String::from(
        "eagervm-trace 2\ndevice cpu:0\ndevice mock:0\nstream s1 mock:0 compute\ntensor t0 f32[] mock:0\n\
         call s1 fill out=t0 scalar=1.0\n",
    );
    for _ in 0..2000 {
        text.push_str("call s1 noop in=t0\n");
    }
    let path = temp("slow.trace");
    std::fs::write(&path, text).unwrap();
    path
}

/// Run `eagervm args` with `env`, the mock devices' launch delay at 1 ms.
fn eagervm(args: &[&str], env: &[(&str, &str)]) -> (Output, Duration) {
    let t0 = Instant::now();
    let o = Command::new(env!("CARGO_BIN_EXE_eagervm"))
        .args(args)
        .env_remove("RUST_LOG")
        .env("EAGERVM_MOCK_DELAY_US", "1000")
        .envs(env.iter().copied())
        .output()
        .expect("the binary runs");
    (o, t0.elapsed())
}

/// `eagervm args` exits with `status` and a message with each of `says`, before any work:
/// nothing on standard output, and well within the replay's 2 s.
fn refused(args: &[&str], env: &[(&str, &str)], status: i32, says: &[&str]) {
    let (o, took) = eagervm(args, env);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(status), "{args:?} {env:?}: {err}");
    for s in says {
        assert!(err.contains(s), "{args:?} {env:?}: {s:?} not in {err}");
    }
    assert!(o.stdout.is_empty(), "{args:?}: work was done: {}", String::from_utf8_lossy(&o.stdout));
    assert!(took < Duration::from_millis(1500), "{args:?}: took {took:?}, as if it ran");
}

#[test]
fn outputs_and_modes_are_checked_before_the_work() {
    let trace = slow_trace();
    let missing = "/nonexistent-eagervm-dir/p.json";
    refused(&["replay", &trace, "--profile", missing], &[], 1, &[missing, "does not exist"]);
    let dir = temp("");
    refused(&["replay", &trace, "--profile", &dir], &[], 1, &["is a directory"]);
    refused(&["run", &trace, "--profile", missing], &[], 1, &[missing]);
    refused(&["run", "layers", "--profile", missing], &[], 1, &[missing]);
    refused(
        &["record", "layers", "-o", "/nonexistent-eagervm-dir/l.trace"],
        &[],
        1,
        &["--output", "does not exist"],
    );
    refused(&["analyze", &trace, "--dot", &dir], &[], 1, &["--dot", "is a directory"]);
    // Synchronous mode has no scheduler thread, whose observer builds the timeline.
    let p = temp("p.json");
    refused(
        &["replay", &trace, "--profile", &p],
        &[("EAGERVM_SYNC", "1")],
        2,
        &["synchronous mode", "--profile"],
    );
    for bad in ["-1", "NaN", "inf", "x"] {
        refused(&["replay", &trace, "--tolerance", bad], &[], 2, &["--tolerance", bad]);
    }
    refused(&["replay", &trace, "--max-tensor-bytes", "0"], &[], 2, &["--max-tensor-bytes"]);
    // The check creates no file where there was none, and truncates none that was there.
    assert!(!std::path::Path::new(&p).exists());
    std::fs::write(&p, "kept").unwrap();
    refused(&["replay", &trace, "--profile", &p], &[("EAGERVM_SYNC", "1")], 2, &[]);
    assert_eq!(std::fs::read_to_string(&p).unwrap(), "kept");
    // A good one still runs, and writes it.
    let (o, _) = eagervm(&["replay", &trace, "--profile", &p], &[("EAGERVM_MOCK_DELAY_US", "0")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(std::fs::read_to_string(&p).unwrap().contains("traceEvents"));
}

#[test]
fn bad_environment_values_are_refused_naming_the_variable() {
    let trace = slow_trace();
    for (var, value, accepted) in [
        ("EAGERVM_MOCK_DEVICES", "abc", "a whole number from 0 to 65535"),
        ("EAGERVM_SYNC", "yes", "1, 0, true or false"),
        ("EAGERVM_BATCH", "0", "1 or more"),
        ("EAGERVM_MOCK_DELAY_US", "1ms", "whole microseconds"),
        ("EAGERVM_STREAM_PRIORITIES", "gpu=2", "type=priority"),
    ] {
        let quoted = format!("{var}=\"{value}\"");
        let says = [quoted.as_str(), accepted];
        for args in [vec!["replay", trace.as_str()], vec!["run", "demo"], vec!["validate", trace.as_str()]] {
            refused(&args, &[(var, value)], 2, &says);
        }
    }
    // Commands that read no configuration do not care.
    let (o, _) = eagervm(&["programs"], &[("EAGERVM_SYNC", "yes")]);
    assert!(o.status.success());
    // A name nothing reads is a warning with the closest one, and the command runs.
    let (o, _) = eagervm(&["run", "demo"], &[("EAGERVM_SYNCC", "1"), ("EAGERVM_MOCK_DELAY_US", "0")]);
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("warning: EAGERVM_SYNCC is not a variable eagervm reads (did you mean EAGERVM_SYNC?)"),
        "{err}"
    );
}

#[test]
fn exit_statuses_follow_the_documented_table() {
    let trace = slow_trace();
    let fast = [("EAGERVM_MOCK_DELAY_US", "0")];
    // 0: success.
    assert_eq!(eagervm(&["replay", &trace], &fast).0.status.code(), Some(0));
    // 1: the work failed, or a file could not be read.
    let bad = temp("bad.trace");
    std::fs::write(&bad, "eagervm-trace 2\ndevice cpu:0\nstream s0 cpu:0 compute\ncall s0 nope\n").unwrap();
    assert_eq!(eagervm(&["replay", &bad], &fast).0.status.code(), Some(1));
    assert_eq!(eagervm(&["validate", "/nonexistent.trace"], &fast).0.status.code(), Some(1));
    assert_eq!(eagervm(&["flight", &trace], &fast).0.status.code(), Some(1));
    // 2: the command line or the environment is wrong.
    assert_eq!(eagervm(&["replay", &trace, "--no-such-flag"], &fast).0.status.code(), Some(2));
    assert_eq!(eagervm(&["run", "mlp", "--ranks", "2"], &fast).0.status.code(), Some(2));
    assert_eq!(eagervm(&["run", "demo"], &[("EAGERVM_CUDA_DEVICES", "-1")]).0.status.code(), Some(2));
}
