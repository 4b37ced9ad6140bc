//! The [`VirtualMachine`] handle and the state its threads share.
//!
//! # Threads
//!
//! `VirtualMachine::new` starts one scheduler thread and one `ThreadCtx` worker per stream
//! (or per device, or one in all: [`ThreadTopology`]); each
//! asynchronous stream's worker starts a watcher. In synchronous mode none are started and
//! the caller runs every instruction itself.
//!
//! # Shutdown protocol
//!
//! 1. `drop(vm)` sets `shutdown` and notifies the scheduler.
//! 2. The scheduler keeps receiving and completing until nothing is in flight (everything
//!    submitted before the drop runs to completion: drain, not cancel), then stops each
//!    worker (`ThreadCtx::stop`) and joins it; each worker stops and joins its watchers.
//! 3. `drop` joins the scheduler. Every thread the VM started has exited when it returns.
//!
//! If the scheduler thread ever panics (a bug in eagervm, not in a kernel: kernel panics
//! are caught where they run), it marks the VM dead and wakes every waiter, whose waits
//! then return [`Error::ShutDown`] instead of hanging.
//!
//! # Tracing
//!
//! The VM opens `tracing` spans (`docs/profiling.md`, "Logging with `RUST_LOG`"): `start`
//! (and a `VM started` event), `sync`, `host_wait` (`Tensor::wait`, `to_vec`),
//! `back_pressure` and `shutdown` at DEBUG here; `batch` at TRACE in each worker and
//! `barrier` at DEBUG on the scheduler. A span is made once per wait, per sync or per
//! batch, never per instruction: with no subscriber, or one that filters it out, a span
//! costs a check of its callsite's cached interest (an atomic load and a branch), and its
//! fields are not evaluated.

use std::sync::Arc;
use std::thread::JoinHandle;

use crossbeam_queue::SegQueue;

use crate::alloc::HostAllocator;
use crate::ep::{DeviceId, Registry, StreamType};
use crate::framework::builder::{push_release, InstructionsBuilder};
use crate::framework::infer_cache::InferCache;
use crate::framework::release::Releases;
use crate::framework::tensor::Tensor;
use crate::framework::{Op, OpRegistry};
use crate::profile::{Profile, ProfileError, Profiler, ThreadRole};
use crate::sync::notify::Notifier;
use crate::sync::{AtomicBool, AtomicU64, AtomicUsize, Condvar, Mutex, Ordering};
use crate::vm::tensor::{Fetch, MetaId, TensorInner, TensorOwner};
use crate::vm::TensorMeta;
use crate::vm::{Attrs, DType, Element};
use crate::vm::{Error, Result};

use super::config::{Config, ThreadTopology};
use super::dependence::InstrRef;
use super::exec::{execute_catching, ExecEnv, FailureLog};
use super::instruction::{AccessSlot, Batch, Body, Instruction, Operand, Operands};
use super::scheduler::{Completion, Scheduler};
use super::stream::{PolicyKind, StreamId, VmStream};
use super::thread_ctx::{spawn_worker, ThreadCtx};

/// State shared by the handle, the scheduler, the workers and the tensors' handles.
pub struct VmShared {
    /// A weak reference to this object: the identity a tensor's own reference to its VM is
    /// compared with (`TensorInner::belongs_to`), with no upgrade and no count per use.
    pub(crate) me: std::sync::Weak<VmShared>,
    pub(crate) config: Config,
    pub(crate) streams: Vec<VmStream>,
    pub(crate) ctxs: Vec<ThreadCtx>,
    ctx_streams: Vec<Vec<usize>>,
    pub(crate) host_stream: StreamId,
    pub(crate) ops: OpRegistry,
    registry: Registry,
    pub(crate) inbox: SegQueue<Batch>,
    pub(crate) completions: SegQueue<Vec<Completion>>,
    pub(crate) sched_notify: Notifier,
    batch_pool: SegQueue<Batch>,
    infer_caches: SegQueue<Box<InferCache>>,
    /// When a tensor's `Release` may be submitted (`framework::release`).
    pub(crate) releases: Releases<TensorOwner>,
    /// The number of each distinct tensor meta seen (`intern`).
    metas: Mutex<std::collections::HashMap<TensorMeta, MetaId>>,
    pub(crate) completion_pool: SegQueue<Vec<Completion>>,
    pub(crate) in_flight: AtomicUsize,
    bp_waiting: AtomicUsize,
    bp_lock: Mutex<()>,
    bp_cv: Condvar,
    pub(crate) shutdown: AtomicBool,
    dead: AtomicBool,
    next_tensor: AtomicU64,
    next_event: AtomicU64,
    /// Program numbers of instructions run in synchronous mode.
    next_inline: AtomicU64,
    pub(crate) failures: Arc<FailureLog>,
    pub(crate) fault: super::config::FaultInjection,
    /// In synchronous mode: the executor environment of each stream.
    sync_envs: Vec<ExecEnv>,
    /// The timeline recorder (`crate::profile`); records nothing unless a session is open.
    pub(crate) profiler: Profiler,
    /// Whether a trace recorder is attached (checked on every submit, without the lock).
    recording: AtomicBool,
    /// The attached trace recorder (`crate::trace`); its lock also orders recording and
    /// inbox splicing, so the trace lists batches exactly in the order the VM received them.
    recorder: Mutex<Option<crate::trace::Capture>>,
    /// Instructions of a dead VM that never ran: kept until this object drops, which is
    /// after every VM thread has exited, because other instructions may still point to
    /// the tensors their `Release`s own (`TensorPtr`).
    graveyard: Mutex<Vec<Batch>>,
}

/// Distinct metas a VM numbers; metas beyond this get [`MetaId::NONE`] (their calls are
/// checked in full every time), which bounds the table in programs whose shapes never
/// repeat.
const MAX_METAS: usize = 1 << 20;

impl std::fmt::Debug for VmShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VmShared").field("streams", &self.streams).finish_non_exhaustive()
    }
}

impl VmShared {
    pub(crate) fn stream(&self, s: StreamId) -> Result<&VmStream> {
        self.streams
            .get(s.index())
            .ok_or_else(|| Error::Config(format!("stream {} does not exist in this VM", s.0)))
    }

    pub(crate) fn unknown_op(&self, name: &str, device: DeviceId) -> Error {
        match self.ops.resolve(name, device) {
            Err(e) => e,
            Ok(_) => unreachable!("asked only for missing kernels"),
        }
    }

    pub(crate) fn new_tensor(self: &Arc<Self>, meta: TensorMeta) -> Tensor {
        let id = self.intern(&meta);
        self.new_tensor_with_id(meta, id)
    }

    /// A new tensor whose meta this VM numbers `meta_id`.
    pub(crate) fn new_tensor_with_id(self: &Arc<Self>, meta: TensorMeta, meta_id: MetaId) -> Tensor {
        self.new_tensor_for(meta, meta_id, Fetch::No)
    }

    /// A new tensor for the use `fetch` says.
    fn new_tensor_for(&self, meta: TensorMeta, meta_id: MetaId, fetch: Fetch) -> Tensor {
        let id = self.next_tensor.fetch_add(1, Ordering::Relaxed);
        Tensor::made_for(id, meta, meta_id, self.me.clone(), fetch)
    }

    /// This VM's number for `meta`: equal metas get equal numbers, so the builder compares
    /// call signatures by number ([`MetaId::NONE`] once [`MAX_METAS`] are numbered).
    pub(crate) fn intern(&self, meta: &TensorMeta) -> MetaId {
        let mut metas = self.metas.lock();
        if let Some(&id) = metas.get(meta) {
            return id;
        }
        if metas.len() >= MAX_METAS {
            return MetaId::NONE;
        }
        let id = MetaId(metas.len() as u32);
        metas.insert(meta.clone(), id);
        id
    }

    pub(crate) fn next_event_id(&self) -> u64 {
        self.next_event.fetch_add(1, Ordering::Relaxed)
    }

    /// An empty batch (pooled: workers hand back the batches they have run and emptied).
    pub(crate) fn take_batch(&self) -> Batch {
        self.batch_pool.pop().unwrap_or_else(|| Batch::with_capacity(self.config.batch_size))
    }

    pub(crate) fn recycle(&self, batch: Batch) {
        debug_assert!(batch.is_empty());
        if batch.has_capacity() {
            self.batch_pool.push(batch);
        }
    }

    /// A shape-inference cache for a new builder (warm if an earlier builder left one).
    pub(crate) fn take_infer_cache(&self) -> Box<InferCache> {
        self.infer_caches.pop().unwrap_or_default()
    }

    /// Keep a builder's inference cache for the next builder.
    pub(crate) fn recycle_infer_cache(&self, cache: Box<InferCache>) {
        self.infer_caches.push(cache);
    }

    pub(crate) fn take_completions(&self) -> Vec<Completion> {
        self.completion_pool.pop().unwrap_or_else(|| Vec::with_capacity(self.config.batch_size))
    }

    /// Hand completion reports to the scheduler (workers and watchers).
    pub(crate) fn report(&self, batch: Vec<Completion>) {
        self.completions.push(batch);
        self.sched_notify.notify();
    }

    pub(crate) fn exec_env(&self, s: usize) -> ExecEnv {
        let st = &self.streams[s];
        ExecEnv { stream_name: st.name.clone(), alloc: st.alloc.clone(), failures: self.failures.clone() }
    }

    pub(crate) fn device_failure(&self, e: Error) {
        tracing::error!(error = %e, "device failure");
        self.failures.record_external(e);
    }

    /// Splice a batch into the inbox (or run it, in synchronous mode); block while too
    /// much is in flight.
    pub(crate) fn submit(&self, batch: Batch) {
        if self.enqueue(batch) > self.config.high_water {
            self.wait_low_water();
        }
    }

    /// Submit the `Release`s of `owners` (`framework::release`), without waiting for
    /// back-pressure: a release only frees memory, and the thread that drops a handle
    /// should not block on other threads' work.
    pub(crate) fn submit_releases(&self, owners: impl IntoIterator<Item = TensorOwner>) {
        let mut b: Option<Batch> = None;
        for t in owners {
            push_release(b.get_or_insert_with(|| self.take_batch()), t);
        }
        if let Some(b) = b.filter(|b| !b.is_empty()) {
            self.enqueue(b);
        }
    }

    /// Splice a batch into the inbox (or run it, in synchronous mode); returns how many
    /// instructions are in flight now.
    fn enqueue(&self, mut batch: Batch) -> usize {
        let recording = if self.recording.load(Ordering::Relaxed) { self.record(&batch) } else { None };
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
        let now = self.in_flight.fetch_add(n, Ordering::SeqCst) + n;
        self.inbox.push(batch);
        drop(recording);
        self.sched_notify.notify();
        now
    }

    /// Hand `batch` to the attached recorder; the returned guard keeps other submitters out
    /// until the batch is in the inbox.
    #[cold]
    fn record(&self, batch: &Batch) -> Option<crate::sync::MutexGuard<'_, Option<crate::trace::Capture>>> {
        let mut g = self.recorder.lock();
        g.as_mut()?.capture(batch);
        Some(g)
    }

    /// Attach (`Some`) or detach (`None`) the trace recorder; returns the one detached.
    pub(crate) fn set_recorder(
        &self,
        capture: Option<crate::trace::Capture>,
    ) -> Option<crate::trace::Capture> {
        let mut g = self.recorder.lock();
        self.recording.store(capture.is_some(), Ordering::Relaxed);
        std::mem::replace(&mut *g, capture)
    }

    fn wait_low_water(&self) {
        let _span = tracing::debug_span!(
            "back_pressure",
            in_flight = self.in_flight.load(Ordering::Relaxed),
            high_water = self.config.high_water,
            low_water = self.config.low_water,
        )
        .entered();
        self.bp_waiting.fetch_add(1, Ordering::SeqCst);
        let mut g = self.bp_lock.lock();
        while self.in_flight.load(Ordering::SeqCst) > self.config.low_water
            && !self.dead.load(Ordering::SeqCst)
        {
            self.bp_cv.wait(&mut g);
        }
        drop(g);
        self.bp_waiting.fetch_sub(1, Ordering::SeqCst);
    }

    /// `n` instructions left flight (scheduler thread).
    pub(crate) fn retired(&self, n: usize) {
        let now = self.in_flight.fetch_sub(n, Ordering::SeqCst) - n;
        if now <= self.config.low_water && self.bp_waiting.load(Ordering::SeqCst) > 0 {
            let _g = self.bp_lock.lock();
            self.bp_cv.notify_all();
        }
    }

    fn run_inline(&self, mut ins: Instruction, ops: &[Operand], program: u64) {
        let s = ins.stream.index();
        let st = &self.streams[s];
        match (&ins.body, st.policy) {
            (Body::RecordEvent { .. } | Body::StreamWaitEvent { .. }, _) => {}
            (_, PolicyKind::Sync) => execute_catching(&mut ins, ops, program, &self.sync_envs[s]),
            (_, PolicyKind::Event) => {
                let env = Arc::new(self.exec_env(s));
                let ops = Operands::from_slice(ops);
                let r = st
                    .ep
                    .launch(Box::new(move || execute_catching(&mut ins, &ops, program, &env)))
                    .and_then(|()| st.ep.synchronize());
                if let Err(e) = r {
                    self.device_failure(e.into());
                }
            }
        }
    }

    /// Release `t` while handles of it may still be alive (`Array::release`): its `Release`
    /// follows every use already built, on any thread (`framework::release`), and later
    /// calls on it are refused.
    pub(crate) fn release_tensor(&self, t: &TensorInner) {
        if t.released.swap(true, Ordering::Relaxed) {
            return;
        }
        self.release_owned(TensorOwner::counted(t));
    }

    /// Emit the `Release` that `t` (marked released) will be owned by, once every builder
    /// batch open now has been submitted (`framework::release`).
    pub(crate) fn release_owned(&self, t: TensorOwner) {
        let ready = self.releases.release(t);
        self.submit_releases(ready);
    }

    /// Keep instructions that will never run until the VM's threads have all exited (see
    /// the `graveyard` field). Only a dead VM's instructions come here.
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
    fn mark_dead(&self) {
        self.dead.store(true, Ordering::SeqCst);
        self.sched_notify.notify();
        let _g = self.bp_lock.lock();
        self.bp_cv.notify_all();
    }

    /// A thread the VM needs could not be started (the system is out of threads or memory):
    /// record why, so that `sync` reports it, and mark the VM dead.
    pub(crate) fn fail_startup(&self, why: String) {
        tracing::error!(%why, "the VM cannot run");
        self.failures.record_external(Error::Config(why));
        self.mark_dead();
    }

    /// Wait until everything submitted so far has retired, leaving the failure log alone.
    fn barrier_wait(&self) -> Result<()> {
        let slot = AccessSlot::new();
        let s2 = slot.clone();
        let barrier = Body::Barrier { callback: Box::new(move || s2.fulfil(Ok(Vec::new()))) };
        let mut b = self.take_batch();
        b.push(Instruction::new(barrier, self.host_stream), &[]);
        self.submit(b);
        slot.wait(|| self.is_dead()).map(|_| ())
    }

    pub(crate) fn wait_tensor(self: &Arc<Self>, t: &Tensor) -> Result<()> {
        self.host_access(t, true).map(|_| ())
    }

    pub(crate) fn read_bytes(self: &Arc<Self>, t: &Tensor) -> Result<Vec<u8>> {
        self.host_access(t, false)
    }

    /// A host access of `t` (a tensor of this VM): its bytes, or for `wait_only` nothing,
    /// or the error it carries. A device tensor is first copied to a new host tensor on
    /// the device's device-to-host stream; that copy answers for a device tensor nothing
    /// has written as the access does for a host one ([`Fetch`]): `wait` passes, `to_vec`
    /// returns `Uninitialized` with the op `Access`, and neither counts as a failure.
    fn host_access(self: &Arc<Self>, t: &Tensor, wait_only: bool) -> Result<Vec<u8>> {
        let _span =
            tracing::debug_span!("host_wait", tensor = t.id(), device = %t.device(), wait_only).entered();
        let slot = AccessSlot::new();
        {
            let mut b = InstructionsBuilder::new(self);
            if t.device().is_host() {
                b.read_into(t, slot.clone(), wait_only)?;
            } else {
                let d2h = self.stream_of(t.device(), StreamType::D2H)?;
                let copy = self.ops.resolve("copy", t.device())?;
                let meta = TensorMeta { device: DeviceId::CPU, ..t.meta().clone() };
                let fetch = if wait_only { Fetch::Wait } else { Fetch::Read };
                let host = self.new_tensor_for(meta.clone(), self.intern(&meta), fetch);
                b.call_into(copy, &[t], &[&host], Attrs::default(), d2h)?;
                b.read_into(&host, slot.clone(), wait_only)?;
            }
        }
        slot.wait(|| self.is_dead())
    }

    pub(crate) fn stream_of(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        let ty = if device.is_host() { StreamType::Compute } else { ty };
        self.streams
            .iter()
            .find(|s| s.device == device && s.ty == ty)
            .map(|s| s.id)
            .ok_or(Error::Device(crate::ep::EpError::Unavailable(device)))
    }
}

/// The eager-execution virtual machine.
///
/// ```
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cpu = vm.compute_stream(DeviceId::CPU)?;
/// let a = vm.from_slice(&[1.0f32, -2.0, 3.0], &[3], DeviceId::CPU)?;
/// let (relu, sum) = (vm.op("relu")?, vm.op("sum")?);
/// let total = vm.run(|b| {
///     let r = b.call(relu, &[&a], Attrs::default(), cpu)?;
///     b.call(sum, &[&r], Attrs::default(), cpu)
/// })?;
/// assert_eq!(total.to_vec::<f32>()?, vec![4.0]);
/// # Ok::<(), eagervm::Error>(())
/// ```
pub struct VirtualMachine {
    shared: Arc<VmShared>,
    scheduler: Option<JoinHandle<()>>,
}

impl std::fmt::Debug for VirtualMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.shared.fmt(f)
    }
}

impl VirtualMachine {
    /// Start a VM: open the devices, build the stream table and start the threads.
    pub fn new(config: Config) -> Result<Self> {
        let _span = tracing::debug_span!("start").entered();
        config.validate()?;
        let mut registry = Registry::new(config.mock_devices, &config.mock);
        registry.add_cuda(config.cuda_devices)?;
        let mut streams = Vec::new();
        let mut ctx_streams: Vec<Vec<usize>> = Vec::new();
        let mut ctx_of_device: Vec<(DeviceId, usize)> = Vec::new();
        for entry in registry.devices() {
            let dev = &entry.device;
            let id = dev.id();
            let alloc =
                HostAllocator::with_faults(&id.to_string(), dev.memory(), config.fault.alloc_faults());
            let types: &[StreamType] = if id.is_host() { &[StreamType::Compute] } else { &StreamType::ALL };
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
                let name = if id.is_host() { id.to_string() } else { format!("{}:{}", id, ty.name()) };
                streams.push(VmStream {
                    id: StreamId(index as u32),
                    device: id,
                    ty,
                    policy: if dev.is_async() { PolicyKind::Event } else { PolicyKind::Sync },
                    device_waits: dev.supports_stream_wait(),
                    ep: dev.create_stream(ty)?,
                    events: entry.events.clone(),
                    alloc: alloc.clone(),
                    ctx,
                    name,
                });
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
        let shared = Arc::new_cyclic(|me| VmShared {
            me: me.clone(),
            ctxs: ctx_streams.iter().map(|_| ThreadCtx::default()).collect(),
            ctx_streams,
            host_stream: StreamId(0),
            streams,
            ops: OpRegistry::with_builtins(),
            registry,
            inbox: SegQueue::new(),
            completions: SegQueue::new(),
            sched_notify: Notifier::new(),
            batch_pool: SegQueue::new(),
            infer_caches: SegQueue::new(),
            releases: Releases::default(),
            metas: Mutex::new(std::collections::HashMap::new()),
            completion_pool: SegQueue::new(),
            in_flight: AtomicUsize::new(0),
            bp_waiting: AtomicUsize::new(0),
            bp_lock: Mutex::new(()),
            bp_cv: Condvar::new(),
            shutdown: AtomicBool::new(false),
            dead: AtomicBool::new(false),
            graveyard: Mutex::new(Vec::new()),
            next_tensor: AtomicU64::new(0),
            next_event: AtomicU64::new(1),
            next_inline: AtomicU64::new(1),
            failures,
            fault: config.fault.clone(),
            sync_envs,
            profiler: Profiler::new(config.profile, allocators),
            recording: AtomicBool::new(false),
            recorder: Mutex::new(None),
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
        Ok(VirtualMachine { shared, scheduler })
    }

    /// The op called `name` (with its kernel for each device type).
    pub fn op(&self, name: &str) -> Result<Op> {
        self.shared.ops.get(name).ok_or_else(|| Error::UnknownOp {
            op: name.into(),
            device: DeviceId::CPU,
            known: self.shared.ops.names().join(", "),
        })
    }

    /// The stream of type `ty` on `device` (`cpu:0` has a single stream for every type).
    pub fn stream(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        self.shared.stream_of(device, ty)
    }

    /// The compute stream of `device`.
    pub fn compute_stream(&self, device: DeviceId) -> Result<StreamId> {
        self.stream(device, StreamType::Compute)
    }

    /// Every stream: id, device, type and name.
    pub fn streams(&self) -> Vec<(StreamId, DeviceId, StreamType, String)> {
        self.shared.streams.iter().map(|s| (s.id, s.device, s.ty, s.name.clone())).collect()
    }

    /// A new tensor with no storage yet (allocated by the first instruction that writes it).
    /// Refused with [`Error::TooLarge`] if its size overflows or is over
    /// [`Config::max_tensor_bytes`].
    pub fn empty(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Tensor> {
        self.empty_at(shape, dtype, device, || format!("`empty` on {device}"))
    }

    /// [`empty`](Self::empty), naming the tensor `at()` if it is too large.
    pub(crate) fn empty_at(
        &self,
        shape: &[usize],
        dtype: DType,
        device: DeviceId,
        at: impl FnOnce() -> String,
    ) -> Result<Tensor> {
        self.shared.registry.get(device)?;
        crate::vm::shape::check(shape, dtype, self.shared.config.max_tensor_bytes, at)?;
        Ok(self.shared.new_tensor(TensorMeta::new(shape, dtype, device)))
    }

    /// A new tensor holding `data`, on `device` (copied there through its host-to-device
    /// stream if it is not the host). Refused as [`empty`](Self::empty) refuses a shape.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize], device: DeviceId) -> Result<Tensor> {
        let at = || format!("`from_slice` on {device}");
        let host = self.empty_at(shape, T::DTYPE, DeviceId::CPU, at)?;
        if device.is_host() {
            self.run(|b| b.write(&host, data))?;
            return Ok(host);
        }
        let dst = self.empty_at(shape, T::DTYPE, device, at)?;
        let h2d = self.stream(device, StreamType::H2D)?;
        let copy = self.shared.ops.resolve("copy", device)?;
        self.run(|b| {
            b.write(&host, data)?;
            b.call_into(copy, &[&host], &[&dst], Attrs::default(), h2d)
        })?;
        Ok(dst)
    }

    /// Build instructions with `f` and submit them. Returns what `f` returns. Instructions
    /// built before an error inside `f` are still submitted (they were valid).
    pub fn run<R>(&self, f: impl FnOnce(&mut InstructionsBuilder<'_>) -> R) -> R {
        let mut b = InstructionsBuilder::new(&self.shared);
        f(&mut b)
    }

    /// Wait until every instruction submitted so far has finished. Returns
    /// [`Error::Failed`] if any instruction failed since the previous `sync` (the failed
    /// tensors keep their errors either way).
    pub fn sync(&self) -> Result<()> {
        let _span = tracing::debug_span!("sync", in_flight = self.in_flight()).entered();
        self.shared.barrier_wait()?;
        match self.shared.failures.take() {
            Some(e) => {
                tracing::debug!(error = %e, "sync found failures");
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// Instructions submitted and not yet retired.
    pub fn in_flight(&self) -> usize {
        self.shared.in_flight.load(Ordering::Relaxed)
    }

    /// The configuration the VM runs with.
    pub fn config(&self) -> &Config {
        &self.shared.config
    }

    /// Open a profiling session (closing any open one, whose records are dropped). Every
    /// instruction submitted after this returns is recorded; see [`crate::profile`]. Waits
    /// for the scheduler to see the session open (a barrier, as [`sync`](Self::sync) does,
    /// but leaving failures for the next `sync` to report).
    pub fn start_profiling(&self) -> std::result::Result<(), ProfileError> {
        if self.shared.config.synchronous {
            return Err(ProfileError::Synchronous);
        }
        self.shared.profiler.start();
        self.shared.barrier_wait().map_err(|_| ProfileError::ShutDown)
    }

    /// Whether a profiling session is open.
    pub fn is_profiling(&self) -> bool {
        self.shared.profiler.is_on()
    }

    /// Close the profiling session and return what it recorded. Waits first until every
    /// instruction submitted so far has finished (like [`sync`](Self::sync), but leaving
    /// failures for the next `sync` to report).
    pub fn stop_profiling(&self) -> std::result::Result<Profile, ProfileError> {
        let sh = &self.shared;
        if sh.config.synchronous {
            return Err(ProfileError::Synchronous);
        }
        if !sh.profiler.is_on() {
            return Err(ProfileError::NotProfiling);
        }
        sh.barrier_wait().map_err(|_| ProfileError::ShutDown)?;
        // A last counter sample, so that every session has one.
        if let Some(mut r) = sh.profiler.begin(ThreadRole::Scheduler) {
            r.sample(&sh.profiler, sh.in_flight.load(Ordering::Relaxed), true);
            r.finish(&sh.profiler);
        }
        let session = sh.profiler.stop().ok_or(ProfileError::NotProfiling)?;
        // The scheduler hands its records in before running a barrier's callback and then
        // records afresh while a session is open; the loop that ran the first barrier's
        // callback may still hold records of this session. Workers and watchers hand theirs
        // in before reporting, so they are all in. After this second barrier nothing of
        // the session is left outside the sink.
        sh.barrier_wait().map_err(|_| ProfileError::ShutDown)?;
        let mut threads = vec![(ThreadRole::Scheduler, "eagervm-scheduler".to_string())];
        for i in 0..sh.ctxs.len() {
            threads.push((ThreadRole::Worker(i as u32), format!("eagervm-worker-{i}")));
        }
        for (i, st) in sh.streams.iter().enumerate() {
            if st.policy == PolicyKind::Event {
                threads.push((ThreadRole::Watcher(i as u32), format!("eagervm-watch-{}", st.name)));
            }
        }
        let streams = sh.streams.iter().map(|s| s.name.clone()).collect();
        Ok(crate::profile::build(
            sh.profiler.drain(session),
            streams,
            threads,
            &sh.profiler.allocator_names(),
        ))
    }

    /// Names of the registered ops.
    pub fn op_names(&self) -> Vec<&'static str> {
        self.shared.ops.names()
    }

    pub(crate) fn shared(&self) -> &Arc<VmShared> {
        &self.shared
    }
}

impl Drop for VirtualMachine {
    fn drop(&mut self) {
        let _span = tracing::debug_span!("shutdown", in_flight = self.in_flight()).entered();
        // No builder is left (each borrows the VM): nothing can hold a release back.
        let left = self.shared.releases.take_all();
        self.shared.submit_releases(left);
        self.shared.shutdown.store(true, Ordering::Release);
        self.shared.sched_notify.notify();
        if let Some(h) = self.scheduler.take() {
            let _ = h.join();
        }
        tracing::debug!("VM shut down: every thread it started has exited");
    }
}

fn scheduler_main(vm: Arc<VmShared>) {
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
    tracing::debug!(in_flight = vm.in_flight.load(Ordering::Relaxed), "scheduler drained; stopping workers");
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ep::mock::MockConfig;

    fn work(vm: &VirtualMachine) {
        let dev = DeviceId::mock(0);
        let (relu, add) = (vm.op("relu").unwrap(), vm.op("add").unwrap());
        let x = vm.from_slice(&[1.0f32, -1.0], &[2], dev).unwrap();
        let (g, cpu) = (vm.compute_stream(dev).unwrap(), vm.compute_stream(DeviceId::CPU).unwrap());
        let y = vm.run(|b| b.call(relu, &[&x], Attrs::default(), g)).unwrap();
        let h = vm.from_slice(&y.to_vec::<f32>().unwrap(), &[2], DeviceId::CPU).unwrap();
        vm.run(|b| b.call(add, &[&h, &h], Attrs::default(), cpu)).unwrap();
        vm.sync().unwrap();
    }

    #[test]
    fn no_thread_records_anything_while_no_session_is_open() {
        let vm = VirtualMachine::new(Config::default().with_mock_devices(1, MockConfig::jittery())).unwrap();
        work(&vm);
        assert_eq!(vm.shared.profiler.pending(), 0);
        vm.start_profiling().unwrap();
        work(&vm);
        assert!(vm.shared.profiler.pending() > 0);
        assert!(!vm.stop_profiling().unwrap().instructions().is_empty());
        work(&vm);
        assert_eq!(vm.shared.profiler.pending(), 0);
    }
}
