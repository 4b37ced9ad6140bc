//! [`Context`]: an owned, shareable handle that builds every call of its arrays into one
//! [`InstructionsBuilder`] it keeps open, and hands the builder's batch to the VM at every
//! flush.
//!
//! # Ownership
//!
//! A context holds a handle of its [`VirtualMachine`] and an array holds its context, both
//! counted (`Arc`): an [`Array`] owns what it needs, so a model keeps its weights in a
//! struct beside its VM, sends them to other threads, and clones them freely. The VM runs
//! until the last of its handles drops: the [`VirtualMachine`] value, every context made on
//! it and every array of those contexts. Dropping the `VirtualMachine` while arrays live
//! therefore returns at once; the arrays keep working, and the VM drains and shuts down
//! (joining its threads, as a dropped VM does) when the last of them goes.
//!
//! # Why one open builder
//!
//! Each `vm.run` costs a wake-up of the scheduler and an inbox hand-off (`docs/frontend.md`
//! has the measured cost), so a context keeps one builder open and hands its batch over
//! every [`ContextOptions::flush_every`] calls, and at every flush point below. Each call is
//! checked once, by that builder, when it is made (its inference cache answers a signature
//! it has checked before), and its instruction is written into the open batch at once: a
//! refused call is refused at the call and leaves nothing behind.
//!
//! # Releases
//!
//! The open batch takes part in the VM's release rule as every builder's does
//! (`framework::release`): the `Release` of a tensor dropped or released while the batch
//! is open waits until the batch is in the inbox, so it lands after every call built that
//! uses it, whichever thread or context releases it.
//!
//! # Flush points
//!
//! A context flushes when `flush_every` calls are built, before every read or wait
//! ([`Array::to_vec`], [`Array::wait`], [`Context::sync`]), before a handle leaves it
//! ([`Array::tensor`], [`Array::release`]), when a call uses an array of another context
//! (that context flushes first, so its writes reach the VM before our reads), and when its
//! last handle drops.
//!
//! # Threads
//!
//! The builder sits behind a mutex, taken for one call (its check and its push: no wait)
//! or one flush (which may wait for back-pressure). A call locks no other context's mutex
//! while it holds its own (the other context flushes first), so two contexts used from two
//! threads cannot deadlock.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use smallvec::SmallVec;

use super::Array;
use crate::ep::{DeviceId, StreamType};
use crate::framework::virtual_machine::{build_host_access, HostAccess};
use crate::framework::VirtualMachine;
use crate::framework::{
    Attrs, DType, Element, InstructionsBuilder, Op, OutSpec, OutSpecs, Scalar, Tensor, TensorMeta,
};
use crate::vm::instruction::AccessSlot;
use crate::vm::StreamId;
use crate::vm::{Error, Result};

/// How a [`Context`] batches its calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContextOptions {
    /// Hand the built calls to the VM once this many are built (at least 1; 1 submits
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
    /// Calls built since the last flush, not yet handed to the VM.
    pub pending: usize,
}

/// Declares [`Ops`], the built-in ops the front end calls, each resolved once by its name.
macro_rules! ops {
    ($($field:ident: $name:literal),* $(,)?) => {
        /// The ops the front end calls, resolved once: the one op table of both front ends
        /// (the Python binding calls through the same [`Context`]).
        pub(crate) struct Ops {
            $(pub(crate) $field: Op,)*
        }

        impl Ops {
            fn resolve(vm: &VirtualMachine) -> Result<Ops> {
                Ok(Ops { $($field: vm.op($name)?,)* })
            }
        }
    };
}

ops! {
    fill: "fill",
    copy: "copy",
    cast: "cast",
    add: "add",
    sub: "sub",
    mul: "mul",
    div: "div",
    scale: "scale",
    add_scalar: "add_scalar",
    rsub_scalar: "rsub_scalar",
    mul_scalar: "mul_scalar",
    div_scalar: "div_scalar",
    rdiv_scalar: "rdiv_scalar",
    eq: "eq",
    ne: "ne",
    lt: "lt",
    le: "le",
    gt: "gt",
    ge: "ge",
    eq_scalar: "eq_scalar",
    ne_scalar: "ne_scalar",
    lt_scalar: "lt_scalar",
    le_scalar: "le_scalar",
    gt_scalar: "gt_scalar",
    ge_scalar: "ge_scalar",
    masked_fill: "masked_fill",
    relu: "relu",
    relu_grad: "relu_grad",
    matmul: "matmul",
    add_bias: "add_bias",
    sum: "sum",
    sum_rows: "sum_rows",
    // Pointwise math (`eager::pointwise`).
    exp: "exp",
    exp2: "exp2",
    log: "log",
    log2: "log2",
    log1p: "log1p",
    expm1: "expm1",
    sqrt: "sqrt",
    rsqrt: "rsqrt",
    reciprocal: "reciprocal",
    sin: "sin",
    cos: "cos",
    tanh: "tanh",
    sigmoid: "sigmoid",
    silu: "silu",
    gelu: "gelu",
    erf: "erf",
    abs: "abs",
    sign: "sign",
    floor: "floor",
    ceil: "ceil",
    round: "round",
    isnan: "isnan",
    isinf: "isinf",
    isfinite: "isfinite",
    logical_not: "logical_not",
    pow: "pow",
    pow_scalar: "pow_scalar",
    maximum: "maximum",
    minimum: "minimum",
    atan2: "atan2",
    div_floor: "div_floor",
    div_trunc: "div_trunc",
    remainder: "remainder",
    fmod: "fmod",
    logical_and: "logical_and",
    logical_or: "logical_or",
    logical_xor: "logical_xor",
    where_: "where",
    clamp: "clamp",
    clamp_scalar: "clamp_scalar",
    lerp: "lerp",
    lerp_scalar: "lerp_scalar",
    addcmul: "addcmul",
    addcdiv: "addcdiv",
    tril: "tril",
    triu: "triu",
    one_hot: "one_hot",
    mean: "mean",
    prod: "prod",
    amax: "amax",
    amin: "amin",
    max: "max",
    min: "min",
    argmax: "argmax",
    argmin: "argmin",
    all: "all",
    any: "any",
    var: "var",
    std: "std",
    logsumexp: "logsumexp",
    norm: "norm",
    cumsum: "cumsum",
    cumprod: "cumprod",
    softmax: "softmax",
    log_softmax: "log_softmax",
    layer_norm: "layer_norm",
    nll_loss: "nll_loss",
    bmm: "bmm",
    conv2d: "conv2d",
    max_pool2d: "max_pool2d",
    max_pool2d_with_indices: "max_pool2d_with_indices",
    avg_pool2d: "avg_pool2d",
    adaptive_avg_pool2d: "adaptive_avg_pool2d",
    attention: "scaled_dot_product_attention",
    cat: "cat",
    index_select: "index_select",
    gather: "gather",
    scatter: "scatter",
    index_add: "index_add",
    index: "index",
    index_put: "index_put",
    nonzero: "nonzero",
}

/// The open builder and the counters.
struct Open {
    b: InstructionsBuilder<'static>,
    pending: usize,
    calls: u64,
    flushes: u64,
}

/// What the handles of one context share.
struct Shared {
    // Declared before `vm`: fields drop in order, so the builder is dropped (and flushed)
    // before the context's handle of the VM, which may be the last one and shut it down.
    open: Mutex<Open>,
    vm: VirtualMachine,
    ops: Ops,
    options: ContextOptions,
    /// Whether a call that fills the batch leaves the flush to its caller
    /// ([`Context::deferring_flushes`]).
    defer_flush: bool,
    /// Set (deferring contexts only) once `flush_every` calls are pending; cleared by a flush.
    flush_due: AtomicBool,
}

/// An eager front end over one [`VirtualMachine`]: creates [`Array`]s and runs their ops.
///
/// Every call is checked when it is made (op known on the device, live operands of this
/// VM, devices, shapes and dtypes, size) and refused with the builder's typed [`Error`]; an
/// accepted call returns its result arrays at once and runs later, asynchronously, once
/// its batch is handed to the VM (module docs). A context is a counted handle: cloning it
/// is cheap and shares it, and it is `Send` and `Sync` (calls from several threads are
/// built one at a time, in the order they take its lock). It keeps its VM running while it
/// or any of its arrays lives.
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
/// assert_eq!(x.add(&w)?.to_vec::<f32>()?, vec![1.5, -1.5, 3.5, -3.5]); // w broadcasts
/// assert!(x.add(&cx.zeros(&[3], DType::F32, DeviceId::CPU)?).is_err()); // refused at the call
/// # Ok::<(), eagervm::Error>(())
/// ```
#[derive(Clone)]
pub struct Context {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("options", &self.shared.options)
            .field("stats", &self.stats())
            .finish()
    }
}

impl Context {
    /// A context with the default options.
    pub fn new(vm: &VirtualMachine) -> Self {
        Self::with_options(vm, ContextOptions::default())
    }

    /// A context with the given options (`flush_every` 0 counts as 1).
    pub fn with_options(vm: &VirtualMachine, options: ContextOptions) -> Self {
        Self::make(vm, options, false)
    }

    /// A context whose calls never flush on the caller's behalf when `flush_every` are
    /// pending: [`flush_due`](Self::flush_due) says so, and the caller flushes. The Python
    /// binding flushes that way, with the GIL released, since a flush may wait for
    /// back-pressure (`python::issue`).
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn deferring_flushes(vm: &VirtualMachine, options: ContextOptions) -> Self {
        Self::make(vm, options, true)
    }

    /// Whether `flush_every` calls are pending in a context made by
    /// [`deferring_flushes`](Self::deferring_flushes).
    #[inline]
    #[cfg_attr(not(feature = "python"), allow(dead_code))]
    pub(crate) fn flush_due(&self) -> bool {
        self.shared.flush_due.load(Ordering::Relaxed)
    }

    fn make(vm: &VirtualMachine, options: ContextOptions, defer_flush: bool) -> Self {
        // Cannot fail: every VM registers the built-in ops, these among them (a test of
        // `Context::new` on every device type checks it).
        let ops = Ops::resolve(vm).expect("every VM registers the built-in ops");
        let options = ContextOptions { flush_every: options.flush_every.max(1) };
        let vm = vm.share();
        // The builder holds a counted handle of the engine: it may stay open for as long as
        // the context lives.
        let b = InstructionsBuilder::owned(vm.engine().clone());
        Context {
            shared: Arc::new(Shared {
                open: Mutex::new(Open { b, pending: 0, calls: 0, flushes: 0 }),
                vm,
                ops,
                options,
                defer_flush,
                flush_due: AtomicBool::new(false),
            }),
        }
    }

    /// The VM this context runs on.
    pub fn vm(&self) -> &VirtualMachine {
        &self.shared.vm
    }

    /// The options in force.
    pub fn options(&self) -> ContextOptions {
        self.shared.options
    }

    /// Counters: calls accepted, flushes, calls built and not yet handed to the VM.
    pub fn stats(&self) -> ContextStats {
        let open = self.shared.open.lock();
        ContextStats { calls: open.calls, flushes: open.flushes, pending: open.pending }
    }

    /// Whether `other` is a handle of this context.
    pub fn same(&self, other: &Context) -> bool {
        Arc::ptr_eq(&self.shared, &other.shared)
    }

    pub(super) fn ops(&self) -> &Ops {
        &self.shared.ops
    }

    /// A `shape` array of `dtype` on `device`, every element 0.
    pub fn zeros(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Array> {
        self.full(shape, Scalar::Int(0), dtype, device)
    }

    /// A `shape` array of `dtype` on `device`, every element 1.
    pub fn ones(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Array> {
        self.full(shape, Scalar::Int(1), dtype, device)
    }

    /// A `shape` array of `dtype` on `device`, every element `value` (converted as `fill`
    /// converts it: an integer exactly, a float truncated toward zero for an integer dtype).
    /// Filled on the device's compute stream.
    pub fn full(
        &self,
        shape: &[usize],
        value: impl Into<Scalar>,
        dtype: DType,
        device: DeviceId,
    ) -> Result<Array> {
        let stream = self.vm().compute_stream(device)?;
        let out = self.vm().empty_at(shape, dtype, device, || format!("output 0 of `fill` on {device}"))?;
        self.call_into(self.shared.ops.fill, &[], &[&out], Attrs::of(value.into()), stream)?;
        Ok(self.array(out))
    }

    /// A `shape` array of `dtype` on `device` that nothing has written: reading it before a
    /// write is [`Error::Uninitialized`] (PyTorch's `empty` gives whatever the memory held;
    /// the first write of any part of it allocates its storage zeroed).
    pub fn empty(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Array> {
        if !device.is_host() {
            self.vm().compute_stream(device)?;
        }
        let t = self.vm().empty_at(shape, dtype, device, || format!("`empty` on {device}"))?;
        Ok(self.array(t))
    }

    /// A 0-d array holding `value` as `dtype`, on `device`.
    pub fn scalar(&self, value: impl Into<Scalar>, dtype: DType, device: DeviceId) -> Result<Array> {
        self.full(&[], value, dtype, device)
    }

    /// The values `start, start + step, ...` below `end` (above it for a negative step), as
    /// `dtype`: `ceil((end - start) / step)` of them, as PyTorch's `arange`. Computed on the
    /// host in `f64` (in `i64` for an integer dtype), then copied to `device`.
    pub fn arange(&self, start: f64, end: f64, step: f64, dtype: DType, device: DeviceId) -> Result<Array> {
        let bad = |detail: String| Error::InvalidOperands { op: "arange".into(), detail };
        if step == 0.0 || !step.is_finite() || !start.is_finite() || !end.is_finite() {
            return Err(bad(format!(
                "start {start}, end {end} and step {step} must be finite, and step nonzero"
            )));
        }
        if (end - start) * step < 0.0 {
            return Err(bad(format!(
                "upper bound and larger bound inconsistent with step sign: {start}..{end} by {step}"
            )));
        }
        let n = ((end - start) / step).ceil().max(0.0);
        if n > (isize::MAX as f64) {
            return Err(bad(format!("{n} elements from {start} to {end} by {step}: too many")));
        }
        let n = n as usize;
        crate::vm::shape::check(&[n], dtype, self.vm().engine().config().max_tensor_bytes, || {
            format!("`arange` on {device}")
        })?;
        let mut bytes = Vec::new();
        bytes.try_reserve_exact(n * dtype.size()).map_err(|e| bad(format!("{n} elements: {e}")))?;
        for i in 0..n {
            let v = if dtype.is_floating() {
                Scalar::Float(start + i as f64 * step)
            } else {
                Scalar::Int(start as i64 + (i as f64 * step) as i64)
            };
            crate::vm::write_element(dtype, v, &mut bytes);
        }
        self.from_bytes(&bytes, &[n], dtype, device)
    }

    /// An array of `shape` and `dtype` on `device` holding `bytes`: its elements, native-
    /// endian, row-major (as `Element::to_bytes` writes them).
    pub fn from_bytes(&self, bytes: &[u8], shape: &[usize], dtype: DType, device: DeviceId) -> Result<Array> {
        macro_rules! from_as {
            ($t:ty) => {{
                let v = <$t as Element>::try_from_bytes(bytes).map_err(|e| Error::Access {
                    tensor: 0,
                    detail: format!("out of memory for {} bytes of values ({e})", bytes.len()),
                })?;
                self.from_slice(&v, shape, device)
            }};
        }
        match dtype {
            DType::Bool => from_as!(bool),
            DType::U8 => from_as!(u8),
            DType::I32 => from_as!(i32),
            DType::I64 => from_as!(i64),
            DType::F16 => from_as!(crate::framework::f16),
            DType::BF16 => from_as!(crate::framework::bf16),
            DType::F32 => from_as!(f32),
            DType::F64 => from_as!(f64),
        }
    }

    /// An array holding `data` (row-major, `shape`), on `device`: written on the host, then
    /// copied through the device's host-to-device stream if `device` is not the host.
    pub fn from_slice<T: Element>(&self, data: &[T], shape: &[usize], device: DeviceId) -> Result<Array> {
        let host =
            self.vm().empty_at(shape, T::DTYPE, DeviceId::CPU, || format!("`from_slice` on {device}"))?;
        if !device.is_host() {
            // Refuse an unknown device before building anything.
            self.vm().stream(device, StreamType::H2D)?;
        }
        self.build(&[], |b| b.write(&host, data))?;
        self.array(host).to(device)
    }

    /// Adopt a low-level tensor. Ops on it are ordered after everything the VM was given
    /// for it before this call.
    pub fn wrap(&self, tensor: Tensor) -> Array {
        self.array(tensor)
    }

    /// Call any registered op by name on `device`'s compute stream. `given` is for ops whose
    /// outputs the caller chooses (`fill`, `noop`, `fail`); it is empty otherwise. Returns
    /// the outputs in order.
    pub fn call(
        &self,
        op: &str,
        inputs: &[&Array],
        attrs: Attrs,
        given: &[OutSpec],
        device: DeviceId,
    ) -> Result<Vec<Array>> {
        let op = self.vm().op(op)?;
        let stream = self.vm().compute_stream(device)?;
        if given.is_empty() {
            return Ok(self.call_multi(op, inputs, attrs, stream)?.into_vec());
        }
        // The kernel's `infer` sees the given outputs first, as in the builder's check: a
        // call it refuses is refused for that, whatever the outputs' sizes. (A second
        // `infer`, for calls with given outputs only; the builder's is then a cache hit.)
        let kernel = op.kernel(device.ty).ok_or_else(|| self.vm().unknown_op(op.name(), device))?;
        let metas: Vec<TensorMeta> =
            given.iter().map(|s| TensorMeta::new(&s.shape, s.dtype, device)).collect();
        let in_metas: SmallVec<[&TensorMeta; 4]> =
            inputs.iter().map(|a| a.tensor_unflushed().meta()).collect();
        let given_metas: SmallVec<[&TensorMeta; 2]> = metas.iter().collect();
        let mut specs = OutSpecs::new();
        kernel
            .infer(&in_metas, &given_metas, &attrs, &mut specs)
            .map_err(|detail| Error::InvalidOperands { op: op.name().into(), detail })?;
        // The outputs are what `infer` gives (ops whose outputs follow from their inputs
        // ignore the given ones).
        let outs = specs
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let at = || format!("output {i} of `{}` on {device}", op.name());
                self.vm().empty_at(&s.shape, s.dtype, device, at)
            })
            .collect::<Result<Vec<Tensor>>>()?;
        {
            let out_refs: SmallVec<[&Tensor; 2]> = outs.iter().collect();
            let ins: SmallVec<[&Tensor; 4]> = inputs.iter().map(|a| a.tensor_unflushed()).collect();
            self.build(inputs, |b| b.call_into(op, &ins, &out_refs, attrs, stream))?;
        }
        Ok(outs.into_iter().map(|t| self.array(t)).collect())
    }

    /// Hand every call built so far to the VM now (it runs them asynchronously).
    pub fn flush(&self) -> Result<()> {
        let mut open = self.shared.open.lock();
        self.flush_open(&mut open);
        Ok(())
    }

    /// Flush, then wait for everything the VM was given so far ([`VirtualMachine::sync`]).
    pub fn sync(&self) -> Result<()> {
        self.flush()?;
        self.vm().sync()
    }

    /// A host access of `t`, an array of this context (`Array::to_vec`, `Array::wait`): built
    /// into the open batch, which is handed to the VM with it, so that an idle VM lets this
    /// thread run the batch itself instead of waking two others (`vm::Handoff`). The lock is
    /// held only until the batch is handed over.
    pub(super) fn host_access(&self, t: &Tensor, wait_only: bool) -> Result<Vec<u8>> {
        let what = if wait_only { HostAccess::Wait } else { HostAccess::Read };
        let (slot, _) = self.begin_host_access(t, what)?;
        self.shared.vm.engine().wait_access(&slot)
    }

    /// The first half of [`host_access`](Self::host_access): build the access into the
    /// open batch and hand the batch over, running it on this thread if the VM lets it.
    /// Returns the slot to wait on (`Engine::wait_access`) and whether the batch ran here,
    /// in which case the slot holds the answer already. The Python binding waits on
    /// another thread otherwise (`python::wait`), so that Ctrl-C cuts the wait short.
    pub(crate) fn begin_host_access(&self, t: &Tensor, what: HostAccess) -> Result<(Arc<AccessSlot>, bool)> {
        let (slot, handoff) = {
            let mut open = self.shared.open.lock();
            let slot = build_host_access(&mut open.b, t, what)?;
            if open.pending > 0 {
                open.flushes += 1;
            }
            open.pending = 0;
            self.shared.flush_due.store(false, Ordering::Relaxed);
            (slot, open.b.flush_for_wait())
        };
        let ran_here = handoff.is_claimed();
        handoff.finish();
        Ok((slot, ran_here))
    }

    fn flush_open(&self, open: &mut Open) {
        if open.pending > 0 {
            open.flushes += 1;
        }
        open.b.flush();
        open.pending = 0;
        self.shared.flush_due.store(false, Ordering::Relaxed);
    }

    /// An array of this context.
    pub(super) fn array(&self, t: Tensor) -> Array {
        Array::new(t, self.clone())
    }

    /// Build one call with the open builder: first flush the other contexts whose arrays
    /// it uses (without holding our lock), then check and build it under our lock, and
    /// flush if `flush_every` calls are built (or, for a context made by
    /// [`deferring_flushes`](Self::deferring_flushes), say that a flush is due). The Python
    /// binding's instruction-list API builds through here too, so that its calls and the
    /// eager ones reach the VM in the order they were made.
    pub(crate) fn build<R>(
        &self,
        inputs: &[&Array],
        f: impl FnOnce(&mut InstructionsBuilder<'static>) -> Result<R>,
    ) -> Result<R> {
        for a in inputs {
            if !self.same(a.context()) {
                a.context().flush()?;
            }
        }
        let mut open = self.shared.open.lock();
        let r = f(&mut open.b)?;
        open.calls += 1;
        open.pending += 1;
        if open.pending >= self.shared.options.flush_every {
            if self.shared.defer_flush {
                self.shared.flush_due.store(true, Ordering::Relaxed);
            } else {
                self.flush_open(&mut open);
            }
        }
        Ok(r)
    }

    /// Call single-output `op` on `stream`, creating its output there.
    ///
    /// The inputs come as an array, not a slice, so that their tensors need no vector.
    /// The result's handle of this context is counted before the lock is taken: an
    /// atomic instruction costs least before the call's stores are pending, not after them
    /// (`docs/performance.md`, "The call path").
    #[inline]
    pub(super) fn call1<const N: usize>(
        &self,
        op: Op,
        inputs: [&Array; N],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<Array> {
        let cx = self.clone();
        let ins: [&Tensor; N] = inputs.map(Array::tensor_unflushed);
        let t = self.build(&inputs, |b| b.call(op, &ins, attrs, stream))?;
        Ok(Array::new(t, cx))
    }

    /// Call `op` on `stream`, creating its outputs there.
    pub(super) fn call_multi(
        &self,
        op: Op,
        inputs: &[&Array],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<SmallVec<[Array; 2]>> {
        let ins: SmallVec<[&Tensor; 4]> = inputs.iter().map(|a| a.tensor_unflushed()).collect();
        let outs = self.build(inputs, |b| b.call_multi(op, &ins, attrs, stream))?;
        Ok(outs.into_iter().map(|t| self.array(t)).collect())
    }

    /// Call `op` on `stream`, writing `outputs` (tensors of this VM).
    pub(super) fn call_into(
        &self,
        op: Op,
        inputs: &[&Array],
        outputs: &[&Tensor],
        attrs: Attrs,
        stream: StreamId,
    ) -> Result<()> {
        let ins: SmallVec<[&Tensor; 4]> = inputs.iter().map(|a| a.tensor_unflushed()).collect();
        self.build(inputs, |b| b.call_into(op, &ins, outputs, attrs, stream))
    }
}
