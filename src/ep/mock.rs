//! Mock device (placeholder until implemented).
use std::sync::Arc;
use super::*;
/// Config.
#[derive(Debug, Clone, Default)]
pub struct MockConfig;
/// Device.
#[derive(Debug)]
pub struct MockDevice;
impl MockDevice {
    /// New.
    pub fn new(_i: u16, _c: MockConfig) -> Self { MockDevice }
}
impl Device for MockDevice {
    fn id(&self) -> DeviceId { DeviceId::mock(0) }
    fn is_async(&self) -> bool { true }
    fn supports_stream_wait(&self) -> bool { true }
    fn create_stream(&self, _ty: StreamType) -> Result<Arc<dyn Stream>, EpError> { Err(EpError::Unavailable(self.id())) }
    fn create_event(&self) -> Result<Arc<dyn Event>, EpError> { Err(EpError::Unavailable(self.id())) }
}
