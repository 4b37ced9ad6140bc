//! eagervm: an eager-execution virtual machine.
#![warn(missing_docs, unreachable_pub)]

pub mod alloc;
pub mod ep;
mod error;
pub mod framework;
pub mod kernels;
pub mod sync;
pub mod vm;

pub use error::{Error, Result};
