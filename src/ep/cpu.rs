//! The CPU execution provider: synchronous streams.
//!
//! A launch runs the work on the calling thread before returning, so every event is
//! complete as soon as it is recorded and a device-side wait has nothing to wait for.
//! The VM runs CPU kernels inline on the stream's `ThreadCtx` worker without going
//! through [`Stream::launch`] (which would box a closure); `launch` exists so that code
//! written against the trait works on the CPU too.

use std::any::Any;
use std::sync::Arc;

use super::{Device, DeviceId, EpError, Event, Stream, StreamType};

/// The host CPU.
#[derive(Debug, Default)]
pub struct CpuDevice;

impl CpuDevice {
    /// The CPU device `cpu:0`.
    pub fn new() -> Self {
        CpuDevice
    }
}

impl Device for CpuDevice {
    fn id(&self) -> DeviceId {
        DeviceId::CPU
    }
    fn is_async(&self) -> bool {
        false
    }
    fn supports_stream_wait(&self) -> bool {
        false
    }
    fn create_stream(&self, ty: StreamType) -> Result<Arc<dyn Stream>, EpError> {
        Ok(Arc::new(CpuStream { ty }))
    }
    fn create_event(&self) -> Result<Arc<dyn Event>, EpError> {
        Ok(Arc::new(CpuEvent))
    }
}

/// A synchronous stream on the CPU.
#[derive(Debug)]
pub struct CpuStream {
    ty: StreamType,
}

impl Stream for CpuStream {
    fn device(&self) -> DeviceId {
        DeviceId::CPU
    }
    fn stream_type(&self) -> StreamType {
        self.ty
    }
    fn launch(&self, work: Box<dyn FnOnce() + Send>) -> Result<(), EpError> {
        work();
        Ok(())
    }
    fn record(&self, _event: &dyn Event) -> Result<(), EpError> {
        Ok(())
    }
    fn wait_event(&self, _event: &dyn Event) -> Result<(), EpError> {
        Ok(())
    }
    fn synchronize(&self) -> Result<(), EpError> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// An event on the CPU: always complete, since CPU work is done when launched.
#[derive(Debug)]
pub struct CpuEvent;

impl Event for CpuEvent {
    fn query(&self) -> bool {
        true
    }
    fn wait(&self) -> Result<(), EpError> {
        Ok(())
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}
