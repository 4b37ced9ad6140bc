"""PyTorch's module functions of the reductions, scans and normalisations
(``eagervm.sum(x, dim=1)``, ...): each calls the array's method of the same name, with
the same arguments (``docs/ops.md``, "Reductions along dimensions")."""



def sum(input, dim=None, keepdim=False, *, dtype=None):
    """The sum along ``dim`` (every element for None); int64 for bool and integers."""
    return input.sum(dim, keepdim, dtype=dtype)


def mean(input, dim=None, keepdim=False, *, dtype=None):
    """The mean along ``dim``; floating arrays, or any with ``dtype=``."""
    return input.mean(dim, keepdim, dtype=dtype)


def prod(input, dim=None, keepdim=False, *, dtype=None):
    """The product along ``dim`` (an int), or of every element."""
    return input.prod(dim, keepdim, dtype=dtype)


def amax(input, dim=(), keepdim=False):
    """The largest elements along ``dim`` (every dimension for ``()``)."""
    return input.amax(dim, keepdim)


def amin(input, dim=(), keepdim=False):
    """The smallest elements along ``dim``."""
    return input.amin(dim, keepdim)


def max(input, dim=None, keepdim=False):
    """The largest element, or ``(values, indices)`` along ``dim``."""
    return input.max(dim, keepdim)


def min(input, dim=None, keepdim=False):
    """The smallest element, or ``(values, indices)`` along ``dim``."""
    return input.min(dim, keepdim)


def argmax(input, dim=None, keepdim=False):
    """The index of the first largest element along ``dim`` (flattened for None)."""
    return input.argmax(dim, keepdim)


def argmin(input, dim=None, keepdim=False):
    """The index of the first smallest element along ``dim`` (flattened for None)."""
    return input.argmin(dim, keepdim)


def all(input, dim=None, keepdim=False):
    """Whether every element along ``dim`` is nonzero."""
    return input.all(dim, keepdim)


def any(input, dim=None, keepdim=False):
    """Whether some element along ``dim`` is nonzero."""
    return input.any(dim, keepdim)


def var(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The variance along ``dim`` with ``correction`` (default 1)."""
    return input.var(dim, unbiased, keepdim, correction=correction)


def std(input, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The standard deviation along ``dim`` with ``correction`` (default 1)."""
    return input.std(dim, unbiased, keepdim, correction=correction)


def logsumexp(input, dim, keepdim=False):
    """``log(sum(exp(input)))`` along ``dim``, stably."""
    return input.logsumexp(dim, keepdim)


def norm(input, p="fro", dim=None, keepdim=False, dtype=None):
    """The vector ``p``-norm along ``dim`` (of the flattened array for None)."""
    return input.norm(p, dim, keepdim, dtype)


def cumsum(input, dim, *, dtype=None):
    """The running sums along ``dim``."""
    return input.cumsum(dim, dtype=dtype)


def cumprod(input, dim, *, dtype=None):
    """The running products along ``dim``."""
    return input.cumprod(dim, dtype=dtype)


def softmax(input, dim, dtype=None):
    """``exp(x) / sum(exp(x))`` along ``dim``, stably."""
    return input.softmax(dim, dtype)


def log_softmax(input, dim, dtype=None):
    """``log(softmax(x))`` along ``dim``, stably."""
    return input.log_softmax(dim, dtype)


class _Linalg:
    """``eagervm.linalg``: ``vector_norm``."""

    @staticmethod
    def vector_norm(x, ord=2, dim=None, keepdim=False, *, dtype=None):
        """PyTorch's ``torch.linalg.vector_norm``: the ``ord``-norm of ``x`` along ``dim``
        (of the flattened array for None); ``ord`` 2, 1, ``inf``, ``-inf``, 0 or any real."""
        if isinstance(ord, str):
            raise ValueError(f"vector_norm(): ord must be a number, not {ord!r}")
        return x.norm(float(ord), dim, keepdim, dtype)


linalg = _Linalg()

__all__ = [
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
]

