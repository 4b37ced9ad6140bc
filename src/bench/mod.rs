//! The throughput benchmark behind `eagervm bench`.
//!
//! Four no-op workloads on the CPU stream, the same four that
//! `shared/baselines/mxnet-engine` runs on MXNet's engine:
//!
//! - **W1 independent**: instruction `i` writes tensor `i % 1024`;
//! - **W2 chain**: every instruction writes the same tensor;
//! - **W3 fan-out/fan-in**: one writer of X, eight readers of X each writing its own Y_k,
//!   one reader of Y_1..Y_8 writing Z, repeated;
//! - **W4 random DAG**: each instruction reads two and writes a third of 256 tensors
//!   (xorshift64* with a fixed seed, the same DAG as the MXNet harness).
//!
//! In the same run it measures [`baseline`]: the same number of no-op items passed through
//! a bare three-thread pipeline (caller → forwarder → worker over batched lock-free queues,
//! the same batch size and the same sleep/wake protocol as the VM, no dependency work).
//! That pipeline is the bound for any runtime of this shape; the VM is reported as a
//! fraction of it, which stays meaningful on a shared, noisy machine. Alongside, it
//! measures a floor (`src/bench/floor.rs`): the same pipeline doing only the least work
//! per instruction that any dependency-tracking runtime does, so that a ratio can be read
//! against what is possible at all. The verdict on W1–W4 is the VM's throughput as a
//! fraction of the floor's, against [`FLOOR_TARGET`].
//!
//! [`ops`] holds W5–W9, the paths W1–W4 skip (a DAG across streams, the allocating `call`,
//! the eager front end, a round trip), and [`mlp`] the training step of `eagervm run mlp` at
//! its own and at larger shapes. [`busy`] starts the competitors of `--busy K` and reads the
//! load average every report states.

pub mod baseline;
pub mod busy;
pub mod cpu;
pub mod cuda;
mod floor;
pub mod mlp;
pub mod nccl;
pub mod ops;
pub mod progress;
pub mod report;
pub mod spread;

pub use progress::Progress;
pub use spread::median;

use std::time::{Duration, Instant};

use crate::ep::DeviceId;
use crate::framework::{Attrs, DType, InstructionsBuilder, Op, Tensor};
use crate::vm::{Config, StreamId};
use crate::vm::{Error, Result};
use crate::VirtualMachine;

/// One of the four workloads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Workload {
    /// Independent writes over 1024 tensors.
    W1,
    /// One write chain.
    W2,
    /// Fan-out/fan-in groups of ten.
    W3,
    /// Random DAG over 256 tensors.
    W4,
}

impl Workload {
    /// All four, in order.
    pub const ALL: [Workload; 4] = [Workload::W1, Workload::W2, Workload::W3, Workload::W4];

    /// `W1`..`W4`.
    pub fn name(self) -> &'static str {
        match self {
            Workload::W1 => "W1",
            Workload::W2 => "W2",
            Workload::W3 => "W3",
            Workload::W4 => "W4",
        }
    }

    /// A one-line description.
    pub fn describe(self) -> &'static str {
        match self {
            Workload::W1 => "independent",
            Workload::W2 => "chain",
            Workload::W3 => "fan-out/fan-in",
            Workload::W4 => "random DAG",
        }
    }

    /// The end-to-end target, as a fraction of the baseline's throughput (reported; the
    /// verdict is taken against the floor, [`FLOOR_TARGET`]).
    pub fn target_ratio(self) -> f64 {
        match self {
            Workload::W1 => 0.50,
            _ => 0.33,
        }
    }

    /// Parse `1`..`4` or `W1`..`W4`.
    pub fn parse(s: &str) -> Option<Workload> {
        match s.trim().trim_start_matches(['W', 'w']) {
            "1" => Some(Workload::W1),
            "2" => Some(Workload::W2),
            "3" => Some(Workload::W3),
            "4" => Some(Workload::W4),
            _ => None,
        }
    }
}

/// The verdict's bar: the VM's throughput as a fraction of the floor's, measured in the
/// same run (the median over the repetitions).
pub const FLOOR_TARGET: f64 = 0.65;

/// The most instructions issued in one `vm.run` (and one pass of the baseline and the
/// floor): progress is reported between chunks, and W4's and W5's generated programs hold
/// one chunk, repeated for longer runs. A multiple of 1024 and of 10, so that W1–W3 are the
/// same program in chunks as in one piece.
pub const CHUNK: usize = 4_096_000;

/// The measurements of one workload (medians over the repetitions).
#[derive(Debug, Clone, serde::Serialize)]
pub struct WorkloadResult {
    /// `W1`..`W4`.
    pub workload: &'static str,
    /// Instructions per repetition.
    pub instructions: u64,
    /// Repetitions measured.
    pub reps: u32,
    /// Caller time to build and submit, per instruction (ns).
    pub push_ns_per_instr: f64,
    /// Instructions per second from the first submission to the end of `sync`.
    pub e2e_instr_per_s: f64,
    /// Items per second through the bare pipeline, measured in the same run.
    pub baseline_instr_per_s: f64,
    /// `e2e_instr_per_s / baseline_instr_per_s`.
    pub ratio: f64,
    /// The target for `ratio`.
    pub target_ratio: f64,
    /// Whether `of_floor` is at least [`FLOOR_TARGET`] and the push-side cost at most
    /// 100 ns per instruction.
    pub meets_target: bool,
    /// `e2e_instr_per_s / floor_instr_per_s`: the VM as a fraction of the floor.
    pub of_floor: f64,
    /// Whether the repetitions of the VM, the baseline or the floor disagree by more than
    /// twice (`spread::DISAGREEMENT`): a verdict from such a run says little.
    pub noisy: bool,
    /// The slowest and fastest repetition of the VM (instructions per second).
    pub e2e_range: [f64; 2],
    /// The slowest and fastest repetition of the baseline (items per second).
    pub baseline_range: [f64; 2],
    /// The slowest and fastest repetition of the floor (instructions per second).
    pub floor_range: [f64; 2],
    /// CPU time per instruction of each stage (median over the repetitions), where the
    /// system tells it (Linux); `None` elsewhere.
    pub cpu_ns_per_instr: Option<cpu::StageCpu>,
    /// The baseline's CPU time per item of each stage (its forwarder in `scheduler`).
    pub baseline_cpu_ns_per_instr: Option<cpu::StageCpu>,
    /// Instructions per second through the floor (the bare pipeline plus the least work
    /// per instruction of any dependency-tracking runtime), measured in the same run.
    pub floor_instr_per_s: f64,
    /// `floor_instr_per_s / baseline_instr_per_s`: the best `ratio` that the floor's work
    /// alone allows.
    pub floor_ratio: f64,
    /// The floor's CPU time per instruction of each stage (its forwarder in `scheduler`).
    pub floor_cpu_ns_per_instr: Option<cpu::StageCpu>,
}

/// One workload's instructions, in the form its timed loop reads them.
///
/// The loop that issues them is the caller's side of the measurement, and the bare
/// pipeline it is compared with reads no program at all: so W1 to W3 are computed from
/// the instruction's index as they are issued, and only W4's random DAG is generated
/// beforehand (generation is not measured), three bytes per instruction. (A general
/// record of 20 bytes per instruction is streamed from memory, a cost of the harness that
/// would count as the caller's: `docs/performance.md`, "Why the hot paths are shaped so",
/// has the measurement.)
enum Program {
    /// W1: instruction `i` writes tensor `i % 1024`.
    Independent { n: usize },
    /// W2: every instruction writes tensor 0.
    Chain { n: usize },
    /// W3: `groups` times: write X (tensor 0); eight readers of X each write Y_k (tensor
    /// k); one reader of Y_1..Y_8 writes Z (tensor 9).
    FanOutIn { groups: usize },
    /// W4: per instruction, two tensors read and one written, of 256.
    Dag { ops: Vec<[u8; 3]> },
}

pub(crate) fn xorshift64star(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

impl Program {
    /// Workload `w` with about `n` instructions (W3 rounds down to whole groups of ten).
    fn new(w: Workload, n: usize) -> Program {
        match w {
            Workload::W1 => Program::Independent { n },
            Workload::W2 => Program::Chain { n },
            Workload::W3 => Program::FanOutIn { groups: n / 10 },
            Workload::W4 => {
                let mut s = 0x9E37_79B9_7F4A_7C15u64;
                let mut draw = |not: &[u8]| loop {
                    let t = (xorshift64star(&mut s) % 256) as u8;
                    if !not.contains(&t) {
                        break t;
                    }
                };
                let ops = (0..n)
                    .map(|_| {
                        let w = draw(&[]);
                        let a = draw(&[w]);
                        let b = draw(&[w, a]);
                        [a, b, w]
                    })
                    .collect();
                Program::Dag { ops }
            }
        }
    }

    /// How many tensors it uses.
    fn tensors(&self) -> usize {
        match self {
            Program::Independent { .. } => 1024,
            Program::Chain { .. } => 1,
            Program::FanOutIn { .. } => 10,
            Program::Dag { .. } => 256,
        }
    }

    /// How many instructions it issues.
    fn len(&self) -> usize {
        match self {
            Program::Independent { n } | Program::Chain { n } => *n,
            Program::FanOutIn { groups } => groups * 10,
            Program::Dag { ops } => ops.len(),
        }
    }

    /// Issue every instruction, in order, as a `noop` call on `stream`.
    fn issue(&self, b: &mut InstructionsBuilder<'_>, noop: Op, t: &[Tensor], stream: StreamId) -> Result<()> {
        let none = Attrs::default();
        match self {
            Program::Independent { n } => {
                for i in 0..*n {
                    b.call_into(noop, &[], &[&t[i % 1024]], none, stream)?;
                }
            }
            Program::Chain { n } => {
                for _ in 0..*n {
                    b.call_into(noop, &[], &[&t[0]], none, stream)?;
                }
            }
            Program::FanOutIn { groups } => {
                let ys: [&Tensor; 8] = std::array::from_fn(|k| &t[k + 1]);
                for _ in 0..*groups {
                    b.call_into(noop, &[], &[&t[0]], none, stream)?;
                    for y in ys {
                        b.call_into(noop, &[&t[0]], &[y], none, stream)?;
                    }
                    b.call_into(noop, &ys, &[&t[9]], none, stream)?;
                }
            }
            Program::Dag { ops } => {
                for &[a, c, w] in ops {
                    b.call_into(noop, &[&t[a as usize], &t[c as usize]], &[&t[w as usize]], none, stream)?;
                }
            }
        }
        Ok(())
    }
}

/// A run of `n` instructions of one workload, in chunks of at most [`CHUNK`]: `full`
/// passes of the chunk's program, then the rest.
struct Chunked {
    chunk: Program,
    full: usize,
    rest: Option<Program>,
}

impl Chunked {
    fn new(w: Workload, n: usize) -> Chunked {
        let chunk = Program::new(w, n.min(CHUNK));
        let (full, rest) = match n.checked_div(CHUNK) {
            Some(full) if full >= 1 => (full, (n % CHUNK > 0).then(|| Program::new(w, n % CHUNK))),
            _ => (1, None),
        };
        Chunked { chunk, full, rest }
    }

    /// Every pass, in order.
    fn passes(&self) -> impl Iterator<Item = &Program> {
        std::iter::repeat_n(&self.chunk, self.full).chain(self.rest.as_ref())
    }

    /// Instructions over all passes.
    fn len(&self) -> usize {
        self.passes().map(Program::len).sum()
    }
}

/// Time one repetition of `run`: (push time, end-to-end time).
fn run_once(
    vm: &VirtualMachine,
    tensors: &[Tensor],
    run: &Chunked,
    progress: &Progress,
) -> Result<(Duration, Duration)> {
    let noop = vm.op("noop")?;
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let (t0, mut push) = (Instant::now(), Duration::ZERO);
    for prog in run.passes() {
        let t = Instant::now();
        vm.run(|b| prog.issue(b, noop, tensors, cpu))?;
        push += t.elapsed();
        progress.advance(prog.len() as u64);
    }
    vm.sync()?;
    Ok((push, t0.elapsed()))
}

/// The medians of each stage's CPU time over `stages`, if every repetition was sampled.
fn median_stages(stages: &[cpu::StageCpu], reps: usize) -> Option<cpu::StageCpu> {
    let of = |f: fn(&cpu::StageCpu) -> f64| median(&mut stages.iter().map(f).collect::<Vec<_>>());
    (stages.len() == reps).then(|| cpu::StageCpu {
        caller: of(|s| s.caller),
        scheduler: of(|s| s.scheduler),
        workers: of(|s| s.workers),
    })
}

/// Measure `w` with `n` instructions, `reps` times, against the baseline pipeline and the
/// floor, the three run in turn in the same process.
pub fn measure(w: Workload, n: usize, reps: u32, config: &Config) -> Result<WorkloadResult> {
    measure_with(w, n, reps, config, &Progress::hidden())
}

/// [`measure`], reporting progress to `progress` once per chunk of instructions.
pub fn measure_with(
    w: Workload,
    n: usize,
    reps: u32,
    config: &Config,
    progress: &Progress,
) -> Result<WorkloadResult> {
    let reps = reps.max(1);
    let vm = VirtualMachine::new(config.clone())?;
    let prog = Chunked::new(w, n);
    let n = prog.len();
    let tensors: Vec<Tensor> =
        (0..prog.chunk.tensors()).map(|_| vm.empty(&[], DType::F32, DeviceId::CPU)).collect::<Result<_>>()?;
    // Initialise every tensor, then warm up (pools, threads) with a tenth of the run.
    let fill = vm.op("fill")?;
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    vm.run(|b| tensors.iter().try_for_each(|t| b.call_into(fill, &[], &[t], Attrs::scalar(1.0), cpu)))?;
    let warm = Chunked::new(w, (n / 10).clamp(1000, CHUNK));
    let warm_n = warm.len();
    progress.start(format!("{} warm-up", w.name()), 3 * (warm_n + n * reps as usize) as u64);
    run_once(&vm, &tensors, &warm, progress)?;
    let mut pipeline =
        baseline::Pipeline::new(config.batch_size, config.backoff(), config.high_water, config.low_water)
            .map_err(|e| Error::Config(format!("cannot start the baseline pipeline's threads: {e}")))?;
    let mut run_pipeline = |run: &Chunked| {
        run.passes().fold(Duration::ZERO, |d, p| {
            let d = d + pipeline.run(p.len());
            progress.advance(p.len() as u64);
            d
        })
    };
    run_pipeline(&warm);
    let mut floor = floor::Floor::new(
        prog.chunk.tensors(),
        config.batch_size,
        config.backoff(),
        config.high_water,
        config.low_water,
    )
    .map_err(|e| Error::Config(format!("cannot start the floor pipeline's threads: {e}")))?;
    let mut run_floor = |run: &Chunked| {
        run.passes().fold(Duration::ZERO, |d, p| {
            let d = d + floor.run(p);
            progress.advance(p.len() as u64);
            d
        })
    };
    run_floor(&warm);
    let (mut push, mut e2e, mut base, mut floor_e2e) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut stages, mut base_stages, mut floor_stages) = (Vec::new(), Vec::new(), Vec::new());
    for rep in 1..=reps {
        progress.phase(format!("{} rep {rep}/{reps}: vm", w.name()));
        let before = cpu::sample();
        let (p, e) = run_once(&vm, &tensors, &prog, progress)?;
        if let (Some(b), Some(a)) = (before, cpu::sample()) {
            stages.push(b.stages_until(&a, n));
        }
        push.push(p.as_secs_f64() * 1e9 / n as f64);
        e2e.push(n as f64 / e.as_secs_f64());
        progress.phase(format!("{} rep {rep}/{reps}: baseline", w.name()));
        let before = cpu::sample();
        let b = run_pipeline(&prog);
        if let (Some(b), Some(a)) = (before, cpu::sample()) {
            base_stages.push(b.stages_named(&a, n, "baseline-fwd", "baseline-work"));
        }
        base.push(n as f64 / b.as_secs_f64());
        progress.phase(format!("{} rep {rep}/{reps}: floor", w.name()));
        let before = cpu::sample();
        let f = run_floor(&prog);
        if let (Some(b), Some(a)) = (before, cpu::sample()) {
            floor_stages.push(b.stages_named(&a, n, "floor-fwd", "floor-work"));
        }
        floor_e2e.push(n as f64 / f.as_secs_f64());
    }
    let noisy = spread::disagree(&e2e) || spread::disagree(&base) || spread::disagree(&floor_e2e);
    // The fraction of the floor per repetition, both timed within the same minute.
    let mut of_floor: Vec<f64> = e2e.iter().zip(&floor_e2e).map(|(v, f)| v / f).collect();
    let (e2e_range, baseline_range, floor_range) =
        (spread::range(&e2e), spread::range(&base), spread::range(&floor_e2e));
    let cpu_ns_per_instr = median_stages(&stages, reps as usize);
    let baseline_cpu_ns_per_instr = median_stages(&base_stages, reps as usize);
    let floor_cpu_ns_per_instr = median_stages(&floor_stages, reps as usize);
    let (push, e2e, base) = (median(&mut push), median(&mut e2e), median(&mut base));
    let floor_e2e = median(&mut floor_e2e);
    let of_floor = median(&mut of_floor);
    let ratio = e2e / base;
    Ok(WorkloadResult {
        workload: w.name(),
        instructions: n as u64,
        reps,
        push_ns_per_instr: push,
        e2e_instr_per_s: e2e,
        baseline_instr_per_s: base,
        ratio,
        target_ratio: w.target_ratio(),
        meets_target: of_floor >= FLOOR_TARGET && push <= 100.0,
        of_floor,
        noisy,
        e2e_range,
        baseline_range,
        floor_range,
        cpu_ns_per_instr,
        baseline_cpu_ns_per_instr,
        floor_instr_per_s: floor_e2e,
        floor_ratio: floor_e2e / base,
        floor_cpu_ns_per_instr,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_random_dag_is_fixed_and_each_instruction_names_three_tensors() {
        let Program::Dag { ops } = Program::new(Workload::W4, 10_000) else { panic!("W4 is a DAG") };
        let Program::Dag { ops: again } = Program::new(Workload::W4, 10_000) else { panic!("W4 is a DAG") };
        assert_eq!(ops, again, "the same DAG every run");
        assert!(ops.iter().all(|&[a, b, w]| a != b && a != w && b != w));
        // The generator spreads over all 256 tensors.
        let mut seen = [false; 256];
        ops.iter().flatten().for_each(|&t| seen[t as usize] = true);
        assert!(seen.iter().all(|&s| s));
    }

    #[test]
    fn every_workload_runs_its_instructions_to_the_end() {
        for w in Workload::ALL {
            let r = measure(w, 1000, 1, &Config::default()).expect("measured");
            assert_eq!(r.instructions, 1000, "{}", w.name());
            assert!(r.e2e_instr_per_s > 0.0 && r.baseline_instr_per_s > 0.0 && r.floor_instr_per_s > 0.0);
            assert!(r.of_floor > 0.0 && r.of_floor.is_finite());
        }
    }

    #[test]
    fn a_long_run_is_the_chunk_repeated_then_the_rest() {
        let run = Chunked::new(Workload::W1, 2 * CHUNK + 5000);
        assert_eq!(run.len(), 2 * CHUNK + 5000);
        assert_eq!(run.passes().count(), 3);
        let short = Chunked::new(Workload::W3, 1005);
        assert_eq!((short.len(), short.passes().count()), (1000, 1), "W3 rounds down to groups of ten");
        let exact = Chunked::new(Workload::W4, CHUNK);
        assert_eq!((exact.len(), exact.passes().count()), (CHUNK, 1));
    }
}
