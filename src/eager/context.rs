//! [`Context`]: checks each call at once, queues it, and hands the queue to the VM in one
//! [`VirtualMachine::run`] at every flush.
//!
//! # Why calls are queued
//!
//! Each `vm.run` costs a wake-up of the scheduler and an inbox hand-off, so calls are
//! handed over in batches (`docs/frontend.md` has the measured cost of each way). They are
//! queued as calls, each holding handles to its operands, and replayed inside one short
//! `vm.run` at a flush: an operand's last handle cannot drop while a call that uses it
//! waits in the queue, and a handle dropped while the calls are built gets its `Release`
//! after them.
//!
//! # Releases
//!
//! A queue of accepted calls is a batch not yet submitted, and it takes part in the VM's
//! release rule as a builder's batch does (`framework::release`): the context opens its
//! slot before it checks the first call it queues after a flush, and closes it once the
//! flush's batch is in the inbox. So a tensor released after a call that uses it was
//! accepted (by [`Array::release`] through another context, or by any thread) has its
//! `Release` submitted after that call, and the flush builds the call without refusing it
//! as released: it was live when it was checked, and its release waits for the flush.
//!
//! The cost is bounded: while calls are queued, this context holds back the `Release` of
//! every tensor released anywhere on the VM until its next flush, which comes after at
//! most [`ContextOptions::flush_every`] calls (or earlier, at a flush point below). A
//! handle dropped while a slot is open costs a clock tick and two uncontended locks
//! instead of a submission of its own; the releases held back go to the VM together when
//! the slot closes.
//!
//! # Flush points
//!
//! A context flushes when its queue reaches [`ContextOptions::flush_every`] calls, before
//! every read or wait ([`Array::to_vec`], [`Array::wait`], [`Context::sync`]), before a
//! handle leaves it ([`Array::tensor`], [`Array::release`]), when a call uses an array of
//! another context (that context flushes first, so its writes reach the VM before our
//! reads), and when it is dropped.
//!
//! # A flush never drops work
//!
//! Each call is checked when it is made, with the builder's own checks, so the builder
//! accepts it at the flush. Should it refuse one all the same (a bug), that call alone is
//! left out: the calls after it still go, its outputs stay unwritten, and the error is
//! counted for the VM's next `sync` and returned by the flush ([`Context::flush`]).

use std::cell::{Cell, RefCell};

use smallvec::SmallVec;

use super::Array;
use crate::ep::{DeviceId, StreamType};
use crate::framework::release::Slot;
use crate::framework::VirtualMachine;
use crate::framework::{
    Attrs, DType, Element, InstructionsBuilder, Op, OutSpec, OutSpecs, Tensor, TensorMeta, MAX_INPUTS,
};
use crate::vm::StreamId;
use crate::vm::{Error, Result};

/// How a [`Context`] batches its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOptions {
    /// Hand the queued calls to the VM once this many are queued (at least 1; 1 submits
    /// every call on its own, the simplest and slowest way; see `docs/frontend.md`).
    pub flush_every: usize,
}

impl Default for ContextOptions {
    fn default() -> Self {
        ContextOptions { flush_every: 128 }
    }
}

/// Counters of a [`Context`], for tests and tuning.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ContextStats {
    /// Calls accepted (op calls, copies and host writes).
    pub calls: u64,
    /// Flushes that handed at least one call to the VM.
    pub flushes: u64,
    /// Calls queued now, not yet handed to the VM.
    pub pending: usize,
}

/// A checked call waiting for the next flush. It holds handles to its operands, so none is
/// released before its instruction is built.
enum Pending {
    Call {
        op: Op,
        inputs: SmallVec<[Tensor; 2]>,
        outputs: SmallVec<[Tensor; 1]>,
        attrs: Attrs,
        stream: StreamId,
    },
    /// A host write of new data.
    Write(HostWrite),
}

/// Emits a host write; owns the data and the tensor's handle.
type HostWrite = Box<dyn FnOnce(&mut InstructionsBuilder<'_>) -> Result<()>>;

/// The ops the front end calls, resolved once.
struct Ops {
    fill: Op,
    copy: Op,
    add: Op,
    sub: Op,
    mul: Op,
    scale: Op,
    relu: Op,
    relu_grad: Op,
    matmul: Op,
    matmul_tn: Op,
    matmul_nt: Op,
    add_bias: Op,
    sum: Op,
    sum_rows: Op,
}

/// An eager front end over one [`VirtualMachine`]: creates [`Array`]s and runs their ops.
///
/// Every call is checked when it is made (op known on the device, live operands, devices,
/// shapes and dtypes) and refused with the same typed [`Error`] the builder gives; an
/// accepted call returns its result arrays at once and runs later, asynchronously, after
/// the next flush (module docs). A context belongs to the thread that made it.
///
/// ```
/// use eagervm::eager::Context;
/// use eagervm::prelude::*;
///
/// let vm = VirtualMachine::new(Config::default())?;
/// let cx = Context::new(&vm);
/// let x = cx.from_slice(&[1.0f32, -2.0, 3.0, -4.0], &[2, 2], DeviceId::CPU)?;
/// let w = cx.full(&[2, 1], 0.5, DType::F32, DeviceId::CPU)?;
/// let y = x.matmul(&w)?.relu()?; // [max(0.5 - 1, 0), max(1.5 - 2, 0)]
/// assert_eq!(y.to_vec::<f32>()?, vec![0.0, 0.0]);
/// assert!(x.add(&w).is_err()); // shapes differ: refused at the call
/// # Ok::<(), eagervm::Error>(())
/// ```
pub struct Context<'vm> {
    vm: &'vm VirtualMachine,
    ops: Ops,
    options: ContextOptions,
    pending: RefCell<Vec<Pending>>,
    calls: Cell<u64>,
    flushes: Cell<u64>,
    /// The error of a flush made when the queue filled up, returned by the next flush.
    deferred: RefCell<Option<Error>>,
    /// This context's slot in the VM's release rule (`framework::release`), and whether it
    /// is open: from before the checks of the first call queued after a flush until the
    /// flush's batch is in the inbox (module docs).
    slot: crate::sync::Arc<Slot>,
    open: Cell<bool>,
}

impl std::fmt::Debug for Context<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("options", &self.options).field("stats", &self.stats()).finish()
    }
}

impl<'vm> Context<'vm> {
    /// A context with the default options.
    pub fn new(vm: &'vm VirtualMachine) -> Self {
        Self::with_options(vm, ContextOptions::default())
    }

    /// A context with the given options (`flush_every` 0 counts as 1).
    pub fn with_options(vm: &'vm VirtualMachine, options: ContextOptions) -> Self {
        // Cannot fail: every VM registers the built-in ops, these among them.
        let op = |name: &str| vm.op(name).expect("a built-in op");
        let ops = Ops {
            fill: op("fill"),
            copy: op("copy"),
            add: op("add"),
            sub: op("sub"),
            mul: op("mul"),
            scale: op("scale"),
            relu: op("relu"),
            relu_grad: op("relu_grad"),
            matmul: op("matmul"),
            matmul_tn: op("matmul_tn"),
            matmul_nt: op("matmul_nt"),
            add_bias: op("add_bias"),
            sum: op("sum"),
            sum_rows: op("sum_rows"),
        };
        let options = ContextOptions { flush_every: options.flush_every.max(1) };
        Context {
            vm,
            ops,
            options,
            pending: RefCell::new(Vec::with_capacity(options.flush_every)),
            calls: Cell::new(0),
            flushes: Cell::new(0),
            deferred: RefCell::new(None),
            slot: vm.front().releases.register(),
            open: Cell::new(false),
        }
    }

    /// The VM this context runs on.
    pub fn vm(&self) -> &'vm VirtualMachine {
        self.vm
    }

    /// The options in force.
    pub fn options(&self) -> ContextOptions {
        self.options
    }

    /// Counters: calls accepted, flushes, calls queued now.
    pub fn stats(&self) -> ContextStats {
        ContextStats {
            calls: self.calls.get(),
            flushes: self.flushes.get(),
            pending: self.pending.borrow().len(),
        }
    }

    /// A `shape` array of `dtype` on `device`, every element 0.
    pub fn zeros(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Array<'_>> {
        self.full(shape, 0.0, dtype, device)
    }

    /// A `shape` array of `dtype` on `device`, every element `value` (cast as `fill` does:
    /// `i64` truncates toward zero). Filled on the device's compute stream.
    pub fn full(&self, shape: &[usize], value: f64, dtype: DType, device: DeviceId) -> Result<Array<'_>> {
        let given = [OutSpec { shape: shape.iter().copied().collect(), dtype }];
        let stream = (self.vm.compute_stream(device)?, device);
        let mut out = self.emit(self.ops.fill, &[], Attrs::scalar(value), stream, device, &given)?;
        // Cannot fail: `fill` given one output makes it, once its `infer` passed.
        Ok(out.pop().expect("fill has one output"))
    }

    /// An array holding `data` (row-major, `shape`), on `device`: written on the host, then
    /// copied through the device's host-to-device stream if `device` is not the host.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize], device: DeviceId) -> Result<Array<'_>> {
        let host =
            self.vm.empty_at(shape, T::DTYPE, DeviceId::CPU, || format!("`from_slice` on {device}"))?;
        if data.len() != host.numel() {
            return Err(Error::Access {
                tensor: host.id(),
                detail: format!("has {} elements, {} given", host.numel(), data.len()),
            });
        }
        if !device.is_host() {
            // Refuse an unknown device before queueing anything.
            self.vm.stream(device, StreamType::H2D)?;
        }
        // The queued write keeps its own copy of the data, as large as the array: allocated
        // fallibly.
        let mut copy = Vec::new();
        copy.try_reserve_exact(data.len()).map_err(|e| {
            crate::framework::tensor::out_of_host_memory(
                host.id(),
                std::mem::size_of_val(data),
                "a copy of the data",
                e,
            )
        })?;
        copy.extend_from_slice(data);
        let (t, data) = (host.clone(), copy);
        self.queue(Pending::Write(Box::new(move |b| b.write_accepted(&t, &data))));
        Array::new(host, self).to(device)
    }

    /// Adopt a low-level tensor. Ops on it are ordered after everything the VM was given
    /// for it before this call.
    pub fn wrap(&self, tensor: Tensor) -> Array<'_> {
        Array::new(tensor, self)
    }

    /// Call any registered op by name on `device`'s compute stream. `given` is for ops whose
    /// outputs the caller chooses (`fill`, `noop`, `fail`); it is empty otherwise. Returns
    /// the outputs in order.
    pub fn call(
        &self,
        op: &str,
        inputs: &[&Array<'_>],
        attrs: Attrs,
        given: &[OutSpec],
        device: DeviceId,
    ) -> Result<Vec<Array<'_>>> {
        let op = self.vm.op(op)?;
        let stream = (self.vm.compute_stream(device)?, device);
        Ok(self.emit(op, inputs, attrs, stream, device, given)?.into_vec())
    }

    /// Hand every queued call to the VM now (it runs them asynchronously).
    ///
    /// Each call was checked when it was made, with the checks the builder makes, so the
    /// builder accepts it now (an operand released since then is no exception: its release
    /// waited for this flush). Should the builder refuse one all the same, the others still
    /// go, the refused call's outputs are never written (a read of them returns
    /// [`Error::Uninitialized`], a wait passes, a call that reads them fails with
    /// `Uninitialized`), its error is counted in the VM's failures for the next
    /// [`VirtualMachine::sync`], and the first such error is returned: by this flush, or,
    /// for a flush made because the queue was full, by the next one.
    pub fn flush(&self) -> Result<()> {
        let r = self.submit();
        match self.deferred.borrow_mut().take() {
            Some(e) => Err(e),
            None => r,
        }
    }

    fn submit(&self) -> Result<()> {
        let mut list = std::mem::take(&mut *self.pending.borrow_mut());
        if list.is_empty() {
            self.close_if_idle();
            return Ok(());
        }
        self.flushes.set(self.flushes.get() + 1);
        let mut first = None;
        self.vm.run(|b| {
            for p in list.drain(..) {
                let r = match p {
                    Pending::Call { op, inputs, outputs, attrs, stream } => {
                        let ins: SmallVec<[&Tensor; 4]> = inputs.iter().collect();
                        let outs: SmallVec<[&Tensor; 2]> = outputs.iter().collect();
                        b.call_accepted(op, &ins, &outs, attrs, stream)
                    }
                    Pending::Write(write) => write(b),
                };
                // A refused call takes nothing else with it (`flush`'s docs).
                if let Err(e) = r {
                    tracing::error!(error = %e, "a call the context accepted was refused at its flush");
                    self.vm.engine().record_failure(e.clone());
                    first.get_or_insert(e);
                }
            }
        });
        // The run's batch is in the inbox: releases held back for the queue may follow it.
        self.close_if_idle();
        // Keep the queue's capacity for the next batch, unless calls were queued meanwhile.
        let mut p = self.pending.borrow_mut();
        if p.is_empty() {
            list.clear();
            *p = list;
        }
        first.map_or(Ok(()), Err)
    }

    /// Open this context's slot in the release rule, if it is not open: before the checks
    /// of a call that may be queued (module docs).
    fn hold(&self) {
        if !self.open.replace(true) {
            self.vm.front().releases.open(&self.slot);
        }
    }

    /// Close this context's slot if it is open and nothing is queued, submitting the
    /// releases that may follow now.
    fn close_if_idle(&self) {
        if self.open.get() && self.pending.borrow().is_empty() {
            self.open.set(false);
            let ready = self.vm.front().releases.close(&self.slot);
            crate::framework::virtual_machine::submit_releases(self.vm.engine(), ready);
        }
    }

    /// Flush, then wait for everything the VM was given so far ([`VirtualMachine::sync`]).
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.vm.sync()
    }

    pub(super) fn ops_binary(&self, name: Binary) -> Op {
        match name {
            Binary::Add => self.ops.add,
            Binary::Sub => self.ops.sub,
            Binary::Mul => self.ops.mul,
            Binary::ReluGrad => self.ops.relu_grad,
            Binary::Matmul => self.ops.matmul,
            Binary::MatmulTn => self.ops.matmul_tn,
            Binary::MatmulNt => self.ops.matmul_nt,
            Binary::AddBias => self.ops.add_bias,
        }
    }

    pub(super) fn ops_unary(&self, name: Unary) -> Op {
        match name {
            Unary::Scale => self.ops.scale,
            Unary::Relu => self.ops.relu,
            Unary::Sum => self.ops.sum,
            Unary::SumRows => self.ops.sum_rows,
            Unary::Copy => self.ops.copy,
        }
    }

    /// Check a call of `op` on `stream` (of `device`), create its outputs on `out_device`
    /// (the stream's device, except for a copy to the host on the source's D2H stream)
    /// and queue it.
    ///
    /// The checks are the builder's, in its order, so that the builder accepts at the flush
    /// every call accepted here. They run with this context's slot in the release rule
    /// open, so that a release made after them waits for the flush (module docs).
    pub(super) fn emit(
        &self,
        op: Op,
        inputs: &[&Array<'_>],
        attrs: Attrs,
        stream: (StreamId, DeviceId),
        out_device: DeviceId,
        given: &[OutSpec],
    ) -> Result<SmallVec<[Array<'_>; 1]>> {
        self.hold();
        let r = self.accept(op, inputs, attrs, stream, out_device, given);
        if r.is_err() {
            // A refused call queues nothing: hold nothing back for it.
            self.close_if_idle();
        }
        r
    }

    /// [`emit`](Self::emit)'s checks, and the queueing of an accepted call.
    fn accept(
        &self,
        op: Op,
        inputs: &[&Array<'_>],
        attrs: Attrs,
        (stream, device): (StreamId, DeviceId),
        out_device: DeviceId,
        given: &[OutSpec],
    ) -> Result<SmallVec<[Array<'_>; 1]>> {
        let kernel = op.kernel(device.ty).ok_or_else(|| Error::UnknownOp {
            op: op.name().into(),
            device,
            known: self
                .vm
                .op_names()
                .into_iter()
                .filter(|n| self.has_kernel(n, device))
                .collect::<Vec<_>>()
                .join(", "),
        })?;
        if inputs.len() > MAX_INPUTS {
            return Err(Error::InvalidOperands {
                op: op.name().into(),
                detail: format!("has {} inputs; a call takes at most {MAX_INPUTS}", inputs.len()),
            });
        }
        let me = self.vm.engine().identity();
        for a in inputs {
            let t = a.tensor_unflushed();
            if !t.inner().belongs_to(me) {
                return Err(Error::ForeignTensor { op: op.name().into(), tensor: t.id() });
            }
            t.check_live()?;
        }
        let wrong = |t: &Tensor| Error::WrongDevice {
            op: op.name().into(),
            tensor: t.id(),
            tensor_device: t.device(),
            stream_device: device,
        };
        if kernel.cross_device() {
            if out_device != device && !inputs.iter().any(|a| a.device() == device) {
                return Err(match inputs.first() {
                    Some(a) => wrong(a.tensor_unflushed()),
                    None => Error::InvalidOperands {
                        op: op.name().into(),
                        detail: "no operand on the stream's device".into(),
                    },
                });
            }
        } else if let Some(a) = inputs.iter().find(|a| a.device() != device) {
            return Err(wrong(a.tensor_unflushed()));
        }
        let in_metas: SmallVec<[&TensorMeta; 4]> =
            inputs.iter().map(|a| a.tensor_unflushed().meta()).collect();
        let given_metas: SmallVec<[TensorMeta; 1]> = given
            .iter()
            .map(|s| TensorMeta { shape: s.shape.clone(), dtype: s.dtype, device: out_device })
            .collect();
        let given_refs: SmallVec<[&TensorMeta; 1]> = given_metas.iter().collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&in_metas, &given_refs, &attrs, &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: op.name().into(), detail })?;
        // The builder's size check of each output (`framework::shape`), before anything is
        // flushed or made, so that a refused call leaves nothing behind.
        let at = |i: usize| move || format!("output {i} of `{}` on {out_device}", op.name());
        let limit = self.vm.config().max_tensor_bytes;
        for (i, s) in specs.iter().enumerate() {
            crate::vm::shape::check(&s.shape, s.dtype, limit, at(i))?;
        }
        // Arrays of other contexts: their writes must reach the VM before our reads.
        for a in inputs {
            if !std::ptr::eq(a.context_ptr(), self as *const Self as *const ()) {
                a.flush_owner()?;
            }
        }
        let mut outputs: SmallVec<[Tensor; 1]> = SmallVec::new();
        for (i, s) in specs.iter().enumerate() {
            outputs.push(self.vm.empty_at(&s.shape, s.dtype, out_device, at(i))?);
        }
        let result = outputs.iter().map(|t| Array::new(t.clone(), self)).collect();
        let inputs = inputs.iter().map(|a| a.tensor_unflushed().clone()).collect();
        self.queue(Pending::Call { op, inputs, outputs, attrs, stream });
        Ok(result)
    }

    fn has_kernel(&self, name: &str, device: DeviceId) -> bool {
        self.vm.op(name).is_ok_and(|op| op.kernel(device.ty).is_some())
    }

    fn queue(&self, p: Pending) {
        // Open already for a call (`emit`); a host write of a new tensor needs no check.
        self.hold();
        self.calls.set(self.calls.get() + 1);
        let full = {
            let mut q = self.pending.borrow_mut();
            q.push(p);
            q.len() >= self.options.flush_every
        };
        if full {
            // Every queued call was checked, so a refusal here would be a bug; keep it for
            // the next flush point that returns errors (reads, waits, sync).
            if let Err(e) = self.submit() {
                self.deferred.borrow_mut().get_or_insert(e);
            }
        }
    }
}

impl Drop for Context<'_> {
    fn drop(&mut self) {
        // A refusal here is not lost: `flush` counts it for the VM's next `sync`.
        let _ = self.flush();
        self.close_if_idle();
        self.vm.front().releases.unregister(&self.slot);
    }
}

/// The two-input ops of [`Array`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Binary {
    Add,
    Sub,
    Mul,
    ReluGrad,
    Matmul,
    MatmulTn,
    MatmulNt,
    AddBias,
}

/// The one-input ops of [`Array`].
#[derive(Debug, Clone, Copy)]
pub(super) enum Unary {
    Scale,
    Relu,
    Sum,
    SumRows,
    Copy,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vm::Config;

    /// A call the builder refuses at a flush takes nothing else with it: the calls queued
    /// before and after it run, the flush returns its error, `sync` counts it, and its
    /// output reads as never written. (No call the context accepts is refused at its
    /// flush, so this one is queued past the context's checks.)
    #[test]
    fn a_call_refused_at_a_flush_takes_nothing_else_with_it() {
        let vm = VirtualMachine::new(Config::default()).unwrap();
        let cx = Context::new(&vm);
        let cpu = vm.compute_stream(DeviceId::CPU).unwrap();
        let a = cx.from_slice(&[1.0f32, 2.0], &[2], DeviceId::CPU).unwrap();
        let b3 = cx.from_slice(&[1.0f32, 2.0, 3.0], &[3], DeviceId::CPU).unwrap();
        let before = a.scale(2.0).unwrap();
        let refused = vm.empty(&[2], DType::F32, DeviceId::CPU).unwrap();
        cx.queue(Pending::Call {
            op: cx.ops.add,
            inputs: [a.tensor_unflushed().clone(), b3.tensor_unflushed().clone()].into_iter().collect(),
            outputs: [refused.clone()].into_iter().collect(),
            attrs: Attrs::default(),
            stream: cpu,
        });
        let after = a.add(&a).unwrap();
        let r = cx.flush();
        assert!(matches!(&r, Err(Error::InvalidOperands { op, .. }) if op == "add"), "{r:?}");
        assert_eq!(before.to_vec::<f32>().unwrap(), vec![2.0, 4.0]);
        assert_eq!(after.to_vec::<f32>().unwrap(), vec![2.0, 4.0], "a call after the refused one");
        match refused.to_vec::<f32>() {
            Err(Error::Uninitialized { op, tensor, .. }) => {
                assert_eq!((op.as_str(), tensor), ("Access", refused.id()))
            }
            other => panic!("the refused call's output was written: {other:?}"),
        }
        assert_eq!(refused.wait(), Ok(()));
        match vm.sync() {
            Err(Error::Failed { count: 1, first }) => {
                assert!(matches!(*first, Error::InvalidOperands { .. }))
            }
            other => panic!("sync should count the refusal, got {other:?}"),
        }
        cx.sync().unwrap();
    }
}
