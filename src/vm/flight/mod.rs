//! The flight recorder: per stream, a bounded ring of the last instructions admitted there,
//! with their op, operands, state and the times of each state change, kept cheaply enough
//! to be always on, so that when something hangs the VM can say what was in flight
//! ([`FlightRecord`], the watchdog's dump, `eagervm flight`).
//!
//! # What is kept
//!
//! For each stream, `Config::flight_records` slots (a ring indexed by stream position):
//! the instruction's position on its stream and program number, its op name (a kernel's
//! name; a collective's names its communicator, `all_reduce.sum@world`), the ids of up to
//! [`MAX_OPERANDS`] operands (inputs, then outputs; the count of all), and the times it was
//! admitted, dispatched, launched and seen done. Besides the ring, each stream has
//! watermarks: the last position admitted, dispatched and done, and when `done` last moved.
//! A stream runs, completes and dispatches in order, so an instruction's state follows from
//! its position and the watermarks: done if at or below `done`, launched if at or below the
//! last launch, dispatched if at or below `dispatched`, else admitted.
//!
//! # Who writes what
//!
//! Every slot and watermark has one writer, the thread that owns the transition:
//!
//! | what | written by | when |
//! | --- | --- | --- |
//! | admission slot (op, operands, admitted time, dispatched time if ready) | scheduler | at admission |
//! | dispatched time of a parked instruction | scheduler | at its dispatch |
//! | done time, `done` watermark | scheduler | at the completion report that retires it |
//! | `admitted`, `dispatched` watermarks | scheduler | after each admission run or dispatch |
//! | launch slot (launched time) | the stream's worker | when it runs or launches the instruction |
//!
//! Readers (the watchdog, [`FlightRecord`] snapshots) read slots without a lock through a
//! sequence lock of atomics (`seqlock.rs`), and skip a slot being rewritten.
//!
//! # Cost
//!
//! Per instruction: a dozen relaxed stores into a preallocated slot on the scheduler and two
//! on the worker; no allocation, lock or system call. Times come from one clock read per
//! scheduler loop and one per worker batch (a coarse clock: an instruction's times are
//! those of the loop or batch that moved it). With `flight_records = 0` only the watermarks
//! are kept (a relaxed store per admission run and per completion report).
//! `docs/architecture.md` ("Flight recorder and watchdog") has the measured cost.

pub(crate) mod seqlock;

use std::fmt;
use std::time::{Duration, Instant};

use crate::sync::{AtomicU64, Ordering};

use super::instruction::{Body, Operand};
use seqlock::Slot;

/// The most operand ids a slot keeps (an instruction with more keeps its first ones and the
/// count of all).
pub const MAX_OPERANDS: usize = 4;

/// The default `Config::flight_records`.
pub const DEFAULT_FLIGHT_RECORDS: usize = 64;

/// Words of an admission slot.
const W_PROGRAM: usize = 0;
const W_NAME_PTR: usize = 1;
const W_NAME_LEN: usize = 2;
/// Operand count (low 32 bits) and how many are inputs (high 32 bits).
const W_COUNTS: usize = 3;
const W_OPS: usize = 4;
const W_ADMITTED: usize = W_OPS + MAX_OPERANDS;
const W_DISPATCHED: usize = W_ADMITTED + 1;
const W_DONE: usize = W_ADMITTED + 2;
const WORDS: usize = W_ADMITTED + 3;

/// Nanoseconds since the VM started, plus one (0: not yet).
pub(crate) type Stamp = u64;

/// The watermarks of one stream (scheduler-written).
#[derive(Default)]
struct Marks {
    /// Instructions a waiter ran on its own thread (`vm::engine`, "Running a waiter's work
    /// on its thread"): they take no position.
    ran_inline: AtomicU64,
    admitted: AtomicU64,
    dispatched: AtomicU64,
    done: AtomicU64,
    done_at: AtomicU64,
}

/// One stream's part of the recorder.
struct StreamRing {
    name: String,
    /// Its slots (0: only the watermarks are kept for it).
    n: u64,
    marks: Marks,
    /// Admission slots, `position % n` (scheduler-written).
    slots: Box<[Slot<WORDS>]>,
    /// Launch slots, `position % n`: the launch time (worker-written).
    launches: Box<[Slot<1>]>,
}

/// The engine's flight recorder (module docs).
pub(crate) struct Flight {
    start: Instant,
    /// Slots per stream (0: only the watermarks are kept).
    n: usize,
    streams: Box<[StreamRing]>,
}

impl Flight {
    /// A recorder of `n` slots for each of the streams `streams` names with `true` (the
    /// others keep their watermarks only).
    pub(crate) fn new(n: usize, streams: impl Iterator<Item = (String, bool)>) -> Flight {
        Flight {
            start: Instant::now(),
            n,
            streams: streams
                .map(|(name, kept)| {
                    let n = if kept { n } else { 0 };
                    StreamRing {
                        name,
                        n: n as u64,
                        marks: Marks::default(),
                        slots: (0..n).map(|_| Slot::default()).collect(),
                        launches: (0..n).map(|_| Slot::default()).collect(),
                    }
                })
                .collect(),
        }
    }

    /// Whether slots are kept (`flight_records > 0`): the callers read the clock only then.
    #[inline(always)]
    pub(crate) fn on(&self) -> bool {
        self.n != 0
    }

    /// Whether stream `s` keeps slots (`on`, and `s` is one of the streams given slots):
    /// looked up once per run of one stream's instructions, so that a stream without slots
    /// pays nothing per instruction.
    #[inline(always)]
    pub(crate) fn keeps(&self, s: usize) -> bool {
        self.streams.get(s).is_some_and(|r| r.n != 0)
    }

    /// The clock, as a [`Stamp`] (once per scheduler loop or worker batch).
    #[inline]
    pub(crate) fn now(&self) -> Stamp {
        self.start.elapsed().as_nanos() as u64 + 1
    }

    /// How long ago `stamp` was, at `now`.
    fn age(now: Stamp, stamp: Stamp) -> Option<Duration> {
        (stamp != 0).then(|| Duration::from_nanos(now.saturating_sub(stamp)))
    }

    /// Scheduler: instruction `body` (`n_inputs` of `ops` read) was admitted at position
    /// `seq` of stream `s`, program number `program`, at `t`; `ready` if it was dispatched
    /// at once. Only while [`on`](Self::on).
    #[allow(clippy::too_many_arguments)]
    #[inline]
    pub(in crate::vm) fn admitted(
        &self,
        s: usize,
        seq: u64,
        program: u64,
        body: &Body,
        n_inputs: u8,
        ops: &[Operand],
        t: Stamp,
        ready: bool,
    ) {
        let ring = &self.streams[s];
        if ring.n == 0 {
            return;
        }
        let name = body.name();
        let mut w = [0u64; WORDS];
        w[W_PROGRAM] = program;
        w[W_NAME_PTR] = name.as_ptr() as usize as u64;
        w[W_NAME_LEN] = name.len() as u64;
        w[W_COUNTS] = ops.len() as u64 | (u64::from(n_inputs) << 32);
        for (k, o) in ops.iter().take(MAX_OPERANDS).enumerate() {
            // SAFETY: the scheduler is admitting the instruction, so its operands' tensors
            // are alive (`Operand::tensor`'s contract).
            w[W_OPS + k] = unsafe { o.tensor() }.id;
        }
        w[W_ADMITTED] = t;
        w[W_DISPATCHED] = if ready { t } else { 0 };
        ring.slots[(seq % ring.n) as usize].write(seq, w);
    }

    /// Scheduler: the parked instruction at position `seq` of stream `s` was dispatched at
    /// `t`. Only while [`on`](Self::on).
    #[inline]
    pub(crate) fn dispatched(&self, s: usize, seq: u64, t: Stamp) {
        let ring = &self.streams[s];
        if ring.n != 0 {
            ring.slots[(seq % ring.n) as usize].set(seq, W_DISPATCHED, t);
        }
    }

    /// Scheduler: stream `s` has admitted through `admitted` and dispatched through
    /// `dispatched`.
    #[inline(always)]
    pub(crate) fn marks(&self, s: usize, admitted: u64, dispatched: u64) {
        let m = &self.streams[s].marks;
        m.admitted.store(admitted, Ordering::Relaxed);
        m.dispatched.store(dispatched, Ordering::Relaxed);
    }

    /// A waiter ran `n` instructions of stream `s` on its own thread.
    #[inline]
    pub(crate) fn ran_inline(&self, s: usize, n: u64) {
        self.streams[s].marks.ran_inline.fetch_add(n, Ordering::Relaxed);
    }

    /// Scheduler: stream `s`'s dispatched watermark moved to `dispatched`.
    #[inline(always)]
    pub(crate) fn dispatched_mark(&self, s: usize, dispatched: u64) {
        self.streams[s].marks.dispatched.store(dispatched, Ordering::Relaxed);
    }

    /// Scheduler: stream `s` is done through `done` (it was done through `before`), seen at
    /// `t` (0 while not [`on`](Self::on)).
    #[inline]
    pub(crate) fn done(&self, s: usize, before: u64, done: u64, t: Stamp) {
        let ring = &self.streams[s];
        ring.marks.done.store(done, Ordering::Relaxed);
        if self.n == 0 {
            return;
        }
        ring.marks.done_at.store(t, Ordering::Relaxed);
        if ring.n == 0 {
            return;
        }
        let from = before.max(done.saturating_sub(ring.n)) + 1;
        for p in from..=done {
            ring.slots[(p % ring.n) as usize].set(p, W_DONE, t);
        }
    }

    /// Worker: it runs or launches the instruction at position `seq` of stream `s`, in a
    /// batch it began at `t`. Only while [`on`](Self::on).
    #[inline(always)]
    pub(crate) fn launched(&self, s: usize, seq: u64, t: Stamp) {
        let ring = &self.streams[s];
        if ring.n != 0 {
            ring.launches[(seq % ring.n) as usize].write(seq, [t]);
        }
    }

    /// Stream `s`'s watermarks: (admitted, dispatched, done).
    pub(crate) fn progress(&self, s: usize) -> (u64, u64, u64) {
        let m = &self.streams[s].marks;
        // `done` first: the others, read after, are at least as far along.
        let done = m.done.load(Ordering::Relaxed);
        let dispatched = m.dispatched.load(Ordering::Relaxed).max(done);
        (m.admitted.load(Ordering::Relaxed).max(dispatched), dispatched, done)
    }

    /// The op name of the in-flight instruction at position `seq` of stream `s`, if its slot
    /// still holds it.
    pub(crate) fn op_at(&self, s: usize, seq: u64) -> Option<&'static str> {
        let ring = &self.streams[s];
        if ring.n == 0 {
            return None;
        }
        let (tag, w) = ring.slots[(seq % ring.n) as usize].read()?;
        (tag == seq).then(|| name_of(&w))
    }

    /// A snapshot of every stream (module docs); `stuck` gives, per stream index, how long
    /// the watchdog has seen it make no progress with work in flight.
    pub(crate) fn snapshot(
        &self,
        reason: String,
        timeout: Option<Duration>,
        stuck: &[(usize, Duration)],
        communicators: Vec<CommunicatorRecord>,
    ) -> FlightRecord {
        let now = self.now();
        let mut streams = Vec::with_capacity(self.streams.len());
        for (s, ring) in self.streams.iter().enumerate() {
            let (admitted, dispatched, done) = self.progress(s);
            let launched = ring.launches.iter().map(Slot::tag).max().filter(|_| ring.n > 0);
            let launched_mark = launched.unwrap_or(dispatched).clamp(done, dispatched);
            let mut entries = Vec::new();
            for slot in ring.slots.iter() {
                let Some((seq, w)) = slot.read() else { continue };
                let launch = ring.launches[(seq % ring.n) as usize].read();
                let launch_t = launch.and_then(|(tag, [t])| (tag == seq).then_some(t)).unwrap_or(0);
                let state = if seq <= done {
                    FlightState::Done
                } else if seq <= launched_mark {
                    FlightState::Launched
                } else if seq <= dispatched {
                    FlightState::Dispatched
                } else {
                    FlightState::Admitted
                };
                let n_ops = (w[W_COUNTS] & u64::from(u32::MAX)) as usize;
                let n_in = (w[W_COUNTS] >> 32) as usize;
                let kept: Vec<u64> = w[W_OPS..W_OPS + n_ops.min(MAX_OPERANDS)].to_vec();
                let at = |t: Stamp| (t != 0).then(|| Duration::from_nanos(t - 1));
                entries.push(FlightEntry {
                    position: seq,
                    program: w[W_PROGRAM],
                    op: name_of(&w).to_string(),
                    inputs: kept.iter().take(n_in).copied().collect(),
                    outputs: kept.iter().skip(n_in).copied().collect(),
                    operands: n_ops,
                    state,
                    admitted: at(w[W_ADMITTED]),
                    dispatched: at(w[W_DISPATCHED]),
                    launched: at(launch_t),
                    done: at(w[W_DONE]),
                });
            }
            entries.sort_by_key(|e| e.position);
            streams.push(StreamRecord {
                name: ring.name.clone(),
                admitted,
                dispatched,
                launched: launched.map(|l| l.clamp(done, dispatched)),
                done,
                done_ago: Self::age(now, ring.marks.done_at.load(Ordering::Relaxed)),
                ran_inline: ring.marks.ran_inline.load(Ordering::Relaxed),
                stuck_for: stuck.iter().find(|(i, _)| *i == s).map(|&(_, d)| d),
                entries,
            });
        }
        FlightRecord {
            pid: std::process::id(),
            reason,
            taken_at: Duration::from_nanos(now - 1),
            timeout,
            records_per_stream: self.n,
            streams,
            communicators,
        }
    }
}

/// The op name an admission slot's words hold.
fn name_of(w: &[u64; WORDS]) -> &'static str {
    let (ptr, len) = (w[W_NAME_PTR] as usize as *const u8, w[W_NAME_LEN] as usize);
    if ptr.is_null() {
        return "";
    }
    // SAFETY: the two words were written together by one `Flight::admitted` from one
    // `&'static str` (the sequence lock returns only the words of one complete write), so
    // they are the address and length of a string that lives for the whole program.
    unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(ptr, len)) }
}

/// The state of an instruction in a [`FlightRecord`]: how far it has come.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum FlightState {
    /// The scheduler received it; it waits for its inputs or for its stream.
    Admitted,
    /// Handed to its stream's worker, not yet run or launched.
    Dispatched,
    /// Running on its worker (a synchronous stream) or launched on its device stream.
    Launched,
    /// Finished and retired.
    Done,
}

impl FlightState {
    /// Its name in the dump (`admitted`, `dispatched`, `launched`, `done`).
    pub fn name(self) -> &'static str {
        match self {
            FlightState::Admitted => "admitted",
            FlightState::Dispatched => "dispatched",
            FlightState::Launched => "launched",
            FlightState::Done => "done",
        }
    }
}

/// One instruction in a [`FlightRecord`]. Times are since the VM started, as the
/// scheduler loop or worker batch that moved the instruction read the clock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightEntry {
    /// Its position on its stream (from 1).
    pub position: u64,
    /// Its program number (submission order over the VM, from 1).
    pub program: u64,
    /// Its op name: a kernel's name, a collective's with its communicator
    /// (`all_reduce.sum@world`), or the instruction kind (`RecordEvent`, `StreamWaitEvent`,
    /// `Release`, `Access`).
    pub op: String,
    /// The ids of the tensors it reads (of the first [`MAX_OPERANDS`] operands).
    pub inputs: Vec<u64>,
    /// The ids of the tensors it writes (of the first [`MAX_OPERANDS`] operands).
    pub outputs: Vec<u64>,
    /// How many operands it has in all.
    pub operands: usize,
    /// How far it has come.
    pub state: FlightState,
    /// When the scheduler admitted it.
    pub admitted: Option<Duration>,
    /// When it was dispatched to its worker.
    pub dispatched: Option<Duration>,
    /// When its worker began the batch that ran or launched it.
    pub launched: Option<Duration>,
    /// When the scheduler saw it done.
    pub done: Option<Duration>,
}

/// One stream in a [`FlightRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamRecord {
    /// The stream's name (`cpu:0`, `mock:0:collective`).
    pub name: String,
    /// The last position admitted.
    pub admitted: u64,
    /// The last position dispatched.
    pub dispatched: u64,
    /// The last position run or launched (`None` when no slots are kept).
    pub launched: Option<u64>,
    /// The last position done: everything up to it has finished.
    pub done: u64,
    /// How long before the snapshot `done` last moved (`None` if never, or no slots kept).
    pub done_ago: Option<Duration>,
    /// Instructions of the stream that a caller waiting for them ran on its own thread, the
    /// VM being idle (`docs/architecture.md`, "A waiter runs its own work"): done, and
    /// not counted in the positions above.
    pub ran_inline: u64,
    /// For a stream the watchdog found stuck: how long it has had work in flight and made
    /// no progress.
    pub stuck_for: Option<Duration>,
    /// The last instructions admitted on the stream, oldest first (at most
    /// `records_per_stream`).
    pub entries: Vec<FlightEntry>,
}

impl StreamRecord {
    /// The instructions in flight: dispatched or launched, not done.
    pub fn in_flight(&self) -> impl Iterator<Item = &FlightEntry> {
        self.entries.iter().filter(|e| matches!(e.state, FlightState::Dispatched | FlightState::Launched))
    }
}

/// A communicator in a [`FlightRecord`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CommunicatorRecord {
    /// Its name (what follows `@` in its ops' names).
    pub name: String,
    /// Its backend (`mock`, `mpi`, `nccl`).
    pub backend: String,
    /// Ranks over all processes.
    pub world_size: usize,
    /// The local members: (rank, device).
    pub members: Vec<(usize, String)>,
    /// How many collectives of it this process has issued (the last one is number
    /// `issued - 1`, from 0).
    pub issued: u64,
    /// Why it was aborted, if it was.
    pub aborted: Option<String>,
}

/// What a VM has in flight, per stream, and its communicators: the flight recorder's
/// snapshot (`VirtualMachine::flight_record`), and the watchdog's dump, whose format is its
/// [`Display`](fmt::Display) (`docs/distributed.md`, "Failures and the flight recorder").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FlightRecord {
    /// The process.
    pub pid: u32,
    /// Why it was taken (`snapshot`, or the watchdog's finding).
    pub reason: String,
    /// When, since the VM started.
    pub taken_at: Duration,
    /// The watchdog's timeout, if one runs.
    pub timeout: Option<Duration>,
    /// Slots kept per stream (`Config::flight_records`).
    pub records_per_stream: usize,
    /// Every stream, in the VM's stream order.
    pub streams: Vec<StreamRecord>,
    /// Every communicator made on the VM.
    pub communicators: Vec<CommunicatorRecord>,
}

impl FlightRecord {
    /// The first line of every dump: `eagervm flight record v1`.
    pub const HEADER: &'static str = "eagervm flight record v1";

    /// Whether `text` is a flight dump (it begins with [`HEADER`](Self::HEADER)).
    pub fn is_dump(text: &str) -> bool {
        text.lines().next().is_some_and(|l| l.trim_end() == Self::HEADER)
    }

    /// The stream called `name`.
    pub fn stream(&self, name: &str) -> Option<&StreamRecord> {
        self.streams.iter().find(|s| s.name == name)
    }

    /// Whether nothing is in flight on any stream (every admitted instruction is done).
    pub fn quiet(&self) -> bool {
        self.streams.iter().all(|s| s.done == s.admitted)
    }
}

/// A time in the dump: seconds with microseconds, or `-`.
struct T(Option<Duration>);

impl fmt::Display for T {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(d) => write!(f, "{:.6}s", d.as_secs_f64()),
            None => f.write_str("-"),
        }
    }
}

fn ids(v: &[u64]) -> String {
    if v.is_empty() {
        return "-".into();
    }
    v.iter().map(|i| format!("%{i}")).collect::<Vec<_>>().join(",")
}

impl fmt::Display for FlightRecord {
    /// The dump format (`docs/distributed.md`, "Failures and the flight recorder").
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{}", Self::HEADER)?;
        writeln!(f, "pid: {}", self.pid)?;
        writeln!(f, "reason: {}", self.reason)?;
        writeln!(f, "taken: {} after the VM started", T(Some(self.taken_at)))?;
        match self.timeout {
            Some(t) => writeln!(f, "watchdog timeout: {t:?}")?,
            None => writeln!(f, "watchdog timeout: off")?,
        }
        writeln!(f, "records per stream: {}", self.records_per_stream)?;
        for s in &self.streams {
            writeln!(f)?;
            write!(f, "stream {}: admitted {}, dispatched {}", s.name, s.admitted, s.dispatched)?;
            if let Some(l) = s.launched {
                write!(f, ", launched {l}")?;
            }
            write!(f, ", done {}", s.done)?;
            if let Some(a) = s.done_ago {
                write!(f, " ({} ago)", T(Some(a)))?;
            }
            if s.ran_inline > 0 {
                write!(f, "; ran by waiters {}", s.ran_inline)?;
            }
            writeln!(f)?;
            if let Some(d) = s.stuck_for {
                match s.in_flight().next() {
                    Some(e) => writeln!(
                        f,
                        "  STUCK for {}: #{} {} ({}), {}",
                        T(Some(d)),
                        e.position,
                        e.op,
                        e.state.name(),
                        match e.state {
                            FlightState::Launched =>
                                "waiting for its work (its kernel, device or peers) to finish",
                            _ => "waiting for its worker, busy with an earlier instruction",
                        }
                    )?,
                    None => writeln!(
                        f,
                        "  STUCK for {}: position {} (no longer in the ring)",
                        T(Some(d)),
                        s.done + 1
                    )?,
                }
            }
            if s.entries.is_empty() {
                continue;
            }
            writeln!(
                f,
                "  {:>6} {:>8}  {:<10} {:>12} {:>12} {:>12} {:>12}  op  (in -> out)",
                "pos", "program", "state", "admitted", "dispatched", "launched", "done"
            )?;
            for e in &s.entries {
                let more = if e.operands > MAX_OPERANDS {
                    format!(" (+{})", e.operands - MAX_OPERANDS)
                } else {
                    String::new()
                };
                writeln!(
                    f,
                    "  {:>6} {:>8}  {:<10} {:>12} {:>12} {:>12} {:>12}  {}  ({} -> {}){more}",
                    e.position,
                    e.program,
                    e.state.name(),
                    T(e.admitted).to_string(),
                    T(e.dispatched).to_string(),
                    T(e.launched).to_string(),
                    T(e.done).to_string(),
                    e.op,
                    ids(&e.inputs),
                    ids(&e.outputs),
                )?;
            }
        }
        for c in &self.communicators {
            writeln!(f)?;
            let members =
                c.members.iter().map(|(r, d)| format!("rank {r} on {d}")).collect::<Vec<_>>().join(", ");
            writeln!(
                f,
                "communicator {}: {} backend, world size {}, local members: {members}",
                c.name, c.backend, c.world_size
            )?;
            match c.issued {
                0 => writeln!(f, "  collectives issued: 0")?,
                n => writeln!(f, "  collectives issued: {n} (the last is collective #{})", n - 1)?,
            }
            match &c.aborted {
                Some(why) => writeln!(f, "  aborted: {why}")?,
                None => writeln!(f, "  aborted: no")?,
            }
        }
        Ok(())
    }
}
