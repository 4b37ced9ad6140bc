//! `eagervm.Array`: an [`eager::Array`](crate::eager::Array) from Python. The class is
//! here, below every file that takes or makes one; its methods, with PyTorch's names,
//! arguments and semantics, are in `python::methods`.
//!
//! The class is frozen: an `eager::Array` is a counted handle that is `Send` and `Sync`,
//! so arrays may be used from several Python threads.

use pyo3::prelude::*;

use crate::eager::Array;

/// An eager array of one VM.
#[pyclass(frozen, name = "Array", module = "eagervm")]
pub(crate) struct PyArr {
    pub(crate) a: Array,
}
