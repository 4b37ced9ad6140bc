//! `eagervm run mlp-dp`: data-parallel training of the MLP ([`mlp_dp`](mod@crate::programs::mlp_dp)) as
//! the command line runs it, and its comparison with one rank.
//!
//! The communicator comes from [`DpBackend`]: `mock` (the default) puts every rank on a mock
//! device of one VM, behind one mock communicator. `mpi` (one rank per process under
//! `mpirun`, on `cpu:0`) and `nccl` (one GPU per process, with torchrun's `WORLD_SIZE`,
//! `RANK`, `LOCAL_RANK`, `MASTER_ADDR`, `MASTER_PORT`) are made in [`communicator`], the one
//! place a backend is chosen; a build without them refuses them there with a
//! [`CliError::Usage`] that says what is missing.

use std::time::{Duration, Instant};

use crate::ep::mock::MockConfig;
use crate::ep::DeviceId;
use crate::framework::Communicator;
use crate::profile::Profile;
use crate::programs::mlp_dp::{collective_overlap, max_rel_diff, mock_devices, Overlap, LOSS_REL_TOLERANCE};
use crate::programs::{mlp, mlp_dp, MlpDpOptions, MlpDpReport, MlpOptions};
use crate::{Config, VirtualMachine};

use super::CliError;

/// The mock devices' launch delay for `mlp-dp` when `EAGERVM_MOCK_DELAY_US` does not set
/// one: enough simulated device time per launch for the overlap of the collectives with
/// the backward pass to show on the timeline and in step times.
pub const DEFAULT_MOCK_DELAY: Duration = Duration::from_micros(100);

/// Which collective backend carries the ranks' gradients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DpBackend {
    /// Every rank a mock device of this process (`ep::ccl::mock`, a test double).
    #[default]
    Mock,
    /// One rank per process on `cpu:0`, over MPI (`mpirun -np N eagervm run mlp-dp
    /// --backend mpi`).
    Mpi,
    /// One GPU per process over NCCL, with torchrun's environment variables.
    Nccl,
}

impl DpBackend {
    /// The backend a launcher asks for when `--backend` is not given: `mpi` under an MPI
    /// launcher (`mpirun` sets `OMPI_COMM_WORLD_SIZE`, `PMIX_RANK` or `PMI_SIZE`), `nccl`
    /// under torchrun (`WORLD_SIZE` and `MASTER_ADDR`), else `mock`.
    pub fn from_launcher() -> DpBackend {
        let set = |v: &str| std::env::var_os(v).is_some();
        if ["OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_SIZE"].iter().any(|v| set(v)) {
            DpBackend::Mpi
        } else if set("WORLD_SIZE") && set("MASTER_ADDR") {
            DpBackend::Nccl
        } else {
            DpBackend::Mock
        }
    }
}

impl std::str::FromStr for DpBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "mock" => Ok(DpBackend::Mock),
            "mpi" => Ok(DpBackend::Mpi),
            "nccl" => Ok(DpBackend::Nccl),
            _ => Err(format!("unknown backend `{s}` (use mock, mpi or nccl)")),
        }
    }
}

impl std::fmt::Display for DpBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            DpBackend::Mock => "mock",
            DpBackend::Mpi => "mpi",
            DpBackend::Nccl => "nccl",
        })
    }
}

/// What `eagervm run mlp-dp` runs.
#[derive(Debug, Clone, PartialEq)]
pub struct DpOptions {
    /// The backend (default mock).
    pub backend: DpBackend,
    /// Ranks, for the mock backend (default 2); the other backends take the world size
    /// from their launcher.
    pub ranks: usize,
    /// The training (default: [`MlpDpOptions::default`]).
    pub train: MlpDpOptions,
    /// Take a timeline of the run.
    pub profile: bool,
}

impl Default for DpOptions {
    fn default() -> Self {
        DpOptions { backend: DpBackend::Mock, ranks: 2, train: MlpDpOptions::default(), profile: false }
    }
}

/// What a run of `mlp-dp` did.
#[derive(Debug)]
pub struct DpRun {
    /// The program's report.
    pub report: MlpDpReport,
    /// The mock devices' launch delay (mock backend).
    pub launch_delay: Duration,
    /// Wall time of the training, from its first call to its last loss read.
    pub wall: Duration,
    /// The one-rank loss curve on the global batch (the plain MLP on `mock:0`).
    pub reference: Vec<f32>,
    /// The largest relative difference between the two curves.
    pub max_rel_diff: f64,
    /// The timeline, if one was asked for.
    pub profile: Option<Profile>,
    /// The overlap of the all-reduces with the backward pass, on the timeline.
    pub overlap: Option<Overlap>,
}

impl DpRun {
    /// Whether the program's check passed and the loss curve is within
    /// [`LOSS_REL_TOLERANCE`] of one rank's.
    pub fn ok(&self) -> bool {
        self.report.ok() && self.max_rel_diff <= LOSS_REL_TOLERANCE
    }
}

fn program_error(error: crate::Error) -> CliError {
    CliError::Program { program: "mlp-dp".into(), error }
}

/// The VM configuration for `ranks` mock devices: `config`'s, with [`DEFAULT_MOCK_DELAY`]
/// if it sets no launch delay.
pub fn mock_config(mut config: Config, ranks: usize) -> Config {
    let mut mock: MockConfig = config.mock.clone();
    if mock.launch_delay.is_zero() {
        mock.launch_delay = DEFAULT_MOCK_DELAY;
    }
    config.mock_devices = config.mock_devices.max(ranks.min(u16::MAX as usize) as u16);
    config.mock = mock;
    config
}

/// The VM and the communicator `mlp-dp` runs on: where every backend is chosen.
pub fn communicator(
    backend: DpBackend,
    ranks: usize,
    config: Config,
) -> Result<(VirtualMachine, Communicator), CliError> {
    match backend {
        DpBackend::Mock => {
            if !(1..=64).contains(&ranks) {
                return Err(CliError::Usage(format!("--ranks {ranks}: give 1 to 64 mock ranks")));
            }
            let vm = VirtualMachine::new(mock_config(config, ranks)).map_err(program_error)?;
            let comm = vm.mock_communicator("dp", &mock_devices(ranks)).map_err(program_error)?;
            Ok((vm, comm))
        }
        #[cfg(feature = "mpi")]
        DpBackend::Mpi => {
            // One rank per process, `cpu:0`; the world is the launcher's (`mpirun -np N`).
            let backend = crate::ep::ccl::mpi::MpiBackend::world()
                .map_err(|e| CliError::Usage(format!("--backend mpi: {e}")))?;
            let vm = VirtualMachine::new(config).map_err(program_error)?;
            let comm = vm.communicator("dp", std::sync::Arc::new(backend)).map_err(program_error)?;
            Ok((vm, comm))
        }
        #[cfg(not(feature = "mpi"))]
        DpBackend::Mpi => Err(CliError::Usage(
            "--backend mpi: this eagervm was built without the `mpi` feature, which provides the MPI \
             collective backend (build with `--features mpi` and launch with `mpirun -np N eagervm run \
             mlp-dp --backend mpi`)"
                .into(),
        )),
        #[cfg(feature = "cuda")]
        DpBackend::Nccl => {
            // One GPU per process, `cuda:LOCAL_RANK`, ranks and rendezvous as torchrun sets them.
            let backend =
                crate::ep::ccl::nccl::NcclBackend::from_env("dp", std::time::Duration::from_secs(300))
                    .map_err(|e| CliError::Usage(format!("--backend nccl: {e}")))?;
            let device = crate::ep::ccl::Backend::members(&backend)[0].device;
            let mut config = config;
            config.cuda_devices = config.cuda_devices.max(device.index + 1);
            let vm = VirtualMachine::new(config).map_err(program_error)?;
            let comm = vm.communicator("dp", std::sync::Arc::new(backend)).map_err(program_error)?;
            Ok((vm, comm))
        }
        #[cfg(not(feature = "cuda"))]
        DpBackend::Nccl => Err(CliError::Usage(
            "--backend nccl: this eagervm has no NCCL collective backend, which one-GPU-per-process \
             training needs (launched like torchrun, with WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR and \
             MASTER_PORT set)"
                .into(),
        )),
    }
}

/// Run `mlp-dp` as `eagervm run mlp-dp` does, and the one-rank MLP on the global batch to
/// compare its loss curve with.
pub fn run_mlp_dp(config: Config, opts: &DpOptions) -> Result<DpRun, CliError> {
    let (vm, comm) = communicator(opts.backend, opts.ranks, config)?;
    let profiling = opts.profile && !vm.config().synchronous;
    if opts.profile && !profiling {
        return Err(CliError::Usage("synchronous mode (EAGERVM_SYNC=1) cannot be profiled".into()));
    }
    if profiling {
        vm.start_profiling().map_err(|e| CliError::Usage(e.to_string()))?;
    }
    let t0 = Instant::now();
    let report = mlp_dp(&vm, &comm, &opts.train).map_err(program_error)?;
    let wall = t0.elapsed();
    vm.sync().map_err(program_error)?;
    let profile = match profiling {
        true => Some(vm.stop_profiling().map_err(|e| CliError::Usage(e.to_string()))?),
        false => None,
    };
    let overlap = match &profile {
        Some(p) => {
            let compute = comm
                .members()
                .iter()
                .map(|m| vm.compute_stream(m.device))
                .collect::<crate::Result<Vec<_>>>()
                .map_err(program_error)?;
            Some(collective_overlap(p, comm.stream(), &compute))
        }
        None => None,
    };
    let reference = one_rank(&vm.config().mock, &opts.train.mlp)?.0;
    Ok(DpRun {
        max_rel_diff: max_rel_diff(&report.losses, &reference),
        launch_delay: vm.config().mock.launch_delay,
        report,
        wall,
        reference,
        profile,
        overlap,
    })
}

/// The one-rank MLP on the global batch, on `mock:0` of a fresh VM with `mock`'s timing:
/// its losses and its training's wall time.
fn one_rank(mock: &MockConfig, opts: &MlpOptions) -> Result<(Vec<f32>, Duration), CliError> {
    let vm =
        VirtualMachine::new(Config::default().with_mock_devices(1, mock.clone())).map_err(program_error)?;
    let t0 = Instant::now();
    let r = mlp(&vm, &MlpOptions { device: DeviceId::mock(0), ..opts.clone() }).map_err(program_error)?;
    Ok((r.losses, t0.elapsed()))
}

/// Step times of `mlp-dp` against one rank on the same global batch, on mock devices
/// (median over repetitions, each on a fresh VM).
#[derive(Debug, Clone)]
pub struct DpComparison {
    /// Ranks of the data-parallel runs.
    pub ranks: usize,
    /// The mock devices' launch delay.
    pub launch_delay: Duration,
    /// Training steps per run.
    pub steps: usize,
    /// Runs of each kind.
    pub reps: usize,
    /// One rank, the whole batch: median time per step.
    pub one_rank: Duration,
    /// `ranks` ranks, buckets overlapping the backward pass.
    pub overlapped: Duration,
    /// `ranks` ranks, every bucket after the backward pass.
    pub after_backward: Duration,
    /// The processor cores this process may use (`std::thread::available_parallelism`).
    pub cores: usize,
}

impl DpComparison {
    /// Why the figures are what they are: what the mock device charges for, and what the
    /// ranks share when there are more of them than cores.
    pub fn why(&self) -> String {
        let mut why = format!(
            "why: a mock launch sleeps {:?} whatever its size, so each of the {} ranks, on 1/{} of the \
             batch, spends as long per step as one rank on all of it: on mock devices data parallelism \
             cannot beat one rank, and the figures show what the all-reduces and the ranks' host \
             threads add.",
            self.launch_delay, self.ranks, self.ranks
        );
        if self.ranks > self.cores {
            why.push_str(&format!(
                "\n{} ranks on {} cores: the ranks' kernels, workers and device threads share the cores, so \
                 ranks wait for each other's turn (the more so on a busy machine), and buckets that overlap \
                 the backward pass find no idle core to run on, which can make them slower than buckets \
                 after it; with a core per rank (or a GPU per rank) the overlap is what hides the \
                 all-reduces.",
                self.ranks, self.cores
            ));
        } else {
            why.push_str(&format!(
                "\n{} ranks on {} cores: each rank's host work can have a core of its own, so what separates \
                 the ranks from one rank is the all-reduces, which overlapping buckets hide behind the \
                 backward pass.",
                self.ranks, self.cores
            ));
        }
        why
    }
}

impl std::fmt::Display for DpComparison {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let rel = |d: Duration| d.as_secs_f64() / self.one_rank.as_secs_f64();
        writeln!(
            f,
            "step time, median of {} runs of {} steps on mock devices ({:?} per launch):",
            self.reps, self.steps, self.launch_delay
        )?;
        writeln!(f, "  1 rank, global batch:                        {:>8.3} ms", ms(self.one_rank))?;
        writeln!(
            f,
            "  {} ranks, buckets overlapping the backward:   {:>8.3} ms ({:.2}x one rank)",
            self.ranks,
            ms(self.overlapped),
            rel(self.overlapped)
        )?;
        writeln!(
            f,
            "  {} ranks, buckets after the backward:        {:>8.3} ms ({:.2}x one rank)",
            self.ranks,
            ms(self.after_backward),
            rel(self.after_backward)
        )?;
        write!(f, "{}", self.why())
    }
}

/// Measure [`DpComparison`]: `reps` runs of each kind, taken in turn.
pub fn compare(
    config: Config,
    ranks: usize,
    train: &MlpDpOptions,
    reps: usize,
) -> Result<DpComparison, CliError> {
    let config = mock_config(config, ranks);
    let reps = reps.max(1);
    let steps = train.mlp.steps.max(1);
    let mut times: [Vec<Duration>; 3] = Default::default();
    for _ in 0..reps {
        times[0].push(one_rank(&config.mock, &train.mlp)?.1);
        for (k, overlap) in [(1, true), (2, false)] {
            let (vm, comm) = communicator(DpBackend::Mock, ranks, config.clone())?;
            let t0 = Instant::now();
            mlp_dp(&vm, &comm, &MlpDpOptions { overlap, ..train.clone() }).map_err(program_error)?;
            times[k].push(t0.elapsed());
        }
    }
    let median = |v: &mut Vec<Duration>| {
        v.sort();
        v[v.len() / 2] / steps as u32
    };
    Ok(DpComparison {
        ranks,
        launch_delay: config.mock.launch_delay,
        steps,
        reps,
        one_rank: median(&mut times[0]),
        overlapped: median(&mut times[1]),
        after_backward: median(&mut times[2]),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
    })
}
