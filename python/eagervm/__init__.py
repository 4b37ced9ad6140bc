"""eagervm: an eager-execution virtual machine, from Python.

A ``VM`` runs small tensor instructions asynchronously on CPU and device streams, in an
order that respects every read/write dependency. Arrays come from NumPy (``vm.array``)
and go back to it (``arr.numpy()``, which waits); every op returns at once while the VM
runs the work. ``docs/python.md`` in the repository is the guide.

    >>> import numpy as np, eagervm
    >>> vm = eagervm.VM(mock_devices=1)
    >>> x = vm.array(np.array([1.0, -2.0, 3.0], dtype=np.float32), device="mock:0")
    >>> (x.relu() * 2.0).numpy()
    array([2., 0., 6.], dtype=float32)
"""

from ._eagervm import (
    VM,
    Array,
    Stream,
    Program,
    Profile,
    Recorder,
    replay,
    validate,
    analyze,
    Error,
    UnknownOpError,
    InvalidOperandsError,
    OutputMismatchError,
    WrongDeviceError,
    AliasedError,
    ForeignTensorError,
    ReleasedError,
    AccessError,
    UninitializedError,
    KernelError,
    PanicError,
    AllocError,
    TooLargeError,
    DeviceError,
    DTypeError,
    ConfigError,
    CollectiveError,
    ShutDownError,
    FailedError,
    TraceError,
    ProfileError,
    __version__,
)


def from_dlpack(x, *, vm, device="cpu:0"):
    """A new array of ``vm`` holding a copy of ``x``, any DLPack producer of host memory
    (a NumPy array, a PyTorch CPU tensor, ...), on ``device``."""
    return vm.from_dlpack(x, device=device)


__all__ = [
    "VM",
    "Array",
    "Stream",
    "Program",
    "Profile",
    "Recorder",
    "replay",
    "validate",
    "analyze",
    "from_dlpack",
    "Error",
    "UnknownOpError",
    "InvalidOperandsError",
    "OutputMismatchError",
    "WrongDeviceError",
    "AliasedError",
    "ForeignTensorError",
    "ReleasedError",
    "AccessError",
    "UninitializedError",
    "KernelError",
    "PanicError",
    "AllocError",
    "TooLargeError",
    "DeviceError",
    "DTypeError",
    "ConfigError",
    "CollectiveError",
    "ShutDownError",
    "FailedError",
    "TraceError",
    "ProfileError",
]
