//! Stream policies: how a stream's instructions run and how their completion reaches the
//! scheduler, one file per policy.
//!
//! The scheduler knows a stream only by positions and by the reports "launched" (a
//! `RecordEvent`'s event is recorded) and "done through p" (`vm::scheduler`). A stream
//! policy is what makes those reports true: what a worker does with each instruction of
//! the stream, who reports it done, and when. Each policy reports a stream's positions in
//! stream order. Every stream has one policy, picked from its device when the engine starts
//! ([`StreamPolicy::for_device`]); the instruction kinds that the scheduler runs itself take
//! the scheduler-thread policy whatever their stream ([`StreamPolicy::on_scheduler`]).
//!
//! | policy | file | runs | "launched" means | "done" means | who reports done |
//! | --- | --- | --- | --- | --- | --- |
//! | `Synchronous` | `synchronous.rs` | the streams of synchronous devices (CPU) | run on the worker: launched is done | run on the worker | the worker, once per stream per batch ("done through" the batch's last position on the stream) |
//! | `EventRecorded` | `event.rs` | the streams of asynchronous devices (mock, CUDA) | enqueued on the device stream; for a `RecordEvent`, its pooled event recorded behind the work before it, which the worker reports at once | the device has reached an event recorded on the stream at or after it | the stream's watcher thread, sleeping in `Event::wait` on the oldest event it was handed (never a poll loop) |
//! | `OnScheduler` | `scheduler.rs` | `Barrier` (it carries the host stream but takes no position on it) | taken in by the scheduler at receipt; it never reaches a worker, and counts as retired at once | every stream is done through the position noted at receipt, and the scheduler has run its callback | the scheduler, on its own thread |
//!
//! In synchronous mode (`Config::synchronous`) there are no workers: the caller runs each
//! instruction as it submits it ([`run_inline`]) under the same policies: a synchronous
//! stream's on its own thread, an event-recorded stream's launched and then waited for, a
//! barrier's callback at once.
//!
//! The policy is an enum, not a trait object: a worker picks a stream's policy with one
//! `match` per run of instructions, which the compiler inlines into the worker's loop (the
//! synchronous arm into its run of one stream), where a call through a vtable would stay a
//! call for every instruction.
//!
//! # How to add a stream policy or a stream type
//!
//! A stream type whose streams complete as an existing policy's do takes only step 1: the
//! collective stream did (`StreamType::Collective`), since a collective runs as a kernel
//! whose backend waits for its peers inside the call (on `cpu:0`, under the synchronous
//! policy) or runs as the device's work on its collective stream (mock and CUDA, under the
//! event-recorded one), so a collective is done when its kernel is. A stream with a
//! completion of its own takes every step:
//!
//! 1. The stream type: its `StreamType` variant, in `StreamType::ALL` and
//!    `StreamType::name` (`src/ep/types.rs`), and the stream each device makes for it
//!    (`Device::create_stream` in `src/ep/cpu.rs`, `src/ep/mock.rs`, `src/ep/cuda/`).
//! 2. The policy's file, `src/vm/stream_policy/<policy>.rs`: what a worker keeps for one of
//!    its streams, and the functions that start a lane (and any thread it needs), run or
//!    launch one instruction, handle a panic while doing so, end a batch (its reports),
//!    stop the lane, and run one instruction in synchronous mode.
//! 3. `kind.rs`: the [`StreamPolicy`] variant and its answer in
//!    [`is_asynchronous`](StreamPolicy::is_asynchronous). This file: the [`LanePolicy`]
//!    variant, and one arm in each `match` of [`LanePolicy`] and [`run_inline`].
//! 4. The one registration, in `kind.rs`: [`StreamPolicy::for_device`] picks the policy for
//!    the streams that take it (given the stream type as well, when the policy goes by
//!    stream type).
//!
//! Nothing else changes: the workers (`vm::thread_ctx`), the engine (`vm::engine`) and the
//! scheduler (`vm::scheduler`) reach the policies only through this file and `kind.rs`.

mod event;
pub(crate) mod kind;
mod scheduler;
mod synchronous;

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::vm::observe::Recorder;

use super::engine::Parts;
use super::instruction::{Batch, Body, Instruction, Operand};
use super::instruction_policy::ExecEnv;
use super::report::Completion;
use kind::StreamPolicy;

pub(crate) use scheduler::Barriers;

/// What a worker keeps for one stream under the stream's policy.
#[derive(Default)]
pub(crate) enum LanePolicy {
    /// A synchronous stream, or a stream the worker does not serve: nothing to keep.
    #[default]
    Synchronous,
    /// An event-recorded stream: its watcher, and what it covers.
    EventRecorded(event::EventLane),
}

impl LanePolicy {
    /// Set up the lane of stream `s` on its worker; the threads its policy starts are pushed
    /// to `threads`, for the worker to join after [`stop`](Self::stop).
    pub(crate) fn start(vm: &Arc<Parts>, s: usize, threads: &mut Vec<JoinHandle<()>>) -> LanePolicy {
        match vm.streams[s].policy {
            StreamPolicy::Synchronous => LanePolicy::Synchronous,
            StreamPolicy::EventRecorded => LanePolicy::EventRecorded(event::EventLane::start(vm, s, threads)),
            StreamPolicy::OnScheduler => unreachable!("no stream has the scheduler policy"),
        }
    }

    /// Whether the worker runs the stream's instructions itself, so that a run of them takes
    /// the worker's run-of-one-stream loop.
    #[inline(always)]
    pub(crate) fn runs_on_worker(&self) -> bool {
        matches!(self, LanePolicy::Synchronous)
    }

    /// Run or launch instruction `i` of `batch` (program number `program`), at position
    /// `seq` of its stream `s`. With `prof`, it is timed.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn run(
        &mut self,
        vm: &Parts,
        s: usize,
        seq: u64,
        batch: &mut Batch,
        i: usize,
        program: u64,
        env: &Arc<ExecEnv>,
        done: &mut Vec<Completion>,
        prof: Option<&mut Recorder>,
    ) {
        match self {
            LanePolicy::Synchronous => synchronous::run(batch, i, program, env, prof),
            LanePolicy::EventRecorded(lane) => lane.launch(vm, s, seq, batch, i, program, env, done, prof),
        }
    }

    /// Instruction `i` of `batch`, at position `seq` of its stream `s`, unwound out of
    /// [`run`](Self::run) with `payload`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(crate) fn unwound(
        &mut self,
        vm: &Parts,
        s: usize,
        seq: u64,
        batch: &Batch,
        i: usize,
        env: &ExecEnv,
        payload: Box<dyn std::any::Any + Send>,
    ) {
        match self {
            LanePolicy::Synchronous => synchronous::unwound(batch, i, env, payload),
            LanePolicy::EventRecorded(lane) => lane.unwound(vm, s, seq, env),
        }
    }

    /// The batch ran or launched stream `s`'s instructions through position `seq`: report
    /// (or arrange to report) them.
    #[inline(always)]
    pub(crate) fn end_batch(&mut self, vm: &Parts, s: usize, seq: u64, done: &mut Vec<Completion>) {
        match self {
            LanePolicy::Synchronous => synchronous::end_batch(s, seq, done),
            LanePolicy::EventRecorded(lane) => lane.end_batch(vm, s, seq),
        }
    }

    /// Ask the lane's threads to exit (the worker joins them).
    pub(crate) fn stop(&self) {
        match self {
            LanePolicy::Synchronous => {}
            LanePolicy::EventRecorded(lane) => lane.stop(),
        }
    }
}

/// Synchronous mode, or a waiter running its own batch on an idle engine: run `ins`
/// (program number `program`, operands `ops`) on the caller's thread under its policy, and
/// return once it is done.
pub(crate) fn run_inline(vm: &Parts, mut ins: Instruction, ops: &[Operand], program: u64) {
    let s = ins.stream.index();
    let env = vm.streams.env(s);
    match (&ins.body, StreamPolicy::of(&ins.body, vm.streams[s].policy)) {
        // Everything submitted before has finished: no event is left to record or wait for.
        (Body::RecordEvent { .. } | Body::StreamWaitEvent { .. }, _) => {}
        (_, StreamPolicy::Synchronous) => synchronous::run_inline(&mut ins, ops, program, env),
        (_, StreamPolicy::EventRecorded) => event::run_inline(vm, s, ins, ops, program),
        (_, StreamPolicy::OnScheduler) => scheduler::run_inline(&mut ins, ops, program, env),
    }
}
