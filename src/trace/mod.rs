//! Instruction traces: record, parse, validate, replay and analyse.
//!
//! A trace is a line-oriented text file that lists, in program order, exactly the
//! instructions a [`VirtualMachine`](crate::VirtualMachine) received (`OpCall`,
//! `RecordEvent`, `StreamWaitEvent`, `Barrier`, `Release`, `Access`), in the order its
//! scheduler admitted them, after a version header and the declarations of the devices,
//! streams, tensors and views (tensors over another tensor's storage) they use; `after`
//! statements say where the scheduler, not a `record`/`wait`, synchronised a cross-stream
//! use (`sync`). It may end with expectations (checksums of tensors, an expected failure)
//! that a replay checks.
//! `docs/trace-format.md` has the grammar and a worked example.
//!
//! - [`Recorder`]: attach to a VM, run any program, get its trace. The VM hands every
//!   batch it receives to the recorder before splicing it into the scheduler's inbox; the
//!   recorder copies a compact description and a background thread formats and writes it,
//!   with an `after` wherever builders open at once left a use unsynchronised in the order
//!   the scheduler admitted it, so that every recording validates and replays as recorded.
//! - [`parse_str`] / [`load`]: text to [`Trace`], with every syntax problem located.
//! - [`Progress`]: how far a load, validation or replay has got (`load_with`,
//!   `validate_with`, `replay_with`), and the flag that stops it early.
//! - [`validate()`]: every semantic problem (unknown ops, undeclared or released tensors,
//!   shape and dtype errors through the kernels' `infer`, cross-stream uses without
//!   synchronisation, events waited on before they are recorded), each with line and column.
//! - [`replay()`]: run a trace, as recorded or with the synchronisation derived anew
//!   (`resync`), on the recorded device layout or another one, and check its expectations.
//! - [`analyze()`]: dependency-graph statistics (per-stream counts, critical path,
//!   available parallelism) and the graph, condensed for a person to read, with a DOT
//!   export of capped size.

mod analyze;
mod format;
mod parse;
mod progress;
mod record;
mod replay;
mod sidecar;
mod sync;
mod validate;

use std::fmt;

pub use analyze::{analyze, Analysis, Dot, DotLimits, EdgeKind, Graph, GraphEdge, GraphNode};
pub use format::{
    checksum, write_stmt, AccessKind, DTypeCount, Data, DeviceKind, FailureKind, Line, Pos, Ref, Stmt, Trace,
    TraceDevice, INLINE_LIMIT, MAGIC, VERSION,
};
pub use parse::{parse_str, parse_str_with};
pub use progress::{Phase, Progress};
pub use record::{RecordSummary, Recorder};
pub use replay::{replay, replay_with, DeviceMap, ReadResult, ReplayOptions, ReplayReport};
pub use validate::{validate, validate_with, ValidateOptions, MAX_MOCK_DEVICES};

/// A problem at a place in a trace file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    /// The file.
    pub file: String,
    /// 1-based line.
    pub line: u32,
    /// 1-based column.
    pub col: u32,
    /// What is wrong, and what was expected.
    pub message: String,
}

impl fmt::Display for Diagnostic {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}: {}", self.file, self.line, self.col, self.message)
    }
}

/// Everything that can go wrong reading, recording or replaying a trace.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TraceError {
    /// A file could not be read or written.
    #[error("{path}: {message}")]
    Io {
        /// The file.
        path: String,
        /// The operating system's message.
        message: String,
    },
    /// The trace has syntax or consistency problems; each names its line and column.
    #[error("{}", problems(diagnostics))]
    Invalid {
        /// Every problem found.
        diagnostics: Vec<Diagnostic>,
    },
    /// The VM refused or failed a statement during replay.
    #[error("{}:{}:{}: {error}", at.file, at.line, at.col)]
    Vm {
        /// The statement.
        at: Diagnostic,
        /// The VM's error.
        error: Box<crate::Error>,
    },
    /// A tensor's bytes after replay differ from the trace's `expect`.
    #[error("{}:{}:{}: tensor t{tensor}: checksum 0x{found:016x}, but the trace expects 0x{expected:016x}", at.file, at.line, at.col)]
    Mismatch {
        /// The `expect` statement.
        at: Diagnostic,
        /// The tensor.
        tensor: u32,
        /// The checksum the trace states.
        expected: u64,
        /// The checksum of the replayed bytes.
        found: u64,
    },
    /// A tensor after replay is off the reference replay by more than the tolerance
    /// ([`ReplayOptions::tolerance`](crate::trace::ReplayOptions::tolerance)).
    #[error("{}:{}:{}: tensor t{tensor}: element {index} is {found}, the reference replay on cpu:0 gives {expected} (beyond the relative tolerance {rel} of the tensor's largest magnitude)", at.file, at.line, at.col)]
    OutOfTolerance {
        /// The `expect` statement.
        at: Diagnostic,
        /// The tensor.
        tensor: u32,
        /// The first element off.
        index: usize,
        /// Its value in this replay.
        found: f64,
        /// Its value in the reference replay.
        expected: f64,
        /// The relative tolerance.
        rel: f64,
    },
    /// The trace states an error that the replay did not produce.
    #[error("{at}: the trace expects this failure, but the replay did not fail that way{}", seen(observed))]
    MissingFailure {
        /// The `expect error` statement.
        at: Diagnostic,
        /// The failures the replay did produce.
        observed: Vec<String>,
    },
    /// A device the trace needs is not available in this build or on this machine.
    #[error("device {device} is not available: {reason}")]
    DeviceUnavailable {
        /// The device (`cuda:0`) or device type (`cuda`).
        device: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// The background writer of a recording failed.
    #[error("recording to {path} failed: {message}")]
    Recording {
        /// The trace file.
        path: String,
        /// What failed.
        message: String,
    },
    /// The timeline of a replay could not be taken.
    #[error("profiling the replay: {0}")]
    Profile(String),
    /// The operation stopped because its [`Progress`] asked it to (the command line's
    /// Ctrl-C) before it had anything to report.
    #[error("interrupted")]
    Interrupted,
}

fn problems(d: &[Diagnostic]) -> String {
    let mut s = format!("{} problem(s):", d.len());
    for p in d {
        s.push_str("\n  ");
        s.push_str(&p.to_string());
    }
    s
}

fn seen(observed: &[String]) -> String {
    if observed.is_empty() {
        " (it ran without failures)".into()
    } else {
        format!(" (failures seen: {})", observed.join("; "))
    }
}

impl TraceError {
    pub(crate) fn io(path: &std::path::Path, e: std::io::Error) -> Self {
        TraceError::Io { path: path.display().to_string(), message: e.to_string() }
    }
}

/// Read and parse a trace file; any syntax problem is a [`TraceError::Invalid`] listing
/// every one of them.
pub fn load(path: &std::path::Path) -> Result<Trace, TraceError> {
    load_with(path, progress::none())
}

/// [`load`], counting the bytes parsed in `progress` and stopping with
/// [`TraceError::Interrupted`] once `progress` asks for a stop.
pub fn load_with(path: &std::path::Path, progress: &Progress) -> Result<Trace, TraceError> {
    let bytes = std::fs::read(path).map_err(|e| TraceError::io(path, e))?;
    let file = path.display().to_string();
    let text = match String::from_utf8(bytes) {
        Ok(t) => t,
        Err(e) => {
            // `valid_up_to` is a length within the bytes.
            let valid = &e.as_bytes()[..e.utf8_error().valid_up_to()];
            let line = parse::place(valid.iter().filter(|&&b| b == b'\n').count());
            let col = parse::place(valid.iter().rev().take_while(|&&b| b != b'\n').count());
            let message = "the trace is not UTF-8 text".to_string();
            return Err(TraceError::Invalid { diagnostics: vec![Diagnostic { file, line, col, message }] });
        }
    };
    let (mut trace, diagnostics) = parse_str_with(&file, &text, progress)?;
    if !diagnostics.is_empty() {
        return Err(TraceError::Invalid { diagnostics });
    }
    trace.dir = path.parent().map(|p| p.to_path_buf()).unwrap_or_default();
    Ok(trace)
}
