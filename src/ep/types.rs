//! The device layer's vocabulary: which device ([`DeviceId`], [`DeviceType`]), which of its
//! streams ([`StreamType`]), what can go wrong ([`EpError`], [`CudaUnavailable`]), and what a
//! device's memory promises the storage above it ([`DeviceMemory`], [`Block`],
//! [`DeviceBuffer`]).
//!
//! The backends of `ep` and everything above the device layer name these types, the VM's
//! allocators (`alloc`) included. They sit in a module that uses nothing else of the crate
//! (`std` and `thiserror` only), so that the dependence between the two layers runs one way:
//! `alloc` uses `ep`, and nothing in `ep` uses `alloc`. `ep` re-exports the identifiers and
//! the error, `ep::memory` the memory contract, `ep::cuda` the CUDA reason; that reason is
//! defined without the `cuda` feature too, since a build without CUDA reports it.

use std::fmt;
use std::sync::Arc;

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
    /// Collectives (`all_reduce`, `broadcast`, ...) of the communicators this device is a
    /// member of: OneFlow's CCL stream. Every device has one, the CPU too, so that a
    /// collective that waits for its peers never holds up the device's kernels.
    Collective,
}

impl StreamType {
    /// All stream types, in index order.
    pub const ALL: [StreamType; 4] =
        [StreamType::Compute, StreamType::H2D, StreamType::D2H, StreamType::Collective];

    /// The stream types of an asynchronous device's own work (all but
    /// [`Collective`](StreamType::Collective)), in index order.
    pub const DEVICE: [StreamType; 3] = [StreamType::Compute, StreamType::H2D, StreamType::D2H];

    /// Short name (`compute`, `h2d`, `d2h`, `collective`).
    pub fn name(self) -> &'static str {
        match self {
            StreamType::Compute => "compute",
            StreamType::H2D => "h2d",
            StreamType::D2H => "d2h",
            StreamType::Collective => "collective",
        }
    }
}

/// Errors of the device layer.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
pub enum EpError {
    /// A device string that names no known device type or has a bad index.
    #[error("unknown device `{0}` (expected `cpu:N`, `mock:N` or `cuda:N`)")]
    UnknownDevice(String),
    /// The device is not one the VM opened; `reason` says why (what the VM opened, and for
    /// a CUDA device, what this machine lacks if it cannot have one).
    #[error("device {device} is not available: {reason}")]
    Unavailable {
        /// The device asked for.
        device: DeviceId,
        /// Why it is not there.
        reason: String,
    },
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

/// Device memory behind tensor storage: what a device backend gives the VM's allocator.
pub trait DeviceMemory: Send + Sync + fmt::Debug {
    /// The device the memory is on.
    fn device(&self) -> DeviceId;
    /// A block of at least `bytes` bytes, for work of the stream the calling thread is
    /// launching on (if any). Out of memory is [`EpError::OutOfMemory`].
    fn allocate(&self, bytes: usize) -> Result<Block, EpError>;
    /// Give back a block from [`DeviceMemory::allocate`]. Called when the owning
    /// [`DeviceBuffer`] drops, which in the VM happens inside the `Release` instruction,
    /// on the stream the tensor was last used on (stream-ordered free).
    fn release(&self, block: Block);
    /// Wait until nothing on the device uses memory any more (every stream idle): what must
    /// come before a block is given back from a thread that launches nothing, when work
    /// outside the VM may still use it (a block lent through DLPack, `alloc::lend`). Memory
    /// that no device work uses asynchronously has nothing to wait for.
    fn synchronize(&self) -> Result<(), EpError> {
        Ok(())
    }
}

/// A block of device memory owned by a tensor's storage; dropping it gives the block back.
pub struct DeviceBuffer {
    block: Option<Block>,
    owner: Arc<dyn DeviceMemory>,
}

impl DeviceBuffer {
    /// A new buffer of at least `bytes` bytes from `owner`.
    pub fn new(owner: &Arc<dyn DeviceMemory>, bytes: usize) -> Result<DeviceBuffer, EpError> {
        let block = owner.allocate(bytes)?;
        Ok(DeviceBuffer { block: Some(block), owner: owner.clone() })
    }

    /// A buffer that owns `block`, handed out by `owner` in some other way than
    /// [`DeviceMemory::allocate`] (memory another library owns, wrapped by the device's
    /// backend); dropping it gives the block back to `owner`.
    pub fn adopt(owner: Arc<dyn DeviceMemory>, block: Block) -> DeviceBuffer {
        DeviceBuffer { block: Some(block), owner }
    }

    /// Wait until nothing on the buffer's device uses memory ([`DeviceMemory::synchronize`]).
    pub fn synchronize(&self) -> Result<(), EpError> {
        self.owner.synchronize()
    }

    /// The device address of the first byte.
    pub fn addr(&self) -> u64 {
        self.block.as_ref().map_or(0, |b| b.addr)
    }

    /// The bytes asked for (the block may be longer).
    pub fn len(&self) -> usize {
        self.block.as_ref().map_or(0, |b| b.requested)
    }

    /// Whether the buffer holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The device it is on.
    pub fn device(&self) -> DeviceId {
        self.owner.device()
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if let Some(b) = self.block.take() {
            self.owner.release(b);
        }
    }
}

impl fmt::Debug for DeviceBuffer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "DeviceBuffer({} bytes at {:#x} on {})", self.len(), self.addr(), self.device())
    }
}

/// A block of device memory: handed out by [`DeviceMemory::allocate`] and given back with
/// [`DeviceMemory::release`]. A plain handle, not an owner ([`DeviceBuffer`] is one): a block
/// dropped without being given back stays in use until its allocator drops.
#[derive(Debug, PartialEq, Eq)]
pub struct Block {
    /// Device address of the first byte.
    pub addr: u64,
    /// Usable bytes (the rounded request).
    pub size: usize,
    /// Bytes asked for.
    pub requested: usize,
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
