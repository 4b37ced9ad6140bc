//! `ThreadCtx`: the worker loops that run dispatched instructions, each stream's under its
//! stream policy.
//!
//! # Its queue
//!
//! A worker serves one [`WorkerQueue`] of instruction batches (`engine/worker_queue.rs`,
//! which has the sleep/wake and stop protocol and its memory ordering): the scheduler
//! pushes each loop's batch for it and rings it; the worker takes batches in order, and
//! sleeps when there are none, so no batch and no stop request is missed.

//! # Stream policies
//!
//! A worker keeps a lane for each stream it serves, and each lane follows its stream's
//! policy (`vm::stream_policy`, which has the table and how to add one): a synchronous
//! stream's instructions run here, an event-recorded stream's are launched on the device
//! and reported done by the stream's watcher thread, which the worker starts with the lane.
//! The worker picks a lane's policy once per run of instructions on one stream, and at the
//! end of each batch asks each stream it touched for its reports (a synchronous stream's
//! one "done through p").
//!
//! # Profiling
//!
//! A worker asks the timeline once per batch for a recorder (`observe::timeline`); with none
//! it runs the batch exactly as without profiling. With one, it times each instruction
//! (synchronous stream: start and end of `execute`; asynchronous stream: the start of its
//! launch, which travels to the watcher) and hands the records in before reporting the
//! batch's completions. A watcher records an instruction's launch and done times together,
//! and hands them in before each report.
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
//! 1. The scheduler, once asked to stop and with nothing in flight, stops each worker's
//!    queue (`WorkerQueue::stop`).
//! 2. A worker returns from its queue's loop once the queue is empty and stopped; before
//!    exiting it stops the threads its lanes started (the watchers) the same way and joins
//!    them. A batch pushed after the stop would be left; none is: the scheduler stops the
//!    workers only once nothing is in flight, and a worker stops its watchers only after
//!    that, when every watch has been reported (a dead VM leaves work unrun anyway).
//! 3. The VM joins the scheduler, which joined the workers.

use std::sync::Arc;
use std::thread::JoinHandle;

use crate::vm::observe::Recorder;
use crate::vm::observe::ThreadRole;

use super::engine::Parts;
use super::flight::Stamp;
use super::instruction::Batch;
use super::instruction_policy::{execute_at, ExecEnv};
use super::report::Completion;
use super::stream_policy::LanePolicy;

/// Start the worker thread of ctx `index`, which serves the streams the stream table gives
/// it.
pub(crate) fn spawn_worker(parts: Arc<Parts>, index: usize) -> std::io::Result<JoinHandle<()>> {
    let name = format!("eagervm-worker-{index}");
    std::thread::Builder::new().name(name).spawn(move || worker_main(&parts, index))
}

/// What a worker keeps for one stream it serves.
#[derive(Default)]
struct Lane {
    env: Option<Arc<ExecEnv>>,
    /// What the stream's policy keeps here (an event-recorded stream's watcher).
    policy: LanePolicy,
    /// The position of the last instruction run or launched. The scheduler dispatches each
    /// stream's instructions in order, so counting them gives their positions.
    seq: u64,
    /// Whether the current batch ran or launched any of its instructions.
    touched: bool,
}

/// A worker's lanes, one per stream of the VM (only those it serves are set up).
struct Lanes {
    lanes: Vec<Lane>,
    /// Streams run or launched in the current batch.
    touched: Vec<usize>,
    /// When the current batch began, for the flight recorder (`vm::flight`); 0 while it
    /// keeps no slots.
    now: Stamp,
    /// During a run of one synchronous stream's instructions (`run_from`): the stream
    /// position of the batch's instruction `j` is `run_base + j`.
    run_base: Option<u64>,
}

impl Lanes {
    /// Run a batch: each instruction on a synchronous stream runs here, each on an
    /// asynchronous stream is launched. A kernel that panics fails its instruction and the
    /// batch goes on with the next one; the landing pad is set once per batch (and again
    /// after each panic), not once per instruction. With `prof`, each instruction is timed.
    fn run_batch(
        &mut self,
        vm: &Parts,
        batch: &mut Batch,
        done: &mut Vec<Completion>,
        mut prof: Option<&mut Recorder>,
    ) {
        let n = batch.len();
        let mut i = 0;
        while i < n {
            let ran = crate::vm::panic_hook::catching(|| match prof.as_deref_mut() {
                None => self.run_from(vm, batch, &mut i, done),
                Some(r) => {
                    while i < n {
                        self.run(vm, batch, i, done, Some(&mut *r));
                        i += 1;
                    }
                }
            });
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
    fn run_from(&mut self, vm: &Parts, batch: &mut Batch, i: &mut usize, done: &mut Vec<Completion>) {
        let n = batch.len();
        while *i < n {
            let s = batch.ins[*i].stream.index();
            let Lanes { lanes, touched, now, run_base } = self;
            let lane = &mut lanes[s];
            if !lane.policy.runs_on_worker() {
                self.run(vm, batch, *i, done, None);
                *i += 1;
                continue;
            }
            if !lane.touched {
                lane.touched = true;
                touched.push(s);
            }
            let env = lane.env.as_deref().expect("ctx serves the instruction's stream");
            // Instruction `j` of the run is at position `base + j` of the stream: the loop
            // keeps no position, and a panic's landing pad works it out (`unwound`).
            let base = lane.seq.wrapping_add(1).wrapping_sub(*i as u64);
            *run_base = Some(base);
            // Most streams keep no flight slots (`vm::flight`): asked once per run.
            if *now != 0 && vm.flight.keeps(s) {
                run_stream::<true>(vm, batch, i, s, base, *now, env);
            } else {
                run_stream::<false>(vm, batch, i, s, base, 0, env);
            }
            *run_base = None;
            lane.seq = base.wrapping_add(*i as u64).wrapping_sub(1);
        }
    }

    /// Run (synchronous stream) or launch (asynchronous stream) instruction `i` of `batch`,
    /// under its stream's policy.
    #[inline]
    fn run(
        &mut self,
        vm: &Parts,
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
        if self.now != 0 {
            vm.flight.launched(s, lane.seq, self.now);
        }
        if !lane.touched {
            lane.touched = true;
            self.touched.push(s);
        }
        lane.policy.run(vm, s, lane.seq, batch, i, program, env, done, prof);
    }

    /// Instruction `i` of `batch` unwound out of `run`: on a synchronous stream its kernel
    /// panicked, and it fails; on an asynchronous stream the device panicked while taking
    /// the launch, which is a device failure, and its position is still reported, in turn.
    #[cold]
    fn unwound(&mut self, vm: &Parts, batch: &Batch, i: usize, payload: Box<dyn std::any::Any + Send>) {
        let s = batch.ins[i].stream.index();
        let lane = &mut self.lanes[s];
        // In a run of one stream (`run_from`) the lane's position is set at the run's end:
        // the one that panicked is the run's last.
        if let Some(base) = self.run_base.take() {
            lane.seq = base.wrapping_add(i as u64);
        }
        let env = lane.env.as_ref().expect("ctx serves the instruction's stream");
        lane.policy.unwound(vm, s, lane.seq, batch, i, env, payload);
    }
}

/// The synchronous policy's run (`stream_policy::synchronous`) of the instructions of stream
/// `s` from `*i` on, up to the batch's end or the first one on another stream, here so that
/// the lane is looked up once per run. Instruction `j` is at stream position `base + j`;
/// with `KEEPS`, each is recorded in the flight recorder as launched at `now`.
#[inline(always)]
fn run_stream<const KEEPS: bool>(
    vm: &Parts,
    batch: &mut Batch,
    i: &mut usize,
    s: usize,
    base: u64,
    now: Stamp,
    env: &ExecEnv,
) {
    let n = batch.len();
    loop {
        let j = *i;
        if KEEPS {
            vm.flight.launched(s, base.wrapping_add(j as u64), now);
        }
        prefetch_ahead(batch, j);
        let (body, n_inputs, ops, program) = batch.parts_at(j);
        execute_at(body, n_inputs, ops, program, env);
        *i = j + 1;
        if j + 1 == n || batch.ins[j + 1].stream.index() != s {
            break;
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

fn worker_main(vm: &Arc<Parts>, index: usize) {
    // The worker allocates and frees most tensors' storage: small blocks stay in a cache of
    // its own (`alloc::thread_cache`).
    crate::alloc::thread_cache::enable();
    let streams = vm.streams.served_by(index);
    let n = vm.streams.len();
    let mut lanes = Lanes {
        lanes: (0..n).map(|_| Lane::default()).collect(),
        touched: Vec::with_capacity(n),
        now: 0,
        run_base: None,
    };
    let mut joins = Vec::new();
    for &s in streams {
        let lane = &mut lanes.lanes[s];
        lane.env = Some(vm.streams.env(s).clone());
        lane.policy = LanePolicy::start(vm, s, &mut joins);
    }
    tracing::debug!(
        worker = index,
        streams = %streams.iter().map(|&s| vm.streams[s].name.as_str()).collect::<Vec<_>>().join(", "),
        "worker started"
    );
    let mut done = vm.completions.take();
    vm.workers[index].serve(vm.config.backoff(), |mut batch| {
        // Per batch, not per instruction (module docs, "Tracing").
        let _span = tracing::trace_span!(
            "batch",
            worker = index,
            stream = batch.ins.first().map_or("", |i| vm.streams[i.stream.index()].name.as_str()),
            n = batch.len(),
        )
        .entered();
        if vm.flight.on() {
            lanes.now = vm.flight.now();
        }
        match vm.timeline.begin(ThreadRole::Worker(index as u32)) {
            None => lanes.run_batch(vm, &mut batch, &mut done, None),
            Some(mut r) => {
                let start = r.now();
                lanes.run_batch(vm, &mut batch, &mut done, Some(&mut r));
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
            lane.policy.end_batch(vm, s, lane.seq, &mut done);
        }
        if !done.is_empty() {
            vm.completions.report(std::mem::replace(&mut done, vm.completions.take()));
        }
    });
    for lane in &lanes.lanes {
        lane.policy.stop();
    }
    for j in joins {
        let _ = j.join();
    }
    tracing::debug!(worker = index, "worker stopped");
}
