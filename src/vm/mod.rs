//! The engine: the object model, the kernel ABI, instructions, the scheduler, `ThreadCtx`
//! workers, stream and instruction policies, and the observers' views.
//!
//! This layer knows nothing above it (`docs/architecture.md`, "Layers"): the front end
//! (`framework`) starts an engine and submits batches of instructions to it; trace
//! recording and profiling watch it through `observe`. See `scheduler.rs` for the lifecycle
//! of an instruction and the edge rules, `thread_ctx.rs` for the workers' sleep/wake
//! protocol, and `engine/` for the engine's parts (the stream table, the inbox, the
//! completion channel, the worker queues), each with its protocol, their assembly and
//! shutdown.
//! `stream_policy/` has how each stream's instructions run and complete, one file per
//! stream policy (synchronous, event-recorded, on the scheduler thread), with the one
//! registration of a stream's policy; `instruction_policy/` what each kind of instruction
//! does to its tensors, one file per kind. [`flight`] keeps the last instructions of each
//! stream and `watchdog.rs` turns a hang into an error.

mod back_pressure;
mod config;
pub(crate) mod dependence;
mod dtype;
pub(crate) mod engine;
pub mod env;
mod error;
pub mod flight;
pub(crate) mod instruction;
mod instruction_policy;
mod intern;
pub mod kernel;
pub(crate) mod observe;
pub(crate) mod panic_hook;
pub mod params;
mod refcount;
mod rendezvous;
mod report;
pub(crate) mod scheduler;
pub mod shape;
mod stream;
mod stream_policy;
pub(crate) mod tensor;
pub(crate) mod thread_ctx;
pub(crate) mod views;
mod watchdog;

pub use config::{bounds, default_max_tensor_bytes, FALLBACK_MAX_TENSOR_BYTES};
pub use config::{
    Config, FaultInjection, StreamPriorities, ThreadTopology, DEFAULT_EVENT_INTERVAL,
    DEFAULT_WATCHDOG_TIMEOUT,
};
pub use dtype::{bf16, f16, promote_types, read_element, write_element, Category};
pub(crate) use engine::VmStream;
pub(crate) use engine::{Engine, EngineRef, Handoff};
pub use env::EnvError;
pub use error::{Error, Result};
pub(crate) use kernel::KernelRef;
pub use kernel::{
    Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, Params, ParamsFull, Scalar, TensorView, TensorViewMut,
};
pub use stream::StreamId;
pub use tensor::{contiguous_strides, DType, Element, Shape, Strides, TensorMeta};
