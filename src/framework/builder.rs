//! `InstructionsBuilder`: turns op calls into instructions, with soft sync.
//!
//! A builder is lent to the closure of [`VirtualMachine::run`](crate::vm::VirtualMachine::run).
//! Each call is checked (op known on the stream's device, operand count, shapes and dtypes
//! through the kernel's `infer`, devices, aliasing, released tensors) and refused with a
//! typed [`Error`] before anything is emitted; an accepted call appends instructions to a
//! local batch without taking any lock. Every `batch_size` instructions, and when the
//! closure returns, the batch is spliced into the scheduler's inbox in O(1).
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
//! Dropping the last handle of a tensor inside a `run` closure queues its `Release` on the
//! builder of that thread, so it lands after the instructions already built that use it.
//! Outside any `run`, the `Release` is submitted at once.
//!
//! A builder holds a handle of each tensor its unsubmitted batch uses, and drops them just
//! after submitting the batch. So no thread can drop a tensor's last handle while a builder
//! anywhere still has unsubmitted uses of it: the last handle drops here, after the batch,
//! and the `Release` follows the batch.

use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use smallvec::SmallVec;

use crate::ep::DeviceId;
use crate::error::{Error, Result};
use crate::framework::infer_cache::InferCache;
use crate::framework::tensor::{Element, Tensor, TensorInner, TensorMeta, TensorOwner, NO_STREAM};
use crate::framework::{Attrs, Op, OpKernel, OutSpecs};
use crate::vm::instruction::{
    AccessMode, AccessSlot, HostAccess, InstrKind, Instruction, Operand, Operands, TensorPtr,
};
use crate::vm::{StreamId, VmShared};

thread_local! {
    /// Per thread: the VMs with a builder active here (innermost last), each with the
    /// tensors whose `Release` waits for that builder's next flush.
    static ACTIVE: RefCell<Vec<(usize, Vec<TensorOwner>)>> = const { RefCell::new(Vec::new()) };
}

/// Queue `t`'s release on this thread's active builder for `vm`, if there is one.
/// Gives `t` back if there is none.
pub(crate) fn defer_release(vm: &VmShared, t: TensorOwner) -> Option<TensorOwner> {
    let key = vm as *const VmShared as usize;
    let mut t = Some(t);
    let _ = ACTIVE.try_with(|a| {
        let mut a = a.borrow_mut();
        if let Some((_, list)) = a.iter_mut().rev().find(|(k, _)| *k == key) {
            list.extend(t.take());
        }
    });
    t
}

/// The most inputs one call takes (an `OpCall` counts them in a byte).
pub const MAX_INPUTS: usize = u8::MAX as usize;

/// Builds instructions for one [`VirtualMachine::run`](crate::vm::VirtualMachine::run).
pub struct InstructionsBuilder<'vm> {
    vm: &'vm Arc<VmShared>,
    batch: Vec<Instruction>,
    key: usize,
    /// Inference results of calls already checked (kept across builders of this VM).
    infer: Box<InferCache>,
    /// The specs of the last call whose signature was not cached.
    uncached: OutSpecs,
    /// A handle to every tensor the unsubmitted instructions use, dropped once they are
    /// submitted (module docs, "Releases").
    keep: Vec<Tensor>,
    /// This VM-unique number of the batch being built (names it in `TensorInner::kept_in`).
    batch_id: u64,
}

impl<'vm> InstructionsBuilder<'vm> {
    pub(crate) fn new(vm: &'vm Arc<VmShared>) -> Self {
        let key = Arc::as_ptr(vm) as usize;
        let _ = ACTIVE.try_with(|a| a.borrow_mut().push((key, Vec::new())));
        InstructionsBuilder {
            vm,
            batch: vm.take_batch(),
            key,
            infer: vm.take_infer_cache(),
            uncached: OutSpecs::new(),
            keep: vm.take_keep_list(),
            batch_id: vm.next_batch_id(),
        }
    }

    /// Call `op` on `stream`, creating its outputs. Returns them in order.
    pub fn call_multi(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<SmallVec<[Tensor; 2]>> {
        let device = self.vm.stream(stream)?.device;
        let vm = self.vm;
        let (kernel, specs) = self.check(op, inputs, &[], &attrs, stream)?;
        let outs: SmallVec<[Tensor; 2]> = specs
            .iter()
            .map(|s| vm.new_tensor(TensorMeta { shape: s.shape.clone(), dtype: s.dtype, device }))
            .collect();
        {
            let refs: SmallVec<[&Tensor; 2]> = outs.iter().collect();
            self.emit_call(kernel, inputs, &refs, attrs, stream);
        }
        Ok(outs)
    }

    /// Call a single-output `op` on `stream`, creating its output.
    pub fn call(&mut self, op: Op, inputs: &[&Tensor], attrs: Attrs, stream: StreamId) -> Result<Tensor> {
        // Refuse before emitting anything: a refused call leaves no instruction behind.
        let n = self.check(op, inputs, &[], &attrs, stream)?.1.len();
        if n != 1 {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {n} outputs; use call_multi"),
            });
        }
        let mut outs = self.call_multi(op, inputs, attrs, stream)?;
        Ok(outs.pop().expect("one output"))
    }

    /// Call `op` on `stream`, writing into the given `outputs` (which must have the shapes
    /// and dtypes the op produces, and live on the stream's device).
    pub fn call_into(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        let kernel = self.check(op, inputs, outputs, &attrs, stream)?.0;
        self.emit_call(kernel, inputs, outputs, attrs, stream);
        Ok(())
    }

    /// Overwrite a host tensor with `data` (a host `Access`).
    pub fn write<T: Element>(&mut self, t: &Tensor, data: &[T]) -> Result<()> {
        t.check_live()?;
        if !t.device().is_host() {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!("is on {}; only host tensors are written directly (copy it)", t.device()),
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
        let ops = operands(&[], &[t]);
        self.keep_alive(t);
        self.emit(InstrKind::Access(HostAccess::Write(T::to_bytes(data))), self.vm.host_stream, ops);
        Ok(())
    }

    /// Emit a host access that reads `t` (a host tensor) into `slot`.
    pub(crate) fn read_into(&mut self, t: &Tensor, slot: Arc<AccessSlot>, wait_only: bool) {
        let ops = operands(&[t], &[]);
        let access = if wait_only { HostAccess::Wait(slot) } else { HostAccess::Read(slot) };
        self.keep_alive(t);
        self.emit(InstrKind::Access(access), self.vm.host_stream, ops);
    }

    /// Hand what has been built so far to the scheduler now.
    pub fn flush(&mut self) {
        self.take_deferred_releases();
        if self.batch.is_empty() {
            return;
        }
        let batch = std::mem::replace(&mut self.batch, self.vm.take_batch());
        self.vm.submit(batch);
        self.batch_id = self.vm.next_batch_id();
        // Now that they are submitted, let go of the handles the instructions used. A
        // handle dropped here may be a tensor's last: its `Release` follows at once.
        self.keep.clear();
        self.take_deferred_releases();
        if !self.batch.is_empty() {
            let batch = std::mem::replace(&mut self.batch, self.vm.take_batch());
            self.vm.submit(batch);
        }
    }

    /// Hold a handle of `t` until the batch being built is submitted (once per batch).
    #[inline]
    fn keep_alive(&mut self, t: &Tensor) {
        let kept = &t.inner().kept_in;
        if kept.load(Ordering::Relaxed) != self.batch_id {
            kept.store(self.batch_id, Ordering::Relaxed);
            self.keep.push(t.clone());
        }
    }

    /// Add the `Release`s of the tensors whose last handle dropped on this thread since the
    /// last flush.
    fn take_deferred_releases(&mut self) {
        let key = self.key;
        let deferred = ACTIVE
            .try_with(|a| {
                let mut a = a.borrow_mut();
                a.iter_mut().rev().find(|(k, _)| *k == key).map(|(_, l)| std::mem::take(l))
            })
            .ok()
            .flatten()
            .unwrap_or_default();
        for t in deferred {
            if let Some(ins) = release_instruction(t) {
                self.batch.push(ins);
            }
        }
    }

    /// Check a call (module docs); returns its kernel and output specs. The common case, a
    /// signature already in the inference cache, takes one pass over the operands and no
    /// allocation.
    #[inline]
    fn check(
        &mut self,
        op: Op,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: &Attrs,
        stream: StreamId,
    ) -> Result<(&'static dyn OpKernel, &OutSpecs)> {
        let device = self.vm.stream(stream)?.device;
        let Some(kernel) = op.kernel(device.ty) else {
            return Err(self.vm.unknown_op(op.name(), device));
        };
        let mut on_device = 0;
        for t in inputs.iter().chain(outputs) {
            t.check_live()?;
            on_device += usize::from(t.device() == device);
        }
        let n = inputs.len() + outputs.len();
        if inputs.len() > MAX_INPUTS {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {} inputs; a call takes at most {MAX_INPUTS}", inputs.len()),
            });
        }
        if on_device < n && !kernel.cross_device() || on_device == 0 && n > 0 {
            return Err(wrong_device(op, kernel, inputs, outputs, device));
        }
        for (i, o) in outputs.iter().enumerate() {
            if inputs.iter().chain(&outputs[..i]).any(|t| std::ptr::eq(t.inner(), o.inner())) {
                return Err(Error::Aliased { op: op.name().into(), tensor: o.id() });
            }
        }
        // A signature checked before passes again: infer is a function of it alone, and
        // it passed the output comparison then (only passing calls are cached).
        let metas = inputs.iter().chain(outputs).map(|t| t.meta());
        match self.infer.get(kernel, stream.0, attrs, inputs.len(), n, metas) {
            Some(i) => Ok((kernel, self.infer.specs(i))),
            None => self.infer_uncached(op, kernel, inputs, outputs, attrs, stream, device),
        }
    }

    /// Run the kernel's `infer` for a signature not in the cache, compare the given outputs
    /// with it, and cache it if it passes.
    #[allow(clippy::too_many_arguments)]
    #[inline(never)]
    fn infer_uncached(
        &mut self,
        op: Op,
        kernel: &'static dyn OpKernel,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: &Attrs,
        stream: StreamId,
        device: DeviceId,
    ) -> Result<(&'static dyn OpKernel, &OutSpecs)> {
        let name = || op.name().to_string();
        let in_metas: SmallVec<[&TensorMeta; 8]> = inputs.iter().map(|t| t.meta()).collect();
        let given: SmallVec<[&TensorMeta; 2]> = outputs.iter().map(|t| t.meta()).collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&in_metas, &given, attrs, &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: name(), detail })?;
        if !outputs.is_empty() {
            if specs.len() != outputs.len() {
                return Err(Error::InvalidOperands {
                    op: name(),
                    detail: format!("produces {} outputs, {} given", specs.len(), outputs.len()),
                });
            }
            for (i, (s, t)) in specs.iter().zip(outputs).enumerate() {
                if s.shape != t.meta().shape || s.dtype != t.dtype() {
                    let want = TensorMeta { shape: s.shape.clone(), dtype: s.dtype, device };
                    return Err(Error::OutputMismatch {
                        op: name(),
                        index: i,
                        expected: want.describe(),
                        found: t.meta().describe(),
                    });
                }
            }
        }
        match self.infer.insert(kernel, stream.0, attrs, &in_metas, &given, specs.clone()) {
            Some(i) => Ok((kernel, self.infer.specs(i))),
            None => {
                self.uncached = specs;
                Ok((kernel, &self.uncached))
            }
        }
    }

    /// Emit an `OpCall` (after `check`). The instruction is pushed first and its operands
    /// written into it where it lies in the batch, so that nothing as large as an operand
    /// list is built on the stack and copied.
    #[inline]
    fn emit_call(
        &mut self,
        kernel: &'static dyn OpKernel,
        inputs: &[&Tensor],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) {
        for t in inputs.iter().chain(outputs) {
            self.keep_alive(t);
        }
        let tensors = inputs.iter().chain(outputs).map(|t| t.inner());
        self.sync_operands(stream, tensors, || operands(inputs, outputs));
        let kind = InstrKind::OpCall { kernel, attrs, n_inputs: inputs.len() as u8 };
        self.batch.push(Instruction::new(kind, stream, Operands::new()));
        push_operands(&mut self.batch.last_mut().expect("just pushed").operands, inputs, outputs);
        if self.batch.len() >= self.vm.config.batch_size {
            self.flush();
        }
    }

    fn emit(&mut self, kind: InstrKind, stream: StreamId, ops: Operands) {
        self.sync_operands(stream, ops.iter().map(|o| o.tensor()), || ops.clone());
        self.batch.push(Instruction::new(kind, stream, ops));
        if self.batch.len() >= self.vm.config.batch_size {
            self.flush();
        }
    }

    /// Emit an instruction exactly as given: no checks and no soft sync. For trace replay
    /// without `--resync`, where the trace (validated beforehand) carries its own
    /// `RecordEvent`/`StreamWaitEvent` instructions.
    pub(crate) fn emit_raw(&mut self, kind: InstrKind, stream: StreamId, ops: Operands) {
        for o in &ops {
            o.tensor().last_stream.store(stream.0, Ordering::Relaxed);
        }
        self.batch.push(Instruction::new(kind, stream, ops));
        if self.batch.len() >= self.vm.config.batch_size {
            self.flush();
        }
    }

    /// Soft sync before an instruction on `stream` that uses `tensors` (module docs): emit
    /// the synchronisation for those last used on other streams, and mark them all used on
    /// `stream`. `ops` gives the instruction's operand list, needed only in the first case.
    #[inline]
    fn sync_operands<'t>(
        &mut self,
        stream: StreamId,
        tensors: impl Iterator<Item = &'t TensorInner> + Clone,
        ops: impl FnOnce() -> Operands,
    ) {
        let me = stream.0;
        let mut foreign = false;
        for t in tensors.clone() {
            let last = t.last_stream.load(Ordering::Relaxed);
            if last != me {
                foreign |= last != NO_STREAM;
                if !foreign {
                    t.last_stream.store(me, Ordering::Relaxed);
                }
            }
        }
        if foreign {
            self.soft_sync(stream, &ops());
            for t in tensors {
                t.last_stream.store(me, Ordering::Relaxed);
            }
        }
    }

    /// Emit the synchronisation for operands last used on other streams (module docs).
    #[cold]
    fn soft_sync(&mut self, me: StreamId, ops: &Operands) {
        let mut groups: SmallVec<[(u32, Operands); 2]> = SmallVec::new();
        for o in ops {
            let last = o.tensor().last_stream.load(Ordering::Relaxed);
            if last == me.0 || last == NO_STREAM {
                continue;
            }
            let read = Operand::new(o.ptr(), AccessMode::Read);
            match groups.iter_mut().find(|(s, _)| *s == last) {
                Some((_, g)) => {
                    if !g.iter().any(|x| x.ptr() == o.ptr()) {
                        g.push(read)
                    }
                }
                None => groups.push((last, SmallVec::from_iter([read]))),
            }
        }
        for (src, reads) in groups {
            let (s, t) = (&self.vm.streams[src as usize], &self.vm.streams[me.index()]);
            let id = self.vm.next_event_id();
            if s.device == t.device && s.device_waits {
                self.batch.push(Instruction::new(InstrKind::RecordEvent { id }, StreamId(src), reads));
                self.batch.push(Instruction::new(
                    InstrKind::StreamWaitEvent { id, event: None },
                    me,
                    Operands::new(),
                ));
            } else if s.policy == crate::vm::PolicyKind::Event {
                self.batch.push(Instruction::new(InstrKind::RecordEvent { id }, StreamId(src), reads));
            }
        }
    }
}

impl Drop for InstructionsBuilder<'_> {
    fn drop(&mut self) {
        self.flush();
        let key = self.key;
        let _ = ACTIVE.try_with(|a| {
            let mut a = a.borrow_mut();
            if let Some(i) = a.iter().rposition(|(k, _)| *k == key) {
                a.remove(i);
            }
        });
        let empty = std::mem::take(&mut self.batch);
        self.vm.recycle(empty);
        self.vm.recycle_infer_cache(std::mem::take(&mut self.infer));
        self.vm.recycle_keep_list(std::mem::take(&mut self.keep));
    }
}

/// The error for a call with an operand on the wrong device: the first operand off the
/// stream's device (or, for a copy, the first operand, when none is on it).
#[cold]
fn wrong_device(
    op: Op,
    kernel: &'static dyn OpKernel,
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

/// The operand list of a call. Every caller keeps each tensor alive (`keep_alive`) until
/// the instruction is submitted.
fn operands(inputs: &[&Tensor], outputs: &[&Tensor]) -> Operands {
    let mut ops = Operands::new();
    push_operands(&mut ops, inputs, outputs);
    ops
}

/// Append the operands of a call to `ops`: inputs read, then outputs written. Every caller
/// keeps each tensor alive (`keep_alive`) until the instruction is submitted.
#[inline]
fn push_operands(ops: &mut Operands, inputs: &[&Tensor], outputs: &[&Tensor]) {
    // SAFETY (both loops): each tensor has a keep-alive handle until the batch is
    // submitted, and its Release follows the batch (module docs, "Releases").
    for t in inputs {
        ops.push(Operand::new(unsafe { TensorPtr::new(t.inner()) }, AccessMode::Read));
    }
    for t in outputs {
        ops.push(Operand::new(unsafe { TensorPtr::new(t.inner()) }, AccessMode::Write));
    }
}

/// The `Release` of `t`, on the stream that used it last; none if nothing ever used it.
pub(crate) fn release_instruction(t: TensorOwner) -> Option<Instruction> {
    let last = t.last_stream.load(Ordering::Relaxed);
    if last == NO_STREAM {
        return None;
    }
    // SAFETY: the instruction owns `t` (its `owner`), so the pointer lives as long as it.
    let ops = SmallVec::from_iter([Operand::new(unsafe { TensorPtr::new(&t) }, AccessMode::Write)]);
    Some(Instruction::new(InstrKind::Release { owner: Some(t) }, StreamId(last), ops))
}
