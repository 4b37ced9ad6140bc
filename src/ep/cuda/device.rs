//! A CUDA device: its context, streams, events, memory and compiled kernels.

use std::any::Any;
use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, OnceLock};

use cudarc::driver::CudaContext;

use super::memory::{CudaMemory, PinnedPool};
use super::stream::{with_current, CudaEpEvent, CudaEpStream};
use super::CudaUnavailable;
use crate::ep::memory::caching::{CachingAllocator, DeviceAllocError, DeviceAllocStats, StreamKey};
use crate::ep::memory::{Block, DeviceMemory};
use crate::ep::{Device, DeviceId, EpError, Event, Stream, StreamType};

/// What a device's streams, events and storages share.
pub(crate) struct DeviceShared {
    pub(crate) id: DeviceId,
    pub(crate) ctx: Arc<CudaContext>,
    pub(crate) alloc: CachingAllocator<CudaMemory>,
    pub(crate) pinned: Arc<PinnedPool>,
    /// Host storages (by address) that a copy from this device will still write from a
    /// host function, with how many such copies are pending (see `kernels::cuda::CudaCopy`).
    pub(crate) host_writes: Arc<parking_lot::Mutex<std::collections::HashMap<usize, u32>>>,
    next_key: AtomicU32,
    /// The device's compiled kernels (`kernels::cuda`), loaded on first use.
    pub(crate) kernels: OnceLock<Result<Arc<dyn Any + Send + Sync>, String>>,
}

impl fmt::Debug for DeviceShared {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CudaDevice").field("id", &self.id).field("memory", &self.alloc.stats()).finish()
    }
}

impl DeviceShared {
    /// The allocator key of the stream launching on this thread, if it is one of this
    /// device's; otherwise nothing on the device is using the memory (idle).
    fn current_key(&self) -> StreamKey {
        with_current(|s| s.filter(|s| s.shared.id == self.id).map(|s| s.key)).unwrap_or(StreamKey::IDLE)
    }
}

impl DeviceMemory for DeviceShared {
    fn device(&self) -> DeviceId {
        self.id
    }

    fn allocate(&self, bytes: usize) -> Result<Block, EpError> {
        self.alloc.allocate(bytes, self.current_key()).map_err(|e| match e {
            DeviceAllocError::OutOfMemory { .. } => {
                EpError::OutOfMemory { device: self.id, detail: e.to_string() }
            }
            DeviceAllocError::Source { .. } => EpError::Device { device: self.id, what: e.to_string() },
        })
    }

    fn release(&self, block: Block) {
        self.alloc.free(block, self.current_key());
    }

    fn synchronize(&self) -> Result<(), EpError> {
        self.ctx
            .synchronize()
            .map_err(|e| EpError::Device { device: self.id, what: format!("cuCtxSynchronize: {e}") })
    }
}

/// A CUDA device (`cuda:N`).
#[derive(Debug, Clone)]
pub struct CudaDevice {
    pub(crate) shared: Arc<DeviceShared>,
}

impl CudaDevice {
    /// Open `cuda:index` (the libraries were probed by the caller, `cuda::open`).
    pub(crate) fn open(index: u16) -> Result<Arc<dyn Device>, CudaUnavailable> {
        // SAFETY: the probes load the libraries and look for symbols only; no CUDA call.
        let (nvrtc, cublas) =
            unsafe { (cudarc::nvrtc::sys::is_culib_present(), cudarc::cublas::sys::is_culib_present()) };
        if !nvrtc {
            return Err(CudaUnavailable::LibraryMissing { library: "nvrtc" });
        }
        if !cublas {
            return Err(CudaUnavailable::LibraryMissing { library: "cublas" });
        }
        let driver = |e: cudarc::driver::DriverError| CudaUnavailable::Driver(e.to_string());
        let count = CudaContext::device_count().map_err(driver)?;
        if i32::from(index) >= count {
            return Err(CudaUnavailable::NoDevice { count });
        }
        let ctx = CudaContext::new(usize::from(index)).map_err(driver)?;
        // SAFETY: no CudaSlice is ever made on this context: eagervm's memory is raw device
        // pointers from its own allocator, ordered across streams by the VM's instructions.
        unsafe { ctx.disable_event_tracking() };
        if let Err(e) = ctx.set_blocking_synchronize() {
            // The primary context may already be active with other flags; host waits on
            // blocking-sync events still sleep.
            tracing::warn!(error = %e, "cannot set blocking-sync scheduling on cuda:{index}");
        }
        let id = DeviceId::cuda(index);
        let shared = Arc::new(DeviceShared {
            id,
            alloc: CachingAllocator::new(&id.to_string(), CudaMemory { ctx: ctx.clone() }),
            pinned: PinnedPool::new(ctx.clone()),
            host_writes: Arc::default(),
            ctx,
            next_key: AtomicU32::new(0),
            kernels: OnceLock::new(),
        });
        Ok(Arc::new(CudaDevice { shared }))
    }

    /// The allocator's counters.
    pub fn memory_stats(&self) -> DeviceAllocStats {
        self.shared.alloc.stats()
    }

    /// Wait for the device to be idle and give every wholly free cached segment back to the
    /// driver; returns the bytes freed.
    pub fn shrink(&self) -> Result<usize, EpError> {
        self.shared
            .alloc
            .shrink()
            .map_err(|e| EpError::Device { device: self.shared.id, what: e.to_string() })
    }

    /// The device's context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.shared.ctx
    }
}

impl CudaDevice {
    fn make_stream(&self, ty: StreamType, priority: Option<i32>) -> Result<Arc<dyn Stream>, EpError> {
        let key = StreamKey(self.shared.next_key.fetch_add(1, Ordering::Relaxed));
        CudaEpStream::new(self.shared.clone(), ty, key, priority)
            .map(|s| Arc::new(s) as Arc<dyn Stream>)
            .map_err(|e| EpError::Device {
                device: self.shared.id,
                what: format!("cannot create a stream: {e}"),
            })
    }
}

/// The CUDA priority of a stream of VM priority `p` among the VM's priorities `levels`, on
/// a device whose priorities run from `least` to `greatest` (numerically lower is higher).
pub(crate) fn cuda_priority(p: i32, levels: &[i32], least: i32, greatest: i32) -> i32 {
    if p <= 0 {
        return least;
    }
    let above = levels.iter().filter(|&&l| l > p).count();
    greatest.saturating_add(i32::try_from(above).unwrap_or(i32::MAX)).min(least)
}

impl Device for CudaDevice {
    fn id(&self) -> DeviceId {
        self.shared.id
    }

    fn is_async(&self) -> bool {
        true
    }

    fn supports_stream_wait(&self) -> bool {
        true
    }

    fn create_stream(&self, ty: StreamType) -> Result<Arc<dyn Stream>, EpError> {
        self.make_stream(ty, None)
    }

    /// A stream with a CUDA priority: the VM's positive priorities, highest first, get the
    /// device's greatest CUDA priority, the next one below, and so on down to its least;
    /// priorities of 0 and below get the least, CUDA's default (`Config::stream_priorities`).
    fn create_stream_with_priority(
        &self,
        ty: StreamType,
        priority: i32,
        levels: &[i32],
    ) -> Result<Arc<dyn Stream>, EpError> {
        let err = |e: cudarc::driver::DriverError| EpError::Device {
            device: self.shared.id,
            what: format!("cannot read the stream priority range: {e}"),
        };
        self.shared.ctx.bind_to_thread().map_err(err)?;
        let (least, greatest) = cudarc::driver::result::stream::get_priority_range().map_err(err)?;
        self.make_stream(ty, Some(cuda_priority(priority, levels, least, greatest)))
    }

    fn create_event(&self) -> Result<Arc<dyn Event>, EpError> {
        CudaEpEvent::new(self.shared.ctx.clone(), self.shared.id)
            .map(|e| Arc::new(e) as Arc<dyn Event>)
            .map_err(|e| EpError::Device {
                device: self.shared.id,
                what: format!("cannot create an event: {e}"),
            })
    }

    fn memory(&self) -> Option<Arc<dyn DeviceMemory>> {
        Some(self.shared.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::cuda_priority;

    #[test]
    fn vm_priorities_map_onto_the_cuda_range() {
        // A device with priorities 0 (least) to -5 (greatest).
        let levels = [0, 1];
        assert_eq!(cuda_priority(1, &levels, 0, -5), -5);
        assert_eq!(cuda_priority(0, &levels, 0, -5), 0);
        let levels = [-3, 0, 2, 7];
        assert_eq!(cuda_priority(7, &levels, 0, -5), -5);
        assert_eq!(cuda_priority(2, &levels, 0, -5), -4);
        assert_eq!(cuda_priority(-3, &levels, 0, -5), 0);
        // A device without priorities (least == greatest == 0).
        assert_eq!(cuda_priority(7, &levels, 0, 0), 0);
        // More levels than the device has: the lowest positive ones share its least.
        let many: Vec<i32> = (0..10).collect();
        assert_eq!(cuda_priority(1, &many, 0, -5), 0);
    }
}
