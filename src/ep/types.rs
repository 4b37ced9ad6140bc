//! The device layer's vocabulary: which device ([`DeviceId`], [`DeviceType`]), which of its
//! streams ([`StreamType`]), and what can go wrong ([`EpError`], [`CudaUnavailable`]).
//!
//! Everything above the device layer names these types, the allocators included. They sit
//! in a module of their own that depends on nothing else in the crate, so that naming a
//! device or an error never pulls in a backend: `alloc` uses `ep`, and nothing under `ep`
//! uses `alloc`.

use std::fmt;

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
        reason: CudaUnavailable,
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

/// Why a CUDA device cannot be used. Defined with and without the `cuda` feature: a build
/// without it reports [`CudaUnavailable::NotBuilt`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CudaUnavailable {
    /// This build has no CUDA backend (cargo feature `cuda` off).
    NotBuilt,
    /// The driver library could not be loaded.
    DriverMissing {
        /// The library names tried.
        tried: String,
    },
    /// A CUDA library besides the driver (NVRTC, cuBLAS) could not be loaded.
    LibraryMissing {
        /// Which library.
        library: &'static str,
    },
    /// The machine has fewer CUDA devices than the index asked for.
    NoDevice {
        /// How many devices the driver reports.
        count: i32,
    },
    /// The driver refused to initialise or to open the device.
    Driver(String),
    /// A CUDA library panicked while the device was opened.
    Panicked(String),
}

impl fmt::Display for CudaUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CudaUnavailable::NotBuilt => {
                f.write_str("this build of eagervm has no CUDA backend (build with the `cuda` feature)")
            }
            CudaUnavailable::DriverMissing { tried } => {
                write!(
                    f,
                    "the CUDA driver library is not installed (tried {tried}); install the NVIDIA driver"
                )
            }
            CudaUnavailable::LibraryMissing { library } => {
                write!(f, "the CUDA library `{library}` is not installed; install the CUDA toolkit's runtime libraries")
            }
            CudaUnavailable::NoDevice { count } => write!(f, "the machine has {count} CUDA device(s)"),
            CudaUnavailable::Driver(e) => write!(f, "the CUDA driver failed: {e}"),
            CudaUnavailable::Panicked(e) => write!(f, "a CUDA library panicked: {e}"),
        }
    }
}
