//! The front end: tensors, ops and kernels, and the instruction builder.

pub(crate) mod collective;
pub(crate) mod op;
pub(crate) mod tensor;
pub(crate) mod virtual_machine;

pub use crate::vm::kernel::{
    Attrs, KernelCtx, OpKernel, OutSpec, OutSpecs, Params, ParamsFull, Scalar, TensorView, TensorViewMut,
};
pub use crate::vm::params::MAX_PARAMS;
pub use crate::vm::{
    bf16, contiguous_strides, f16, promote_types, shape, Category, DType, Element, Shape, Strides, TensorMeta,
};
pub use op::{Call, Op, OpRegistry};
pub use tensor::Tensor;
pub(crate) mod builder;
mod deferred;
pub(crate) mod infer_cache;
pub(crate) mod layout;
#[cfg(test)]
mod lend_tests;
#[cfg(all(test, feature = "cuda"))]
mod ops_table;
pub(crate) mod release;
pub use crate::alloc::HostLoan;
pub use builder::{InstructionsBuilder, MAX_INPUTS};
pub use collective::Communicator;
pub use virtual_machine::VirtualMachine;
