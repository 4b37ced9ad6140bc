//! CUDA streams and events behind the `ep` traits.

use std::any::Any;
use std::cell::Cell;
use std::fmt;
use std::sync::{Arc, OnceLock};

use cudarc::driver::{sys, CudaContext, CudaStream, DriverError};
use parking_lot::Mutex;

use super::device::DeviceShared;
use super::memory::launch_host_fn;
use crate::ep::fault::{self, FaultRecord, FaultWords, FreeWords};
use crate::ep::memory::caching::StreamKey;
use crate::ep::memory::defer;
use crate::ep::{DeviceId, EpError, Event, Stream, StreamType};

thread_local! {
    /// The stream whose `launch` is running on this thread, or null.
    static CURRENT: Cell<*const CudaEpStream> = const { Cell::new(std::ptr::null()) };
}

/// Run `f` with the CUDA stream whose [`Stream::launch`] is running on this thread (`None`
/// outside a launch). CUDA kernels enqueue their work on it.
pub fn with_current<R>(f: impl FnOnce(Option<&CudaEpStream>) -> R) -> R {
    let p = CURRENT.with(Cell::get);
    // SAFETY: `CURRENT` is non-null only while `CudaEpStream::launch` runs on this thread,
    // with a pointer to the `&self` it was called on, which outlives that call; it is reset
    // before `launch` returns (also on unwinding), so the reference cannot outlive the
    // stream, and `f` cannot keep it (the borrow ends with `f`).
    f(if p.is_null() { None } else { Some(unsafe { &*p }) })
}

/// A CUDA stream of one device: non-blocking, one per [`StreamType`].
pub struct CudaEpStream {
    pub(crate) shared: Arc<DeviceShared>,
    pub(crate) cu: Arc<CudaStream>,
    ty: StreamType,
    /// The allocator's key for blocks freed on this stream.
    pub(crate) key: StreamKey,
    /// The op of the last launch, for attributing asynchronous faults.
    label: Mutex<&'static str>,
    /// The cuBLAS handle bound to this stream, made on first use.
    pub(crate) blas: OnceLock<Result<cudarc::cublas::CudaBlas, String>>,
    /// The stream's fault record, in pinned host memory mapped into the device
    /// (`ep::fault`): the failable kernels write it at its device address.
    faults: FaultRecord,
}

impl CudaEpStream {
    pub(crate) fn new(
        shared: Arc<DeviceShared>,
        ty: StreamType,
        key: StreamKey,
        priority: Option<i32>,
    ) -> Result<Self, DriverError> {
        let cu = match priority {
            None => shared.ctx.new_stream()?,
            Some(p) => shared.ctx.new_stream_with_priority(p)?,
        };
        let faults = mapped_record(&shared.ctx)?;
        Ok(CudaEpStream { shared, cu, ty, key, label: Mutex::new("(none)"), blas: OnceLock::new(), faults })
    }

    /// The raw stream handle.
    pub fn cu_stream(&self) -> sys::CUstream {
        self.cu.cu_stream()
    }

    /// The cudarc stream.
    pub fn cuda_stream(&self) -> &Arc<CudaStream> {
        &self.cu
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }

    /// Name the op being launched, so that an asynchronous fault found later names it.
    pub fn set_label(&self, op: &'static str) {
        *self.label.lock() = op;
    }

    /// Enqueue `f` to run on a driver thread after everything launched so far (see
    /// `memory::launch_host_fn`; `f` must make no CUDA call).
    pub fn then(&self, f: Box<dyn FnOnce() + Send>) -> Result<(), EpError> {
        launch_host_fn(self.cu_stream(), f).map_err(|e| self.err("cuLaunchHostFunc", e))
    }

    /// Host storages with a write from a host function of this device still pending.
    pub(crate) fn host_writes(&self) -> &Arc<parking_lot::Mutex<std::collections::HashMap<usize, u32>>> {
        &self.shared.host_writes
    }

    pub(crate) fn pinned(&self) -> &Arc<super::memory::PinnedPool> {
        &self.shared.pinned
    }

    pub(crate) fn err(&self, what: &str, e: DriverError) -> EpError {
        EpError::Device { device: self.shared.id, what: format!("{what} on {} stream: {e}", self.ty.name()) }
    }

    fn cuda_event<'e>(&self, event: &'e dyn Event) -> Option<&'e CudaEpEvent> {
        event.as_any().downcast_ref::<CudaEpEvent>()
    }
}

/// A fault record in pinned host memory mapped into `ctx`'s device: kernels write it at its
/// device address, the host reads it in place once the stream has reached them.
fn mapped_record(ctx: &Arc<CudaContext>) -> Result<FaultRecord, DriverError> {
    ctx.bind_to_thread()?;
    let bytes = std::mem::size_of::<FaultWords>();
    let mut host: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: `host` is a valid out-pointer; the context is current. Pinned host memory is
    // page-aligned, more than `FaultWords` needs.
    unsafe { sys::cuMemHostAlloc(&mut host, bytes, sys::CU_MEMHOSTALLOC_DEVICEMAP) }.result()?;
    let mut dev: sys::CUdeviceptr = 0;
    // SAFETY: `host` is a live mapped allocation of this context; `dev` a valid out-pointer.
    let mapped = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut dev, host, 0) }.result();
    if let Err(e) = mapped {
        // SAFETY: `host` came from `cuMemHostAlloc` above and is freed once, here.
        let _ = unsafe { sys::cuMemFreeHost(host) };
        return Err(e);
    }
    // SAFETY: `host` is `bytes` long and writable from the host.
    unsafe { std::ptr::write_bytes(host.cast::<u8>(), 0, bytes) };
    let ctx = ctx.clone();
    let free: FreeWords = Box::new(move |w| {
        let _ = ctx.bind_to_thread();
        // SAFETY: `w` is the `cuMemHostAlloc` block above, given back once, when the record
        // drops (after the stream that wrote it: the record is the stream's field).
        if let Err(e) = unsafe { sys::cuMemFreeHost(w.cast()) }.result() {
            tracing::error!(error = %e, "cuMemFreeHost of a fault record failed");
        }
    });
    // SAFETY: `host` is zeroed, page-aligned memory of `FaultWords`' size, valid until the
    // free; `dev` is its address in the device's space.
    Ok(unsafe { FaultRecord::from_raw(host.cast(), dev, free) })
}

impl fmt::Debug for CudaEpStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEpStream({}:{})", self.shared.id, self.ty.name())
    }
}

/// Resets `CURRENT` when dropped (also on unwinding).
struct ResetCurrent(*const CudaEpStream);

impl Drop for ResetCurrent {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.0));
    }
}

impl Stream for CudaEpStream {
    fn device(&self) -> DeviceId {
        self.shared.id
    }

    fn stream_type(&self) -> StreamType {
        self.ty
    }

    /// Run `work` here, with this stream current: the CUDA kernels it calls enqueue on this
    /// stream and return. Host memory freed by `work` is returned by a host function behind
    /// it (`ep::memory::defer`).
    fn launch(&self, work: Box<dyn FnOnce() + Send>) -> Result<(), EpError> {
        self.shared.ctx.bind_to_thread().map_err(|e| self.err("binding the context", e))?;
        let outer = CURRENT.with(|c| c.replace(self as *const _));
        let reset = ResetCurrent(outer);
        let (ran, deferred) = defer::collect(|| {
            fault::running(Some(&self.faults), || {
                std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
            })
        });
        drop(reset);
        if !deferred.is_empty() {
            if let Err(e) = self.then(Box::new(move || drop(deferred))) {
                // The stream cannot run a host function (the deferred blocks, dropped with
                // the closure, went back at once): wait for the stream so nothing uses them.
                tracing::error!(error = %e, "cannot defer host frees; synchronising");
                self.synchronize()?;
            }
        }
        ran.map_err(|_| EpError::Device {
            device: self.shared.id,
            what: format!("work launched on the {} stream panicked", self.ty.name()),
        })
    }

    fn record(&self, event: &dyn Event) -> Result<(), EpError> {
        let ev = self.cuda_event(event).ok_or_else(|| EpError::Device {
            device: self.shared.id,
            what: format!("cannot record {event:?}: not a CUDA event"),
        })?;
        if ev.device != self.shared.id {
            return Err(EpError::Device {
                device: self.shared.id,
                what: format!("cannot record an event of {} on a stream of {}", ev.device, self.shared.id),
            });
        }
        *ev.after.lock() = (*self.label.lock(), self.ty);
        // SAFETY: both handles are live (owned by `ev` and `self`) and belong to this
        // device's context, which `launch` or the caller has made current.
        unsafe { sys::cuEventRecord(ev.raw, self.cu_stream()) }
            .result()
            .map_err(|e| self.err("cuEventRecord", e))
    }

    fn wait_event(&self, event: &dyn Event) -> Result<(), EpError> {
        let Some(ev) = self.cuda_event(event) else {
            if event.query() {
                return Ok(());
            }
            return Err(EpError::Device {
                device: self.shared.id,
                what: format!("cannot wait on the device for {event:?}: not a CUDA event"),
            });
        };
        self.shared.ctx.bind_to_thread().map_err(|e| self.err("binding the context", e))?;
        // SAFETY: both handles are live; waiting for an event of another context of the
        // same process is allowed by `cuStreamWaitEvent`.
        unsafe { sys::cuStreamWaitEvent(self.cu_stream(), ev.raw, 0) }
            .result()
            .map_err(|e| self.err("cuStreamWaitEvent", e))
    }

    fn synchronize(&self) -> Result<(), EpError> {
        self.cu.synchronize().map_err(|e| self.err("cuStreamSynchronize", e))
    }

    fn faults(&self) -> Option<&FaultRecord> {
        Some(&self.faults)
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// A CUDA event: blocking-sync (host waits sleep), timing disabled.
pub struct CudaEpEvent {
    raw: sys::CUevent,
    ctx: Arc<CudaContext>,
    device: DeviceId,
    /// The op and stream of the last launch before the latest recording.
    after: Mutex<(&'static str, StreamType)>,
}

// SAFETY: a CUevent handle may be used from any thread (the driver API is thread-safe);
// the handle is destroyed only in `drop`, when nothing else holds the event.
unsafe impl Send for CudaEpEvent {}
// SAFETY: as above; every method takes `&self` and the driver synchronises internally.
unsafe impl Sync for CudaEpEvent {}

impl CudaEpEvent {
    pub(crate) fn new(ctx: Arc<CudaContext>, device: DeviceId) -> Result<Self, DriverError> {
        ctx.bind_to_thread()?;
        let mut raw: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_BLOCKING_SYNC as u32
            | sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `raw` is a valid out-pointer; the context is current.
        unsafe { sys::cuEventCreate(&mut raw, flags) }.result()?;
        Ok(CudaEpEvent { raw, ctx, device, after: Mutex::new(("(none)", StreamType::Compute)) })
    }
}

impl fmt::Debug for CudaEpEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "CudaEpEvent({})", self.device)
    }
}

impl Event for CudaEpEvent {
    fn query(&self) -> bool {
        // SAFETY: the handle is live. Any answer but "not ready" counts as complete, so that
        // a waiter goes on to `wait` and gets the error.
        let r = unsafe { sys::cuEventQuery(self.raw) };
        r != sys::CUresult::CUDA_ERROR_NOT_READY
    }

    fn wait(&self) -> Result<(), EpError> {
        let r = self.ctx.bind_to_thread().and_then(|()| {
            // SAFETY: the handle is live; the event is blocking-sync, so this sleeps.
            unsafe { sys::cuEventSynchronize(self.raw) }.result()
        });
        r.map_err(|e| {
            let (op, ty) = *self.after.lock();
            EpError::Device {
                device: self.device,
                what: format!("asynchronous CUDA error after `{op}` on the {} stream: {e}", ty.name()),
            }
        })
    }

    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl Drop for CudaEpEvent {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        // SAFETY: the handle was created by `cuEventCreate` and is destroyed once, here.
        if let Err(e) = unsafe { sys::cuEventDestroy_v2(self.raw) }.result() {
            tracing::error!(error = %e, "cuEventDestroy failed");
        }
    }
}
