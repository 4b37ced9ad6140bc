//! [`Context`]: checks each call at once, queues it, and hands the queue to the VM in one
//! [`VirtualMachine::run`] at every flush.
//!
//! # Why calls are queued, not built into an open builder
//!
//! A tensor's `Release` is submitted only after every builder batch that was open when its
//! last handle dropped has been submitted (`framework::release`), so a builder kept open
//! between calls would hold back the `Release` of every tensor dropped meanwhile, on any
//! thread, until its next submission. So a context keeps its own queue of checked calls,
//! each holding handles to its operands, and replays the queue inside one short `vm.run`
//! at a flush: the operands stay alive until their instructions are built, and a handle
//! dropped while they are built gets its `Release` after them.
//!
//! # Flush points
//!
//! A context flushes when its queue reaches [`ContextOptions::flush_every`] calls, before
//! every read or wait ([`Array::to_vec`], [`Array::wait`], [`Context::sync`]), before a
//! handle leaves it ([`Array::tensor`], [`Array::release`]), when a call uses an array of
//! another context (that context flushes first, so its writes reach the VM before our
//! reads), and when it is dropped.

use std::cell::{Cell, RefCell};

use smallvec::SmallVec;

use super::Array;
use crate::ep::{DeviceId, StreamType};
use crate::error::{Error, Result};
use crate::framework::{
    Attrs, DType, Element, InstructionsBuilder, Op, OutSpec, OutSpecs, Tensor, TensorMeta,
};
use crate::vm::{StreamId, VirtualMachine};

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
        let host = self.vm.empty(shape, T::DTYPE, DeviceId::CPU)?;
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
        let (t, data) = (host.clone(), data.to_vec());
        self.queue(Pending::Write(Box::new(move |b| b.write(&t, &data))));
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

    /// Hand every queued call to the VM now (it runs them asynchronously). Returns the
    /// builder's error if one of them was refused there, now or at an earlier flush made
    /// because the queue was full (it cannot be, short of a bug: each call was checked
    /// when it was made); the calls after it are then dropped and their outputs are never
    /// written.
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
            return Ok(());
        }
        self.flushes.set(self.flushes.get() + 1);
        let r = self.vm.run(|b| {
            for p in list.drain(..) {
                match p {
                    Pending::Call { op, inputs, outputs, attrs, stream } => {
                        let ins: SmallVec<[&Tensor; 4]> = inputs.iter().collect();
                        let outs: SmallVec<[&Tensor; 2]> = outputs.iter().collect();
                        b.call_into(op, &ins, &outs, attrs, stream)?;
                    }
                    Pending::Write(write) => write(b)?,
                }
            }
            Ok(())
        });
        // Keep the queue's capacity for the next batch, unless calls were queued meanwhile.
        let mut p = self.pending.borrow_mut();
        if p.is_empty() {
            list.clear();
            *p = list;
        }
        r
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
    pub(super) fn emit(
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
        for a in inputs {
            a.tensor_unflushed().check_live()?;
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
        // Arrays of other contexts: their writes must reach the VM before our reads.
        for a in inputs {
            if !std::ptr::eq(a.context_ptr(), self as *const Self as *const ()) {
                a.flush_owner()?;
            }
        }
        let mut outputs: SmallVec<[Tensor; 1]> = SmallVec::new();
        for s in &specs {
            outputs.push(self.vm.empty(&s.shape, s.dtype, out_device)?);
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
        let _ = self.flush();
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
