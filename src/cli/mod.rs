//! What the `eagervm` command line does, as functions: run or record a built-in program
//! (from the one registry, [`crate::programs`]), and the errors every command reports. The
//! binary (`src/bin/eagervm.rs`) parses the arguments and prints; `docs/cli.md` describes
//! each command.
//!
//! Compiled only with the `cli` cargo feature (on by default), like the binary and
//! [`crate::bench`]: a library user who turns default features off builds none of it.

pub mod dp;
pub mod graph;
pub mod interrupt;
pub mod plot;
pub mod progress;
pub mod summary;

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
    /// An `EAGERVM_*` variable is set to a value the library cannot use.
    #[error(transparent)]
    Env(#[from] crate::vm::EnvError),
    /// An output file named on the command line cannot be written (checked before any work,
    /// [`check_output`]).
    #[error("{option} {path}: {why}")]
    Output {
        /// The option that names it (`--profile`).
        option: String,
        /// The path given.
        path: String,
        /// Why it cannot be written.
        why: String,
    },
    /// The work ran and failed its own check (a program's, or a file that is not what it
    /// must be).
    #[error("{0}")]
    Failed(String),
    /// Stopped by Ctrl-C; what it did has been reported.
    #[error("interrupted by Ctrl-C (SIGINT)")]
    Interrupted,
    /// A graph could not be rendered or written (`eagervm analyze`).
    #[error(transparent)]
    Render(#[from] graph::RenderError),
    /// A plot could not be drawn or written (`eagervm plot`).
    #[error(transparent)]
    Plot(#[from] plot::PlotError),
}

/// The exit statuses of the `eagervm` command (`docs/cli.md`, "Exit status").
pub mod exit {
    /// Success.
    pub const OK: u8 = 0;
    /// The work failed, or a file could not be read or written.
    pub const FAILURE: u8 = 1;
    /// The command line or the environment is wrong; nothing ran. (clap exits with it too.)
    pub const USAGE: u8 = 2;
    /// Stopped by Ctrl-C (128 + SIGINT, as a shell reports a process the signal killed).
    pub const INTERRUPTED: u8 = 130;
}

impl CliError {
    /// The exit status this error ends the command with ([`exit`]).
    pub fn exit_code(&self) -> u8 {
        match self {
            CliError::Usage(_) | CliError::Env(_) => exit::USAGE,
            CliError::Interrupted | CliError::Trace(TraceError::Interrupted) => exit::INTERRUPTED,
            CliError::Trace(_)
            | CliError::Program { .. }
            | CliError::UnknownProgram { .. }
            | CliError::Io(_)
            | CliError::Output { .. }
            | CliError::Render(_)
            | CliError::Plot(_)
            | CliError::Failed(_) => exit::FAILURE,
        }
    }
}

/// Check, before any work, that `path` (named by `option`) can be written: not empty, not
/// a directory, in a directory that exists, and openable for writing (a file that does not
/// exist yet is created to check, then removed; an existing one is opened, not truncated).
pub fn check_output(path: &Path, option: &str) -> Result<(), CliError> {
    let bad = |why: String| {
        Err(CliError::Output { option: option.to_string(), path: path.display().to_string(), why })
    };
    if path.as_os_str().is_empty() {
        return bad("an empty path".into());
    }
    if path.is_dir() {
        return bad("is a directory; give a file name".into());
    }
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    if !parent.is_dir() {
        return bad(format!("the directory {} does not exist", parent.display()));
    }
    let existed = path.symlink_metadata().is_ok();
    match std::fs::OpenOptions::new().write(true).create(true).truncate(false).open(path) {
        Ok(_) => {
            if !existed {
                let _ = std::fs::remove_file(path);
            }
            Ok(())
        }
        Err(e) => bad(format!("cannot be written: {e}")),
    }
}

/// The VM configuration from the environment, strictly ([`Config::try_from_env`]): a bad
/// `EAGERVM_*` value is [`CliError::Env`].
pub fn config_from_env() -> Result<Config, CliError> {
    Ok(Config::try_from_env()?)
}

/// `EAGERVM_*` variables that the test suite and the benchmarks read (`docs/testing.md`,
/// `docs/performance.md`), not the library: set, they are not misspellings.
pub const TOOL_VARS: &[&str] = &[
    "EAGERVM_BIN",
    "EAGERVM_FUZZ_CASES",
    "EAGERVM_FUZZ_TIMEOUT_S",
    "EAGERVM_MPI_MAX_BYTES",
    "EAGERVM_MPI_MAX_SLEEP_US",
    "EAGERVM_MPI_RANKS",
    "EAGERVM_MPI_YIELD_US",
    "EAGERVM_NCCL_DP_STEPS",
    "EAGERVM_NCCL_JSON",
    "EAGERVM_NCCL_MAX_BYTES",
    "EAGERVM_NCCL_ROUNDS",
    "EAGERVM_SOAK_INSTRUCTIONS",
    "EAGERVM_TEST_ALONE",
];

/// A warning for each `EAGERVM_*` variable set in this process that nothing reads (neither
/// the library, [`crate::vm::env::VARS`], nor the tools, [`TOOL_VARS`]), with the closest
/// name the library reads where one is close (a typo).
pub fn unknown_env_vars() -> Vec<String> {
    let mut out = Vec::new();
    for (name, _) in std::env::vars_os() {
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("EAGERVM_") || crate::vm::env::VARS.contains(&name) || TOOL_VARS.contains(&name)
        {
            continue;
        }
        let near = crate::vm::env::VARS
            .iter()
            .map(|v| (strsim::levenshtein(name, v), *v))
            .min()
            .filter(|&(d, _)| d <= name.len() / 4);
        out.push(match near {
            Some((_, v)) => format!("{name} is not a variable eagervm reads (did you mean {v}?)"),
            None => format!("{name} is not a variable eagervm reads (docs/tuning.md lists them)"),
        });
    }
    out.sort();
    out
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
/// read, [`CliError::Failed`] if it is not a flight dump.
pub fn read_flight_dump(path: &Path) -> Result<String, CliError> {
    let text = std::fs::read_to_string(path).map_err(|e| CliError::Io(format!("{}: {e}", path.display())))?;
    if !crate::vm::flight::FlightRecord::is_dump(&text) {
        return Err(CliError::Failed(format!(
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
    let (out, synced) = progress::with_program_spinner(&vm, p.name(), || (p.run(&vm), vm.sync()));
    let out = out.map_err(|error| CliError::Program { program: p.name().into(), error })?;
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
    let result = progress::with_program_spinner(&vm, p.name(), || p.run(&vm));
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
