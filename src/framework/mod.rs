//! The front end: tensors, ops and kernels, and the instruction builder.

pub mod op;
pub mod shape;
pub mod tensor;

pub(crate) use op::KernelRef;
pub use op::{Attrs, KernelCtx, Op, OpKernel, OpRegistry, OutSpec, OutSpecs, TensorView, TensorViewMut};
pub use tensor::{DType, Element, Shape, Tensor, TensorMeta};
pub mod builder;
pub(crate) mod infer_cache;
pub(crate) mod release;
pub use builder::{InstructionsBuilder, MAX_INPUTS};
