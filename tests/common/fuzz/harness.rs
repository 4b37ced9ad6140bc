//! What every fuzz target shares: the VM configuration of a case and the memory pre-check
//! that goes with it, case counts, a watchdog that bounds each case's time, and a panic
//! hook that catches panics on any thread (the VM's included), not only the caller's.
//!
//! A case runs on a thread of its own while the test thread waits for it with a deadline
//! ([`bounded`]). A panic there, or on any other thread during the case (a scheduler,
//! worker, watcher or mock-device thread), fails the case with its message and the input;
//! so does a case that outlives the deadline. The one panic that is expected is the
//! `panic` op's own (`panic op: ...`), which the VM must catch; the hook ignores it.
//!
//! Cases of all targets run one at a time (a process-wide lock), so that a panic on a VM
//! thread is charged to the case that caused it, and a case has the machine's cores to
//! itself.
#![allow(dead_code)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::framework::DType;
use eagervm::trace::{Stmt, Trace};
use eagervm::vm::ThreadTopology;
use eagervm::Config;
use proptest::test_runner::FileFailurePersistence;

/// The largest tensor, in bytes, that a fuzz case may create: the cap the VM's own
/// `Config::max_tensor_bytes` is to enforce once it exists.
pub const TENSOR_CAP: u64 = 64 << 20;

/// The knobs of a case's VM that a target draws at random.
#[derive(Debug, Clone, Copy)]
pub struct Knobs {
    /// Streams per worker thread.
    pub threads: ThreadTopology,
    /// Run everything on the caller (no scheduler or worker threads).
    pub synchronous: bool,
    /// `Config::batch_size`.
    pub batch_size: usize,
    /// Back-pressure: `Config::high_water` (`low_water` is a quarter of it).
    pub high_water: usize,
}

impl Default for Knobs {
    fn default() -> Self {
        Knobs {
            threads: ThreadTopology::PerStream,
            synchronous: false,
            batch_size: 1024,
            high_water: 1 << 16,
        }
    }
}

/// The VM configuration of a fuzz case (two mock devices with jitter, so that streams
/// interleave differently from case to case), and the memory pre-check to apply with it.
///
/// This is the one place that bounds the memory a case may ask for. Today the VM accepts
/// tensors of any size and aborts the process when it cannot allocate one, and its shape
/// arithmetic wraps; until `Config::max_tensor_bytes` (refused with `Error::TooLarge`) and
/// checked shapes land, the harness itself keeps cases away from tensors beyond
/// [`TENSOR_CAP`] ([`Precheck`]). Once they land, set `config.max_tensor_bytes = TENSOR_CAP`
/// here and return `Precheck::OFF`: the VM then refuses such tensors itself, and the
/// targets check that it does so with a typed error.
pub fn setup(knobs: Knobs) -> (Config, Precheck) {
    let mut config = Config::default().with_mock_devices(2, MockConfig::jittery());
    config.threads = knobs.threads;
    config.synchronous = knobs.synchronous;
    config.batch_size = knobs.batch_size.max(1);
    config.high_water = knobs.high_water.max(4);
    config.low_water = config.high_water / 4;
    config.max_tensor_bytes = TENSOR_CAP;
    (config, Precheck::OFF)
}

/// A stopgap, removed once the VM refuses oversized tensors itself ([`setup`]): which
/// tensors a case may create. A shape whose true size in bytes (computed without
/// wrapping) is beyond the cap is not created, or its trace is not replayed, and the
/// case counts it ([`Stats::precheck_skips`]) instead of aborting the process.
#[derive(Debug, Clone, Copy)]
pub struct Precheck {
    cap: Option<u64>,
}

impl Precheck {
    /// No pre-check: the VM's own limits alone.
    pub const OFF: Precheck = Precheck { cap: None };

    /// Whether a tensor of `shape` and `dtype` may be created.
    pub fn admits(&self, shape: &[usize], dtype: DType) -> bool {
        match self.cap {
            None => true,
            Some(cap) => true_bytes(shape, dtype).is_some_and(|b| b <= cap),
        }
    }

    /// Whether every tensor `trace` declares may be created (replay creates them all).
    pub fn admits_trace(&self, trace: &Trace) -> bool {
        trace.lines.iter().all(|l| match &l.stmt {
            Stmt::Tensor { shape, dtype, .. } => self.admits(shape, *dtype),
            _ => true,
        })
    }
}

/// The bytes of a `shape` tensor of `dtype`, or `None` if that does not fit in a `u64`.
pub fn true_bytes(shape: &[usize], dtype: DType) -> Option<u64> {
    shape.iter().try_fold(dtype.size() as u64, |n, &d| n.checked_mul(u64::try_from(d).ok()?))
}

/// Cases per target: `EAGERVM_FUZZ_CASES`, else `PROPTEST_CASES`, else `default`.
pub fn cases(default: u32) -> u32 {
    ["EAGERVM_FUZZ_CASES", "PROPTEST_CASES"]
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
        .unwrap_or(default)
}

/// The time one case may take: `EAGERVM_FUZZ_TIMEOUT_S` seconds, 10 by default. Far above
/// what any case needs (a case replays a few thousand instructions or makes a few dozen
/// calls), so that only a hang reaches it, even on a loaded machine.
pub fn case_timeout() -> Duration {
    let s = std::env::var("EAGERVM_FUZZ_TIMEOUT_S").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(10);
    Duration::from_secs(s)
}

/// Counters of a target's run, printed at its end and checked so that a target that
/// stops exercising what it should fails instead of passing vacuously.
#[derive(Debug)]
pub struct Stats {
    /// Cases run.
    pub cases: AtomicU64,
    /// Inputs accepted (a trace that validates, a call the VM accepted).
    pub accepted: AtomicU64,
    /// Inputs refused with a typed error.
    pub refused: AtomicU64,
    /// Runs that went all the way (a replay, a read that returned the values).
    pub ran: AtomicU64,
    /// Inputs left out by the [`Precheck`].
    pub precheck_skips: AtomicU64,
    /// Set once a case hangs: its thread is still running, so the target's later cases
    /// (shrinking included) pass at once and the hanging input is the one reported.
    pub hung: AtomicBool,
}

impl Stats {
    /// All counters at zero.
    pub const fn new() -> Self {
        Stats {
            cases: AtomicU64::new(0),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            ran: AtomicU64::new(0),
            precheck_skips: AtomicU64::new(0),
            hung: AtomicBool::new(false),
        }
    }

    /// A counter's value.
    pub fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    /// Add one to a counter.
    pub fn bump(c: &AtomicU64) {
        c.fetch_add(1, Ordering::Relaxed);
    }

    /// A one-line summary.
    pub fn line(&self, target: &str) -> String {
        let g = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "{target}: {} cases, {} inputs accepted, {} refused with a typed error, {} ran through, \
             {} left out by the memory pre-check",
            g(&self.cases),
            g(&self.accepted),
            g(&self.refused),
            g(&self.ran),
            g(&self.precheck_skips)
        )
    }
}

/// Panics seen on any thread, other than the `panic` op's, since the last [`take_panics`].
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// One case at a time, across targets (module docs).
static CASE_LOCK: Mutex<()> = Mutex::new(());

/// Whether a case is running: panics outside cases (a failing plain test) are not charged
/// to one.
static IN_CASE: AtomicBool = AtomicBool::new(false);

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The `panic` op's message prefix: the one panic a case may cause on purpose.
const EXPECTED_PANIC: &str = "panic op: ";

/// Install (once) the hook that records every unexpected panic with its thread and place,
/// and keeps the `panic` op's expected ones off the output.
pub fn install_panic_hook() {
    static ONCE: OnceLock<()> = OnceLock::new();
    ONCE.get_or_init(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let payload = info.payload();
            let msg = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            if msg.starts_with(EXPECTED_PANIC) {
                return;
            }
            if IN_CASE.load(Ordering::SeqCst) {
                let thread = std::thread::current().name().unwrap_or("<unnamed>").to_string();
                let at = info.location().map(|l| l.to_string()).unwrap_or_default();
                lock(&PANICS).push(format!("thread `{thread}` panicked at {at}: {msg}"));
            }
            previous(info);
        }));
    });
}

fn take_panics() -> Vec<String> {
    std::mem::take(&mut *lock(&PANICS))
}

/// Run `case` of a target counted in `stats` on a thread of its own, with the deadline of
/// [`case_timeout`]. `Ok` with its result if it finished and nothing panicked anywhere
/// meanwhile; otherwise `Err` with what went wrong (the caller adds the input). After a
/// hang, every later call for the target returns `Ok(None)` at once ([`Stats::hung`]).
pub fn bounded<T: Send + 'static>(
    stats: &Stats,
    case: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<Option<T>, String> {
    bounded_within(stats, case_timeout(), case)
}

/// [`bounded`] with the deadline `limit`.
pub fn bounded_within<T: Send + 'static>(
    stats: &Stats,
    limit: Duration,
    case: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<Option<T>, String> {
    install_panic_hook();
    let _one_at_a_time = lock(&CASE_LOCK);
    if stats.hung.load(Ordering::Relaxed) {
        return Ok(None);
    }
    take_panics();
    IN_CASE.store(true, Ordering::SeqCst);
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::Builder::new()
        .name("fuzz-case".into())
        .spawn(move || {
            let _ = tx.send(case());
        })
        .map_err(|e| {
            IN_CASE.store(false, Ordering::SeqCst);
            format!("could not start the case's thread: {e}")
        })?;
    let outcome = match rx.recv_timeout(limit) {
        Ok(r) => {
            let _ = handle.join();
            r.map(Some)
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            let _ = handle.join();
            Err("the case panicked".into())
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            // What the hung case does later is charged to no case: the target stops here.
            IN_CASE.store(false, Ordering::SeqCst);
            stats.hung.store(true, Ordering::Relaxed);
            return Err(format!(
                "the case did not finish within {limit:?} (a hang; its thread is left running, and the \
                 target's later cases are skipped so that this input is the one reported)"
            ));
        }
    };
    // A VM's threads panic after the call that caused it returned, if at all: the VM is
    // dropped at the end of the case, which joins them, so every panic is in by now.
    IN_CASE.store(false, Ordering::SeqCst);
    let panics = take_panics();
    if !panics.is_empty() {
        return Err(format!("unexpected panic(s):\n  {}", panics.join("\n  ")));
    }
    outcome
}

/// A proptest configuration for a target: `cases` cases (see [`cases`]), failures kept in
/// the `.proptest-regressions` file beside `source_file` (`file!()` of the test) and
/// replayed first on every run; `test_name` is the test's path.
pub fn proptest_config(
    cases: u32,
    source_file: &'static str,
    test_name: &'static str,
) -> proptest::test_runner::Config {
    proptest::test_runner::Config {
        cases,
        source_file: Some(source_file),
        test_name: Some(test_name),
        // A failing case is shrunk for at most a minute: each step replays a case.
        max_shrink_time: 60_000,
        failure_persistence: Some(Box::new(FileFailurePersistence::WithSource("proptest-regressions"))),
        // Cases run in this process, under `bounded`'s watchdog (proptest's forking mode
        // would run them in a child, out of reach of the counters the targets check).
        fork: false,
        timeout: 0,
        ..proptest::test_runner::Config::default()
    }
}

/// A path for a temporary file of this process, unique per call.
pub fn temp_path(ext: &str) -> std::path::PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let n = N.fetch_add(1, Ordering::Relaxed);
    std::env::temp_dir().join(format!("eagervm-fuzz-{}-{n}.{ext}", std::process::id()))
}
