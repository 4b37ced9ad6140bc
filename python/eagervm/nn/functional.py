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
    "softmax",
    "log_softmax",
    "layer_norm",
    "nll_loss",
    "cross_entropy",
    "mse_loss",
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
def _reduction(size_average, reduce, reduction):
    """PyTorch's legacy ``size_average`` and ``reduce`` arguments as a ``reduction``."""
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    if not reduce:
        return "none"
    return "mean" if size_average else "sum"


def softmax(input, dim=None, _stacklevel=3, dtype=None):
    """``exp(x) / sum(exp(x))`` along ``dim``, computed stably (one kernel); ``dtype``
    converts the input first."""
    if dim is None:
        raise TypeError("softmax(): give dim (PyTorch's implicit choice is deprecated)")
    return input.softmax(dim, dtype)


def log_softmax(input, dim=None, _stacklevel=3, dtype=None):
    """``log(softmax(x))`` along ``dim``, computed stably (one kernel)."""
    if dim is None:
        raise TypeError("log_softmax(): give dim (PyTorch's implicit choice is deprecated)")
    return input.log_softmax(dim, dtype)


def layer_norm(input, normalized_shape, weight=None, bias=None, eps=1e-5):
    """Each group of the last ``len(normalized_shape)`` dimensions scaled to mean 0 and
    (biased) variance 1, then times ``weight`` plus ``bias`` where given (one kernel)."""
    if isinstance(normalized_shape, int):
        normalized_shape = (normalized_shape,)
    return input._layer_norm(list(normalized_shape), weight, bias, eps)


def nll_loss(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
             reduction="mean"):
    """The negative log-likelihood of class indices ``target`` under log-probabilities
    ``input`` (``[N, C]``, ``[N, C, d1, ...]`` or ``[C]``), one kernel."""
    return input._nll_loss(target, weight, ignore_index, _reduction(size_average, reduce, reduction))


def cross_entropy(input, target, weight=None, size_average=None, ignore_index=-100, reduce=None,
                  reduction="mean", label_smoothing=0.0):
    """``nll_loss(log_softmax(input, class dim), target)`` for class indices, or the
    cross entropy with class probabilities (a floating ``target`` of the input's shape);
    ``label_smoothing`` as PyTorch."""
    return input._cross_entropy(
        target, weight, ignore_index, _reduction(size_average, reduce, reduction), float(label_smoothing)
    )


def mse_loss(input, target, size_average=None, reduce=None, reduction="mean", weight=None):
    """``(input - target)**2``, then its mean, sum, or itself (``reduction``)."""
    if weight is not None:
        raise TypeError("mse_loss(): weight is not supported")
    return input._mse_loss(target, _reduction(size_average, reduce, reduction))
