//! The synchronous policy (CPU streams): the worker runs each instruction itself.
//!
//! An instruction is done once the worker has run it, so launched means done. The worker
//! runs a stream's instructions in stream order, so one report, "done through" the last
//! position the batch ran on the stream, covers every instruction of the stream in the
//! batch ([`end_batch`]). A kernel's panic unwinds to the worker's one landing pad per batch
//! and fails its instruction ([`unwound`]).
//!
//! A run of instructions on one synchronous stream, the common case, does not come here one
//! by one: the worker's run-of-one-stream loop (`run_stream` in `vm::thread_ctx`) calls
//! `execute_at` directly, with the lane looked up once per run and the stream position set
//! at the run's end. [`run`] serves the rest: an instruction met alone, and every
//! instruction when profiling.

use crate::vm::observe::{Rec, Recorder};

use super::super::instruction::{Batch, Instruction, Operand};
use super::super::instruction_policy::{execute, execute_catching, panicked, ExecEnv};
use super::super::report::{Completion, Report};

/// Run instruction `i` of `batch` (program number `program`) on this thread; with `prof`,
/// time it.
#[inline(always)]
pub(super) fn run(batch: &mut Batch, i: usize, program: u64, env: &ExecEnv, prof: Option<&mut Recorder>) {
    let (body, _, n_inputs, ops) = batch.parts(i);
    match prof {
        None => execute(body, n_inputs, ops, program, env),
        Some(r) => {
            let t = r.now();
            execute(body, n_inputs, ops, program, env);
            r.push(Rec::Exec { program, start: t, end: r.now() });
        }
    }
}

/// Instruction `i` of `batch` unwound out of [`run`]: its kernel panicked, and it fails.
pub(super) fn unwound(batch: &Batch, i: usize, env: &ExecEnv, payload: Box<dyn std::any::Any + Send>) {
    let ins = &batch.ins[i];
    let ops = batch.operands(ins);
    panicked(ins, &ops, batch.program(i), payload, env);
}

/// The batch ran stream `s` through position `seq`: the stream runs in order, so one report
/// covers the batch.
#[inline(always)]
pub(super) fn end_batch(s: usize, seq: u64, done: &mut Vec<Completion>) {
    done.push(Completion { stream: s as u32, seq, report: Report::Done, event: None });
}

/// Synchronous mode: run `ins` on the caller's thread, catching a panic.
pub(super) fn run_inline(ins: &mut Instruction, ops: &[Operand], program: u64, env: &ExecEnv) {
    execute_catching(ins, ops, program, env);
}
