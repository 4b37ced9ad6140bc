"""PyTorch's ``torch.nn.functional`` over eagervm arrays: the same names, arguments and
semantics, each issuing the op's instructions into the array's VM (``docs/ops.md`` lists
the ops and what each takes)."""

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
    "embedding",
    "pad",
]


def relu(input, inplace=False):
    """``max(input, 0)`` elementwise; in place (returning ``input``) with ``inplace=True``."""
    return input.relu_() if inplace else input.relu()
