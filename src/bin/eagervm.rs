//! The `eagervm` command line: run, record, replay, validate and analyse instruction
//! traces and built-in programs; the demo; the throughput benchmark. `docs/cli.md` describes
//! every command.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Parser, Subcommand};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use eagervm::bench::{self, Workload};
use eagervm::cli::{self, CliError};
use eagervm::ep::mock::MockConfig;
use eagervm::prelude::*;
use eagervm::profile::Profile;
use eagervm::trace::{self, DeviceMap, ReplayOptions, ReplayReport, ValidateOptions};

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
    /// Check the trace's `expect`ed tensors against a replay of it on cpu:0 within this
    /// relative tolerance (of each tensor's largest magnitude) instead of bit for bit, for
    /// devices whose kernels round differently (cuBLAS on cuda), e.g. `1e-4`.
    #[arg(long, value_name = "REL")]
    tolerance: Option<f64>,
    /// The most bytes one tensor may hold (default: EAGERVM_MAX_TENSOR_BYTES, else half the
    /// machine's memory); the trace is refused before it runs if it declares a larger one.
    #[arg(long, value_name = "BYTES")]
    max_tensor_bytes: Option<u64>,
}

impl ReplayArgs {
    /// The VM configuration: the environment's, with this command line's cap.
    fn config(&self) -> Config {
        let mut c = Config::from_env();
        if let Some(n) = self.max_tensor_bytes {
            c.max_tensor_bytes = n;
        }
        c
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
        #[arg(long, value_name = "N")]
        overhead: Option<usize>,
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
        #[arg(long, value_name = "BYTES")]
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
    /// Measure the VM's throughput on four no-op workloads against a bare pipeline.
    Bench {
        /// Instructions per workload.
        #[arg(short, long, default_value_t = 1_000_000)]
        n: usize,
        /// Repetitions (the median is reported).
        #[arg(short, long, default_value_t = 3)]
        reps: u32,
        /// Workloads to run, e.g. `1,2` or `W3`.
        #[arg(short, long, default_value = "1,2,3,4", value_delimiter = ',')]
        workloads: Vec<String>,
        /// Print one JSON object per workload instead of a table.
        #[arg(long)]
        json: bool,
        /// Run the GPU benchmarks on cuda:0 instead (VM overhead, copy/compute overlap, MLP
        /// step, each against a plain loop); without a GPU they report why they skipped.
        #[arg(long, conflicts_with_all = ["n", "workloads", "json"])]
        cuda: bool,
        /// With --cuda: kernels in the overhead chains (0 skips them).
        #[arg(long, requires = "cuda", default_value_t = 100_000)]
        chain: usize,
        /// With --cuda: chunks of 4 MiB in the overlap pipeline (0 skips it).
        #[arg(long, requires = "cuda", default_value_t = 64)]
        chunks: usize,
        /// With --cuda: MLP steps (0 skips them).
        #[arg(long, requires = "cuda", default_value_t = 200)]
        steps: usize,
    },
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
    let r: Result<(), CliError> = match cli.command.unwrap_or(Command::Demo) {
        Command::Demo => demo().map_err(|error| CliError::Program { program: "demo".into(), error }),
        Command::Bench { cuda: true, reps, chain, chunks, steps, .. } => {
            let opts = bench::cuda::CudaBenchOptions { chain, chunks, steps, ..Default::default() };
            run_cuda_bench(&opts, reps)
                .map_err(|error| CliError::Program { program: "bench --cuda".into(), error })
        }
        Command::Bench { n, reps, workloads, json, .. } => run_bench(n, reps, &workloads, json)
            .map_err(|error| CliError::Program { program: "bench".into(), error }),
        Command::Run { target, replay, dp } if target == "mlp-dp" => run_dp(&replay, &dp),
        Command::Run { dp, .. } if dp.given() => {
            Err(CliError::Usage("--ranks, --backend, --steps and --compare apply to `mlp-dp`".into()))
        }
        Command::Run { target, replay, .. } => run(&target, &replay),
        Command::Record { program, output, overhead } => record(&program, &output, overhead),
        Command::Replay { file, replay } => replay_file(&file, &replay),
        Command::Validate { file, resync, max_tensor_bytes } => validate(&file, resync, max_tensor_bytes),
        Command::Analyze { file, graph } => analyze(&file, &graph),
        Command::Plot { what } => plot(what),
        Command::Flight { file } => cli::read_flight_dump(&file).map(|text| say!("{}", text.trim_end())),
        Command::Programs => {
            for p in eagervm::programs::all() {
                say!("{:<10} {}", p.name(), p.about());
            }
            say!("{:<10} {}", "mlp-dp", MLP_DP_ABOUT);
            Ok(())
        }
    };
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // Not `eprintln!`, which panics when standard error is a closed pipe.
            use std::io::Write as _;
            let _ = writeln!(std::io::stderr(), "eagervm: error: {e}");
            ExitCode::FAILURE
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
    let mut opts = cli::dp::DpOptions { profile: args.profile.is_some(), ..Default::default() };
    opts.backend = dp.backend.unwrap_or_else(cli::dp::DpBackend::from_launcher);
    opts.ranks = dp.ranks.unwrap_or(opts.ranks);
    opts.train.mlp.steps = dp.steps.unwrap_or(opts.train.mlp.steps);
    let s = cli::dp::run_mlp_dp(args.config(), &opts)?;
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
        say!("{}", cli::dp::compare(args.config(), opts.ranks, &opts.train, 5)?);
    }
    match s.ok() {
        true => Ok(()),
        false => Err(CliError::Usage("`mlp-dp` failed its own check".into())),
    }
}

fn run(target: &str, args: &ReplayArgs) -> Result<(), CliError> {
    if let Some(p) = eagervm::programs::lookup(target) {
        if args.resync || args.device != DeviceMap::AsRecorded || args.tolerance.is_some() {
            return Err(CliError::Usage(format!(
                "--resync, --device and --tolerance apply to trace files; `{target}` is a built-in program"
            )));
        }
        let s = cli::run_program(&p, args.config())?;
        say!("ran `{}` in {:.3?}", p.name(), s.wall);
        write_profile(s.profile.as_ref(), args.profile.as_deref())?;
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
                false => Err(CliError::Usage(format!("`{}` failed its own check", p.name()))),
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
    let (s, wall) = cli::record_program(&p, Config::from_env(), output)?;
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
        let o = cli::recording_overhead(&p, &Config::from_env(), output, reps)?;
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

/// A progress bar that appears only once a replay has run for a second.
fn progress_bar() -> (ProgressBar, Instant) {
    let pb = ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden());
    let style = ProgressStyle::with_template(
        "{spinner} replay [{elapsed_precise}] {bar:40} {pos}/{len} instructions",
    )
    .expect("a valid template (a constant)");
    pb.set_style(style);
    (pb, Instant::now())
}

fn replay_file(file: &Path, args: &ReplayArgs) -> Result<(), CliError> {
    let t = trace::load(file)?;
    // The summary's per-stream busy time comes from a timeline, which holds about 150 bytes
    // per instruction until the replay ends: taken for traces up to BUSY_TIME_LIMIT
    // instructions, or on any trace with `--profile` (which also writes it out).
    let profile = args.profile.is_some() || t.instructions() <= BUSY_TIME_LIMIT;
    let opts = ReplayOptions {
        resync: args.resync,
        device: args.device,
        config: args.config(),
        profile,
        tolerance: args.tolerance,
    };
    let (pb, t0) = progress_bar();
    let mut shown = false;
    let r = trace::replay_with(&t, &opts, &mut |done, total| {
        if !shown && t0.elapsed() > Duration::from_secs(1) {
            pb.set_draw_target(ProgressDrawTarget::stderr());
            shown = true;
        }
        pb.set_length(total);
        pb.set_position(done);
    });
    pb.finish_and_clear();
    let report = r?;
    print_replay(file, args, &report);
    if !profile {
        say!(
            "  busy time per stream: not measured on traces over {BUSY_TIME_LIMIT} instructions (memory); \
             pass --profile FILE to measure it"
        );
    }
    write_profile(report.profile.as_ref(), args.profile.as_deref())
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
    if let Some(path) = out {
        profile.write_chrome_json(path).map_err(|e| CliError::Usage(e.to_string()))?;
        say!("  timeline written to {} (open it in ui.perfetto.dev or chrome://tracing)", path.display());
    }
    Ok(())
}

fn print_replay(file: &Path, args: &ReplayArgs, r: &ReplayReport) {
    let mode = if args.resync { "synchronisation derived anew" } else { "as recorded" };
    say!(
        "replayed {} ({mode}, devices: {}): {} instructions in {:.3?}",
        file.display(),
        args.device,
        r.instructions,
        r.wall
    );
    say!("  instructions per stream:");
    for (s, n) in &r.per_stream {
        say!("    {s:<16} {n}");
    }
    match args.tolerance {
        None => say!("  host reads: {}; expected checksums matched: {}", r.reads.len(), r.checked),
        Some(rel) => say!(
            "  host reads: {}; expected tensors within {rel} of a replay on cpu:0: {}",
            r.reads.len(),
            r.checked
        ),
    }
    match &r.expected_failure {
        Some(f) => say!("  errors: {} (expected by the trace: {f})", r.failures.len()),
        None => say!("  errors: {}", r.failures.len()),
    }
}

fn validate(file: &Path, resync: bool, max_tensor_bytes: Option<u64>) -> Result<(), CliError> {
    let t = trace::load(file)?;
    let max_tensor_bytes = max_tensor_bytes.unwrap_or(Config::from_env().max_tensor_bytes);
    trace::validate(&t, &ValidateOptions { resync, max_tensor_bytes })?;
    say!("{}: valid ({} statements, {} instructions)", file.display(), t.lines.len(), t.instructions());
    Ok(())
}

fn run_cuda_bench(opts: &bench::cuda::CudaBenchOptions, reps: u32) -> eagervm::Result<()> {
    say!(
        "eagervm bench --cuda: (a) {} one-element kernels in a chain, (b) {} chunks of {} floats, \
         (c) {} MLP steps of width {}; each figure the median of 5 runs taken in turn with its reference; \
         {reps} report(s)",
        opts.chain,
        opts.chunks,
        opts.chunk_elems,
        opts.steps,
        opts.width
    );
    for _ in 0..reps.max(1) {
        let report = bench::cuda::run(opts, &Config::from_env())?;
        say!("{report}");
        if report.skipped.is_some() {
            break;
        }
    }
    Ok(())
}

fn run_bench(n: usize, reps: u32, workloads: &[String], json: bool) -> eagervm::Result<()> {
    let ws: Vec<Workload> = workloads
        .iter()
        .map(|w| Workload::parse(w).ok_or_else(|| Error::Config(format!("unknown workload `{w}` (use 1-4)"))))
        .collect::<eagervm::Result<_>>()?;
    let config = Config::from_env();
    if !json {
        say!("eagervm bench: {n} no-op instructions per workload on cpu:0, median of {reps}");
        say!(
            "{:<4} {:<15} {:>10} {:>14} {:>14} {:>7} {:>7}  {:<7} {:>6}  {}",
            "",
            "workload",
            "push ns/i",
            "e2e instr/s",
            "baseline /s",
            "ratio",
            "target",
            "result",
            "floor",
            "cpu ns/i: caller sched workers"
        );
    }
    let mut all_ok = true;
    for w in ws {
        let r = bench::measure(w, n, reps, &config)?;
        all_ok &= r.meets_target;
        if json {
            // Cannot fail: numbers and strings only (serde_json writes a non-finite number as null).
            say!("{}", serde_json::to_string(&r).expect("plain struct serialises"));
        } else {
            let cpu = r.cpu_ns_per_instr.map_or(String::new(), |c| {
                format!("{:>6.1} {:>6.1} {:>6.1}", c.caller, c.scheduler, c.workers)
            });
            say!(
                "{:<4} {:<15} {:>10.1} {:>14.0} {:>14.0} {:>7.2} {:>7.2}  {:<7} {:>6.2}  {}",
                r.workload,
                w.describe(),
                r.push_ns_per_instr,
                r.e2e_instr_per_s,
                r.baseline_instr_per_s,
                r.ratio,
                r.target_ratio,
                if r.meets_target { "met" } else { "MISSED" },
                r.floor_ratio,
                cpu
            );
        }
    }
    if !json {
        say!(
            "ratio = e2e / baseline (a bare caller→forwarder→worker pipeline measured in the same run); \
             targets: W1 >= 0.50, W2-W4 >= 0.33, push <= 100 ns/instr{}",
            if all_ok { "; all met" } else { "" }
        );
        say!(
            "floor = the ratio of the same pipeline doing only the least work per instruction of any \
             dependency-tracking runtime (docs/performance.md)"
        );
    }
    Ok(())
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
