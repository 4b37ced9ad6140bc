"""eagervm: an eager-execution virtual machine, from Python, with PyTorch's tensor API.

A ``VM`` runs tensor instructions asynchronously on CPU and device streams, in an order
that respects every read/write dependency; every op returns at once while the VM runs
the work, and reads (``x.numpy()``, ``x.item()``, ``print(x)``) wait for it. Names,
arguments and semantics follow PyTorch's, so PyTorch code ports by changing its imports
where the API exists. ``docs/python.md`` in the repository is the guide.

    >>> import eagervm as torch
    >>> x = torch.tensor([[1.0, -2.0], [3.0, -4.0]])
    >>> (x.relu() * 2 + 1)[:, 0].tolist()
    [3.0, 7.0]
    >>> x.dtype, x[0].shape, (x > 0).dtype
    (eagervm.float32, (2,), eagervm.bool)
"""

from ._eagervm import (
    VM,
    Array,
    Stream,
    Program,
    Profile,
    Recorder,
    dtype,
    device,
    replay,
    validate,
    analyze,
    default_vm,
    set_default_vm,
    result_type,
    promote_types,
    can_cast,
    get_default_dtype,
    zeros_like,
    ones_like,
    empty_like,
    full_like,
    exp,
    exp2,
    log,
    log2,
    log1p,
    expm1,
    sqrt,
    rsqrt,
    reciprocal,
    sin,
    cos,
    tanh,
    sigmoid,
    erf,
    abs,
    neg,
    sign,
    floor,
    ceil,
    round,
    isnan,
    isinf,
    isfinite,
    logical_not,
    logical_and,
    logical_or,
    logical_xor,
    pow,
    maximum,
    minimum,
    atan2,
    remainder,
    fmod,
    floor_divide,
    where,
    clamp,
    clip,
    lerp,
    addcmul,
    addcdiv,
    tril,
    triu,
    linspace,
    eye,
    matmul,
    mm,
    bmm,
    addmm,
    baddbmm,
    dot,
    outer,
    conv2d,
    max_pool2d,
    cat,
    stack,
    index_select,
    gather,
    scatter,
    scatter_add,
    index_add,
    nonzero,
    masked_select,
    flip,
    roll,
    tile,
    index_copy,
    index_fill,
    take,
    bool,
    uint8,
    int32,
    int64,
    float16,
    bfloat16,
    float32,
    float64,
    Error,
    UnknownOpError,
    InvalidOperandsError,
    OutOfRangeError,
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

from . import nn
from . import return_types
from . import linalg
from ._eagervm import (
    sum,
    mean,
    prod,
    amax,
    amin,
    max,
    min,
    argmax,
    argmin,
    all,
    any,
    var,
    std,
    logsumexp,
    norm,
    cumsum,
    cumprod,
    softmax,
    log_softmax,
)

# PyTorch's aliases.
float = float32
double = float64
half = float16
int = int32
long = int64

# PyTorch's other names of ``cat``.
concat = cat
concatenate = cat

#: PyTorch's name of the array class, for ``isinstance`` checks and annotations.
Tensor = Array


def _dtype_named(name):
    """The dtype called ``name`` (how dtypes unpickle)."""
    return globals()[name]


def is_tensor(obj):
    """Whether ``obj`` is an eagervm array."""
    return isinstance(obj, Array)


def tensor(data, dtype=None, device=None):
    """A new array holding a copy of ``data`` (numbers, nested sequences, NumPy or eagervm
    arrays) on the default VM (``default_vm()``): PyTorch's dtype inference (bool, int64,
    or the default float dtype where a float is among the values); a NumPy array keeps its
    dtype."""
    return default_vm().tensor(data, dtype=dtype, device=device)


def from_numpy(ndarray):
    """An array of the default VM over the NumPy array's memory, as PyTorch's
    ``from_numpy`` shares it, where the VM can use it as it is (C-contiguous, 8-byte
    aligned, writable); otherwise over a copy. ``docs/python.md``, "DLPack", says how
    writes on either side are ordered."""
    return default_vm().from_numpy(ndarray)


def zeros(*size, dtype=None, device=None):
    """``zeros(2, 3)`` or ``zeros((2, 3))``: an array of zeros on the default VM (dtype
    float32 unless given, device ``cpu:0`` unless given)."""
    return default_vm().zeros(*size, dtype=dtype, device=device)


def ones(*size, dtype=None, device=None):
    """An array of ones on the default VM (as ``zeros``)."""
    return default_vm().ones(*size, dtype=dtype, device=device)


def empty(*size, dtype=None, device=None):
    """An array nothing has written, on the default VM: reading it before a write raises
    ``UninitializedError`` (PyTorch gives whatever the memory held)."""
    return default_vm().empty(*size, dtype=dtype, device=device)


def full(size, fill_value, dtype=None, device=None):
    """An array of ``fill_value`` on the default VM; its dtype, unless given, is the
    value's (bool, int64, or float32 for a float)."""
    return default_vm().full(size, fill_value, dtype=dtype, device=device)


def arange(start, end=None, step=None, *, dtype=None, device=None):
    """``arange(end)`` or ``arange(start, end, step=1)`` on the default VM: int64 for
    integer arguments, float32 if any is a float (unless ``dtype`` is given)."""
    return default_vm().arange(start, end, step, dtype=dtype, device=device)


def from_dlpack(x, *, vm=None, device=None, copy=None):
    """An array of ``vm`` (``default_vm()`` if None) over ``x``, any DLPack producer of
    host or CUDA memory (a NumPy array, a PyTorch tensor, ...): the producer's memory itself
    where the VM can use it as it is, otherwise one copy. ``device`` (default ``"cpu:0"``)
    other than the host copies to it; ``copy=True`` always copies, ``copy=False`` raises
    ``BufferError`` where a copy is needed. ``docs/python.md``, "DLPack", has the rules."""
    if vm is None:
        vm = default_vm()
    return vm.from_dlpack(x, device=device, copy=copy)


__all__ = [
    "VM",
    "Array",
    "Tensor",
    "Stream",
    "Program",
    "Profile",
    "Recorder",
    "dtype",
    "device",
    "replay",
    "validate",
    "analyze",
    "default_vm",
    "set_default_vm",
    "result_type",
    "promote_types",
    "can_cast",
    "get_default_dtype",
    "is_tensor",
    "tensor",
    "from_numpy",
    "from_dlpack",
    "zeros",
    "ones",
    "empty",
    "full",
    "arange",
    "zeros_like",
    "ones_like",
    "empty_like",
    "full_like",
    "exp",
    "exp2",
    "log",
    "log2",
    "log1p",
    "expm1",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "erf",
    "abs",
    "neg",
    "sign",
    "floor",
    "ceil",
    "round",
    "isnan",
    "isinf",
    "isfinite",
    "logical_not",
    "logical_and",
    "logical_or",
    "logical_xor",
    "pow",
    "maximum",
    "minimum",
    "atan2",
    "remainder",
    "fmod",
    "floor_divide",
    "where",
    "clamp",
    "clip",
    "lerp",
    "addcmul",
    "addcdiv",
    "tril",
    "triu",
    "linspace",
    "eye",
    "matmul",
    "mm",
    "bmm",
    "addmm",
    "baddbmm",
    "dot",
    "outer",
    "conv2d",
    "max_pool2d",
    "cat",
    "concat",
    "concatenate",
    "stack",
    "index_select",
    "gather",
    "scatter",
    "scatter_add",
    "index_add",
    "nonzero",
    "masked_select",
    "flip",
    "roll",
    "tile",
    "index_copy",
    "index_fill",
    "take",
    "bool",
    "uint8",
    "int32",
    "int64",
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float",
    "double",
    "half",
    "int",
    "long",
    "nn",
    "return_types",
    "sum",
    "mean",
    "prod",
    "amax",
    "amin",
    "max",
    "min",
    "argmax",
    "argmin",
    "all",
    "any",
    "var",
    "std",
    "logsumexp",
    "norm",
    "cumsum",
    "cumprod",
    "softmax",
    "log_softmax",
    "linalg",
    "Error",
    "UnknownOpError",
    "InvalidOperandsError",
    "OutOfRangeError",
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
