//! What the `eagervm` command line does, as functions: run or record a built-in program
//! (from the one registry, [`crate::programs`]), and the errors every command reports. The
//! binary (`src/bin/eagervm.rs`) parses the arguments and prints; `docs/cli.md` describes
//! each command.
//!
//! Compiled only with the `cli` cargo feature (on by default), like the binary and
//! [`crate::bench`]: a library user who turns default features off builds none of it.

pub mod dp;
pub mod graph;
pub mod plot;

use std::path::Path;
use std::time::{Duration, Instant};

use crate::framework::Tensor;
use crate::programs::{all, lookup, Builtin};
use crate::trace::{checksum, RecordSummary, Recorder, TraceError};
use crate::{Config, VirtualMachine};

/// Why a command failed.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    /// A trace could not be read, recorded, validated or replayed (names file and line).
    #[error(transparent)]
    Trace(#[from] TraceError),
    /// The VM failed while running a built-in program.
    #[error("program `{program}`: {error}")]
    Program {
        /// The program.
        program: String,
        /// What failed.
        error: crate::Error,
    },
    /// No built-in program has that name, and no file does either.
    #[error("`{name}` is neither a built-in program ({known}) nor a trace file")]
    UnknownProgram {
        /// The name given.
        name: String,
        /// The built-in programs.
        known: String,
    },
    /// A file could not be written or a tool could not be run.
    #[error("{0}")]
    Io(String),
    /// Options that do not fit together.
    #[error("{0}")]
    Usage(String),
    /// A graph could not be rendered or written (`eagervm analyze`).
    #[error(transparent)]
    Render(#[from] graph::RenderError),
    /// A plot could not be drawn or written (`eagervm plot`).
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
}

/// The outcome of running a built-in program.
#[derive(Debug)]
pub struct RunSummary {
    /// Wall time from the start of the program to the end of its final sync.
    pub wall: Duration,
    /// Per output: its shape and dtype, and the FNV-1a of its bytes or its error.
    pub outputs: Vec<(String, Result<u64, crate::Error>)>,
    /// The report of a self-checking program.
    pub report: Option<crate::programs::Report>,
    /// The run's timeline (per-stream busy time; absent in synchronous mode).
    pub profile: Option<crate::profile::Profile>,
}

/// The flight record in `path` (a dump the watchdog wrote, `docs/distributed.md`,
/// "Failures and the flight recorder"), checked to be one: [`CliError::Io`] if it cannot be
/// read, [`CliError::Usage`] if it is not a flight dump.
pub fn read_flight_dump(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
    if !crate::vm::flight::FlightRecord::is_dump(&text) {
        return Err(CliError::Usage(format!(
            "{}: not a flight record (its first line is not `{}`)",
            path.display(),
            crate::vm::flight::FlightRecord::HEADER
        )));
    }
    Ok(text)
}

/// The built-in program called `name`, or [`CliError::UnknownProgram`].
pub fn program(name: &str) -> Result<Builtin, CliError> {
    lookup(name).ok_or_else(|| CliError::UnknownProgram {
        name: name.to_string(),
        known: all().map(|p| p.name()).collect::<Vec<_>>().join(", "),
    })
}

fn vm_for(p: &Builtin, mut config: Config) -> Result<VirtualMachine, CliError> {
    config.mock_devices = config.mock_devices.max(p.mock_devices());
    VirtualMachine::new(config).map_err(|error| CliError::Program { program: p.name().into(), error })
}

fn describe(t: &Tensor) -> String {
    format!("t{} {} on {}", t.id(), t.meta().describe(), t.device())
}

/// A tensor's bytes, whatever its dtype: the host read's own copy, with no second one.
fn bytes_of(t: &Tensor) -> crate::Result<Vec<u8>> {
    t.read_bytes()
}

/// Run the built-in program `p` on a VM with `config` (plus the mock devices it needs).
pub fn run_program(p: &Builtin, config: Config) -> Result<RunSummary, CliError> {
    let vm = vm_for(p, config)?;
    let profiling = !vm.config().synchronous;
    if profiling {
        vm.start_profiling().map_err(|e| TraceError::Profile(e.to_string()))?;
    }
    let t0 = Instant::now();
    let out = p.run(&vm).map_err(|error| CliError::Program { program: p.name().into(), error })?;
    let synced = vm.sync();
    let wall = t0.elapsed();
    let profile = match profiling {
        true => Some(vm.stop_profiling().map_err(|e| TraceError::Profile(e.to_string()))?),
        false => None,
    };
    let outputs: Vec<_> =
        out.tensors.iter().map(|t| (describe(t), bytes_of(t).map(|b| checksum(&b)))).collect();
    if let Err(error) = synced {
        return Err(CliError::Program { program: p.name().into(), error });
    }
    Ok(RunSummary { wall, outputs, report: out.report, profile })
}

/// Run the built-in program `p` with a [`Recorder`] attached, writing its trace to `path`
/// (with the checksums of its outputs, or the failure it ends with). Returns what was
/// written and the wall time of the recorded run.
pub fn record_program(
    p: &Builtin,
    config: Config,
    path: &Path,
) -> Result<(RecordSummary, Duration), CliError> {
    let vm = vm_for(p, config)?;
    let rec = Recorder::start(&vm, path)?;
    let t0 = Instant::now();
    let result = p.run(&vm);
    let (outputs, error) = match result {
        Ok(out) => (out.tensors, None),
        Err(e) => (Vec::new(), Some(e)),
    };
    let refs: Vec<&Tensor> = outputs.iter().collect();
    let summary = rec.finish(&vm, &refs, error.as_ref())?;
    let wall = t0.elapsed();
    match (error, &summary.failure) {
        (Some(error), None) => Err(CliError::Program { program: p.name().into(), error }),
        _ => Ok((summary, wall)),
    }
}

/// The cost of recording a program, measured by running it alternately with and without a
/// recorder.
#[derive(Debug, Clone)]
pub struct Overhead {
    /// Runs of each kind.
    pub reps: usize,
    /// Median wall time without a recorder.
    pub plain: Duration,
    /// Median wall time with a recorder attached (including writing the trace out).
    pub recorded: Duration,
}

impl Overhead {
    /// `recorded / plain - 1`, in percent.
    pub fn percent(&self) -> f64 {
        (self.recorded.as_secs_f64() / self.plain.as_secs_f64() - 1.0) * 100.0
    }
}

/// Run `p` `reps` times with a recorder writing to `path` and `reps` times without,
/// alternating, each on a fresh VM whose start-up is not timed. Both kinds of run end the
/// same way: sync, then read every output.
pub fn recording_overhead(
    p: &Builtin,
    config: &Config,
    path: &Path,
    reps: usize,
) -> Result<Overhead, CliError> {
    let fail = |error| CliError::Program { program: p.name().into(), error };
    let mut times = [Vec::new(), Vec::new()];
    for i in 0..reps.max(1).saturating_mul(2) {
        let record = i % 2 == 1;
        let vm = vm_for(p, config.clone())?;
        let t0 = Instant::now();
        let rec = if record { Some(Recorder::start(&vm, path)?) } else { None };
        let outputs = p.run(&vm).map_err(fail)?.tensors;
        match rec {
            Some(rec) => {
                rec.finish(&vm, &outputs.iter().collect::<Vec<_>>(), None)?;
            }
            None => {
                vm.sync().map_err(fail)?;
                for t in &outputs {
                    bytes_of(t).map_err(fail)?;
                }
            }
        }
        times[record as usize].push(t0.elapsed());
        drop(outputs);
    }
    // Cannot fail: the loop above ran at least once of each kind.
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let recorded = median(&mut times[1]);
    Ok(Overhead { reps: reps.max(1), plain: median(&mut times[0]), recorded })
}
