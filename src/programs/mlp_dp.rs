//! `mlp-dp`: the MLP of [`mlp`](mod@super::mlp), trained data-parallel on the ranks of a
//! communicator, with gradients all-reduced in buckets that overlap the backward pass.
//!
//! # The model and the data
//!
//! Every rank holds a replica of the same two-layer perceptron, with the same initial
//! weights ([`initial_weights`], then broadcast from rank 0 as
//! a data-parallel trainer does at start), and makes the same global data set
//! ([`dataset`]). Rank `r` of `N` trains on its shard: rows
//! `r·n/N .. (r+1)·n/N` of the `n` samples (integer division, so every row is in exactly
//! one shard).
//!
//! # Why the loss curve is the one-rank curve
//!
//! The one-rank loss is `L = (1/n) Σ_i (p_i - y_i)²`. Rank `r` computes
//! `L_r = (N/n) Σ_{i in shard r} (p_i - y_i)²` (for equal shards, its shard's mean loss),
//! and its gradients are those of `L_r`. The mean over ranks of `L_r` is `L`, and the mean
//! of the ranks' gradients is the gradient of `L`, exactly in real arithmetic, for equal
//! and unequal shards alike. So all-reducing the gradients with [`ReduceOp::Mean`] and
//! taking the same SGD step on every rank gives the one-rank run on the global batch. In
//! floating point the sums are split differently (each rank adds its shard, then the
//! all-reduce adds the ranks), so the losses differ in the last bits; `docs/distributed.md`
//! states the measured difference and the tolerance the tests hold it to
//! ([`LOSS_REL_TOLERANCE`]).
//!
//! # Buckets and overlap
//!
//! The backward pass runs last layer first. Gradients are grouped in one bucket per layer
//! (`W2, b2`, then `W1, b1`); as soon as a bucket's gradients are issued on every local
//! rank, its all-reduce is issued on the communicator's collective stream, and the compute
//! streams go on with the earlier layer's backward while it runs. The SGD update of a
//! bucket's parameters is issued after the whole backward pass and reads the bucket's
//! reduced gradients: the VM's soft sync makes the compute stream wait for the collective
//! (on the device where the device can), so the update never needs the host to wait. Each
//! step also all-reduces the ranks' losses (mean), which is the global loss of the step.
//!
//! With [`MlpDpOptions::overlap`] off, every bucket is issued after the whole backward
//! pass instead (the same collectives in the same order, so the same results bit for bit):
//! the reference that shows what overlap buys. [`collective_overlap`] measures the overlap
//! on a profile of the run.
//!
//! # Ranks, processes and devices
//!
//! [`mlp_dp`] is written against any [`Communicator`]: its local members are the local
//! ranks, each with its device. On mock devices one VM holds every rank and one collective
//! call covers them all; with one rank per process (MPI, torchrun on GPUs) each process
//! runs the same function with its one member, and the communicator's backend carries the
//! collectives between processes.

use std::fmt;
use std::time::Duration;

use serde::Serialize;

use super::mlp::{dataset, initial_weights, MlpOptions};
use crate::eager::{Array, Context};
use crate::ep::ccl::ReduceOp;
use crate::ep::DeviceId;
use crate::framework::{Communicator, DType, InstructionsBuilder, Tensor, VirtualMachine};
use crate::profile::{InstrSpan, Profile};
use crate::vm::{Error, Result, StreamId};

/// The largest relative difference allowed between a loss of `mlp-dp` on 2 to 4 ranks and
/// the loss of the same step of the one-rank [`mlp`](super::mlp()) on the global batch, at
/// the default options. The measured difference is far smaller (`docs/distributed.md`).
pub const LOSS_REL_TOLERANCE: f64 = 1e-4;

/// Options of [`mlp_dp()`].
#[derive(Debug, Clone, PartialEq)]
pub struct MlpDpOptions {
    /// The model, the data and the training: `samples` is the global batch, split over
    /// the ranks. Its `device` is not used: each rank trains on its member's device.
    pub mlp: MlpOptions,
    /// Issue each bucket's all-reduce as soon as its gradients are issued, overlapping the
    /// rest of the backward pass (default), or every bucket after the backward pass.
    pub overlap: bool,
}

impl Default for MlpDpOptions {
    fn default() -> Self {
        MlpDpOptions { mlp: MlpOptions::default(), overlap: true }
    }
}

/// The gradient buckets, in the order their all-reduces are issued (last layer first).
pub const BUCKETS: [&[&str]; 2] = [&["W2", "b2"], &["W1", "b1"]];

/// What [`mlp_dp()`] did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MlpDpReport {
    /// The communicator's backend (`mock`, `mpi`, `nccl`).
    pub backend: String,
    /// Ranks over all processes.
    pub world_size: usize,
    /// The local ranks and their devices, in member order.
    pub local: Vec<(usize, String)>,
    /// The global batch.
    pub samples: usize,
    /// Samples per local rank, in member order.
    pub shards: Vec<usize>,
    /// Whether the buckets' all-reduces overlapped the backward pass.
    pub overlap: bool,
    /// Collectives per training step (one per gradient, and one for the loss).
    pub collectives_per_step: usize,
    /// The global loss before each step's update: the mean over ranks of the ranks' losses.
    pub losses: Vec<f32>,
    /// Whether every local replica ended with the same weights, bit for bit.
    pub replicas_agree: bool,
}

impl MlpDpReport {
    /// The loss before the first update.
    pub fn initial_loss(&self) -> f32 {
        self.losses.first().copied().unwrap_or(f32::NAN)
    }
    /// The loss before the last update.
    pub fn final_loss(&self) -> f32 {
        self.losses.last().copied().unwrap_or(f32::NAN)
    }
    /// Whether training more than halved the loss and the local replicas agree.
    pub fn ok(&self) -> bool {
        self.final_loss() < 0.5 * self.initial_loss() && self.replicas_agree
    }
}

impl fmt::Display for MlpDpReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let local: Vec<String> = self.local.iter().map(|(r, d)| format!("rank {r} on {d}")).collect();
        write!(
            f,
            "mlp-dp over {} rank(s) ({} backend; local: {}): global batch {} split {:?}, {} steps, \
             loss {:.6} -> {:.6} ({}); gradients all-reduced (mean) in {} buckets {}, \
             {} collectives per step; local replicas {}",
            self.world_size,
            self.backend,
            local.join(", "),
            self.samples,
            self.shards,
            self.losses.len(),
            self.initial_loss(),
            self.final_loss(),
            if self.final_loss() < 0.5 * self.initial_loss() {
                "fell by more than half"
            } else {
                "did NOT halve"
            },
            BUCKETS.len(),
            if self.overlap { "overlapping the backward pass" } else { "after the backward pass" },
            self.collectives_per_step,
            if self.replicas_agree { "agree bit for bit" } else { "DIFFER" },
        )?;
        let every = self.losses.len().div_ceil(10).max(1);
        for (i, l) in self.losses.iter().enumerate() {
            if i % every == 0 || i + 1 == self.losses.len() {
                write!(f, "\n  step {:>4}  loss {l:.6}", i + 1)?;
            }
        }
        Ok(())
    }
}

/// The rows `start..end` of rank `rank`'s shard of `samples` rows over `world` ranks.
pub fn shard(samples: usize, world: usize, rank: usize) -> (usize, usize) {
    (rank * samples / world.max(1), (rank + 1) * samples / world.max(1))
}

/// One rank's replica: its data shard and parameters.
struct Replica {
    x: Array,
    y: Array,
    w1: Array,
    b1: Array,
    w2: Array,
    b2: Array,
}

/// The activations and gradients of one rank in one step.
struct Step {
    z: Array,
    a: Array,
    diff: Array,
    dp: Option<Array>,
}

/// Issue `call` once per group of `groups` (one array per local member, in member order),
/// all in one batch; returns its outputs in the same layout.
fn collectives(
    cx: &Context,
    groups: &[Vec<&Array>],
    call: impl Fn(&mut InstructionsBuilder<'_>, &[&Tensor]) -> Result<Vec<Tensor>>,
) -> Result<Vec<Vec<Array>>> {
    // `tensor()` flushes the context: the compute calls that make the inputs reach the VM
    // before the collectives that read them.
    let tensors = groups
        .iter()
        .map(|g| g.iter().map(|a| a.tensor().cloned()).collect::<Result<Vec<Tensor>>>())
        .collect::<Result<Vec<_>>>()?;
    let outs = cx.vm().run(|b| {
        tensors.iter().map(|g| call(b, &g.iter().collect::<Vec<_>>())).collect::<Result<Vec<_>>>()
    })?;
    Ok(outs.into_iter().map(|g| g.into_iter().map(|t| cx.wrap(t)).collect()).collect())
}

/// All-reduce (mean) each group of `groups` over `comm`, in one batch.
fn all_reduce_mean(cx: &Context, comm: &Communicator, groups: &[Vec<&Array>]) -> Result<Vec<Vec<Array>>> {
    collectives(cx, groups, |b, ins| b.all_reduce(comm, ins, ReduceOp::Mean))
}

/// Train the MLP data-parallel on the local members of `comm` (module docs). Every rank of
/// the communicator, in every process, must call it with the same options.
///
/// Fails with [`Error::Config`] if the global batch has fewer samples than the
/// communicator has ranks; with the VM's errors otherwise (a failed collective carries its
/// error onto the losses and weights it feeds).
pub fn mlp_dp(vm: &VirtualMachine, comm: &Communicator, opts: &MlpDpOptions) -> Result<MlpDpReport> {
    mlp_dp_keeping(vm, comm, opts, &mut Vec::new())
}

/// [`mlp_dp()`], also pushing onto `keep` handles to the per-step losses and to every
/// local replica's trained weights (`W1, b1, W2, b2` per member, in member order).
pub fn mlp_dp_keeping(
    vm: &VirtualMachine,
    comm: &Communicator,
    opts: &MlpDpOptions,
    keep: &mut Vec<Tensor>,
) -> Result<MlpDpReport> {
    let m = &opts.mlp;
    let world = comm.world_size();
    let (n, d, h) = (m.samples, m.inputs, m.hidden);
    if n < world {
        return Err(Error::Config(format!(
            "a global batch of {n} samples cannot be split over {world} ranks"
        )));
    }
    let cx = Context::new(vm);
    let members = comm.members().to_vec();
    let (xv, yv) = dataset(m);
    let (w1v, w2v) = initial_weights(m);
    let mut shards = Vec::with_capacity(members.len());
    let mut reps = Vec::with_capacity(members.len());
    for mem in &members {
        let dev = mem.device;
        let (lo, hi) = shard(n, world, mem.rank);
        shards.push(hi - lo);
        reps.push(Replica {
            x: cx.from_slice(&xv[lo * d..hi * d], &[hi - lo, d], dev)?,
            y: cx.from_slice(&yv[lo..hi], &[hi - lo, 1], dev)?,
            w1: cx.from_slice(&w1v, &[d, h], dev)?,
            b1: cx.zeros(&[h], DType::F32, dev)?,
            w2: cx.from_slice(&w2v, &[h, 1], dev)?,
            b2: cx.zeros(&[1], DType::F32, dev)?,
        });
    }
    // Rank 0's parameters on every rank, as a data-parallel trainer starts.
    let groups: Vec<Vec<&Array>> = vec![
        reps.iter().map(|r| &r.w1).collect(),
        reps.iter().map(|r| &r.b1).collect(),
        reps.iter().map(|r| &r.w2).collect(),
        reps.iter().map(|r| &r.b2).collect(),
    ];
    let params = collectives(&cx, &groups, |b, ins| b.broadcast(comm, ins, 0))?;
    drop(groups);
    let mut params = params.into_iter().map(Vec::into_iter);
    let mut next = || params.next().expect("one group per parameter");
    let (w1s, b1s, w2s, b2s) = (next(), next(), next(), next());
    for (r, (((w1, b1), w2), b2)) in reps.iter_mut().zip(w1s.zip(b1s).zip(w2s).zip(b2s)) {
        (r.w1, r.b1, r.w2, r.b2) = (w1, b1, w2, b2);
    }
    // Rank r's loss and gradients are those of (N/n) Σ_shard (p - y)² (module docs).
    let per_rank = world as f64 / n as f64;
    let lr = m.lr as f64;
    let mut losses: Vec<Array> = Vec::with_capacity(m.steps);
    for _ in 0..m.steps {
        // Forward, and the global loss.
        let mut steps = Vec::with_capacity(reps.len());
        let mut local_losses = Vec::with_capacity(reps.len());
        for r in &reps {
            let z = r.x.matmul(&r.w1)?.add_bias(&r.b1)?;
            let a = z.relu()?;
            let p = a.matmul(&r.w2)?.add_bias(&r.b2)?;
            let diff = p.sub(&r.y)?;
            local_losses.push(diff.mul(&diff)?.sum()?.scale(per_rank)?);
            steps.push(Step { z, a, diff, dp: None });
        }
        let mut loss = all_reduce_mean(&cx, comm, &[local_losses.iter().collect()])?;
        losses.push(loss.remove(0).remove(0));
        // Backward of layer 2: its bucket.
        let mut g2 = (Vec::new(), Vec::new());
        for s in &mut steps {
            let dp = s.diff.scale(2.0 * per_rank)?;
            g2.0.push(s.a.matmul_tn(&dp)?);
            g2.1.push(dp.sum_rows()?);
            s.dp = Some(dp);
        }
        let bucket2 = [g2.0.iter().collect(), g2.1.iter().collect()];
        let mut reduced2 = if opts.overlap { Some(all_reduce_mean(&cx, comm, &bucket2)?) } else { None };
        // Backward of layer 1 (while bucket 2 is reduced), then its bucket.
        let mut g1 = (Vec::new(), Vec::new());
        for (s, r) in steps.iter().zip(&reps) {
            let dp = s.dp.as_ref().expect("set above");
            let dz = s.z.relu_grad(&dp.matmul_nt(&r.w2)?)?;
            g1.0.push(r.x.matmul_tn(&dz)?);
            g1.1.push(dz.sum_rows()?);
        }
        if reduced2.is_none() {
            reduced2 = Some(all_reduce_mean(&cx, comm, &bucket2)?);
        }
        let reduced2 = reduced2.expect("set above");
        let reduced1 = all_reduce_mean(&cx, comm, &[g1.0.iter().collect(), g1.1.iter().collect()])?;
        // SGD from the reduced gradients: the same update on every rank.
        for (i, r) in reps.iter_mut().enumerate() {
            r.w2 = r.w2.sub(&reduced2[0][i].scale(lr)?)?;
            r.b2 = r.b2.sub(&reduced2[1][i].scale(lr)?)?;
            r.w1 = r.w1.sub(&reduced1[0][i].scale(lr)?)?;
            r.b1 = r.b1.sub(&reduced1[1][i].scale(lr)?)?;
        }
    }
    for l in &losses {
        keep.push(l.tensor()?.clone());
    }
    let mut weights = Vec::with_capacity(reps.len());
    for r in &reps {
        let mut w = Vec::new();
        for a in [&r.w1, &r.b1, &r.w2, &r.b2] {
            keep.push(a.tensor()?.clone());
            w.push(a.to_vec::<f32>()?.into_iter().map(f32::to_bits).collect::<Vec<_>>());
        }
        weights.push(w);
    }
    let replicas_agree = weights.windows(2).all(|p| p[0] == p[1]);
    let losses = losses.iter().map(|l| l.item::<f32>()).collect::<Result<Vec<_>>>()?;
    Ok(MlpDpReport {
        backend: comm.backend().to_string(),
        world_size: world,
        local: members.iter().map(|mem| (mem.rank, mem.device.to_string())).collect(),
        samples: n,
        shards,
        overlap: opts.overlap,
        collectives_per_step: 1 + BUCKETS.iter().map(|b| b.len()).sum::<usize>(),
        losses,
        replicas_agree,
    })
}

/// The largest relative difference between two loss curves, step by step (infinite if
/// their lengths differ or a loss is not finite).
pub fn max_rel_diff(a: &[f32], b: &[f32]) -> f64 {
    if a.len() != b.len() {
        return f64::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(&x, &y)| {
            let (x, y) = (x as f64, y as f64);
            if !x.is_finite() || !y.is_finite() {
                f64::INFINITY
            } else {
                (x - y).abs() / x.abs().max(y.abs()).max(f64::MIN_POSITIVE)
            }
        })
        .fold(0.0, f64::max)
}

/// How much of a data-parallel run's gradient reduction overlapped its backward pass, from
/// a profile of the run ([`collective_overlap`]).
///
/// An instruction's slice here is the time it ran: from when it was launched, or when the
/// instruction before it on its stream was done if that is later (a stream runs its work in
/// order, so a launched instruction waits for its predecessors), to when it was done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// All-reduces followed, in program order, by work on a compute stream before the next
    /// collective (in [`mlp_dp()`], backward work): those that could overlap it.
    pub candidates: usize,
    /// Of those, the ones that overlapped it: their slice intersects the slice of such an
    /// instruction, and they finished before the last of them did (so they were not left
    /// waiting for that work to end).
    pub overlapped: usize,
    /// Time during which the collective stream ran an all-reduce.
    pub collective_busy: Duration,
    /// Time during which the collective stream ran an all-reduce while a compute stream
    /// ran work that may overlap one.
    pub overlapped_time: Duration,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let pct = if self.collective_busy.is_zero() {
            0.0
        } else {
            100.0 * self.overlapped_time.as_secs_f64() / self.collective_busy.as_secs_f64()
        };
        write!(
            f,
            "{} of {} all-reduces followed by compute work overlapped it; all-reduce time overlapping \
             that work: {:.3} of {:.3} ms ({pct:.0}%)",
            self.overlapped,
            self.candidates,
            self.overlapped_time.as_secs_f64() * 1e3,
            self.collective_busy.as_secs_f64() * 1e3,
        )
    }
}

/// The time each instruction of `instrs` (in program order) ran: from its launch or its
/// stream predecessor's completion, whichever is later, to its completion.
fn run_slices(instrs: &[InstrSpan]) -> Vec<(Duration, Duration)> {
    let mut last_done: Vec<(StreamId, Duration)> = Vec::new();
    instrs
        .iter()
        .map(|i| {
            let start = match last_done.iter_mut().find(|(s, _)| *s == i.stream) {
                Some((_, d)) => {
                    let start = i.launched.max(*d);
                    *d = (*d).max(i.done);
                    start
                }
                None => {
                    last_done.push((i.stream, i.done));
                    i.launched
                }
            };
            (start.min(i.done), i.done)
        })
        .collect()
}

/// Measure, on `profile`, how the all-reduces on `collective` (a communicator's stream)
/// overlapped the work issued after them on the `compute` streams (see [`Overlap`]).
///
/// The work that may overlap an all-reduce is every op on a compute stream issued after it
/// and before the next collective of the stream: in [`mlp_dp()`], the backward pass of
/// layer 2 for the loss's all-reduce, and the backward pass of layer 1 for layer 2's
/// bucket. The VM's own instructions (`RecordEvent`, `StreamWaitEvent`, `Release`) are
/// not counted as work.
pub fn collective_overlap(profile: &Profile, collective: StreamId, compute: &[StreamId]) -> Overlap {
    let instrs = profile.instructions();
    let slices = run_slices(instrs);
    // Indices into `instrs`, in program order (`instructions()` is sorted by it).
    let reduces: Vec<usize> = (0..instrs.len())
        .filter(|&k| instrs[k].stream == collective && instrs[k].name.starts_with("all_reduce"))
        .collect();
    let collectives: Vec<usize> = (0..instrs.len())
        .filter(|&k| instrs[k].stream == collective && instrs[k].name.contains('@'))
        .collect();
    let backward: Vec<usize> = (0..instrs.len())
        .filter(|&k| {
            let i = &instrs[k];
            compute.contains(&i.stream) && i.name.starts_with(|c: char| c.is_ascii_lowercase())
        })
        .collect();
    let (mut candidates, mut overlapped, mut windows) = (0, 0, Vec::new());
    for &r in &reduces {
        let next = collectives.iter().find(|&&c| c > r).copied().unwrap_or(usize::MAX);
        let after: Vec<usize> = backward.iter().copied().filter(|&b| b > r && b < next).collect();
        if after.is_empty() {
            continue;
        }
        candidates += 1;
        windows.extend_from_slice(&after);
        let (rs, re) = slices[r];
        let last_done = after.iter().map(|&b| slices[b].1).max().unwrap_or_default();
        let intersects = after.iter().any(|&b| slices[b].0 < re && rs < slices[b].1);
        if intersects && re < last_done {
            overlapped += 1;
        }
    }
    let union = |v: &[usize]| {
        let mut s: Vec<(Duration, Duration)> = v.iter().map(|&k| slices[k]).collect();
        s.sort_unstable();
        merge(&s)
    };
    let (red, back) = (union(&reduces), union(&windows));
    Overlap {
        candidates,
        overlapped,
        collective_busy: red.iter().map(|(a, b)| *b - *a).sum(),
        overlapped_time: intersection(&red, &back),
    }
}

/// Merge sorted intervals into disjoint ones.
fn merge(spans: &[(Duration, Duration)]) -> Vec<(Duration, Duration)> {
    let mut out: Vec<(Duration, Duration)> = Vec::new();
    for &(s, e) in spans {
        match out.last_mut() {
            Some((_, le)) if s <= *le => *le = (*le).max(e),
            _ => out.push((s, e)),
        }
    }
    out
}

/// Total length of the intersection of two sets of disjoint sorted intervals.
fn intersection(a: &[(Duration, Duration)], b: &[(Duration, Duration)]) -> Duration {
    let (mut i, mut j, mut total) = (0, 0, Duration::ZERO);
    while i < a.len() && j < b.len() {
        let (s, e) = (a[i].0.max(b[j].0), a[i].1.min(b[j].1));
        if s < e {
            total += e - s;
        }
        if a[i].1 < b[j].1 {
            i += 1;
        } else {
            j += 1;
        }
    }
    total
}

/// The mock devices `mock:0 .. mock:ranks-1`, for a one-process run of [`mlp_dp()`].
pub fn mock_devices(ranks: usize) -> Vec<DeviceId> {
    (0..ranks).map(|r| DeviceId::mock(r as u16)).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn shards_cover_every_row_once() {
        for (n, w) in [(64, 2), (64, 3), (64, 4), (5, 5), (7, 1)] {
            let mut next = 0;
            for r in 0..w {
                let (lo, hi) = shard(n, w, r);
                assert_eq!(lo, next);
                assert!(hi > lo);
                next = hi;
            }
            assert_eq!(next, n);
        }
    }

    #[test]
    fn interval_arithmetic() {
        assert_eq!(
            merge(&[(ms(0), ms(2)), (ms(1), ms(3)), (ms(5), ms(6))]),
            [(ms(0), ms(3)), (ms(5), ms(6))]
        );
        let a = [(ms(0), ms(3)), (ms(5), ms(6))];
        let b = [(ms(2), ms(5)), (ms(5), ms(10))];
        assert_eq!(intersection(&a, &b), ms(2));
        assert_eq!(intersection(&a, &[]), Duration::ZERO);
    }

    #[test]
    fn relative_differences() {
        assert_eq!(max_rel_diff(&[1.0, 2.0], &[1.0, 2.0]), 0.0);
        assert!((max_rel_diff(&[1.0, 2.0], &[1.0, 2.002]) - 0.002 / 2.002).abs() < 1e-6);
        assert_eq!(max_rel_diff(&[1.0], &[1.0, 2.0]), f64::INFINITY);
        assert_eq!(max_rel_diff(&[f32::NAN], &[1.0]), f64::INFINITY);
    }
}
