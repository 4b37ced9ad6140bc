//! CUDA memory: the raw device-memory source under the caching allocator, pinned host
//! staging buffers, and host functions enqueued on a stream.

use std::collections::BTreeMap;
use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, DriverError};
use parking_lot::Mutex;

use crate::alloc::device::{RawMemory, RawMemoryError};

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
}

// SAFETY: a `PinnedBuf` is the sole owner of its page-locked allocation (it is only ever in
// the pool or held by one copy in flight); moving it between threads moves owned memory.
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

    /// A buffer of at least `bytes` bytes: a pooled one of its size class, or a new one.
    pub(crate) fn take(&self, bytes: usize) -> Result<PinnedBuf, DriverError> {
        let size = bytes.max(4096).next_power_of_two();
        if let Some(b) = self.free.lock().get_mut(&size).and_then(Vec::pop) {
            return Ok(b);
        }
        self.ctx.bind_to_thread()?;
        let mut p: *mut c_void = std::ptr::null_mut();
        // SAFETY: `p` is a valid out-pointer; flags 0: pinned, neither portable, mapped nor
        // write-combined.
        unsafe { sys::cuMemHostAlloc(&mut p, size, 0) }.result()?;
        Ok(PinnedBuf { ptr: p.cast(), size })
    }

    /// Return a buffer for reuse.
    pub(crate) fn give(&self, b: PinnedBuf) {
        self.free.lock().entry(b.size).or_default().push(b);
    }
}

impl Drop for PinnedPool {
    fn drop(&mut self) {
        let _ = self.ctx.bind_to_thread();
        for (_, bufs) in std::mem::take(&mut *self.free.lock()) {
            for b in bufs {
                // SAFETY: each pooled buffer came from `cuMemHostAlloc` and is freed once;
                // buffers in flight hold an `Arc` to the pool, so none is in use now.
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
