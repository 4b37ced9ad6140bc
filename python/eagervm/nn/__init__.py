"""Neural-network functions under PyTorch's names: ``eagervm.nn.functional`` (PyTorch's
``torch.nn.functional``), so that ``import eagervm.nn.functional as F`` ports code that
imports ``torch.nn.functional as F``."""

from . import functional

__all__ = ["functional"]
