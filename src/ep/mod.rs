//! Execution providers: the device layer under the VM.
//!
//! An execution provider is a [`Device`] that hands out [`Stream`]s (FIFO queues of work on
//! that device) and [`Event`]s (markers recorded on a stream that the host or another stream
//! can wait for). The shape follows OneFlow's `ep::Device` / `ep::Stream` / `ep::Event`.
//!
//! Backends, one file each:
//! - [`cpu`]: synchronous. Work runs on the calling thread when launched, so an event is
//!   complete as soon as it is recorded.
//! - [`mock`]: an asynchronous, CUDA-like device made of host threads (one per stream), with
//!   configurable launch delay and random jitter, so that every event and stream-wait path of
//!   the VM runs (and any missing synchronisation shows up) without a GPU.
//! - [`cuda`]: NVIDIA GPUs through cudarc, loaded at run time (feature `cuda`); asking for
//!   `cuda:N` on a machine without the driver or the GPU is an [`EpError::CudaUnavailable`].
//!
//! Events are pooled per device ([`EventPool`]): taken when an instruction records one and
//! given back when it retires, so steady-state execution creates none.
//!
//! Devices are found through a [`Registry`] keyed by [`DeviceId`] (type and index).

pub mod cpu;
pub mod cuda;
mod event_pool;
pub mod mock;
mod registry;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use event_pool::EventPool;
pub use registry::Registry;

/// The kind of a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DeviceType {
    /// The host CPU; synchronous streams.
    Cpu,
    /// The mock asynchronous device (host threads standing in for a GPU).
    Mock,
    /// An NVIDIA GPU through CUDA (feature `cuda`).
    Cuda,
}

impl DeviceType {
    /// The name used in device strings (`cpu`, `mock`).
    pub fn name(self) -> &'static str {
        match self {
            DeviceType::Cpu => "cpu",
            DeviceType::Mock => "mock",
            DeviceType::Cuda => "cuda",
        }
    }
}

/// A device: its type and its index among devices of that type (`mock:1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    /// The device type.
    pub ty: DeviceType,
    /// Index among devices of this type.
    pub index: u16,
}

impl DeviceId {
    /// The host CPU, `cpu:0`.
    pub const CPU: DeviceId = DeviceId { ty: DeviceType::Cpu, index: 0 };

    /// The mock device with the given index.
    pub const fn mock(index: u16) -> DeviceId {
        DeviceId { ty: DeviceType::Mock, index }
    }

    /// The CUDA device with the given ordinal.
    pub const fn cuda(index: u16) -> DeviceId {
        DeviceId { ty: DeviceType::Cuda, index }
    }

    /// Whether tensors on this device live in host memory that the caller may read directly.
    pub fn is_host(self) -> bool {
        self.ty == DeviceType::Cpu
    }
}

impl fmt::Display for DeviceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.ty.name(), self.index)
    }
}

impl std::str::FromStr for DeviceId {
    type Err = EpError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (ty, idx) = s.split_once(':').unwrap_or((s, "0"));
        let ty = match ty {
            "cpu" => DeviceType::Cpu,
            "mock" => DeviceType::Mock,
            "cuda" => DeviceType::Cuda,
            _ => return Err(EpError::UnknownDevice(s.to_string())),
        };
        let index = idx.parse().map_err(|_| EpError::UnknownDevice(s.to_string()))?;
        Ok(DeviceId { ty, index })
    }
}

/// What a stream is for. One stream of each type per device by default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StreamType {
    /// Kernels.
    Compute,
    /// Copies from host memory to this device.
    H2D,
    /// Copies from this device to host memory.
    D2H,
}

impl StreamType {
    /// All stream types, in index order.
    pub const ALL: [StreamType; 3] = [StreamType::Compute, StreamType::H2D, StreamType::D2H];

    /// Short name (`compute`, `h2d`, `d2h`).
    pub fn name(self) -> &'static str {
        match self {
            StreamType::Compute => "compute",
            StreamType::H2D => "h2d",
            StreamType::D2H => "d2h",
        }
    }
}

/// Errors of the device layer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EpError {
    /// A device string that names no known device type or has a bad index.
    #[error("unknown device `{0}` (expected `cpu:N`, `mock:N` or `cuda:N`)")]
    UnknownDevice(String),
    /// The device is not present in the registry.
    #[error("device {0} is not available")]
    Unavailable(DeviceId),
    /// A CUDA device was asked for, but this build or this machine cannot provide it.
    #[error("{device} is not available: {reason}")]
    CudaUnavailable {
        /// The device asked for.
        device: DeviceId,
        /// Why not.
        reason: cuda::CudaUnavailable,
    },
    /// The device has no memory left for an allocation, even after freeing its cache.
    #[error("{device}: {detail}")]
    OutOfMemory {
        /// The device.
        device: DeviceId,
        /// The request and the allocator's state.
        detail: String,
    },
    /// A device-side operation failed.
    #[error("device {device}: {what}")]
    Device {
        /// The device.
        device: DeviceId,
        /// What went wrong.
        what: String,
    },
}

/// A device: creates streams and events.
pub trait Device: Send + Sync + fmt::Debug {
    /// Which device this is.
    fn id(&self) -> DeviceId;
    /// Whether launches return before the work is done (events must be watched).
    fn is_async(&self) -> bool;
    /// Whether one stream can wait on the device for an event recorded on another stream of
    /// this device (`StreamWaitEvent`), instead of the host waiting.
    fn supports_stream_wait(&self) -> bool;
    /// Create a stream of the given type.
    fn create_stream(&self, ty: StreamType) -> Result<Arc<dyn Stream>, EpError>;
    /// Create a fresh event; the VM takes events from [`EventPool`]s, which call this only
    /// when empty.
    fn create_event(&self) -> Result<Arc<dyn Event>, EpError>;
    /// Where tensors on this device get their bytes, if not from host memory: device
    /// backends with memory of their own return it, and the VM's allocator for the device
    /// takes tensor storage from it.
    fn memory(&self) -> Option<Arc<dyn crate::alloc::DeviceMemory>> {
        None
    }
}

/// A FIFO queue of work on one device.
pub trait Stream: Send + Sync + fmt::Debug {
    /// The device it belongs to.
    fn device(&self) -> DeviceId;
    /// What it is for.
    fn stream_type(&self) -> StreamType;
    /// Run `work` on this stream after everything launched before it. Synchronous streams
    /// run it before returning; asynchronous streams enqueue it and return.
    fn launch(&self, work: Box<dyn FnOnce() + Send>) -> Result<(), EpError>;
    /// Record `event` after everything launched so far on this stream.
    fn record(&self, event: &dyn Event) -> Result<(), EpError>;
    /// Make everything launched on this stream from now on wait, on the device, until the
    /// last recording of `event` (as of this call) is reached. The host does not block.
    fn wait_event(&self, event: &dyn Event) -> Result<(), EpError>;
    /// Block the host until everything launched on this stream has run.
    fn synchronize(&self) -> Result<(), EpError>;
    /// For backend-specific kernels.
    fn as_any(&self) -> &dyn Any;
}

/// A marker recorded on a stream.
pub trait Event: Send + Sync + fmt::Debug {
    /// Whether the last recording has been reached (true if never recorded).
    fn query(&self) -> bool;
    /// Block the host until the last recording (as of this call) has been reached. Sleeps;
    /// never spins for long.
    fn wait(&self) -> Result<(), EpError>;
    /// For backend-specific streams.
    fn as_any(&self) -> &dyn Any;
}
