//! The device registry: every device the VM may use, keyed by [`DeviceId`], each with its
//! event pool.

use std::sync::Arc;

use super::cpu::CpuDevice;
use super::mock::{MockConfig, MockDevice};
use super::{Device, DeviceId, EpError, EventPool};

/// One registered device.
#[derive(Debug)]
pub struct Entry {
    /// The device.
    pub device: Arc<dyn Device>,
    /// Its event pool.
    pub events: Arc<EventPool>,
}

/// The devices a VM runs on. `cpu:0` is always present.
#[derive(Debug)]
pub struct Registry {
    entries: Vec<Entry>,
}

impl Registry {
    /// `cpu:0` plus `mock_devices` mock devices configured by `mock`.
    pub fn new(mock_devices: u16, mock: &MockConfig) -> Self {
        let mut r = Registry { entries: Vec::new() };
        r.add(Arc::new(CpuDevice::new()));
        for i in 0..mock_devices {
            r.add(Arc::new(MockDevice::new(i, mock.clone())));
        }
        r
    }

    /// Register CUDA devices `cuda:0` .. `cuda:n-1`; with `n == 0`, nothing (and no CUDA
    /// call). Fails with [`EpError::CudaUnavailable`] when the build has no CUDA, the driver
    /// library is absent, or the machine has fewer GPUs.
    pub fn add_cuda(&mut self, n: u16) -> Result<(), EpError> {
        for i in 0..n {
            self.add(super::cuda::open(i)?);
        }
        Ok(())
    }

    /// Register another device (replacing one with the same id).
    pub fn add(&mut self, device: Arc<dyn Device>) {
        let id = device.id();
        self.entries.retain(|e| e.device.id() != id);
        let events = Arc::new(EventPool::new(device.clone()));
        self.entries.push(Entry { device, events });
    }

    /// The entry for `id`, or [`EpError::Unavailable`].
    pub fn get(&self, id: DeviceId) -> Result<&Entry, EpError> {
        self.entries.iter().find(|e| e.device.id() == id).ok_or(EpError::Unavailable(id))
    }

    /// All registered devices, in registration order.
    pub fn devices(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }
}
