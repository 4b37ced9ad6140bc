"""How an array prints: ``tensor([...], device='mock:0', dtype=eagervm.float16)``, as
PyTorch prints a tensor, with the values as NumPy formats them."""

import numpy as np

# The dtypes PyTorch leaves out of a tensor's repr: those its constructor infers.
_IMPLIED = ("float32", "int64", "bool")


def tensor_repr(x):
    """The repr of array ``x`` (waits for its values)."""
    from . import Error, UninitializedError, bfloat16

    prefix = "tensor("
    suffix = []
    try:
        values = (x.float() if x.dtype == bfloat16 else x).numpy()
        body = np.array2string(values, separator=", ", prefix=prefix, threshold=1000, edgeitems=3)
        if values.size == 0 and values.ndim != 1:
            suffix.append(f"size={tuple(values.shape)}")
    except UninitializedError:
        body = "<uninitialized>"
        suffix.append(f"size={tuple(x.shape)}")
    except Error as e:
        body = f"<{type(e).__name__}: {e}>"
        suffix.append(f"size={tuple(x.shape)}")
    device = str(x.device)
    if device != "cpu:0":
        suffix.append(f"device='{device}'")
    name = repr(x.dtype).split(".")[-1]
    if name not in _IMPLIED:
        suffix.append(f"dtype={x.dtype!r}")
    return prefix + ", ".join([body] + suffix) + ")"
