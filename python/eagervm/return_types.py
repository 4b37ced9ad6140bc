"""The named tuples some ops return, as PyTorch's ``torch.return_types``: ``x.max(dim)``
and ``x.min(dim)`` give ``(values, indices)``, read by attribute or unpacked."""

from collections import namedtuple

max = namedtuple("max", ["values", "indices"])
min = namedtuple("min", ["values", "indices"])

__all__ = ["max", "min"]
