"""PyTorch's ``torch.nn.functional`` over eagervm arrays: the same names, arguments and
semantics, each issuing the op's instructions into the array's VM (``docs/ops.md`` lists
the ops and what each takes)."""

from .._eagervm import gelu as _gelu, one_hot as _one_hot
from .._eagervm import (
    linear,
    conv2d,
    max_pool2d,
    avg_pool2d,
    adaptive_avg_pool2d,
    scaled_dot_product_attention,
    embedding,
    pad,
)

__all__ = [
    "relu",
    "linear",
    "conv2d",
    "max_pool2d",
    "avg_pool2d",
    "adaptive_avg_pool2d",
    "scaled_dot_product_attention",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "softplus",
    "one_hot",
    "embedding",
    "pad",
]


def relu(input, inplace=False):
    """``max(input, 0)`` elementwise; in place (returning ``input``) with ``inplace=True``."""
    return input.relu_() if inplace else input.relu()


def gelu(input, approximate="none"):
    """``input * Φ(input)``: the exact erf form, or PyTorch's tanh approximation with
    ``approximate="tanh"``; float32 for a bool or integer array."""
    return _gelu(input, approximate)


def silu(input, inplace=False):
    """``input * sigmoid(input)``; in place (returning ``input``) with ``inplace=True``."""
    return input.silu_() if inplace else input.silu()


def sigmoid(input):
    """``1 / (1 + exp(-input))``."""
    return input.sigmoid()


def tanh(input):
    """The hyperbolic tangent."""
    return input.tanh()


def softplus(input, beta=1.0, threshold=20.0):
    """``log(1 + exp(beta * input)) / beta``, and ``input`` itself where
    ``beta * input > threshold`` (PyTorch's formula), composed of ``mul``, ``exp``,
    ``log1p``, ``div`` and ``where``."""
    scaled = input * beta
    soft = scaled.exp().log1p() / beta
    return soft.where(scaled <= threshold, input)


def one_hot(tensor, num_classes=-1):
    """An int64 array of ``tensor``'s shape plus a last dimension of ``num_classes``, with
    1 at each class index and 0 elsewhere. ``num_classes=-1`` takes one more than the
    largest index, which reads ``tensor`` (waits for its value)."""
    return _one_hot(tensor, num_classes)
