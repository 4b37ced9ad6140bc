//! The `eagervm` command at a terminal: the progress bar under a pseudo-terminal (moving
//! counts and a rate) and its absence on a pipe; Ctrl-C during a replay (the first stops
//! submitting, waits, prints the partial summary and writes the partial timeline, exit 130;
//! a second exits at once); a long program's spinner; and the library's progress counters
//! and stop flag behind them.

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use eagervm::trace::{self, Phase, Progress, TraceError};

fn temp(name: &str) -> String {
    let dir = std::env::temp_dir().join(format!("eagervm-cli-interactive-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir.join(name).display().to_string()
}

/// A trace of `blocks` blocks of `per_block` no-ops on `mock:0`, each block ended by a
/// barrier (which makes the replay wait for it): with a launch delay of D, it replays in
/// about `blocks * per_block * D`, submitting as it goes.
fn slow_trace(name: &str, blocks: usize, per_block: usize) -> String {
    let mut text = String::from(
        "eagervm-trace 2\ndevice cpu:0\ndevice mock:0\nstream s0 cpu:0 compute\nstream s1 mock:0 compute\n\
         tensor t0 f32[] mock:0\ncall s1 fill out=t0 scalar=1.0\n",
    );
    for _ in 0..blocks {
        for _ in 0..per_block {
            text.push_str("call s1 noop in=t0\n");
        }
        text.push_str("barrier s0\n");
    }
    let path = temp(name);
    std::fs::write(&path, text).expect("write the trace");
    path
}

/// A child with standard error on a pseudo-terminal of 150 columns (standard output a
/// pipe), and what the terminal receives, chunk by chunk.
fn spawn_on_pty(cmd: &mut Command) -> (Child, mpsc::Receiver<Vec<u8>>) {
    let (mut master, mut slave) = (0, 0);
    let size = libc::winsize { ws_row: 30, ws_col: 150, ws_xpixel: 0, ws_ypixel: 0 };
    // SAFETY: openpty writes the two descriptors into the integers given and reads the
    // window size; the name and termios pointers may be null.
    let rc = unsafe { libc::openpty(&mut master, &mut slave, std::ptr::null_mut(), std::ptr::null(), &size) };
    assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
    // SAFETY: openpty returned two open descriptors that nothing else owns.
    let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
    let child = cmd.stdout(Stdio::piped()).stderr(Stdio::from(slave)).spawn().expect("the binary runs");
    // The Command keeps the slave end open until it is dropped; the caller drops it, so the
    // reader sees the end (EIO) once the child exits.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut f = std::fs::File::from(master);
        let mut buf = [0u8; 4096];
        while let Ok(n) = f.read(&mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    (child, rx)
}

/// Collect what arrives on `rx` until `until` holds of it all, the terminal closes, or
/// `limit` passes.
fn read_until(
    rx: &mpsc::Receiver<Vec<u8>>,
    seen: &mut Vec<u8>,
    limit: Duration,
    until: impl Fn(&str) -> bool,
) {
    let t0 = Instant::now();
    while !until(&String::from_utf8_lossy(seen)) && t0.elapsed() < limit {
        match rx.recv_timeout(Duration::from_millis(50)) {
            Ok(chunk) => seen.extend(chunk),
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
    }
}

fn eagervm() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_eagervm"));
    c.env_remove("RUST_LOG");
    c
}

/// The counts `N/4,201` that the bar showed, in order.
fn counts(bar: &str, total: &str) -> Vec<u64> {
    counts_before(bar, &format!("/{total} instructions"))
}

#[test]
fn the_replay_bar_moves_on_a_terminal_and_stays_away_from_a_pipe() {
    // 4000 no-ops at 1 ms each on mock:0: about 4 s, past the second before the bar shows.
    let path = slow_trace("bar.trace", 200, 20);
    let mut cmd = eagervm();
    cmd.args(["replay", &path]).env("EAGERVM_MOCK_DELAY_US", "1000");
    let (child, rx) = spawn_on_pty(&mut cmd);
    drop(cmd);
    let mut seen = Vec::new();
    read_until(&rx, &mut seen, Duration::from_secs(120), |_| false);
    let out = child.wait_with_output().expect("the replay ends");
    let bar = String::from_utf8_lossy(&seen);
    assert!(out.status.success(), "{}\n{bar}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("4201 instructions in"), "{stdout}");
    let shown = counts(&bar, "4,201");
    assert!(shown.len() >= 5, "the bar redraws as the replay goes: {bar:?}");
    let distinct: std::collections::BTreeSet<_> = shown.iter().collect();
    assert!(distinct.len() >= 3, "the count moves, instruction by instruction, not at the end: {shown:?}");
    assert!(shown.windows(2).all(|w| w[0] <= w[1]), "and never back: {shown:?}");
    assert!(bar.contains("replay ") && bar.contains("/s, ETA"), "a rate and an ETA: {bar:?}");
    // The summary goes to standard output, never to the bar's terminal.
    assert!(!bar.contains("instructions per stream"), "{bar:?}");

    // Standard error a pipe: the summary and nothing else.
    let out = eagervm().args(["replay", &path]).env("EAGERVM_MOCK_DELAY_US", "1000").output().unwrap();
    assert!(out.status.success());
    assert!(out.stderr.is_empty(), "no bar on a pipe: {:?}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("4201 instructions in"));
}

#[test]
fn a_first_ctrl_c_keeps_the_results_and_a_second_exits_at_once() {
    // About 6 s of work (3000 no-ops at 2 ms), submitted block by block.
    let path = slow_trace("sigint.trace", 150, 20);
    let profile = temp("sigint.json");
    let mut cmd = eagervm();
    cmd.args(["replay", &path, "--profile", &profile]).env("EAGERVM_MOCK_DELAY_US", "2000");
    let (child, rx) = spawn_on_pty(&mut cmd);
    drop(cmd);
    let mut seen = Vec::new();
    // Started: the bar is up (the handler is installed before any work).
    read_until(&rx, &mut seen, Duration::from_secs(60), |s| s.contains("replay "));
    let pid = child.id() as libc::pid_t;
    let t0 = Instant::now();
    // SAFETY: kill sends a signal to the child this test started and has not waited for.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("the replay ends");
    assert!(t0.elapsed() < Duration::from_secs(5), "it stopped at the next batch: {:?}", t0.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(130), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("interrupted: stopped submitting at line"), "{stdout}");
    assert!(stdout.contains("expected checksums: not checked"), "{stdout}");
    let replayed: u64 = stdout
        .lines()
        .find(|l| l.starts_with("replayed "))
        .and_then(|l| l.split(" instructions in ").next())
        .and_then(|h| h.rsplit(' ').next())
        .and_then(|n| n.parse().ok())
        .expect("the partial summary counts the instructions replayed");
    assert!(replayed > 0 && replayed < 3001, "a part of the trace: {replayed}");
    assert!(stdout.contains("mock:0:compute") && stdout.contains("timeline written to"), "{stdout}");
    let json: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&profile).unwrap()).unwrap();
    let slices = json["traceEvents"].as_array().unwrap().iter().filter(|e| e["ph"] == "X").count();
    assert!(slices > 0, "the partial timeline has the instructions that ran");

    // A single block of 3000 no-ops: all submitted at once, then a 6 s wait for them at the
    // barrier that ends it. The first Ctrl-C waits for the instructions in flight; the
    // second does not.
    let path = slow_trace("sigint2.trace", 1, 3000);
    let mut cmd = eagervm();
    cmd.args(["replay", &path, "--profile", &profile]).env("EAGERVM_MOCK_DELAY_US", "2000");
    let (child, rx) = spawn_on_pty(&mut cmd);
    drop(cmd);
    let mut seen = Vec::new();
    read_until(&rx, &mut seen, Duration::from_secs(60), |s| s.contains(" in flight"));
    let pid = child.id() as libc::pid_t;
    // SAFETY: as above.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    // SAFETY: as above; the child is still running (the first signal only asked it to stop).
    assert_eq!(unsafe { libc::kill(pid, libc::SIGINT) }, 0);
    let out = child.wait_with_output().expect("the replay ends");
    assert_eq!(out.status.code(), Some(130));
    assert!(t0.elapsed() < Duration::from_secs(2), "exits at once: {:?}", t0.elapsed());
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(!stdout.contains("replayed"), "before the instructions in flight finished: {stdout}");
}

#[test]
fn loading_and_validating_advance_the_counters_and_stop_when_asked() {
    let path = slow_trace("counters.trace", 10, 100);
    let size = std::fs::metadata(&path).unwrap().len();
    let p = Progress::default();
    let t = trace::load_with(std::path::Path::new(&path), &p).expect("it parses");
    assert_eq!((p.phase(), p.done(), p.total()), (Phase::Parsing, size, size));
    trace::validate_with(&t, &Default::default(), &p).expect("it is valid");
    assert_eq!((p.phase(), p.done(), p.total()), (Phase::Validating, 1016, 1016));
    let opts = trace::ReplayOptions { resync: true, device: trace::DeviceMap::Cpu, ..Default::default() };
    let r = trace::replay_with(&t, &opts, &p).expect("it replays");
    assert_eq!((r.instructions, r.interrupted), (1011, None));
    assert_eq!(p.phase(), Phase::Idle);

    p.request_stop();
    assert!(matches!(trace::load_with(std::path::Path::new(&path), &p), Err(TraceError::Interrupted)));
    assert!(matches!(trace::validate_with(&t, &Default::default(), &p), Err(TraceError::Interrupted)));
    assert!(matches!(trace::replay_with(&t, &opts, &p), Err(TraceError::Interrupted)));
}

#[test]
fn a_replay_stopped_at_a_statement_reports_what_it_ran() {
    // A thread asks for the stop once the replay has submitted 100 instructions.
    let path = slow_trace("stop.trace", 100, 10);
    let t = trace::load(std::path::Path::new(&path)).unwrap();
    let p = std::sync::Arc::new(Progress::default());
    let mut config = eagervm::Config::default();
    config.mock.launch_delay = Duration::from_micros(500);
    let opts = trace::ReplayOptions { config, profile: true, ..Default::default() };
    let stopper = {
        let p = std::sync::Arc::clone(&p);
        std::thread::spawn(move || {
            while p.phase() != Phase::Replaying || p.done() < 100 {
                std::thread::sleep(Duration::from_millis(5));
            }
            p.request_stop();
        })
    };
    let r = trace::replay_with(&t, &opts, &p).expect("an interrupted replay is a report");
    stopper.join().unwrap();
    let line = r.interrupted.expect("it says where it stopped");
    assert!(r.instructions >= 100 && r.instructions < 1001, "{}", r.instructions);
    // Every instruction it submitted ran: the timeline has them all, and no failure.
    assert!(r.failures.is_empty());
    assert_eq!(r.checked, 0, "expectations are not checked");
    assert!(line > 7 && (line as u64) < 1108, "{line}");
    // Every instruction on mock:0 (the barriers run on the scheduler, not on a stream) is
    // on the timeline, whole.
    let on_mock = r.per_stream.iter().find(|(s, _)| s == "mock:0:compute").expect("mock:0 ran").1;
    let profile = r.profile.expect("the partial timeline");
    assert_eq!((profile.instructions().len() as u64, profile.incomplete()), (on_mock, 0));
}

#[test]
fn a_long_program_run_shows_a_spinner_on_a_terminal() {
    // `layers` launches 6000 kernels on mock:0; at 1 ms each, a few seconds.
    let mut cmd = eagervm();
    cmd.args(["run", "layers"]).env("EAGERVM_MOCK_DELAY_US", "1000");
    let (child, rx) = spawn_on_pty(&mut cmd);
    drop(cmd);
    let mut seen = Vec::new();
    read_until(&rx, &mut seen, Duration::from_secs(120), |_| false);
    let out = child.wait_with_output().expect("the run ends");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let shown = String::from_utf8_lossy(&seen);
    let done = counts_before(&shown, " instructions done");
    assert!(done.len() >= 3 && done.first() < done.last(), "the count moves: {shown:?}");
    assert!(
        shown.contains("run layers [") && shown.contains(" in flight (") && shown.contains("/s)"),
        "{shown:?}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("ran `layers`"));
}

/// The numbers just before each `suffix` in `text`.
fn counts_before(text: &str, suffix: &str) -> Vec<u64> {
    text.match_indices(suffix)
        .filter_map(|(i, _)| {
            let head = &text[..i];
            let start = head.rfind(' ').map_or(0, |s| s + 1);
            head[start..].replace(',', "").parse().ok()
        })
        .collect()
}
