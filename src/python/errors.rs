//! The exceptions: `eagervm.Error` and one subclass per [`Error`] variant, plus
//! `TraceError` and `ProfileError` for the trace and timeline layers. Each carries the
//! Rust error's own message (its `Display`), so a Python user reads what a Rust user reads.
//!
//! The errors of bad arguments are also the built-in exception PyTorch raises for them, so
//! that `except ValueError` and `except IndexError` catch what they catch there:
//! `InvalidOperandsError`, `OverlapError` and `TooLargeError` are `ValueError`s,
//! `OutOfRangeError` (an index or a dimension out of range, an `InvalidOperandsError` the
//! binding raises itself) is an `IndexError`, and `DTypeError` is a `TypeError`. Classes of
//! two bases are made at import with `type(name, bases, ...)`, as `create_exception!`
//! takes one.

use pyo3::create_exception;
use pyo3::exceptions::{PyException, PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::sync::GILOnceCell;
use pyo3::types::{PyDict, PyTuple, PyType};

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
            for class in Twin::ALL {
                m.add(class.name(), class.get(py)?)?;
            }
            Ok(())
        }
    };
}

variants! {
    UnknownOpError: "`Error::UnknownOp`: an op with no kernel on the device.",
    OutputMismatchError: "`Error::OutputMismatch`: a given output has another shape or dtype than the op makes.",
    WrongDeviceError: "`Error::WrongDevice`: an operand is not on the stream's device.",
    AliasedError: "`Error::Aliased`: an output is also an input of the same call.",
    ForeignTensorError: "`Error::ForeignTensor`: an array of another VM.",
    ReleasedError: "`Error::Released`: an array used after it was released.",
    AccessError: "`Error::Access`: a host access with the wrong length, or out of host memory.",
    UninitializedError: "`Error::Uninitialized`: a tensor read before anything wrote it.",
    KernelError: "`Error::Kernel`: a kernel failed at run time.",
    PanicError: "`Error::Panic`: a kernel panicked at run time (caught on its thread).",
    AllocError: "`Error::Alloc`: an instruction could not allocate its outputs.",
    DeviceError: "`Error::Device`: the device layer failed (a device that is not there, CUDA unavailable, ...).",
    ConfigError: "`Error::Config`: a configuration value out of range.",
    CollectiveError: "`Error::Collective`: a communicator or collective call that cannot be.",
    ShutDownError: "`Error::ShutDown`: the VM has shut down.",
    FailedError: "`Error::Failed`: instructions failed since the last sync (`sync()` raises it).",
    TraceError: "A trace could not be read, recorded, validated or replayed (names file, line and column).",
    ProfileError: "A timeline could not be taken or written.",
}

/// The classes of two bases: an `eagervm.Error` subclass that is also a built-in
/// exception (module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Twin {
    /// `Error::InvalidOperands`: `ValueError`.
    InvalidOperands,
    /// `Error::Overlap`: `ValueError`.
    Overlap,
    /// `Error::TooLarge`: `ValueError`.
    TooLarge,
    /// `Error::DType`: `TypeError`.
    DType,
    /// An index or a dimension out of range: `InvalidOperandsError` and `IndexError`.
    OutOfRange,
}

static TWINS: [GILOnceCell<Py<PyType>>; 5] =
    [GILOnceCell::new(), GILOnceCell::new(), GILOnceCell::new(), GILOnceCell::new(), GILOnceCell::new()];

impl Twin {
    const ALL: [Twin; 5] =
        [Twin::InvalidOperands, Twin::Overlap, Twin::TooLarge, Twin::DType, Twin::OutOfRange];

    fn name(self) -> &'static str {
        match self {
            Twin::InvalidOperands => "InvalidOperandsError",
            Twin::Overlap => "OverlapError",
            Twin::TooLarge => "TooLargeError",
            Twin::DType => "DTypeError",
            Twin::OutOfRange => "OutOfRangeError",
        }
    }

    fn doc(self) -> &'static str {
        match self {
            Twin::InvalidOperands => {
                "`Error::InvalidOperands`: the op refused its operands (count, shape, dtype, a bad view, broadcast or cast); a ValueError."
            }
            Twin::Overlap => {
                "`Error::Overlap`: an output overlaps an input, or itself, other than element for element; a ValueError."
            }
            Twin::TooLarge => "`Error::TooLarge`: a tensor over the size cap, or whose size overflows; a ValueError.",
            Twin::DType => "`Error::DType`: a dtype the call cannot handle; a TypeError.",
            Twin::OutOfRange => {
                "An index or a dimension out of range: an InvalidOperandsError that is an IndexError, as PyTorch raises."
            }
        }
    }

    /// The class, made on first use.
    pub(crate) fn get(self, py: Python<'_>) -> PyResult<Bound<'_, PyType>> {
        let cell = &TWINS[self as usize];
        let t = cell.get_or_try_init(py, || -> PyResult<Py<PyType>> {
            let bases = match self {
                Twin::InvalidOperands | Twin::Overlap | Twin::TooLarge => PyTuple::new(
                    py,
                    [py.get_type::<VmError>().into_any(), py.get_type::<PyValueError>().into_any()],
                )?,
                Twin::DType => PyTuple::new(
                    py,
                    [py.get_type::<VmError>().into_any(), py.get_type::<PyTypeError>().into_any()],
                )?,
                Twin::OutOfRange => PyTuple::new(
                    py,
                    [Twin::InvalidOperands.get(py)?.into_any(), py.get_type::<PyIndexError>().into_any()],
                )?,
            };
            let ns = PyDict::new(py);
            ns.set_item("__module__", "eagervm")?;
            ns.set_item("__doc__", self.doc())?;
            let t = py.get_type::<PyType>().call1((self.name(), bases, ns))?;
            Ok(t.downcast_into::<PyType>()?.unbind())
        })?;
        Ok(t.bind(py).clone())
    }

    /// An exception of this class with `msg`.
    pub(crate) fn err(self, msg: impl Into<String>) -> PyErr {
        let msg = msg.into();
        Python::with_gil(|py| match self.get(py) {
            Ok(t) => PyErr::from_type(t, msg),
            Err(e) => e,
        })
    }
}

/// The Python exception for `e`, with its message.
pub(crate) fn to_py(e: Error) -> PyErr {
    let msg = e.to_string();
    match e {
        Error::UnknownOp { .. } => UnknownOpError::new_err(msg),
        Error::InvalidOperands { .. } => Twin::InvalidOperands.err(msg),
        Error::OutputMismatch { .. } => OutputMismatchError::new_err(msg),
        Error::WrongDevice { .. } => WrongDeviceError::new_err(msg),
        Error::Aliased { .. } => AliasedError::new_err(msg),
        Error::Overlap { .. } => Twin::Overlap.err(msg),
        Error::ForeignTensor { .. } => ForeignTensorError::new_err(msg),
        Error::Released { .. } => ReleasedError::new_err(msg),
        Error::Access { .. } => AccessError::new_err(msg),
        Error::Uninitialized { .. } => UninitializedError::new_err(msg),
        Error::Kernel { .. } => KernelError::new_err(msg),
        Error::Panic { .. } => PanicError::new_err(msg),
        Error::Alloc { .. } => AllocError::new_err(msg),
        Error::TooLarge { .. } => Twin::TooLarge.err(msg),
        Error::Device(_) => DeviceError::new_err(msg),
        Error::DType { .. } => Twin::DType.err(msg),
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

/// `e` (an index or a dimension refused by the eager layer's checks) as `OutOfRangeError`.
pub(crate) fn out_of_range(e: Error) -> PyErr {
    Twin::OutOfRange.err(e.to_string())
}
