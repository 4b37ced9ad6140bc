//! The timeline observer: the session state a VM's threads share, and their per-thread
//! record buffers. the profiler (`profile`, a layer above) turns a session's records
//! into a timeline.
//!
//! # Cost when off
//!
//! Each VM thread asks [`Timeline::begin`] once per batch (the scheduler once per loop, a
//! worker once per batch it pops, a watcher once per event it watches). That is one
//! relaxed load of the session word and one branch; nothing is allocated, locked or read
//! from the clock while no session is open.
//!
//! # Cost when on
//!
//! A thread that got a [`Recorder`] appends plain records to a `Vec` it owns (no lock per
//! instruction) and hands the whole `Vec` to the shared sink, a lock-free queue, once per
//! batch, *before* it reports the batch's completions to the scheduler. So once
//! `VirtualMachine::stop_profiling` (through `Engine::timeline`) has seen everything submitted before it retire, every
//! record about those instructions is in the sink. Timestamps are nanoseconds since the
//! VM started, read from one monotonic clock (`Instant`).
//!
//! # Sessions
//!
//! The session word holds 0 (off) or the number of the open session. Each chunk carries
//! the session that was open when its thread began the batch, so a chunk finished after a
//! session was stopped is never mixed into the next one.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use crossbeam_queue::SegQueue;
use smallvec::SmallVec;

use crate::alloc::HostAllocator;

use super::ThreadRole;
use crate::vm::dependence::InstrRef;
use crate::vm::instruction::{Body, Operand};
use crate::vm::StreamId;

/// Nanoseconds since the VM started.
pub(crate) type Nanos = u64;

/// Counters are sampled at most this often (nanoseconds), from the scheduler loop.
const SAMPLE_EVERY: Nanos = 50_000;

/// How an instruction takes part in a cross-stream event wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Link {
    None,
    /// A `RecordEvent` of this event id.
    Record(u64),
    /// A `StreamWaitEvent` waiting on this event id.
    Wait(u64),
}

/// One record. Instructions are named by program number; dependence edges by the
/// scheduler's stream positions, which the admission records map to programs.
#[derive(Debug)]
pub(crate) enum Rec {
    /// The scheduler received the instruction (`queued`) and, if it was ready at once,
    /// dispatched it (`dispatched`).
    Admit {
        program: u64,
        at: InstrRef,
        stream: u32,
        name: &'static str,
        link: Link,
        tensors: SmallVec<[u64; 4]>,
        /// The owner of each operand's storage (a view's owner, an owner's own id), or
        /// empty when no operand is a view (each is then its own storage).
        storages: SmallVec<[u64; 4]>,
        queued: Nanos,
        dispatched: Option<Nanos>,
    },
    /// A barrier was received (it runs on the scheduler, not on a stream).
    Barrier { program: u64, t: Nanos },
    /// A parked instruction was dispatched.
    Dispatch { program: u64, t: Nanos },
    /// A synchronous stream ran the instruction on its worker from `start` to `end`.
    Exec { program: u64, start: Nanos, end: Nanos },
    /// An asynchronous stream's worker launched the instruction at `launched`; its watcher
    /// saw it done at `done`.
    Async { program: u64, launched: Nanos, done: Nanos },
    /// A done-edge between two streams: `src` must finish before `dst` is dispatched.
    Edge { src: InstrRef, dst: InstrRef },
    /// What the recording thread was doing from `start` to `end` (`count` items).
    Slice { name: &'static str, start: Nanos, end: Nanos, count: u32 },
    /// Instructions in flight.
    InFlight { t: Nanos, value: u64 },
    /// Bytes in use in allocator number `index`.
    Alloc { t: Nanos, index: u32, bytes: u64 },
}

/// The records one thread made during one batch.
#[derive(Debug)]
pub(crate) struct Chunk {
    pub(crate) session: u32,
    pub(crate) thread: ThreadRole,
    pub(crate) recs: Vec<Rec>,
}

/// The profiler state shared by a VM's threads.
#[derive(Debug)]
pub(crate) struct Timeline {
    origin: Instant,
    /// 0: off; otherwise the open session's number.
    session: AtomicU32,
    next_session: AtomicU32,
    sink: SegQueue<Chunk>,
    /// The allocators the counters sample, with their names (one per device).
    allocators: Vec<(String, Arc<HostAllocator>)>,
    /// When the counters were last sampled (scheduler thread only).
    last_sample: AtomicU64,
}

impl Timeline {
    /// A profiler for a VM whose devices use `allocators`; `on` opens session 1 at once.
    pub(crate) fn new(on: bool, allocators: Vec<(String, Arc<HostAllocator>)>) -> Self {
        Timeline {
            origin: Instant::now(),
            session: AtomicU32::new(u32::from(on)),
            next_session: AtomicU32::new(2),
            sink: SegQueue::new(),
            allocators,
            last_sample: AtomicU64::new(0),
        }
    }

    /// A recorder for one batch of `thread`, or `None` when no session is open.
    #[inline]
    pub(crate) fn begin(&self, thread: ThreadRole) -> Option<Recorder> {
        let session = self.session.load(Ordering::Relaxed);
        if session == 0 {
            return None;
        }
        Some(Recorder { origin: self.origin, session, thread, recs: Vec::new() })
    }

    /// Nanoseconds since the VM started.
    pub(crate) fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// Whether a session is open.
    pub(crate) fn is_on(&self) -> bool {
        self.session.load(Ordering::Relaxed) != 0
    }

    /// Open a new session (closing any open one); returns its number.
    pub(crate) fn start(&self) -> u32 {
        let s = self.next_session.fetch_add(1, Ordering::Relaxed);
        self.session.store(s, Ordering::Relaxed);
        // Chunks of earlier sessions are of no further use.
        while self.sink.pop().is_some() {}
        s
    }

    /// Close the open session; returns its number (None if none was open).
    pub(crate) fn stop(&self) -> Option<u32> {
        match self.session.swap(0, Ordering::Relaxed) {
            0 => None,
            s => Some(s),
        }
    }

    /// Every chunk of `session` handed in so far (others are dropped).
    pub(crate) fn drain(&self, session: u32) -> Vec<Chunk> {
        let mut out = Vec::new();
        while let Some(c) = self.sink.pop() {
            if c.session == session {
                out.push(c);
            }
        }
        out
    }

    /// Chunks handed in and not yet drained.
    #[cfg(test)]
    pub(crate) fn pending(&self) -> usize {
        self.sink.len()
    }

    /// The names of the sampled allocators, by counter index.
    pub(crate) fn allocator_names(&self) -> Vec<String> {
        self.allocators.iter().map(|(n, _)| n.clone()).collect()
    }
}

/// One thread's records for one batch. Hand them in with [`Recorder::finish`].
#[derive(Debug)]
pub(crate) struct Recorder {
    origin: Instant,
    session: u32,
    thread: ThreadRole,
    recs: Vec<Rec>,
}

impl Recorder {
    /// Nanoseconds since the VM started.
    #[inline]
    pub(crate) fn now(&self) -> Nanos {
        self.origin.elapsed().as_nanos() as Nanos
    }

    /// Append a record.
    #[inline]
    pub(crate) fn push(&mut self, r: Rec) {
        self.recs.push(r);
    }

    /// A slice on this thread's track from `start` to now.
    pub(crate) fn slice(&mut self, name: &'static str, start: Nanos, count: usize) {
        let end = self.now();
        self.recs.push(Rec::Slice { name, start, end, count: count as u32 });
    }

    /// The scheduler received an instruction (`body` on `stream`, with `ops`; program number
    /// `program`, stream position `at`) at `queued`, and dispatched it at `dispatched` if it
    /// was ready at once.
    #[allow(clippy::too_many_arguments)]
    pub(in crate::vm) fn admitted(
        &mut self,
        body: &Body,
        stream: StreamId,
        ops: &[Operand],
        program: u64,
        at: InstrRef,
        queued: Nanos,
        dispatched: Option<Nanos>,
    ) {
        let link = match body {
            Body::RecordEvent { id } => Link::Record(*id),
            Body::StreamWaitEvent { id } => Link::Wait(*id),
            _ => Link::None,
        };
        let (mut tensors, mut storages) = (SmallVec::new(), SmallVec::<[u64; 4]>::new());
        for o in ops {
            // SAFETY: the instruction is being admitted, so its operands' tensors are alive.
            let t = unsafe { o.tensor() };
            tensors.push(t.id);
            storages.push(t.owner().id);
        }
        // Kept only where some operand is a view (the record's docs).
        if tensors == storages {
            storages.clear();
        }
        self.recs.push(Rec::Admit {
            program,
            at,
            stream: stream.0,
            name: body.name(),
            link,
            tensors,
            storages,
            queued,
            dispatched,
        });
    }

    /// Sample the counters if the last sample is old enough, or if `force`.
    pub(crate) fn sample(&mut self, prof: &Timeline, in_flight: usize, force: bool) {
        let t = self.now();
        if !force && t.saturating_sub(prof.last_sample.load(Ordering::Relaxed)) < SAMPLE_EVERY {
            return;
        }
        prof.last_sample.store(t, Ordering::Relaxed);
        self.recs.push(Rec::InFlight { t, value: in_flight as u64 });
        for (i, (_, a)) in prof.allocators.iter().enumerate() {
            self.recs.push(Rec::Alloc { t, index: i as u32, bytes: a.in_use_bytes() as u64 });
        }
    }

    /// Hand the records to the profiler.
    pub(crate) fn finish(self, prof: &Timeline) {
        if !self.recs.is_empty() {
            prof.sink.push(Chunk { session: self.session, thread: self.thread, recs: self.recs });
        }
    }
}
