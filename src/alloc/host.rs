//! Host caching allocator (placeholder until implemented).
use std::sync::Arc;
/// Statistics.
#[derive(Debug, Default, Clone, Copy)]
pub struct AllocStats;
/// Allocator.
#[derive(Debug)]
pub struct HostAllocator;
/// Storage.
#[derive(Debug)]
pub struct Storage(Vec<u8>);
impl HostAllocator {
    /// New.
    pub fn new(_name: &str) -> Arc<Self> { Arc::new(HostAllocator) }
}
