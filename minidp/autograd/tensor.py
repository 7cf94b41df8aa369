"""Tensor: an array (NumPy or CuPy) with an optional gradient and its place in the graph.

``Tensor.data`` and ``Tensor.grad`` are raw arrays, never Tensors: the optimizer and
the communication layer work on them directly (a Parameter's ``data``/``grad`` are
views into one flat buffer that MPI reduces in a single call). Operators build the
graph through :class:`minidp.autograd.function.Function`; :meth:`Tensor.backward` walks it in
reverse topological order and accumulates into the ``grad`` of leaf tensors, in place
when a gradient array already exists (so preallocated views stay views).
"""

from __future__ import annotations

from typing import Any

from minidp import backend
from minidp.autograd.function import Function


def _as_array(data: Any) -> Any:
    if isinstance(data, Tensor):
        return data.data
    if hasattr(data, "dtype") and hasattr(data, "shape"):
        return data
    arr = backend.xp().asarray(data)
    # Python floats would give float64: minidp, like PyTorch, defaults to float32.
    if arr.dtype.kind == "f" and arr.dtype.itemsize == 8:
        arr = arr.astype("float32")
    return arr


class Tensor:
    """An n-dimensional array that can record operations for reverse-mode autodiff.

    Args:
        data: a NumPy/CuPy array (kept as is, dtype included), a scalar or a nested
            list (converted on the selected backend, float32 for floating values).
        requires_grad: whether backward() should compute a gradient for this tensor.
    """

    # Makes ``numpy_array * tensor`` call Tensor.__rmul__ instead of NumPy broadcasting.
    __array_priority__ = 1000

    def __init__(self, data: Any, requires_grad: bool = False) -> None:
        self.data = _as_array(data)
        self.requires_grad = bool(requires_grad)
        self.grad: Any = None
        self._creator: Function | None = None

    # -- array-like properties -------------------------------------------------------
    @property
    def shape(self) -> tuple:
        """Shape of the underlying array."""
        return self.data.shape

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return self.data.ndim

    @property
    def dtype(self) -> Any:
        """Dtype of the underlying array."""
        return self.data.dtype

    @property
    def size(self) -> int:
        """Number of elements."""
        return self.data.size

    def __len__(self) -> int:
        return len(self.data)

    def __repr__(self) -> str:
        grad = ", requires_grad=True" if self.requires_grad else ""
        return f"Tensor({self.data!r}{grad})"

    def item(self) -> float:
        """The value of a one-element tensor as a Python number."""
        return self.data.item()

    def numpy(self) -> Any:
        """The data as a NumPy array on the host."""
        return backend.to_host(self.data)

    def detach(self) -> Tensor:
        """A tensor sharing this data but cut from the graph."""
        return Tensor(self.data)

    def zero_grad(self) -> None:
        """Reset the gradient to zero in place (keeps preallocated gradient views)."""
        if self.grad is not None:
            self.grad[...] = 0

    # -- autodiff ----------------------------------------------------------------------
    def backward(self, grad: Any = None) -> None:
        """Accumulate d(self)/d(leaf) into the ``grad`` of every leaf that requires it.

        Args:
            grad: gradient of the final objective with respect to this tensor; may be
                omitted only when this tensor holds a single element.

        Raises:
            ValueError: ``grad`` is omitted on a tensor with more than one element, or
                its shape differs from this tensor's.
            RuntimeError: this tensor does not require a gradient.
        """
        if not self.requires_grad:
            raise RuntimeError("backward(): this tensor does not require grad and has no graph")
        xp = backend.array_module(self.data)
        if grad is None:
            if self.data.size != 1:
                raise ValueError(
                    f"backward(): grad can be omitted only for a one-element tensor, "
                    f"this one has shape {self.shape}; pass grad= with that shape")
            grad = xp.ones_like(self.data)
        else:
            grad = backend.to_module(_as_array(grad), xp)
            if grad.shape != self.shape:
                raise ValueError(
                    f"backward(): grad has shape {grad.shape}, expected {self.shape}")
        grads = {id(self): grad}
        for node in self._reverse_topological_order():
            g = grads.pop(id(node), None)
            if g is None:
                continue
            fn = node._creator
            if fn is None:
                node._accumulate(g)
                continue
            for parent, pg in zip(fn.inputs, fn.backward(g)):
                if pg is None or not isinstance(parent, Tensor) or not parent.requires_grad:
                    continue
                key = id(parent)
                grads[key] = pg if key not in grads else grads[key] + pg

    def _accumulate(self, g: Any) -> None:
        if self.grad is None:
            xp = backend.array_module(self.data)
            self.grad = xp.array(g, dtype=self.data.dtype, copy=True)
        else:
            self.grad += g

    def _reverse_topological_order(self) -> list:
        order, seen = [], set()
        stack = [(self, False)]
        while stack:
            node, expanded = stack.pop()
            if expanded:
                order.append(node)
                continue
            if id(node) in seen:
                continue
            seen.add(id(node))
            stack.append((node, True))
            if node._creator is not None:
                for parent in node._creator.inputs:
                    if isinstance(parent, Tensor) and parent.requires_grad \
                            and id(parent) not in seen:
                        stack.append((parent, False))
        return order[::-1]

    # -- operators (implemented in minidp.autograd.ops) -------------------------------------------
    def __add__(self, other: Any) -> Tensor:
        return ops.add(self, other)

    def __radd__(self, other: Any) -> Tensor:
        return ops.add(other, self)

    def __sub__(self, other: Any) -> Tensor:
        return ops.sub(self, other)

    def __rsub__(self, other: Any) -> Tensor:
        return ops.sub(other, self)

    def __mul__(self, other: Any) -> Tensor:
        return ops.mul(self, other)

    def __rmul__(self, other: Any) -> Tensor:
        return ops.mul(other, self)

    def __truediv__(self, other: Any) -> Tensor:
        return ops.div(self, other)

    def __rtruediv__(self, other: Any) -> Tensor:
        return ops.div(other, self)

    def __neg__(self) -> Tensor:
        return ops.neg(self)

    def __pow__(self, exponent: Any) -> Tensor:
        return ops.pow(self, exponent)

    def __rpow__(self, base: Any) -> Tensor:
        return ops.pow(base, self)

    def __matmul__(self, other: Any) -> Tensor:
        return ops.matmul(self, other)

    def __rmatmul__(self, other: Any) -> Tensor:
        return ops.matmul(other, self)

    def __getitem__(self, index: Any) -> Tensor:
        return ops.getitem(self, index)

    def sum(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Sum over ``axis`` (all axes when None)."""
        return ops.sum(self, axis=axis, keepdims=keepdims)

    def mean(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Mean over ``axis`` (all axes when None)."""
        return ops.mean(self, axis=axis, keepdims=keepdims)

    def max(self, axis: Any = None, keepdims: bool = False) -> Tensor:
        """Maximum over ``axis``; the gradient is shared equally between tied maxima."""
        return ops.max(self, axis=axis, keepdims=keepdims)

    def reshape(self, *shape: Any) -> Tensor:
        """Same data in a new shape (one -1 allowed)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        return ops.reshape(self, shape)

    def transpose(self, *axes: Any) -> Tensor:
        """Permute axes (reverse them when none are given)."""
        if len(axes) == 1 and isinstance(axes[0], (tuple, list)):
            axes = tuple(axes[0])
        return ops.transpose(self, axes or None)

    @property
    def T(self) -> Tensor:  # noqa: N802 - NumPy's and PyTorch's name
        """The tensor with its axes reversed."""
        return ops.transpose(self, None)

    def flatten(self, start_dim: int = 0) -> Tensor:
        """Merge the axes from ``start_dim`` on into one."""
        return ops.flatten(self, start_dim)

    def relu(self) -> Tensor:
        """max(x, 0)."""
        return ops.relu(self)

    def exp(self) -> Tensor:
        """Elementwise e**x."""
        return ops.exp(self)

    def log(self) -> Tensor:
        """Elementwise natural logarithm."""
        return ops.log(self)

    def sigmoid(self) -> Tensor:
        """Elementwise logistic function."""
        return ops.sigmoid(self)

    def tanh(self) -> Tensor:
        """Elementwise hyperbolic tangent."""
        return ops.tanh(self)


from minidp.autograd import ops  # noqa: E402 - ops build Tensors, so they import this module first
