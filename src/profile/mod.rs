//! The instruction timeline: what every stream and every VM thread did, and when.
//!
//! A profiling session records, for every instruction the VM runs, when the scheduler
//! received it (*queued*), dispatched it to its worker (*dispatched*), when its stream
//! started it (*launched*) and when it finished (*done*); what the scheduler, the workers
//! and the watchers were doing, batch by batch; which cross-stream waits and dependencies
//! linked instructions; and, every 50 µs of scheduler activity at most, the number of
//! instructions in flight and the bytes in use in each device's allocator. MXNet's engine
//! profiler writes the same kind of Chrome trace; eagervm adds the scheduler's own view
//! (queued and dispatched) and the event-wait arrows between streams.
//!
//! ```
//! use eagervm::prelude::*;
//!
//! let vm = VirtualMachine::new(Config { profile: true, ..Config::default() })?;
//! let cpu = vm.compute_stream(DeviceId::CPU)?;
//! let a = vm.from_slice(&[1.0f32, -2.0], &[2], DeviceId::CPU)?;
//! let relu = vm.op("relu")?;
//! let _r = vm.run(|b| b.call(relu, &[&a], Attrs::default(), cpu))?;
//! let profile = vm.stop_profiling()?; // waits for the work submitted so far
//! assert!(profile.instructions().iter().any(|i| i.name == "relu"));
//! println!("{}", profile.summary());
//! let path = std::env::temp_dir().join("eagervm-doc-profile.json");
//! profile.write_chrome_json(&path)?; // open in ui.perfetto.dev or chrome://tracing
//! # std::fs::remove_file(&path).ok();
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `docs/profiling.md` describes every track, slice, arrow and counter of the trace, and
//! the cost of profiling. How the threads record is in the engine's timeline observer (module docs of
//! `src/vm/observe/timeline.rs`): per-thread buffers handed in once per batch, no lock per instruction,
//! one relaxed load and one branch per batch when no session is open.

mod chrome;
mod merge;
mod ops;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::vm::StreamId;

pub use crate::vm::observe::ThreadRole;
pub(crate) use merge::build;
pub use ops::{OpRow, OpTable};

/// One instruction's way through the VM. Times are measured from the VM's start.
#[derive(Debug, Clone, PartialEq)]
pub struct InstrSpan {
    /// Program-order number (errors name instructions by it).
    pub program: u64,
    /// The op name, or the instruction kind (`RecordEvent`, `Release`, ...).
    pub name: &'static str,
    /// The stream it ran on.
    pub stream: StreamId,
    /// Ids of its operand tensors, reads first.
    pub tensors: Vec<u64>,
    /// For each operand, the id of the tensor that owns its storage: the operand's own id,
    /// or for a view the id of the tensor it views.
    pub storages: Vec<u64>,
    /// When the scheduler received it (the scheduler's receipt of its batch).
    pub queued: Duration,
    /// When the scheduler dispatched it to its worker.
    pub dispatched: Duration,
    /// When its stream started it: the worker began running it (synchronous stream) or
    /// began launching it on the device (asynchronous stream).
    pub launched: Duration,
    /// When it finished: the worker finished running it, or the watcher saw the event
    /// recorded after it reached.
    pub done: Duration,
}

impl InstrSpan {
    /// Its operands by name, reads first: `t3` for a tensor that owns its storage, `t7 (view
    /// of t3)` for a view, which says whose storage it reads or writes (the numbers are the
    /// VM's tensor ids, as `Tensor::id` gives them).
    pub fn operand_names(&self) -> Vec<String> {
        let storage = |k: usize| self.storages.get(k).copied().unwrap_or(self.tensors[k]);
        (0..self.tensors.len())
            .map(|k| match (self.tensors[k], storage(k)) {
                (t, s) if t == s => format!("t{t}"),
                (t, s) => format!("t{t} (view of t{s})"),
            })
            .collect()
    }
}

/// What a VM thread was doing over an interval (one slice per batch, not per instruction).
#[derive(Debug, Clone, PartialEq)]
pub struct ThreadSlice {
    /// The thread.
    pub thread: ThreadRole,
    /// `intake` or `completions` (scheduler), `execute` (worker), `watch` (watcher).
    pub name: &'static str,
    /// Start.
    pub start: Duration,
    /// End.
    pub end: Duration,
    /// Instructions or reports handled in the slice.
    pub count: u32,
}

/// Why one instruction had to wait for another on a different stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FlowKind {
    /// A `StreamWaitEvent` waited, on the device, for this `RecordEvent`'s event.
    EventWait,
    /// The target could not be dispatched before the source was done (a done-edge).
    Dependency,
}

/// An arrow from one instruction to another (by program number).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Flow {
    /// What the arrow means.
    pub kind: FlowKind,
    /// The instruction waited for.
    pub from: u64,
    /// The instruction that waited.
    pub to: u64,
}

/// One sample of a counter.
#[derive(Debug, Clone, PartialEq)]
pub struct CounterSample {
    /// `in flight`, or `allocator <device>` (bytes in use).
    pub name: String,
    /// When it was sampled.
    pub at: Duration,
    /// The value.
    pub value: u64,
}

/// A finished profiling session. Build one with
/// [`VirtualMachine::stop_profiling`](crate::VirtualMachine::stop_profiling).
#[derive(Debug, Clone, Default)]
pub struct Profile {
    pub(crate) streams: Vec<String>,
    pub(crate) threads: Vec<(ThreadRole, String)>,
    pub(crate) instructions: Vec<InstrSpan>,
    pub(crate) barriers: Vec<(u64, Duration)>,
    pub(crate) slices: Vec<ThreadSlice>,
    pub(crate) flows: Vec<Flow>,
    pub(crate) counters: Vec<CounterSample>,
    pub(crate) incomplete: usize,
}

impl Profile {
    /// Every instruction that ran during the session, in program order. Barriers
    /// (`vm.sync()`) are not among them: they run on the scheduler, not on a stream.
    pub fn instructions(&self) -> &[InstrSpan] {
        &self.instructions
    }

    /// The threads' batch slices, ordered by start.
    pub fn slices(&self) -> &[ThreadSlice] {
        &self.slices
    }

    /// The cross-stream arrows.
    pub fn flows(&self) -> &[Flow] {
        &self.flows
    }

    /// The counter samples, ordered by time.
    pub fn counters(&self) -> &[CounterSample] {
        &self.counters
    }

    /// The VM's stream names, by stream index.
    pub fn stream_names(&self) -> &[String] {
        &self.streams
    }

    /// The VM's threads and their names.
    pub fn threads(&self) -> &[(ThreadRole, String)] {
        &self.threads
    }

    /// Instructions seen only in part (the session began after their dispatch, or a
    /// device refused to launch them); they are left out of [`instructions`](Self::instructions).
    pub fn incomplete(&self) -> usize {
        self.incomplete
    }

    /// Per-stream busy time and instruction count, and the session's span.
    pub fn summary(&self) -> Summary {
        let mut per: Vec<Vec<(Duration, Duration)>> = vec![Vec::new(); self.streams.len()];
        for i in &self.instructions {
            per[i.stream.index()].push((i.launched, i.done));
        }
        let first = self.instructions.iter().map(|i| i.queued).min().unwrap_or_default();
        let last = self.instructions.iter().map(|i| i.done).max().unwrap_or_default();
        let streams = per
            .into_iter()
            .enumerate()
            .map(|(s, mut spans)| {
                spans.sort_unstable();
                StreamBusy {
                    stream: StreamId(s as u32),
                    name: self.streams[s].clone(),
                    instructions: spans.len(),
                    busy: union_length(&spans),
                }
            })
            .collect();
        Summary { span: last.saturating_sub(first), streams }
    }

    /// Per op and stream: count, total, mean, min and max time and share of the run, sorted
    /// by total time (an instruction's time is the time its stream spent on it alone; see
    /// [`OpTable`]). The totals of one stream's rows add up to its busy time in
    /// [`summary`](Self::summary). `Display` prints it as an aligned table:
    ///
    /// ```text
    /// op              stream            count   total ms    mean us     min us     max us   share
    /// matmul          mock:0:compute       64      1.204      18.81      12.02      40.13   41.3%
    /// ```
    pub fn op_table(&self) -> OpTable {
        ops::build(self)
    }

    /// Write the timeline to `path` as Chrome trace-event JSON (ui.perfetto.dev and
    /// chrome://tracing open it).
    pub fn write_chrome_json(&self, path: impl Into<PathBuf>) -> Result<(), ProfileError> {
        let path = path.into();
        let file = std::fs::File::create(&path)
            .map_err(|source| ProfileError::Write { path: path.clone(), source })?;
        let mut w = std::io::BufWriter::new(file);
        self.write_chrome_json_to(&mut w)
            .and_then(|()| std::io::Write::flush(&mut w))
            .map_err(|source| ProfileError::Write { path, source })
    }

    /// Write the timeline as Chrome trace-event JSON to `w`.
    pub fn write_chrome_json_to(&self, w: &mut impl std::io::Write) -> std::io::Result<()> {
        chrome::write(self, w)
    }
}

/// Total length covered by `spans` (sorted by start).
fn union_length(spans: &[(Duration, Duration)]) -> Duration {
    let mut total = Duration::ZERO;
    let mut cur: Option<(Duration, Duration)> = None;
    for &(s, e) in spans {
        match &mut cur {
            Some((_, ce)) if s <= *ce => *ce = (*ce).max(e),
            _ => {
                if let Some((cs, ce)) = cur {
                    total += ce - cs;
                }
                cur = Some((s, e));
            }
        }
    }
    if let Some((cs, ce)) = cur {
        total += ce - cs;
    }
    total
}

/// How busy each stream was during a session.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    /// From the first instruction's receipt to the last one's completion.
    pub span: Duration,
    /// One entry per stream of the VM, in stream order.
    pub streams: Vec<StreamBusy>,
}

/// One stream's share of a session.
#[derive(Debug, Clone, PartialEq)]
pub struct StreamBusy {
    /// The stream.
    pub stream: StreamId,
    /// Its name (`cpu:0`, `mock:0:compute`, ...).
    pub name: String,
    /// Instructions it ran.
    pub instructions: usize,
    /// Time during which at least one of its instructions was launched and not done.
    pub busy: Duration,
}

/// Prints one row per stream that ran something in the session, the span, and the names of
/// the streams that ran nothing (a VM makes every stream of its devices, a collective stream
/// among them, whether a program uses it or not).
impl fmt::Display for Summary {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "{:<18} {:>12} {:>12} {:>7}", "stream", "instructions", "busy ms", "busy %")?;
        let span = self.span.as_secs_f64();
        for s in self.streams.iter().filter(|s| s.instructions > 0) {
            let pct = if span > 0.0 { 100.0 * s.busy.as_secs_f64() / span } else { 0.0 };
            writeln!(
                f,
                "{:<18} {:>12} {:>12.3} {:>6.1}%",
                s.name,
                s.instructions,
                s.busy.as_secs_f64() * 1e3,
                pct
            )?;
        }
        write!(f, "span {:.3} ms", span * 1e3)?;
        let idle: Vec<&str> =
            self.streams.iter().filter(|s| s.instructions == 0).map(|s| s.name.as_str()).collect();
        if !idle.is_empty() {
            write!(f, "\nnot shown, having run nothing: {}", idle.join(", "))?;
        }
        Ok(())
    }
}

/// Why a profile could not be taken or written.
#[derive(Debug, thiserror::Error)]
pub enum ProfileError {
    /// `stop_profiling` was called with no session open.
    #[error("no profiling session is open: set `Config::profile` or call `start_profiling` first")]
    NotProfiling,
    /// Synchronous mode runs everything on the caller and has nothing to time per thread.
    #[error("profiling needs the scheduler thread; synchronous mode (`Config::synchronous`) has none")]
    Synchronous,
    /// The VM's scheduler is gone, so the session's work never finished.
    #[error("the VM has shut down; the profile cannot be completed")]
    ShutDown,
    /// Writing the trace file failed.
    #[error("cannot write the profile to {}: {source}", path.display())]
    Write {
        /// The file.
        path: PathBuf,
        /// What the system said.
        #[source]
        source: std::io::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn union_length_merges_overlaps_and_skips_gaps() {
        assert_eq!(union_length(&[]), Duration::ZERO);
        assert_eq!(union_length(&[(ms(0), ms(2)), (ms(1), ms(3)), (ms(5), ms(6))]), ms(4));
        assert_eq!(union_length(&[(ms(0), ms(10)), (ms(1), ms(2)), (ms(3), ms(4))]), ms(10));
    }

    #[test]
    fn the_summary_shows_the_streams_that_ran_something_and_names_the_others() {
        let busy = |s: u32, name: &str, instructions: usize| StreamBusy {
            stream: StreamId(s),
            name: name.into(),
            instructions,
            busy: ms(instructions as u64),
        };
        let summary = Summary {
            span: ms(10),
            streams: vec![busy(0, "cpu:0", 4), busy(1, "cpu:0:collective", 0), busy(2, "mock:0:compute", 2)],
        };
        let text = summary.to_string();
        let rows: Vec<&str> = text.lines().skip(1).take_while(|l| !l.starts_with("span")).collect();
        assert_eq!(rows.len(), 2, "{text}");
        assert!(rows.iter().all(|r| !r.starts_with("cpu:0:collective")), "{text}");
        assert!(text.ends_with("not shown, having run nothing: cpu:0:collective"), "{text}");
        // Every stream ran something: no such line.
        let all = Summary { streams: vec![busy(0, "cpu:0", 1)], ..summary };
        assert!(!all.to_string().contains("not shown"), "{all}");
    }
}
