//! The device registry: every device the VM may use, keyed by [`DeviceId`], each with its
//! event pool.

use std::sync::Arc;

use super::cpu::CpuDevice;
use super::mock::{MockConfig, MockDevice};
use super::{Device, DeviceId, DeviceType, EpError, EventPool};

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

    /// The entry for `id`, or [`EpError::Unavailable`] saying why it is not there.
    pub fn get(&self, id: DeviceId) -> Result<&Entry, EpError> {
        match self.entries.iter().find(|e| e.device.id() == id) {
            Some(e) => Ok(e),
            None => Err(self.unavailable(id)),
        }
    }

    /// The error for `id`, a device this registry does not have: what the VM opened of its
    /// type, how to ask for more, and for a CUDA device on a machine that cannot have one,
    /// what the machine lacks ([`cuda::probe`](super::cuda::probe)), as `VirtualMachine::new`
    /// would have said had the VM asked for it.
    #[cold]
    pub fn unavailable(&self, id: DeviceId) -> EpError {
        if self.entries.iter().any(|e| e.device.id() == id) {
            let reason = "this VM opened it, but without the stream asked for".to_string();
            return EpError::Unavailable { device: id, reason };
        }
        let opened: Vec<String> = self
            .entries
            .iter()
            .map(|e| e.device.id())
            .filter(|d| d.ty == id.ty)
            .map(|d| d.to_string())
            .collect();
        let opened = match opened.len() {
            0 => format!("this VM opened no {} device", id.ty.name()),
            n => format!("this VM opened {n} {} device(s): {}", id.ty.name(), opened.join(", ")),
        };
        let reason = match id.ty {
            DeviceType::Cpu => format!("{opened}; the host is cpu:0"),
            DeviceType::Mock => format!("{opened} (Config::mock_devices; VM(mock_devices=N) in Python)"),
            DeviceType::Cuda => match super::cuda::probe() {
                Err(why) => format!("{why}"),
                Ok(()) => format!(
                    "{opened} (Config::cuda_devices; VM(cuda_devices=N) in Python; --device cuda on the command line)"
                ),
            },
        };
        EpError::Unavailable { device: id, reason }
    }

    /// All registered devices, in registration order.
    pub fn devices(&self) -> impl Iterator<Item = &Entry> {
        self.entries.iter()
    }
}
