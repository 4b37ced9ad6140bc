//! The reference of the NCCL benchmark: `ncclAllReduce` called directly, with no VM in
//! between, on a plain CUDA stream of `cuda:N`'s primary context (the context the VM's
//! device uses, so both sides wait for the GPU with the same scheduling flags).
//!
//! It calls NCCL through the backend's own loaded library (`ep::ccl::nccl::DirectComm`), so
//! both sides run the same NCCL, rather than through cudarc's NCCL bindings, whose loader
//! does not try `libnccl.so.2` (the name the `nvidia-nccl` Python packages ship) and panics
//! when no name loads.
//!
//! Its communicator is its own (`ncclCommInitAll` over the one device), beside the VM's:
//! two communicators of one rank on one GPU do not wait for each other.

use std::ffi::c_void;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::{NcclBenchError, Reference};
use crate::ep::ccl::nccl::DirectComm;

fn direct_err(what: impl Into<String>) -> NcclBenchError {
    NcclBenchError::Direct(what.into())
}

fn nccl(e: crate::ep::ccl::CclError) -> NcclBenchError {
    direct_err(e.to_string())
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> NcclBenchError {
    move |e| direct_err(format!("{what}: {e}"))
}

/// A one-rank NCCL communicator over `cuda:N`, a stream, and a send and a receive buffer.
pub(super) struct DirectNccl {
    comm: DirectComm,
    stream: Arc<CudaStream>,
    /// `(send, recv)` of the size last [`prepare`](Self::prepare)d.
    bufs: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

impl DirectNccl {
    /// The communicator and stream on `cuda:device`. Call it after the VM has opened the
    /// device, so that the primary context already has the VM's scheduling flags.
    pub(super) fn new(device: u16) -> Result<DirectNccl, NcclBenchError> {
        let ctx = CudaContext::new(usize::from(device)).map_err(driver("opening the context"))?;
        // SAFETY: the reference uses one stream, and reads its buffers back only after
        // synchronising it, so cudarc's cross-stream event tracking has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let comm = DirectComm::one(device).map_err(nccl)?;
        Ok(DirectNccl { comm, stream, bufs: None })
    }
}

impl Reference for DirectNccl {
    /// Device buffers for an all-reduce of `data`: the send buffer holds it, the receive
    /// buffer is zeroed.
    fn prepare(&mut self, data: &[f32]) -> Result<(), NcclBenchError> {
        self.bufs = None;
        let send = self.stream.clone_htod(data).map_err(driver("copying the input in"))?;
        let recv = self.stream.alloc_zeros::<f32>(data.len()).map_err(driver("cuMemAlloc"))?;
        self.stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        self.bufs = Some((send, recv));
        Ok(())
    }

    /// `iters` all-reduces (sum) of the prepared buffers, each enqueued and then waited for
    /// with `cuStreamSynchronize`.
    fn run(&mut self, iters: usize) -> Result<(), NcclBenchError> {
        let (send, recv) = self.bufs.as_mut().ok_or_else(|| direct_err("no buffers prepared"))?;
        let count = send.len();
        let (sp, _s) = send.device_ptr(&self.stream);
        let (rp, _r) = recv.device_ptr_mut(&self.stream);
        let (sp, rp) = (sp as usize as *const c_void, rp as usize as *mut c_void);
        let cu = self.stream.cu_stream();
        for _ in 0..iters {
            // SAFETY: `sp` and `rp` are device allocations of `count` f32s each on the
            // stream's device, alive while `self.bufs` holds them (all of this call);
            // `cu` is the live stream of `self.stream`, on the communicator's device.
            unsafe { self.comm.all_reduce_sum_f32(sp, rp, count, cu) }.map_err(nccl)?;
            self.stream.synchronize().map_err(driver("cuStreamSynchronize"))?;
        }
        Ok(())
    }

    /// The receive buffer, copied to the host.
    fn result(&mut self) -> Result<Vec<f32>, NcclBenchError> {
        let (_, recv) = self.bufs.as_ref().ok_or_else(|| direct_err("no buffers prepared"))?;
        self.stream.clone_dtoh(recv).map_err(driver("copying the result out"))
    }
}

impl Drop for DirectNccl {
    /// The buffers go, and the stream finishes, before the communicator is destroyed.
    fn drop(&mut self) {
        self.bufs = None;
        let _ = self.stream.synchronize();
    }
}
