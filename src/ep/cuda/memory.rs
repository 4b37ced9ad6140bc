//! CUDA memory: the raw device-memory source under the caching allocator, pinned host
//! staging buffers, host functions enqueued on a stream, and what the DLPack exchange needs
//! of the driver (foreign device memory wrapped as a buffer, another library's stream
//! ordered after the VM's work).

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DriverError};
use parking_lot::Mutex;

use super::stream::{with_current, CudaEpStream};
use crate::ep::memory::caching::{RawMemory, RawMemoryError};
use crate::ep::memory::{Block, DeviceBuffer, DeviceMemory};
use crate::ep::{DeviceId, EpError, Stream};

/// `cuMemAlloc`/`cuMemFree` on one context: the [`RawMemory`] of a CUDA device.
#[derive(Debug)]
pub(crate) struct CudaMemory {
    pub(crate) ctx: Arc<CudaContext>,
}

impl RawMemory for CudaMemory {
    fn allocate(&self, bytes: usize) -> Result<u64, RawMemoryError> {
        self.ctx.bind_to_thread().map_err(|e| RawMemoryError::Other(e.to_string()))?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; the context is current on this thread.
        let r = unsafe { sys::cuMemAlloc_v2(&mut ptr, bytes) };
        match r {
            sys::CUresult::CUDA_SUCCESS => Ok(ptr),
            sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY => Err(RawMemoryError::OutOfMemory),
            other => Err(RawMemoryError::Other(DriverError(other).to_string())),
        }
    }

    fn free(&self, addr: u64, _bytes: usize) {
        let r = self.ctx.bind_to_thread().and_then(|()| {
            // SAFETY: `addr` came from `cuMemAlloc_v2` on this context and the allocator
            // frees each segment once, after synchronising (nothing uses it any more).
            unsafe { sys::cuMemFree_v2(addr) }.result()
        });
        if let Err(e) = r {
            tracing::error!(error = %e, addr, "cuMemFree failed; segment leaked");
        }
    }

    fn synchronize(&self) -> Result<(), RawMemoryError> {
        self.ctx.synchronize().map_err(|e| RawMemoryError::Other(e.to_string()))
    }
}

/// A pinned (page-locked) host buffer, not write-combined, so the host may read it fast
/// after a device-to-host copy.
#[derive(Debug)]
pub(crate) struct PinnedBuf {
    pub(crate) ptr: *mut u8,
    pub(crate) size: usize,
    /// Recorded behind the last work that read the buffer when it was given back with
    /// [`PinnedPool::give_after`]; created on first such use, kept with the buffer.
    event: Option<sys::CUevent>,
    /// Whether `event` was recorded when the buffer was last given back (the buffer may be
    /// reused only once it has been reached).
    pending: bool,
}

// SAFETY: a `PinnedBuf` is the sole owner of its page-locked allocation and of its event (it
// is only ever in the pool or held by one copy in flight); moving it between threads moves
// owned memory and a driver handle, which any thread of the process may use.
unsafe impl Send for PinnedBuf {}

/// Pinned staging buffers of one device, by power-of-two size (at least 4 KiB), reused.
#[derive(Debug)]
pub(crate) struct PinnedPool {
    ctx: Arc<CudaContext>,
    free: Mutex<BTreeMap<usize, Vec<PinnedBuf>>>,
}

impl PinnedPool {
    pub(crate) fn new(ctx: Arc<CudaContext>) -> Arc<PinnedPool> {
        Arc::new(PinnedPool { ctx, free: Mutex::new(BTreeMap::new()) })
    }

    /// A buffer of at least `bytes` bytes: a pooled one of its size class that no device work
    /// still reads, or a new one.
    pub(crate) fn take(&self, bytes: usize) -> Result<PinnedBuf, DriverError> {
        // A size beyond the largest power of two is more than any host can lock.
        let size = bytes
            .max(4096)
            .checked_next_power_of_two()
            .ok_or(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY))?;
        {
            let mut free = self.free.lock();
            if let Some(bufs) = free.get_mut(&size) {
                // The oldest given back first: the likeliest to be reached.
                let ready = bufs.iter().position(|b| {
                    !b.pending
                        || b.event.is_some_and(|e| {
                            // SAFETY: `e` is a live event of this pool's context.
                            let r = unsafe { sys::cuEventQuery(e) };
                            r == sys::CUresult::CUDA_SUCCESS
                        })
                });
                if let Some(i) = ready {
                    let mut b = bufs.remove(i);
                    b.pending = false;
                    return Ok(b);
                }
            }
        }
        self.ctx.bind_to_thread()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; flags 0: pinned, neither portable, mapped nor
        // write-combined.
        unsafe { sys::cuMemHostAlloc(&mut p, size, 0) }.result()?;
        Ok(PinnedBuf { ptr: p.cast(), size, event: None, pending: false })
    }

    /// Return a buffer nothing reads or writes any more.
    pub(crate) fn give(&self, b: PinnedBuf) {
        self.free.lock().entry(b.size).or_default().push(b);
    }

    /// Return a buffer that work enqueued on `stream` (of this pool's context, current on
    /// this thread) still reads: it is handed out again only once the stream has got past
    /// that work, which an event recorded now tells, so that no host function is needed.
    pub(crate) fn give_after(
        &self,
        mut b: PinnedBuf,
        stream: sys::CUstream,
    ) -> Result<(), (PinnedBuf, DriverError)> {
        if b.event.is_none() {
            let mut e: sys::CUevent = std::ptr::null_mut();
            let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
            // SAFETY: `e` is a valid out-pointer; the context is current on this thread.
            if let Err(err) = unsafe { sys::cuEventCreate(&mut e, flags) }.result() {
                return Err((b, err));
            }
            b.event = Some(e);
        }
        let e = b.event.expect("created above");
        // SAFETY: `e` and `stream` are live handles of this context.
        if let Err(err) = unsafe { sys::cuEventRecord(e, stream) }.result() {
            return Err((b, err));
        }
        b.pending = true;
        self.give(b);
        Ok(())
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for (_, bufs) in std::mem::take(&mut *self.free.lock()) {
            for b in bufs {
                if let Some(e) = b.event {
                    // SAFETY: the event is this buffer's alone; waiting for it first lets
                    // the device finish reading the buffer before it is freed below.
                    let r = unsafe { sys::cuEventSynchronize(e) }.result();
                    // SAFETY: as above; destroyed once.
                    let r = r.and_then(|()| unsafe { sys::cuEventDestroy_v2(e) }.result());
                    if let Err(e) = r {
                        tracing::error!(error = %e, "waiting for a staging buffer's event failed");
                    }
                }
                // SAFETY: each pooled buffer came from `cuMemHostAlloc` and is freed once;
                // buffers in flight hold an `Arc` to the pool, and pooled ones have been
                // reached by the device (above), so none is in use now.
                if let Err(e) = unsafe { sys::cuMemFreeHost(b.ptr.cast()) }.result() {
                    tracing::error!(error = %e, "cuMemFreeHost failed");
                }
            }
        }
    }
}

type HostFn = Box<dyn FnOnce() + Send>;

unsafe extern "C" fn trampoline(arg: *mut c_void) {
    // SAFETY: `arg` is the `Box<HostFn>` leaked by `launch_host_fn`, and the driver calls
    // each host function exactly once.
    let f = unsafe { Box::from_raw(arg.cast::<HostFn>()) };
    // Unwinding out of an `extern "C"` function aborts; contain it.
    if std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).is_err() {
        tracing::error!("a host function on a CUDA stream panicked");
    }
}

/// Run `f` on a driver thread once everything enqueued on `stream` before it has finished;
/// work enqueued after it waits for it. `f` must make no CUDA call.
pub(crate) fn launch_host_fn(stream: sys::CUstream, f: HostFn) -> Result<(), DriverError> {
    let arg = Box::into_raw(Box::new(f));
    // SAFETY: `stream` is a live stream of the current context (the caller's); `arg` is a
    // leaked box that `trampoline` takes back exactly once.
    let r = unsafe { sys::cuLaunchHostFunc(stream, Some(trampoline), arg.cast()) }.result();
    if r.is_err() {
        // SAFETY: the driver refused the call, so it will never run `trampoline`: the box is
        // still ours.
        drop(unsafe { Box::from_raw(arg) });
    }
    r
}

// ---------------------------------------------------------------------------------------
// DLPack: device memory another library owns, and ordering another library's stream.

/// The [`DeviceMemory`] behind one block of foreign device memory (a DLPack import): it
/// hands out nothing, and giving its block back drops `owner` (which tells the producer it
/// is done) once nothing on the device uses the block any more.
struct ForeignMemory {
    id: DeviceId,
    ctx: Arc<CudaContext>,
    owner: Mutex<Option<Box<dyn Send>>>,
}

impl std::fmt::Debug for ForeignMemory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ForeignMemory({})", self.id)
    }
}

impl DeviceMemory for ForeignMemory {
    fn device(&self) -> DeviceId {
        self.id
    }

    fn allocate(&self, bytes: usize) -> Result<Block, EpError> {
        Err(EpError::Device {
            device: self.id,
            what: format!("foreign memory allocates nothing (asked for {bytes} bytes)"),
        })
    }

    /// Drop the owner behind the work in flight: the VM gives a block back from the
    /// `Release` launched on the stream that used it last (ordered after every other use),
    /// so a host function behind that launch drops it once the stream has got there. Given
    /// back outside a launch (the last loan of an export, a tensor freed after its VM's
    /// threads stopped), the device is waited for first.
    fn release(&self, _block: Block) {
        let Some(owner) = self.owner.lock().take() else { return };
        let stream = with_current(|s| s.filter(|s| s.shared.id == self.id).map(|s| s.cu_stream()));
        // Shared with the host function, so that a refused launch leaves it here.
        let slot = Arc::new(Mutex::new(Some(owner)));
        if let Some(stream) = stream {
            let behind = slot.clone();
            match launch_host_fn(stream, Box::new(move || drop(behind.lock().take()))) {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, device = %self.id, "cuLaunchHostFunc failed; waiting for the device instead")
                }
            }
        }
        let owner = slot.lock().take();
        match self.ctx.synchronize() {
            Ok(()) => drop(owner),
            Err(e) => {
                // The block cannot be known unused: keep the producer's memory.
                tracing::error!(error = %e, device = %self.id, "cuCtxSynchronize failed; foreign memory kept");
                std::mem::forget(owner);
            }
        }
    }

    fn synchronize(&self) -> Result<(), EpError> {
        self.ctx
            .synchronize()
            .map_err(|e| EpError::Device { device: self.id, what: format!("cuCtxSynchronize: {e}") })
    }
}

/// The stream behind a VM stream of a CUDA device, if it is one.
fn cuda_stream(stream: &dyn Stream) -> Option<&CudaEpStream> {
    stream.as_any().downcast_ref::<CudaEpStream>()
}

/// The raw `CUstream` handle of `stream`, as an integer (what DLPack's `stream` argument
/// carries); `None` for a stream of another backend.
pub(crate) fn raw_stream(stream: &dyn Stream) -> Option<u64> {
    cuda_stream(stream).map(|s| s.cu_stream() as u64)
}

/// Wrap `bytes` bytes of device memory at `addr`, which another library owns and `owner`
/// keeps valid, as a buffer on the device of `stream` (a VM stream of a CUDA device). The
/// address must be memory of that device (the driver is asked: `cuPointerGetAttribute`);
/// otherwise, or for a stream of another backend, a typed error, and `owner` is dropped.
pub(crate) fn wrap_foreign(
    stream: &dyn Stream,
    addr: u64,
    bytes: usize,
    owner: Box<dyn Send>,
) -> Result<DeviceBuffer, EpError> {
    let Some(s) = cuda_stream(stream) else {
        return Err(EpError::Device {
            device: stream.device(),
            what: "foreign device memory can only be wrapped on a CUDA device".into(),
        });
    };
    let (id, ctx) = (s.shared.id, s.shared.ctx.clone());
    if bytes > 0 {
        let err = |what: String| EpError::Device { device: id, what };
        ctx.bind_to_thread().map_err(|e| err(format!("binding the context: {e}")))?;
        let mut ordinal: i32 = -1;
        // SAFETY: `ordinal` is a valid out-pointer for this attribute (an int); the driver
        // reads nothing through `addr`, it looks the address up.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut ordinal as *mut i32).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        };
        if r != sys::CUresult::CUDA_SUCCESS {
            return Err(err(format!(
                "the address {addr:#x} is not device memory the CUDA driver knows ({})",
                DriverError(r)
            )));
        }
        if usize::try_from(ordinal).ok() != Some(ctx.ordinal()) {
            return Err(err(format!(
                "the address {addr:#x} is memory of CUDA device {ordinal}, not of this device (ordinal {})",
                ctx.ordinal()
            )));
        }
        // Memory of another context of the same device is not mapped in this one. (Memory
        // from a stream-ordered pool or mapped with the virtual memory API names no
        // context: its device decides.)
        let mut owner_ctx: sys::CUcontext = std::ptr::null_mut();
        // SAFETY: as above; the attribute is a `CUcontext`.
        let r = unsafe {
            sys::cuPointerGetAttribute(
                (&mut owner_ctx as *mut sys::CUcontext).cast(),
                sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_CONTEXT,
                addr,
            )
        };
        if r == sys::CUresult::CUDA_SUCCESS && !owner_ctx.is_null() && owner_ctx != ctx.cu_ctx() {
            return Err(err(format!(
                "the address {addr:#x} is memory of another CUDA context than the device's primary context, which the VM uses"
            )));
        }
    }
    let memory = Arc::new(ForeignMemory { id, ctx, owner: Mutex::new(Some(owner)) });
    Ok(DeviceBuffer::adopt(memory, Block { addr, size: bytes, requested: bytes }))
}

/// Make `consumer` (a raw `CUstream` handle of a live stream of this device's context, or
/// `CU_STREAM_LEGACY` = 1, `CU_STREAM_PER_THREAD` = 2) wait, on the device, for everything
/// enqueued so far on the CUDA stream whose launch runs on this thread: an event recorded
/// here, which `consumer` waits for. The host does not block.
pub(crate) fn order_after_current(consumer: u64) -> Result<(), String> {
    with_current(|s| {
        let s = s.ok_or("outside a CUDA stream launch")?;
        let mut e: sys::CUevent = std::ptr::null_mut();
        let flags = sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32;
        // SAFETY: `e` is a valid out-pointer; the launch made the stream's context current.
        unsafe { sys::cuEventCreate(&mut e, flags) }.result().map_err(|e| format!("cuEventCreate: {e}"))?;
        // SAFETY: `e` is the live event just made and the stream is live (its launch runs);
        // `consumer` is a live stream of this process's context or a special handle (the
        // caller's contract: DLPack's consumer passes its own stream); the wait is enqueued
        // before the event is destroyed, and the driver keeps an event that a stream waits
        // for until the wait is over.
        let r = unsafe {
            sys::cuEventRecord(e, s.cu_stream())
                .result()
                .map_err(|err| format!("cuEventRecord: {err}"))
                .and_then(|()| {
                    sys::cuStreamWaitEvent(consumer as sys::CUstream, e, 0).result().map_err(|err| {
                        format!("cuStreamWaitEvent on the consumer's stream {consumer:#x}: {err}")
                    })
                })
        };
        // SAFETY: made above, destroyed once.
        let d = unsafe { sys::cuEventDestroy_v2(e) }.result();
        r?;
        d.map_err(|e| format!("cuEventDestroy: {e}"))
    })
}
