//! The floor: the bare pipeline of [`super::baseline`] plus the least work per instruction
//! that a runtime of the VM's shape cannot skip, on the same workloads.
//!
//! The bare pipeline moves items and does nothing else, so the VM's ratio to it mixes two
//! things: the work any dependency-tracking runtime must do per instruction, and what the
//! VM adds beyond that. The floor measures the first in the same run, so that the two can
//! be told apart. Each stage does, per instruction, only this:
//!
//! - **caller**: for each operand, the check of a call (the tensor is alive and on the
//!   stream's device, one line read) and soft sync's bookkeeping (the tensor's last stream
//!   compared, and stored when it differs); then the instruction (kernel and operand
//!   numbers, one cache line, as large as the VM's) is written into the batch;
//! - **forwarder** (the scheduler's place): for each operand, the read or write rule on the
//!   tensor's dependence line (the last writer, and the last reader since), with an edge
//!   counted where an access on record is on another stream;
//! - **worker**: for each operand, its value line's storage read, then the kernel called
//!   through a pointer with the operands' storage.
//!
//! Each of a tensor's three lines is in an array of its own, owned by the one stage that
//! touches it. What the VM does that the floor leaves out: the call's signature and shape
//! checks, aliasing checks, tensors' reference counts and releases, edges between
//! instructions and their release, retirement per stream, errors carried on tensors,
//! allocation on first write, kernel views, and every instruction kind but the call. So
//! the floor is a lower bound on what any such runtime costs, not a runtime itself.

use std::hint::black_box;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::baseline::Stages;
use super::Program;
use crate::sync::notify::Backoff;

/// The most operands one instruction of the workloads has (W3's fan-in: eight inputs and
/// one output).
const MAX_OPERANDS: usize = 9;

/// One instruction: a kernel and its operands' tensor numbers (inputs first), one cache
/// line, as large as one of the VM's instructions.
#[derive(Clone, Copy)]
#[repr(align(64))]
struct Instr {
    kernel: fn(&[&f32]),
    n_inputs: u8,
    n: u8,
    ops: [u32; MAX_OPERANDS],
}

fn noop(operands: &[&f32]) {
    black_box(operands);
}

/// The device every floor tensor lives on, and the one stream every instruction runs on.
const DEVICE: u32 = 0;
const STREAM: u32 = 0;

/// A tensor's line on the caller's side: what the check of a call reads, and soft sync's
/// last stream.
#[repr(align(64))]
struct CheckLine {
    device: u32,
    released: bool,
    last_stream: u32,
}

/// A tensor's dependence line, the forwarder's: the last writer, and the last reader since
/// that write, each `stream << 48 | position` (positions start at 1), 0 for none.
#[derive(Default)]
#[repr(align(64))]
struct DepLine {
    last_write: u64,
    reader: u64,
}

/// A tensor's value line, the worker's: its storage.
#[repr(align(64))]
struct ValueLine {
    data: Box<f32>,
}

/// Whether `access` (one on record, or 0 for none) is on another stream than `me`.
#[inline(always)]
fn other_stream(access: u64, me: u64) -> bool {
    (access != 0) & ((access ^ me) >> 48 != 0)
}

/// What the floor's stages counted (once per batch, in every build), for its tests.
#[derive(Default)]
struct Counts {
    /// Operands the worker passed to kernels.
    operands: AtomicU64,
    /// Edges the dependence rules found (accesses on record on another stream).
    edges: AtomicU64,
}

/// The floor pipeline for one program's tensors. Like the bare pipeline it keeps its
/// threads across runs; dropping it stops and joins them.
pub(crate) struct Floor {
    stages: Stages<Instr>,
    checks: Vec<CheckLine>,
    /// Operands the caller's check refused.
    refused: u64,
    #[cfg(test)]
    counts: Arc<Counts>,
}

impl Floor {
    /// A floor over `tensors` tensors, with the VM's batch size, backoff and water marks
    /// (the arguments of [`super::baseline::Pipeline::new`]). Fails if its threads cannot
    /// be started.
    pub(crate) fn new(
        tensors: usize,
        batch: usize,
        backoff: Backoff,
        high_water: usize,
        low_water: usize,
    ) -> std::io::Result<Self> {
        let counts = Arc::new(Counts::default());
        let mut deps: Vec<DepLine> = (0..tensors).map(|_| DepLine::default()).collect();
        let values: Vec<ValueLine> = (0..tensors).map(|k| ValueLine { data: Box::new(k as f32) }).collect();
        let (c, mut position) = (counts.clone(), 0u64);
        let forward = move |b: &[Instr]| {
            let mut edges = 0u64;
            for ins in b {
                position += 1;
                let me = u64::from(STREAM) << 48 | position;
                // The operand counts fixed where they are small, as the worker's are.
                edges += match (ins.n_inputs, ins.n) {
                    (0, 1) => rules::<0, 1>(ins, &mut deps, me),
                    (1, 2) => rules::<1, 2>(ins, &mut deps, me),
                    (2, 3) => rules::<2, 3>(ins, &mut deps, me),
                    _ => rules::<MAX_OPERANDS, MAX_OPERANDS>(ins, &mut deps, me),
                };
            }
            if edges != 0 {
                c.edges.fetch_add(edges, Ordering::Relaxed);
            }
        };
        let c = counts.clone();
        let work = move |b: &[Instr]| {
            let mut operands = 0;
            for ins in b {
                // The operands' storage in an array of their number where that is small, so
                // that no slot beyond them is written.
                match ins.n {
                    1 => run::<1>(ins, &values),
                    2 => run::<2>(ins, &values),
                    3 => run::<3>(ins, &values),
                    _ => run::<MAX_OPERANDS>(ins, &values),
                }
                operands += u64::from(ins.n);
            }
            c.operands.fetch_add(operands, Ordering::Relaxed);
        };
        let stages = Stages::start("floor", batch, backoff, high_water, low_water, forward, work)?;
        let checks = (0..tensors)
            .map(|_| CheckLine { device: DEVICE, released: false, last_stream: u32::MAX })
            .collect();
        Ok(Floor {
            stages,
            checks,
            refused: 0,
            #[cfg(test)]
            counts,
        })
    }

    /// Run every instruction of `prog` through the floor; returns the time from the first
    /// push until the worker has run the last one.
    pub(crate) fn run(&mut self, prog: &Program) -> Duration {
        let Floor { stages, checks, refused, .. } = self;
        match prog {
            Program::Independent { n } => stages.run(*n, |i| call(checks, refused, [], [(i % 1024) as u32])),
            Program::Chain { n } => stages.run(*n, |_| call(checks, refused, [], [0])),
            Program::FanOutIn { groups } => {
                let ys = std::array::from_fn::<u32, 8, _>(|k| k as u32 + 1);
                stages.run(groups * 10, |i| match i % 10 {
                    0 => call(checks, refused, [], [0]),
                    9 => call(checks, refused, ys, [9]),
                    k => call(checks, refused, [0], [k as u32]),
                })
            }
            Program::Dag { ops } => stages.run(ops.len(), |i| {
                let [a, b, w] = ops[i];
                call(checks, refused, [a as u32, b as u32], [w as u32])
            }),
        }
    }
}

/// The forwarder's work for one instruction `me` of at most `I` inputs and `N` operands:
/// the read rule for each input, the write rule for each output. Returns the edges found:
/// a read waits for the last write; a write for it and for the read since.
#[inline(always)]
fn rules<const I: usize, const N: usize>(ins: &Instr, deps: &mut [DepLine], me: u64) -> u64 {
    let (i, n) = ((ins.n_inputs as usize).min(I), (ins.n as usize).min(N));
    let mut edges = 0;
    for &t in &ins.ops[..i] {
        let d = &mut deps[t as usize];
        edges += u64::from(other_stream(d.last_write, me));
        d.reader = me;
    }
    for &t in &ins.ops[i..n] {
        let d = &mut deps[t as usize];
        edges += u64::from(other_stream(d.last_write, me)) + u64::from(other_stream(d.reader, me));
        d.last_write = me;
        d.reader = 0;
    }
    edges
}

/// The worker's work for one instruction of at most `N` operands: each operand's storage
/// read from its value line, then the kernel called with them.
#[inline(always)]
fn run<const N: usize>(ins: &Instr, values: &[ValueLine]) {
    let n = (ins.n as usize).min(N);
    let storage: [&f32; N] = std::array::from_fn(|k| &*values[ins.ops[k] as usize].data);
    (ins.kernel)(&storage[..n]);
}

/// The caller's work for one call of `noop`: each operand checked and its soft-sync state
/// kept, and the instruction made.
#[inline(always)]
fn call<const I: usize, const O: usize>(
    checks: &mut [CheckLine],
    refused: &mut u64,
    inputs: [u32; I],
    outputs: [u32; O],
) -> Instr {
    let mut ins = Instr { kernel: noop, n_inputs: I as u8, n: (I + O) as u8, ops: [0; MAX_OPERANDS] };
    for (k, t) in inputs.into_iter().chain(outputs).enumerate() {
        let c = &mut checks[t as usize];
        if c.released | (c.device != DEVICE) {
            *refused += 1;
        }
        if c.last_stream != STREAM {
            c.last_stream = STREAM;
        }
        ins.ops[k] = t;
    }
    ins
}

#[cfg(test)]
mod tests {
    use super::super::{Program, Workload};
    use super::*;

    #[test]
    fn every_instruction_reaches_the_worker_with_its_operands() {
        let mut f = Floor::new(1024, 256, Backoff::DEFAULT, 4096, 1024).expect("threads start");
        let (mut items, mut operands) = (0, 0);
        // Operands per ten instructions: W3's group of ten has 1 + 8 * 2 + 9.
        for (w, per_ten) in [(Workload::W1, 10), (Workload::W2, 10), (Workload::W3, 26), (Workload::W4, 30)] {
            let prog = Program::new(w, 5000);
            let t = f.run(&prog);
            assert!(t.as_secs() < 10, "{} took {t:?}", w.name());
            items += prog.len();
            operands += (prog.len() * per_ten / 10) as u64;
            assert_eq!(f.stages.done(), items, "every instruction of {} ran", w.name());
            assert_eq!(f.counts.operands.load(Ordering::Relaxed), operands, "{}'s operands", w.name());
        }
        // One stream: no access on record is ever on another one, and every tensor is live.
        assert_eq!(f.counts.edges.load(Ordering::Relaxed), 0);
        assert_eq!(f.refused, 0);
    }

    #[test]
    fn the_dependence_rules_find_edges_to_other_streams_only() {
        let at = |stream: u64, position: u64| stream << 48 | position;
        let ins = |n_inputs: u8, ops: &[u32]| {
            let mut i = Instr { kernel: noop, n_inputs, n: ops.len() as u8, ops: [0; MAX_OPERANDS] };
            i.ops[..ops.len()].copy_from_slice(ops);
            i
        };
        let mut deps: Vec<DepLine> = (0..3).map(|_| DepLine::default()).collect();
        // Tensor 0 last written on stream 1, tensor 1 read on stream 1 since its write there.
        deps[0].last_write = at(1, 1);
        deps[1] = DepLine { last_write: at(1, 2), reader: at(1, 3) };
        // On stream 0: reading tensor 0 waits for its write; writing tensor 2 (nothing on
        // record) waits for nothing.
        assert_eq!(rules::<1, 2>(&ins(1, &[0, 2]), &mut deps, at(0, 4)), 1);
        assert_eq!((deps[0].reader, deps[2].last_write, deps[2].reader), (at(0, 4), at(0, 4), 0));
        // Writing tensor 1 waits for its write and its read; writing tensor 0 now waits
        // for its write on stream 1, not for the read on its own stream.
        assert_eq!(rules::<0, 1>(&ins(0, &[1]), &mut deps, at(0, 5)), 2);
        assert_eq!(rules::<MAX_OPERANDS, MAX_OPERANDS>(&ins(0, &[0]), &mut deps, at(0, 6)), 1);
        // Everything on record is on stream 0 now: no more edges from there.
        assert_eq!(rules::<2, 3>(&ins(2, &[0, 1, 2]), &mut deps, at(0, 7)), 0);
        assert!(!other_stream(0, at(0, 8)), "nothing on record is on no stream");
    }

    #[test]
    fn an_instruction_is_as_large_as_the_vms() {
        use crate::vm::instruction::INSTRUCTION_LAYOUT;
        assert_eq!(std::mem::size_of::<Instr>(), INSTRUCTION_LAYOUT.0);
    }
}
