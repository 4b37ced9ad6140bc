//! CUDA memory: the raw device-memory source under the caching allocator, pinned host
//! staging buffers, and host functions enqueued on a stream.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DriverError};
use parking_lot::Mutex;

use crate::ep::memory::caching::{RawMemory, RawMemoryError};

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
