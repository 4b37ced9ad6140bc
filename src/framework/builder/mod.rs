//! `InstructionsBuilder`: turns op calls into instructions, with soft sync.
//!
//! A builder is lent to the closure of [`VirtualMachine::run`](crate::VirtualMachine::run).
//! Each call is checked (op known on the stream's device, operand count, shapes and dtypes
//! through the kernel's `infer`, devices, aliasing, released tensors) and refused with a
//! typed [`Error`] before anything is emitted; an accepted call appends instructions to a
//! local batch without taking any lock. Every `batch_size` instructions, and when the
//! closure returns, the batch is spliced into the scheduler's inbox in O(1).
//!
//! # The cost of a call
//!
//! A call whose signature (kernel, stream, attributes, and each operand's interned meta:
//! shape, dtype, device) was checked before by this VM's builders passes on a comparison of
//! a few words (`InferCache`). (Checking a signature includes the size check of every
//! output the call makes, `framework::shape`, so a cached call does not repeat it.) Only
//! the checks that depend on the tensors' identity and state (released, aliased) run on
//! every call. The common `call_into` (at most sixteen operands, a cached signature, no
//! soft sync) does all of it in one pass over its
//! operands (`fast_call`); every other call takes the full path, which gives a refused
//! call its typed error. The instruction is written once, into the batch. Nothing per call
//! is allocated, locked or counted: tensors are not kept alive by a handle per use
//! (`framework::release` says why none is needed).
//!
//! # Soft sync
//!
//! Following OneFlow's `SoftSyncStream`, every tensor remembers the stream that last used
//! it. When a call uses it on another stream, the builder first emits, per source stream:
//! - both streams on one device that supports device-side waits: a `RecordEvent` on the
//!   source stream (reading the tensors) and a `StreamWaitEvent` on the target stream, so
//!   that the target waits on the device and the host never blocks;
//! - an asynchronous source stream otherwise (device → host or another device): a
//!   `RecordEvent` on the source stream, which the host-side consumer waits for;
//! - a synchronous source (the CPU): nothing, its work is done when it is launched.
//!
//! The scheduler's dependence rules alone already make every program correct; soft sync
//! lets the device do the waiting where it can.
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
//! records them). A call whose operands are views takes the full path.
//!
//! # Tensors of other VMs
//!
//! Every operand must belong to the builder's VM: a tensor of another VM would have its
//! dependences tracked by two schedulers, and its meta id is the other VM's number. The
//! check compares the tensor's reference to its VM with the VM's own
//! (`TensorInner::belongs_to`), one comparison of words on the line the fast path reads
//! anyway; a foreign operand is refused with [`Error::ForeignTensor`].

use std::ptr::NonNull;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::DeviceId;
use crate::ep::StreamType;
use crate::framework::deferred;
use crate::framework::infer_cache::{InferCache, Key, WideKey, KEY_OPS, WIDE_OPS};
use crate::framework::layout;
use crate::framework::op::Call;
use crate::framework::release::Slot;
use crate::framework::tensor::Tensor;
use crate::framework::{Attrs, Op, OutSpecs};
use crate::vm::instruction::{AccessSlot, AsObject, Batch};
use crate::vm::shape;
use crate::vm::tensor::{Fetch, MetaId, TensorInner, TensorOwner, NO_STREAM};
use crate::vm::KernelRef;
use crate::vm::{Element, Engine, EngineRef, Error, Handoff, Result, StreamId, TensorMeta, VmStream};

use super::virtual_machine::{front, new_tensor_with_id, release_batch, submit_releases, Front};

/// The most inputs one call takes (an `OpCall` counts them in a byte).
pub const MAX_INPUTS: usize = u8::MAX as usize;

/// Tensors a call uses that were last used on one other stream (soft sync): that stream's
/// index and the tensors.
type SyncGroup<'t> = (u32, SmallVec<[&'t TensorInner; 4]>);

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

/// What a checked call produces: its kernel, and where its outputs' specs are.
#[derive(Clone, Copy)]
struct Checked {
    kernel: KernelRef,
    /// The inference cache entry; `None`: `uncached`.
    entry: Option<usize>,
}

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
        let checked = match self.fast_check_making(&op, inputs, attrs, stream) {
            Some(c) => c,
            None => self.check(op, inputs, &[], &attrs, stream)?,
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
        let checked = match self.fast_check_making(&op, inputs, attrs, stream) {
            Some(c) => c,
            None => self.check(op, inputs, &[], &attrs, stream)?,
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

    /// The check of a call whose outputs the builder makes (`call`, `call_multi`), in one
    /// pass over its inputs, for the common case: at most [`KEY_OPS`] inputs, all of this
    /// VM, none released, and a signature in the inference cache. Returns `None`, having
    /// changed nothing, for any other call, which [`check`](Self::check) then checks in full
    /// (and refuses, if it must). Inputs last used on another stream pass: the emission
    /// (`emit_call`) adds the soft sync. The caller has opened the batch.
    #[inline(always)]
    fn fast_check_making(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Option<Checked> {
        let n = inputs.len();
        if n > KEY_OPS {
            return None;
        }
        let s = self.streams().get(stream.index())?;
        let kernel = op.kernel_ref(s.device.ty)?;
        let mut ids = [MetaId(0); KEY_OPS];
        let mut refused = false;
        for (id, t) in ids.iter_mut().zip(inputs) {
            let t = t.inner();
            *id = t.meta_id;
            // Views go the full way: a kernel may need them copied (module docs, "Layouts").
            refused |= t.released.load(Ordering::Relaxed) | !t.belongs_to(self.me) | t.is_view();
        }
        if refused {
            return None;
        }
        let entry = self.infer.find(&Key::new(kernel, stream.0, &attrs, n, n, &ids))?;
        Some(Checked { kernel, entry: Some(entry) })
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
            let (specs, metas) = self.outputs_of(checked);
            specs
                .iter()
                .zip(metas)
                .zip(first..)
                .map(|((s, &meta_id), id)| {
                    let meta = TensorMeta::new(&s.shape, s.dtype, device);
                    new_tensor_with_id(&self.vm, id, meta, meta_id, Fetch::No)
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
        self.call_into_as(op, inputs, outputs, attrs, stream)
    }

    /// `call_into`: the fast path, else the full one.
    #[inline(always)]
    fn call_into_as(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        self.open_if_idle();
        if self.fast_call(&op, inputs, outputs, attrs, stream) {
            return Ok(());
        }
        self.call_into_checked(op, inputs, outputs, attrs, stream)
    }

    /// `call_into` by the full path: every check, soft sync, any number of operands. Kept
    /// out of line so that the fast path's frame stays small.
    #[inline(never)]
    fn call_into_checked(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        let checked = self.check(op, inputs, outputs, &attrs, stream)?;
        // A signature cached by `call` (whose outputs the builder makes) matches a
        // `call_into` of the same inputs and no outputs: compare the counts here.
        let produced = self.outputs_of(checked).0.len();
        if produced != outputs.len() {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("produces {produced} outputs, {} given", outputs.len()),
            });
        }
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

    /// The common `call_into`, checked and emitted with one pass over its operands: at most
    /// [`WIDE_OPS`] operands, at least one of them an output (a cached signature with none
    /// may be `call`'s, whose outputs the builder made), all of this VM, none released or
    /// aliased or last used on another stream, and a signature in the inference cache
    /// (whose meta ids are this VM's, so only this VM's tensors may be looked up in it). The
    /// caller has opened the batch. Each operand's VM, identity, state and meta id lie in
    /// one line of its tensor, read once. Returns false, having changed nothing, for any
    /// other call, which the full path then checks (and refuses, if it must) and emits. A
    /// signature of at most [`KEY_OPS`] operands is found by its packed key; a wider one
    /// ([`fast_call_wide`](Self::fast_call_wide), out of line) by its longer [`WideKey`].
    #[inline(always)]
    fn fast_call(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> bool {
        let (n_in, n) = (inputs.len(), inputs.len() + outputs.len());
        if outputs.is_empty() {
            return false;
        }
        if n > KEY_OPS {
            return self.fast_call_wide(op, inputs, outputs, attrs, stream);
        }
        let Some(s) = self.streams().get(stream.index()) else { return false };
        let Some(kernel) = op.kernel_ref(s.device.ty) else { return false };
        let mut ids = [MetaId(0); KEY_OPS];
        let Some(first_use) = scan_operands::<false>(&mut ids, inputs, outputs, stream.0, self.me) else {
            return false;
        };
        if self.infer.find(&Key::new(kernel, stream.0, &attrs, n_in, n, &ids)).is_none() {
            return false;
        }
        self.emit_scanned(kernel, inputs, outputs, attrs, stream, first_use);
        true
    }

    /// [`fast_call`](Self::fast_call) for a call of more than [`KEY_OPS`] operands. (Its
    /// first lines repeat `fast_call`'s: one generic function for both, taking the lookup
    /// as a closure, made the narrow path slower per call: `docs/performance.md`, "Why the
    /// hot paths are shaped so", has the measurement.)
    #[inline(never)]
    fn fast_call_wide(
        &mut self,
        op: &Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> bool {
        let n = inputs.len() + outputs.len();
        if n > WIDE_OPS {
            return false;
        }
        let Some(s) = self.streams().get(stream.index()) else { return false };
        let Some(kernel) = op.kernel_ref(s.device.ty) else { return false };
        let mut ids = [MetaId(0); WIDE_OPS];
        let Some(first_use) = scan_operands::<true>(&mut ids, inputs, outputs, stream.0, self.me) else {
            return false;
        };
        if self.infer.find_wide(&WideKey::new(kernel, stream.0, &attrs, inputs.len(), n, &ids)).is_none() {
            return false;
        }
        self.emit_scanned(kernel, inputs, outputs, attrs, stream, first_use);
        true
    }

    /// Emit a call that [`scan_operands`] passed, with a cached signature: mark its
    /// operands used on `stream` if any was never used (`first_use`; every other one was
    /// last used there), and write the instruction into the batch.
    #[inline(always)]
    fn emit_scanned(
        &mut self,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
        first_use: bool,
    ) {
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
        self.write_checked(t, data)
    }

    fn write_checked<T: Element>(&mut self, t: &Tensor, data: &[T]) -> Result<()> {
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
        // SAFETY: as in `write_checked`.
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

    /// Check a call (module docs); returns its kernel and where its output specs are. The
    /// common case, a signature already in the inference cache, takes one pass over the
    /// operands and no allocation. Opens the batch first (`open_if_idle`).
    #[inline]
    fn check(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: &Attrs,
        stream: StreamId,
    ) -> Result<Checked> {
        self.open_if_idle();
        let device = self.vm.stream(stream)?.device;
        let Some(kernel) = op.kernel_ref(device.ty) else {
            return Err(self.front().unknown_op(op.name(), device));
        };
        if inputs.len() > MAX_INPUTS {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {} inputs; a call takes at most {MAX_INPUTS}", inputs.len()),
            });
        }
        for t in inputs.iter().chain(outputs) {
            // Before the inference cache is asked: its meta ids are this VM's.
            if !t.inner().belongs_to(self.me) {
                return Err(Error::ForeignTensor { op: op.name().into(), tensor: t.id() });
            }
            t.check_live()?;
        }
        check_outputs(op, kernel, inputs, outputs)?;
        // A signature checked before passes again: the device rule and `infer` are
        // functions of it alone, and it passed them then (only passing calls are cached).
        let ids = inputs.iter().chain(outputs).map(|t| t.inner().meta_id);
        let found = match Key::of(kernel, stream.0, attrs, inputs.len(), ids.clone()) {
            Some(key) => self.infer.find(&key),
            None => self.infer.get(kernel, stream.0, attrs, inputs.len(), ids),
        };
        match found {
            Some(entry) => Ok(Checked { kernel, entry: Some(entry) }),
            None => self.check_uncached(op, kernel, inputs, outputs, attrs, stream, device),
        }
    }

    /// The output specs and meta ids of a checked call.
    fn outputs_of(&self, c: Checked) -> (&OutSpecs, &[MetaId]) {
        match c.entry {
            Some(i) => self.infer.outputs(i),
            None => (&self.uncached.0, &self.uncached.1),
        }
    }

    /// Check devices and run the kernel's `infer` for a signature not in the cache, compare
    /// the given outputs with it, and cache it if it passes.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn check_uncached(
        &mut self,
        op: Op,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: &Attrs,
        stream: StreamId,
        device: DeviceId,
    ) -> Result<Checked> {
        let n = inputs.len() + outputs.len();
        let on_device = inputs.iter().chain(outputs).filter(|t| t.device() == device).count();
        // A copy needs one end on the stream's device: a given output there, or, with no
        // outputs given (`call`), the output the call makes there.
        if on_device < n && !kernel.cross_device() || on_device == 0 && !outputs.is_empty() {
            return Err(wrong_device(op, kernel, inputs, outputs, device));
        }
        let name = || op.name().to_string();
        let in_metas: SmallVec<[&TensorMeta; 8]> = inputs.iter().map(|t| t.meta()).collect();
        let given: SmallVec<[&TensorMeta; 2]> = outputs.iter().map(|t| t.meta()).collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&in_metas, &given, attrs, &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: name(), detail })?;
        // Every output the call would create passes the one size check (`framework::shape`)
        // here, before the signature is cached: a cached call makes outputs of the same
        // shapes, so it needs no check. Given outputs must equal these (below).
        let limit = self.vm.config().max_tensor_bytes;
        for (i, s) in specs.iter().enumerate() {
            shape::check(&s.shape, s.dtype, limit, || format!("output {i} of `{}` on {device}", op.name()))?;
        }
        if !outputs.is_empty() {
            if specs.len() != outputs.len() {
                return Err(Error::InvalidOperands {
                    op: name(),
                    detail: format!("produces {} outputs, {} given", specs.len(), outputs.len()),
                });
            }
            for (i, (s, t)) in specs.iter().zip(outputs).enumerate() {
                if s.shape != t.meta().shape || s.dtype != t.dtype() {
                    let want = TensorMeta::new(&s.shape, s.dtype, device);
                    return Err(Error::OutputMismatch {
                        op: name(),
                        index: i,
                        expected: want.describe(),
                        found: t.meta().describe(),
                    });
                }
            }
        }
        let out_ids: SmallVec<[MetaId; 2]> =
            specs.iter().map(|s| self.vm.intern(&TensorMeta::new(&s.shape, s.dtype, device))).collect();
        let ids: SmallVec<[MetaId; 4]> = inputs.iter().chain(outputs).map(|t| t.inner().meta_id).collect();
        match self.infer.insert(kernel, stream.0, attrs, inputs.len(), ids, specs.clone(), out_ids.clone()) {
            Some(i) => Ok(Checked { kernel, entry: Some(i) }),
            None => {
                self.uncached = (specs, out_ids);
                Ok(Checked { kernel, entry: None })
            }
        }
    }

    /// Emit an `OpCall` (after `check`), written where it lies in the batch
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

    /// Mark `tensors` used on `stream`, with no soft sync: for trace replay without
    /// `--resync`, where the trace (validated beforehand) carries its own
    /// `RecordEvent`/`StreamWaitEvent` instructions.
    fn mark_raw<'t>(&mut self, stream: StreamId, tensors: impl Iterator<Item = &'t Tensor>) {
        self.open_if_idle();
        for t in tensors {
            t.inner().last_stream.store(stream.0, Ordering::Relaxed);
            t.inner().owner().last_stream.store(stream.0, Ordering::Relaxed);
        }
    }

    /// Emit an `OpCall` exactly as given: no checks and no soft sync (trace replay, as
    /// [`mark_raw`](Self::mark_raw) says). At most [`MAX_INPUTS`] inputs.
    pub(crate) fn emit_raw_call(
        &mut self,
        kernel: KernelRef,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) {
        self.mark_raw(stream, inputs.iter().chain(outputs).copied());
        // SAFETY: the replay holds every tensor's handle until it emits the tensor's
        // `Release`, after this batch.
        unsafe { self.batch.push_call_of(kernel, attrs, stream, inputs, outputs) };
        self.flush_if_full();
    }

    /// Emit a `RecordEvent` of event `id` on `stream` after `tensors`' uses, as given.
    pub(crate) fn emit_raw_record(&mut self, id: u64, stream: StreamId, tensors: &[&Tensor]) {
        self.mark_raw(stream, tensors.iter().copied());
        // SAFETY: as in `emit_raw_call`.
        unsafe { self.batch.push_record_event(id, stream, tensors.iter().map(|t| t.inner())) };
        self.flush_if_full();
    }

    /// Emit a `StreamWaitEvent` on `stream` for event `id`, as given.
    pub(crate) fn emit_raw_wait(&mut self, id: u64, stream: StreamId) {
        self.open_if_idle();
        self.batch.push_stream_wait(id, stream);
        self.flush_if_full();
    }

    /// Emit `t`'s `Release` on `stream`, as given; `t` is marked released, so that dropping
    /// its handles emits nothing more.
    pub(crate) fn emit_raw_release(&mut self, t: &Tensor, stream: StreamId) {
        self.mark_raw(stream, std::iter::once(t));
        t.inner().released.store(true, Ordering::Relaxed);
        let base = super::tensor::hand_off_base(t.inner());
        self.batch.push_release(TensorOwner::counted(t.inner()), stream);
        if let Some(base) = base {
            super::tensor::hand_back_later(base);
        }
        self.flush_if_full();
    }

    /// Emit a host write of `bytes` into `t` on `stream`, as given.
    pub(crate) fn emit_raw_write(&mut self, t: &Tensor, bytes: Box<[u8]>, stream: StreamId) {
        self.mark_raw(stream, std::iter::once(t));
        // SAFETY: as in `emit_raw_call`.
        unsafe { self.batch.push_write(t.inner(), stream, bytes) };
        self.flush_if_full();
    }

    /// Emit a host read (`wait_only`: of the error state) of `t` into `slot` on `stream`, as
    /// given.
    pub(crate) fn emit_raw_read(
        &mut self,
        t: &Tensor,
        stream: StreamId,
        slot: Arc<AccessSlot>,
        wait_only: bool,
    ) {
        self.mark_raw(stream, std::iter::once(t));
        // SAFETY: as in `emit_raw_call`.
        unsafe { self.batch.push_read(t.inner(), stream, slot, wait_only) };
        self.flush_if_full();
    }

    /// Soft sync before an instruction on `stream` that uses `tensors` (module docs): emit
    /// the synchronisation for the storages of those last used on other streams, and mark
    /// them all used on `stream`. A view's storage is its owner's: the owner keeps the
    /// storage's last stream, the view its own (where its `Release` goes).
    #[inline]
    fn sync_operands<'t>(
        &mut self,
        stream: StreamId,
        tensors: impl Iterator<Item = &'t TensorInner> + Clone,
    ) {
        let me = stream.0;
        let mut foreign = false;
        for t in tensors.clone() {
            let o = t.owner();
            let last = o.last_stream.load(Ordering::Relaxed);
            if last != me {
                foreign |= last != NO_STREAM;
                if !foreign {
                    o.last_stream.store(me, Ordering::Relaxed);
                }
            }
            if t.is_view() {
                t.last_stream.store(me, Ordering::Relaxed);
            }
        }
        if foreign {
            self.soft_sync(stream, tensors.clone().map(TensorInner::owner));
            for t in tensors {
                t.owner().last_stream.store(me, Ordering::Relaxed);
            }
        }
    }

    /// Emit the synchronisation for storages (their owners, `tensors`) last used on other
    /// streams (module docs).
    #[cold]
    fn soft_sync<'t>(&mut self, me: StreamId, tensors: impl Iterator<Item = &'t TensorInner>) {
        let mut groups: SmallVec<[SyncGroup<'_>; 2]> = SmallVec::new();
        for t in tensors {
            let last = t.last_stream.load(Ordering::Relaxed);
            if last == me.0 || last == NO_STREAM {
                continue;
            }
            match groups.iter_mut().find(|(s, _)| *s == last) {
                Some((_, g)) => {
                    if !g.iter().any(|x| std::ptr::eq(*x, t)) {
                        g.push(t)
                    }
                }
                None => groups.push((last, SmallVec::from_iter([t]))),
            }
        }
        self.open_if_idle();
        for (src, reads) in groups {
            // Both are streams of this VM: `me` passed `check` (or is the host stream), and
            // `src` is the `last_stream` of a tensor of this VM, set by one of its builders
            // (a tensor of another VM is refused before it gets here).
            let (s, t) = (&self.streams()[src as usize], &self.streams()[me.index()]);
            let (device_waits, asynchronous) =
                (s.device == t.device && s.device_waits, s.policy.is_asynchronous());
            let id = self.vm.next_event_id();
            // SAFETY: the caller holds a handle of each tensor while it builds (a view's
            // handle keeps its owner), and a `Release` of one is submitted only after the
            // batch being built.
            if device_waits {
                unsafe { self.batch.push_record_event(id, StreamId(src), reads.into_iter()) };
                self.batch.push_stream_wait(id, me);
            } else if asynchronous {
                unsafe { self.batch.push_record_event(id, StreamId(src), reads.into_iter()) };
            }
        }
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

/// The checks of a call's outputs against its other operands (`check`), by storage: an
/// output that is exactly an input's elements is allowed to a kernel that works in place
/// ([`Error::Aliased`] otherwise); one that overlaps an input other than element for element,
/// or names an element twice, is refused ([`Error::Overlap`]), as are two outputs of one
/// storage; one that shares its storage with an input at other elements is allowed.
fn check_outputs(op: Op, kernel: KernelRef, inputs: &[&Tensor], outputs: &[&Tensor]) -> Result<()> {
    let aliased = |o: &Tensor| Error::Aliased { op: op.name().into(), tensor: o.id() };
    for (i, o) in outputs.iter().enumerate() {
        let (oi, om) = (o.inner(), o.meta());
        if layout::has_internal_overlap(om) {
            return Err(Error::Overlap {
                op: op.name().into(),
                output: o.id(),
                detail: format!("writes some of its elements more than once ({})", om.describe()),
            });
        }
        if outputs[..i].iter().any(|t| std::ptr::eq(t.inner().owner(), oi.owner())) {
            return Err(aliased(o));
        }
        for t in inputs.iter().filter(|t| std::ptr::eq(t.inner().owner(), oi.owner())) {
            // Elements the output shares with no input, or that cannot be told from the
            // layouts (PyTorch lets those through too), are the kernel's to read and write
            // in its order: a kernel over contiguous operands never sees such a pair, as one
            // of the two is a view that the builder copies (module docs, "Layouts").
            match layout::overlap(t.meta(), om) {
                layout::Overlap::Same if kernel.in_place() => {}
                layout::Overlap::Same => return Err(aliased(o)),
                layout::Overlap::None | layout::Overlap::Unknown => {}
                layout::Overlap::Partial => {
                    return Err(Error::Overlap {
                        op: op.name().into(),
                        output: o.id(),
                        detail: format!(
                            "({}) overlaps input tensor {} ({}) in their storage",
                            om.describe(),
                            t.id(),
                            t.meta().describe()
                        ),
                    })
                }
            }
        }
    }
    Ok(())
}

/// The error for a call with an operand on the wrong device: the first operand off the
/// stream's device (or, for a copy, the first operand, when none is on it).
#[cold]
fn wrong_device(
    op: Op,
    kernel: KernelRef,
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    device: DeviceId,
) -> Error {
    let mut all = inputs.iter().chain(outputs);
    let t = if kernel.cross_device() {
        all.next().expect("a copy with no operands has none on the device: checked by the caller")
    } else {
        all.find(|t| t.device() != device).expect("some operand is off the device")
    };
    Error::WrongDevice {
        op: op.name().into(),
        tensor: t.id(),
        tensor_device: t.device(),
        stream_device: device,
    }
}

/// One pass over a call's operands for the fast path: their meta ids into `ids` (inputs,
/// then outputs; `ids` has room for them all), and whether the call can take the fast path
/// on stream `me` of the VM `vm`: `None` if an operand belongs to another VM, is released,
/// was last used on another stream (soft sync needed), or an output aliases another
/// operand; otherwise whether any operand is used for the first time. `WIDE`: for
/// [`fast_call_wide`](InstructionsBuilder::fast_call_wide), whose operand counts are not known
/// where it is compiled.
///
/// The pass asks one question per operand: is it this VM's, live, and last used on `me`?
/// Any other answer (a tensor never used is the one that passes) sends the call to
/// [`scan_unusual`], which asks again, operand by operand. A loop's calls find their
/// operands last used on their own stream, so the common pass keeps no second flag.
#[inline(always)]
fn scan_operands<const WIDE: bool>(
    ids: &mut [MetaId],
    inputs: &[&Tensor],
    outputs: &[&Tensor],
    me: u32,
    vm: EngineRef,
) -> Option<bool> {
    let mut unusual = false;
    let mut scan = |id: &mut MetaId, t: &&Tensor| {
        let t = t.inner();
        *id = t.meta_id;
        // The VM's identity lies in the line the other fields come from: one more
        // comparison, folded into the same flag (a foreign operand is refused by the full
        // path, before its meta id, another VM's number, meets the inference cache).
        // A view goes the full way too: its storage's soft-sync state and aliasing are its
        // owner's (`check`, `sync_operands`).
        unusual |= t.released.load(Ordering::Relaxed)
            | (t.last_stream.load(Ordering::Relaxed) != me)
            | !t.belongs_to(vm)
            | t.is_view();
    };
    if WIDE {
        // Inputs, then outputs, each a loop of its own: one loop over the two chained
        // tests which half it is in on every operand. (A narrow call's operand counts are
        // known where it is inlined, and its chained loop unrolls to fewer instructions
        // than the split one.)
        let (in_ids, out_ids) = ids.split_at_mut(inputs.len().min(ids.len()));
        in_ids.iter_mut().zip(inputs).for_each(|(id, t)| scan(id, t));
        out_ids.iter_mut().zip(outputs).for_each(|(id, t)| scan(id, t));
    } else {
        ids.iter_mut().zip(inputs.iter().chain(outputs)).for_each(|(id, t)| scan(id, t));
    }
    // Every pair compared, with no early exit: a loop that stops at the first match ends on
    // a branch that is mispredicted once per call.
    let mut aliased = false;
    for (i, o) in outputs.iter().enumerate() {
        aliased |=
            inputs.iter().chain(&outputs[..i]).fold(false, |a, t| a | std::ptr::eq(t.inner(), o.inner()));
    }
    match (aliased, unusual) {
        (true, _) => None,
        (false, false) => Some(false),
        (false, true) => scan_unusual(inputs, outputs, me, vm),
    }
}

/// [`scan_operands`]'s answer for a call one of whose operands is not a live tensor of
/// this VM last used on `me`: `Some(true)` if each such operand is a live tensor (not a
/// view) of this VM that nothing has used yet, else `None`.
#[cold]
#[inline(never)]
fn scan_unusual(inputs: &[&Tensor], outputs: &[&Tensor], me: u32, vm: EngineRef) -> Option<bool> {
    let passes = inputs.iter().chain(outputs).all(|t| {
        let t = t.inner();
        let last = t.last_stream.load(Ordering::Relaxed);
        !t.released.load(Ordering::Relaxed)
            && t.belongs_to(vm)
            && !t.is_view()
            && (last == me || last == NO_STREAM)
    });
    passes.then_some(true)
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
