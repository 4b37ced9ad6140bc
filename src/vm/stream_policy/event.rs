//! The event-recorded policy (asynchronous devices: mock, CUDA): the worker launches each
//! instruction's work on the device stream, and the stream's watcher reports it done.
//!
//! # Launch and watch
//!
//! 1. The worker launches the work on the device stream ([`launch_async`]): a call's
//!    execution as a closure (`execute_catching`, on the mock device's thread, or on the
//!    worker inside a CUDA launch), a `WaitEvent` as a wait on the device for its event.
//! 2. A launch gets a pooled event recorded behind it only when it is a `RecordEvent`,
//!    when profiling, or when `Config::event_interval` launches are waiting for one; the
//!    others are covered by the next event on the stream, at the latest the one recorded
//!    when the batch ends ([`watch_through`]). The lane keeps the last position covered so
//!    (`watched`).
//! 3. Each event goes to the stream's watcher thread ([`Watch`]) with the position it
//!    covers. The watcher sleeps in `Event::wait` on the oldest one and reports "done
//!    through" that position when the device reaches it (the stream runs in order, so the
//!    report retires every launch before it), never in a poll loop. It reports what is
//!    already complete without blocking, and blocks only on the oldest incomplete event
//!    after handing over what it has.
//! 4. A `RecordEvent` is also reported "launched" by the worker as soon as its event is
//!    recorded, which releases the `StreamWaitEvent`s that wait on it.
//!
//! # Checked launches
//!
//! A call whose kernel may find bad data only when it runs (an index out of range:
//! `OpKernel::checks_data`) reports it in the stream's fault record (`ep::fault`), not by
//! returning an error. Such a launch always gets an event, and the worker waits for it
//! (`Event::wait`: a blocking wait) before it hands the event to the watcher and before it
//! launches anything else: it then takes the record ([`check_faults`]), and if a fault is
//! there, the call fails as if its kernel had returned the error (`Error::Kernel`, counted,
//! stored on every output). So the instructions launched after it see the error on their
//! inputs and skip, as on a synchronous device, and nothing retires the call (the
//! watcher's report) before its outputs carry their error. The cost is one host wait per
//! checked call (the worker cannot run ahead of the device past it); calls whose kernels
//! cannot meet bad data are not checked, and `Config::check_data` turns the check off.
//!
//! # Failures
//!
//! A launch or a record that the device refuses, or a launch during which the device
//! panics, is recorded in the failure log; the launches before it get their event, and its
//! position is handed to the watcher with no event, so that it is still reported done, in
//! its turn: reports stay in stream order and nothing waits for it forever.
//!
//! # Profiling
//!
//! When profiling, every launch gets an event, and its [`Watch`] carries the instruction's
//! program number and the start of its launch. The watcher records the launch and done
//! times together, and hands its records in before each report.
//!
//! # Shutdown
//!
//! The worker that serves the stream starts the watcher with the lane
//! ([`EventLane::start`]); before exiting it stops the watcher's queue ([`EventLane::stop`],
//! `WorkerQueue::stop`) and joins it. The watcher exits once its queue is empty and
//! stopped.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::ep::Event;
use crate::vm::observe::ThreadRole;
use crate::vm::observe::{Nanos, Rec, Recorder};
use crate::vm::Error;
use crate::vm::OpKernel;

use super::super::engine::{Parts, VmStream, WorkerQueue};
use super::super::instruction::{Batch, Body, Instruction, Operand, Operands};
use super::super::instruction_policy::{execute_catching, kernel_failed, ExecEnv};
use super::super::report::{Completion, Report};

/// One event the watcher waits for, and the stream position it reports done.
struct Watch {
    seq: u64,
    /// `None` when the launch or the record failed: nothing to wait for, but the position
    /// is reported done in its turn, so that reports stay in stream order.
    event: Option<Arc<dyn Event>>,
    /// When profiling: the instruction's program number and when its launch began.
    prof: Option<(u64, Nanos)>,
}

/// A watcher's queue: one per asynchronous stream, fed by the worker that serves the
/// stream (`engine/worker_queue.rs` has its protocol).
type Watcher = WorkerQueue<Watch>;

/// What a worker keeps for an event-recorded stream.
pub(crate) struct EventLane {
    /// The stream's watcher.
    watcher: Arc<Watcher>,
    /// The last position handed to the watcher. A launch gets an event of its own only when
    /// it is a `RecordEvent`, when profiling, or when `Config::event_interval` launches are
    /// waiting for one; the others are covered by the next event on the stream, at the
    /// latest the one recorded when the batch ends (the watcher's report "done through p"
    /// retires them all, as the stream runs in order).
    watched: u64,
}

impl EventLane {
    /// Start the watcher of stream `s` (pushed to `threads`). If it cannot be started, the
    /// VM is dead: nothing on the stream would ever complete.
    pub(super) fn start(vm: &Arc<Parts>, s: usize, threads: &mut Vec<JoinHandle<()>>) -> EventLane {
        let w = Arc::new(Watcher::new());
        let (vm2, w2) = (vm.clone(), w.clone());
        let name = format!("eagervm-watch-{}", vm.streams[s].name);
        let spawned = if vm.config.fault.refuse_watcher_threads {
            Err(std::io::Error::other("refused by fault injection"))
        } else {
            std::thread::Builder::new().name(name).spawn(move || watcher_main(vm2, w2, s as u32))
        };
        match spawned {
            Ok(j) => threads.push(j),
            Err(e) => {
                // Without its watcher nothing on this stream would ever complete.
                vm.fail(format!("cannot start the watcher of {}: {e}", vm.streams[s].name));
            }
        }
        EventLane { watcher: w, watched: 0 }
    }

    /// Launch instruction `i` of `batch` (program number `program`), at position `seq` of
    /// stream `s`: an event behind this launch now, or later behind a later one (see
    /// [`EventLane`]).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn launch(
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
        let prof = prof.map(|r| (program, r.now()));
        let ops = Operands::from_slice(&batch.operands(&batch.ins[i]));
        let ins = batch.ins[i].take();
        let check = Check::of(vm, &ins, &ops);
        let record = matches!(ins.body, Body::RecordEvent { .. })
            || prof.is_some()
            || check.is_some()
            || seq - self.watched >= u64::from(vm.config.event_interval);
        self.watched = launch_async(
            vm,
            s,
            seq,
            self.watched,
            record,
            check,
            ins,
            ops,
            program,
            env,
            &self.watcher,
            done,
            prof,
        );
    }

    /// The device panicked while taking the launch at position `seq` of stream `s`: a device
    /// failure. Its position is still reported, in turn.
    pub(super) fn unwound(&mut self, vm: &Parts, s: usize, seq: u64, env: &ExecEnv) {
        vm.record_failure(Error::Device(crate::ep::EpError::Device {
            device: vm.streams[s].device,
            what: format!("launching on {} panicked", env.stream_name),
        }));
        if self.watched < seq {
            // The launches before this one get an event behind them first.
            watch_through(vm, s, seq - 1, self.watched, &self.watcher);
            self.watched = seq;
            self.watcher.push(Watch { seq, event: None, prof: None });
        }
    }

    /// The batch launched stream `s` through position `seq`: the launches since the last
    /// event get one event behind them.
    #[inline(always)]
    pub(super) fn end_batch(&mut self, vm: &Parts, s: usize, seq: u64) {
        self.watched = watch_through(vm, s, seq, self.watched, &self.watcher);
    }

    /// Ask the watcher to exit once it has reported everything handed to it.
    pub(super) fn stop(&self) {
        self.watcher.stop();
    }
}

/// A checked launch (the module docs): the call's kernel and its outputs, which carry the
/// error if the stream's fault record holds one once the device has run the call.
struct Check {
    kernel: &'static dyn OpKernel,
    outputs: Operands,
}

impl Check {
    /// The check `ins` (operands `ops`) needs: a call whose kernel may report bad data,
    /// unless the VM's configuration turns checks off.
    #[inline(always)]
    fn of(vm: &Parts, ins: &Instruction, ops: &[Operand]) -> Option<Check> {
        match &ins.body {
            Body::OpCall { kernel, attrs } if vm.config.check_data && kernel.get().checks_data(attrs) => {
                Some(Check::outputs(kernel.get(), &ops[ins.n_inputs as usize..]))
            }
            _ => None,
        }
    }

    #[cold]
    #[inline(never)]
    fn outputs(kernel: &'static dyn OpKernel, outputs: &[Operand]) -> Check {
        Check { kernel, outputs: Operands::from_slice(outputs) }
    }
}

/// The stream has run the checked call `check` (program number `program`): take its fault
/// record, and if a fault is there, fail the call with the CPU kernel's message for it.
fn check_faults(vm: &Parts, s: usize, check: &Check, program: u64, env: &ExecEnv) {
    let Some(fault) = vm.streams[s].ep.faults().and_then(|r| r.take()) else { return };
    let op = check.kernel.name();
    kernel_failed(check.kernel, &check.outputs, fault.message(op), program, env);
}

/// Launch on the device stream; with `record`, record an event behind the launch and hand
/// it to the watcher, which reports the stream done through `seq` when the event is
/// reached. Without it the launch waits for a later event (see [`EventLane`]). With
/// `check` (which comes with `record`), wait for the event first and check the stream's
/// fault record (the module docs). Returns the stream position now covered by watches
/// (`watched` or `seq`).
#[allow(clippy::too_many_arguments)]
fn launch_async(
    vm: &Parts,
    s: usize,
    seq: u64,
    watched: u64,
    record: bool,
    check: Option<Check>,
    ins: Instruction,
    ops: Operands,
    program: u64,
    env: &Arc<ExecEnv>,
    watcher: &Watcher,
    done: &mut Vec<Completion>,
    prof: Option<(u64, Nanos)>,
) -> u64 {
    let stream = &vm.streams[s];
    let mut record_id = None;
    let launched = match &ins.body {
        Body::RecordEvent { id } => {
            record_id = Some(*id);
            Ok(())
        }
        Body::WaitEvent { event } => match event {
            Some(ev) if !vm.config.fault.skip_stream_wait() => stream.ep.wait_event(ev.as_ref()),
            _ => Ok(()),
        },
        _ => {
            let env = env.clone();
            let mut ins = ins;
            stream.ep.launch(Box::new(move || execute_catching(&mut ins, &ops, program, &env)))
        }
    };
    if let Err(e) = launched {
        // The device refused the launch: the instruction is over (its work did not run).
        // Record the failure; the launches before it get their event, and its watcher
        // reports this one done in turn after them, so that nothing waits for it forever.
        vm.record_failure(e.into());
        watch_through(vm, s, seq - 1, watched, watcher);
        watcher.push(Watch { seq, event: None, prof });
        return seq;
    }
    if !record {
        return watched;
    }
    let event = match record_event(stream) {
        Ok(ev) => {
            // A failed wait is the watcher's to report: it waits for the same event.
            if let Some(check) = &check {
                if ev.wait().is_ok() {
                    check_faults(vm, s, check, program, env);
                }
            }
            if let Some(id) = record_id {
                let report = Report::Launched { id };
                done.push(Completion { stream: s as u32, seq, report, event: Some(ev.clone()) });
            }
            Some(ev)
        }
        Err(e) => {
            // Its watcher reports it done in turn (see above).
            vm.record_failure(e);
            None
        }
    };
    watcher.push(Watch { seq, event, prof });
    seq
}

/// Take a pooled event and record it on `stream`'s device stream.
fn record_event(stream: &VmStream) -> Result<Arc<dyn Event>, Error> {
    let ev = stream.events.take()?;
    stream.ep.record(ev.as_ref())?;
    Ok(ev)
}

/// Cover stream `s`'s launches after `watched` through `seq` with one event, handed to its
/// watcher; returns the new covered position (`seq`, or `watched` if nothing was left).
fn watch_through(vm: &Parts, s: usize, seq: u64, watched: u64, watcher: &Watcher) -> u64 {
    if watched >= seq {
        return watched;
    }
    let event = record_event(&vm.streams[s]).map_err(|e| vm.record_failure(e)).ok();
    watcher.push(Watch { seq, event, prof: None });
    seq
}

/// A watcher's records since its last report: the recorder and the slice's start.
type WatchRecords = Option<(Recorder, Nanos, usize)>;

/// Hand a watcher's records in (before its report).
fn finish_watch(vm: &Parts, rec: &mut WatchRecords) {
    if let Some((mut r, start, n)) = rec.take() {
        r.slice("watch", start, n);
        r.finish(&vm.timeline);
    }
}

fn watcher_main(vm: Arc<Parts>, w: Arc<Watcher>, stream: u32) {
    let mut done = vm.completions.take();
    let mut rec: WatchRecords = None;
    w.serve(vm.config.backoff(), |watch| {
        if let Some(event) = &watch.event {
            // Report what is already complete without blocking; block only on the oldest
            // incomplete event, after handing over what we have.
            if !event.query() && !done.is_empty() {
                finish_watch(&vm, &mut rec);
                vm.completions.report(std::mem::replace(&mut done, vm.completions.take()));
            }
            let start = watch.prof.map(|_| vm.timeline.now());
            if let Err(e) = event.wait() {
                vm.record_failure(e.into());
            }
            if let (Some((program, launched)), Some(start)) = (watch.prof, start) {
                if rec.is_none() {
                    rec = vm.timeline.begin(ThreadRole::Watcher(stream)).map(|r| (r, start, 0));
                }
                if let Some((r, _, n)) = &mut rec {
                    r.push(Rec::Async { program, launched, done: r.now() });
                    *n += 1;
                }
            }
        }
        done.push(Completion { stream, seq: watch.seq, report: Report::Done, event: watch.event });
        if w.is_empty() {
            finish_watch(&vm, &mut rec);
            vm.completions.report(std::mem::replace(&mut done, vm.completions.take()));
        }
    });
}

/// Synchronous mode: launch `ins` (at stream `s`) on its device stream and wait until the
/// stream has run it; a refused launch or a failed wait is recorded in the failure log.
/// A checked call's fault record is taken once the stream has run it (the module docs).
pub(super) fn run_inline(vm: &Parts, s: usize, mut ins: Instruction, ops: &[Operand], program: u64) {
    let st = &vm.streams[s];
    let env = vm.streams.env(s).clone();
    let check = Check::of(vm, &ins, ops);
    let ops = Operands::from_slice(ops);
    let r = st
        .ep
        .launch(Box::new(move || execute_catching(&mut ins, &ops, program, &env)))
        .and_then(|()| st.ep.synchronize());
    match r {
        Err(e) => vm.record_failure(e.into()),
        Ok(()) => {
            if let Some(check) = &check {
                check_faults(vm, s, check, program, vm.streams.env(s));
            }
        }
    }
}
