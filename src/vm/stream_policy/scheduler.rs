//! The scheduler-thread policy: instructions the scheduler runs itself, on its own thread,
//! never handed to a worker. The kinds that take it are named in one place,
//! `StreamPolicy::on_scheduler`; today that is `Barrier`.
//!
//! # Barriers
//!
//! A barrier has no operands and takes no position on any stream (it carries the host
//! stream, which it never uses).
//!
//! 1. On receipt the scheduler takes it in ([`Barriers::admit`]): it notes each stream's
//!    last position and takes the callback out of the instruction, whose husk is not
//!    dispatched. It is not an instruction in flight: the scheduler counts it retired at
//!    once.
//! 2. After each admission and each round of completion reports, the scheduler takes, in
//!    order, the barriers whose streams are all done through the positions noted for them
//!    ([`Barriers::pop_ready`]) and runs their callbacks on its thread
//!    ([`PendingBarrier::run`]), each inside a DEBUG span `barrier`.
//!
//! In synchronous mode there is no scheduler: everything submitted before a barrier has
//! finished when the caller submits it, and the caller runs its callback at once
//! ([`run_inline`], through the instruction policy `instruction_policy::barrier`).

use std::collections::VecDeque;

use crate::vm::observe::{Rec, Recorder};

use super::super::instruction::{Body, Instruction, Operand};
use super::super::instruction_policy::{execute_catching, ExecEnv};

/// A received barrier: the positions each stream must be done through, and its callback.
pub(crate) struct PendingBarrier {
    /// Its program number (named in its `tracing` span).
    program: u64,
    need: Vec<u64>,
    callback: Box<dyn FnOnce() + Send>,
}

/// The barriers the scheduler has taken in and not yet run, in order.
#[derive(Default)]
pub(crate) struct Barriers {
    pending: VecDeque<PendingBarrier>,
}

impl Barriers {
    /// Take in `body`, an instruction of the scheduler policy with program number
    /// `program`, received when the streams' last positions are `last` (in stream order).
    /// With `prof`, its receipt is recorded.
    pub(crate) fn admit(
        &mut self,
        body: &mut Body,
        program: u64,
        last: impl Iterator<Item = u64>,
        prof: Option<&mut Recorder>,
    ) {
        let Body::Barrier { callback } = body else {
            unreachable!("only barriers take the scheduler policy")
        };
        let callback = std::mem::replace(callback, Box::new(|| {}));
        if let Some(r) = prof {
            r.push(Rec::Barrier { program, t: r.now() });
        }
        let need = last.collect();
        self.pending.push_back(PendingBarrier { program, need, callback });
    }

    /// The oldest barrier, taken out, if every stream is done through the position noted
    /// for it; `done` gives the streams' done positions, in stream order.
    pub(crate) fn pop_ready(&mut self, done: impl Iterator<Item = u64>) -> Option<PendingBarrier> {
        let b = self.pending.front()?;
        if !b.need.iter().zip(done).all(|(&need, done)| done >= need) {
            return None;
        }
        self.pending.pop_front()
    }
}

impl PendingBarrier {
    /// Run the callback (on the scheduler thread).
    pub(crate) fn run(self) {
        // One span per barrier (a sync, a profiling session's edge), not per instruction.
        let _span = tracing::debug_span!("barrier", program = self.program).entered();
        (self.callback)();
    }
}

/// Synchronous mode, or a waiter running its own batch on an idle VM (`Handoff`): run `ins`
/// on the caller's thread, at once (see the module docs).
pub(super) fn run_inline(ins: &mut Instruction, ops: &[Operand], program: u64, env: &ExecEnv) {
    // The same span as a barrier the scheduler runs, so that `tracing` shows every `sync`
    // whichever thread ran its barrier.
    let _span = tracing::debug_span!("barrier", program).entered();
    execute_catching(ins, ops, program, env);
}
