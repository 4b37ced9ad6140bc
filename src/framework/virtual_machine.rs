//! [`VirtualMachine`]: the user's handle to a VM, and the front end's per-VM state.
//!
//! A `VirtualMachine` owns a running engine (`vm::Engine`) and is the only way in: it makes
//! tensors, lends [`InstructionsBuilder`]s to [`run`](VirtualMachine::run), reads tensors
//! back, syncs and profiles. What the front end keeps per VM ([`Front`]: the op registry,
//! the release rule, the pooled inference caches) lives with the engine as the opaque value
//! the engine keeps for the layer above, so that a tensor, which knows only its engine,
//! reaches it when its last handle drops.
//!
//! # Tracing
//!
//! `sync` and `host_wait` (`Tensor::wait`, `to_vec`) are DEBUG spans, one per call.

use std::sync::Arc;

use crossbeam_queue::SegQueue;

use crate::alloc::{HostLoan, Storage};
use crate::ep::{DeviceId, StreamType};
use crate::profile::{Profile, ProfileError};
use crate::vm::engine::{Engine, EngineHandle};
use crate::vm::instruction::{AccessSlot, Batch};
use crate::vm::observe::ThreadRole;
use crate::vm::tensor::{Fetch, MetaId, TensorOwner};
use crate::vm::{Attrs, Config, DType, Element, Error, Result, StreamId, TensorMeta};

use super::builder::{push_release, InstructionsBuilder};
use super::infer_cache::InferCache;
use super::op::{Op, OpRegistry};
use super::release::Releases;
use super::tensor::Tensor;

/// What the front end keeps per VM, with the engine (`Engine::front`).
pub(crate) struct Front {
    pub(crate) ops: OpRegistry,
    /// When a tensor's `Release` may be submitted (`framework::release`).
    pub(crate) releases: Releases<TensorOwner>,
    /// Inference caches left by finished builders, for the next ones.
    infer_caches: SegQueue<Box<InferCache>>,
    /// The communicators made on this VM (`framework::collective`).
    pub(crate) communicators: parking_lot::Mutex<Vec<super::collective::Communicator>>,
}

/// The front end's state kept with `engine`.
#[inline]
pub(crate) fn front(engine: &Engine) -> &Front {
    engine.front().downcast_ref::<Front>().expect("every engine is started by `VirtualMachine::new`")
}

impl Front {
    /// A shape-inference cache for a new builder (warm if an earlier builder left one).
    pub(crate) fn take_infer_cache(&self) -> Box<InferCache> {
        self.infer_caches.pop().unwrap_or_default()
    }

    /// Keep a builder's inference cache for the next builder.
    pub(crate) fn recycle_infer_cache(&self, cache: Box<InferCache>) {
        self.infer_caches.push(cache);
    }

    /// The error for an op with no kernel on `device`.
    pub(crate) fn unknown_op(&self, name: &str, device: DeviceId) -> Error {
        match self.ops.resolve(name, device) {
            Err(e) => e,
            Ok(_) => unreachable!("asked only for missing kernels"),
        }
    }
}

/// A new tensor of `engine` for the use `fetch` says; `meta_id` is the engine's number for
/// `meta`.
pub(crate) fn new_tensor(engine: &Engine, meta: TensorMeta, meta_id: MetaId, fetch: Fetch) -> Tensor {
    new_tensor_with_id(engine, engine.next_tensor_id(), meta, meta_id, fetch)
}

/// [`new_tensor`] with an id the caller reserved (`Engine::reserve_tensor_ids`).
#[inline]
pub(crate) fn new_tensor_with_id(
    engine: &Engine,
    id: u64,
    meta: TensorMeta,
    meta_id: MetaId,
    fetch: Fetch,
) -> Tensor {
    Tensor::made_for(id, meta, meta_id, engine.identity(), fetch)
}

/// Submit the `Release`s of `owners` (`framework::release`), without waiting for
/// back-pressure.
pub(crate) fn submit_releases(engine: &Engine, owners: impl IntoIterator<Item = TensorOwner>) {
    if let Some(b) = release_batch(engine, owners) {
        engine.submit_unbounded(b);
    }
    super::tensor::drop_handed_bases();
}

/// The batch of the `Release`s of `owners`, if there are any.
pub(crate) fn release_batch(engine: &Engine, owners: impl IntoIterator<Item = TensorOwner>) -> Option<Batch> {
    let mut b = None;
    for t in owners {
        push_release(b.get_or_insert_with(|| engine.take_batch()), t);
    }
    b
}

/// Emit the `Release` that `t` (marked released) will be owned by, once every builder batch
/// open now has been submitted (`framework::release`).
pub(crate) fn release_owned(engine: &Engine, t: TensorOwner) {
    let ready = front(engine).releases.release(t);
    submit_releases(engine, ready);
}

/// Release `t` while handles of it may still be alive (`Array::release`): its `Release`
/// follows every use already built, on any thread (`framework::release`), and later calls
/// on it are refused. The handle proves the tensor alive; the `Release` gets a count of its
/// own.
pub(crate) fn release_tensor(engine: &Engine, t: &Tensor) {
    use crate::vm::views::Release;
    let t = t.inner();
    // An owner whose storage views still use keeps it for them: its `Release` comes when
    // its last reference (the last view's among them) drops (`vm::views` has the handshake
    // with a view made meanwhile). A view's own count is always 0.
    match t.views.release(&t.released) {
        Release::Again => {}
        Release::AfterViews => t.release_deferred.store(true, std::sync::atomic::Ordering::Relaxed),
        Release::Now => release_owned(engine, TensorOwner::counted(t)),
    }
}

/// Wait until every instruction issued so far that writes `t` has finished.
pub(crate) fn wait_tensor(engine: &Arc<Engine>, t: &Tensor) -> Result<()> {
    host_access(engine, t, HostAccess::Wait).map(|_| ())
}

/// `t`'s bytes, once every instruction issued so far that writes it has finished.
pub(crate) fn read_bytes(engine: &Arc<Engine>, t: &Tensor) -> Result<Vec<u8>> {
    host_access(engine, t, HostAccess::Read).map(|(bytes, _)| bytes)
}

/// A loan of `t`'s host bytes (of a host copy for a device tensor), once every instruction
/// issued so far that writes it has finished (`Tensor::lend_host`).
pub(crate) fn lend_host(engine: &Arc<Engine>, t: &Tensor) -> Result<HostLoan> {
    match host_access(engine, t, HostAccess::Lend)? {
        (_, Some(loan)) => Ok(loan),
        (_, None) => unreachable!("a lending access that succeeds keeps a loan"),
    }
}

/// What a host access gives its caller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HostAccess {
    /// Nothing but the error state (`Tensor::wait`).
    Wait,
    /// A copy of the bytes (`Tensor::to_vec`).
    Read,
    /// A loan of the bytes (`Tensor::lend_host`).
    Lend,
}

/// A host access of `t` (a tensor of this VM): its bytes (`Read`), a loan of them
/// (`Lend`), nothing (`Wait`), or the error it carries. A device tensor is first copied
/// to a new host tensor on the device's device-to-host stream; that copy answers for a
/// device tensor nothing has written as the access does for a host one ([`Fetch`]): `wait`
/// passes, `to_vec` and a loan return `Uninitialized` with the op `Access`, and none counts
/// as a failure. A loan of such a copy outlives the copy's tensor (`alloc::lend`).
fn host_access(engine: &Arc<Engine>, t: &Tensor, what: HostAccess) -> Result<(Vec<u8>, Option<HostLoan>)> {
    let wait_only = what != HostAccess::Read;
    let _span = tracing::debug_span!("host_wait", tensor = t.id(), device = %t.device(), wait_only).entered();
    let mut b = InstructionsBuilder::new(engine);
    let slot = build_host_access(&mut b, t, what)?;
    b.flush_for_wait().finish();
    drop(b);
    super::tensor::drop_handed_bases();
    let bytes = engine.wait_access(&slot)?;
    Ok((bytes, slot.take_loan()))
}

/// Build into `b` a host access of `t` (a tensor of `b`'s VM), as [`host_access`] makes it,
/// and return the slot its result will come to. The caller submits `b`'s batch, preferably
/// with [`InstructionsBuilder::flush_for_wait`], and waits on the slot.
///
/// A wait reads no bytes: it is an access of the tensor's storage on the host stream,
/// wherever the storage lives (a device stream that last wrote it records an event the host
/// waits for: soft sync). A read or a loan needs the tensor's elements as host bytes, in
/// order: a host tensor that is its whole storage is read in place; any other (a device
/// tensor, a view of part of a storage) is first copied to a new contiguous host tensor, on
/// its device's device-to-host stream, or the host's compute stream for a host view.
pub(crate) fn build_host_access(
    b: &mut InstructionsBuilder<'_>,
    t: &Tensor,
    what: HostAccess,
) -> Result<Arc<AccessSlot>> {
    let slot = if what == HostAccess::Lend { AccessSlot::lending() } else { AccessSlot::new() };
    let engine = b.engine();
    if what == HostAccess::Wait {
        b.read_into(t, slot.clone(), true)?;
    } else if t.device().is_host() && t.is_whole() {
        b.read_into(t, slot.clone(), false)?;
    } else {
        let stream = match t.device().is_host() {
            true => engine.stream_of(t.device(), StreamType::Compute)?,
            false => engine.stream_of(t.device(), StreamType::D2H)?,
        };
        let copy = front(engine).ops.resolve("copy", t.device())?;
        let meta = TensorMeta::new(t.shape(), t.dtype(), DeviceId::CPU);
        let host = new_tensor(engine, meta.clone(), engine.intern(&meta), Fetch::Read);
        b.call_into(copy, &[t], &[&host], Attrs::default(), stream)?;
        b.read_into(&host, slot.clone(), false)?;
    }
    Ok(slot)
}

/// The eager-execution virtual machine.
///
/// Dropping it drains every instruction it was given, shuts it down and joins its threads,
/// unless eager contexts or arrays made on it are still alive (`eager`): they keep it
/// running, and it shuts down so when the last of them drops.
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
    core: Arc<Core>,
}

/// What a [`VirtualMachine`] and every eager context made on it share: the running engine.
/// Dropping the last of them shuts the engine down (`Core`'s drop, then the handle's).
struct Core {
    handle: EngineHandle,
}

impl Drop for Core {
    fn drop(&mut self) {
        // No builder is left (each borrows a live handle of the VM): nothing can hold a
        // release back. Dropping the handle afterwards shuts the engine down and joins its
        // threads.
        let engine = self.handle.engine();
        let left = front(engine).releases.take_all();
        submit_releases(engine, left);
        // What is still queued runs to the end, but a simulated device's delays are not
        // waited out one by one (the mock device: `ep::mock`, "What it models").
        for s in engine.streams() {
            s.ep.end_simulated_time();
        }
    }
}

impl std::fmt::Debug for VirtualMachine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.engine().fmt(f)
    }
}

impl VirtualMachine {
    /// Start a VM: open the devices, build the stream table and start the threads.
    pub fn new(config: Config) -> Result<Self> {
        Self::with_registry(config, OpRegistry::with_builtins())
    }

    /// A VM whose ops are `registry`'s: the built-in ones plus a framework's own kernels
    /// (`OpRegistry::register`; a kernel registered under a built-in name replaces it).
    /// Refused with [`Error::Config`] if the registry lacks a built-in op the front ends call
    /// (start from [`OpRegistry::with_builtins`]).
    ///
    /// ```
    /// use eagervm::prelude::*;
    /// use eagervm::framework::{KernelCtx, OpKernel, OpRegistry, OutSpec, OutSpecs, TensorMeta};
    /// use eagervm::ep::DeviceType;
    ///
    /// /// `x * x` for f32 tensors of any layout.
    /// struct Square;
    /// impl OpKernel for Square {
    ///     fn name(&self) -> &'static str { "square" }
    ///     fn infer(&self, inputs: &[&TensorMeta], _: &[&TensorMeta], _: &Attrs, out: &mut OutSpecs) -> Result<(), String> {
    ///         match inputs {
    ///             [x] if x.dtype == DType::F32 => Ok(out.push(OutSpec { shape: x.shape.clone(), dtype: DType::F32 })),
    ///             _ => Err("square takes one f32 tensor".into()),
    ///         }
    ///     }
    ///     fn strided(&self) -> bool { true }
    ///     fn compute(&self, ctx: &mut KernelCtx<'_, '_>) -> Result<(), String> {
    ///         let (x, y) = (&ctx.inputs[0], &ctx.outputs[0]);
    ///         let (from, to) = (x.data.as_ptr() as *const f32, y.data.as_mut_ptr() as *mut f32);
    ///         // Row-major over the output's index; each operand at offset + Σ index·stride.
    ///         let mut index = vec![0usize; x.meta.shape.len()];
    ///         for _ in 0..x.meta.numel() {
    ///             let at = |m: &TensorMeta| m.offset as isize + index.iter().zip(&m.strides).map(|(&i, &s)| i as isize * s).sum::<isize>();
    ///             // SAFETY: the VM checked both layouts against their storages before the call
    ///             // (a kernel called directly would check `m.check_layout`), and the output
    ///             // shares no storage with the input (the kernel does not say `in_place`).
    ///             unsafe { *to.offset(at(y.meta)) = (*from.offset(at(x.meta))).powi(2) };
    ///             for d in (0..index.len()).rev() {
    ///                 index[d] += 1;
    ///                 if index[d] < x.meta.shape[d] { break }
    ///                 index[d] = 0;
    ///             }
    ///         }
    ///         Ok(())
    ///     }
    /// }
    ///
    /// let mut registry = OpRegistry::with_builtins();
    /// registry.register(DeviceType::Cpu, &Square);
    /// let vm = VirtualMachine::with_registry(Config::default(), registry)?;
    /// let x = vm.from_slice(&[1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 3], DeviceId::CPU)?;
    /// let xt = x.view_layout(&[3, 2], &[1, 3], 0)?; // the transpose, no copy
    /// let (square, cpu) = (vm.op("square")?, vm.compute_stream(DeviceId::CPU)?);
    /// let y = vm.run(|b| b.call(square, &[&xt], Attrs::default(), cpu))?;
    /// assert_eq!(y.to_vec::<f32>()?, vec![1.0, 16.0, 4.0, 25.0, 9.0, 36.0]);
    /// # Ok::<(), eagervm::Error>(())
    /// ```
    pub fn with_registry(config: Config, registry: OpRegistry) -> Result<Self> {
        let missing: Vec<&str> =
            crate::kernels::BUILTINS.iter().map(|k| k.name()).filter(|n| registry.get(n).is_none()).collect();
        if !missing.is_empty() {
            return Err(Error::Config(format!(
                "the op registry lacks the built-in ops {}: start from OpRegistry::with_builtins()",
                missing.join(", ")
            )));
        }
        let front = Front {
            ops: registry,
            releases: Releases::default(),
            infer_caches: SegQueue::new(),
            communicators: Default::default(),
        };
        Ok(VirtualMachine { core: Arc::new(Core { handle: Engine::start(config, Box::new(front))? }) })
    }

    /// Another handle of this VM, which keeps it running as long as it lives (an eager
    /// `Context` holds one).
    pub(crate) fn share(&self) -> VirtualMachine {
        VirtualMachine { core: self.core.clone() }
    }

    #[inline]
    pub(crate) fn engine(&self) -> &Arc<Engine> {
        self.core.handle.engine()
    }

    pub(crate) fn front(&self) -> &Front {
        front(self.engine())
    }

    /// The op called `name` (with its kernel for each device type).
    pub fn op(&self, name: &str) -> Result<Op> {
        self.front().ops.get(name).ok_or_else(|| Error::UnknownOp {
            op: name.into(),
            device: DeviceId::CPU,
            known: self.front().ops.names().join(", "),
        })
    }

    /// The error for an op with no kernel on `device`.
    pub(crate) fn unknown_op(&self, name: &str, device: DeviceId) -> Error {
        self.front().unknown_op(name, device)
    }

    /// The stream of type `ty` on `device` (`cpu:0` has a single stream for every type).
    pub fn stream(&self, device: DeviceId, ty: StreamType) -> Result<StreamId> {
        self.engine().stream_of(device, ty)
    }

    /// The compute stream of `device`.
    pub fn compute_stream(&self, device: DeviceId) -> Result<StreamId> {
        self.stream(device, StreamType::Compute)
    }

    /// Every stream: id, device, type and name.
    pub fn streams(&self) -> Vec<(StreamId, DeviceId, StreamType, String)> {
        self.engine().streams().iter().map(|s| (s.id, s.device, s.ty, s.name.clone())).collect()
    }

    /// A new tensor with no storage yet (allocated by the first instruction that writes it).
    /// Refused with [`Error::TooLarge`] if its size overflows or is over
    /// [`Config::max_tensor_bytes`].
    pub fn empty(&self, shape: &[usize], dtype: DType, device: DeviceId) -> Result<Tensor> {
        self.empty_at(shape, dtype, device, || format!("`empty` on {device}"))
    }

    /// [`empty`](Self::empty) with `strides` (PyTorch's `empty_strided`) that lay the tensor
    /// out densely in some order of its dimensions (row-major up to a permutation, each
    /// element once, offset 0), as the output of a pointwise op over transposed inputs is
    /// laid out. Other strides are refused with [`Error::InvalidOperands`]: they are a
    /// view's ([`Tensor::view_layout`]).
    pub fn empty_strided(
        &self,
        shape: &[usize],
        strides: &[isize],
        dtype: DType,
        device: DeviceId,
    ) -> Result<Tensor> {
        let t = self.empty(shape, dtype, device)?;
        let meta = t.meta().with_layout(shape, strides, 0);
        if strides.len() != shape.len() || strides.iter().any(|&s| s < 0) || !super::layout::is_dense(&meta) {
            return Err(Error::InvalidOperands {
                op: "empty_strided".into(),
                detail: format!(
                    "strides {strides:?} do not lay out shape {shape:?} densely (each element once, in \
                     some order of the dimensions)"
                ),
            });
        }
        if meta.strides == t.meta().strides {
            return Ok(t);
        }
        let engine = self.engine();
        let id = engine.intern(&meta);
        Ok(Tensor::made_strided(engine.next_tensor_id(), meta, id, engine.identity()))
    }

    /// [`empty`](Self::empty), naming the tensor `at()` if it is too large.
    pub(crate) fn empty_at(
        &self,
        shape: &[usize],
        dtype: DType,
        device: DeviceId,
        at: impl FnOnce() -> String,
    ) -> Result<Tensor> {
        let engine = self.engine();
        engine.check_device(device)?;
        crate::vm::shape::check(shape, dtype, engine.config().max_tensor_bytes, at)?;
        let meta = TensorMeta::new(shape, dtype, device);
        let id = engine.intern(&meta);
        Ok(new_tensor(engine, meta, id, Fetch::No))
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
        let copy = self.front().ops.resolve("copy", device)?;
        self.run(|b| {
            b.write(&host, data)?;
            b.call_into(copy, &[&host], &[&dst], Attrs::default(), h2d)
        })?;
        Ok(dst)
    }

    /// A new host tensor whose storage is `len = numel * dtype.size()` bytes of memory the
    /// VM did not allocate, at `ptr`, kept valid by `owner` (a zero-copy import: DLPack,
    /// `docs/python.md`). No instruction is emitted: the tensor is written already. The VM's
    /// instructions read and write those bytes in place; `owner` is dropped when the VM
    /// frees the storage (after the tensor's `Release`, and after every loan of it,
    /// [`Tensor::lend_host`]), on whatever thread frees it. `ptr` is ignored for an empty
    /// shape. Refused, with `owner` dropped at once, as [`empty`](Self::empty) refuses a
    /// shape, and with [`Error::Access`] if `ptr` is not aligned to 8 bytes.
    ///
    /// # Safety
    /// Until `owner` drops, `ptr` must be valid for reads and writes of `len` bytes, and
    /// nothing else may write them while an instruction of the VM may read them, nor access
    /// them while one may write them (an outside party orders itself with the VM by waiting
    /// for it: [`Tensor::wait`], [`sync`](Self::sync)).
    pub unsafe fn from_host_memory(
        &self,
        ptr: std::ptr::NonNull<u8>,
        shape: &[usize],
        dtype: DType,
        owner: Box<dyn Send>,
    ) -> Result<Tensor> {
        let t = self.empty_at(shape, dtype, DeviceId::CPU, || "`from_host_memory`".to_string())?;
        let len = t.meta().bytes();
        let ptr = if len == 0 { std::ptr::NonNull::<u64>::dangling().cast() } else { ptr };
        if ptr.as_ptr() as usize % crate::alloc::lend::FOREIGN_ALIGN != 0 {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!(
                    "foreign memory at {:p} is not aligned to {} bytes",
                    ptr.as_ptr(),
                    crate::alloc::lend::FOREIGN_ALIGN
                ),
            });
        }
        // SAFETY: the caller's contract is `Storage::foreign`'s, and alignment is checked.
        let storage = unsafe { Storage::foreign(ptr, len, owner) };
        // SAFETY: the tensor was made just now: this is its only handle and no instruction
        // names it, so nothing else reaches its value. The batch that first uses it is
        // handed to the scheduler after this, through the inbox, whose release/acquire pair
        // carries the store to the threads that run it.
        unsafe { t.inner().value_mut() }.storage = Some(storage);
        Ok(t)
    }

    /// A new tensor on the CUDA device `device` whose storage is `numel * dtype.size()`
    /// bytes of device memory the VM did not allocate, at device address `addr`, kept valid
    /// by `owner` (a zero-copy DLPack import of CUDA memory, `docs/python.md`), as
    /// [`from_host_memory`](Self::from_host_memory) is for host memory: no instruction is
    /// emitted, the VM's instructions read and write the memory in place, and `owner` is
    /// dropped once the VM frees the storage and no work on the device uses it any more
    /// (behind the `Release` on its stream, or after waiting for the device). That drop may
    /// run in a host function of a CUDA stream (a driver thread), so it must make no CUDA
    /// call and must not wait for anything the VM's work waits for (the Python binding's
    /// owner only puts the producer's tensor on a list). Refused, with
    /// `owner` dropped, as [`empty`](Self::empty) refuses a shape or a device; with
    /// [`Error::Access`] if `addr` is not aligned to 8 bytes; with [`Error::Device`] if the
    /// device is not a CUDA device or the driver does not know `addr` as its memory.
    ///
    /// # Safety
    /// Until `owner` drops, `addr` must be valid device memory of `device` for reads and
    /// writes of the tensor's bytes, and nothing else may write it while an instruction of
    /// the VM may read it, nor access it while one may write it; work of another library
    /// on the device is ordered with the VM's streams by that library (DLPack's `stream`
    /// protocol) or by waiting for the VM.
    pub unsafe fn from_device_memory(
        &self,
        addr: u64,
        shape: &[usize],
        dtype: DType,
        device: DeviceId,
        owner: Box<dyn Send>,
    ) -> Result<Tensor> {
        let t = self.empty_at(shape, dtype, device, || "`from_device_memory`".to_string())?;
        let len = t.meta().bytes();
        if len > 0 && addr % crate::alloc::lend::FOREIGN_ALIGN as u64 != 0 {
            return Err(Error::Access {
                tensor: t.id(),
                detail: format!(
                    "foreign device memory at {addr:#x} is not aligned to {} bytes",
                    crate::alloc::lend::FOREIGN_ALIGN
                ),
            });
        }
        let engine = self.engine();
        let stream = engine.stream(engine.stream_of(device, StreamType::Compute)?)?;
        let buffer = crate::ep::cuda::wrap_foreign(&*stream.ep, addr, len, owner).map_err(Error::Device)?;
        let storage = Storage::foreign_device(buffer);
        // SAFETY: as in `from_host_memory`: the tensor was made just now, so nothing else
        // reaches its value, and the batch that first uses it is handed over after this.
        unsafe { t.inner().value_mut() }.storage = Some(storage);
        Ok(t)
    }

    /// Build instructions with `f` and submit them. Returns what `f` returns. Instructions
    /// built before an error inside `f` are still submitted (they were valid).
    pub fn run<R>(&self, f: impl FnOnce(&mut InstructionsBuilder<'_>) -> R) -> R {
        let mut b = InstructionsBuilder::new(self.engine());
        f(&mut b)
    }

    /// Wait until every instruction submitted so far has finished. Returns
    /// [`Error::Failed`] if any instruction failed since the previous `sync` (the failed
    /// tensors keep their errors either way).
    pub fn sync(&self) -> Result<()> {
        let _span = tracing::debug_span!("sync", in_flight = self.in_flight()).entered();
        self.engine().barrier_wait()?;
        match self.engine().take_failures() {
            Some(e) => {
                tracing::debug!(error = %e, "sync found failures");
                Err(e)
            }
            None => Ok(()),
        }
    }

    /// A snapshot of the flight recorder: per stream, the last `Config::flight_records`
    /// instructions admitted there with their op, operands, state and times, the stream's
    /// progress, and every communicator (`vm::flight`). Its `Display` is the watchdog's
    /// dump format (`docs/distributed.md`, "Failures and the flight recorder"). Taken
    /// without stopping the VM: an instruction being recorded as it is read is left out. In
    /// synchronous mode no instruction is kept.
    pub fn flight_record(&self) -> crate::vm::flight::FlightRecord {
        self.engine().flight_record("snapshot")
    }

    /// Instructions submitted and not yet retired: a reading, for monitoring. The scheduler
    /// counts retirements as it handles completions, so just after [`sync`](Self::sync)
    /// returns the count may still include instructions that have finished; it drains to 0
    /// when nothing else is submitted.
    pub fn in_flight(&self) -> usize {
        self.engine().in_flight()
    }

    /// The configuration the VM runs with.
    pub fn config(&self) -> &Config {
        self.engine().config()
    }

    /// Open a profiling session (closing any open one, whose records are dropped). Every
    /// instruction submitted after this returns is recorded; see [`crate::profile`]. Waits
    /// for the scheduler to see the session open (a barrier, as [`sync`](Self::sync) does,
    /// but leaving failures for the next `sync` to report).
    pub fn start_profiling(&self) -> std::result::Result<(), ProfileError> {
        if self.engine().config().synchronous {
            return Err(ProfileError::Synchronous);
        }
        self.engine().timeline().start();
        self.engine().barrier_wait_scheduled().map_err(|_| ProfileError::ShutDown)
    }

    /// Whether a profiling session is open.
    pub fn is_profiling(&self) -> bool {
        self.engine().timeline().is_on()
    }

    /// Close the profiling session and return what it recorded. Waits first until every
    /// instruction submitted so far has finished (like [`sync`](Self::sync), but leaving
    /// failures for the next `sync` to report).
    pub fn stop_profiling(&self) -> std::result::Result<Profile, ProfileError> {
        let sh = self.engine();
        if sh.config().synchronous {
            return Err(ProfileError::Synchronous);
        }
        if !sh.timeline().is_on() {
            return Err(ProfileError::NotProfiling);
        }
        sh.barrier_wait_scheduled().map_err(|_| ProfileError::ShutDown)?;
        // A last counter sample, so that every session has one.
        let timeline = sh.timeline();
        if let Some(mut r) = timeline.begin(ThreadRole::Scheduler) {
            r.sample(timeline, sh.in_flight(), true);
            r.finish(timeline);
        }
        let session = timeline.stop().ok_or(ProfileError::NotProfiling)?;
        // The scheduler hands its records in before running a barrier's callback and then
        // records afresh while a session is open; the loop that ran the first barrier's
        // callback may still hold records of this session. Workers and watchers hand theirs
        // in before reporting, so they are all in. After this second barrier nothing of
        // the session is left outside the sink.
        sh.barrier_wait_scheduled().map_err(|_| ProfileError::ShutDown)?;
        let threads = sh.thread_names();
        let streams = sh.streams().iter().map(|s| s.name.clone()).collect();
        Ok(crate::profile::build(timeline.drain(session), streams, threads, &timeline.allocator_names()))
    }

    /// Names of the registered ops.
    pub fn op_names(&self) -> Vec<&'static str> {
        self.front().ops.names()
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
        assert_eq!(vm.engine().timeline().pending(), 0);
        vm.start_profiling().unwrap();
        work(&vm);
        assert!(vm.engine().timeline().pending() > 0);
        assert!(!vm.stop_profiling().unwrap().instructions().is_empty());
        work(&vm);
        assert_eq!(vm.engine().timeline().pending(), 0);
    }
}
