//! eagervm: an eager-execution virtual machine.
#![warn(missing_docs, unreachable_pub)]

pub mod alloc;
pub mod bench;
pub mod ep;
mod error;
pub mod framework;
pub mod kernels;
pub mod sync;
pub mod vm;

pub use error::{Error, Result};
pub use vm::{Config, VirtualMachine};

/// The names most programs need.
pub mod prelude {
    pub use crate::ep::{DeviceId, StreamType};
    pub use crate::framework::{Attrs, DType, InstructionsBuilder, Tensor};
    pub use crate::vm::{Config, StreamId, VirtualMachine};
    pub use crate::{Error, Result};
}
