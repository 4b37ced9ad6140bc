//! Built-in kernels.
use crate::framework::OpRegistry;
/// Register the built-in kernels.
pub fn register_builtins(_r: &mut OpRegistry) {}
