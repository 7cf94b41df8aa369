"""Reductions: sum, mean and max over any axes, with ``keepdims``.

Backward re-inserts the reduced axes and broadcasts the gradient back to the input
shape. ``max`` shares the gradient equally between tied maxima (the subgradient
PyTorch's ``amax`` uses), which keeps central-difference checks honest.
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.backend import array_module


def normalize_axes(axis: Any, ndim: int, op: str) -> tuple:
    """Turn ``axis`` (None, int or sequence) into a sorted tuple of non-negative axes."""
    if axis is None:
        return tuple(range(ndim))
    axes = (axis,) if isinstance(axis, int) else tuple(axis)
    out = []
    for a in axes:
        if not isinstance(a, int) or not -ndim <= a < max(ndim, 1):
            raise ValueError(f"{op}: axis {axis!r} is out of range for an array of {ndim} dims")
        out.append(a % max(ndim, 1))
    if len(set(out)) != len(out):
        raise ValueError(f"{op}: axis {axis!r} repeats an axis")
    return tuple(sorted(out))


def _expand(g: Any, axes: tuple, keepdims: bool) -> Any:
    if keepdims or not axes:
        return g
    xp = array_module(g)
    return xp.expand_dims(g, axes)


class Sum(Function):
    """Sum over axes."""

    def forward(self, a: Any, axis: Any = None, keepdims: bool = False) -> Any:
        self.shape, self.keepdims = a.shape, keepdims
        self.axes = normalize_axes(axis, a.ndim, "sum")
        return a.sum(axis=self.axes, keepdims=keepdims)

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        return (xp.broadcast_to(_expand(g, self.axes, self.keepdims), self.shape),)


class Mean(Function):
    """Mean over axes."""

    def forward(self, a: Any, axis: Any = None, keepdims: bool = False) -> Any:
        self.shape, self.keepdims = a.shape, keepdims
        self.axes = normalize_axes(axis, a.ndim, "mean")
        self.count = 1
        for ax in self.axes:
            self.count *= a.shape[ax]
        return a.mean(axis=self.axes, keepdims=keepdims)

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        return (xp.broadcast_to(_expand(g, self.axes, self.keepdims) / self.count, self.shape),)


class Max(Function):
    """Maximum over axes; tied maxima share the gradient equally."""

    def forward(self, a: Any, axis: Any = None, keepdims: bool = False) -> Any:
        if a.size == 0:
            raise ValueError("max: the input is empty, a maximum is undefined")
        self.a, self.keepdims = a, keepdims
        self.axes = normalize_axes(axis, a.ndim, "max")
        self.out = a.max(axis=self.axes, keepdims=True)
        return self.out if keepdims else self.out.reshape(
            [n for i, n in enumerate(a.shape) if i not in self.axes])

    def backward(self, g: Any) -> tuple:
        mask = self.a == self.out
        share = mask / mask.sum(axis=self.axes, keepdims=True)
        return (_expand(g, self.axes, self.keepdims) * share,)
