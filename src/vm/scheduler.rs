//! The scheduler thread: the single owner of all dependence state.
//!
//! # Lifecycle of one instruction
//!
//! ```text
//! received ──(no in-edges left)──> dispatched ──> launched ──> done ──(stream front)──> retired
//! ```
//!
//! 1. **Receive.** Batches arrive in the inbox in program order. Each instruction gets a
//!    slot in the slab (a free list, most recently freed first, so hot slots stay in cache),
//!    a program number, and a sequence number on its stream. Its operands go through the
//!    dependence rules (`vm::dependence`), which call `Scheduler::connect` for every
//!    earlier access it must follow.
//! 2. **Dispatch.** An instruction with no in-edge left is moved into its worker's outgoing
//!    batch. Batches are handed to workers once per scheduler loop.
//! 3. **Launched / done.** Workers report completion; asynchronous streams report `done`
//!    from their watcher when the instruction's event is reached, and `RecordEvent`s also
//!    report `launched` (the event is recorded and may be waited on).
//! 4. **Retire.** Each stream retires its instructions in FIFO order once they are done:
//!    the slot's generation is bumped (stale references now read as finished), its pooled
//!    event goes back to the pool, and the in-flight count drops.
//!
//! # When an edge is released
//!
//! | source and target | released when the source is |
//! | --- | --- |
//! | same stream | dispatched (the stream keeps order) |
//! | `RecordEvent` → the `StreamWaitEvent` that waits on it | launched (event recorded) |
//! | different streams, target stream has waited on the device for an event recorded on the source stream at or after the source | covered: replaced by a same-stream edge from that `StreamWaitEvent` |
//! | different streams otherwise | done |
//!
//! Dispatch on a stream is kept in program order by an implicit same-stream edge from the
//! stream's previous instruction while that one is undispatched; this is what lets a
//! `StreamWaitEvent` cover *everything* recorded on the source stream before its event.
//!
//! # Barriers
//!
//! A `Barrier` has no operands and never reaches a worker. It closes an *epoch*: the
//! scheduler counts live instructions per epoch and runs the barrier's callback on this
//! thread once every earlier epoch has no live instruction left.
//!
//! # Profiling
//!
//! Each loop asks the profiler once for a recorder (`None` when no session is open) and
//! hands the loop's records in at its end; with a recorder, the loop records its intake
//! and completion slices, each received batch's instructions, later dispatches, the
//! done-edges between streams and, at most every 50 µs, the counters (`crate::profile`).
//! It hands them in before running a barrier's callback, so a caller that waited on a
//! barrier finds every record the scheduler made before it, and asks for a new recorder
//! after, so that a session opened before the barrier covers everything after it.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::Event;
use crate::profile::recorder::{Rec, Recorder};
use crate::profile::ThreadRole;
use crate::sync::Ordering;

use super::dependence::{EdgeSink, InstrRef};
use super::instruction::{AccessMode, InstrKind, Instruction};
use super::VmShared;

/// How far an instruction has got. Ordered: a later state implies the earlier ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
#[repr(u8)]
enum State {
    Free = 0,
    Waiting = 1,
    Dispatched = 2,
    Launched = 3,
    Done = 4,
}

/// What a completion report says.
#[derive(Debug)]
pub(crate) enum Report {
    /// The instruction's event is recorded (sent for `RecordEvent` on async streams).
    Launched,
    /// The instruction has finished.
    Done,
    /// The instruction has finished, and so has every earlier instruction of its stream
    /// (a synchronous stream runs its instructions in order: one report per batch).
    DoneThrough,
}

/// A completion report from a worker or watcher.
#[derive(Debug)]
pub(crate) struct Completion {
    pub(crate) slot: u32,
    pub(crate) gen: u32,
    pub(crate) report: Report,
    /// The instruction's pooled event, to hold until it retires.
    pub(crate) event: Option<Arc<dyn Event>>,
}

/// What admitting an instruction decided.
enum Admit {
    /// Dispatched: hand it to this worker.
    Ready(usize),
    /// Parked until its in-edges are released.
    Waiting,
    /// Taken in by the scheduler itself (a barrier).
    Consumed,
}

/// An edge out of an instruction: the target slot and the state that releases it.
#[derive(Debug, Clone, Copy)]
struct Edge {
    to: u32,
    on: State,
}

/// The scheduler's record of one instruction: one cache line. What only some
/// instructions need (a parked body, a pooled event, a `RecordEvent` id) lives in side
/// tables indexed by the same slot, so admitting and retiring an instruction that needs
/// none of it touches this line alone.
#[repr(align(64))]
struct Node {
    gen: u32,
    stream: u32,
    /// In-edges not yet released.
    pending: u32,
    state: State,
    /// Whether `Extra` holds anything for this slot.
    extra: bool,
    /// Position on its stream (1-based).
    seq: u64,
    /// Barrier epoch it belongs to.
    epoch: u64,
    out: SmallVec<[Edge; 2]>,
}

impl Node {
    fn empty() -> Self {
        Node {
            gen: 0,
            stream: 0,
            pending: 0,
            state: State::Free,
            extra: false,
            seq: 0,
            epoch: 0,
            out: SmallVec::new(),
        }
    }
}

/// What some instructions keep in the scheduler besides their `Node`.
#[derive(Default)]
struct Extra {
    /// `RecordEvent` id, 0 if not a `RecordEvent`.
    record_id: u64,
    /// The instruction's pooled event, held until it retires.
    event: Option<Arc<dyn Event>>,
}

/// Per-stream scheduler state.
#[derive(Default)]
struct StreamState {
    /// Live instructions in program order; retired from the front.
    fifo: VecDeque<u32>,
    next_seq: u64,
    /// The last instruction received on this stream.
    tail: Option<InstrRef>,
}

/// "Stream `dst` has waited on the device for everything on stream `src` up to `seq`,
/// through the `StreamWaitEvent` `via` (which is on `dst`)."
#[derive(Clone, Copy, Default)]
struct Cover {
    seq: u64,
    via: Option<InstrRef>,
}

/// Live instructions of one barrier epoch, and the callbacks waiting for it to end.
struct Epoch {
    live: u64,
    callbacks: Vec<Box<dyn FnOnce() + Send>>,
}

pub(crate) struct Scheduler {
    vm: Arc<VmShared>,
    nodes: Vec<Node>,
    /// Per slot: the instruction, parked here while it waits for in-edges.
    parked: Vec<Option<Instruction>>,
    /// Per slot: see `Extra` (valid where the node's `extra` is set).
    extras: Vec<Extra>,
    free: Vec<u32>,
    streams: Vec<StreamState>,
    covers: Vec<Cover>,
    /// Live `RecordEvent`s by event id.
    events: HashMap<u64, InstrRef>,
    epochs: VecDeque<Epoch>,
    epoch_base: u64,
    program: u64,
    /// Instructions made ready and not yet dispatched (a work list, not recursion).
    ready: Vec<u32>,
    /// Per ThreadCtx: the batch being filled this loop.
    outgoing: Vec<Vec<Instruction>>,
    retired_this_loop: usize,
    /// This loop's profile recorder, if a session is open.
    prof: Option<Recorder>,
}

impl Scheduler {
    pub(crate) fn new(vm: Arc<VmShared>) -> Self {
        let n = vm.streams.len();
        let ctxs = vm.ctxs.len();
        Scheduler {
            nodes: Vec::new(),
            parked: Vec::new(),
            extras: Vec::new(),
            free: Vec::new(),
            streams: (0..n).map(|_| StreamState::default()).collect(),
            covers: vec![Cover::default(); n * n],
            events: HashMap::new(),
            epochs: VecDeque::from([Epoch { live: 0, callbacks: Vec::new() }]),
            epoch_base: 0,
            program: 0,
            ready: Vec::new(),
            outgoing: (0..ctxs).map(|_| Vec::new()).collect(),
            retired_this_loop: 0,
            prof: None,
            vm,
        }
    }

    /// The scheduler loop. Returns when shutdown was asked for and nothing is in flight.
    pub(crate) fn run(mut self) {
        let vm = self.vm.clone();
        loop {
            self.prof = vm.profiler.begin(ThreadRole::Scheduler);
            let t0 = self.prof.as_ref().map_or(0, Recorder::now);
            let mut n = 0;
            while let Some(mut batch) = vm.completions.pop() {
                n += batch.len();
                for c in batch.drain(..) {
                    self.complete(c);
                }
                vm.completion_pool.push(batch);
            }
            let mut busy = n > 0;
            if let (true, Some(r)) = (busy, &mut self.prof) {
                r.slice("completions", t0, n);
            }
            let t1 = self.prof.as_ref().map_or(0, Recorder::now);
            n = 0;
            // Bounded per loop so that completions (which free slots) interleave with intake.
            for _ in 0..4 {
                let Some(batch) = vm.inbox.pop() else { break };
                let _span = tracing::trace_span!("receive", n = batch.len()).entered();
                n += batch.len();
                self.receive_batch(batch);
                busy = true;
            }
            if let (true, Some(r)) = (n > 0, &mut self.prof) {
                r.slice("intake", t1, n);
            }
            self.flush();
            if let Some(mut r) = self.prof.take() {
                if busy {
                    r.sample(&vm.profiler, vm.in_flight.load(Ordering::Relaxed), false);
                }
                r.finish(&vm.profiler);
            }
            if busy {
                continue;
            }
            if vm.shutdown.load(Ordering::Acquire) && vm.in_flight.load(Ordering::Acquire) == 0 {
                return;
            }
            if vm.is_dead() {
                // A thread the VM needs is missing: what is in flight can never finish.
                return;
            }
            vm.sched_notify.wait(vm.config.spin, || {
                !vm.completions.is_empty()
                    || !vm.inbox.is_empty()
                    || vm.shutdown.load(Ordering::Acquire)
                    || vm.is_dead()
            });
        }
    }

    /// Hand this loop's outgoing batches to the workers and settle the in-flight count.
    fn flush(&mut self) {
        for (i, out) in self.outgoing.iter_mut().enumerate() {
            if !out.is_empty() {
                let batch = std::mem::replace(out, self.vm.take_batch());
                self.vm.ctxs[i].push(batch);
            }
        }
        if self.retired_this_loop > 0 {
            self.vm.retired(self.retired_this_loop);
            self.retired_this_loop = 0;
        }
    }

    fn alloc_slot(&mut self) -> u32 {
        match self.free.pop() {
            Some(s) => s,
            None => {
                self.nodes.push(Node::empty());
                self.parked.push(None);
                self.extras.push(Extra::default());
                (self.nodes.len() - 1) as u32
            }
        }
    }

    /// Receive one batch from the inbox, in program order.
    ///
    /// Admission (slot, dependence rules, dispatch decision) works on the instructions in
    /// place. When every instruction of the batch is ready at once and all go to one worker
    /// (a stream that keeps up with its caller), the batch itself is handed to that worker
    /// without moving a single instruction. Otherwise the ready ones move to their
    /// workers' outgoing batches and the others park in their nodes.
    ///
    /// Admitting an instruction never releases another one: edges run from earlier to later
    /// instructions, and a just-admitted instruction has no successor yet. So the order in
    /// which this function hands instructions over is program order per stream.
    fn receive_batch(&mut self, mut batch: Vec<Instruction>) {
        let queued = self.prof.as_ref().map_or(0, Recorder::now);
        let mut single: Option<usize> = None;
        let mut pass = true;
        for ins in batch.iter_mut() {
            match self.admit(ins) {
                Admit::Ready(ctx) => pass &= *single.get_or_insert(ctx) == ctx,
                Admit::Waiting | Admit::Consumed => pass = false,
            }
        }
        debug_assert!(self.ready.is_empty(), "admission released an instruction");
        if let Some(r) = &mut self.prof {
            let nodes = &self.nodes;
            let ready = |slot: u32, gen: u32| {
                let n = &nodes[slot as usize];
                n.gen == gen && n.state >= State::Dispatched
            };
            r.admitted(&batch, queued, r.now(), ready);
        }
        if let (true, Some(ctx)) = (pass, single) {
            // Keep order with what this loop already dispatched to the same worker.
            if !self.outgoing[ctx].is_empty() {
                let earlier = std::mem::replace(&mut self.outgoing[ctx], self.vm.take_batch());
                self.vm.ctxs[ctx].push(earlier);
            }
            self.vm.ctxs[ctx].push(batch);
            return;
        }
        for ins in batch.drain(..) {
            if let InstrKind::Barrier { .. } = ins.kind {
                continue; // consumed at admission
            }
            let slot = ins.slot as usize;
            if self.nodes[slot].state >= State::Dispatched {
                let ctx = self.vm.streams[ins.stream.index()].ctx;
                self.outgoing[ctx].push(ins);
            } else {
                self.parked[slot] = Some(ins);
            }
        }
        self.vm.recycle(batch);
    }

    /// Admit one instruction: number it, give it a slot, apply the dependence rules, and
    /// mark it dispatched if nothing holds it back. The caller moves it where it belongs.
    fn admit(&mut self, ins: &mut Instruction) -> Admit {
        self.program += 1;
        ins.program = self.program;
        if let InstrKind::Barrier { callback } = &mut ins.kind {
            let callback = std::mem::replace(callback, Box::new(|| {}));
            if let Some(r) = &mut self.prof {
                r.push(Rec::Barrier { program: ins.program, t: r.now() });
            }
            // Nothing in flight: the barrier can run now; else it closes the current epoch.
            let cur = self.epochs.back_mut().expect("there is always a current epoch");
            cur.callbacks.push(callback);
            self.epochs.push_back(Epoch { live: 0, callbacks: Vec::new() });
            self.end_epochs();
            // A barrier is not an instruction in flight: settle the count the caller added.
            self.retired_this_loop += 1;
            return Admit::Consumed;
        }
        let slot = self.alloc_slot();
        let stream = ins.stream.0;
        let st = &mut self.streams[stream as usize];
        st.next_seq += 1;
        let seq = st.next_seq;
        let prev_tail = st.tail;
        let node = &mut self.nodes[slot as usize];
        node.state = State::Waiting;
        node.stream = stream;
        node.pending = 0;
        node.seq = seq;
        node.epoch = self.epoch_base + self.epochs.len() as u64 - 1;
        debug_assert!(node.out.is_empty() && !node.extra);
        let me = InstrRef { slot, gen: node.gen };
        ins.slot = slot;
        ins.gen = node.gen;
        self.epochs.back_mut().expect("current epoch").live += 1;
        self.streams[stream as usize].tail = Some(me);
        self.streams[stream as usize].fifo.push_back(slot);

        // Keep dispatch in program order on the stream.
        if let Some(prev) = prev_tail {
            self.connect_same_stream(prev, slot);
        }
        match &ins.kind {
            InstrKind::RecordEvent { id } => {
                self.nodes[slot as usize].extra = true;
                self.extras[slot as usize].record_id = *id;
                self.events.insert(*id, me);
            }
            InstrKind::StreamWaitEvent { id, .. } => {
                if let Some(&rec) = self.events.get(id) {
                    if self.is_live(rec) {
                        self.connect_on(rec, slot, State::Launched);
                        let src = self.nodes[rec.slot as usize].stream as usize;
                        let rseq = self.nodes[rec.slot as usize].seq;
                        let c = &mut self.covers[stream as usize * self.streams.len() + src];
                        if rseq > c.seq {
                            *c = Cover { seq: rseq, via: Some(me) };
                        }
                    }
                }
            }
            _ => {}
        }
        for op in &ins.operands {
            // SAFETY: only the scheduler thread (this one) touches dependence objects, and
            // no other reference to this one is held across this call.
            let dep = unsafe { op.tensor().dep_mut() };
            match op.mode() {
                AccessMode::Read => dep.read(me, self),
                AccessMode::Write => dep.write(me, self),
            }
        }
        if self.nodes[slot as usize].pending == 0 {
            Admit::Ready(self.mark_dispatched(slot, ins))
        } else {
            Admit::Waiting
        }
    }

    /// Add an edge `src → dst` released when `src` reaches `on` (unless it already has);
    /// returns whether an edge was added.
    fn connect_on(&mut self, src: InstrRef, dst: u32, on: State) -> bool {
        let n = &mut self.nodes[src.slot as usize];
        if n.gen != src.gen || n.state >= on || src.slot == dst {
            return false;
        }
        n.out.push(Edge { to: dst, on });
        self.nodes[dst as usize].pending += 1;
        true
    }

    fn connect_same_stream(&mut self, src: InstrRef, dst: u32) {
        self.connect_on(src, dst, State::Dispatched);
    }

    /// Dispatch a parked instruction that became ready.
    fn dispatch(&mut self, slot: u32, mut ins: Instruction) {
        if let Some(r) = &mut self.prof {
            r.push(Rec::Dispatch { program: ins.program, t: r.now() });
        }
        let ctx = self.mark_dispatched(slot, &mut ins);
        self.outgoing[ctx].push(ins);
    }

    /// Mark `slot` dispatched and release what that satisfies; returns the worker that
    /// must get the instruction (the caller hands it over, in order).
    fn mark_dispatched(&mut self, slot: u32, ins: &mut Instruction) -> usize {
        let node = &mut self.nodes[slot as usize];
        node.state = State::Dispatched;
        if let InstrKind::StreamWaitEvent { id, event } = &mut ins.kind {
            if let Some(&rec) = self.events.get(id) {
                let r = &self.nodes[rec.slot as usize];
                if r.gen == rec.gen && r.state < State::Done && r.extra {
                    *event = self.extras[rec.slot as usize].event.clone();
                }
            }
        }
        self.advance(slot, State::Dispatched);
        self.vm.streams[ins.stream.index()].ctx
    }

    /// Move `slot` to `state` and release the edges that state satisfies.
    fn advance(&mut self, slot: u32, state: State) {
        let node = &mut self.nodes[slot as usize];
        if node.state < state {
            node.state = state;
        }
        let state = node.state;
        if node.out.is_empty() {
            return;
        }
        let mut released: SmallVec<[u32; 8]> = SmallVec::new();
        node.out.retain(|e| {
            if e.on <= state {
                released.push(e.to);
                false
            } else {
                true
            }
        });
        for to in released {
            let t = &mut self.nodes[to as usize];
            t.pending -= 1;
            if t.pending == 0 {
                self.ready.push(to);
            }
        }
    }

    fn drain_ready(&mut self) {
        while let Some(slot) = self.ready.pop() {
            let ins = self.parked[slot as usize].take().expect("ready node has its body");
            self.dispatch(slot, ins);
        }
    }

    fn complete(&mut self, c: Completion) {
        let node = &mut self.nodes[c.slot as usize];
        if node.gen != c.gen || node.state == State::Free {
            return;
        }
        if c.event.is_some() {
            node.extra = true;
            self.extras[c.slot as usize].event = c.event;
        }
        let stream = node.stream;
        match c.report {
            Report::Launched => self.advance(c.slot, State::Launched),
            Report::Done => {
                self.advance(c.slot, State::Done);
                self.retire_front(stream);
            }
            Report::DoneThrough => {
                while let Some(&front) = self.streams[stream as usize].fifo.front() {
                    self.advance(front, State::Done);
                    if front == c.slot {
                        break;
                    }
                    // Each retire frees its slot; the reported slot is still live behind it.
                    self.streams[stream as usize].fifo.pop_front();
                    self.retire(front);
                }
                self.retire_front(stream);
            }
        }
        self.drain_ready();
    }

    /// Retire the done instructions at the front of `stream`'s FIFO.
    fn retire_front(&mut self, stream: u32) {
        while let Some(&slot) = self.streams[stream as usize].fifo.front() {
            if self.nodes[slot as usize].state != State::Done {
                break;
            }
            self.streams[stream as usize].fifo.pop_front();
            self.retire(slot);
        }
        self.end_epochs();
    }

    fn retire(&mut self, slot: u32) {
        let node = &mut self.nodes[slot as usize];
        debug_assert!(node.out.is_empty() && node.pending == 0);
        node.state = State::Free;
        node.gen = node.gen.wrapping_add(1);
        if std::mem::take(&mut node.extra) {
            let x = std::mem::take(&mut self.extras[slot as usize]);
            if let Some(ev) = x.event {
                self.vm.streams[node.stream as usize].events.give(ev);
            }
            if x.record_id != 0 {
                self.events.remove(&x.record_id);
            }
        }
        let e = (node.epoch - self.epoch_base) as usize;
        self.epochs[e].live -= 1;
        self.free.push(slot);
        self.retired_this_loop += 1;
    }

    /// Run the callbacks of barriers whose earlier epochs have drained.
    fn end_epochs(&mut self) {
        while self.epochs.len() > 1 && self.epochs[0].live == 0 {
            let e = self.epochs.pop_front().expect("len > 1");
            self.epoch_base += 1;
            // Hand the loop's records in first: whoever waits on the barrier (a sync, the
            // end of a profiling session) finds them there. The rest of the loop records
            // afresh if a session is open (one may just have been started).
            if let Some(r) = self.prof.take() {
                r.finish(&self.vm.profiler);
            }
            self.prof = self.vm.profiler.begin(ThreadRole::Scheduler);
            for cb in e.callbacks {
                cb();
            }
        }
    }
}

impl Drop for Scheduler {
    /// A scheduler that stops with instructions still parked or undispatched (the VM died,
    /// or it panicked) hands them to the VM to keep until every thread has exited: a
    /// worker may still be running an instruction on a tensor one of them owns.
    fn drop(&mut self) {
        let mut left: Vec<Instruction> = self.parked.iter_mut().filter_map(Option::take).collect();
        for out in &mut self.outgoing {
            left.append(out);
        }
        self.vm.bury(left);
    }
}

impl EdgeSink for Scheduler {
    #[inline]
    fn connect(&mut self, src: InstrRef, dst: u32) {
        let n = &self.nodes[src.slot as usize];
        if n.gen != src.gen {
            return; // retired
        }
        let (ss, ds) = (n.stream, self.nodes[dst as usize].stream);
        if ss == ds {
            // Implied by the stream's program-order chain.
            return;
        }
        let cover = self.covers[ds as usize * self.streams.len() + ss as usize];
        if cover.seq >= n.seq {
            if let Some(via) = cover.via {
                // `via` is on the target's stream and earlier: the chain orders it.
                debug_assert!({
                    let v = &self.nodes[via.slot as usize];
                    v.gen != via.gen || v.stream == ds
                });
                return;
            }
        }
        if self.connect_on(src, dst, State::Done) {
            if let Some(r) = &mut self.prof {
                let dst_gen = self.nodes[dst as usize].gen;
                r.push(Rec::Edge { src: (src.slot, src.gen), dst: (dst, dst_gen) });
            }
        }
    }

    #[inline]
    fn is_live(&self, r: InstrRef) -> bool {
        let n = &self.nodes[r.slot as usize];
        n.gen == r.gen && n.state != State::Free
    }
}

#[cfg(test)]
mod node_size {
    #[test]
    fn a_node_is_one_cache_line() {
        assert_eq!(std::mem::size_of::<super::Node>(), 64);
    }
}
