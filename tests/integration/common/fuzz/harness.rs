//! What every fuzz target shares: the VM configuration of a case and its cap on one
//! tensor's bytes, the tensors that cap refuses, case counts, a watchdog that bounds each
//! case's time, and a panic hook that catches panics on any thread (the VM's included),
//! not only the caller's.
//!
//! A case runs on a thread of its own while the test thread waits for it with a deadline
//! ([`bounded`]). A panic there, or on any other thread during the case (a scheduler,
//! worker, watcher or mock-device thread), fails the case with its message and the input;
//! so does a case that outlives the deadline. The one panic that is expected is the
//! `panic` op's own (`panic op: ...`), which the VM must catch; the hook ignores it.
//!
//! Cases of all targets run one at a time (a process-wide lock), so that a panic on a VM
//! thread is charged to the case that caused it, and a case has the machine's cores to
//! itself. (The other tests of the binary run beside the cases: their expected panics are
//! all the `panic` op's, so a panic of theirs charged to a case is a failure of theirs too.)

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{mpsc, Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use eagervm::ep::mock::MockConfig;
use eagervm::framework::DType;
use eagervm::vm::ThreadTopology;
use eagervm::{Config, Error};
use proptest::test_runner::FileFailurePersistence;

/// The cap on one tensor's bytes in a fuzz case's VM (`Config::max_tensor_bytes`) and in
/// the trace validator (`ValidateOptions::max_tensor_bytes`).
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

/// The VM configuration of a fuzz case: two mock devices with jitter (so that streams
/// interleave differently from case to case), and [`TENSOR_CAP`] as the cap on one
/// tensor's bytes.
///
/// This is the one place that bounds the memory a case may ask for. The VM refuses a
/// tensor beyond the cap, or one whose size overflows, with `Error::TooLarge` before
/// anything runs, and the trace validator refuses a trace that declares one; a case that
/// asks for one therefore allocates nothing, and the targets check that the refusal is
/// that typed error ([`oversized`]).
pub fn setup(knobs: Knobs) -> Config {
    let mut config = Config::default().with_mock_devices(2, MockConfig::jittery());
    config.threads = knobs.threads;
    config.synchronous = knobs.synchronous;
    config.batch_size = knobs.batch_size.max(1);
    config.high_water = knobs.high_water.max(4);
    config.low_water = config.high_water / 4;
    config.max_tensor_bytes = TENSOR_CAP;
    config
}

/// A tensor that the VM must refuse under [`TENSOR_CAP`] ([`oversized`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Oversized {
    /// Its shape.
    pub shape: Vec<usize>,
    /// Its dtype.
    pub dtype: DType,
    /// Its size in bytes; `None` where the product of its nonzero dimensions and its
    /// element size overflows a `usize`.
    pub bytes: Option<u64>,
}

impl Oversized {
    /// The refusal the VM must give for it, asked for at `at` (`` `empty` on cpu:0 ``,
    /// `` output 0 of `matmul` on mock:1 ``, `tensor t3` of a trace: `docs/errors.md`).
    pub fn error(&self, at: impl Into<String>) -> Error {
        Error::TooLarge {
            at: at.into(),
            shape: self.shape.clone(),
            dtype: self.dtype,
            bytes: self.bytes,
            limit: TENSOR_CAP,
        }
    }
}

/// The tensor of `shape` and `dtype`, if the VM must refuse it under [`TENSOR_CAP`]: when
/// the product of its nonzero dimensions and its element size does not fit in a `usize`,
/// or its size in bytes (zero if a dimension is zero) is over the cap (the rule of
/// `TooLarge` in `docs/errors.md`). Computed here on its own, in `u128` and checked
/// arithmetic, so that it never wraps.
pub fn oversized(shape: &[usize], dtype: DType) -> Option<Oversized> {
    let product = shape
        .iter()
        .filter(|&&d| d != 0)
        .try_fold(dtype.size() as u128, |p, &d| p.checked_mul(d as u128))
        .filter(|&p| p <= usize::MAX as u128);
    let bytes = product.map(|p| if shape.contains(&0) { 0 } else { p as u64 });
    match bytes {
        Some(b) if b <= TENSOR_CAP => None,
        _ => Some(Oversized { shape: shape.to_vec(), dtype, bytes }),
    }
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
    /// Of those, inputs that asked for a tensor over [`TENSOR_CAP`] and were refused as
    /// `TooLarge` (a trace: by the validator).
    pub too_large: AtomicU64,
    /// Runs that went all the way (a replay, a read that returned the values).
    pub ran: AtomicU64,
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
            too_large: AtomicU64::new(0),
            ran: AtomicU64::new(0),
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
            "{target}: {} cases, {} inputs accepted, {} refused with a typed error ({} of them as too \
             large), {} ran through",
            g(&self.cases),
            g(&self.accepted),
            g(&self.refused),
            g(&self.too_large),
            g(&self.ran)
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
