"""Shape ops: reshape, transpose, flatten and indexing (integer arrays, slices)."""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.backend import array_module


class Reshape(Function):
    """The same elements in a new shape."""

    def forward(self, a: Any, shape: tuple) -> Any:
        self.shape = a.shape
        try:
            return a.reshape(shape)
        except ValueError:
            raise ValueError(
                f"reshape: cannot reshape an array of shape {a.shape} ({a.size} elements) "
                f"into shape {tuple(shape)}") from None

    def backward(self, g: Any) -> tuple:
        return (g.reshape(self.shape),)


class Transpose(Function):
    """Permute axes; ``axes=None`` reverses them."""

    def forward(self, a: Any, axes: Any = None) -> Any:
        if axes is not None and sorted(axes) != list(range(a.ndim)):
            raise ValueError(
                f"transpose: axes {tuple(axes)} are not a permutation of range({a.ndim})")
        self.axes = tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)
        return a.transpose(self.axes)

    def backward(self, g: Any) -> tuple:
        inverse = [0] * len(self.axes)
        for i, ax in enumerate(self.axes):
            inverse[ax] = i
        return (g.transpose(inverse),)


class Flatten(Function):
    """Merge the axes from ``start_dim`` on: (N, C, H, W) -> (N, C*H*W) for start_dim=1."""

    def forward(self, a: Any, start_dim: int = 1) -> Any:
        if not -a.ndim <= start_dim < max(a.ndim, 1):
            raise ValueError(f"flatten: start_dim {start_dim} is out of range for {a.ndim} dims")
        self.shape = a.shape
        start = start_dim % max(a.ndim, 1)
        return a.reshape(a.shape[:start] + (-1,))

    def backward(self, g: Any) -> tuple:
        return (g.reshape(self.shape),)


class GetItem(Function):
    """``a[index]``: basic slicing and integer-array indexing; repeated indices accumulate."""

    def forward(self, a: Any, index: Any) -> Any:
        self.shape, self.dtype, self.index = a.shape, a.dtype, index
        return a[index]

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        grad = xp.zeros(self.shape, dtype=self.dtype)
        xp.add.at(grad, self.index, g)
        return (grad,)
