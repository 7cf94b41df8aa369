"""Max and average pooling (square windows, no padding), through the Numba kernels."""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.kernels import avgpool_backward, avgpool_forward, maxpool_backward, maxpool_forward


def pool_geometry(x: Any, kernel_size: Any, stride: Any, op: str) -> tuple[int, int]:
    """Validate a pooling call and return (kernel, stride); stride defaults to the kernel."""
    def as_int(value: Any, name: str) -> int:
        if isinstance(value, (tuple, list)):
            if len(value) != 2 or value[0] != value[1]:
                raise ValueError(f"{op}: {name} {value!r} must be one int or two equal ints")
            value = value[0]
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{op}: {name} must be a positive int, got {value!r}")
        return value

    if x.ndim != 4:
        raise ValueError(f"{op}: input must be (N, C, H, W), got shape {x.shape}")
    k = as_int(kernel_size, "kernel_size")
    s = k if stride is None else as_int(stride, "stride")
    if k > x.shape[2] or k > x.shape[3]:
        raise ValueError(f"{op}: kernel_size {k} is larger than the input's spatial size "
                         f"{x.shape[2:]}")
    return k, s


class MaxPool2d(Function):
    """Maximum over k x k windows moved by ``stride``."""

    def forward(self, x: Any, kernel_size: Any = 2, stride: Any = None) -> Any:
        k, s = pool_geometry(x, kernel_size, stride, "max_pool2d")
        self.x_shape = x.shape
        out, self.argmax = maxpool_forward(x, k, s)
        self.k, self.s = k, s
        return out

    def backward(self, g: Any) -> tuple:
        return (maxpool_backward(g, self.argmax, self.x_shape, self.k, self.s),)


class AvgPool2d(Function):
    """Mean over k x k windows moved by ``stride``."""

    def forward(self, x: Any, kernel_size: Any = 2, stride: Any = None) -> Any:
        self.k, self.s = pool_geometry(x, kernel_size, stride, "avg_pool2d")
        self.x_shape = x.shape
        return avgpool_forward(x, self.k, self.s)

    def backward(self, g: Any) -> tuple:
        return (avgpool_backward(g, self.x_shape, self.k, self.s),)
