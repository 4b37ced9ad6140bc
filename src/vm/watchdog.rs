//! The watchdog: one thread per engine, started when `Config::watchdog_timeout` is set,
//! that turns a hang into an error.
//!
//! It sleeps on a channel for a period (a quarter of the timeout, between 1 ms and 5 s:
//! never a poll loop), and on each wake reads every stream's watermarks from the flight
//! recorder (`vm::flight`). A stream with work in flight (dispatched beyond done) whose
//! done position has not moved since the watchdog first saw it so, for at least the
//! timeout, is stuck: its oldest instruction in flight has been in flight at least that
//! long (a stream completes in order). For the streams found stuck on one wake, once per
//! stuck position, it:
//!
//! 1. logs each through `tracing::error!`;
//! 2. writes the flight record ([`FlightRecord`](super::flight::FlightRecord)), with the
//!    stuck streams marked, to `Config::flight_dump` (default
//!    `<temp dir>/eagervm-flight-<pid>.txt`), replacing what an earlier finding wrote;
//! 3. aborts each communicator whose collective is in flight on a stuck stream
//!    (`Backend::abort`, with a message naming the timeout and the dump): the collective
//!    returns an error, its kernel fails its outputs with [`Error::Kernel`](super::Error),
//!    and the stream goes on. A stuck stream whose instructions are not collectives
//!    (a kernel that loops, a device that stopped) is logged and dumped only: the VM has no
//!    way to stop a running kernel.
//!
//! # Shutdown
//!
//! The thread holds a weak reference to the engine's parts, upgraded only for the length of
//! one check, so it never keeps them alive. The engine handle's drop, after joining the
//! scheduler (while the scheduler drains, the watchdog can still abort a hung collective
//! that would keep it from finishing), drops the channel's sender, which wakes the thread
//! at once, and joins it.

use std::path::PathBuf;
use std::sync::mpsc::{self, RecvTimeoutError, Sender};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::engine::Parts;
use super::flight::CommunicatorRecord;

/// The running watchdog of an engine.
#[derive(Debug)]
pub(crate) struct Watchdog {
    stop: Option<Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Watchdog {
    /// Start the watchdog of `engine` with `timeout`.
    pub(crate) fn start(engine: &Arc<Parts>, timeout: Duration) -> std::io::Result<Watchdog> {
        let (tx, rx) = mpsc::channel::<()>();
        let weak = Arc::downgrade(engine);
        let thread = std::thread::Builder::new().name("eagervm-watchdog".into()).spawn(move || {
            let period = (timeout / 4).clamp(Duration::from_millis(1), Duration::from_secs(5));
            let mut state = State::default();
            loop {
                match rx.recv_timeout(period) {
                    Err(RecvTimeoutError::Timeout) => {}
                    Ok(()) | Err(RecvTimeoutError::Disconnected) => return,
                }
                let Some(engine) = weak.upgrade() else { return };
                state.check(&engine, timeout);
            }
        })?;
        Ok(Watchdog { stop: Some(tx), thread: Some(thread) })
    }

    /// Stop the thread and join it.
    pub(crate) fn stop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.stop();
    }
}

/// What the watchdog remembers between wakes, per stream.
#[derive(Default)]
struct State {
    /// The done position at which the stream was first seen with work in flight, and when.
    since: Vec<Option<(u64, Instant)>>,
    /// The done position at which it last fired for the stream.
    fired: Vec<Option<u64>>,
}

impl State {
    fn check(&mut self, vm: &Parts, timeout: Duration) {
        let flight = &vm.flight;
        let n = vm.streams.len();
        self.since.resize(n, None);
        self.fired.resize(n, None);
        let now = Instant::now();
        let mut stuck = Vec::new();
        for s in 0..n {
            let (_, dispatched, done) = flight.progress(s);
            if dispatched <= done {
                self.since[s] = None;
                continue;
            }
            match self.since[s] {
                Some((d, t)) if d == done => {
                    let held = now - t;
                    if held >= timeout && self.fired[s] != Some(done) {
                        self.fired[s] = Some(done);
                        stuck.push((s, held));
                    }
                }
                _ => self.since[s] = Some((done, now)),
            }
        }
        if !stuck.is_empty() {
            fire(vm, timeout, &stuck);
        }
    }
}

/// The dump file: `Config::flight_dump`, or `<temp dir>/eagervm-flight-<pid>.txt`.
pub(crate) fn dump_path(vm: &Parts) -> PathBuf {
    vm.config
        .flight_dump
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("eagervm-flight-{}.txt", std::process::id())))
}

/// The communicators of `vm`, as a flight record shows them.
pub(crate) fn communicator_records(vm: &Parts) -> Vec<CommunicatorRecord> {
    vm.communicators()
        .into_iter()
        .map(|c| CommunicatorRecord {
            name: c.name.to_string(),
            backend: c.backend.kind().to_string(),
            world_size: c.backend.world_size(),
            members: c.backend.members().iter().map(|m| (m.rank, m.device.to_string())).collect(),
            issued: (c.issued)(),
            aborted: c.backend.aborted(),
        })
        .collect()
}

/// Streams `stuck` (index, how long) have made no progress for `timeout`: log, dump, abort.
#[cold]
fn fire(vm: &Parts, timeout: Duration, stuck: &[(usize, Duration)]) {
    let path = dump_path(vm);
    let flight = &vm.flight;
    let comms = vm.communicators();
    // Per stuck stream: its first instruction in flight, and the communicators to abort.
    let mut abort: Vec<(usize, String)> = Vec::new();
    let mut found = Vec::new();
    for &(s, held) in stuck {
        let st = &vm.streams[s];
        let (_, dispatched, done) = flight.progress(s);
        let op = flight.op_at(s, done + 1);
        tracing::error!(
            stream = %st.name,
            position = done + 1,
            op = op.unwrap_or("?"),
            in_flight = dispatched - done,
            for_ms = held.as_millis() as u64,
            timeout_ms = timeout.as_millis() as u64,
            dump = %path.display(),
            "watchdog: an instruction has been in flight longer than the timeout"
        );
        found.push(format!("{} #{} {}", st.name, done + 1, op.unwrap_or("?")));
        // The communicators of the collectives in flight on the stream: by op name where the
        // ring holds it; else, on a collective stream, those it serves.
        let mut named = false;
        for p in done + 1..=dispatched {
            let Some(name) = flight.op_at(s, p) else { continue };
            if let Some((_, comm)) = name.split_once('@') {
                if let Some(i) = comms.iter().position(|c| &*c.name == comm) {
                    named = true;
                    if !abort.iter().any(|(j, _)| *j == i) {
                        abort.push((i, format!("`{name}` on {}", st.name)));
                    }
                }
            }
        }
        if !named && st.ty == crate::ep::StreamType::Collective {
            for (i, c) in comms.iter().enumerate() {
                let serves = c.backend.members().first().is_some_and(|m| m.device == st.device);
                if serves && !abort.iter().any(|(j, _)| *j == i) {
                    abort.push((i, format!("a collective on {}", st.name)));
                }
            }
        }
    }
    let reason = format!(
        "watchdog: in flight longer than the timeout of {timeout:?} without progress: {}",
        found.join("; ")
    );
    let mut record = flight.snapshot(reason, Some(timeout), stuck, communicator_records(vm));
    let whys: Vec<(usize, String)> = abort
        .into_iter()
        .map(|(i, what)| {
            let why = format!(
                "the watchdog aborted communicator `{}`: {what} was in flight longer than the timeout of \
                 {timeout:?} (watchdog_timeout, EAGERVM_WATCHDOG_TIMEOUT_MS); flight record: {}",
                comms[i].name,
                path.display()
            );
            (i, why)
        })
        .collect();
    // The dump shows the aborts this finding makes (they follow its writing).
    for (i, why) in &whys {
        if let Some(c) = record.communicators.iter_mut().find(|c| *c.name == *comms[*i].name) {
            c.aborted.get_or_insert_with(|| why.clone());
        }
    }
    if let Err(e) = std::fs::write(&path, record.to_string()) {
        tracing::error!(path = %path.display(), error = %e, "watchdog: cannot write the flight record");
    }
    for (i, why) in whys {
        let c = &comms[i];
        tracing::error!(communicator = %c.name, "{why}");
        c.backend.abort(&why);
    }
}
