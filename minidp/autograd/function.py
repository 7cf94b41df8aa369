"""Function: one differentiable operation, forward and backward on raw arrays.

A Function subclass implements ``forward(*arrays, **options)`` returning the output
array and ``backward(grad_output)`` returning one gradient per input (None where
an input needs none; ``self.wants(i)`` tells which inputs do, so a costly
gradient such as that of the image batch is never computed). A backward may also add
a leaf input's gradient into that leaf's ``grad`` array itself, and return None for it
(Linear's weight gradient, added in the BLAS's product). Whatever backward
needs is saved on ``self`` during forward: the instance *is* the saved context.
:meth:`Function.apply` wraps the arrays of Tensor inputs, runs forward, and links
the output into the graph only when a gradient is needed, so inference under
:func:`no_grad` builds no graph at all.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from minidp.backend import array_module

if TYPE_CHECKING:
    from minidp.autograd.tensor import Tensor

_grad_state = {"enabled": True}


def is_grad_enabled() -> bool:
    """Whether operations currently record a graph for backward()."""
    return _grad_state["enabled"]


@contextlib.contextmanager
def no_grad() -> Iterator[None]:
    """Context manager in which no graph is recorded (evaluation, parameter updates)."""
    previous = _grad_state["enabled"]
    _grad_state["enabled"] = False
    try:
        yield
    finally:
        _grad_state["enabled"] = previous


def unbroadcast(grad: Any, shape: tuple) -> Any:
    """Sum ``grad`` over the axes along which an input of ``shape`` was broadcast."""
    if grad.shape == tuple(shape):
        return grad
    extra = grad.ndim - len(shape)
    if extra:
        grad = grad.sum(axis=tuple(range(extra)))
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    if stretched:
        grad = grad.sum(axis=stretched, keepdims=True)
    return grad


class Function(abc.ABC):
    """Base class of differentiable operations (see module docstring)."""

    inputs: tuple
    needs_grad: tuple

    @abc.abstractmethod
    def forward(self, *arrays: Any, **options: Any) -> Any:
        """Compute the output array from the input arrays."""

    @abc.abstractmethod
    def backward(self, grad_output: Any) -> tuple:
        """Return the gradient of the loss with respect to each input."""

    def wants(self, i: int) -> bool:
        """Whether input ``i`` (which may be an omitted optional input) needs a gradient."""
        return i < len(self.needs_grad) and self.needs_grad[i]

    @classmethod
    def apply(cls, *inputs: Any, **options: Any) -> Tensor:
        """Run the operation on Tensors (or raw arrays and scalars) and record it."""
        from minidp.autograd.tensor import Tensor

        arrays = [t.data if isinstance(t, Tensor) else t for t in inputs]
        xp = array_module(*arrays)
        fn = cls()
        # Reductions give NumPy scalars; asarray keeps every Tensor's data a real array.
        out = xp.asarray(fn.forward(*arrays, **options))
        needs_grad = is_grad_enabled() and any(
            isinstance(t, Tensor) and t.requires_grad for t in inputs)
        result = Tensor(out, requires_grad=needs_grad)
        if needs_grad:
            fn.inputs = inputs
            fn.needs_grad = tuple(isinstance(t, Tensor) and t.requires_grad for t in inputs)
            result._creator = fn
        return result
