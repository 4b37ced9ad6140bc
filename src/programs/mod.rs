//! Built-in programs: small, deterministic workloads written with the [eager front
//! end](crate::eager), that exercise the VM the way a framework does and that the command
//! line can run (and record) by name.
//!
//! This is the one registry of built-in programs, for the library and the `eagervm` command
//! line alike: the four below check themselves ([`builtin`]); the [`workloads`] (`demo`,
//! `branches`, `layers`, `noops`) leave result tensors for a trace to check. [`all`] lists
//! both kinds, [`lookup`] finds either by name.
//!
//! | program | what it shows |
//! | --- | --- |
//! | [`mlp`](mod@mlp) | training: forward, hand-written backward and SGD of a two-layer MLP |
//! | [`pipeline`](mod@pipeline) | copy/compute overlap over the H2D, compute and D2H streams of a device |
//! | [`fanout`](mod@fanout) | a wide fan-out/fan-in graph: one array read by many independent ops |
//! | [`failure`](mod@failure) | a failed kernel poisons what it feeds; everything else keeps working |
//!
//! [`mlp_dp`](mod@mlp_dp) trains the MLP data-parallel over the ranks of a communicator. It
//! takes a communicator as well as a VM, so it is not among the programs run by name here;
//! the command line runs it as `eagervm run mlp-dp`.
//!
//! Every program takes a `&VirtualMachine` and an options struct, uses fixed seeds, and
//! returns a report of plain values (no timings), so two runs give equal reports; each
//! runs in well under two seconds at its defaults.
//!
//! The programs' own checks compare with a reference bit for bit on devices whose kernels
//! add in the CPU kernels' order (`cpu`, `mock`: [`bit_exact_on`]); on CUDA, where `sum`
//! and the cuBLAS products add in another order, they allow the per-op tolerance of
//! `docs/cuda.md`, `1e-5 · Σ|terms|` ([`CUDA_REL`]), carried through the program. [`builtin`] lists them with a uniform
//! entry point:
//!
//! ```
//! use eagervm::ep::mock::MockConfig;
//! use eagervm::prelude::*;
//! use eagervm::programs::{builtin, RunOptions};
//!
//! let needs = builtin().iter().map(|p| p.mock_devices).max().unwrap_or(0);
//! let vm = VirtualMachine::new(Config::default().with_mock_devices(needs, MockConfig::default()))?;
//! let fanout = eagervm::programs::find("fanout").expect("a built-in program");
//! let report = (fanout.run)(&vm, &RunOptions { size: Some(8), ..RunOptions::default() })?;
//! assert!(report.ok(), "{report}");
//! # Ok::<(), eagervm::Error>(())
//! ```

use std::fmt;

use serde::Serialize;

use crate::ep::{DeviceId, DeviceType};
use crate::framework::Tensor;
use crate::framework::VirtualMachine;
use crate::vm::Result;

pub mod failure;
pub mod fanout;
pub mod mlp;
pub mod mlp_dp;
pub mod pipeline;
pub mod workloads;

pub use failure::{failure, failure_keeping, FailureOptions, FailureReport};
pub use fanout::{fanout, fanout_keeping, FanoutOptions, FanoutReport};
pub use mlp::{mlp, mlp_keeping, MlpOptions, MlpReport};
pub use mlp_dp::{mlp_dp, mlp_dp_keeping, MlpDpOptions, MlpDpReport};
pub use pipeline::{pipeline, pipeline_keeping, PipelineOptions, PipelineReport};
pub use workloads::WorkloadInfo;

/// Whether `device`'s kernels add in the CPU kernels' order, so that a program's results
/// there equal the CPU's bit for bit: true for `cpu` and `mock`, false for `cuda` (its
/// `sum` adds 256 strided partial sums by a tree, its products are cuBLAS's).
pub fn bit_exact_on(device: DeviceId) -> bool {
    device.ty != DeviceType::Cuda
}

/// The relative error a reduction or product may have on a device that is not bit-exact,
/// against the sum of the absolute values of its terms (`docs/cuda.md`).
pub const CUDA_REL: f64 = 1e-5;

/// Whether `got` agrees with the reference `want`: bit for bit when `exact`, else within
/// `tol`.
pub(crate) fn agrees(got: f32, want: f32, exact: bool, tol: f64) -> bool {
    if exact {
        got.to_bits() == want.to_bits()
    } else {
        (got as f64 - want as f64).abs() <= tol
    }
}

/// Options every built-in program understands, for running them by name.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RunOptions {
    /// Where the program computes; `None` for its default ([`ProgramInfo::default_device`]).
    pub device: Option<DeviceId>,
    /// The program's size knob ([`ProgramInfo::size_means`]); `None` for its default.
    pub size: Option<usize>,
}

/// A built-in program: its name, what it does, and how to run it.
#[derive(Debug, Clone, Copy)]
pub struct ProgramInfo {
    /// The name to run it by (`mlp`, `pipeline`, ...).
    pub name: &'static str,
    /// One line on what it does.
    pub about: &'static str,
    /// What [`RunOptions::size`] sets, with its default.
    pub size_means: &'static str,
    /// The device it computes on unless told otherwise.
    pub default_device: DeviceId,
    /// How many mock devices the VM needs for the defaults.
    pub mock_devices: u16,
    /// Run it.
    pub run: fn(&VirtualMachine, &RunOptions) -> Result<Report>,
    /// Run it, also pushing onto the vector handles to the arrays that hold its results
    /// (what the command line checksums, and a recorded trace expects on replay).
    pub run_keeping: fn(&VirtualMachine, &RunOptions, &mut Vec<Tensor>) -> Result<Report>,
}

/// The report of any built-in program.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "program", rename_all = "lowercase")]
pub enum Report {
    /// From [`mlp()`].
    Mlp(MlpReport),
    /// From [`pipeline()`].
    Pipeline(PipelineReport),
    /// From [`fanout()`].
    Fanout(FanoutReport),
    /// From [`failure()`].
    Failure(FailureReport),
}

impl Report {
    /// Whether the program's own check passed (the loss fell; results match the host
    /// reference; the failure stayed where it belongs).
    pub fn ok(&self) -> bool {
        match self {
            Report::Mlp(r) => r.loss_fell(),
            Report::Pipeline(r) => r.matches_reference,
            Report::Fanout(r) => r.matches_reference,
            Report::Failure(r) => r.as_expected,
        }
    }

    /// The report as JSON (`{"program": "mlp", ...}`).
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Report::Mlp(r) => r.fmt(f),
            Report::Pipeline(r) => r.fmt(f),
            Report::Fanout(r) => r.fmt(f),
            Report::Failure(r) => r.fmt(f),
        }
    }
}

fn mlp_options(o: &RunOptions) -> MlpOptions {
    let mut opts = MlpOptions::default();
    opts.device = o.device.unwrap_or(opts.device);
    opts.steps = o.size.unwrap_or(opts.steps);
    opts
}

fn pipeline_options(o: &RunOptions) -> PipelineOptions {
    let mut opts = PipelineOptions::default();
    opts.device = o.device.unwrap_or(opts.device);
    opts.chunks = o.size.unwrap_or(opts.chunks);
    opts
}

fn fanout_options(o: &RunOptions) -> FanoutOptions {
    let mut opts = FanoutOptions::default();
    opts.device = o.device.unwrap_or(opts.device);
    opts.width = o.size.unwrap_or(opts.width);
    opts
}

fn failure_options(o: &RunOptions) -> FailureOptions {
    let mut opts = FailureOptions::default();
    opts.device = o.device.unwrap_or(opts.device);
    opts.len = o.size.unwrap_or(opts.len);
    opts
}

static BUILTIN: [ProgramInfo; 4] = [
    ProgramInfo {
        name: "mlp",
        about: "train a two-layer MLP (forward, hand-written backward, SGD) on synthetic regression data",
        size_means: "training steps (default 60)",
        default_device: DeviceId::CPU,
        mock_devices: 0,
        run: |vm, o| mlp_keeping(vm, &mlp_options(o), &mut Vec::new()).map(Report::Mlp),
        run_keeping: |vm, o, keep| mlp_keeping(vm, &mlp_options(o), keep).map(Report::Mlp),
    },
    ProgramInfo {
        name: "pipeline",
        about: "stream chunks host -> device (H2D) -> compute -> host (D2H) with copies overlapping compute",
        size_means: "chunks (default 32)",
        default_device: DeviceId::mock(0),
        mock_devices: 1,
        run: |vm, o| pipeline_keeping(vm, &pipeline_options(o), &mut Vec::new()).map(Report::Pipeline),
        run_keeping: |vm, o, keep| pipeline_keeping(vm, &pipeline_options(o), keep).map(Report::Pipeline),
    },
    ProgramInfo {
        name: "fanout",
        about: "one array read by many independent ops, then reduced by a tree of adds",
        size_means: "branches (default 64)",
        default_device: DeviceId::CPU,
        mock_devices: 0,
        run: |vm, o| fanout_keeping(vm, &fanout_options(o), &mut Vec::new()).map(Report::Fanout),
        run_keeping: |vm, o, keep| fanout_keeping(vm, &fanout_options(o), keep).map(Report::Fanout),
    },
    ProgramInfo {
        name: "failure",
        about: "a deliberately failing kernel poisons the arrays it feeds while the others keep working",
        size_means: "elements per array (default 16)",
        default_device: DeviceId::CPU,
        mock_devices: 0,
        run: |vm, o| failure_keeping(vm, &failure_options(o), &mut Vec::new()).map(Report::Failure),
        run_keeping: |vm, o, keep| failure_keeping(vm, &failure_options(o), keep).map(Report::Failure),
    },
];

/// Every built-in program, in a fixed order.
pub fn builtin() -> &'static [ProgramInfo] {
    &BUILTIN
}

/// The self-checking built-in program called `name` (see [`lookup`] for either kind).
pub fn find(name: &str) -> Option<&'static ProgramInfo> {
    BUILTIN.iter().find(|p| p.name == name)
}

/// A built-in program of either kind, as the command line lists, runs and records it.
#[derive(Debug, Clone, Copy)]
pub enum Builtin {
    /// A program that checks its own results ([`builtin`]).
    Checked(&'static ProgramInfo),
    /// A workload that leaves result tensors for a trace to check ([`workloads`]).
    Workload(&'static WorkloadInfo),
}

/// What a built-in program leaves behind when run by name.
#[derive(Debug, Default)]
pub struct Output {
    /// The tensors that hold its results (checksummed by `eagervm run`, expected by a
    /// recorded trace).
    pub tensors: Vec<Tensor>,
    /// The report of a program that checks itself; `None` for a workload.
    pub report: Option<Report>,
}

impl Builtin {
    /// The name to run it by.
    pub fn name(&self) -> &'static str {
        match self {
            Builtin::Checked(p) => p.name,
            Builtin::Workload(w) => w.name,
        }
    }

    /// One line on what it does.
    pub fn about(&self) -> &'static str {
        match self {
            Builtin::Checked(p) => p.about,
            Builtin::Workload(w) => w.about,
        }
    }

    /// How many mock devices the VM needs for its defaults.
    pub fn mock_devices(&self) -> u16 {
        match self {
            Builtin::Checked(p) => p.mock_devices,
            Builtin::Workload(w) => w.mock_devices,
        }
    }

    /// Run it at its defaults, keeping the tensors that hold its results.
    pub fn run(&self, vm: &VirtualMachine) -> Result<Output> {
        match self {
            Builtin::Checked(p) => {
                let mut tensors = Vec::new();
                let report = (p.run_keeping)(vm, &RunOptions::default(), &mut tensors)?;
                Ok(Output { tensors, report: Some(report) })
            }
            Builtin::Workload(w) => Ok(Output { tensors: (w.run)(vm)?, report: None }),
        }
    }
}

/// Every built-in program of both kinds, in a fixed order: the self-checking ones, then the
/// workloads.
pub fn all() -> impl Iterator<Item = Builtin> {
    BUILTIN.iter().map(Builtin::Checked).chain(workloads::WORKLOADS.iter().map(Builtin::Workload))
}

/// The built-in program of either kind called `name`.
pub fn lookup(name: &str) -> Option<Builtin> {
    all().find(|p| p.name() == name)
}

/// A deterministic stream of `f32`s, uniform in `[-1, 1)` (xorshift64*), so that programs
/// make the same data on every machine.
#[derive(Debug, Clone)]
pub(crate) struct Rng(u64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Self {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }

    pub(crate) fn next_f32(&mut self) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let x = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D);
        // 24 random bits: exact in f32.
        (x >> 40) as f32 / (1u32 << 23) as f32 - 1.0
    }

    pub(crate) fn vec(&mut self, n: usize, scale: f32) -> Vec<f32> {
        (0..n).map(|_| self.next_f32() * scale).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rng_is_deterministic_and_in_range() {
        let (a, b) = (Rng::new(7).vec(1000, 1.0), Rng::new(7).vec(1000, 1.0));
        assert_eq!(a, b);
        assert_ne!(a, Rng::new(8).vec(1000, 1.0));
        assert!(a.iter().all(|x| (-1.0..1.0).contains(x)));
        assert!(a.iter().any(|&x| x < -0.9) && a.iter().any(|&x| x > 0.9));
    }

    #[test]
    fn bit_exact_everywhere_but_cuda() {
        assert!(bit_exact_on(DeviceId::CPU) && bit_exact_on(DeviceId::mock(1)));
        assert!(!bit_exact_on(DeviceId::cuda(0)));
        assert!(agrees(1.0, 1.0, true, 0.0) && !agrees(-0.0, 0.0, true, 1.0));
        assert!(agrees(1.0, 1.0 + 1e-6, false, 1e-5) && !agrees(1.0, 1.0 + 1e-4, false, 1e-5));
    }

    #[test]
    fn names_are_unique_and_found() {
        for p in builtin() {
            assert_eq!(find(p.name).map(|q| q.name), Some(p.name));
        }
        assert!(find("nope").is_none());
        let mut names: Vec<_> = builtin().iter().map(|p| p.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), builtin().len());
    }

    #[test]
    fn one_registry_holds_every_program_once() {
        let names: Vec<_> = all().map(|p| p.name()).collect();
        assert_eq!(
            names,
            ["mlp", "pipeline", "fanout", "failure", "demo", "branches", "layers", "noops"],
            "the command line's programs and their order"
        );
        for p in all() {
            assert_eq!(lookup(p.name()).map(|q| q.name()), Some(p.name()));
            assert!(!p.about().is_empty(), "{}", p.name());
            // The self-checking ones are those `find` knows.
            assert_eq!(find(p.name()).is_some(), matches!(p, Builtin::Checked(_)), "{}", p.name());
        }
        let mut unique = names.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), names.len(), "a name in both kinds: {names:?}");
        assert!(lookup("nope").is_none());
    }

    #[test]
    fn running_by_name_keeps_results_and_reports_when_checked() {
        let needs = all().map(|p| p.mock_devices()).max().unwrap_or(0);
        let vm = VirtualMachine::new(
            crate::Config::default().with_mock_devices(needs, crate::ep::mock::MockConfig::default()),
        )
        .unwrap();
        for name in ["fanout", "demo"] {
            let p = lookup(name).unwrap();
            let out = p.run(&vm).unwrap();
            assert!(!out.tensors.is_empty(), "{name} kept no results");
            for t in &out.tensors {
                t.wait().unwrap_or_else(|e| panic!("{name}: {e}"));
            }
            match (p, &out.report) {
                (Builtin::Checked(_), Some(r)) => assert!(r.ok(), "{r}"),
                (Builtin::Workload(_), None) => {}
                (_, r) => panic!("{name}: report {r:?}"),
            }
        }
    }
}
