//! The NCCL half of the all-reduce benchmark (`cargo bench --bench allreduce_nccl`): on
//! `cuda:0` with a one-rank NCCL communicator, the VM's `all_reduce` against the same
//! `ncclAllReduce` made directly, and the data-parallel MLP's step against the plain
//! one-rank step. `benches/allreduce_mpi.rs` is the MPI half, on the host.
//!
//! - **All-reduce**, sum of `f32`, for sizes from 4 B to 64 MiB ([`sizes`], powers of 4).
//!   Three sides, each `iters` calls one after the other, every call issued and then waited
//!   for: the VM's `all_reduce` (`vm.run(|b| b.all_reduce(..))`, then `wait` on the output:
//!   a new output tensor per call, from the caching allocator), the VM's `collective_into`
//!   (the same, into one output tensor reused, as the direct side reuses its buffer), and
//!   `direct`: `ncclAllReduce` on a plain CUDA stream, then `cuStreamSynchronize`. Rounds
//!   of the three are taken in turn (VM, into, direct, VM, ...) so that a slow spell of a
//!   shared machine falls on all; each side's figure is the median over rounds of the time
//!   per call. Overhead is VM − direct in µs (the figure to read at small sizes); bandwidth
//!   is the algorithm bandwidth, bytes / time (the one to read at large sizes). The bus
//!   bandwidth of nccl-tests, algorithm bandwidth × 2(n − 1)/n ([`bus_bandwidth`]), is 0 on
//!   one rank, where NCCL's all-reduce is a copy from the send to the receive buffer: it is
//!   printed only for more ranks. Every size checks that the VM's result, the direct result
//!   and the input (the sum over one rank) agree bit for bit.
//! - **Data-parallel step**: `programs::mlp_dp` on the one-rank NCCL communicator over
//!   `cuda:0` (buckets overlapping the backward pass, and after it) against
//!   `programs::mlp` on `cuda:0`: the time of a whole training run divided by its steps,
//!   the median over runs taken in turn. The loss curves must agree within
//!   `LOSS_REL_TOLERANCE`.
//!
//! Without a GPU or without libnccl, [`run`] returns a report whose `skipped` says which is
//! missing. The measurement functions ([`measure_sizes`], [`dp_step`]) take any
//! communicator, so the tests run them on a mock one.

#[cfg(feature = "cuda")]
mod direct;

use std::fmt;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::ep::ccl::Collective;
use crate::ep::ccl::ReduceOp;
use crate::ep::DeviceId;
use crate::framework::Communicator;
use crate::programs::mlp_dp::{max_rel_diff, LOSS_REL_TOLERANCE};
use crate::programs::{mlp, mlp_dp, MlpDpOptions, MlpOptions};
use crate::vm::Config;
use crate::VirtualMachine;

/// What can go wrong in the benchmark (a missing GPU or libnccl is not an error: the report
/// says it skipped).
#[derive(Debug, thiserror::Error)]
pub enum NcclBenchError {
    /// The VM refused or failed a call.
    #[error(transparent)]
    Vm(#[from] crate::vm::Error),
    /// Making the VM's NCCL communicator failed.
    #[error("the VM's NCCL communicator: {0}")]
    Communicator(crate::ep::ccl::CclError),
    /// A call of the direct side (NCCL or the CUDA driver) failed.
    #[error("direct NCCL: {0}")]
    Direct(String),
    /// Two sides computed different results.
    #[error("all_reduce of {bytes} B: {what}")]
    Mismatch {
        /// The size.
        bytes: usize,
        /// Which results differ.
        what: String,
    },
    /// The data-parallel loss curve left the one-rank curve's tolerance.
    #[error("mlp-dp's loss curve differs from one rank's by {0:e} (tolerance {LOSS_REL_TOLERANCE:e})")]
    Loss(f64),
    /// A malformed option.
    #[error("{0}")]
    Option(String),
}

/// How much to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NcclBenchOptions {
    /// The smallest all-reduce, in bytes (a multiple of 4).
    pub min_bytes: usize,
    /// The largest all-reduce, in bytes; sizes go up by 4× from `min_bytes`. 0 skips the
    /// all-reduce table.
    pub max_bytes: usize,
    /// Rounds of each side, taken in turn.
    pub rounds: usize,
    /// Training steps per run of the data-parallel comparison; 0 skips it.
    pub dp_steps: usize,
    /// Runs of each kind in the data-parallel comparison.
    pub dp_reps: usize,
}

impl Default for NcclBenchOptions {
    fn default() -> Self {
        NcclBenchOptions { min_bytes: 4, max_bytes: 64 << 20, rounds: 5, dp_steps: 60, dp_reps: 5 }
    }
}

/// The environment variables [`NcclBenchOptions::from_vars`] reads, with what each sets.
pub const ENV_VARS: [(&str, &str); 3] = [
    ("EAGERVM_NCCL_MAX_BYTES", "the largest all-reduce in bytes (0: none)"),
    ("EAGERVM_NCCL_ROUNDS", "rounds of each side"),
    ("EAGERVM_NCCL_DP_STEPS", "steps per data-parallel run (0: none)"),
];

impl NcclBenchOptions {
    /// The defaults, with the [`ENV_VARS`] that `get` returns a value for; a value that is
    /// not a number, or no round, is an error naming the variable.
    pub fn from_vars(get: impl Fn(&str) -> Option<String>) -> Result<Self, NcclBenchError> {
        let mut o = NcclBenchOptions::default();
        let fields = [&mut o.max_bytes, &mut o.rounds, &mut o.dp_steps];
        for ((name, _), field) in ENV_VARS.iter().zip(fields) {
            if let Some(v) = get(name) {
                *field =
                    v.trim().parse().map_err(|e| NcclBenchError::Option(format!("{name}={v:?}: {e}")))?;
            }
        }
        if o.rounds == 0 {
            return Err(NcclBenchError::Option("EAGERVM_NCCL_ROUNDS=0: at least one round is needed".into()));
        }
        Ok(o)
    }
}

/// The sizes measured: `min` (rounded up to whole `f32`s, at least one), then ×4 while at
/// most `max`.
pub fn sizes(min: usize, max: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut b = min.max(4).next_multiple_of(4);
    while b <= max {
        out.push(b);
        match b.checked_mul(4) {
            Some(n) => b = n,
            None => break,
        }
    }
    out
}

/// Calls per round at `bytes`: 256 MiB moved per round, between 5 and 2000 calls.
pub fn iterations(bytes: usize) -> usize {
    ((256usize << 20) / bytes.max(1)).clamp(5, 2000)
}

/// Algorithm bandwidth in GB/s (10⁹ bytes per second): `bytes` per rank over `t`.
pub fn alg_bandwidth(bytes: usize, t: Duration) -> f64 {
    bytes as f64 / t.as_secs_f64() / 1e9
}

/// nccl-tests' bus bandwidth of an all-reduce in GB/s: the algorithm bandwidth × 2(n − 1)/n,
/// what each rank's link carries in a ring all-reduce (0 for one rank).
pub fn bus_bandwidth(bytes: usize, t: Duration, ranks: usize) -> f64 {
    let n = ranks.max(1) as f64;
    alg_bandwidth(bytes, t) * 2.0 * (n - 1.0) / n
}

/// The median of `v` (the upper middle of an even count).
fn median(v: &[Duration]) -> Duration {
    let mut v = v.to_vec();
    v.sort();
    v.get(v.len() / 2).copied().unwrap_or_default()
}

/// One size of the all-reduce table; times are per call.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct SizeRow {
    /// Bytes per rank.
    pub bytes: usize,
    /// Calls per round.
    pub iters: usize,
    /// The direct `ncclAllReduce`, µs (median over rounds).
    pub direct_us: f64,
    /// The VM's `all_reduce` (a new output per call), µs.
    pub vm_us: f64,
    /// The VM's `collective_into` (one output reused), µs.
    pub vm_into_us: f64,
    /// `vm_us − direct_us`.
    pub overhead_us: f64,
    /// Algorithm bandwidth of the direct side, GB/s.
    pub direct_gbs: f64,
    /// Algorithm bandwidth of the VM's `all_reduce`, GB/s.
    pub vm_gbs: f64,
    /// `vm_us / direct_us`.
    pub ratio: f64,
    /// The lowest and highest ratio of one round's VM time to the same round's direct time:
    /// how noisy the machine was.
    pub ratio_range: [f64; 2],
}

/// The data-parallel comparison: time per training step.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct DpStep {
    /// Steps per run.
    pub steps: usize,
    /// Runs of each kind.
    pub reps: usize,
    /// `programs::mlp` on the device, ms per step (median over runs).
    pub one_rank_ms: f64,
    /// `programs::mlp_dp`, buckets overlapping the backward pass, ms per step.
    pub overlapped_ms: f64,
    /// `programs::mlp_dp`, buckets after the backward pass, ms per step.
    pub after_backward_ms: f64,
    /// The largest relative difference between the two loss curves.
    pub max_rel_diff: f64,
}

/// The results, or why there are none.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct NcclBenchReport {
    /// Why nothing ran (no GPU, no libnccl), if so.
    pub skipped: Option<String>,
    /// NCCL's version (`major·10000 + minor·100 + patch`), when loaded.
    pub nccl_version: Option<i32>,
    /// Ranks in the communicator.
    pub ranks: usize,
    /// The device measured on.
    pub device: String,
    /// The all-reduce table, smallest size first.
    pub sizes: Vec<SizeRow>,
    /// The data-parallel comparison, if measured.
    pub dp: Option<DpStep>,
}

impl NcclBenchReport {
    fn skipped(why: String) -> NcclBenchReport {
        NcclBenchReport {
            skipped: Some(why),
            nccl_version: None,
            ranks: 0,
            device: String::new(),
            sizes: Vec::new(),
            dp: None,
        }
    }
}

impl fmt::Display for NcclBenchReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(why) = &self.skipped {
            return write!(f, "nccl benchmarks skipped: {why}");
        }
        let v = self.nccl_version.unwrap_or(0);
        writeln!(
            f,
            "all_reduce sum of f32 on {} over {} rank(s), NCCL {}.{}.{}: the VM against ncclAllReduce \
             called directly (each call issued, then waited for; median of rounds taken in turn)",
            self.device,
            self.ranks,
            v / 10000,
            v / 100 % 100,
            v % 100
        )?;
        let bus = self.ranks > 1;
        write!(
            f,
            "{:>9} {:>6} {:>10} {:>10} {:>10} {:>12} {:>11} {:>10} {:>8} {:>12}",
            "bytes",
            "iters",
            "direct µs",
            "vm µs",
            "into µs",
            "overhead µs",
            "direct GB/s",
            "vm GB/s",
            "vm/dir",
            "(per round)"
        )?;
        if bus {
            write!(f, " {:>10}", "vm bus GB/s")?;
        }
        for r in &self.sizes {
            write!(
                f,
                "\n{:>9} {:>6} {:>10.1} {:>10.1} {:>10.1} {:>12.1} {:>11.3} {:>10.3} {:>8.2} {:>5.2}–{:<6.2}",
                r.bytes,
                r.iters,
                r.direct_us,
                r.vm_us,
                r.vm_into_us,
                r.overhead_us,
                r.direct_gbs,
                r.vm_gbs,
                r.ratio,
                r.ratio_range[0],
                r.ratio_range[1],
            )?;
            if bus {
                let t = Duration::from_secs_f64(r.vm_us * 1e-6);
                write!(f, " {:>10.3}", bus_bandwidth(r.bytes, t, self.ranks))?;
            }
        }
        if self.ranks == 1 && !self.sizes.is_empty() {
            write!(
                f,
                "\n(one rank: NCCL's all-reduce is a copy, and the bus bandwidth 2(n-1)/n x alg is 0; \
                 GB/s above is bytes / time)"
            )?;
        }
        if let Some(d) = &self.dp {
            write!(
                f,
                "\nmlp-dp step on {} with the one-rank NCCL communicator, median of {} runs of {} steps:\
                 \n  1 rank, programs::mlp:                {:>8.3} ms\
                 \n  mlp-dp, buckets overlapping backward: {:>8.3} ms ({:.2}x)\
                 \n  mlp-dp, buckets after backward:       {:>8.3} ms ({:.2}x)\
                 \n  loss curves differ by at most {:.2e} (relative)",
                self.device,
                d.reps,
                d.steps,
                d.one_rank_ms,
                d.overlapped_ms,
                d.overlapped_ms / d.one_rank_ms,
                d.after_backward_ms,
                d.after_backward_ms / d.one_rank_ms,
                d.max_rel_diff,
            )?;
        }
        Ok(())
    }
}

/// The side of the all-reduce comparison that makes the same call without the VM.
pub trait Reference {
    /// Get ready for all-reduces of `data` (one rank's input).
    fn prepare(&mut self, data: &[f32]) -> Result<(), NcclBenchError>;
    /// Make `iters` all-reduces of the prepared input, each issued and waited for.
    fn run(&mut self, iters: usize) -> Result<(), NcclBenchError>;
    /// The last all-reduce's result.
    fn result(&mut self) -> Result<Vec<f32>, NcclBenchError>;
}

/// Time, for each of `sizes`, the VM's `all_reduce` and `collective_into` on `comm` (a
/// one-member communicator whose member is on `device`) against `reference`, `rounds`
/// rounds each taken in turn after a warm-up call of each; check that all three give the
/// input back (the sum over one rank).
pub fn measure_sizes(
    vm: &VirtualMachine,
    comm: &Communicator,
    device: DeviceId,
    sizes: &[usize],
    rounds: usize,
    reference: &mut dyn Reference,
) -> Result<Vec<SizeRow>, NcclBenchError> {
    let rounds = rounds.max(1);
    let op = Collective::AllReduce(ReduceOp::Sum);
    let mut rows = Vec::with_capacity(sizes.len());
    for &bytes in sizes {
        let count = bytes / 4;
        let iters = iterations(bytes);
        // Small integers: every sum is exact, so the sides must agree bit for bit.
        let data: Vec<f32> = (0..count).map(|i| (i % 7) as f32).collect();
        let x = vm.from_slice(&data, &[count], device)?;
        let into = vm.empty(&[count], crate::framework::DType::F32, device)?;
        reference.prepare(&data)?;
        let vm_side = |n: usize| -> Result<(), NcclBenchError> {
            for _ in 0..n {
                let y = vm.run(|b| b.all_reduce(comm, &[&x], ReduceOp::Sum))?;
                y[0].wait()?;
            }
            Ok(())
        };
        let into_side = |n: usize| -> Result<(), NcclBenchError> {
            for _ in 0..n {
                vm.run(|b| b.collective_into(comm, op, &[&x], &[&into]))?;
                into.wait()?;
            }
            Ok(())
        };
        vm_side(1)?;
        into_side(1)?;
        reference.run(1)?;
        let (mut t_vm, mut t_into, mut t_direct) =
            (Vec::with_capacity(rounds), Vec::with_capacity(rounds), Vec::with_capacity(rounds));
        let per_call = |t: Instant| t.elapsed() / iters as u32;
        for _ in 0..rounds {
            let t = Instant::now();
            vm_side(iters)?;
            t_vm.push(per_call(t));
            let t = Instant::now();
            into_side(iters)?;
            t_into.push(per_call(t));
            let t = Instant::now();
            reference.run(iters)?;
            t_direct.push(per_call(t));
        }
        let y = vm.run(|b| b.all_reduce(comm, &[&x], ReduceOp::Sum))?;
        let bits = |v: &[f32]| v.iter().map(|f| f.to_bits()).collect::<Vec<_>>();
        let want = bits(&data);
        for (what, got) in [
            ("the VM's all_reduce", y[0].to_vec::<f32>()?),
            ("the VM's collective_into", into.to_vec::<f32>()?),
            ("the direct call", reference.result()?),
        ] {
            if bits(&got) != want {
                return Err(NcclBenchError::Mismatch {
                    bytes,
                    what: format!("{what} does not give the input back (the sum over one rank)"),
                });
            }
        }
        let (vm_t, into_t, direct_t) = (median(&t_vm), median(&t_into), median(&t_direct));
        let ratios: Vec<f64> =
            t_vm.iter().zip(&t_direct).map(|(v, d)| v.as_secs_f64() / d.as_secs_f64()).collect();
        let us = |d: Duration| d.as_secs_f64() * 1e6;
        rows.push(SizeRow {
            bytes,
            iters,
            direct_us: us(direct_t),
            vm_us: us(vm_t),
            vm_into_us: us(into_t),
            overhead_us: us(vm_t) - us(direct_t),
            direct_gbs: alg_bandwidth(bytes, direct_t),
            vm_gbs: alg_bandwidth(bytes, vm_t),
            ratio: vm_t.as_secs_f64() / direct_t.as_secs_f64(),
            ratio_range: super::spread::range(&ratios),
        });
    }
    Ok(rows)
}

/// Time `programs::mlp_dp` on `comm` (one member, on `device`), with and without overlap,
/// against `programs::mlp` on `device`: `reps` runs of `steps` steps of each, taken in turn
/// after a warm-up run of each. Fails if the loss curves differ by more than
/// `LOSS_REL_TOLERANCE`.
pub fn dp_step(
    vm: &VirtualMachine,
    comm: &Communicator,
    device: DeviceId,
    steps: usize,
    reps: usize,
) -> Result<DpStep, NcclBenchError> {
    let (steps, reps) = (steps.max(1), reps.max(1));
    let mlp_opts = MlpOptions { device, steps, ..MlpOptions::default() };
    let one = || -> Result<(Duration, Vec<f32>), NcclBenchError> {
        let t = Instant::now();
        let r = mlp(vm, &mlp_opts)?;
        Ok((t.elapsed(), r.losses))
    };
    let dp = |overlap: bool| -> Result<(Duration, Vec<f32>), NcclBenchError> {
        let t = Instant::now();
        let r = mlp_dp(vm, comm, &MlpDpOptions { mlp: mlp_opts.clone(), overlap })?;
        Ok((t.elapsed(), r.losses))
    };
    let reference = one()?.1;
    let mut diff = max_rel_diff(&dp(true)?.1, &reference);
    dp(false)?;
    let mut times: [Vec<Duration>; 3] = Default::default();
    for _ in 0..reps {
        times[0].push(one()?.0);
        for (k, overlap) in [(1, true), (2, false)] {
            let (t, losses) = dp(overlap)?;
            times[k].push(t);
            diff = diff.max(max_rel_diff(&losses, &reference));
        }
    }
    if diff.is_nan() || diff > LOSS_REL_TOLERANCE {
        return Err(NcclBenchError::Loss(diff));
    }
    let ms = |v: &[Duration]| median(v).as_secs_f64() * 1e3 / steps as f64;
    Ok(DpStep {
        steps,
        reps,
        one_rank_ms: ms(&times[0]),
        overlapped_ms: ms(&times[1]),
        after_backward_ms: ms(&times[2]),
        max_rel_diff: diff,
    })
}

/// Why the benchmark cannot run here, from whether `cuda:0` opens and whether libnccl
/// loads (`None`: both are there).
pub fn skip_reason(gpu: Result<(), String>, nccl: Result<i32, String>) -> Option<String> {
    let mut why = Vec::new();
    if let Err(e) = gpu {
        why.push(format!("no CUDA device ({e})"));
    }
    if let Err(e) = nccl {
        why.push(format!("no NCCL library ({e})"));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// Run the benchmark on `cuda:0` through a VM started with `config` plus one CUDA device,
/// or report why it skipped.
pub fn run(opts: &NcclBenchOptions, config: &Config) -> Result<NcclBenchReport, NcclBenchError> {
    let gpu = crate::ep::cuda::available(0).map_err(|e| e.to_string());
    #[cfg(feature = "cuda")]
    let nccl = crate::ep::ccl::nccl::probe().map_err(|e| e.to_string());
    #[cfg(not(feature = "cuda"))]
    let nccl: Result<i32, String> = Err("eagervm was built without the `cuda` feature".into());
    if let Some(why) = skip_reason(gpu, nccl.clone()) {
        return Ok(NcclBenchReport::skipped(why));
    }
    measure(opts, config, nccl.ok())
}

#[cfg(feature = "cuda")]
fn measure(
    opts: &NcclBenchOptions,
    config: &Config,
    nccl_version: Option<i32>,
) -> Result<NcclBenchReport, NcclBenchError> {
    use std::sync::Arc;

    let gpu = DeviceId::cuda(0);
    // The VM opens the device first, so that the primary context gets its scheduling flags
    // before the backend and the direct side use it.
    let vm = VirtualMachine::new(config.clone().with_cuda_devices(1))?;
    let backend = crate::ep::ccl::nccl::NcclBackend::local(&[0]).map_err(NcclBenchError::Communicator)?;
    let comm = vm.communicator("bench", Arc::new(backend))?;
    let rows = match sizes(opts.min_bytes, opts.max_bytes) {
        s if s.is_empty() => Vec::new(),
        s => {
            let mut direct = direct::DirectNccl::new(0)?;
            measure_sizes(&vm, &comm, gpu, &s, opts.rounds, &mut direct)?
        }
    };
    let dp =
        (opts.dp_steps > 0).then(|| dp_step(&vm, &comm, gpu, opts.dp_steps, opts.dp_reps)).transpose()?;
    Ok(NcclBenchReport {
        skipped: None,
        nccl_version,
        ranks: comm.world_size(),
        device: gpu.to_string(),
        sizes: rows,
        dp,
    })
}

#[cfg(not(feature = "cuda"))]
fn measure(_: &NcclBenchOptions, _: &Config, _: Option<i32>) -> Result<NcclBenchReport, NcclBenchError> {
    // `run` has skipped already: without the feature there is no libnccl to load.
    Ok(NcclBenchReport::skipped("eagervm was built without the `cuda` feature".into()))
}

#[cfg(test)]
mod tests;
