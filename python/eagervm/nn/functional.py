"""PyTorch's ``torch.nn.functional`` over eagervm arrays: the same names, arguments and
semantics, each issuing the op's instructions into the array's VM (``docs/ops.md`` lists
the ops and what each takes)."""

from .._eagervm import embedding, pad

__all__ = ["relu", "embedding", "pad"]


def relu(input, inplace=False):
    """``max(input, 0)`` elementwise; in place (returning ``input``) with ``inplace=True``."""
    return input.relu_() if inplace else input.relu()
