//! How far a long trace operation (load, validate, replay) has got, and the flag that asks
//! it to stop.
//!
//! The operation advances counters in a [`Progress`] with relaxed atomic stores, and reads
//! the stop flag with a relaxed load, at most once per line or instruction: no lock, no
//! system call, no call back into the caller. Whoever shows the progress (the command
//! line's bar) reads the counters from a thread of its own, at its own pace, so that a
//! replay blocked on a host read or in its final sync still shows live figures.
//!
//! # Memory ordering
//!
//! Every access is `Relaxed`: the counters publish nothing but themselves (a reader that
//! sees a count a little old draws a bar a little behind), and the stop flag asks for a
//! stop that may come an instruction or a batch later.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, Ordering};
use std::sync::{Arc, Mutex, Weak};

use crate::vm::Engine;

/// What an operation is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Phase {
    /// Not started, or finished.
    Idle = 0,
    /// Parsing the trace text: [`Progress::done`] counts bytes.
    Parsing = 1,
    /// Checking the trace: lines.
    Validating = 2,
    /// The reference replay on `cpu:0` of a replay with a tolerance: instructions submitted.
    Reference = 3,
    /// Replaying: instructions submitted to the VM.
    Replaying = 4,
    /// Waiting for the instructions in flight ([`Progress::in_flight`]) to finish.
    Finishing = 5,
}

impl Phase {
    fn from_u8(v: u8) -> Phase {
        match v {
            1 => Phase::Parsing,
            2 => Phase::Validating,
            3 => Phase::Reference,
            4 => Phase::Replaying,
            5 => Phase::Finishing,
            _ => Phase::Idle,
        }
    }

    /// What the phase's counts count.
    pub fn unit(self) -> &'static str {
        match self {
            Phase::Parsing => "bytes",
            Phase::Validating => "lines",
            _ => "instructions",
        }
    }

    /// The phase in a few words.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Idle => "idle",
            Phase::Parsing => "parse",
            Phase::Validating => "validate",
            Phase::Reference => "reference replay on cpu:0",
            Phase::Replaying => "replay",
            Phase::Finishing => "finish",
        }
    }
}

/// Counters a trace operation advances, and a flag that asks it to stop (module docs).
/// `Progress::default()` has a stop flag of its own that nothing sets.
#[derive(Default)]
pub struct Progress {
    phase: AtomicU8,
    done: AtomicU64,
    total: AtomicU64,
    stop: Arc<AtomicBool>,
    /// The engine of the VM a replay runs on, while it runs: the reader asks it for the
    /// instructions in flight, which move while the replay waits on the host. Locked only
    /// to attach, detach and read (the reader's pace), never per instruction.
    engine: Mutex<Option<Weak<Engine>>>,
}

impl std::fmt::Debug for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Progress")
            .field("phase", &self.phase())
            .field("done", &self.done())
            .field("total", &self.total())
            .field("in_flight", &self.in_flight())
            .field("stop", &self.stop_requested())
            .finish()
    }
}

/// Lines or instructions between two updates of the counters in the loops that advance
/// them: the counters cost nothing to skip, and a bar redrawn ten times a second needs no
/// finer steps.
pub(crate) const STRIDE: u64 = 64;

impl Progress {
    /// Progress that stops when `stop` is set (by a signal handler, say).
    pub fn with_stop(stop: Arc<AtomicBool>) -> Progress {
        Progress { stop, ..Progress::default() }
    }

    /// The current phase.
    pub fn phase(&self) -> Phase {
        Phase::from_u8(self.phase.load(Ordering::Relaxed))
    }

    /// Units of the current phase done ([`Phase::unit`]).
    pub fn done(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Units of the current phase in all.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// Instructions submitted and not yet finished, while a replay runs (0 otherwise).
    pub fn in_flight(&self) -> u64 {
        let engine = self.engine.lock().ok().and_then(|e| e.as_ref().and_then(Weak::upgrade));
        match engine {
            Some(e) => e.in_flight() as u64,
            None => 0,
        }
    }

    /// Whether a stop has been asked for.
    pub fn stop_requested(&self) -> bool {
        self.stop.load(Ordering::Relaxed)
    }

    /// Ask the operation to stop at its next check.
    pub fn request_stop(&self) {
        self.stop.store(true, Ordering::Relaxed);
    }

    /// Enter `phase`, with `total` units to do.
    pub(crate) fn start(&self, phase: Phase, total: u64) {
        self.done.store(0, Ordering::Relaxed);
        self.total.store(total, Ordering::Relaxed);
        self.phase.store(phase as u8, Ordering::Relaxed);
    }

    /// `done` units of the current phase are done.
    #[inline]
    pub(crate) fn set_done(&self, done: u64) {
        self.done.store(done, Ordering::Relaxed);
    }

    /// Read the instructions in flight from `engine` until [`detach`](Self::detach).
    pub(crate) fn attach(&self, engine: &Arc<Engine>) {
        if let Ok(mut e) = self.engine.lock() {
            *e = Some(Arc::downgrade(engine));
        }
    }

    /// Stop reading an engine.
    pub(crate) fn detach(&self) {
        if let Ok(mut e) = self.engine.lock() {
            *e = None;
        }
    }

    /// Back to [`Phase::Idle`].
    pub(crate) fn finish(&self) {
        self.phase.store(Phase::Idle as u8, Ordering::Relaxed);
    }
}

/// A [`Progress`] that reports nothing and is never stopped, for the entry points without
/// one.
pub(crate) fn none() -> &'static Progress {
    static NONE: std::sync::OnceLock<Progress> = std::sync::OnceLock::new();
    NONE.get_or_init(Progress::default)
}
