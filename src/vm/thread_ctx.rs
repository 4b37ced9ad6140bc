//! `ThreadCtx`: the worker loops that run dispatched instructions, and the event watchers
//! of asynchronous streams.
//!
//! # Sleep/wake protocol
//!
//! A worker owns a queue of instruction batches and a [`Notifier`]. The scheduler pushes a
//! batch and calls `notify`, which costs a fence and a load unless the worker sleeps. The
//! worker drains batches; when it finds none it re-checks briefly (spinning, then yielding
//! its core: [`Backoff`](crate::sync::notify::Backoff)), then sleeps under the
//! notifier's protocol (`crate::sync::notify`), re-checking the queue and its stop flag
//! after announcing that it sleeps, so no batch and no stop request is missed.
//!
//! # Policies
//!
//! - **Sync** (CPU): run the instruction on this thread. Such a stream runs in program
//!   order, so one `done through` report per stream per batch covers every instruction of
//!   it in the batch.
//! - **Event** (mock, CUDA): launch the work on the device stream, record a pooled
//!   event after it and pass the event to the stream's watcher thread, which sleeps in
//!   `Event::wait` on the oldest pending event and reports `done` (never a poll loop). A
//!   `RecordEvent` also reports `launched` at once, which releases the `StreamWaitEvent`s
//!   that wait on it.
//!
//! # Profiling
//!
//! A worker asks the timeline once per batch for a recorder (`observe::timeline`); with none
//! it runs the batch exactly as without profiling. With one, it times each instruction
//! (synchronous stream: start and end of `execute`; asynchronous stream: the start of its
//! launch, which travels to the watcher in the `Watch`) and hands the records in before
//! reporting the batch's completions. A watcher records an instruction's launch and done
//! times together, and hands them in before each report.
//!
//! # Tracing
//!
//! Each batch a worker takes runs inside a TRACE span `batch` (its worker, the stream of
//! its first instruction, its instruction count): one span per batch, never one per
//! instruction. With no subscriber, or one that filters TRACE out, that is a check of the
//! callsite's cached interest (an atomic load and a branch) per batch, and the fields are
//! not evaluated. A worker's start and exit are DEBUG events.
//!
//! # Shutdown
//!
//! 1. The scheduler, once asked to stop and with nothing in flight, sets each ctx's stop
//!    flag and notifies it.
//! 2. A worker exits when its queue is empty and the flag is set; before exiting it stops
//!    its watchers the same way and joins them.
//! 3. The VM joins the scheduler, which joined the workers.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_queue::SegQueue;

use crate::ep::Event;
use crate::sync::notify::Notifier;
use crate::sync::{AtomicBool, Ordering};
use crate::vm::observe::ThreadRole;
use crate::vm::observe::{Nanos, Rec, Recorder};
use crate::vm::Error;

use super::exec::{execute, execute_catching, panicked, ExecEnv};
use super::instruction::{Batch, Body, Instruction, Operands};
use super::scheduler::{Completion, Report};
use super::stream::PolicyKind;
use super::Engine;

/// The shared half of a worker: its queue, its parking spot, its stop flag.
#[derive(Debug, Default)]
pub(crate) struct ThreadCtx {
    queue: SegQueue<Batch>,
    notify: Notifier,
    stop: AtomicBool,
}

impl ThreadCtx {
    /// Hand a batch to the worker (scheduler thread).
    pub(crate) fn push(&self, batch: Batch) {
        self.queue.push(batch);
        self.notify.notify();
    }

    /// Ask the worker to exit once its queue is empty.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.notify.notify();
    }
}

/// One event the watcher waits for, and the stream position it reports done.
struct Watch {
    seq: u64,
    /// `None` when the launch or the record failed: nothing to wait for, but the position
    /// is reported done in its turn, so that reports stay in stream order.
    event: Option<Arc<dyn Event>>,
    /// When profiling: the instruction's program number and when its launch began.
    prof: Option<(u64, Nanos)>,
}

/// A watcher: one per asynchronous stream.
#[derive(Default)]
struct Watcher {
    queue: SegQueue<Watch>,
    notify: Notifier,
    stop: AtomicBool,
}

/// Start the worker thread of ctx `index`, which serves `streams`.
pub(crate) fn spawn_worker(
    vm: Arc<Engine>,
    index: usize,
    streams: Vec<usize>,
) -> std::io::Result<JoinHandle<()>> {
    let name = format!("eagervm-worker-{index}");
    std::thread::Builder::new().name(name).spawn(move || worker_main(vm, index, streams))
}

/// What a worker keeps for one stream it serves.
#[derive(Default)]
struct Lane {
    env: Option<Arc<ExecEnv>>,
    /// The stream's watcher, if it is asynchronous.
    watcher: Option<Arc<Watcher>>,
    /// The position of the last instruction run or launched. The scheduler dispatches each
    /// stream's instructions in order, so counting them gives their positions.
    seq: u64,
    /// Asynchronous stream: the last position handed to the watcher. A launch gets an event
    /// of its own only when it is a `RecordEvent`, when profiling, or when
    /// `Config::event_interval` launches are waiting for one; the others are covered by the
    /// next event on the stream, at the latest the one recorded when the batch ends (the
    /// watcher's report "done through p" retires them all, as the stream runs in order).
    watched: u64,
    /// Whether the current batch ran or launched any of its instructions.
    touched: bool,
}

/// A worker's lanes, one per stream of the VM (only those it serves are set up).
struct Lanes {
    lanes: Vec<Lane>,
    /// Synchronous streams run in the current batch.
    touched: Vec<usize>,
}

impl Lanes {
    /// Run a batch: each instruction on a synchronous stream runs here, each on an
    /// asynchronous stream is launched. A kernel that panics fails its instruction and the
    /// batch goes on with the next one; the landing pad is set once per batch (and again
    /// after each panic), not once per instruction. With `prof`, each instruction is timed.
    fn run_batch(
        &mut self,
        vm: &Engine,
        batch: &mut Batch,
        done: &mut Vec<Completion>,
        mut prof: Option<&mut Recorder>,
    ) {
        let n = batch.len();
        let mut i = 0;
        while i < n {
            let ran = catch_unwind(AssertUnwindSafe(|| match prof.as_deref_mut() {
                None => self.run_from(vm, batch, &mut i, done),
                Some(r) => {
                    while i < n {
                        self.run(vm, batch, i, done, Some(&mut *r));
                        i += 1;
                    }
                }
            }));
            if let Err(payload) = ran {
                self.unwound(vm, batch, i, payload);
                i += 1;
            }
        }
    }

    /// Run the batch from instruction `*i` on, without profiling, advancing `*i` past each
    /// instruction once it has run (a panic leaves it on the one that panicked). Runs of
    /// instructions on one synchronous stream, the common case, take a comparison each
    /// besides their execution: their lane is looked up once per run.
    #[inline]
    fn run_from(&mut self, vm: &Engine, batch: &mut Batch, i: &mut usize, done: &mut Vec<Completion>) {
        let n = batch.len();
        while *i < n {
            let s = batch.ins[*i].stream.index();
            let lane = &mut self.lanes[s];
            if lane.watcher.is_some() {
                self.run(vm, batch, *i, done, None);
                *i += 1;
                continue;
            }
            if !lane.touched {
                lane.touched = true;
                self.touched.push(s);
            }
            let env = lane.env.as_deref().expect("ctx serves the instruction's stream");
            loop {
                lane.seq += 1;
                let program = batch.program(*i);
                prefetch_ahead(batch, *i);
                let (body, _, n_inputs, ops) = batch.parts(*i);
                execute(body, n_inputs, ops, program, env);
                *i += 1;
                if *i == n || batch.ins[*i].stream.index() != s {
                    break;
                }
            }
        }
    }

    /// Run (synchronous stream) or launch (asynchronous stream) instruction `i` of `batch`.
    #[inline]
    fn run(
        &mut self,
        vm: &Engine,
        batch: &mut Batch,
        i: usize,
        done: &mut Vec<Completion>,
        prof: Option<&mut Recorder>,
    ) {
        let program = batch.program(i);
        let s = batch.ins[i].stream.index();
        let lane = &mut self.lanes[s];
        let env = lane.env.as_ref().expect("ctx serves the instruction's stream");
        lane.seq += 1;
        match &lane.watcher {
            None => {
                if !lane.touched {
                    lane.touched = true;
                    self.touched.push(s);
                }
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
            Some(w) => {
                if !lane.touched {
                    lane.touched = true;
                    self.touched.push(s);
                }
                let prof = prof.map(|r| (program, r.now()));
                let ops = Operands::from_slice(&batch.operands(&batch.ins[i]));
                let ins = batch.ins[i].take();
                // An event behind this launch now, or later behind a later one (see `Lane`).
                let record = matches!(ins.body, Body::RecordEvent { .. })
                    || prof.is_some()
                    || lane.seq - lane.watched >= u64::from(vm.config.event_interval);
                let seq = lane.seq;
                lane.watched =
                    launch_async(vm, s, seq, lane.watched, record, ins, ops, program, env, w, done, prof);
            }
        }
    }

    /// Instruction `i` of `batch` unwound out of `run`: on a synchronous stream its kernel
    /// panicked, and it fails; on an asynchronous stream the device panicked while taking
    /// the launch, which is a device failure, and its position is still reported, in turn.
    #[cold]
    fn unwound(&mut self, vm: &Engine, batch: &Batch, i: usize, payload: Box<dyn std::any::Any + Send>) {
        let ins = &batch.ins[i];
        let ops = batch.operands(ins);
        let lane = &mut self.lanes[ins.stream.index()];
        let env = lane.env.as_ref().expect("ctx serves the instruction's stream");
        match &lane.watcher {
            None => panicked(ins, &ops, batch.program(i), payload, env),
            Some(w) => {
                vm.record_failure(Error::Device(crate::ep::EpError::Device {
                    device: vm.streams[ins.stream.index()].device,
                    what: format!("launching on {} panicked", env.stream_name),
                }));
                if lane.watched < lane.seq {
                    // The launches before this one get an event behind them first.
                    watch_through(vm, ins.stream.index(), lane.seq - 1, lane.watched, w);
                    lane.watched = lane.seq;
                    w.queue.push(Watch { seq: lane.seq, event: None, prof: None });
                    w.notify.notify();
                }
            }
        }
    }
}

/// How many instructions ahead of the one it runs a worker asks for the next line.
const PREFETCH_AHEAD: usize = 12;

/// Ask for the line of instruction `i + PREFETCH_AHEAD` of `batch`. The instruction lines
/// come from the caller's core, and a call's path is too long for the processor to reach
/// the next one's loads ahead of time by itself; asked for early, they arrive while earlier
/// calls run (`docs/performance.md`, "Why the hot paths are shaped so", has the
/// measurement).
#[inline(always)]
fn prefetch_ahead(batch: &Batch, i: usize) {
    #[cfg(all(target_arch = "x86_64", not(miri)))]
    // SAFETY: a prefetch is a hint: it reads nothing the program sees and cannot fault,
    // so any address will do (past the batch's end, it is a wasted hint), and SSE, which
    // it needs, is part of x86-64.
    unsafe {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        _mm_prefetch::<_MM_HINT_T0>(batch.ins.as_ptr().wrapping_add(i + PREFETCH_AHEAD).cast::<i8>());
    }
    #[cfg(not(all(target_arch = "x86_64", not(miri))))]
    let _ = (batch, i);
}

fn worker_main(vm: Arc<Engine>, index: usize, streams: Vec<usize>) {
    let ctx = &vm.ctxs[index];
    let n = vm.streams.len();
    let mut lanes =
        Lanes { lanes: (0..n).map(|_| Lane::default()).collect(), touched: Vec::with_capacity(n) };
    let mut joins = Vec::new();
    for &s in &streams {
        let lane = &mut lanes.lanes[s];
        lane.env = Some(Arc::new(vm.exec_env(s)));
        if vm.streams[s].policy == PolicyKind::Event {
            let w = Arc::new(Watcher::default());
            let (vm2, w2) = (vm.clone(), w.clone());
            let name = format!("eagervm-watch-{}", vm.streams[s].name);
            let spawned = if vm.fault.refuse_watcher_threads {
                Err(std::io::Error::other("refused by fault injection"))
            } else {
                std::thread::Builder::new().name(name).spawn(move || watcher_main(vm2, w2, s as u32))
            };
            match spawned {
                Ok(j) => joins.push(j),
                Err(e) => {
                    // Without its watcher nothing on this stream would ever complete.
                    vm.fail_startup(format!("cannot start the watcher of {}: {e}", vm.streams[s].name));
                }
            }
            lane.watcher = Some(w);
        }
    }
    tracing::debug!(
        worker = index,
        streams = %streams.iter().map(|&s| vm.streams[s].name.as_str()).collect::<Vec<_>>().join(", "),
        "worker started"
    );
    let mut done = vm.take_completions();
    loop {
        if let Some(mut batch) = ctx.queue.pop() {
            // Per batch, not per instruction (module docs, "Tracing").
            let _span = tracing::trace_span!(
                "batch",
                worker = index,
                stream = batch.ins.first().map_or("", |i| vm.streams[i.stream.index()].name.as_str()),
                n = batch.len(),
            )
            .entered();
            match vm.timeline.begin(ThreadRole::Worker(index as u32)) {
                None => lanes.run_batch(&vm, &mut batch, &mut done, None),
                Some(mut r) => {
                    let start = r.now();
                    lanes.run_batch(&vm, &mut batch, &mut done, Some(&mut r));
                    r.slice("execute", start, batch.len());
                    // Before the reports: see the module docs of `observe::timeline`.
                    r.finish(&vm.timeline);
                }
            }
            batch.clear();
            vm.recycle(batch);
            // A synchronous stream runs in order: one report covers the batch. An
            // asynchronous stream's launches since its last event get one event behind them.
            for s in lanes.touched.drain(..) {
                let lane = &mut lanes.lanes[s];
                lane.touched = false;
                match &lane.watcher {
                    None => done.push(Completion {
                        stream: s as u32,
                        seq: lane.seq,
                        report: Report::Done,
                        event: None,
                    }),
                    Some(w) => lane.watched = watch_through(&vm, s, lane.seq, lane.watched, w),
                }
            }
            if !done.is_empty() {
                vm.report(std::mem::replace(&mut done, vm.take_completions()));
            }
            continue;
        }
        if ctx.stop.load(Ordering::Acquire) {
            break;
        }
        ctx.notify.wait(vm.config.backoff(), || !ctx.queue.is_empty() || ctx.stop.load(Ordering::Acquire));
    }
    for w in lanes.lanes.iter().filter_map(|l| l.watcher.as_ref()) {
        w.stop.store(true, Ordering::Release);
        w.notify.notify();
    }
    for j in joins {
        let _ = j.join();
    }
    tracing::debug!(worker = index, "worker stopped");
}

/// The Event policy: launch on the device stream; with `record`, record an event behind the
/// launch and hand it to the watcher, which reports the stream done through `seq` when the
/// event is reached. Without it the launch waits for a later event (see `Lane`). Returns the
/// stream position now covered by watches (`watched` or `seq`).
#[allow(clippy::too_many_arguments)]
fn launch_async(
    vm: &Engine,
    s: usize,
    seq: u64,
    watched: u64,
    record: bool,
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
            Some(ev) if !vm.fault.skip_stream_wait() => stream.ep.wait_event(ev.as_ref()),
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
        watcher.queue.push(Watch { seq, event: None, prof });
        watcher.notify.notify();
        return seq;
    }
    if !record {
        return watched;
    }
    let event = match record_event(stream) {
        Ok(ev) => {
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
    watcher.queue.push(Watch { seq, event, prof });
    watcher.notify.notify();
    seq
}

/// Take a pooled event and record it on `stream`'s device stream.
fn record_event(stream: &super::stream::VmStream) -> Result<Arc<dyn Event>, Error> {
    let ev = stream.events.take()?;
    stream.ep.record(ev.as_ref())?;
    Ok(ev)
}

/// Cover stream `s`'s launches after `watched` through `seq` with one event, handed to its
/// watcher; returns the new covered position (`seq`, or `watched` if nothing was left).
fn watch_through(vm: &Engine, s: usize, seq: u64, watched: u64, watcher: &Watcher) -> u64 {
    if watched >= seq {
        return watched;
    }
    let event = record_event(&vm.streams[s]).map_err(|e| vm.record_failure(e)).ok();
    watcher.queue.push(Watch { seq, event, prof: None });
    watcher.notify.notify();
    seq
}

/// A watcher's records since its last report: the recorder and the slice's start.
type WatchRecords = Option<(Recorder, Nanos, usize)>;

/// Hand a watcher's records in (before its report).
fn finish_watch(vm: &Engine, rec: &mut WatchRecords) {
    if let Some((mut r, start, n)) = rec.take() {
        r.slice("watch", start, n);
        r.finish(&vm.timeline);
    }
}

fn watcher_main(vm: Arc<Engine>, w: Arc<Watcher>, stream: u32) {
    let mut done = vm.take_completions();
    let mut rec: WatchRecords = None;
    loop {
        match w.queue.pop() {
            Some(watch) => {
                if let Some(event) = &watch.event {
                    // Report what is already complete without blocking; block only on the
                    // oldest incomplete event, after handing over what we have.
                    if !event.query() && !done.is_empty() {
                        finish_watch(&vm, &mut rec);
                        vm.report(std::mem::replace(&mut done, vm.take_completions()));
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
                if w.queue.is_empty() {
                    finish_watch(&vm, &mut rec);
                    vm.report(std::mem::replace(&mut done, vm.take_completions()));
                }
            }
            None => {
                if w.stop.load(Ordering::Acquire) {
                    break;
                }
                w.notify.wait(vm.config.backoff(), || !w.queue.is_empty() || w.stop.load(Ordering::Acquire));
            }
        }
    }
}
