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
//! Kernels that find bad data only when they run (an index out of range on an asynchronous
//! device) report it in their stream's [`fault::FaultRecord`] ([`Stream::faults`]).
//!
//! Events are pooled per device ([`EventPool`]): taken when an instruction records one and
//! given back when it retires, so steady-state execution creates none.
//!
//! Devices are found through a [`Registry`] keyed by [`DeviceId`] (type and index).
//!
//! What a device is called and what can go wrong ([`DeviceId`], [`DeviceType`],
//! [`StreamType`], [`EpError`]) and what its memory promises ([`memory::DeviceMemory`]) are
//! defined in a module of this layer that depends on nothing else in the crate; [`memory`]
//! holds the caching device allocator the CUDA backend builds its memory on, and the
//! deferred host frees of asynchronous launches. The VM's per-device storage allocator
//! (`alloc`) sits above this layer and uses it; nothing here uses `alloc`.

pub mod ccl;
pub mod cpu;
pub mod cuda;
mod event_pool;
pub mod fault;
pub mod memory;
pub mod mock;
mod registry;
mod types;

use std::any::Any;
use std::fmt;
use std::sync::Arc;

pub use event_pool::EventPool;
pub use registry::Registry;
pub use types::{DeviceId, DeviceType, EpError, StreamType};

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
    /// Create a stream of the given type with a priority (`Config::stream_priorities`:
    /// higher runs first) among the device's streams `levels`: the distinct priorities of
    /// the VM's stream types, in ascending order. Devices without stream priorities (the
    /// default) ignore it.
    fn create_stream_with_priority(
        &self,
        ty: StreamType,
        priority: i32,
        levels: &[i32],
    ) -> Result<Arc<dyn Stream>, EpError> {
        let _ = (priority, levels);
        self.create_stream(ty)
    }
    /// Create a fresh event; the VM takes events from [`EventPool`]s, which call this only
    /// when empty.
    fn create_event(&self) -> Result<Arc<dyn Event>, EpError>;
    /// Where tensors on this device get their bytes, if not from host memory: device
    /// backends with memory of their own return it, and the VM's allocator for the device
    /// takes tensor storage from it.
    fn memory(&self) -> Option<Arc<dyn memory::DeviceMemory>> {
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
    /// Its owner is shutting down: work launched on it still runs, in order, but a device
    /// that only simulates the time work takes (the mock device's launch delay and jitter)
    /// stops spending that time, including a wait it is in now. A device whose time is
    /// real has nothing to skip; the default does nothing.
    fn end_simulated_time(&self) {}
    /// The stream's fault record ([`fault`]): where its kernels report bad data they find
    /// when they run, for the VM to read once the stream has reached a checked launch.
    /// `None` (the default) for streams whose kernels fail by returning an error
    /// (synchronous ones).
    fn faults(&self) -> Option<&fault::FaultRecord> {
        None
    }
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
