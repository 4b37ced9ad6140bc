//! The front end: tensors, ops and kernels, and the instruction builder.

pub mod collective;
pub mod op;
pub mod tensor;
pub(crate) mod virtual_machine;

pub use crate::vm::kernel::{Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, TensorView, TensorViewMut};
pub use crate::vm::{shape, DType, Element, Shape, TensorMeta};
pub use op::{Op, OpRegistry};
pub use tensor::Tensor;
pub mod builder;
mod deferred;
pub(crate) mod infer_cache;
pub(crate) mod release;
pub use builder::{InstructionsBuilder, MAX_INPUTS};
pub use collective::Communicator;
pub use virtual_machine::VirtualMachine;
