"""Flat parameter storage: one contiguous buffer for all parameters, one for all gradients.

Every ``Parameter.data`` and ``Parameter.grad`` is a reshaped view into these
buffers, in ``named_parameters()`` order. So one MPI call reduces every gradient of
the model, a fused kernel updates every parameter in one pass, and the gradient
buffer can itself be a rank's segment of a node's shared-memory window
(:meth:`FlatParameters.rebind_grad` of a ``minidp.comm.NodeBuffer``), which makes
intra-node reduction zero-copy.
"""

from __future__ import annotations

from typing import Any, Protocol

from minidp.autograd.tensor import Tensor
from minidp.backend import array_module


class Parameter(Tensor):
    """A Tensor that is a trainable parameter of a Module (requires_grad by default).

    Attributes:
        flat_owner: the :class:`FlatParameters` whose buffers hold this parameter's
            ``data`` and ``grad`` (None until a model's parameters are flattened), so an
            optimizer can update them all in one pass.
    """

    def __init__(self, data: Any, requires_grad: bool = True) -> None:
        super().__init__(data, requires_grad=requires_grad)
        self.flat_owner: FlatParameters | None = None


class GradientMemory(Protocol):
    """Memory the flat gradients can be moved into: ``minidp.comm.NodeBuffer``.

    A protocol, because layers never import comm. The strategy hands the same object to
    its reductions, which then know by its type that the gradients lie in the node's
    window (no copy in or out), while ``grad`` stays a plain array view for the optimizer.
    """

    @property
    def array(self) -> Any:
        """The memory as a 1-D array of the parameters' size and dtype."""


class FlatParameters:
    """Flat ``data`` and ``grad`` buffers backing a list of parameters.

    Args:
        params: the parameters, in a fixed order; all of one floating dtype.

    Attributes:
        data: 1-D array of every parameter value.
        grad: 1-D array of every gradient (zeros initially).
        params: the parameters, in buffer order.
        slices: ``slices[i]`` is the range of ``params[i]`` in the buffers.
    """

    def __init__(self, params: list[Parameter]) -> None:
        dtypes = {p.data.dtype for p in params}
        if len(dtypes) > 1:
            raise TypeError(f"flat parameters: parameters have mixed dtypes "
                            f"{sorted(map(str, dtypes))}; convert the model with "
                            "Module.to(dtype) first")
        xp = array_module(*[p.data for p in params])
        dtype = dtypes.pop() if dtypes else xp.float32
        self.params = list(params)
        self.slices, offset = [], 0
        for p in self.params:
            self.slices.append(slice(offset, offset + p.data.size))
            offset += p.data.size
        self.data = xp.empty(offset, dtype=dtype)
        self.grad = xp.zeros(offset, dtype=dtype)
        for p, sl in zip(self.params, self.slices):
            self.data[sl] = p.data.reshape(-1)
            if p.grad is not None:
                self.grad[sl] = p.grad.reshape(-1)
            shape = p.data.shape
            p.data = self.data[sl].reshape(shape)
            p.grad = self.grad[sl].reshape(shape)
            p.flat_owner = self
        self._views = [(p.data, p.grad) for p in self.params]

    @property
    def size(self) -> int:
        """Number of scalars in the buffers."""
        return self.data.size

    def intact(self, params: list[Parameter]) -> bool:
        """Whether ``params`` are still exactly these parameters, viewing these buffers."""
        return len(params) == len(self.params) and all(
            p is q and p.data is d and p.grad is g
            for p, q, (d, g) in zip(params, self.params, self._views))

    def rebind_grad(self, memory: GradientMemory) -> None:
        """Move the gradient storage into ``memory`` (a node's shared-memory segment).

        Current gradient values are copied over; ``grad`` and every ``Parameter.grad``
        become views of ``memory.array``.
        """
        buffer = memory.array
        if buffer.shape != (self.size,) or buffer.dtype != self.data.dtype:
            raise ValueError(f"rebind_grad: buffer has shape {buffer.shape} and dtype "
                             f"{buffer.dtype}, expected ({self.size},) and {self.data.dtype}")
        buffer[...] = self.grad
        self.grad = buffer
        for i, (p, sl) in enumerate(zip(self.params, self.slices)):
            p.grad = buffer[sl].reshape(p.data.shape)
            self._views[i] = (p.data, p.grad)

    def rebind_data(self, buffer: Any) -> None:
        """Let the parameters live in ``buffer`` from now on: its values are theirs.

        Nothing is copied (the caller fills it first): ``data`` and every
        ``Parameter.data`` become views of ``buffer``. DASO's identical node keeps one
        replica in a node window this way.
        """
        if buffer.shape != (self.size,) or buffer.dtype != self.data.dtype:
            raise ValueError(f"rebind_data: buffer has shape {buffer.shape} and dtype "
                             f"{buffer.dtype}, expected ({self.size},) and {self.data.dtype}")
        self.data = buffer
        for i, (p, sl) in enumerate(zip(self.params, self.slices)):
            p.data = buffer[sl].reshape(p.data.shape)
            self._views[i] = (p.data, p.grad)

    def zero_grad(self) -> None:
        """Set every gradient to zero with one write."""
        self.grad[...] = 0
