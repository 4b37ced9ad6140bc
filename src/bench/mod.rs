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
//! fraction of it, which stays meaningful on a shared, noisy machine.

pub mod baseline;
pub mod cpu;
pub mod cuda;

use std::time::{Duration, Instant};

use crate::ep::DeviceId;
use crate::error::Result;
use crate::framework::{Attrs, DType, Tensor};
use crate::vm::{Config, VirtualMachine};

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

    /// The end-to-end target, as a fraction of the baseline's throughput.
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
    /// Whether `ratio` meets its target and push-side cost is at most 100 ns.
    pub meets_target: bool,
    /// The slowest and fastest repetition of the VM (instructions per second).
    pub e2e_range: [f64; 2],
    /// The slowest and fastest repetition of the baseline (items per second).
    pub baseline_range: [f64; 2],
    /// CPU time per instruction of each stage (median over the repetitions), where the
    /// system tells it (Linux); `None` elsewhere.
    pub cpu_ns_per_instr: Option<cpu::StageCpu>,
}

/// Operands of one workload, generated before timing so generation is not measured.
struct Program {
    /// (reads, write) per instruction, as tensor indices.
    ops: Vec<([u16; 8], u8, u16)>,
    tensors: usize,
}

fn xorshift64star(s: &mut u64) -> u64 {
    *s ^= *s >> 12;
    *s ^= *s << 25;
    *s ^= *s >> 27;
    s.wrapping_mul(0x2545_F491_4F6C_DD1D)
}

fn program(w: Workload, n: usize) -> Program {
    let mut ops = Vec::with_capacity(n);
    let tensors = match w {
        Workload::W1 => {
            ops.extend((0..n).map(|i| ([0; 8], 0, (i % 1024) as u16)));
            1024
        }
        Workload::W2 => {
            ops.extend((0..n).map(|_| ([0; 8], 0, 0)));
            1
        }
        Workload::W3 => {
            for _ in 0..n / 10 {
                ops.push(([0; 8], 0, 0));
                for k in 1..=8u16 {
                    ops.push(([0; 8], 1, k));
                }
                ops.push(([1, 2, 3, 4, 5, 6, 7, 8], 8, 9));
            }
            10
        }
        Workload::W4 => {
            let mut s = 0x9E37_79B9_7F4A_7C15u64;
            for _ in 0..n {
                let w = (xorshift64star(&mut s) % 256) as u16;
                let a = loop {
                    let a = (xorshift64star(&mut s) % 256) as u16;
                    if a != w {
                        break a;
                    }
                };
                let b = loop {
                    let b = (xorshift64star(&mut s) % 256) as u16;
                    if b != w && b != a {
                        break b;
                    }
                };
                ops.push(([a, b, 0, 0, 0, 0, 0, 0], 2, w));
            }
            256
        }
    };
    Program { ops, tensors }
}

/// Time one repetition of `w`: (push time, end-to-end time).
fn run_once(vm: &VirtualMachine, tensors: &[Tensor], prog: &Program) -> Result<(Duration, Duration)> {
    let noop = vm.op("noop")?;
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    let t0 = Instant::now();
    vm.run(|b| -> Result<()> {
        let mut ins: [&Tensor; 8] = [&tensors[0]; 8];
        for (reads, nr, w) in &prog.ops {
            for k in 0..*nr as usize {
                ins[k] = &tensors[reads[k] as usize];
            }
            b.call_into(noop, &ins[..*nr as usize], &[&tensors[*w as usize]], Attrs::default(), cpu)?;
        }
        Ok(())
    })?;
    let t1 = Instant::now();
    vm.sync()?;
    Ok((t1 - t0, t0.elapsed()))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let k = v.len();
    if k % 2 == 1 {
        v[k / 2]
    } else {
        0.5 * (v[k / 2 - 1] + v[k / 2])
    }
}

/// Measure `w` with `n` instructions, `reps` times, against the baseline pipeline run
/// alternately in the same process.
pub fn measure(w: Workload, n: usize, reps: u32, config: &Config) -> Result<WorkloadResult> {
    let vm = VirtualMachine::new(config.clone())?;
    let prog = program(w, n);
    let n = prog.ops.len();
    let tensors: Vec<Tensor> =
        (0..prog.tensors).map(|_| vm.empty(&[], DType::F32, DeviceId::CPU)).collect::<Result<_>>()?;
    // Initialise every tensor, then warm up (pools, threads) with a tenth of the run.
    let fill = vm.op("fill")?;
    let cpu = vm.compute_stream(DeviceId::CPU)?;
    vm.run(|b| tensors.iter().try_for_each(|t| b.call_into(fill, &[], &[t], Attrs::scalar(1.0), cpu)))?;
    let warm = program(w, (n / 10).max(1000));
    run_once(&vm, &tensors, &warm)?;
    let pipeline =
        baseline::Pipeline::new(config.batch_size, config.spin, config.high_water, config.low_water);
    pipeline.run((n / 10).max(1000));
    let (mut push, mut e2e, mut base) = (Vec::new(), Vec::new(), Vec::new());
    let mut stages: Vec<cpu::StageCpu> = Vec::new();
    for _ in 0..reps.max(1) {
        let before = cpu::sample();
        let (p, e) = run_once(&vm, &tensors, &prog)?;
        if let (Some(b), Some(a)) = (before, cpu::sample()) {
            stages.push(b.stages_until(&a, n));
        }
        push.push(p.as_secs_f64() * 1e9 / n as f64);
        e2e.push(n as f64 / e.as_secs_f64());
        let b = pipeline.run(n);
        base.push(n as f64 / b.as_secs_f64());
    }
    let range =
        |v: &[f64]| [v.iter().copied().fold(f64::INFINITY, f64::min), v.iter().copied().fold(0.0, f64::max)];
    let (e2e_range, baseline_range) = (range(&e2e), range(&base));
    let cpu_ns_per_instr = (stages.len() == reps.max(1) as usize).then(|| cpu::StageCpu {
        caller: median(&mut stages.iter().map(|s| s.caller).collect::<Vec<_>>()),
        scheduler: median(&mut stages.iter().map(|s| s.scheduler).collect::<Vec<_>>()),
        workers: median(&mut stages.iter().map(|s| s.workers).collect::<Vec<_>>()),
    });
    let (push, e2e, base) = (median(&mut push), median(&mut e2e), median(&mut base));
    let ratio = e2e / base;
    Ok(WorkloadResult {
        workload: w.name(),
        instructions: n as u64,
        reps: reps.max(1),
        push_ns_per_instr: push,
        e2e_instr_per_s: e2e,
        baseline_instr_per_s: base,
        ratio,
        target_ratio: w.target_ratio(),
        meets_target: ratio >= w.target_ratio() && push <= 100.0,
        e2e_range,
        baseline_range,
        cpu_ns_per_instr,
    })
}
