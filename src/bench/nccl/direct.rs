//! The reference of the NCCL benchmark: `ncclAllReduce` called directly, with no VM in
//! between, on a plain CUDA stream of `cuda:N`'s primary context (the context the VM's
//! device uses, so both sides wait for the GPU with the same scheduling flags).
//!
//! The library is the one the backend opened: [`ENV_NCCL_LIB`] if set, else `libnccl.so.2`
//! or `libnccl.so`, opened by the same names, so the dynamic loader hands back the library
//! already loaded and both sides run the same NCCL. The five functions it calls are
//! declared here, as `ep::ccl::nccl` declares its own, rather than through cudarc's NCCL
//! bindings, whose loader does not try `libnccl.so.2` (the name the `nvidia-nccl` Python
//! packages ship) and panics when no name loads.
//!
//! Its communicator is its own (`ncclCommInitAll` over the one device), beside the VM's:
//! two communicators of one rank on one GPU do not wait for each other.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::Arc;

use cudarc::driver::{sys, CudaContext, CudaSlice, CudaStream, DevicePtr, DevicePtrMut};

use super::{NcclBenchError, Reference};
use crate::ep::ccl::nccl::ENV_NCCL_LIB;

type Comm = *mut c_void;
type Res = c_int;
const SUCCESS: Res = 0;
/// `ncclFloat32`, `ncclSum`: what the VM's `all_reduce(.., ReduceOp::Sum)` of `f32` calls.
const FLOAT32: c_int = 7;
const SUM: c_int = 0;

/// The NCCL functions the reference calls, with the library that holds them.
struct Lib {
    get_error_string: unsafe extern "C" fn(Res) -> *const c_char,
    comm_init_all: unsafe extern "C" fn(*mut Comm, c_int, *const c_int) -> Res,
    comm_destroy: unsafe extern "C" fn(Comm) -> Res,
    all_reduce:
        unsafe extern "C" fn(*const c_void, *mut c_void, usize, c_int, c_int, Comm, sys::CUstream) -> Res,
    /// Keeps the functions above loaded while the reference lives.
    _lib: libloading::Library,
}

fn direct_err(what: impl Into<String>) -> NcclBenchError {
    NcclBenchError::Direct(what.into())
}

impl Lib {
    fn load() -> Result<Lib, NcclBenchError> {
        let names = match std::env::var(ENV_NCCL_LIB) {
            Ok(name) => vec![name],
            Err(_) => vec!["libnccl.so.2".to_string(), "libnccl.so".to_string()],
        };
        // SAFETY: opening libnccl runs its initialisers, which have no preconditions; the
        // backend has opened the same library in this process already.
        let lib = names
            .iter()
            .find_map(|n| unsafe { libloading::Library::new(n) }.ok())
            .ok_or_else(|| direct_err(format!("libnccl cannot be loaded (tried {})", names.join(", "))))?;
        macro_rules! sym {
            ($name:literal) => {
                // SAFETY: the symbol is NCCL 2's C function of this name, whose signature
                // (`nccl.h`, unchanged since 2.4) is the field's type; `_lib` keeps it loaded
                // for as long as the `Lib` lives.
                *unsafe { lib.get($name) }.map_err(|e| {
                    direct_err(format!(
                        "libnccl lacks {}: {e}",
                        String::from_utf8_lossy(&$name[..$name.len() - 1])
                    ))
                })?
            };
        }
        Ok(Lib {
            get_error_string: sym!(b"ncclGetErrorString\0"),
            comm_init_all: sym!(b"ncclCommInitAll\0"),
            comm_destroy: sym!(b"ncclCommDestroy\0"),
            all_reduce: sym!(b"ncclAllReduce\0"),
            _lib: lib,
        })
    }

    /// NCCL's result `r` of `what` as an error value.
    fn check(&self, r: Res, what: &str) -> Result<(), NcclBenchError> {
        if r == SUCCESS {
            return Ok(());
        }
        // SAFETY: ncclGetErrorString returns a static NUL-terminated string for any code.
        let msg = unsafe { (self.get_error_string)(r) };
        let msg = if msg.is_null() {
            format!("error {r}")
        } else {
            // SAFETY: non-null, NUL-terminated and static (above).
            unsafe { CStr::from_ptr(msg) }.to_string_lossy().into_owned()
        };
        Err(direct_err(format!("{what}: {msg} ({r})")))
    }
}

fn driver(what: &'static str) -> impl Fn(cudarc::driver::DriverError) -> NcclBenchError {
    move |e| direct_err(format!("{what}: {e}"))
}

/// A one-rank NCCL communicator over `cuda:N`, a stream, and a send and a receive buffer.
pub(super) struct DirectNccl {
    lib: Lib,
    comm: Comm,
    stream: Arc<CudaStream>,
    /// `(send, recv)` of the size last [`prepare`](Self::prepare)d.
    bufs: Option<(CudaSlice<f32>, CudaSlice<f32>)>,
}

impl DirectNccl {
    /// The communicator and stream on `cuda:device`. Call it after the VM has opened the
    /// device, so that the primary context already has the VM's scheduling flags.
    pub(super) fn new(device: u16) -> Result<DirectNccl, NcclBenchError> {
        let lib = Lib::load()?;
        let ctx = CudaContext::new(usize::from(device)).map_err(driver("opening the context"))?;
        // SAFETY: the reference uses one stream, and reads its buffers back only after
        // synchronising it, so cudarc's cross-stream event tracking has nothing to order.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream().map_err(driver("cuStreamCreate"))?;
        let list = [c_int::from(device)];
        let mut comm: Comm = std::ptr::null_mut();
        // SAFETY: `comm` has room for the one handle of the one device listed; the device
        // exists (its context was opened above).
        lib.check(unsafe { (lib.comm_init_all)(&mut comm, 1, list.as_ptr()) }, "ncclCommInitAll")?;
        Ok(DirectNccl { lib, comm, stream, bufs: None })
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
            // `comm` is live until drop; `cu` is the live stream of `self.stream`.
            let r = unsafe { (self.lib.all_reduce)(sp, rp, count, FLOAT32, SUM, self.comm, cu) };
            self.lib.check(r, "ncclAllReduce")?;
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
    fn drop(&mut self) {
        self.bufs = None;
        let _ = self.stream.synchronize();
        // SAFETY: `comm` was made by ncclCommInitAll and is destroyed once, here, after the
        // stream it was used on has finished.
        let r = unsafe { (self.lib.comm_destroy)(self.comm) };
        if let Err(e) = self.lib.check(r, "ncclCommDestroy") {
            tracing::warn!(error = %e, "freeing the benchmark's NCCL communicator");
        }
    }
}
