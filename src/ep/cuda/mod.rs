//! The CUDA execution provider: NVIDIA GPUs through cudarc, loaded at run time.
//!
//! # Loading
//!
//! eagervm links no CUDA library. cudarc is built with `dynamic-loading` and one fixed CUDA
//! version, its `cuda-13000` feature (CUDA 13.0's API; `Cargo.toml`); the driver
//! (`libcuda`), NVRTC and cuBLAS are opened the first time a `cuda:N` device is asked for,
//! each function resolved when it is first called (`docs/cuda.md` says which library names
//! are looked up and what has been run). cudarc *panics* when a library it needs is absent, so
//! [`open`] first probes for each library itself ([`probe`]), and only then touches cudarc,
//! inside `catch_unwind` as a second line of defence. Without the `cuda` feature, without the
//! driver, or without enough GPUs, [`open`] returns [`EpError::CudaUnavailable`] with a
//! [`CudaUnavailable`] reason, and nothing else changes: the CPU and mock paths never load
//! CUDA. [`ENV_DRIVER_LIB`] names another driver library to probe for (a name that does not
//! exist forces the absent-driver path, which is how tests exercise it on machines with a
//! GPU too).
//!
//! # Streams, events and memory (feature `cuda`)
//!
//! - Per device: the primary context, set to block-sync scheduling (host waits sleep), with
//!   cudarc's own event tracking disabled right after creation: the VM's `StreamWaitEvent` /
//!   `RecordEvent` instructions are the only cross-stream synchronisation (DESIGN.md).
//! - One non-blocking CUDA stream per [`StreamType`](super::StreamType) the VM asks for. `Stream::launch` runs
//!   the VM's closure *on the calling worker thread*, with this stream set as the thread's
//!   current CUDA stream (`with_current`): the CUDA kernels in `kernels::cuda` read it and
//!   enqueue their work on it, so `launch` returns once the work is enqueued, not done.
//! - Events are created with `CU_EVENT_BLOCKING_SYNC | CU_EVENT_DISABLE_TIMING` and pooled by
//!   the VM's `EventPool`; the stream's watcher thread sleeps in `cuEventSynchronize`.
//!   `Stream::wait_event` is `cuStreamWaitEvent`.
//! - Tensor memory comes from the caching allocator of [`crate::ep::memory::caching`] over
//!   `cuMemAlloc`, with blocks freed on the stream that last used them (stream order).
//!   Copies between host and device go through pinned staging buffers (not write-combined),
//!   returned to their pool by a host function enqueued behind the copy. Host memory freed
//!   during a launch is returned the same way (see [`crate::ep::memory::defer`]).
//! - Errors: a failed launch fails its instruction; an asynchronous fault surfaces when the
//!   watcher waits for the event recorded after the instruction, and is reported (through
//!   `VirtualMachine::sync`) with the op and stream of the last launch before that event.
//! - Each stream has a fault record (`ep::fault`) in pinned host memory mapped into the
//!   device (`cuMemHostAlloc` with `CU_MEMHOSTALLOC_DEVICEMAP`), which the kernels that
//!   read indices from device data write on an index out of range, and the VM reads once
//!   the stream has run such a call (a checked launch).

pub use super::types::CudaUnavailable;
use super::{DeviceId, EpError};

#[cfg(feature = "cuda")]
mod device;
#[cfg(feature = "cuda")]
mod memory;
#[cfg(feature = "cuda")]
mod stream;

#[cfg(feature = "cuda")]
pub use device::CudaDevice;
#[cfg(feature = "cuda")]
pub use stream::{CudaEpEvent, CudaEpStream};

/// The environment variable that names the CUDA driver library to probe for instead of the
/// usual names (`libcuda.so.1`, `libcuda.so`, ...). A name that cannot be loaded makes every
/// `cuda:N` unavailable with [`CudaUnavailable::DriverMissing`].
pub const ENV_DRIVER_LIB: &str = "EAGERVM_CUDA_DRIVER_LIB";

/// Check, without any CUDA call, that the driver library can be loaded (honouring
/// [`ENV_DRIVER_LIB`]). `Ok` says nothing about GPUs: [`open`] asks the driver for those.
pub fn probe() -> Result<(), CudaUnavailable> {
    #[cfg(not(feature = "cuda"))]
    {
        Err(CudaUnavailable::NotBuilt)
    }
    #[cfg(feature = "cuda")]
    {
        let names: Vec<String> = match std::env::var(ENV_DRIVER_LIB) {
            Ok(name) => vec![name],
            Err(_) if cfg!(windows) => vec!["nvcuda.dll".into()],
            Err(_) => vec!["libcuda.so.1".into(), "libcuda.so".into()],
        };
        probe_names(&names)
    }
}

/// `Ok` when one of the driver libraries `names` loads; `DriverMissing` naming them all
/// when none does.
#[cfg(feature = "cuda")]
fn probe_names(names: &[String]) -> Result<(), CudaUnavailable> {
    for name in names {
        // SAFETY: loading the driver library runs its initialisers, which have no
        // preconditions; the handle is dropped (unloaded) at once, and cudarc loads it again
        // on its own when the probe succeeds.
        if unsafe { libloading::Library::new(name) }.is_ok() {
            return Ok(());
        }
    }
    Err(CudaUnavailable::DriverMissing { tried: names.join(", ") })
}

/// Open `cuda:index`: probe the libraries, create the context and the allocator. Every
/// failure is an [`EpError::CudaUnavailable`]; nothing panics.
pub fn open(index: u16) -> Result<std::sync::Arc<dyn super::Device>, EpError> {
    let device = DeviceId::cuda(index);
    let unavailable = |reason| EpError::CudaUnavailable { device, reason };
    probe().map_err(unavailable)?;
    #[cfg(not(feature = "cuda"))]
    {
        unreachable!("probe fails without the cuda feature")
    }
    #[cfg(feature = "cuda")]
    {
        let opened = std::panic::catch_unwind(|| device::CudaDevice::open(index));
        match opened {
            Ok(Ok(d)) => Ok(d),
            Ok(Err(reason)) => Err(unavailable(reason)),
            Err(payload) => {
                let msg = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "non-string panic payload".into());
                Err(unavailable(CudaUnavailable::Panicked(msg)))
            }
        }
    }
}

/// How many CUDA devices the driver sees (after the same probe as [`open`]); a typed error
/// where there is no driver, or the `cuda` feature is off.
pub fn device_count() -> Result<u16, EpError> {
    let unavailable = |reason| EpError::CudaUnavailable { device: DeviceId::cuda(0), reason };
    probe().map_err(unavailable)?;
    #[cfg(not(feature = "cuda"))]
    {
        unreachable!("probe fails without the cuda feature")
    }
    #[cfg(feature = "cuda")]
    {
        match std::panic::catch_unwind(cudarc::driver::CudaContext::device_count) {
            Ok(Ok(n)) => Ok(u16::try_from(n.max(0)).unwrap_or(u16::MAX)),
            Ok(Err(e)) => Err(unavailable(CudaUnavailable::Driver(e.to_string()))),
            Err(_) => Err(unavailable(CudaUnavailable::Panicked("asking for the device count".into()))),
        }
    }
}

/// Whether `cuda:index` can be opened now, with the reason when not (for tests and
/// benchmarks that skip without a GPU).
pub fn available(index: u16) -> Result<(), EpError> {
    open(index).map(|_| ())
}

#[cfg(feature = "cuda")]
pub use stream::with_current;

/// The raw `CUstream` handle of `stream` as an integer (DLPack's `stream` argument); `None`
/// for a stream of another backend, or without the `cuda` feature.
#[cfg_attr(not(feature = "python"), allow(dead_code))] // the DLPack exchange's (`python`)
pub(crate) fn raw_stream(stream: &dyn super::Stream) -> Option<u64> {
    #[cfg(feature = "cuda")]
    {
        memory::raw_stream(stream)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = stream;
        None
    }
}

/// Device memory at `addr` that another library owns (`owner` keeps it), wrapped as a
/// buffer on the CUDA device of `stream` (`memory::wrap_foreign`): a typed error for an
/// address the driver does not know as that device's, or a stream of another backend.
pub(crate) fn wrap_foreign(
    stream: &dyn super::Stream,
    addr: u64,
    bytes: usize,
    owner: Box<dyn Send>,
) -> Result<super::memory::DeviceBuffer, EpError> {
    #[cfg(feature = "cuda")]
    {
        memory::wrap_foreign(stream, addr, bytes, owner)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = (addr, bytes, owner);
        Err(EpError::CudaUnavailable { device: stream.device(), reason: CudaUnavailable::NotBuilt })
    }
}

/// Make the stream `consumer` (a raw `CUstream` handle) wait, on the device, for the work
/// enqueued so far on the CUDA stream launching on this thread (`memory::order_after_current`).
#[cfg_attr(not(feature = "python"), allow(dead_code))] // the DLPack exchange's (`python`)
pub(crate) fn order_after_current(consumer: u64) -> Result<(), String> {
    #[cfg(feature = "cuda")]
    {
        memory::order_after_current(consumer)
    }
    #[cfg(not(feature = "cuda"))]
    {
        let _ = consumer;
        Err("eagervm was built without the cuda feature".into())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The probe of a library name that exists nowhere. (The environment variable that
    /// names it, and the error through `open` and `VirtualMachine::new`, are tested in
    /// `tests/integration/cuda.rs`, which sets the variable only in a child process of its
    /// own; a unit test must not, as other unit tests of this process open CUDA devices
    /// meanwhile.)
    #[test]
    fn absent_driver_is_a_typed_error() {
        #[cfg(feature = "cuda")]
        {
            let names = ["libeagervm-no-such-driver.so".to_string(), "libeagervm-nor-this.so".to_string()];
            assert_eq!(
                probe_names(&names),
                Err(CudaUnavailable::DriverMissing {
                    tried: "libeagervm-no-such-driver.so, libeagervm-nor-this.so".into()
                })
            );
        }
        #[cfg(not(feature = "cuda"))]
        match open(3) {
            Err(EpError::CudaUnavailable { device, reason }) => {
                assert_eq!(device, DeviceId::cuda(3));
                assert_eq!(reason, CudaUnavailable::NotBuilt);
            }
            other => panic!("expected CudaUnavailable, got {other:?}"),
        }
    }

    #[test]
    fn reasons_say_what_to_do() {
        let e = EpError::CudaUnavailable {
            device: DeviceId::cuda(0),
            reason: CudaUnavailable::DriverMissing { tried: "libcuda.so.1".into() },
        };
        assert_eq!(
            e.to_string(),
            "cuda:0 is not available: the CUDA driver library is not installed (tried libcuda.so.1); \
             install the NVIDIA driver"
        );
        assert!(CudaUnavailable::NoDevice { count: 1 }.to_string().contains("1 CUDA device"));
    }
}
