//! `InstructionsBuilder`: turns op calls into instructions, with soft sync.
//!
//! A builder is lent to the closure of [`VirtualMachine::run`](crate::VirtualMachine::run).
//! Each call is checked (op known on the stream's device, operand count, shapes and dtypes
//! through the kernel's `infer`, devices, aliasing, released tensors) and refused with a
//! typed [`Error`] before anything is emitted; an accepted call appends instructions to a
//! local batch without taking any lock. Every `batch_size` instructions, and when the
//! closure returns, the batch is spliced into the scheduler's inbox in O(1).
//!
//! # The rule, and the cost of a call
//!
//! Which calls are accepted is stated once, item by item, in `rule.rs`
//! ([`rule`](InstructionsBuilder::rule)). What depends on a call's signature alone (kernel,
//! stream, attributes, and each operand's interned meta: shape, dtype, device) is
//! remembered per VM by the inference cache (`InferCache`), so a signature checked before
//! passes on a comparison of a few words (checking it includes the size check of every
//! output the call makes, `framework::shape`); only the items that depend on the tensors'
//! identity and state (released, of this VM, aliased) run on every call. The common calls
//! take caches of the rule that answer in one pass over their operands, or say they cannot
//! tell: `call` and `call_multi` (at most four inputs, none a view, a cached signature), and
//! `call_into` (at most sixteen operands, none a view or aliased, a cached signature, no
//! soft sync), which is then written at once. Every other call takes the rule itself,
//! which gives a refused call its typed error; a unit test (`rule_tests.rs`) checks on
//! random calls that each cache's answer is the rule's. The instruction is written once,
//! into the batch. Nothing per call is allocated, locked or counted: tensors are not kept
//! alive by a handle per use (`framework::release` says why none is needed).
//!
//! # Soft sync
//!
//! Before an instruction uses tensors last used on another stream, the builder emits the
//! two streams' synchronisation (`soft_sync.rs`, after OneFlow's `SoftSyncStream`).
//!
//! # Releases
//!
//! Dropping the last handle of a tensor emits its `Release`; the VM submits it once every
//! builder batch that was open at that moment (on any thread, this one's included) has been
//! submitted, so it lands after every instruction built that uses the tensor
//! (`framework::release`). A batch opens before the checks of its first call, and a batch
//! is submitted only between calls, so that an explicit release (`Array::release`) made on
//! another thread either is seen by a call's check or waits for the batch that holds it.
//!
//! # Layouts
//!
//! A tensor may be a view of part of a storage, in any layout (`Tensor::view_layout`). A
//! kernel that says it takes every layout (`OpKernel::strided`: the built-in ones) gets its
//! operands as they are. Any other gets contiguous operands, each its whole storage: before
//! the call the builder copies each input that is not so into a new tensor (the `copy` op,
//! on the call's stream), and lets the kernel write each such output into a new tensor that
//! it then copies into the output. These copies are instructions like any other (a trace
//! records them). A call whose operands are views takes the rule itself.
//!
//! # Tensors of other VMs
//!
//! Every operand must belong to the builder's VM: a tensor of another VM would have its
//! dependences tracked by two schedulers, and its meta id is the other VM's number. The
//! check compares the tensor's reference to its VM with the VM's own
//! (`TensorInner::belongs_to`), one comparison of words on the line the rule's caches read
//! anyway; a foreign operand is refused with [`Error::ForeignTensor`].
//!
//! # Trace replay
//!
//! A trace replayed as recorded writes its instructions exactly as the trace gives them,
//! with no checks and no soft sync, through emitters the builder lends
//! ([`raw`](InstructionsBuilder::raw), `raw.rs`), which are not part of the builder's own
//! API.

mod raw;
mod rule;
#[cfg(test)]
mod rule_tests;
mod soft_sync;

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::StreamType;
use crate::framework::deferred;
use crate::framework::infer_cache::{InferCache, KEY_OPS};
use crate::framework::op::Call;
use crate::framework::release::Slot;
use crate::framework::tensor::Tensor;
use crate::framework::{Attrs, Op, OutSpecs};
use crate::vm::instruction::{AccessSlot, AsObject, Batch};
use crate::vm::tensor::{Fetch, MetaId, Strides, TensorInner, TensorOwner, NO_STREAM};
use crate::vm::KernelRef;
use crate::vm::{Element, Engine, EngineRef, Error, Handoff, Result, StreamId, TensorMeta, VmStream};

pub(crate) use raw::Raw;
use rule::{Checked, Outputs, Scanned};

use super::virtual_machine::{front, new_tensor_with_id, release_batch, submit_releases, Front};

/// The most inputs one call takes (an `OpCall` counts them in a byte).
pub const MAX_INPUTS: usize = u8::MAX as usize;

/// The engine as a builder holds it: borrowed for `'vm` (`VirtualMachine::run`), or through
/// a counted handle of its own (an eager context's builder, kept open between calls).
enum Hold<'vm> {
    Borrowed(&'vm Arc<Engine>),
    Owned(Arc<Engine>),
}

impl std::ops::Deref for Hold<'_> {
    type Target = Arc<Engine>;
    #[inline(always)]
    fn deref(&self) -> &Arc<Engine> {
        match self {
            Hold::Borrowed(e) => e,
            Hold::Owned(e) => e,
        }
    }
}

/// Builds instructions for one [`VirtualMachine::run`](crate::VirtualMachine::run), or, owning
/// its handle of the engine, for an eager context (`InstructionsBuilder::owned`).
pub struct InstructionsBuilder<'vm> {
    vm: Hold<'vm>,
    /// The front end's state of this VM (`virtual_machine::Front`), in the engine `vm`
    /// holds: alive while this builder is.
    front: NonNull<Front>,
    /// The VM's identity, which every operand's must equal (`TensorInner::belongs_to`).
    me: EngineRef,
    /// The VM's streams (`vm.streams`, one load nearer), in the engine `vm` holds (a table
    /// fixed when the engine starts).
    streams: NonNull<[VmStream]>,
    batch: Batch,
    batch_size: usize,
    /// This builder's slot in the VM's release rule (`framework::release`).
    slot: crate::sync::Arc<Slot>,
    /// Whether the slot holds the start of an open batch: from before the checks of the
    /// batch's first call until the batch is in the inbox. Set whenever `batch` is not
    /// empty (it may be open and still empty after a refused call).
    open: bool,
    /// Inference results of calls already checked (kept across builders of this VM).
    infer: Box<InferCache>,
    /// The specs and output meta ids of the last call whose signature was not cached.
    uncached: (OutSpecs, SmallVec<[MetaId; 2]>),
    /// The strides of the outputs the call being built makes, where they are not row-major
    /// (a pointwise op's outputs laid out like its inputs: `layout::pointwise_strides`);
    /// set by the rule, taken when the outputs are made. Never cached: meta ids name
    /// shapes, not layouts, and a call with an input that is not row-major always takes
    /// the rule (`cached_making` refuses it).
    layouts: Vec<Strides>,
    /// This builder's claim on its thread's deferred releases (`framework::deferred`), if
    /// it owns them.
    ownership: Option<deferred::Ownership>,
    /// The deferred releases being made (kept for its capacity).
    deferred: Vec<TensorOwner>,
    /// Tensor ids reserved for this builder's outputs: one atomic instruction per
    /// [`ID_BLOCK`] outputs instead of one per output.
    ids: std::ops::Range<u64>,
}

/// How many tensor ids a builder reserves at once. Ids stay unique within the VM; those a
/// builder did not use are skipped, so ids increase per builder, not across builders.
const ID_BLOCK: u64 = 64;

// SAFETY: the pointers `front` and `streams` point into the engine the builder holds (a
// borrow or a counted handle), whose front end state is `Sync` and whose stream table is
// immutable; everything else the builder holds is `Send`.
unsafe impl Send for InstructionsBuilder<'_> {}

impl<'vm> InstructionsBuilder<'vm> {
    pub(crate) fn new(vm: &'vm Arc<Engine>) -> Self {
        Self::holding(Hold::Borrowed(vm))
    }

    /// A builder that owns a counted handle of `vm`, and so may live as long as its owner
    /// wants: an eager context keeps one open between its calls (`eager::Context`).
    pub(crate) fn owned(vm: Arc<Engine>) -> InstructionsBuilder<'static> {
        InstructionsBuilder::holding(Hold::Owned(vm))
    }

    fn holding(vm: Hold<'vm>) -> Self {
        let f = front(&vm);
        let (front_ptr, streams) = (NonNull::from(f), NonNull::from(vm.streams()));
        InstructionsBuilder {
            me: vm.identity(),
            streams,
            batch: vm.take_batch(),
            batch_size: vm.config().batch_size,
            slot: f.releases.register(),
            open: false,
            infer: f.take_infer_cache(),
            uncached: Default::default(),
            layouts: Vec::new(),
            ownership: deferred::enter(&vm),
            deferred: Vec::new(),
            ids: 0..0,
            front: front_ptr,
            vm,
        }
    }

    /// The engine this builder emits into.
    #[inline]
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        &self.vm
    }

    /// Trace replay's emitters, writing into this builder's batch (`raw.rs`).
    pub(crate) fn raw(&mut self) -> Raw<'_, 'vm> {
        Raw(self)
    }

    /// The front end's state of the VM.
    #[inline(always)]
    fn front(&self) -> &Front {
        // SAFETY: `front` points into the engine `vm` holds, alive while `self` is.
        unsafe { self.front.as_ref() }
    }

    /// The VM's streams.
    #[inline(always)]
    fn streams(&self) -> &[VmStream] {
        // SAFETY: `streams` points to the engine's fixed stream table, in the engine `vm`
        // holds, alive while `self` is.
        unsafe { self.streams.as_ref() }
    }

    /// Call a single-output op with defaults: `call` is an [`Op`] (default attributes, on
    /// the compute stream of the first input's device) or an op with its attributes and
    /// stream ([`Op::with`], [`Op::on`]). A call with no input must name its stream.
    pub fn apply(&mut self, call: impl Into<Call>, inputs: &[&Tensor]) -> Result<Tensor> {
        let Call { op, attrs, stream } = call.into();
        let stream = match (stream, inputs.first()) {
            (Some(s), _) => s,
            (None, Some(t)) => self.vm.stream_of(t.device(), StreamType::Compute)?,
            (None, None) => {
                return Err(Error::InvalidOperands {
                    op: op.name().into(),
                    detail: "has no input to take its stream from: name one with `.on(stream)`".into(),
                })
            }
        };
        self.call(op, inputs, attrs, stream)
    }

    /// Call `op` on `stream`, creating its outputs. Returns them in order.
    pub fn call_multi(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<SmallVec<[Tensor; 2]>> {
        self.open_if_idle();
        let checked = match self.cached_making(&op, inputs, attrs, stream) {
            Some(c) => c,
            None => self.rule(op, inputs, Outputs::Made, &attrs, stream)?,
        };
        if let Some(whole) = self.whole_inputs(checked.kernel, inputs, stream)? {
            let refs: SmallVec<[&Tensor; 4]> = whole.iter().collect();
            return Ok(self.make_and_emit(checked, &refs, attrs, stream));
        }
        Ok(self.make_and_emit(checked, inputs, attrs, stream))
    }

    /// Call a single-output `op` on `stream`, creating its output.
    #[inline]
    pub fn call(&mut self, op: Op, inputs: &[&Tensor], attrs: Attrs, stream: StreamId) -> Result<Tensor> {
        self.open_if_idle();
        // Refuse before emitting anything: a refused call leaves no instruction behind.
        let checked = match self.cached_making(&op, inputs, attrs, stream) {
            Some(c) => c,
            None => self.rule(op, inputs, Outputs::Made, &attrs, stream)?,
        };
        let n = self.outputs_of(checked).0.len();
        if n != 1 {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {n} outputs; use call_multi"),
            });
        }
        let mut outs = match self.whole_inputs(checked.kernel, inputs, stream)? {
            None => self.make_and_emit(checked, inputs, attrs, stream),
            Some(whole) => {
                let refs: SmallVec<[&Tensor; 4]> = whole.iter().collect();
                self.make_and_emit(checked, &refs, attrs, stream)
            }
        };
        // Cannot fail: the checked signature has one output.
        Ok(outs.pop().expect("one output"))
    }

    /// Make the outputs of a checked call (`call`, `call_multi`) on the stream's device and
    /// emit the call.
    #[inline]
    fn make_and_emit(
        &mut self,
        checked: Checked,
        inputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> SmallVec<[Tensor; 2]> {
        // The check found the stream.
        let device = self.streams()[stream.index()].device;
        let outs: SmallVec<[Tensor; 2]> = {
            let n = self.outputs_of(checked).0.len() as u64;
            if (self.ids.end - self.ids.start) < n {
                self.ids = self.vm.reserve_tensor_ids(ID_BLOCK.max(n));
            }
            let first = self.ids.start;
            self.ids.start += n;
            let strides =
                if self.layouts.is_empty() { Vec::new() } else { std::mem::take(&mut self.layouts) };
            let (specs, metas) = self.outputs_of(checked);
            specs
                .iter()
                .zip(metas)
                .zip(first..)
                .enumerate()
                .map(|(i, ((s, &meta_id), id))| {
                    let mut meta = TensorMeta::new(&s.shape, s.dtype, device);
                    match strides.get(i) {
                        None => new_tensor_with_id(&self.vm, id, meta, meta_id, Fetch::No),
                        // A pointwise op's output laid out like its inputs (`rule.rs`).
                        Some(strides) => {
                            meta.strides.clone_from(strides);
                            Tensor::made_strided(id, meta, meta_id, self.vm.identity())
                        }
                    }
                })
                .collect()
        };
        match outs.len() {
            1 => self.emit_call(checked.kernel, inputs, &[&outs[0]], attrs, stream),
            _ => {
                let refs: SmallVec<[&Tensor; 2]> = outs.iter().collect();
                self.emit_call(checked.kernel, inputs, &refs, attrs, stream);
            }
        }
        outs
    }

    /// Call `op` on `stream`, writing into the given `outputs` (which must have the shapes
    /// and dtypes the op produces, and live on the stream's device).
    #[inline(always)]
    pub fn call_into(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        self.open_if_idle();
        // The rule's caches first (`rule.rs`): a call they pass needs no soft sync and no
        // copy, and is written at once.
        if inputs.len() + outputs.len() <= KEY_OPS {
            if let Some(s) = self.cached_into(&op, inputs, outputs, attrs, stream) {
                self.emit_cached(s, inputs, outputs, attrs, stream);
                return Ok(());
            }
        } else if self.call_into_wide(&op, inputs, outputs, attrs, stream) {
            return Ok(());
        }
        self.call_into_by_rule(op, inputs, outputs, attrs, stream)
    }

    /// `call_into` of more than `KEY_OPS` operands through its cache, out of line so that
    /// the narrow call's frame stays small; false, having changed nothing, if the cache
    /// cannot tell.
    #[inline(never)]
    fn call_into_wide(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> bool {
        match self.cached_into_wide(op, inputs, outputs, attrs, stream) {
            Some(s) => {
                self.emit_cached(s, inputs, outputs, attrs, stream);
                true
            }
            None => false,
        }
    }

    /// `call_into` by the rule itself: any number of operands, soft sync, the copies of a
    /// kernel over contiguous operands. Out of line so that the cached call's frame stays
    /// small.
    #[inline(never)]
    fn call_into_by_rule(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        let checked = self.rule(op, inputs, Outputs::Given(outputs), &attrs, stream)?;
        let kernel = checked.kernel;
        if kernel.strided() || inputs.iter().chain(outputs).all(|t| t.is_whole()) {
            self.emit_call(kernel, inputs, outputs, attrs, stream);
            return Ok(());
        }
        // A kernel over contiguous operands (module docs, "Layouts").
        let whole_in = self.whole_inputs(kernel, inputs, stream)?;
        let ins: SmallVec<[&Tensor; 4]> = match &whole_in {
            Some(w) => w.iter().collect(),
            None => inputs.iter().copied().collect(),
        };
        let copy = self.copy_op(stream)?;
        let temps: SmallVec<[Option<Tensor>; 2]> =
            outputs.iter().map(|o| (!o.is_whole()).then(|| self.contiguous_like(o))).collect();
        let outs: SmallVec<[&Tensor; 2]> =
            outputs.iter().zip(&temps).map(|(o, t)| t.as_ref().unwrap_or(o)).collect();
        self.emit_call(kernel, &ins, &outs, attrs, stream);
        for (o, t) in outputs.iter().zip(&temps) {
            if let Some(t) = t {
                self.call_into(copy, &[t], &[o], Attrs::default(), stream)?;
            }
        }
        Ok(())
    }

    /// For a kernel over contiguous operands (`OpKernel::strided` false) given an input that
    /// is not its whole storage: each input as a tensor that is, copied where it is not (on
    /// `stream`). `None` when every input can go as it is.
    fn whole_inputs(
        &mut self,
        kernel: KernelRef,
        inputs: &[&Tensor],
        stream: StreamId,
    ) -> Result<Option<SmallVec<[Tensor; 4]>>> {
        if kernel.strided() || inputs.iter().all(|t| t.is_whole()) {
            return Ok(None);
        }
        let copy = self.copy_op(stream)?;
        let mut whole = SmallVec::new();
        for t in inputs {
            whole.push(match t.is_whole() {
                true => (*t).clone(),
                false => self.call(copy, &[t], Attrs::default(), stream)?,
            });
        }
        Ok(Some(whole))
    }

    /// The `copy` op of `stream`'s device, which must take every layout: the copies that make
    /// operands contiguous are its calls.
    fn copy_op(&self, stream: StreamId) -> Result<Op> {
        let device = self.vm.stream(stream)?.device;
        let copy = self.front().ops.resolve("copy", device)?;
        match copy.kernel(device.ty) {
            Some(k) if k.strided() => Ok(copy),
            _ => Err(Error::InvalidOperands {
                op: "copy".into(),
                detail: format!("the `copy` kernel of {device} takes contiguous tensors only, so it cannot make views contiguous"),
            }),
        }
    }

    /// A new contiguous tensor of `t`'s shape, dtype and device.
    fn contiguous_like(&mut self, t: &Tensor) -> Tensor {
        let meta = TensorMeta::new(t.shape(), t.dtype(), t.device());
        let id = self.vm.next_tensor_id();
        new_tensor_with_id(&self.vm, id, meta.clone(), self.vm.intern(&meta), Fetch::No)
    }

    /// Emit a call that a cache of the rule passed (`rule.rs`, [`Scanned`]): mark its
    /// operands used on `stream` if any was never used (every other one was last used
    /// there), and write the instruction into the batch.
    #[inline(always)]
    fn emit_cached(
        &mut self,
        s: Scanned,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) {
        let Scanned { kernel, first_use } = s;
        if first_use {
            for t in inputs.iter().chain(outputs) {
                t.inner().last_stream.store(stream.0, Ordering::Relaxed);
            }
        }
        // SAFETY: the caller holds a handle of each operand while it builds, and a `Release`
        // of a tensor is submitted only after the batch being built (`framework::release`);
        // at most `WIDE_OPS` operands take this path, so the input count fits its byte.
        unsafe { self.batch.push_call_of(kernel, attrs, stream, inputs, outputs) };
        self.flush_if_full();
    }

    /// Overwrite a host tensor with `data` (a host `Access`).
    pub fn write<T: Element>(&mut self, t: &Tensor, data: &[T]) -> Result<()> {
        self.open_if_idle();
        if !t.inner().belongs_to(self.me) {
            return Err(Error::ForeignTensor { op: "write".into(), tensor: t.id() });
        }
        t.check_live()?;
        if !t.device().is_host() {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!("is on {}; only host tensors are written directly (copy it)", t.device()),
            });
        }
        if !t.is_whole() {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!(
                    "is a view of part of its storage ({}); write a new tensor and copy it in",
                    t.meta().describe()
                ),
            });
        }
        if T::DTYPE != t.dtype() {
            return Err(Error::DType { expected: t.dtype(), found: T::DTYPE });
        }
        if data.len() != t.numel() {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!("has {} elements, {} given", t.numel(), data.len()),
            });
        }
        // The copy the instruction carries is as large as the tensor: allocated fallibly.
        let bytes = T::try_to_bytes(data).map_err(|e| {
            super::tensor::out_of_host_memory(t.id(), std::mem::size_of_val(data), "a copy of the data", e)
        })?;
        let host = self.vm.host_stream();
        self.sync_operands(host, std::iter::once(t.inner()));
        self.open_if_idle();
        // SAFETY: the caller holds `t`'s handle while it builds, and a `Release` of `t` is
        // submitted only after the batch being built (`framework::release`).
        unsafe { self.batch.push_write(t.inner(), host, bytes.into_boxed_slice()) };
        self.flush_if_full();
        Ok(())
    }

    /// Emit a host access that reads `t` (a tensor of this VM: a host tensor that is its
    /// whole storage, or any tensor for `wait_only`) into `slot`, unless `t` has been
    /// released.
    pub(crate) fn read_into(&mut self, t: &Tensor, slot: Arc<AccessSlot>, wait_only: bool) -> Result<()> {
        self.open_if_idle();
        t.check_live()?;
        let host = self.vm.host_stream();
        self.sync_operands(host, std::iter::once(t.inner()));
        self.open_if_idle();
        // SAFETY: as in `write`.
        unsafe { self.batch.push_read(t.inner(), host, slot, wait_only) };
        self.flush_if_full();
        Ok(())
    }

    /// Hand what has been built so far to the VM, then wait for `t`'s values, as
    /// [`Tensor::to_vec`] does after the builder is done. The read goes with the batch: when
    /// nothing else is in flight and everything in the batch runs on the CPU's streams, this
    /// thread runs the batch itself rather than waking the VM's threads and waiting for them
    /// (`docs/architecture.md`, "A waiter runs its own work"). A refused read submits
    /// nothing new and leaves what was built to be handed over later.
    ///
    /// ```
    /// use eagervm::prelude::*;
    ///
    /// let vm = VirtualMachine::new(Config::default())?;
    /// let (add, cpu) = (vm.op("add")?, vm.compute_stream(DeviceId::CPU)?);
    /// let x = vm.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU)?;
    /// let y = vm.run(|b| {
    ///     let y = b.call(add, &[&x, &x], Attrs::default(), cpu)?;
    ///     b.to_vec::<f32>(&y)
    /// })?;
    /// assert_eq!(y, vec![2.0, 4.0]);
    /// # Ok::<(), eagervm::Error>(())
    /// ```
    pub fn to_vec<T: Element>(&mut self, t: &Tensor) -> Result<Vec<T>> {
        if T::DTYPE != t.dtype() {
            return Err(Error::DType { expected: t.dtype(), found: T::DTYPE });
        }
        let slot =
            super::virtual_machine::build_host_access(self, t, super::virtual_machine::HostAccess::Read)?;
        self.flush_for_wait().finish();
        let bytes = self.vm.wait_access(&slot)?;
        t.values_of(&bytes)
    }

    /// Hand what has been built so far to the scheduler now.
    pub fn flush(&mut self) {
        if !self.batch.is_empty() {
            let batch = std::mem::replace(&mut self.batch, self.vm.take_batch());
            self.vm.submit(batch);
        }
        if self.open {
            // Now that the batch is in the inbox, releases waiting for it may follow it.
            self.open = false;
            let ready = self.front().releases.close(&self.slot);
            submit_releases(&self.vm, ready);
        }
        // Dropping the owners' handles that views' releases handed back may release those
        // owners, which this thread defers to this builder again: made in the same flush.
        loop {
            self.make_deferred_releases();
            if !super::tensor::drop_handed_bases() {
                break;
            }
        }
    }

    /// [`flush`](Self::flush) for a caller that waits next for the batch's last instruction
    /// (a host access): the VM, if idle, runs the batch and the releases that follow it on
    /// the caller's thread once the returned hand-off is finished (`vm::Handoff`).
    pub(crate) fn flush_for_wait(&mut self) -> Handoff<'vm> {
        let batch = std::mem::replace(&mut self.batch, self.vm.take_batch());
        // The hand-off holds the engine as this builder does: borrowed for `'vm`, or through a
        // counted handle of its own.
        let mut h = match &self.vm {
            Hold::Borrowed(e) => e.submit_for_wait(batch),
            Hold::Owned(e) => e.submit_for_wait_owned(batch),
        };
        if self.open {
            self.open = false;
            let ready = self.front().releases.close(&self.slot);
            if let Some(b) = release_batch(&self.vm, ready) {
                h.follow(b);
            }
        }
        if let Some(b) = self.deferred_releases() {
            h.follow(b);
        }
        h
    }

    /// Make the releases this thread deferred for this VM (`framework::deferred`), all at
    /// once, after this builder's batch is in the inbox.
    fn make_deferred_releases(&mut self) {
        if let Some(b) = self.deferred_releases() {
            self.vm.submit_unbounded(b);
        }
    }

    /// The batch of the releases this thread deferred for this VM, if any.
    fn deferred_releases(&mut self) -> Option<Batch> {
        deferred::take(&self.vm, &mut self.deferred);
        if self.deferred.is_empty() {
            return None;
        }
        // SAFETY: `front` points into the engine `vm` holds, alive while `self` is; borrowed
        // apart from the fields the closure uses.
        let front = unsafe { self.front.as_ref() };
        let (vm, mut b) = (&self.vm, None);
        front.releases.release_all(self.deferred.drain(..), |t| {
            push_release(b.get_or_insert_with(|| vm.take_batch()), t)
        });
        b
    }

    /// Before a call's checks, if no batch is open: tell the release rule a batch is open.
    ///
    /// The checks come after the opening, and the instructions of the call go into the
    /// batch opened before them: so an operand found live here has its `Release` held
    /// back until this batch is in the inbox, even if another thread releases it
    /// explicitly (`Array::release`) right after the check (`framework::release`, "Explicit
    /// releases").
    #[inline]
    fn open_if_idle(&mut self) {
        if !self.open {
            self.open = true;
            self.front().releases.open(&self.slot);
        }
    }

    /// After a call (or another operation): submit the batch once it is full.
    #[inline]
    fn flush_if_full(&mut self) {
        if self.batch.len() >= self.batch_size {
            self.flush();
        }
    }

    /// Emit an `OpCall` (after the rule), written where it lies in the batch
    /// (`Batch::push_call_of`): nothing as large as an instruction or an operand list is
    /// built on the stack and copied.
    #[inline]
    fn emit_call(
        &mut self,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) {
        self.sync_operands(stream, inputs.iter().chain(outputs).map(|t| t.inner()));
        self.open_if_idle();
        // SAFETY: the caller holds a handle of each operand while it builds, and a `Release`
        // of a tensor is submitted only after the batch being built (`framework::release`);
        // `check` refused more than `MAX_INPUTS` inputs.
        unsafe { self.batch.push_call_of(kernel, attrs, stream, inputs, outputs) };
        self.flush_if_full();
    }
}

impl Drop for InstructionsBuilder<'_> {
    fn drop(&mut self) {
        self.flush();
        if let Some(o) = self.ownership.take() {
            o.leave();
        }
        self.front().releases.unregister(&self.slot);
        let empty = std::mem::take(&mut self.batch);
        self.vm.recycle(empty);
        let infer = std::mem::take(&mut self.infer);
        self.front().recycle_infer_cache(infer);
    }
}

impl AsObject for Tensor {
    #[inline(always)]
    fn object(&self) -> &TensorInner {
        self.inner()
    }
}

/// Append the `Release` of `t` to `batch`, on the stream that used it last; nothing (and `t`
/// is dropped) if nothing ever used it. A view's handle of its owner is handed back to be
/// dropped once this thread has submitted the batch (`framework::tensor::hand_back_later`),
/// so that the owner's `Release` follows the view's.
pub(crate) fn push_release(batch: &mut Batch, t: TensorOwner) {
    let base = super::tensor::hand_off_base(&t);
    let last = t.last_stream.load(Ordering::Relaxed);
    if last != NO_STREAM {
        batch.push_release(t, StreamId(last));
    }
    if let Some(base) = base {
        super::tensor::hand_back_later(base);
    }
}

#[cfg(test)]
mod tests {
    use crate::prelude::*;

    /// A loop of 24 distinct signatures through `call`, as the MLP step has: after the
    /// first pass every call finds its signature in the cache. (A cache of 8 entries
    /// replaced round-robin checked every call of such a loop in full.)
    #[test]
    fn a_loop_of_24_signatures_is_checked_once() {
        let vm = VirtualMachine::new(Config::default()).unwrap();
        let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
        let ops = ["add", "sub", "mul"].map(|o| vm.op(o).unwrap());
        let (scale, relu) = (vm.op("scale").unwrap(), vm.op("relu").unwrap());
        // Eight shapes, three ops on each: 24 signatures.
        let xs: Vec<Tensor> =
            (1..=8).map(|n| vm.from_slice(&vec![1.0f32; n], &[n], DeviceId::CPU).unwrap()).collect();
        vm.run(|b| {
            let mut after_first = 0;
            for pass in 0..5 {
                for x in &xs {
                    for op in ops {
                        let y = b.call(op, &[x, x], Attrs::default(), cpu).unwrap();
                        drop(y);
                    }
                }
                if pass == 0 {
                    after_first = b.infer.inserted();
                }
            }
            assert_eq!(after_first, 24);
            assert_eq!(b.infer.inserted(), 24, "later passes found every signature");
            // Attributes and ops are part of the signature.
            let y = b.call(scale, &[&xs[0]], Attrs::scalar(2.0), cpu).unwrap();
            let z = b.call(scale, &[&y], Attrs::scalar(3.0), cpu).unwrap();
            let w = b.call(relu, &[&z], Attrs::default(), cpu).unwrap();
            assert_eq!(b.infer.inserted(), 27);
            w
        });
        vm.sync().unwrap();
    }
}
