//! The virtual machine: scheduler, workers, instructions and their policies.
//!
//! See [`scheduler`] for the lifecycle of an instruction and the edge rules,
//! [`thread_ctx`] for the workers' sleep/wake protocol, and [`virtual_machine`] for
//! start-up and shutdown.

#[allow(dead_code)]
pub(crate) mod back_pressure;
mod config;
pub(crate) mod dependence;
mod exec;
pub(crate) mod instruction;
pub mod scheduler;
mod stream;
pub mod thread_ctx;
pub mod virtual_machine;

pub use config::{bounds, default_max_tensor_bytes, FALLBACK_MAX_TENSOR_BYTES};
pub use config::{Config, FaultInjection, ThreadTopology, DEFAULT_EVENT_INTERVAL};
pub use stream::StreamId;
pub(crate) use stream::{PolicyKind, VmStream};
pub use virtual_machine::VirtualMachine;
pub(crate) use virtual_machine::VmShared;
