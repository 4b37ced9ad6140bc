//! The `eagervm` command line: run, record, replay, validate and analyse instruction
//! traces and built-in programs; the demo; the throughput benchmark. `docs/cli.md` describes
//! every command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use eagervm::bench;
use eagervm::cli::progress::ProgressView;
use eagervm::cli::{self, CliError};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::profile::Profile;
use eagervm::trace::{self, DeviceMap, Progress, ReplayOptions, ReplayReport, Trace, ValidateOptions};

/// `println!` that ignores a closed standard output (`eagervm ... | head`) instead of
/// panicking.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

/// The `analyze` and `plot` commands.
#[path = "eagervm/pictures.rs"]
mod pictures;

use pictures::{analyze, plot, AnalyzeArgs, PlotCommand};

/// eagervm: an eager-execution virtual machine for tensor programs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

/// How a trace is replayed (shared by `run FILE` and `replay`).
#[derive(clap::Args, Clone)]
struct ReplayArgs {
    /// Drop the recorded RecordEvent/StreamWaitEvent and derive synchronisation anew (needed
    /// to replay on another device layout).
    #[arg(long)]
    resync: bool,
    /// Where the trace's devices run: `recorded` (as named in the trace), `cpu` (all on
    /// cpu:0), `mock` (non-host devices on mock devices) or `cuda`.
    #[arg(long, default_value = "recorded")]
    device: DeviceMap,
    /// Write a Chrome/Perfetto timeline of the run to this file (open it in
    /// ui.perfetto.dev or chrome://tracing).
    #[arg(long, value_name = "OUT.json")]
    profile: Option<PathBuf>,
    /// Print the op table: per op and stream, count, total, mean, min and max time and the
    /// share of the run, sorted by total time.
    #[arg(long)]
    profile_summary: bool,
    /// Check the trace's `expect`ed tensors against a replay of it on cpu:0 within this
    /// relative tolerance (of each tensor's largest magnitude) instead of bit for bit, for
    /// devices whose kernels round differently (cuBLAS on cuda), e.g. `1e-4`: a finite
    /// number, 0 or more.
    #[arg(long, value_name = "REL", value_parser = parse_tolerance, allow_hyphen_values = true)]
    tolerance: Option<f64>,
    /// The most bytes one tensor may hold (default: EAGERVM_MAX_TENSOR_BYTES, else half the
    /// machine's memory); the trace is refused before it runs if it declares a larger one.
    #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
    max_tensor_bytes: Option<u64>,
}

/// `--tolerance`: a finite relative tolerance, 0 or more (a negative or NaN one would pass
/// or fail every tensor whatever its values).
fn parse_tolerance(s: &str) -> Result<f64, String> {
    let v: f64 = s.trim().parse().map_err(|e| format!("`{s}` is not a number ({e})"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!("`{s}`: a relative tolerance is a finite number, 0 or more (e.g. 1e-4)"));
    }
    Ok(v)
}

impl ReplayArgs {
    /// The VM configuration: the environment's (read strictly), with this command line's cap.
    fn config(&self) -> Result<Config, CliError> {
        let mut c = cli::config_from_env()?;
        if let Some(n) = self.max_tensor_bytes {
            c.max_tensor_bytes = n;
        }
        Ok(c)
    }

    /// The checks made before any work: the timeline's file can be written, and the mode
    /// can take one (synchronous mode has no scheduler thread, whose observer builds it).
    fn preflight(&self, config: &Config) -> Result<(), CliError> {
        let Some(out) = &self.profile else { return Ok(()) };
        if config.synchronous {
            return Err(CliError::Usage(
                "--profile needs the scheduler thread's timeline, and synchronous mode (EAGERVM_SYNC=1) \
                 has no scheduler thread: drop one of them"
                    .into(),
            ));
        }
        cli::check_output(out, "--profile")
    }
}

/// The options of `run mlp-dp` (data-parallel training of the MLP).
#[derive(clap::Args, Clone)]
struct DpArgs {
    /// mlp-dp: ranks, one mock device each (default 2).
    #[arg(long, value_name = "N")]
    ranks: Option<usize>,
    /// mlp-dp: the collective backend: `mock` (every rank in this process), `mpi` (one rank
    /// per process under mpirun) or `nccl` (one GPU per process, torchrun's variables);
    /// default: what the launcher sets (mpirun: `mpi`; torchrun: `nccl`), else `mock`.
    #[arg(long, value_name = "KIND")]
    backend: Option<cli::dp::DpBackend>,
    /// mlp-dp: training steps (default 60).
    #[arg(long, value_name = "N")]
    steps: Option<usize>,
    /// mlp-dp: also measure the step time against one rank on the same global batch, and
    /// against buckets reduced after the backward pass (median of 5 runs each).
    #[arg(long)]
    compare: bool,
}

impl DpArgs {
    fn given(&self) -> bool {
        self.ranks.is_some() || self.backend.is_some() || self.steps.is_some() || self.compare
    }
}

#[derive(Subcommand)]
enum Command {
    /// Run a short program on the CPU and a mock asynchronous device, printing what ran.
    Demo,
    /// Run a built-in program (see `eagervm programs`) or replay a trace file.
    Run {
        /// A built-in program's name, `mlp-dp`, or a trace file.
        target: String,
        #[command(flatten)]
        replay: ReplayArgs,
        #[command(flatten)]
        dp: DpArgs,
    },
    /// Run a built-in program with a recorder attached and write its trace.
    Record {
        /// The built-in program (see `eagervm programs`).
        program: String,
        /// The trace file to write (large host writes go to FILE.bin beside it).
        #[arg(short, long)]
        output: PathBuf,
        /// Then measure what recording costs: run the program N more times with and N
        /// times without a recorder, alternating, and report the median wall times.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
        overhead: Option<u64>,
    },
    /// Replay a trace and check its expected checksums and failures.
    Replay {
        /// The trace file.
        file: PathBuf,
        #[command(flatten)]
        replay: ReplayArgs,
    },
    /// Check a trace without running it; report every problem with its line and column.
    Validate {
        /// The trace file.
        file: PathBuf,
        /// Do not require record/wait (or after) before cross-stream uses (for `replay --resync`).
        #[arg(long)]
        resync: bool,
        /// The most bytes one tensor may hold (default: EAGERVM_MAX_TENSOR_BYTES, else half
        /// the machine's memory), as in a replay.
        #[arg(long, value_name = "BYTES", value_parser = clap::value_parser!(u64).range(1..))]
        max_tensor_bytes: Option<u64>,
    },
    /// Print dependency-graph statistics of a trace; draw its graph as DOT or SVG.
    Analyze {
        /// The trace file.
        file: PathBuf,
        #[command(flatten)]
        graph: AnalyzeArgs,
    },
    /// Draw a picture (SVG or PNG): the MLP's loss curve, busy time per stream, benchmark results.
    Plot {
        #[command(subcommand)]
        what: PlotCommand,
    },
    /// List the built-in programs.
    Programs,
    /// Print a flight record that the watchdog wrote (checked to be one).
    Flight {
        /// The dump file (`EAGERVM_FLIGHT_DUMP`, default `<temp dir>/eagervm-flight-<pid>.txt`).
        file: PathBuf,
    },
    /// Measure the VM: W1-W4 (no-ops against a bare pipeline and a floor), W5-W9 (a DAG
    /// across streams, the allocating call, the eager front end, a round trip) and the MLP
    /// step of `run mlp` at 64x8x32 and 1024x1024x1024.
    Bench {
        /// Instructions per workload (at least 1; `10^6` and `1e6` are accepted). W9 runs
        /// n/100 round trips, the MLP n/500 steps (n/10^5 at the large shape).
        #[arg(short, long, default_value = "1000000", value_parser = parse_count)]
        n: usize,
        /// Repetitions (the median is reported; at least 1).
        #[arg(short, long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..))]
        reps: u32,
        /// Workloads to run, e.g. `1,2`, `W3`, `5-9`, `mlp`, `mlp-large`, `all`.
        #[arg(short, long, default_value = "all", value_delimiter = ',')]
        workloads: Vec<String>,
        /// Print one JSON object per workload instead of a table (with --cuda: one per report).
        #[arg(long)]
        json: bool,
        /// Run the GPU benchmarks on cuda:0 instead (VM overhead, copy/compute overlap, MLP
        /// step, each against a plain loop, and the `run mlp` step); without a GPU they
        /// report why they skipped.
        #[arg(long, conflicts_with_all = ["n", "workloads"])]
        cuda: bool,
        /// With --cuda: kernels in the overhead chains (0 skips them; default 100000).
        #[arg(long)]
        chain: Option<usize>,
        /// With --cuda: chunks of 4 MiB in the overlap pipeline (0 skips it; default 64).
        #[arg(long)]
        chunks: Option<usize>,
        /// With --cuda: MLP steps (0 skips them; default 200).
        #[arg(long)]
        steps: Option<usize>,
        /// Run K busy loops (processes that never sleep) beside the whole measurement, and
        /// stop them at its end; the report says how many ran and the 1-minute load average
        /// at the start and end (0 to 1024; not with --cuda).
        #[arg(
            long,
            value_name = "K",
            default_value_t = 0,
            value_parser = clap::value_parser!(u16).range(0..=1024),
            conflicts_with = "cuda"
        )]
        busy: u16,
    },
}

/// A count of at least 1: `1000000`, `10^6` or `1e6`.
fn parse_count(s: &str) -> Result<usize, String> {
    let s = s.trim().replace('_', "");
    let n = if let Some((base, exp)) = s.split_once('^') {
        let (base, exp): (u64, u32) = (
            base.parse().map_err(|e| format!("`{s}`: {e}"))?,
            exp.parse().map_err(|e| format!("`{s}`: {e}"))?,
        );
        base.checked_pow(exp).ok_or_else(|| format!("`{s}` is too large"))?
    } else if let Some((mant, exp)) = s.split_once(['e', 'E']) {
        let (mant, exp): (u64, u32) = (
            mant.parse().map_err(|e| format!("`{s}`: {e}"))?,
            exp.parse().map_err(|e| format!("`{s}`: {e}"))?,
        );
        10u64
            .checked_pow(exp)
            .and_then(|p| p.checked_mul(mant))
            .ok_or_else(|| format!("`{s}` is too large"))?
    } else {
        s.parse().map_err(|e| format!("`{s}`: {e}"))?
    };
    match usize::try_from(n) {
        Ok(0) => Err("must be at least 1".into()),
        Ok(n) => Ok(n),
        Err(_) => Err(format!("`{s}` is too large")),
    }
}

/// Send the VM's `tracing` spans and events to standard error, filtered by `RUST_LOG`
/// (`docs/profiling.md`, "Logging with `RUST_LOG`"). Unset, only warnings and errors pass,
/// so normal output is unchanged; an invalid directive is skipped, not fatal. Spans print a
/// line when they close, with their busy and idle time.
fn install_subscriber() {
    use tracing_subscriber::filter::{EnvFilter, LevelFilter};
    use tracing_subscriber::fmt::format::FmtSpan;
    let filter = EnvFilter::builder().with_default_directive(LevelFilter::WARN.into()).from_env_lossy();
    let subscriber = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_span_events(FmtSpan::CLOSE)
        .with_thread_names(true)
        .with_writer(std::io::stderr)
        // Its report of a failed write is an `eprintln!`, which panics on a closed standard
        // error; a VM thread that panicked there would leave its work undone forever.
        .log_internal_errors(false)
        .finish();
    // Fails only if a subscriber is already installed, which nothing here does.
    let _ = tracing::subscriber::set_global_default(subscriber);
}

fn main() -> ExitCode {
    install_subscriber();
    let cli = Cli::parse();
    let command = cli.command.unwrap_or(Command::Demo);
    let r = check_environment(&command).and_then(|()| dispatch(command));
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Not `eprintln!`, which panics when standard error is a closed pipe.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "eagervm: error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// Before any work: warn of `EAGERVM_*` variables that nothing reads (a misspelling), and
/// refuse a bad value of one the library reads, for every command that starts a VM or
/// reads its configuration (`docs/cli.md`, "Before the work").
fn check_environment(command: &Command) -> Result<(), CliError> {
    for w in cli::unknown_env_vars() {
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), "eagervm: warning: {w}");
    }
    match command {
        Command::Programs | Command::Flight { .. } | Command::Analyze { .. } => Ok(()),
        _ => cli::config_from_env().map(drop),
    }
}

fn dispatch(command: Command) -> Result<(), CliError> {
    match command {
        Command::Demo => demo().map_err(|error| CliError::Program { program: "demo".into(), error }),
        Command::Bench { cuda: true, reps, chain, chunks, steps, json, .. } => {
            let d = bench::cuda::CudaBenchOptions::default();
            let opts = bench::cuda::CudaBenchOptions {
                chain: chain.unwrap_or(d.chain),
                chunks: chunks.unwrap_or(d.chunks),
                steps: steps.unwrap_or(d.steps),
                ..d
            };
            run_cuda_bench(&opts, reps, json)
                .map_err(|error| CliError::Program { program: "bench --cuda".into(), error })
        }
        Command::Bench { chain, chunks, steps, .. }
            if chain.is_some() || chunks.is_some() || steps.is_some() =>
        {
            use clap::CommandFactory as _;
            let given: Vec<&str> = [("--chain", chain), ("--chunks", chunks), ("--steps", steps)]
                .into_iter()
                .filter_map(|(flag, v)| v.map(|_| flag))
                .collect();
            let mut cmd = Cli::command();
            // Cannot fail: `bench` is one of the subcommands.
            let bench = cmd.find_subcommand_mut("bench").expect("the bench subcommand");
            bench
                .error(
                    clap::error::ErrorKind::ArgumentConflict,
                    format!("{} apply only to the GPU benchmarks: add --cuda", given.join(", ")),
                )
                .exit()
        }
        Command::Bench { n, reps, workloads, json, busy, .. } => {
            run_bench(&workloads, &bench::report::Options { n, reps, json, busy: busy.into() })
        }
        Command::Run { target, replay, dp } if target == "mlp-dp" => run_dp(&replay, &dp),
        Command::Run { dp, .. } if dp.given() => {
            Err(CliError::Usage("--ranks, --backend, --steps and --compare apply to `mlp-dp`".into()))
        }
        Command::Run { target, replay, .. } => run(&target, &replay),
        Command::Record { program, output, overhead } => {
            cli::check_output(&output, "--output")?;
            record(&program, &output, overhead.map(|n| n as usize))
        }
        Command::Replay { file, replay } => replay_file(&file, &replay),
        Command::Validate { file, resync, max_tensor_bytes } => validate(&file, resync, max_tensor_bytes),
        Command::Analyze { file, graph } => {
            for (path, option) in [(&graph.dot, "--dot"), (&graph.svg, "--svg")] {
                if let Some(p) = path {
                    cli::check_output(p, option)?;
                }
            }
            analyze(&file, &graph)
        }
        Command::Plot { what } => plot(what),
        Command::Flight { file } => cli::read_flight_dump(&file).map(|text| say!("{}", text.trim_end())),
        Command::Programs => {
            for p in eagervm::programs::all() {
                say!("{:<10} {}", p.name(), p.about());
            }
            say!("{:<10} {}", "mlp-dp", MLP_DP_ABOUT);
            Ok(())
        }
    }
}

/// What `eagervm programs` says of `mlp-dp`.
const MLP_DP_ABOUT: &str =
    "train the MLP data-parallel on N ranks, gradients all-reduced in buckets overlapping the backward pass";

fn run_dp(args: &ReplayArgs, dp: &DpArgs) -> Result<(), CliError> {
    if args.resync || args.device != DeviceMap::AsRecorded || args.tolerance.is_some() {
        return Err(CliError::Usage("--resync, --device and --tolerance apply to trace files".into()));
    }
    let config = args.config()?;
    args.preflight(&config)?;
    let mut opts = cli::dp::DpOptions { profile: args.profile.is_some(), ..Default::default() };
    opts.backend = dp.backend.unwrap_or_else(cli::dp::DpBackend::from_launcher);
    opts.ranks = dp.ranks.unwrap_or(opts.ranks);
    opts.train.mlp.steps = dp.steps.unwrap_or(opts.train.mlp.steps);
    let s = cli::dp::run_mlp_dp(config.clone(), &opts)?;
    if s.report.backend == "mock" {
        say!(
            "ran `mlp-dp` in {:.3?} on {} mock devices (one process; {:?} per launch), one rank each",
            s.wall,
            s.report.local.len(),
            s.launch_delay
        );
    } else {
        say!("ran `mlp-dp` in {:.3?} on the {} backend", s.wall, s.report.backend);
    }
    write_profile(s.profile.as_ref(), args.profile.as_deref())?;
    print_op_table(s.profile.as_ref(), args.profile_summary);
    if let Some(o) = &s.overlap {
        say!("  overlap: {o}");
    }
    say!("{}", s.report);
    say!(
        "loss curve against one rank on the global batch: largest relative difference {:.2e} (tolerance {:e})",
        s.max_rel_diff,
        eagervm::programs::mlp_dp::LOSS_REL_TOLERANCE
    );
    if dp.compare {
        say!("{}", cli::dp::compare(config, opts.ranks, &opts.train, 5)?);
    }
    match s.ok() {
        true => Ok(()),
        false => Err(CliError::Failed("`mlp-dp` failed its own check".into())),
    }
}

fn run(target: &str, args: &ReplayArgs) -> Result<(), CliError> {
    if let Some(p) = eagervm::programs::lookup(target) {
        if args.resync || args.device != DeviceMap::AsRecorded || args.tolerance.is_some() {
            return Err(CliError::Usage(format!(
                "--resync, --device and --tolerance apply to trace files; `{target}` is a built-in program"
            )));
        }
        let config = args.config()?;
        args.preflight(&config)?;
        let s = cli::run_program(&p, config)?;
        say!("ran `{}` in {:.3?}", p.name(), s.wall);
        write_profile(s.profile.as_ref(), args.profile.as_deref())?;
        print_op_table(s.profile.as_ref(), args.profile_summary);
        // Many outputs (a training run's losses and weights): the first few and a count.
        const SHOWN: usize = 6;
        if s.outputs.len() > SHOWN {
            say!("  {} outputs; the first {SHOWN}:", s.outputs.len());
        }
        for (what, sum) in s.outputs.iter().take(SHOWN) {
            match sum {
                Ok(sum) => say!("  {what}: fnv1a64 0x{sum:016x}"),
                Err(e) => say!("  {what}: error: {e}"),
            }
        }
        let failed = s.outputs.iter().filter(|o| o.1.is_err()).count();
        if let Some(report) = &s.report {
            say!("{report}");
            say!("errors: {failed} (as the program expects: {})", if report.ok() { "yes" } else { "no" });
            return match report.ok() {
                true => Ok(()),
                false => Err(CliError::Failed(format!("`{}` failed its own check", p.name()))),
            };
        }
        say!("errors: {failed}");
        return match s.outputs.into_iter().find_map(|o| o.1.err()) {
            Some(error) => Err(CliError::Program { program: p.name().into(), error }),
            None => Ok(()),
        };
    }
    if Path::new(target).is_file() {
        return replay_file(Path::new(target), args);
    }
    // Cannot fail: `lookup` found no program of that name above.
    Err(cli::program(target).expect_err("not a program"))
}

fn record(program: &str, output: &Path, overhead: Option<usize>) -> Result<(), CliError> {
    let p = cli::program(program)?;
    let config = cli::config_from_env()?;
    let (s, wall) = cli::record_program(&p, config.clone(), output)?;
    say!(
        "recorded `{}` to {}: {} instructions, {} tensors, {} expected checksum(s) in {:.3?}",
        p.name(),
        s.path.display(),
        s.instructions,
        s.tensors,
        s.expects,
        wall
    );
    if let Some(side) = &s.sidecar {
        say!("  large host writes in {}", side.display());
    }
    if let Some(f) = &s.failure {
        say!("  the program fails on purpose; the trace expects: {f}");
    }
    if let Some(reps) = overhead {
        let o = cli::recording_overhead(&p, &config, output, reps)?;
        say!(
            "recording overhead over {} runs each: median {:.3?} without a recorder, {:.3?} with one: {:+.1}%",
            o.reps,
            o.plain,
            o.recorded,
            o.percent()
        );
    }
    Ok(())
}

/// Progress shown on standard error while `work` runs on `file` (`cli::progress`); with
/// `interruptible`, the first Ctrl-C asks `work` to stop (`cli::interrupt`).
fn with_progress<T>(
    file: &Path,
    interruptible: bool,
    work: impl FnOnce(&Progress) -> Result<T, CliError>,
) -> Result<T, CliError> {
    let progress = match interruptible {
        true => Progress::with_stop(cli::interrupt::install()?),
        false => Progress::default(),
    };
    let progress = Arc::new(progress);
    let view = ProgressView::start(Arc::clone(&progress), file.display().to_string());
    let r = work(&progress);
    drop(view);
    r
}

/// Load a trace, with a progress bar on a long one (the other commands' way in).
fn load_trace(file: &Path) -> Result<Trace, CliError> {
    with_progress(file, false, |p| Ok(trace::load_with(file, p)?))
}

fn replay_file(file: &Path, args: &ReplayArgs) -> Result<(), CliError> {
    let config = args.config()?;
    args.preflight(&config)?;
    let (t, r) = with_progress(file, true, |progress| {
        let t = trace::load_with(file, progress)?;
        // The summary's per-stream busy time comes from a timeline, which holds about 150
        // bytes per instruction until the replay ends: taken for traces up to
        // BUSY_TIME_LIMIT instructions, or on any trace with `--profile` (which also writes
        // it out).
        let profile = args.profile.is_some() || args.profile_summary || t.instructions() <= BUSY_TIME_LIMIT;
        let opts = ReplayOptions {
            resync: args.resync,
            device: args.device,
            config,
            profile,
            tolerance: args.tolerance,
        };
        let r = trace::replay_with(&t, &opts, progress);
        Ok((t, r))
    })?;
    let report = r?;
    print_replay(file, args, &report);
    if report.profile.is_none() && t.instructions() > BUSY_TIME_LIMIT {
        say!(
            "  busy time per stream: not measured on traces over {BUSY_TIME_LIMIT} instructions (memory); \
             pass --profile FILE to measure it"
        );
    }
    print_op_table(report.profile.as_ref(), args.profile_summary);
    write_timeline(report.profile.as_ref(), args.profile.as_deref())?;
    match report.interrupted {
        Some(_) => Err(CliError::Interrupted),
        None => Ok(()),
    }
}

/// Print the op table (`--profile-summary`) of a run that has a timeline.
fn print_op_table(profile: Option<&Profile>, asked: bool) {
    match (profile, asked) {
        (Some(p), true) => say!("{}", cli::summary::op_table(p)),
        (None, true) => say!("  op table: no timeline (synchronous mode has none)"),
        (_, false) => {}
    }
}

/// Replays of traces up to this many instructions measure busy time per stream by default.
const BUSY_TIME_LIMIT: usize = 1_000_000;

/// Print the per-stream busy time of a run, and write its timeline if asked to.
fn write_profile(profile: Option<&Profile>, out: Option<&Path>) -> Result<(), CliError> {
    let Some(profile) = profile else {
        if out.is_some() {
            return Err(CliError::Usage("synchronous mode (EAGERVM_SYNC=1) cannot be profiled".into()));
        }
        return Ok(());
    };
    let summary = profile.summary();
    say!("  busy time per stream, over {:.3?} of device activity:", summary.span);
    for line in summary.to_string().lines() {
        say!("    {line}");
    }
    write_timeline(Some(profile), out)
}

/// Write a run's timeline to `out`, if asked to.
fn write_timeline(profile: Option<&Profile>, out: Option<&Path>) -> Result<(), CliError> {
    let (Some(profile), Some(path)) = (profile, out) else {
        if out.is_some() {
            return Err(CliError::Usage("synchronous mode (EAGERVM_SYNC=1) cannot be profiled".into()));
        }
        return Ok(());
    };
    profile.write_chrome_json(path).map_err(|e| CliError::Io(e.to_string()))?;
    say!("  timeline written to {} (open it in ui.perfetto.dev or chrome://tracing)", path.display());
    Ok(())
}

fn print_replay(file: &Path, args: &ReplayArgs, r: &ReplayReport) {
    let mode = if args.resync { "synchronisation derived anew" } else { "as recorded" };
    if let Some(line) = r.interrupted {
        say!(
            "interrupted: stopped submitting at line {line} of {} and waited for the instructions in flight; \
             the summary and timeline below are of that part, and the trace's expectations were not checked",
            file.display()
        );
    }
    say!(
        "replayed {} ({mode}; {}): {} instructions in {:.3?}",
        file.display(),
        cli::summary::replay_devices(args.device, r),
        r.instructions,
        r.wall
    );
    say!("{}", cli::summary::replay_streams(r));
    if let Some(d) = cli::summary::dtypes(&r.dtypes) {
        say!("{d}");
    }
    say!("{}", cli::summary::replay_checks(r, args.tolerance));
    match &r.expected_failure {
        Some(f) => say!("  errors: {} (expected by the trace: {f})", r.failures.len()),
        None => say!("  errors: {}", r.failures.len()),
    }
    if let Some(p) = cli::summary::panics(r) {
        say!("{p}");
    }
}

fn validate(file: &Path, resync: bool, max_tensor_bytes: Option<u64>) -> Result<(), CliError> {
    let max_tensor_bytes = match max_tensor_bytes {
        Some(n) => n,
        None => cli::config_from_env()?.max_tensor_bytes,
    };
    let t = with_progress(file, true, |progress| {
        let t = trace::load_with(file, progress)?;
        trace::validate_with(&t, &ValidateOptions { resync, max_tensor_bytes }, progress)?;
        Ok(t)
    })?;
    say!("{}: valid ({} statements, {} instructions)", file.display(), t.lines.len(), t.instructions());
    Ok(())
}

fn run_cuda_bench(opts: &bench::cuda::CudaBenchOptions, reps: u32, json: bool) -> eagervm::Result<()> {
    if !json {
        say!(
            "eagervm bench --cuda: (a) {} one-element kernels in a chain, (b) {} chunks of {} floats, \
             (c) {} MLP steps of width {}, (d) {} steps of `run mlp` at 64x8x32 and 1024x1024x1024; \
             each figure the median of 5 runs taken in turn with its reference ((d): of 3); {reps} report(s)",
            opts.chain,
            opts.chunks,
            opts.chunk_elems,
            opts.steps,
            opts.width,
            opts.steps
        );
    }
    for _ in 0..reps.max(1) {
        let report = bench::cuda::run(opts, &Config::from_env())?;
        if json {
            say!("{}", report.to_json());
        } else {
            say!("{report}");
        }
        if report.skipped.is_some() {
            break;
        }
    }
    Ok(())
}

fn run_bench(workloads: &[String], opts: &bench::report::Options) -> Result<(), CliError> {
    let selection = bench::report::Selection::parse(workloads).map_err(CliError::Usage)?;
    let progress = bench::Progress::stderr();
    let mut out = std::io::stdout();
    let checked = bench::report::run(&selection, opts, &Config::from_env(), &progress, &mut out)
        .map_err(|error| CliError::Program { program: "bench".into(), error })?;
    match checked {
        true => Ok(()),
        false => Err(CliError::Usage("a workload's result differed from its sequential reference".into())),
    }
}

fn demo() -> eagervm::Result<()> {
    let mut mock = MockConfig::from_env();
    if mock.launch_delay.is_zero() {
        mock.launch_delay = std::time::Duration::from_micros(200);
    }
    let delay = mock.launch_delay;
    let vm = VirtualMachine::new(Config::from_env().with_mock_devices(1, mock))?;
    let gpu = DeviceId::mock(0);
    say!("eagervm demo: devices cpu:0 and {gpu} (a mock asynchronous device: host threads, {delay:?} per launch)");
    say!("streams:");
    for (id, _, _, name) in vm.streams() {
        say!("  #{} {}", id.index(), name);
    }
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let g = vm.compute_stream(gpu)?;
    let h2d = vm.stream(gpu, StreamType::H2D)?;
    // Cannot fail: every VM registers the built-in ops.
    let [matmul, add, relu, sum, copy, scale, fail] =
        ["matmul", "add", "relu", "sum", "copy", "scale", "fail"].map(|n| vm.op(n).expect("built-in op"));

    let x = vm.from_slice(&[1.0f32, -2.0, 3.0, -4.0, 5.0, -6.0], &[2, 3], DeviceId::CPU)?;
    let w = vm.from_slice(&[0.5f32, -1.0, 1.5, 2.0, -0.5, 1.0], &[3, 2], DeviceId::CPU)?;
    say!("\nx = {:?} (2x3, cpu:0)\nw = {:?} (3x2, cpu:0)", x.to_vec::<f32>()?, w.to_vec::<f32>()?);

    let t0 = std::time::Instant::now();
    let (y, total) = vm.run(|b| -> eagervm::Result<_> {
        let xw = b.call(matmul, &[&x, &w], Attrs::default(), cpu)?;
        say!("  cpu:0         matmul(x, w)        -> {:?}", xw.shape());
        let xw_dev = vm.empty(xw.shape(), DType::F32, gpu)?;
        b.call_into(copy, &[&xw], &[&xw_dev], Attrs::default(), h2d)?;
        say!("  {gpu}:h2d    copy to device       (waits for the cpu matmul)");
        let r = b.call(relu, &[&xw_dev], Attrs::default(), g)?;
        say!("  {gpu}:compute relu                (device-side wait on the h2d copy)");
        let s = b.call(scale, &[&r], Attrs::scalar(10.0), g)?;
        let y = b.call(add, &[&s, &xw_dev], Attrs::default(), g)?;
        say!("  {gpu}:compute scale x10, add");
        let total = b.call(sum, &[&y], Attrs::default(), g)?;
        say!("  {gpu}:compute sum");
        Ok((y, total))
    })?;
    say!("submitted in {:?}; the caller did not wait for the device", t0.elapsed());
    say!("y = 10*relu(x@w) + x@w = {:?}", y.to_vec::<f32>()?);
    say!("sum(y) = {:?} (read back through {gpu}:d2h)", total.to_vec::<f32>()?);

    say!("\nerrors are values: a kernel that fails poisons what it writes, and what reads it");
    let bad = vm.run(|b| -> eagervm::Result<_> {
        let f = vm.empty(&[2], DType::F32, DeviceId::CPU)?;
        b.call_into(fail, &[], &[&f], Attrs::scalar(7.0), cpu)?;
        b.call(relu, &[&f], Attrs::default(), cpu)
    })?;
    let shown = |r: eagervm::Result<String>| r.map_or_else(|e| e.to_string(), |v| format!("{v} (no error)"));
    say!("  relu(failed) -> {}", shown(bad.to_vec::<f32>().map(|v| format!("{v:?}"))));
    say!("  sync         -> {}", shown(vm.sync().map(|()| "ok".into())));
    say!("  x is untouched: {:?}", x.to_vec::<f32>()?);
    vm.sync()?;
    say!("\nnext: `eagervm bench` measures throughput; `cargo test` runs the tests");
    Ok(())
}
