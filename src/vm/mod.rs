//! The virtual machine: scheduler, workers, instructions and their policies.
//!
//! See [`scheduler`] for the lifecycle of an instruction and the edge rules,
//! [`thread_ctx`] for the workers' sleep/wake protocol, and [`virtual_machine`] for
//! start-up and shutdown.

mod config;
pub(crate) mod dependence;
pub(crate) mod engine;
mod error;
mod exec;
pub(crate) mod instruction;
pub mod kernel;
pub(crate) mod observe;
pub mod scheduler;
pub mod shape;
mod stream;
pub(crate) mod tensor;
pub mod thread_ctx;

pub use config::{bounds, default_max_tensor_bytes, FALLBACK_MAX_TENSOR_BYTES};
pub use config::{Config, FaultInjection, ThreadTopology, DEFAULT_EVENT_INTERVAL};
pub(crate) use engine::Engine;
pub use error::{Error, Result};
pub(crate) use kernel::KernelRef;
pub use kernel::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorView, TensorViewMut};
pub use stream::StreamId;
pub(crate) use stream::{PolicyKind, VmStream};
pub use tensor::{DType, Element, Shape, TensorMeta};
