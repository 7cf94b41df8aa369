"""The autograd core: :class:`Tensor`, :class:`Function`, the ops, gradient checking.

Read in this order: ``function.py`` (one differentiable operation, forward and backward
on raw arrays), ``tensor.py`` (the graph and ``backward``), ``ops/`` (one family of
operations per file, each beside its Numba or CUDA kernel in :mod:`minidp.kernels`),
``gradcheck.py`` (central differences, used by the tests). ``tensor`` and ``ops`` import
each other (ops build Tensors, Tensor's operators call ops): the one import circle of
minidp, and it stays inside this package.
"""

from minidp.autograd.function import Function, no_grad
from minidp.autograd.tensor import Tensor

__all__ = ["Function", "Tensor", "no_grad"]
