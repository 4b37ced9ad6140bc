//! The scheduler thread: the single owner of all dependence state.
//!
//! The thread's loop (what it takes from the completion channel and the inbox, in which
//! order, and when it sleeps and stops) is the engine's (`vm/engine/scheduler_loop.rs`);
//! this file is what the loop does with each report and each batch ([`Scheduler`], through
//! `Dispatch`). The inbox numbers each batch as the scheduler receives it.
//!
//! # Lifecycle of one instruction
//!
//! ```text
//! received ──(no in-edge left, stream's earlier ones dispatched)──> dispatched ──> launched ──> done = retired
//! ```
//!
//! 1. **Receive.** Batches arrive in the inbox in program order. Each instruction gets a
//!    program number and the next position on its stream, which together with the stream
//!    name it (`InstrRef`). Its operands go through the dependence rules
//!    (`vm::dependence`), which call `EdgeSink::connect` for every earlier access on
//!    another stream it must follow. A run of `OpCall`s on one stream with nothing parked
//!    is admitted in one loop over the stream's state (`admit_run`).
//! 2. **Dispatch.** An instruction with no in-edge left, whose stream has dispatched every
//!    earlier instruction, goes to its worker's outgoing batch; one that must wait is
//!    parked in its stream's queue of undispatched instructions (in stream order). A
//!    received batch whose instructions are all ready for one worker goes to that worker
//!    whole, without moving an instruction. Outgoing batches are handed over once per loop.
//! 3. **Launched / done.** Workers and watchers report, per stream, "done through position
//!    p" (a synchronous stream once per batch; an asynchronous stream's watcher per event,
//!    in stream order), and a `RecordEvent` on an asynchronous stream also reports
//!    "launched" (its event is recorded and may be waited on).
//! 4. **Retire.** A stream completes in order, so "done through p" retires everything up to
//!    p at once: the stream's done position moves, pooled events go back to their pool, the
//!    edges waiting on those instructions are released, and the in-flight count drops. The
//!    scheduler keeps no per-instruction record of an instruction that never waited and
//!    that nothing waits for.
//!
//! # When an edge is released
//!
//! | source and target | released when the source is |
//! | --- | --- |
//! | same stream | never made: the stream dispatches, runs and completes in order |
//! | `RecordEvent` → the `StreamWaitEvent` that waits on it | launched (event recorded) |
//! | different streams, target stream has waited on the device for an event recorded on the source stream at or after the source | covered: the `StreamWaitEvent` is earlier on the target's stream, which keeps order |
//! | different streams otherwise | done |
//!
//! An edge is a target reference filed under its source's stream, in a min-heap on the
//! source's position, one heap for each release condition; a stream's progress pops what
//! it releases.
//!
//! # Barriers
//!
//! A `Barrier` has no operands and never reaches a worker: it takes the scheduler-thread
//! stream policy (`vm::stream_policy::scheduler`). On receipt it notes each stream's last
//! position; its callback runs on this thread once every stream is done through the
//! position noted for it.
//!
//! # Priorities
//!
//! Where one worker serves streams of different priorities (`Config::stream_priorities`,
//! with `ThreadTopology::PerDevice` or `Single`), the streams woken by one loop's completions
//! are dispatched highest priority first, so their instructions come first in the worker's
//! batch and run first. The order among one stream's instructions, and the program order in
//! which received instructions are dispatched, never change. It costs a sort of the woken
//! streams per loop, only in such a configuration; otherwise a flag test per loop.
//!
//! # Tracing
//!
//! A barrier's callback runs inside a DEBUG span `barrier`; each received batch is a TRACE
//! span `receive`. Both are per barrier or per batch, never per instruction: disabled, a
//! span is a check of its callsite's cached interest.
//!
//! # Profiling
//!
//! Each loop asks the profiler once for a recorder (`None` when no session is open) and
//! hands the loop's records in at its end; with a recorder, the loop records its intake
//! and completion slices, each received instruction, later dispatches, the done-edges
//! between streams and, at most every 50 µs, the counters (`observe::timeline`). It hands them
//! in before running a barrier's callback, so a caller that waited on a barrier finds every
//! record the scheduler made before it, and asks for a new recorder after, so that a
//! session opened before the barrier covers everything after it.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::Arc;

use crate::ep::Event;
use crate::vm::observe::ThreadRole;
use crate::vm::observe::{Nanos, Rec, Recorder};

use super::dependence::{EdgeSink, InstrRef};
use super::engine::{Dispatch, Parts};
use super::flight::Stamp;
use super::instruction::{AccessMode, Batch, Body, Instruction, Operand};
use super::report::{Completion, Report};
use super::stream::StreamId;
use super::stream_policy::kind::StreamPolicy;
use super::stream_policy::Barriers;

/// An undispatched instruction of a stream (its operands wait in the stream's
/// `parked_ops`, in the same order).
struct Parked {
    /// In-edges not yet released.
    pending: u32,
    /// How many operands it has.
    n_ops: u32,
    program: u64,
    ins: Instruction,
}

/// "Stream `dst` has waited on the device for everything on stream `src` up to this
/// position" (through a `StreamWaitEvent` earlier on `dst`), per (dst, src).
type Cover = u64;

/// A live `RecordEvent`: where it is and, once launched, its event.
struct LiveRecord {
    at: InstrRef,
    event: Option<Arc<dyn Event>>,
}

/// Per-stream scheduler state. Positions: `done <= dispatched <= last`.
#[derive(Default)]
struct StreamState {
    /// The worker (`ThreadCtx`) that runs this stream.
    ctx: u32,
    /// The last position given out.
    last: u64,
    /// Every instruction up to here has been dispatched.
    dispatched: u64,
    /// Every `RecordEvent` up to here has recorded its event.
    launched: u64,
    /// Every instruction up to here has finished (and retired).
    done: u64,
    /// Undispatched instructions, positions `dispatched + 1 ..= last`.
    parked: VecDeque<Parked>,
    /// Their operands, one after another: they leave in the order they came.
    parked_ops: VecDeque<Operand>,
    /// Edges from this stream released when their source is done: (source position, target).
    on_done: BinaryHeap<Reverse<(u64, InstrRef)>>,
    /// Edges released when their source (a `RecordEvent`) is launched.
    on_launch: BinaryHeap<Reverse<(u64, InstrRef)>>,
    /// Live `RecordEvent` ids, in stream order.
    records: VecDeque<(u64, u64)>,
}

/// What admitting an instruction decided.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Admit {
    /// Dispatched: hand it to this worker.
    Ready(u32),
    /// It must wait for this many in-edges (or for earlier instructions of its stream):
    /// park it.
    Park(u32),
    /// Taken in by the scheduler itself (the scheduler-thread stream policy: a barrier).
    Consumed,
    /// Its stream has no position left: the VM stops.
    Exhausted,
}

/// The scheduler's dependence state, and what it needs of the engine's parts. Its loop is
/// the engine's (`engine::scheduler_loop`), which hands it reports and batches through
/// [`Dispatch`].
pub(crate) struct Scheduler<'e> {
    parts: &'e Parts,
    streams: Vec<StreamState>,
    /// `covers[dst * n + src]` (see [`Cover`]).
    covers: Vec<Cover>,
    /// Live `RecordEvent`s by event id.
    events: HashMap<u64, LiveRecord>,
    /// Received barriers not yet run (the scheduler-thread stream policy).
    barriers: Barriers,
    program: u64,
    /// In-edges of the instruction being admitted.
    pending: u32,
    /// Streams with parked instructions whose front may have become dispatchable.
    wake: Vec<u32>,
    /// Per ThreadCtx: the batch being filled this loop.
    outgoing: Vec<Batch>,
    retired_this_loop: usize,
    /// This loop's profile recorder, if a session is open.
    prof: Option<Recorder>,
    /// When this loop's completion reports, then its intake, began (profiling).
    t0: Nanos,
    /// The flight recorder's clock, read once per loop while it keeps slots (`vm::flight`).
    now: Stamp,
    /// Per stream: its type's priority (`Config::stream_priorities`).
    prio: Vec<i32>,
    /// Whether some worker serves streams of different priorities: only then does
    /// `dispatch_woken` order the woken streams (see "Priorities" in the module docs).
    prioritized: bool,
}

impl<'e> Scheduler<'e> {
    /// A scheduler over `parts`, with nothing received yet.
    pub(crate) fn new(parts: &'e Parts) -> Self {
        let table = &parts.streams;
        let n = table.len();
        let prio: Vec<i32> = table.iter().map(|s| parts.config.stream_priorities.get(s.ty)).collect();
        let prioritized = table
            .iter()
            .enumerate()
            .any(|(i, a)| table[..i].iter().enumerate().any(|(j, b)| b.ctx == a.ctx && prio[j] != prio[i]));
        Scheduler {
            prio,
            prioritized,
            streams: table
                .iter()
                .map(|s| StreamState { ctx: s.ctx as u32, ..StreamState::default() })
                .collect(),
            covers: vec![0; n * n],
            events: HashMap::new(),
            barriers: Barriers::default(),
            program: 0,
            pending: 0,
            wake: Vec::new(),
            outgoing: (0..parts.workers.len()).map(|_| Batch::default()).collect(),
            retired_this_loop: 0,
            prof: None,
            t0: 0,
            now: 0,
            parts,
        }
    }
}

impl Dispatch<Batch, Completion> for Scheduler<'_> {
    #[inline]
    fn begin(&mut self) {
        self.prof = self.parts.timeline.begin(ThreadRole::Scheduler);
        if self.parts.flight.on() {
            self.now = self.parts.flight.now();
        }
        self.t0 = self.prof.as_ref().map_or(0, Recorder::now);
    }

    #[inline]
    fn complete(&mut self, c: Completion) {
        self.on_report(c);
    }

    fn completed(&mut self, n: usize) {
        self.dispatch_woken();
        self.run_barriers();
        if let Some(r) = &mut self.prof {
            r.slice("completions", self.t0, n);
        }
        self.t0 = self.prof.as_ref().map_or(0, Recorder::now);
    }

    #[inline]
    fn receive(&mut self, batch: Batch, first: u64) {
        let _span = tracing::trace_span!("receive", n = batch.len()).entered();
        self.receive_batch(batch, first);
    }

    fn received(&mut self, n: usize) {
        if let Some(r) = &mut self.prof {
            r.slice("intake", self.t0, n);
        }
    }

    /// Hand this loop's outgoing batches to the workers; what retired in the loop leaves
    /// flight.
    #[inline]
    fn flush(&mut self) -> usize {
        for (i, out) in self.outgoing.iter_mut().enumerate() {
            if !out.is_empty() {
                let batch = std::mem::replace(out, self.parts.take_batch());
                self.parts.workers[i].push(batch);
            }
        }
        std::mem::take(&mut self.retired_this_loop)
    }

    #[inline]
    fn end(&mut self, busy: bool) {
        if let Some(mut r) = self.prof.take() {
            if busy {
                r.sample(&self.parts.timeline, self.parts.inbox.in_flight(), false);
            }
            r.finish(&self.parts.timeline);
        }
    }
}

impl Scheduler<'_> {
    /// Receive one batch from the inbox, in program order.
    ///
    /// Admission (numbering, dependence rules, the dispatch decision) works on the
    /// instructions in place; an instruction that must wait is moved to its stream's queue
    /// at once. When every instruction of the batch is ready and all go to one worker (a
    /// stream that keeps up with its caller), the batch itself is handed to that worker.
    /// Otherwise the ready ones move to their workers' outgoing batches.
    ///
    /// Admitting an instruction never releases another one: edges are released by
    /// completion reports only. So the order in which this function hands instructions over
    /// is program order per stream.
    fn receive_batch(&mut self, mut batch: Batch, first: u64) {
        // The inbox numbered the batch as it received it (`engine/inbox.rs`): a waiter may
        // have numbered instructions it ran itself since the last one.
        self.program = first - 1;
        let mut single: Option<u32> = None;
        let mut whole = true;
        let mut i = 0;
        while i < batch.len() {
            if self.prof.is_none() {
                let (run, ctx, parked) = self.admit_run(&mut batch, i);
                if run > 0 {
                    whole &= !parked && *single.get_or_insert(ctx) == ctx;
                    i += run;
                    continue;
                }
            }
            self.program += 1;
            let program = self.program;
            let (body, stream, n_inputs, ops) = batch.parts(i);
            match self.admit(body, stream, n_inputs, ops, program) {
                Admit::Ready(ctx) => whole &= *single.get_or_insert(ctx) == ctx,
                Admit::Park(pending) => {
                    whole = false;
                    self.park(&mut batch, i, pending, program);
                }
                Admit::Consumed => whole = false,
                Admit::Exhausted => {
                    whole = false;
                    self.exhausted(&mut batch, i);
                }
            }
            i += 1;
        }
        if let (true, Some(ctx)) = (whole, single) {
            // Keep order with what this loop already dispatched to the same worker.
            let ctx = ctx as usize;
            if !self.outgoing[ctx].is_empty() {
                let earlier = std::mem::replace(&mut self.outgoing[ctx], self.parts.take_batch());
                self.parts.workers[ctx].push(earlier);
            }
            batch.number_from(first);
            self.parts.workers[ctx].push(batch);
        } else {
            // What admission left in the batch: the ready instructions, the inert husks of
            // those it parked (moved out), and the consumed barriers.
            batch.number_from(first);
            batch.drain_each(|ins, ops, program| match ins.body {
                Body::Release { owner: None } => {}
                ref body if StreamPolicy::on_scheduler(body) => {}
                _ => {
                    let ctx = self.streams[ins.stream.index()].ctx as usize;
                    self.outgoing[ctx].push_numbered(ins, ops, program);
                }
            });
            self.parts.recycle(batch);
        }
    }

    /// Admit, from instruction `from` of `batch` on, the run of `OpCall`s on `from`'s stream,
    /// the common case, with the stream's state looked up once: what [`admit`](Self::admit)
    /// does to each, without its checks for other kinds of instruction and for profiling.
    /// Returns how many it admitted (0 if the run cannot start here: the stream has
    /// undispatched instructions, keeps flight slots or has no position left, or `from` is
    /// not an `OpCall`), the worker that runs them, and whether it parked the last of them.
    /// The run stops after an instruction that must wait, which it parks (the batch is then
    /// not handed over whole), or before the first instruction of another kind or stream.
    /// Called only without a profiling session.
    ///
    /// Kept out of line: compiled on its own, its loop keeps its state in registers; inlined
    /// into the scheduler's loop it spilled to the stack on every instruction
    /// (`docs/performance.md`, "Why the hot paths are shaped so", has the measurement).
    #[inline(never)]
    fn admit_run(&mut self, batch: &mut Batch, from: usize) -> (usize, u32, bool) {
        let ins = &batch.ins[from];
        let s = ins.stream.0;
        let st = &self.streams[s as usize];
        // A stream that keeps flight slots (the collective streams by default, `vm::flight`)
        // records each instruction as it is admitted: `admit` does that, one at a time.
        if !matches!(ins.body, Body::OpCall { .. })
            || ins.views
            || st.dispatched != st.last
            || self.parts.flight.keeps(s as usize)
        {
            return (0, 0, false);
        }
        let (last, ctx) = (st.last, st.ctx);
        let room = usize::try_from(InstrRef::MAX_SEQ - last).unwrap_or(usize::MAX);
        let end = batch.len().min(from.saturating_add(room));
        let mut seq = last;
        let mut i = from;
        let mut parked = None;
        loop {
            // The common path: every access on record is on this stream (or there is none),
            // so no edge is made (`DepObject::read_local`). It calls nothing, so that its
            // state stays in registers; an operand whose record names another stream leaves
            // it, with that operand and the ones after it still to be ruled on.
            let mut rest = None;
            while i < end {
                // An instruction with an operand that views another's storage leaves the run:
                // the loop reaches each operand's own dependence object, untested.
                let views = batch.has_views(i);
                let (body, stream, _, ops) = batch.parts(i);
                if stream.0 != s || !matches!(body, Body::OpCall { .. }) || views {
                    break;
                }
                seq += 1;
                i += 1;
                let me = InstrRef::new(s, seq);
                // The index of the operand left is worked out from where the iterator
                // stopped: counted in the loop, the count and the instruction's index
                // went to the stack and back on every instruction.
                let mut it = ops.iter();
                for op in it.by_ref() {
                    // SAFETY: as in `apply_rules`; no operand is a shared view (above).
                    let dep = unsafe { op.own_dep() };
                    let local = match op.mode() {
                        AccessMode::Read => dep.read_local(me),
                        AccessMode::Write => dep.write_local(me),
                    };
                    if !local {
                        rest = Some(ops.len() - it.len() - 1);
                        break;
                    }
                }
                if rest.is_some() {
                    break;
                }
            }
            let Some(k) = rest else { break };
            // Instruction `i - 1`, from operand `k` on: the full rules, which may make edges.
            let ops = batch.parts(i - 1).3;
            self.pending = 0;
            self.apply_rules(InstrRef::new(s, seq), &ops[k..]);
            if self.pending > 0 {
                parked = Some(self.pending);
                break;
            }
        }
        let st = &mut self.streams[s as usize];
        st.last = seq;
        st.dispatched = if parked.is_some() { seq - 1 } else { seq };
        self.parts.flight.marks(s as usize, seq, st.dispatched);
        self.program += (i - from) as u64;
        if let Some(pending) = parked {
            self.park(batch, i - 1, pending, self.program);
        }
        (i - from, ctx, parked.is_some())
    }

    /// Admit one instruction (its body, stream and operands): give it its stream position,
    /// apply the dependence rules, and dispatch it if nothing holds it back. The caller
    /// moves a ready one where it belongs, or parks it.
    fn admit(
        &mut self,
        body: &mut Body,
        stream: StreamId,
        n_inputs: u8,
        ops: &[Operand],
        program: u64,
    ) -> Admit {
        if StreamPolicy::on_scheduler(body) {
            self.barriers.admit(body, program, self.streams.iter().map(|s| s.last), self.prof.as_mut());
            // A barrier is not an instruction in flight: settle the count the caller added.
            self.retired_this_loop += 1;
            self.run_barriers();
            return Admit::Consumed;
        }
        let stream = stream.0;
        let st = &mut self.streams[stream as usize];
        if st.last == InstrRef::MAX_SEQ {
            return Admit::Exhausted;
        }
        st.last += 1;
        let seq = st.last;
        let me = InstrRef::new(stream, seq);
        self.pending = 0;
        if !matches!(body, Body::OpCall { .. }) {
            self.admit_event(body, me);
        }
        self.apply_rules(me, ops);
        let pending = self.pending;
        let st = &mut self.streams[stream as usize];
        let ready = pending == 0 && st.dispatched + 1 == seq;
        let flight = &self.parts.flight;
        if flight.on() {
            flight.admitted(stream as usize, seq, program, body, n_inputs, ops, self.now, ready);
        }
        flight.marks(stream as usize, seq, if ready { seq } else { st.dispatched });
        if let Some(r) = &mut self.prof {
            let t = r.now();
            r.admitted(body, StreamId(stream), ops, program, me, t, ready.then_some(t));
        }
        if ready {
            st.dispatched = seq;
            let ctx = st.ctx;
            if matches!(body, Body::StreamWaitEvent { .. }) {
                self.prepare(body);
            }
            Admit::Ready(ctx)
        } else {
            Admit::Park(pending)
        }
    }

    /// Apply the dependence rules to each operand of instruction `me`, in order; the edges
    /// they ask for are counted in `self.pending`.
    #[inline(always)]
    fn apply_rules(&mut self, me: InstrRef, ops: &[Operand]) {
        for op in ops {
            // SAFETY: the instruction is being admitted, so its operands' tensors are alive
            // (`Operand::tensor`); only the scheduler thread (this one) touches dependence
            // objects, and no other reference to this one is held across this call.
            let dep = unsafe { op.dep() };
            match op.mode() {
                AccessMode::Read => dep.read(me, self),
                AccessMode::Write => dep.write(me, self),
            }
        }
    }

    /// Move instruction `i` of `batch` (admitted, with `pending` in-edges) to the back of
    /// its stream's queue of undispatched instructions, its operands to the stream's
    /// operand queue. Out of line: inlined into `admit_run` (as the compiler chose for some
    /// builds and not others) its frame made the admission of every ready instruction spill
    /// more (`docs/performance.md`, "Why the hot paths are shaped so").
    #[inline(never)]
    fn park(&mut self, batch: &mut Batch, i: usize, pending: u32, program: u64) {
        let ins = batch.ins[i].take();
        let ops = batch.operands(&ins);
        let st = &mut self.streams[ins.stream.index()];
        st.parked_ops.extend(ops.iter());
        st.parked.push_back(Parked { pending, n_ops: ops.len() as u32, program, ins });
    }

    /// Instruction `i` of `batch` needs a position its stream does not have: the VM cannot
    /// go on.
    #[cold]
    fn exhausted(&mut self, batch: &mut Batch, i: usize) {
        let ins = batch.ins[i].take();
        let name = &self.parts.streams[ins.stream.index()].name;
        self.parts
            .fail(format!("stream {name} has run {} instructions, the most a stream can", InstrRef::MAX_SEQ));
        let mut dead = self.parts.take_batch();
        dead.push(ins, &[]);
        self.parts.inbox.bury(dead);
    }

    /// The event side of admitting `ins` (`me`): a `RecordEvent` is filed under its id; a
    /// `StreamWaitEvent` gets its edge from the `RecordEvent` it waits for, and the cover.
    fn admit_event(&mut self, body: &Body, me: InstrRef) {
        let (stream, seq) = (me.stream(), me.seq());
        match body {
            Body::RecordEvent { id } => {
                self.events.insert(*id, LiveRecord { at: me, event: None });
                self.streams[stream as usize].records.push_back((seq, *id));
            }
            Body::StreamWaitEvent { id } => {
                if let Some(rec) = self.events.get(id).map(|r| r.at) {
                    let src = &mut self.streams[rec.stream() as usize];
                    if src.launched < rec.seq() && src.done < rec.seq() {
                        src.on_launch.push(Reverse((rec.seq(), me)));
                        self.pending += 1;
                    }
                    // Only a stream that really waits on the device covers the source
                    // stream (a synchronous stream has nothing to wait with).
                    let target = &self.parts.streams[stream as usize];
                    if target.policy.is_asynchronous() && target.device_waits {
                        let n = self.streams.len();
                        let c = &mut self.covers[stream as usize * n + rec.stream() as usize];
                        *c = (*c).max(rec.seq());
                    }
                }
            }
            _ => {}
        }
    }

    /// Ready a dispatched instruction for its worker: a `StreamWaitEvent` gets the event it
    /// waits for (none if that is already done).
    fn prepare(&mut self, body: &mut Body) {
        if let Body::StreamWaitEvent { id } = *body {
            let event = self.events.get(&id).and_then(|r| {
                let src = &self.streams[r.at.stream() as usize];
                if src.done < r.at.seq() {
                    r.event.clone()
                } else {
                    None
                }
            });
            *body = Body::WaitEvent { event };
        }
    }

    /// Release one in-edge of `to` (a parked instruction).
    fn release(&mut self, to: InstrRef) {
        let st = &mut self.streams[to.stream() as usize];
        let k = (to.seq() - st.dispatched - 1) as usize;
        let p = &mut st.parked[k];
        p.pending -= 1;
        if k == 0 && p.pending == 0 {
            self.wake.push(to.stream());
        }
    }

    /// Dispatch, in order, the parked instructions at the front of each woken stream that
    /// have no in-edge left.
    fn dispatch_woken(&mut self) {
        if self.prioritized && self.wake.len() > 1 {
            // Ascending, so that `pop` takes the highest priority first.
            let prio = &self.prio;
            self.wake.sort_by_key(|&s| prio[s as usize]);
        }
        while let Some(s) = self.wake.pop() {
            loop {
                let st = &mut self.streams[s as usize];
                match st.parked.front() {
                    Some(p) if p.pending == 0 => {}
                    _ => break,
                }
                let Parked { program, n_ops, mut ins, .. } = st.parked.pop_front().expect("front checked");
                st.dispatched += 1;
                let flight = &self.parts.flight;
                if flight.on() {
                    flight.dispatched(s as usize, st.dispatched, self.now);
                }
                flight.dispatched_mark(s as usize, st.dispatched);
                let ctx = st.ctx as usize;
                let ops = st.parked_ops.drain(..n_ops as usize);
                let out = &mut self.outgoing[ctx];
                let range = out.place(n_ops as usize, ops);
                if let Some(r) = &mut self.prof {
                    r.push(Rec::Dispatch { program, t: r.now() });
                }
                self.prepare(&mut ins.body);
                ins.ops = range;
                self.outgoing[ctx].push_placed(ins, program);
            }
        }
    }

    /// Take in one completion report: retire what it reports done, release the edges it
    /// releases.
    fn on_report(&mut self, c: Completion) {
        let s = c.stream as usize;
        match c.report {
            Report::Launched { id } => {
                let st = &mut self.streams[s];
                if c.seq <= st.done {
                    return; // retired already (its watcher reported first)
                }
                st.launched = st.launched.max(c.seq);
                if let Some(r) = self.events.get_mut(&id) {
                    r.event = c.event;
                }
                while let Some(&Reverse((q, to))) = self.streams[s].on_launch.peek() {
                    if q > c.seq {
                        break;
                    }
                    self.streams[s].on_launch.pop();
                    self.release(to);
                }
            }
            Report::Done => {
                if let Some(ev) = c.event {
                    self.parts.streams[s].events.give(ev);
                }
                let st = &mut self.streams[s];
                if c.seq <= st.done {
                    return;
                }
                self.retired_this_loop += (c.seq - st.done) as usize;
                self.parts.flight.done(s, st.done, c.seq, self.now);
                st.done = c.seq;
                st.launched = st.launched.max(c.seq);
                while let Some(&(q, id)) = st.records.front() {
                    if q > c.seq {
                        break;
                    }
                    st.records.pop_front();
                    self.events.remove(&id);
                }
                for heap in [0, 1] {
                    loop {
                        let st = &mut self.streams[s];
                        let h = if heap == 0 { &mut st.on_done } else { &mut st.on_launch };
                        match h.peek() {
                            Some(&Reverse((q, to))) if q <= c.seq => {
                                h.pop();
                                self.release(to);
                            }
                            _ => break,
                        }
                    }
                }
            }
        }
    }

    /// Run the callbacks of the barriers whose streams are done through their positions,
    /// in order.
    fn run_barriers(&mut self) {
        while let Some(b) = self.barriers.pop_ready(self.streams.iter().map(|s| s.done)) {
            // What retired so far leaves flight first: whoever the barrier wakes (a sync)
            // finds nothing in flight that finished before the barrier.
            let retired = std::mem::take(&mut self.retired_this_loop);
            if retired > 0 {
                self.parts.inbox.retire(retired);
            }
            // Hand the loop's records in first: whoever waits on the barrier (a sync, the
            // end of a profiling session) finds them there. The rest of the loop records
            // afresh if a session is open (one may just have been started).
            if let Some(r) = self.prof.take() {
                r.finish(&self.parts.timeline);
            }
            self.prof = self.parts.timeline.begin(ThreadRole::Scheduler);
            b.run();
        }
    }
}

impl Drop for Scheduler<'_> {
    /// A scheduler that stops with instructions still parked or undispatched (the VM died,
    /// or it panicked) hands them to the VM to keep until every thread has exited: a
    /// worker may still be running an instruction on a tensor one of them owns.
    fn drop(&mut self) {
        // Buried instructions never run: their operands are not kept.
        let mut left = self.parts.take_batch();
        for st in &mut self.streams {
            for p in st.parked.drain(..) {
                left.push(p.ins, &[]);
            }
        }
        self.parts.inbox.bury(left);
        for out in &mut self.outgoing {
            self.parts.inbox.bury(std::mem::take(out));
        }
    }
}

impl EdgeSink for Scheduler<'_> {
    #[inline]
    fn connect(&mut self, src: InstrRef, dst: InstrRef) {
        let (ss, ds) = (src.stream() as usize, dst.stream() as usize);
        if self.covers[ds * self.streams.len() + ss] >= src.seq() {
            // A `StreamWaitEvent` earlier on the target's stream waits, on the device, for
            // an event recorded after `src`; the target's stream keeps order behind it.
            return;
        }
        let st = &mut self.streams[ss];
        if st.done >= src.seq() {
            return;
        }
        st.on_done.push(Reverse((src.seq(), dst)));
        self.pending += 1;
        if let Some(r) = &mut self.prof {
            r.push(Rec::Edge { src, dst });
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_parked_instruction_record_stays_small() {
        // The one per-instruction record the scheduler keeps, and only while it waits: the
        // line-aligned instruction and one more line for its count and program number.
        assert!(std::mem::size_of::<super::Parked>() <= 128);
    }
}
