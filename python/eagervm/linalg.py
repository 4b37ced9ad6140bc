"""PyTorch's ``torch.linalg`` over eagervm arrays: ``vector_norm``."""

__all__ = ["vector_norm"]


def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
    """The ``ord``-norm of ``x`` along ``dim`` (of the flattened array for None): ``ord``
    2, 1, ``inf``, ``-inf``, 0 (the count of nonzero elements) or any other real; one
    kernel (``norm``)."""
    if isinstance(ord, str):
        raise ValueError(f"vector_norm(): ord must be a number, not {ord!r}")
    return x.norm(float(ord), dim, keepdim, dtype)
