//! The engine, assembled from its parts: start-up, the handle that shuts it down, and what
//! the front end asks of it.
//!
//! The engine knows nothing above it. The front end (`framework`) starts one with
//! [`Engine::start`], handing it an opaque value of its own to keep ([`Engine::front`]), and
//! submits [`Batch`]es of instructions; observers attach through [`observe`](super::observe).
//!
//! # Parts
//!
//! | part | file | protocol, and which thread owns which end |
//! | --- | --- | --- |
//! | the stream table | `streams.rs` | fixed at start-up, read by every thread |
//! | the inbox | `inbox.rs` | callers submit, the scheduler receives and numbers, a waiter may claim it; back-pressure and the inline claim share its in-flight word (`vm/back_pressure.rs`) |
//! | submission | `submit.rs` | the caller's paths into the inbox, synchronous mode, and the hand-off of a waiter that runs its own work |
//! | the completion channel | `completions.rs` | workers and watchers report, the scheduler drains |
//! | the worker queues | `worker_queue.rs` | the scheduler pushes, each worker (and each watcher) serves its own |
//! | the scheduler's loop | `scheduler_loop.rs` | the order in which the scheduler thread takes reports and batches, sleeps and stops |
//! | the parts together | `parts.rs` | what the engine's threads hold |
//! | the engine's name | `identity.rs` | what a tensor names its engine by |
//!
//! [`Engine::start`] is their assembly: it opens the stream table, makes the scheduler's
//! bell and the channels that ring it, the flight recorder and the timeline, puts them
//! together ([`Parts`]), and starts the threads: one scheduler, which starts one
//! `ThreadCtx` worker per stream (or per device, or one in all: [`ThreadTopology`]), each
//! event-recorded stream's worker starting a watcher; and the watchdog, when one is asked
//! for. In synchronous mode none are started and the caller runs every instruction itself,
//! under its stream's policy (`stream_policy::run_inline`).
//!
//! The engine's threads hold the parts ([`Parts`], counted), not the engine: the engine is
//! what the front end and the process's table of engines hold, and it leaves the table
//! when its last handle goes, after every thread it started has exited.
//!
//! # Shutdown protocol
//!
//! 1. Dropping the [`EngineHandle`] closes the inbox (`Inbox::close`), which rings the
//!    scheduler.
//! 2. The scheduler keeps receiving and completing until nothing is in flight (everything
//!    submitted before the drop runs to completion: drain, not cancel), then stops each
//!    worker (`WorkerQueue::stop`) and joins it; each worker stops and joins its watchers.
//!    It waits until every device stream has run what was launched on it, and its end of
//!    the inbox leaves (`Inbox::leave`): a batch submitted after that is buried.
//! 3. The drop joins the scheduler, then the watchdog. Every thread the engine started has
//!    exited when it returns.
//!
//! If the scheduler thread ever panics (a bug in eagervm, not in a kernel: kernel panics
//! are caught where they run), or a thread the engine needs cannot start, the inbox is
//! killed (`Inbox::kill`): waiters are woken and their waits return [`Error::ShutDown`],
//! and what will never run is buried, answering its waiters, instead of hanging.
//!
//! # Memory ordering
//!
//! Each part's file has its own section: the inbox (submission, the claim, the program
//! counter, closing and death), the completion channel, the worker queues, back-pressure.
//! The handle's drop closes the inbox after everything its owner submitted is in it.
//!
//! # Tracing
//!
//! The engine opens `tracing` spans (`docs/profiling.md`, "Logging with `RUST_LOG`"):
//! `start` (and a `VM started` event), `back_pressure`, `stop_workers` and `shutdown` at
//! DEBUG here; `batch` at TRACE in each worker and `barrier` at DEBUG on the scheduler. A
//! span is made once per wait or per batch, never per instruction: with no subscriber, or
//! one that filters it out, a span costs a check of its callsite's cached interest (an
//! atomic load and a branch), and its fields are not evaluated.

mod completions;
mod identity;
mod inbox;
mod parts;
mod scheduler_loop;
mod streams;
mod submit;
mod worker_queue;

use std::any::Any;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crate::ep::{DeviceId, StreamType};
use crate::sync::notify::Notifier;
use crate::sync::{AtomicU64, Ordering};

use super::config::Config;
use super::error::{Error, Result};
use super::flight::Flight;
use super::instruction::{AccessSlot, Batch, Body, Instruction, SlotSender};
use super::instruction_policy::FailureLog;
use super::observe::{SubmitObserver, ThreadRole, Timeline};
use super::scheduler::Scheduler;
use super::stream::StreamId;
use super::tensor::{MetaId, TensorMeta};
use super::thread_ctx;
use super::watchdog::{self, Watchdog};

pub(crate) use completions::Completions;
pub(crate) use identity::EngineRef;
pub(crate) use inbox::SchedulerEnd;
pub(crate) use parts::{CommEntry, Parts};
pub(crate) use scheduler_loop::Dispatch;
pub(crate) use streams::{StreamTable, VmStream};
pub(crate) use submit::{Handoff, PartsHold};
pub(crate) use worker_queue::WorkerQueue;

/// An engine: its parts, and what only the front end uses (meta numbers, id counters, the
/// front end's own state).
pub(crate) struct Engine {
    /// This engine's name in the process's table of engines ([`EngineRef`]): what every
    /// tensor it makes names it by (`TensorInner::belongs_to`).
    me: EngineRef,
    /// The parts its threads share.
    parts: Arc<Parts>,
    /// The number of each distinct tensor meta seen (`intern`).
    metas: super::intern::Metas,
    next_tensor: AtomicU64,
    next_event: AtomicU64,
    /// What the layer above keeps with the engine (the front end's per-VM state). The engine
    /// never looks inside; it keeps it alive as long as itself, so that a tensor, which
    /// knows only its engine, reaches it.
    front: Box<dyn Any + Send + Sync>,
}

/// The engines made in this process and not yet dropped, with their [`EngineRef`]s.
static ENGINES: parking_lot::Mutex<Vec<(EngineRef, Weak<Engine>)>> = parking_lot::const_mutex(Vec::new());

impl EngineRef {
    /// The engine, if it is still alive: a lock and a short scan, for the paths that are
    /// not per call (a tensor's read, its release outside a builder, a VM gone).
    pub(crate) fn upgrade(self) -> Option<Arc<Engine>> {
        let engines = ENGINES.lock();
        engines.iter().find(|(r, _)| *r == self).and_then(|(_, e)| e.upgrade())
    }
}

impl Drop for Engine {
    /// Leave the table: no tensor can reach this engine any more.
    fn drop(&mut self) {
        let mut engines = ENGINES.lock();
        if let Some(i) = engines.iter().position(|(r, _)| *r == self.me) {
            engines.swap_remove(i);
        }
    }
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("streams", &&*self.parts.streams).finish_non_exhaustive()
    }
}

/// Owns a running engine: dropping it shuts the engine down (the module docs' shutdown
/// protocol) and joins every thread it started.
#[derive(Debug)]
pub(crate) struct EngineHandle {
    engine: Arc<Engine>,
    scheduler: Option<JoinHandle<()>>,
    /// The watchdog, when `Config::watchdog_timeout` is set (`vm::watchdog`).
    watchdog: Option<Watchdog>,
}

impl EngineHandle {
    /// The engine.
    #[inline]
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.engine
    }
}

impl Drop for EngineHandle {
    fn drop(&mut self) {
        let _span = tracing::debug_span!("shutdown", in_flight = self.engine.in_flight()).entered();
        self.engine.parts.inbox.close();
        if let Some(h) = self.scheduler.take() {
            let _ = h.join();
        }
        // After the scheduler: while it drains, the watchdog may still abort a hung
        // collective that would keep it from finishing.
        if let Some(mut w) = self.watchdog.take() {
            w.stop();
        }
        tracing::debug!("VM shut down: every thread it started has exited");
    }
}

impl Engine {
    /// Start an engine: assemble its parts and start its threads (module docs). `front` is
    /// kept for the layer above ([`front`](Self::front)).
    pub(crate) fn start(config: Config, front: Box<dyn Any + Send + Sync>) -> Result<EngineHandle> {
        let _span = tracing::debug_span!("start").entered();
        config.validate()?;
        // Kernel panics that the workers catch become errors, not lines on standard error.
        super::panic_hook::install();
        let failures = Arc::new(FailureLog::default());
        let streams = StreamTable::open(&config, &failures)?;
        let bell = Arc::new(Notifier::new());
        let (inbox, end) = inbox::Inbox::new(config.high_water, config.low_water, bell.clone());
        let completions = Completions::new(config.batch_size, bell);
        let flight = Flight::new(
            if config.synchronous { 0 } else { config.flight_records },
            // Every stream's watermarks; the slots of the collective streams only, unless
            // asked for on every stream (their cost per instruction: docs/tuning.md).
            streams
                .iter()
                .map(|s| (s.name.clone(), config.flight_all_streams || s.ty == StreamType::Collective)),
        );
        let timeline = Timeline::new(config.profile, streams.allocators());
        let parts = Arc::new(Parts::new(config, streams, inbox, completions, failures, flight, timeline));
        let engine = Arc::new_cyclic(|me: &Weak<Engine>| {
            let r = EngineRef::fresh();
            ENGINES.lock().push((r, me.clone()));
            Engine {
                me: r,
                parts: parts.clone(),
                metas: Default::default(),
                next_tensor: AtomicU64::new(0),
                next_event: AtomicU64::new(1),
                front,
            }
        });
        let config = &parts.config;
        tracing::debug!(
            streams = %parts.streams.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
            workers = if config.synchronous { 0 } else { parts.workers.len() },
            topology = ?config.threads,
            synchronous = config.synchronous,
            "VM started"
        );
        let scheduler = if config.synchronous {
            None
        } else {
            let p = parts.clone();
            Some(
                std::thread::Builder::new()
                    .name("eagervm-scheduler".into())
                    .spawn(move || scheduler_main(p, end))
                    .map_err(|e| Error::Config(format!("cannot start the scheduler thread: {e}")))?,
            )
        };
        let watchdog = match config.watchdog_timeout {
            Some(timeout) if !config.synchronous => Some(
                Watchdog::start(&parts, timeout)
                    .map_err(|e| Error::Config(format!("cannot start the watchdog thread: {e}")))?,
            ),
            _ => None,
        };
        Ok(EngineHandle { engine, scheduler, watchdog })
    }

    /// The engine's identity, which every tensor it made names (`TensorInner::belongs_to`).
    #[inline]
    pub(crate) fn identity(&self) -> EngineRef {
        self.me
    }

    /// What the layer above keeps with the engine ([`start`](Self::start)'s `front`).
    #[inline]
    pub(crate) fn front(&self) -> &(dyn Any + Send + Sync) {
        &*self.front
    }

    /// The configuration the engine runs with.
    #[inline]
    pub(crate) fn config(&self) -> &Config {
        &self.parts.config
    }

    /// The stream table.
    #[inline]
    pub(crate) fn streams(&self) -> &[VmStream] {
        &self.parts.streams
    }

    /// Stream `s`, or [`Error::Config`] if the engine has none such.
    pub(crate) fn stream(&self, s: StreamId) -> Result<&VmStream> {
        self.parts.streams.stream(s)
    }

    /// The stream of type `ty` on `device` (`cpu:0` has one stream for compute and copies,
    /// and a collective stream).
    pub(crate) fn stream_of(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        self.parts.streams.stream_of(device, ty)
    }

    /// The host stream, where host accesses and barriers go.
    #[inline]
    pub(crate) fn host_stream(&self) -> StreamId {
        self.parts.streams.host()
    }

    /// Whether `device` is one of the engine's devices.
    pub(crate) fn check_device(&self, device: DeviceId) -> Result<()> {
        self.parts.streams.check_device(device)
    }

    /// Note a communicator made on this engine, so that the watchdog can abort it. Fails
    /// with [`Error::Collective`] if the name is taken.
    /// `issued` says how many collectives of it have been issued so far.
    pub(crate) fn add_communicator(
        &self,
        name: Arc<str>,
        backend: Arc<dyn crate::ep::ccl::Backend>,
        issued: Arc<dyn Fn() -> u64 + Send + Sync>,
    ) -> Result<()> {
        self.parts.add_communicator(CommEntry { name, backend, issued })
    }

    /// A snapshot of the flight recorder (`vm::flight`), taken for `reason`.
    pub(crate) fn flight_record(&self, reason: &str) -> super::flight::FlightRecord {
        let comms = watchdog::communicator_records(&self.parts);
        self.parts.flight.snapshot(reason.to_string(), self.parts.config.watchdog_timeout, &[], comms)
    }

    /// This engine's number for `meta`: equal metas get equal numbers, so the front end
    /// compares call signatures by number ([`MetaId::NONE`] once the table is full). Without
    /// a lock for a meta this thread asked for before (`vm::intern`).
    #[inline]
    pub(crate) fn intern(&self, meta: &TensorMeta) -> MetaId {
        self.metas.intern(meta)
    }

    /// A new tensor id, unique within this engine.
    #[inline]
    pub(crate) fn next_tensor_id(&self) -> u64 {
        self.next_tensor.fetch_add(1, Ordering::Relaxed)
    }

    /// `n` new tensor ids, unique within this engine, for a builder to hand out one by one
    /// without an atomic instruction per tensor.
    #[inline]
    pub(crate) fn reserve_tensor_ids(&self, n: u64) -> std::ops::Range<u64> {
        let start = self.next_tensor.fetch_add(n, Ordering::Relaxed);
        start..start + n
    }

    /// A new event id, unique within this engine (`RecordEvent`/`StreamWaitEvent` pairs).
    pub(crate) fn next_event_id(&self) -> u64 {
        self.next_event.fetch_add(1, Ordering::Relaxed)
    }

    /// An empty batch (pooled: workers hand back the batches they have run and emptied).
    #[inline]
    pub(crate) fn take_batch(&self) -> Batch {
        self.parts.take_batch()
    }

    /// Give an emptied batch back to the pool.
    #[inline]
    pub(crate) fn recycle(&self, batch: Batch) {
        self.parts.recycle(batch);
    }

    /// The kernel panics caught over the engine's life: their count, and the errors of the
    /// first few (`instruction_policy::KEPT_PANICS`).
    pub(crate) fn caught_panics(&self) -> (u64, Vec<Error>) {
        self.parts.failures.panics()
    }

    /// Take the failures recorded since the last call: their count and the first, as
    /// [`Error::Failed`].
    pub(crate) fn take_failures(&self) -> Option<Error> {
        self.parts.failures.take()
    }

    /// Hand a batch to the scheduler (or run it, in synchronous mode); block while too
    /// much is in flight (`engine/submit.rs`).
    #[inline]
    pub(crate) fn submit(&self, batch: Batch) {
        submit::submit(&self.parts, batch);
    }

    /// Hand a batch over without waiting for back-pressure: for `Release`s; on an idle
    /// engine they run on this thread (`engine/submit.rs`).
    pub(crate) fn submit_unbounded(&self, batch: Batch) {
        submit::submit_unbounded(&self.parts, batch);
    }

    /// Submit a batch whose results the caller waits for next (it ends with a host access
    /// or a barrier), and run it on the caller's thread if the engine is idle: see
    /// [`Handoff`]. Otherwise the same as [`submit`](Self::submit).
    pub(crate) fn submit_for_wait(&self, batch: Batch) -> Handoff<'_> {
        submit::hand_off(PartsHold::Borrowed(&self.parts), batch, true)
    }

    /// [`submit_for_wait`](Self::submit_for_wait) through a counted handle of the parts,
    /// which the hand-off keeps: for a builder that owns its engine handle.
    pub(crate) fn submit_for_wait_owned(&self, batch: Batch) -> Handoff<'static> {
        submit::hand_off(PartsHold::Owned(self.parts.clone()), batch, true)
    }

    /// Attach (`Some`) or detach (`None`) the submit observer; returns the one detached.
    pub(crate) fn set_submit_observer(
        &self,
        observer: Option<Box<dyn SubmitObserver>>,
    ) -> Option<Box<dyn SubmitObserver>> {
        self.parts.inbox.set_observer(observer)
    }

    /// The timeline observer (`observe::timeline`).
    pub(crate) fn timeline(&self) -> &Timeline {
        &self.parts.timeline
    }

    /// Every thread the timeline may name, with its name.
    pub(crate) fn thread_names(&self) -> Vec<(ThreadRole, String)> {
        let mut threads = vec![(ThreadRole::Scheduler, "eagervm-scheduler".to_string())];
        for i in 0..self.parts.workers.len() {
            threads.push((ThreadRole::Worker(i as u32), format!("eagervm-worker-{i}")));
        }
        for (i, st) in self.parts.streams.iter().enumerate() {
            if st.policy.is_asynchronous() {
                threads.push((ThreadRole::Watcher(i as u32), format!("eagervm-watch-{}", st.name)));
            }
        }
        threads
    }

    /// Instructions submitted and not yet retired.
    pub(crate) fn in_flight(&self) -> usize {
        self.parts.inbox.in_flight()
    }

    /// Whether nothing will run what is submitted now: the engine died, or it was shut
    /// down.
    pub(crate) fn is_dead(&self) -> bool {
        self.parts.inbox.is_dead()
    }

    /// Wait until everything submitted so far has retired, leaving the failure log alone.
    pub(crate) fn barrier_wait(&self) -> Result<()> {
        self.barrier(true)
    }

    /// [`barrier_wait`](Self::barrier_wait) through the scheduler even when the VM is idle:
    /// for the profiler, which relies on the scheduler handing its records in before it
    /// runs a barrier's callback.
    pub(crate) fn barrier_wait_scheduled(&self) -> Result<()> {
        self.barrier(false)
    }

    /// Submit a barrier and wait for it; `may_run_here`: on an idle VM this thread may run
    /// it ([`Handoff`]).
    fn barrier(&self, may_run_here: bool) -> Result<()> {
        let slot = AccessSlot::new();
        let sender = SlotSender::new(slot.clone());
        let barrier = Body::Barrier { callback: Box::new(move || sender.fulfil(Ok(Vec::new()))) };
        let mut b = self.take_batch();
        b.push(Instruction::new(barrier, self.host_stream()), &[]);
        if may_run_here {
            self.submit_for_wait(b).finish();
        } else {
            self.submit(b);
        }
        self.wait_access(&slot).map(|_| ())
    }

    /// Wait for a host access of this engine to be answered: its result, or
    /// [`Error::ShutDown`] if it will never run.
    pub(crate) fn wait_access(&self, slot: &AccessSlot) -> Result<Vec<u8>> {
        slot.wait(self.parts.config.backoff())
    }
}

/// The scheduler thread: start the workers, run the scheduler's loop, then stop and join
/// the workers (the module docs' shutdown protocol).
fn scheduler_main(parts: Arc<Parts>, mut end: SchedulerEnd) {
    let mut workers = Vec::new();
    for i in 0..parts.workers.len() {
        match thread_ctx::spawn_worker(parts.clone(), i) {
            Ok(w) => workers.push(w),
            Err(e) => parts.fail(format!("cannot start worker thread {i}: {e}")),
        }
    }
    if !parts.inbox.died() {
        let mut sched = Scheduler::new(&parts);
        let backoff = parts.config.backoff();
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            scheduler_loop::run(&parts.inbox, &mut end, &parts.completions, backoff, &mut sched)
        }));
        if r.is_err() {
            tracing::error!("the scheduler thread panicked; the VM is dead");
            parts.inbox.kill();
        }
        // What it still holds never runs: buried.
        drop(sched);
    }
    let _span =
        tracing::debug_span!("stop_workers", workers = workers.len(), dead = parts.inbox.died()).entered();
    tracing::debug!(in_flight = parts.inbox.in_flight(), "scheduler drained; stopping workers");
    for w in parts.workers.iter() {
        w.stop();
    }
    for w in workers {
        let _ = w.join();
    }
    // Let every device stream run what was launched on it (nothing is left after a clean
    // shutdown; a dead VM may leave some). Once this thread ends, the VM's last strong
    // reference can go, and from then on a tensor's last handle frees the tensor at once
    // (`tensor::last_reference_dropped`): no device thread may still be running an
    // instruction on it.
    for s in parts.streams.iter() {
        let _ = s.ep.synchronize();
    }
    parts.inbox.leave(end);
}
