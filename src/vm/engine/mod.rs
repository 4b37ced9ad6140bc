//! The engine: the state the scheduler, the workers and the front end share, start-up,
//! submission, back-pressure and shutdown.
//!
//! The engine knows nothing above it. The front end (`framework`) starts one with
//! [`Engine::start`], handing it an opaque value of its own to keep ([`Engine::front`]), and
//! submits [`Batch`]es of instructions; observers attach through [`observe`](super::observe).
//!
//! # Threads
//!
//! `Engine::start` builds the stream table, each stream with the stream policy of its
//! device (`StreamPolicy::for_device`, `vm::stream_policy`), and starts one scheduler thread
//! and one `ThreadCtx` worker per stream (or per device, or one in all: [`ThreadTopology`]);
//! each event-recorded stream's worker starts a watcher. In synchronous mode none are
//! started and the caller runs every instruction itself, under its stream's policy
//! (`stream_policy::run_inline`).
//!
//! # Shutdown protocol
//!
//! 1. Dropping the [`EngineHandle`] sets `shutdown` and notifies the scheduler.
//! 2. The scheduler keeps receiving and completing until nothing is in flight (everything
//!    submitted before the drop runs to completion: drain, not cancel), then stops each
//!    worker (`ThreadCtx::stop`) and joins it; each worker stops and joins its watchers.
//! 3. The drop joins the scheduler. Every thread the engine started has exited when it
//!    returns.
//!
//! If the scheduler thread ever panics (a bug in eagervm, not in a kernel: kernel panics
//! are caught where they run), it marks the engine dead and wakes every waiter, whose waits
//! then return [`Error::ShutDown`] instead of hanging.
//!
//! # Memory ordering
//!
//! - The in-flight count and the back-pressure wait: `BackPressure`
//!   (`vm/back_pressure.rs`), whose module docs give each access's ordering and why no
//!   wake-up is lost.
//! - `shutdown`: stored with `Release` by the handle's drop, after everything its owner
//!   submitted is in the inbox; loaded with `Acquire` by the scheduler, which then still
//!   drains the inbox before it stops.
//! - `dead`: stored `SeqCst`, then notified through the scheduler's notifier and
//!   `BackPressure::wake_all`; waiters load it after they wake (under the back-pressure
//!   lock, or in the host-access slot's timed re-check), so a waiter that missed the store
//!   before sleeping is woken by the notification that follows it.
//!
//! # Tracing
//!
//! The engine opens `tracing` spans (`docs/profiling.md`, "Logging with `RUST_LOG`"):
//! `start` (and a `VM started` event), `back_pressure`, `stop_workers` and `shutdown` at
//! DEBUG here; `batch` at TRACE in each worker and `barrier` at DEBUG on the scheduler. A
//! span is made once per wait or per batch, never per instruction: with no subscriber, or
//! one that filters it out, a span costs a check of its callsite's cached interest (an
//! atomic load and a branch), and its fields are not evaluated.

use std::any::Any;
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use crossbeam_queue::SegQueue;
use smallvec::SmallVec;

use crate::alloc::HostAllocator;
use crate::ep::{DeviceId, Registry, StreamType};
use crate::sync::notify::Notifier;
use crate::sync::{AtomicBool, AtomicU64, Mutex, Ordering};

use super::back_pressure::BackPressure;
use super::config::{Config, ThreadTopology};
use super::dependence::InstrRef;
use super::error::{Error, Result};
use super::flight::Flight;
use super::instruction::{AccessSlot, Batch, Body, Instruction, Operand};
use super::instruction_policy::{ExecEnv, FailureLog};
use super::observe::{SubmitObserver, Submitted, ThreadRole, Timeline};
use super::scheduler::{Completion, Scheduler};
use super::stream::{StreamId, VmStream};
use super::stream_policy;
use super::tensor::{MetaId, TensorMeta};
use super::thread_ctx::{spawn_worker, ThreadCtx};
use super::watchdog::Watchdog;
use super::StreamPolicy;

/// The state shared by the front end, the scheduler, the workers and the tensors' objects.
pub(crate) struct Engine {
    /// This engine's name in the process's table of engines ([`EngineRef`]): what every
    /// tensor it makes names it by (`TensorInner::belongs_to`).
    me: EngineRef,
    pub(super) config: Config,
    pub(super) streams: Vec<VmStream>,
    pub(super) ctxs: Vec<ThreadCtx>,
    ctx_streams: Vec<Vec<usize>>,
    host_stream: StreamId,
    registry: Registry,
    pub(super) inbox: SegQueue<Batch>,
    pub(super) completions: SegQueue<Vec<Completion>>,
    pub(super) sched_notify: Notifier,
    batch_pool: SegQueue<Batch>,
    /// The number of each distinct tensor meta seen (`intern`).
    metas: super::intern::Metas,
    pub(super) completion_pool: SegQueue<Vec<Completion>>,
    /// The instructions in flight and the submitters waiting for them to fall.
    pub(super) bp: BackPressure,
    pub(super) shutdown: AtomicBool,
    dead: AtomicBool,
    next_tensor: AtomicU64,
    next_event: AtomicU64,
    /// Program numbers of instructions run in synchronous mode.
    next_inline: AtomicU64,
    /// The last program number given out (asynchronous mode): written by the scheduler after
    /// each batch it receives and by a waiter that ran its own work, read by each before it
    /// numbers a batch. The inline claim orders the two (`back_pressure`, steps 5–7).
    pub(super) program: AtomicU64,
    /// Per stream: whether a waiter may run the stream's instructions on its own thread
    /// ([`Engine::submit_for_wait`]).
    inline_ok: Box<[bool]>,
    pub(super) failures: Arc<FailureLog>,
    pub(super) fault: super::config::FaultInjection,
    /// In synchronous mode: the executor environment of each stream.
    sync_envs: Vec<ExecEnv>,
    /// The timeline observer (`observe::timeline`); records nothing unless a session is open.
    pub(super) timeline: Timeline,
    /// Whether a submit observer is attached (checked on every submit, without the lock).
    observing: AtomicBool,
    /// The attached submit observer; its lock also orders observation and inbox splicing, so
    /// the observer sees batches exactly in the order the scheduler receives them.
    observer: Mutex<Option<Box<dyn SubmitObserver>>>,
    /// Instructions of a dead engine that never ran: kept until this object drops, which is
    /// after every engine thread has exited, because other instructions may still point to
    /// the tensors their `Release`s own (`TensorPtr`).
    graveyard: Mutex<Vec<Batch>>,
    /// The communicators made on this engine, by name: what the watchdog aborts.
    communicators: Mutex<Vec<CommEntry>>,
    /// The flight recorder (`vm::flight`).
    pub(super) flight: Flight,
    /// What the layer above keeps with the engine (the front end's per-VM state). The engine
    /// never looks inside; it keeps it alive as long as itself, so that a tensor, which
    /// knows only its engine, reaches it.
    front: Box<dyn Any + Send + Sync>,
}

/// What a tensor names its engine by: a number that no other engine of the process ever
/// has, so that checking a tensor's engine is one comparison of words, and making or
/// freeing a tensor counts nothing on its engine. (A counted reference per tensor did: the
/// caller's thread added to the engine's count for each output, and the worker that freed
/// the tensor took it away again, so the count's line crossed between their cores twice
/// per call; `docs/performance.md`, "The call path".)
///
/// [`upgrade`](Self::upgrade) finds the engine again, while it lives, in the process's table
/// of engines: a lock and a short scan, for the paths that are not per call (a tensor's
/// read, its release outside a builder, a VM gone).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EngineRef(u64);

/// The engines made in this process and not yet dropped, with their [`EngineRef`]s.
static ENGINES: parking_lot::Mutex<Vec<(EngineRef, Weak<Engine>)>> = parking_lot::const_mutex(Vec::new());

/// The next [`EngineRef`]'s number (never reused: 2^64 engines outlast any process). The
/// standard library's atomic, not the `sync` facade's: a process-wide counter that no
/// model checks, and a `static` (loom's atomics are not made in constant expressions).
static NEXT_ENGINE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

impl EngineRef {
    /// No engine's name (numbers start at 1): for objects of unit tests that belong to none.
    #[cfg(test)]
    pub(crate) const NONE: EngineRef = EngineRef(0);

    /// Name the engine that `me` will point to, in the table.
    fn register(me: &Weak<Engine>) -> EngineRef {
        let r = EngineRef(NEXT_ENGINE.fetch_add(1, Ordering::Relaxed));
        ENGINES.lock().push((r, me.clone()));
        r
    }

    /// The engine, if it is still alive.
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

/// A communicator made on an engine: what the watchdog reads and aborts.
#[derive(Clone)]
pub(crate) struct CommEntry {
    /// Its name.
    pub(crate) name: Arc<str>,
    /// Its backend.
    pub(crate) backend: Arc<dyn crate::ep::ccl::Backend>,
    /// How many collectives of it have been issued so far.
    pub(crate) issued: Arc<dyn Fn() -> u64 + Send + Sync>,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine").field("streams", &self.streams).finish_non_exhaustive()
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
        self.engine.shutdown.store(true, Ordering::Release);
        self.engine.sched_notify.notify();
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

/// The two passes over the devices that build the stream table.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Pass {
    /// Each device's own streams (compute, copies).
    Own,
    /// Each device's collective stream.
    Collective,
}

impl Engine {
    /// Start an engine: open the devices, build the stream table and start the threads.
    /// `front` is kept for the layer above ([`front`](Self::front)).
    pub(crate) fn start(config: Config, front: Box<dyn Any + Send + Sync>) -> Result<EngineHandle> {
        let _span = tracing::debug_span!("start").entered();
        config.validate()?;
        // Kernel panics that the workers catch become errors, not lines on standard error.
        super::panic_hook::install();
        let mut registry = Registry::new(config.mock_devices, &config.mock);
        registry.add_cuda(config.cuda_devices)?;
        let mut streams = Vec::new();
        let mut ctx_streams: Vec<Vec<usize>> = Vec::new();
        let mut ctx_of_device: Vec<(DeviceId, usize)> = Vec::new();
        // The devices' own streams first, then one collective stream per device: the table
        // keeps the positions it had before collective streams existed, which traces and
        // tests name by number.
        let mut allocs: Vec<Arc<HostAllocator>> = Vec::new();
        let levels = {
            let mut l = config.stream_priorities.0.to_vec();
            l.sort_unstable();
            l.dedup();
            l
        };
        for pass in [Pass::Own, Pass::Collective] {
            for (d, entry) in registry.devices().enumerate() {
                let dev = &entry.device;
                let id = dev.id();
                if pass == Pass::Own {
                    allocs.push(HostAllocator::with_faults(
                        &id.to_string(),
                        dev.memory(),
                        config.fault.alloc_faults(),
                    ));
                }
                let alloc = allocs[d].clone();
                let types: &[StreamType] = match pass {
                    Pass::Own if id.is_host() => &[StreamType::Compute],
                    Pass::Own => &StreamType::DEVICE,
                    Pass::Collective => &[StreamType::Collective],
                };
                for &ty in types {
                    let index = streams.len();
                    let ctx = match config.threads {
                        ThreadTopology::PerStream => {
                            ctx_streams.push(Vec::new());
                            ctx_streams.len() - 1
                        }
                        ThreadTopology::PerDevice => match ctx_of_device.iter().find(|(d, _)| *d == id) {
                            Some(&(_, c)) => c,
                            None => {
                                ctx_streams.push(Vec::new());
                                ctx_of_device.push((id, ctx_streams.len() - 1));
                                ctx_streams.len() - 1
                            }
                        },
                        ThreadTopology::Single => {
                            if ctx_streams.is_empty() {
                                ctx_streams.push(Vec::new());
                            }
                            0
                        }
                    };
                    ctx_streams[ctx].push(index);
                    let name = if id.is_host() && ty == StreamType::Compute {
                        id.to_string()
                    } else {
                        format!("{}:{}", id, ty.name())
                    };
                    streams.push(VmStream {
                        id: StreamId(index as u32),
                        device: id,
                        ty,
                        policy: StreamPolicy::for_device(&**dev),
                        device_waits: dev.supports_stream_wait(),
                        ep: dev.create_stream_with_priority(ty, config.stream_priorities.get(ty), &levels)?,
                        events: entry.events.clone(),
                        alloc: alloc.clone(),
                        ctx,
                        name,
                    });
                }
            }
        }
        if streams.len() > InstrRef::MAX_STREAMS {
            return Err(Error::Config(format!(
                "{} streams asked for; a VM runs at most {}",
                streams.len(),
                InstrRef::MAX_STREAMS
            )));
        }
        let failures = Arc::new(FailureLog::default());
        // One allocator per device: the counters sample each once.
        let mut allocators: Vec<(String, Arc<HostAllocator>)> = Vec::new();
        for s in &streams {
            if !allocators.iter().any(|(_, a)| Arc::ptr_eq(a, &s.alloc)) {
                allocators.push((s.device.to_string(), s.alloc.clone()));
            }
        }
        let sync_envs = streams
            .iter()
            .map(|s| ExecEnv {
                stream_name: s.name.clone(),
                alloc: s.alloc.clone(),
                failures: failures.clone(),
            })
            .collect();
        let flight = Flight::new(
            if config.synchronous { 0 } else { config.flight_records },
            // Every stream's watermarks; the slots of the collective streams only, unless
            // asked for on every stream (their cost per instruction: docs/tuning.md).
            streams
                .iter()
                .map(|s| (s.name.clone(), config.flight_all_streams || s.ty == StreamType::Collective)),
        );
        // A collective could wait for its peers on the caller's thread, out of the
        // watchdog's sight, and the instructions of a stream whose flight records are kept
        // would be missing from them.
        let inline_ok = streams
            .iter()
            .map(|s| {
                s.policy == StreamPolicy::Synchronous
                    && s.ty != StreamType::Collective
                    && !(config.flight_all_streams && config.flight_records > 0)
            })
            .collect();
        let shared = Arc::new_cyclic(|me| Engine {
            me: EngineRef::register(me),
            ctxs: ctx_streams.iter().map(|_| ThreadCtx::default()).collect(),
            ctx_streams,
            host_stream: StreamId(0),
            streams,
            registry,
            inbox: SegQueue::new(),
            completions: SegQueue::new(),
            sched_notify: Notifier::new(),
            batch_pool: SegQueue::new(),
            metas: Default::default(),
            completion_pool: SegQueue::new(),
            bp: BackPressure::new(config.high_water, config.low_water),
            shutdown: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            graveyard: Mutex::new(Vec::new()),
            communicators: Mutex::new(Vec::new()),
            flight,
            next_tensor: AtomicU64::new(0),
            next_event: AtomicU64::new(1),
            next_inline: AtomicU64::new(1),
            program: AtomicU64::new(0),
            inline_ok,
            failures,
            fault: config.fault.clone(),
            sync_envs,
            timeline: Timeline::new(config.profile, allocators),
            observing: AtomicBool::new(false),
            observer: Mutex::new(None),
            front,
            config,
        });
        tracing::debug!(
            streams = %shared.streams.iter().map(|s| s.name.as_str()).collect::<Vec<_>>().join(", "),
            workers = if shared.config.synchronous { 0 } else { shared.ctxs.len() },
            topology = ?shared.config.threads,
            synchronous = shared.config.synchronous,
            "VM started"
        );
        let scheduler = if shared.config.synchronous {
            None
        } else {
            let vm = shared.clone();
            Some(
                std::thread::Builder::new()
                    .name("eagervm-scheduler".into())
                    .spawn(move || scheduler_main(vm))
                    .map_err(|e| Error::Config(format!("cannot start the scheduler thread: {e}")))?,
            )
        };
        let watchdog = match shared.config.watchdog_timeout {
            Some(timeout) if !shared.config.synchronous => Some(
                Watchdog::start(&shared, timeout)
                    .map_err(|e| Error::Config(format!("cannot start the watchdog thread: {e}")))?,
            ),
            _ => None,
        };
        Ok(EngineHandle { engine: shared, scheduler, watchdog })
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
        &self.config
    }

    /// The stream table.
    #[inline]
    pub(crate) fn streams(&self) -> &[VmStream] {
        &self.streams
    }

    /// Stream `s`, or [`Error::Config`] if the engine has none such.
    pub(crate) fn stream(&self, s: StreamId) -> Result<&VmStream> {
        self.streams
            .get(s.index())
            .ok_or_else(|| Error::Config(format!("stream {} does not exist in this VM", s.0)))
    }

    /// The stream of type `ty` on `device` (`cpu:0` has one stream for compute and copies,
    /// and a collective stream).
    pub(crate) fn stream_of(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        let ty = if device.is_host() && ty != StreamType::Collective { StreamType::Compute } else { ty };
        // A match, not `ok_or`: the error made and dropped on every lookup cost the eager
        // call path a call of the error's destructor.
        match self.streams.iter().find(|s| s.device == device && s.ty == ty) {
            Some(s) => Ok(s.id),
            None => Err(Error::Device(self.registry.unavailable(device))),
        }
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
        let mut comms = self.communicators.lock();
        if comms.iter().any(|c| c.name == name) {
            return Err(Error::Collective {
                comm: name.to_string(),
                detail: "a communicator of this name exists".into(),
            });
        }
        comms.push(CommEntry { name, backend, issued });
        Ok(())
    }

    /// The communicators made on this engine, in the order they were made.
    pub(crate) fn communicators(&self) -> Vec<CommEntry> {
        self.communicators.lock().clone()
    }

    /// A snapshot of the flight recorder (`vm::flight`), taken for `reason`.
    pub(crate) fn flight_record(&self, reason: &str) -> super::flight::FlightRecord {
        let comms = super::watchdog::communicator_records(self);
        self.flight.snapshot(reason.to_string(), self.config.watchdog_timeout, &[], comms)
    }

    /// The host stream, where host accesses and barriers go.
    #[inline]
    pub(crate) fn host_stream(&self) -> StreamId {
        self.host_stream
    }

    /// Whether `device` is one of the engine's devices.
    pub(crate) fn check_device(&self, device: DeviceId) -> Result<()> {
        self.registry.get(device).map(|_| ()).map_err(Error::from)
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
    pub(crate) fn take_batch(&self) -> Batch {
        self.batch_pool.pop().unwrap_or_else(|| Batch::with_capacity(self.config.batch_size))
    }

    /// Give an emptied batch back to the pool.
    pub(crate) fn recycle(&self, batch: Batch) {
        debug_assert!(batch.is_empty());
        if batch.has_capacity() {
            self.batch_pool.push(batch);
        }
    }

    pub(super) fn take_completions(&self) -> Vec<Completion> {
        self.completion_pool.pop().unwrap_or_else(|| Vec::with_capacity(self.config.batch_size))
    }

    /// Hand completion reports to the scheduler (workers and watchers).
    pub(super) fn report(&self, batch: Vec<Completion>) {
        self.completions.push(batch);
        self.sched_notify.notify();
    }

    pub(super) fn exec_env(&self, s: usize) -> ExecEnv {
        let st = &self.streams[s];
        ExecEnv { stream_name: st.name.clone(), alloc: st.alloc.clone(), failures: self.failures.clone() }
    }

    /// Record a failure that no tensor carries (a device that refused a launch, a call the
    /// front end refused after accepting it); the next `sync` reports it.
    pub(crate) fn record_failure(&self, e: Error) {
        tracing::error!(error = %e, "failure outside any tensor");
        self.failures.record_external(e);
    }

    /// The kernel panics caught over the engine's life: their count, and the errors of the
    /// first few (`instruction_policy::KEPT_PANICS`).
    pub(crate) fn caught_panics(&self) -> (u64, Vec<Error>) {
        self.failures.panics()
    }

    /// Take the failures recorded since the last call: their count and the first, as
    /// [`Error::Failed`].
    pub(crate) fn take_failures(&self) -> Option<Error> {
        self.failures.take()
    }

    /// Splice a batch into the inbox (or run it, in synchronous mode); block while too
    /// much is in flight.
    pub(crate) fn submit(&self, batch: Batch) {
        let now = self.enqueue(batch);
        self.bp.throttle(now, || self.is_dead());
    }

    /// Splice a batch into the inbox without waiting for back-pressure: for `Release`s,
    /// which only free memory, so that the thread that drops a handle does not block on
    /// other threads' work.
    ///
    /// When the VM is idle, the `Release`s run on this thread at once instead (see
    /// [`Handoff`]): a handle dropped between round trips would otherwise keep the VM busy
    /// just long enough that the next waiter finds it so.
    pub(crate) fn submit_unbounded(&self, batch: Batch) {
        if batch.is_empty() {
            self.recycle(batch);
        } else if self.bp.in_flight() == 0 {
            // `hand_off` checks the rest, and hands the batch over if it may not run here.
            Engine::hand_off(EngineHold::Borrowed(self), batch, false).finish();
        } else {
            self.enqueue(batch);
        }
    }

    /// Submit a batch whose results the caller waits for next (it ends with a host access
    /// or a barrier), and run it on the caller's thread if the VM is idle: see
    /// [`Handoff`]. Otherwise the same as [`submit`](Self::submit).
    pub(crate) fn submit_for_wait(&self, batch: Batch) -> Handoff<'_> {
        Engine::hand_off(EngineHold::Borrowed(self), batch, true)
    }

    /// [`submit_for_wait`](Self::submit_for_wait) through a counted handle, which the
    /// hand-off keeps: for a builder that owns its engine handle.
    pub(crate) fn submit_for_wait_owned(self: &Arc<Self>, batch: Batch) -> Handoff<'static> {
        Engine::hand_off(EngineHold::Owned(self.clone()), batch, true)
    }

    /// [`submit_for_wait`](Self::submit_for_wait); `bounded`: wait for back-pressure when
    /// the batch is handed over (as [`submit`](Self::submit), not
    /// [`submit_unbounded`](Self::submit_unbounded), does).
    fn hand_off(engine: EngineHold<'_>, batch: Batch, bounded: bool) -> Handoff<'_> {
        let claimed = engine.hand_off_claims(batch, bounded);
        let mut h = Handoff { engine, claimed: false, absorbing: false, batches: SmallVec::new() };
        if let Some(batch) = claimed {
            h.claimed = true;
            h.absorbing = true;
            h.batches.push(batch);
        }
        h
    }

    /// [`hand_off`](Self::hand_off)'s work: submit `batch`, or claim it for the waiting
    /// thread (returned then, to run when the hand-off is finished).
    fn hand_off_claims(&self, batch: Batch, bounded: bool) -> Option<Batch> {
        if self.config.synchronous || batch.is_empty() || !self.may_run_inline(&batch) {
            let now = self.enqueue(batch);
            if bounded {
                self.bp.throttle(now, || self.is_dead());
            }
            return None;
        }
        let observed = if self.observing.load(Ordering::Relaxed) { self.observe(&batch) } else { None };
        // The load first: a busy VM's word is written by other cores, and a failing
        // compare-and-swap would take its cache line from them.
        if self.bp.in_flight() == 0 && !self.is_dead() && self.bp.try_claim_inline() {
            // The observer's lock is held until the claim, so the observer sees this batch
            // before any a later submitter hands over (the scheduler holds those back).
            drop(observed);
            return Some(batch);
        }
        let now = self.enqueue_observed(batch, observed);
        if bounded {
            self.bp.throttle(now, || self.is_dead());
        }
        None
    }

    /// Whether every instruction of `batch` may run on a waiter's thread: host accesses,
    /// calls and releases on the streams `inline_ok` marks, and barriers; nothing while a
    /// profiling session is open, so that the timeline shows everything.
    fn may_run_inline(&self, batch: &Batch) -> bool {
        !self.timeline.is_on()
            && batch.ins.iter().all(|ins| match ins.body {
                Body::Barrier { .. } => true,
                Body::OpCall { .. }
                | Body::Release { .. }
                | Body::Read(_)
                | Body::Write(_)
                | Body::Wait(_) => self.inline_ok[ins.stream.index()],
                Body::RecordEvent { .. } | Body::StreamWaitEvent { .. } | Body::WaitEvent { .. } => false,
            })
    }

    /// Run a claimed batch on this thread (see [`Handoff`]), numbering its instructions
    /// after everything the scheduler has numbered.
    fn run_claimed(&self, mut batch: Batch) {
        let first = self.program.load(Ordering::Relaxed) + 1;
        self.program.store(first - 1 + batch.len() as u64, Ordering::Relaxed);
        batch.number_from(first);
        batch.drain_each(|ins, ops, program| {
            if !StreamPolicy::on_scheduler(&ins.body) {
                self.flight.ran_inline(ins.stream.index(), 1);
            }
            self.run_inline(ins, ops, program);
        });
        self.recycle(batch);
    }

    /// Scheduler, after taking a batch from the inbox: hold it while a waiter runs work on
    /// its own thread (`back_pressure`, step 7).
    #[inline]
    pub(super) fn hold_while_inline(&self) {
        if self.bp.inline_running() {
            self.wait_inline_end();
        }
    }

    #[cold]
    fn wait_inline_end(&self) {
        self.sched_notify.wait(self.config.backoff(), || !self.bp.inline_running());
    }

    /// Splice a batch into the inbox (or run it, in synchronous mode); returns how many
    /// instructions are in flight now.
    fn enqueue(&self, batch: Batch) -> usize {
        let observed = if self.observing.load(Ordering::Relaxed) { self.observe(&batch) } else { None };
        self.enqueue_observed(batch, observed)
    }

    /// [`enqueue`](Self::enqueue), once the observer has seen `batch` (`observed` holds its
    /// lock, if one is attached).
    fn enqueue_observed(
        &self,
        mut batch: Batch,
        observed: Option<crate::sync::MutexGuard<'_, Option<Box<dyn SubmitObserver>>>>,
    ) -> usize {
        if self.config.synchronous {
            batch.drain_each(|ins, ops, _| {
                let program = self.next_inline.fetch_add(1, Ordering::Relaxed);
                self.run_inline(ins, ops, program);
            });
            self.recycle(batch);
            return 0;
        }
        if self.dead.load(Ordering::Acquire) {
            // Nothing will run it.
            self.bury(batch);
            return 0;
        }
        let n = batch.len();
        let now = self.bp.admit(n);
        self.inbox.push(batch);
        drop(observed);
        self.sched_notify.notify();
        now
    }

    /// Show `batch` to the attached submit observer; the returned guard keeps other
    /// submitters out until the batch is in the inbox.
    #[cold]
    fn observe(&self, batch: &Batch) -> Option<crate::sync::MutexGuard<'_, Option<Box<dyn SubmitObserver>>>> {
        let mut g = self.observer.lock();
        g.as_mut()?.submitted(Submitted::new(batch));
        Some(g)
    }

    /// Attach (`Some`) or detach (`None`) the submit observer; returns the one detached.
    pub(crate) fn set_submit_observer(
        &self,
        observer: Option<Box<dyn SubmitObserver>>,
    ) -> Option<Box<dyn SubmitObserver>> {
        let mut g = self.observer.lock();
        self.observing.store(observer.is_some(), Ordering::Relaxed);
        std::mem::replace(&mut *g, observer)
    }

    /// The timeline observer (`observe::timeline`).
    pub(crate) fn timeline(&self) -> &Timeline {
        &self.timeline
    }

    /// Every thread the timeline may name, with its name.
    pub(crate) fn thread_names(&self) -> Vec<(ThreadRole, String)> {
        let mut threads = vec![(ThreadRole::Scheduler, "eagervm-scheduler".to_string())];
        for i in 0..self.ctxs.len() {
            threads.push((ThreadRole::Worker(i as u32), format!("eagervm-worker-{i}")));
        }
        for (i, st) in self.streams.iter().enumerate() {
            if st.policy.is_asynchronous() {
                threads.push((ThreadRole::Watcher(i as u32), format!("eagervm-watch-{}", st.name)));
            }
        }
        threads
    }

    /// `n` instructions left flight (scheduler thread).
    pub(super) fn retired(&self, n: usize) {
        self.bp.retire(n);
    }

    /// Instructions submitted and not yet retired.
    pub(crate) fn in_flight(&self) -> usize {
        self.bp.in_flight()
    }

    /// Synchronous mode: run `ins` now, on this thread, under its stream policy.
    fn run_inline(&self, ins: Instruction, ops: &[Operand], program: u64) {
        let env = &self.sync_envs[ins.stream.index()];
        stream_policy::run_inline(self, ins, ops, program, env);
    }

    /// Keep instructions that will never run until the engine's threads have all exited (see
    /// the `graveyard` field). Only a dead engine's instructions come here.
    pub(crate) fn bury(&self, batch: Batch) {
        if !batch.is_empty() {
            self.graveyard.lock().push(batch);
        }
    }

    pub(crate) fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire)
    }

    /// Mark the VM dead and wake everything that waits on it: its waits then return
    /// [`Error::ShutDown`] and new submissions are dropped instead of hanging.
    pub(super) fn mark_dead(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.sched_notify.notify();
        self.bp.wake_all();
    }

    /// A thread the VM needs could not be started (the system is out of threads or memory):
    /// record why, so that `sync` reports it, and mark the VM dead.
    pub(super) fn fail_startup(&self, why: String) {
        tracing::error!(%why, "the VM cannot run");
        self.failures.record_external(Error::Config(why));
        self.mark_dead();
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
        let s2 = slot.clone();
        let barrier = Body::Barrier { callback: Box::new(move || s2.fulfil(Ok(Vec::new()))) };
        let mut b = self.take_batch();
        b.push(Instruction::new(barrier, self.host_stream), &[]);
        if may_run_here {
            self.submit_for_wait(b).finish();
        } else {
            self.submit(b);
        }
        self.wait_access(&slot).map(|_| ())
    }

    /// Wait for a host access of this engine to be fulfilled, or for the engine to die.
    pub(crate) fn wait_access(&self, slot: &AccessSlot) -> Result<Vec<u8>> {
        slot.wait(self.config.backoff(), || self.is_dead())
    }
}

/// What [`Engine::submit_for_wait`] did with a batch: handed it to the scheduler, or, the VM
/// being idle, claimed the VM to run it on this thread (`back_pressure`, steps 5–7). A
/// claimed batch runs, under its streams' policies as in synchronous mode, when the
/// hand-off is finished or dropped, so that nothing accepted is lost; then the claim ends
/// and the scheduler receives what others submitted meanwhile.
///
/// A waiter that hands its batch over pays for two threads' wake-ups (the scheduler's, then
/// the worker's) before its result can come back; a waiter that runs it pays for neither.
/// The claim is taken only when nothing is in flight, so the batch cannot overtake earlier
/// work, and only for batches a thread waits for next or that only free memory (the
/// `Release`s of handles dropped while the VM is idle), so the VM's asynchrony is kept for
/// everything else (`docs/architecture.md`, "A waiter runs its own work").
#[must_use = "a claimed batch runs when the hand-off is finished or dropped"]
pub(crate) struct Handoff<'e> {
    engine: EngineHold<'e>,
    /// Whether this thread holds the inline claim.
    claimed: bool,
    /// Whether [`follow`](Self::follow) may still add batches to the claimed run: once one
    /// went to the scheduler, later ones must too, to keep program order.
    absorbing: bool,
    /// The claimed batches, in program order.
    batches: SmallVec<[Batch; 2]>,
}

/// An engine as a hand-off or a builder holds it: borrowed for a lifetime, or through a
/// counted handle of its own (a builder that owns its handle: `framework::builder`).
pub(crate) enum EngineHold<'e> {
    /// Borrowed for `'e`.
    Borrowed(&'e Engine),
    /// A counted handle, kept as long as the holder lives.
    Owned(Arc<Engine>),
}

impl std::ops::Deref for EngineHold<'_> {
    type Target = Engine;
    #[inline(always)]
    fn deref(&self) -> &Engine {
        match self {
            EngineHold::Borrowed(e) => e,
            EngineHold::Owned(e) => e,
        }
    }
}

impl Handoff<'_> {
    /// Submit `batch` (`Release`s that follow the handed-off batch, without waiting for
    /// back-pressure): into the claimed run when it may run there, else to the scheduler.
    pub(crate) fn follow(&mut self, batch: Batch) {
        let e: &Engine = &self.engine;
        if self.absorbing && !batch.is_empty() && e.may_run_inline(&batch) {
            if e.observing.load(Ordering::Relaxed) {
                drop(e.observe(&batch));
            }
            self.batches.push(batch);
        } else {
            self.absorbing = false;
            e.submit_unbounded(batch);
        }
    }

    /// Whether this thread holds the claim: the batch runs here, in
    /// [`finish`](Self::finish). (The Python binding's waits ask.)
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn is_claimed(&self) -> bool {
        self.claimed
    }

    /// Run the claimed batches, if any, and end the claim.
    pub(crate) fn finish(self) {}
}

impl Drop for Handoff<'_> {
    fn drop(&mut self) {
        if !self.claimed {
            return;
        }
        let e: &Engine = &self.engine;
        for batch in self.batches.drain(..) {
            e.run_claimed(batch);
        }
        if e.bp.end_inline() {
            e.sched_notify.notify();
        }
    }
}

fn scheduler_main(vm: Arc<Engine>) {
    let mut workers = Vec::new();
    for (i, streams) in vm.ctx_streams.iter().enumerate() {
        match spawn_worker(vm.clone(), i, streams.clone()) {
            Ok(w) => workers.push(w),
            Err(e) => vm.fail_startup(format!("cannot start worker thread {i}: {e}")),
        }
    }
    if !vm.is_dead() {
        let sched = Scheduler::new(vm.clone());
        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| sched.run()));
        if r.is_err() {
            tracing::error!("the scheduler thread panicked; the VM is dead");
            vm.mark_dead();
        }
    }
    let _span = tracing::debug_span!("stop_workers", workers = workers.len(), dead = vm.is_dead()).entered();
    tracing::debug!(in_flight = vm.in_flight(), "scheduler drained; stopping workers");
    for c in &vm.ctxs {
        c.stop();
    }
    for w in workers {
        let _ = w.join();
    }
    // Let every device stream run what was launched on it (nothing is left after a clean
    // shutdown; a dead VM may leave some). Once this thread ends, the VM's last strong
    // reference can go, and from then on a tensor's last handle frees the tensor at once
    // (`tensor::last_reference_dropped`): no device thread may still be running an
    // instruction on it.
    for s in &vm.streams {
        let _ = s.ep.synchronize();
    }
}
