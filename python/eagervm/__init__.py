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

import threading

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
    OverlapError,
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


_default_vm = None
_default_vm_lock = threading.Lock()


def default_vm():
    """The VM that ``from_dlpack`` uses when it is given none: started on first use with
    ``VM()``'s defaults (the ``EAGERVM_*`` variables apply), and kept for the process."""
    global _default_vm
    with _default_vm_lock:
        if _default_vm is None:
            _default_vm = VM()
        return _default_vm


def from_dlpack(x, *, vm=None, device=None, copy=None):
    """An array of ``vm`` (``default_vm()`` if None) over ``x``, any DLPack producer of
    host memory (a NumPy array, a PyTorch CPU tensor, ...): the producer's memory itself
    where the VM can use it as it is, otherwise one copy. ``device`` (default ``"cpu:0"``)
    other than the host copies to it; ``copy=True`` always copies, ``copy=False`` raises
    ``BufferError`` where a copy is needed. ``docs/python.md``, "DLPack", has the rules."""
    if vm is None:
        vm = default_vm()
    return vm.from_dlpack(x, device=device, copy=copy)


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
    "default_vm",
    "Error",
    "UnknownOpError",
    "InvalidOperandsError",
    "OutputMismatchError",
    "WrongDeviceError",
    "AliasedError",
    "OverlapError",
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
