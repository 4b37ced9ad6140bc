//! The exceptions: `eagervm.Error` and one subclass per [`Error`] variant, plus
//! `TraceError` and `ProfileError` for the trace and timeline layers. Each carries the
//! Rust error's own message (its `Display`), so a Python user reads what a Rust user reads.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyValueError};
use pyo3::prelude::*;

use crate::ep::EpError;
use crate::profile::ProfileError as RsProfileError;
use crate::trace::TraceError as RsTraceError;
use crate::Error;

create_exception!(eagervm, VmError, PyException, "The base class of every error eagervm raises.");

macro_rules! variants {
    ($($name:ident: $doc:literal),* $(,)?) => {
        $(create_exception!(eagervm, $name, VmError, $doc);)*

        /// Add the base class and every subclass to the module.
        pub(super) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
            let py = m.py();
            m.add("Error", py.get_type::<VmError>())?;
            $(m.add(stringify!($name), py.get_type::<$name>())?;)*
            Ok(())
        }
    };
}

variants! {
    UnknownOpError: "`Error::UnknownOp`: an op with no kernel on the device.",
    InvalidOperandsError: "`Error::InvalidOperands`: the op refused its operands (count, shape, dtype).",
    OutputMismatchError: "`Error::OutputMismatch`: a given output has another shape or dtype than the op makes.",
    WrongDeviceError: "`Error::WrongDevice`: an operand is not on the stream's device.",
    AliasedError: "`Error::Aliased`: an output is also an input of the same call.",
    OverlapError: "`Error::Overlap`: an output overlaps an input, or itself, other than element for element.",
    ForeignTensorError: "`Error::ForeignTensor`: an array of another VM.",
    ReleasedError: "`Error::Released`: an array used after it was released.",
    AccessError: "`Error::Access`: a host access with the wrong length, or out of host memory.",
    UninitializedError: "`Error::Uninitialized`: a tensor read before anything wrote it.",
    KernelError: "`Error::Kernel`: a kernel failed at run time.",
    PanicError: "`Error::Panic`: a kernel panicked at run time (caught on its thread).",
    AllocError: "`Error::Alloc`: an instruction could not allocate its outputs.",
    TooLargeError: "`Error::TooLarge`: a tensor over the size cap, or whose size overflows.",
    DeviceError: "`Error::Device`: the device layer failed (a device that is not there, CUDA unavailable, ...).",
    DTypeError: "`Error::DType`: a dtype the call cannot handle.",
    ConfigError: "`Error::Config`: a configuration value out of range.",
    CollectiveError: "`Error::Collective`: a communicator or collective call that cannot be.",
    ShutDownError: "`Error::ShutDown`: the VM has shut down.",
    FailedError: "`Error::Failed`: instructions failed since the last sync (`sync()` raises it).",
    TraceError: "A trace could not be read, recorded, validated or replayed (names file, line and column).",
    ProfileError: "A timeline could not be taken or written.",
}

/// The Python exception for `e`, with its message.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::UnknownOp { .. } => UnknownOpError::new_err(msg),
        Error::InvalidOperands { .. } => InvalidOperandsError::new_err(msg),
        Error::OutputMismatch { .. } => OutputMismatchError::new_err(msg),
        Error::WrongDevice { .. } => WrongDeviceError::new_err(msg),
        Error::Aliased { .. } => AliasedError::new_err(msg),
        Error::Overlap { .. } => OverlapError::new_err(msg),
        Error::ForeignTensor { .. } => ForeignTensorError::new_err(msg),
        Error::Released { .. } => ReleasedError::new_err(msg),
        Error::Access { .. } => AccessError::new_err(msg),
        Error::Uninitialized { .. } => UninitializedError::new_err(msg),
        Error::Kernel { .. } => KernelError::new_err(msg),
        Error::Panic { .. } => PanicError::new_err(msg),
        Error::Alloc { .. } => AllocError::new_err(msg),
        Error::TooLarge { .. } => TooLargeError::new_err(msg),
        Error::Device(_) => DeviceError::new_err(msg),
        Error::DType { .. } => DTypeError::new_err(msg),
        Error::Config(_) => ConfigError::new_err(msg),
        Error::Collective { .. } => CollectiveError::new_err(msg),
        Error::ShutDown => ShutDownError::new_err(msg),
        Error::Failed { .. } => FailedError::new_err(msg),
    }
}

/// `to_py` as a `map_err` argument.
pub(crate) trait IntoPy<T> {
    /// The result with its error turned into the Python exception.
    fn py_err(self) -> PyResult<T>;
}

impl<T> IntoPy<T> for Result<T, Error> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(to_py)
    }
}

impl<T> IntoPy<T> for Result<T, RsTraceError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| TraceError::new_err(e.to_string()))
    }
}

/// A bad `EAGERVM_*` value: `ConfigError`, naming the variable (as `Error::Config` would).
impl<T> IntoPy<T> for Result<T, crate::vm::EnvError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| to_py(e.into()))
    }
}

impl<T> IntoPy<T> for Result<T, RsProfileError> {
    fn py_err(self) -> PyResult<T> {
        self.map_err(|e| ProfileError::new_err(e.to_string()))
    }
}

/// A device string the device layer cannot parse is the caller's bad input: `ValueError`.
pub(crate) fn bad_device(e: EpError) -> PyErr {
    PyValueError::new_err(e.to_string())
}
