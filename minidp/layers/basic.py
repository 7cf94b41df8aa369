"""The standard layers, with PyTorch's constructor arguments, weight layouts and defaults."""

from __future__ import annotations

from typing import Any

import numpy as np

from minidp import backend
from minidp.autograd import ops
from minidp.autograd.tensor import Tensor
from minidp.layers import init
from minidp.layers.module import Module, Parameter


class Linear(Module):
    """y = x @ W.T + b with W of shape (out_features, in_features)."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
        super().__init__()
        self.in_features, self.out_features = in_features, out_features
        bound = init.fan_in_bound(in_features)
        self.weight = Parameter(init.uniform((out_features, in_features), bound))
        self.bias = Parameter(init.uniform((out_features,), bound)) if bias else None

    def forward(self, x: Any) -> Any:
        """Apply the affine map to the last axis of x."""
        if x.ndim < 1 or x.shape[-1] != self.in_features:
            raise ValueError(f"expected input of shape (*, {self.in_features}), got {x.shape}")
        return ops.linear(x, self.weight, self.bias)

    def extra_repr(self) -> str:
        """Constructor arguments."""
        return f"in_features={self.in_features}, out_features={self.out_features}, " \
               f"bias={self.bias is not None}"


class Conv2d(Module):
    """2-D convolution, weight (out_channels, in_channels, k, k)."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int, stride: int = 1,
                 padding: int = 0, bias: bool = True) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding
        bound = init.fan_in_bound(in_channels * kernel_size * kernel_size)
        self.weight = Parameter(init.uniform(
            (out_channels, in_channels, kernel_size, kernel_size), bound))
        self.bias = Parameter(init.uniform((out_channels,), bound)) if bias else None

    def forward(self, x: Any) -> Any:
        """Convolve a (N, C, H, W) batch."""
        if x.ndim != 4 or x.shape[1] != self.in_channels:
            raise ValueError(f"expected input of shape (N, {self.in_channels}, H, W), "
                             f"got {x.shape}")
        return ops.conv2d(x, self.weight, self.bias, stride=self.stride, padding=self.padding)

    def extra_repr(self) -> str:
        """Constructor arguments."""
        return f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, " \
               f"stride={self.stride}, padding={self.padding}"


class BatchNorm2d(Module):
    """Batch normalisation over (N, H, W) per channel, with running statistics."""

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: float = 0.1,
                 affine: bool = True) -> None:
        super().__init__()
        self.num_features, self.eps, self.momentum = num_features, eps, momentum
        xp = backend.xp()
        self.weight = Parameter(xp.ones(num_features, dtype=np.float32)) if affine else None
        self.bias = Parameter(xp.zeros(num_features, dtype=np.float32)) if affine else None
        self.register_buffer("running_mean", xp.zeros(num_features, dtype=np.float32))
        self.register_buffer("running_var", xp.ones(num_features, dtype=np.float32))
        self.register_buffer("num_batches_tracked", xp.zeros((), dtype=np.int64))

    def forward(self, x: Any) -> Any:
        """Normalise with batch statistics (training) or running statistics (eval)."""
        self._check(x)
        return ops.batch_norm(x, self.running_mean, self.running_var, self.weight, self.bias,
                              training=self.training, momentum=self.momentum, eps=self.eps)

    def forward_relu(self, x: Any, residual: Any = None) -> Any:
        """``relu(self(x) + residual)`` in one fused op (a ResNet block's tail)."""
        self._check(x)
        return ops.batch_norm_relu(x, self.running_mean, self.running_var, self.weight,
                                   self.bias, residual, training=self.training,
                                   momentum=self.momentum, eps=self.eps)

    def _check(self, x: Any) -> None:
        """Refuse a wrong shape; count a training batch (PyTorch's num_batches_tracked)."""
        if x.ndim != 4 or x.shape[1] != self.num_features:
            raise ValueError(f"expected input of shape (N, {self.num_features}, H, W), "
                             f"got {x.shape}")
        if self.training:
            self.num_batches_tracked += 1

    def extra_repr(self) -> str:
        """Constructor arguments."""
        return f"{self.num_features}, eps={self.eps}, momentum={self.momentum}"


class MaxPool2d(Module):
    """Max pooling over k x k windows."""

    def __init__(self, kernel_size: int, stride: int | None = None) -> None:
        super().__init__()
        self.kernel_size, self.stride = kernel_size, stride

    def forward(self, x: Any) -> Any:
        """Pool a (N, C, H, W) batch."""
        return ops.max_pool2d(x, self.kernel_size, self.stride)

    def extra_repr(self) -> str:
        """Constructor arguments."""
        return f"kernel_size={self.kernel_size}, stride={self.stride or self.kernel_size}"


class AvgPool2d(MaxPool2d):
    """Average pooling over k x k windows."""

    def forward(self, x: Any) -> Any:
        """Pool a (N, C, H, W) batch."""
        return ops.avg_pool2d(x, self.kernel_size, self.stride)


class ReLU(Module):
    """max(x, 0)."""

    def forward(self, x: Any) -> Any:
        """Apply elementwise."""
        return ops.relu(x)


class Flatten(Module):
    """Merge all axes from ``start_dim`` on."""

    def __init__(self, start_dim: int = 1) -> None:
        super().__init__()
        self.start_dim = start_dim

    def forward(self, x: Any) -> Any:
        """Flatten trailing axes."""
        return ops.flatten(x, self.start_dim)


class Dropout(Module):
    """Inverted dropout with probability ``p``, active in training mode only."""

    def __init__(self, p: float = 0.5) -> None:
        super().__init__()
        if not 0 <= p < 1:
            raise ValueError(f"Dropout: p must be in [0, 1), got {p}")
        self.p = p
        self.rng = np.random.default_rng(init.generator().integers(2**63))

    def forward(self, x: Any) -> Any:
        """Drop elements (training) or pass x through (eval).

        On a GPU the mask is drawn there, by a CuPy generator seeded from this layer's
        host generator: masks follow (seed, rank) and a checkpoint restores them.
        """
        xp = backend.array_module(x.data if isinstance(x, Tensor) else x)
        rng = self.rng if xp is np else xp.random.default_rng(int(self.rng.integers(2**63)))
        return ops.dropout(x, self.p, self.training, rng)

    def extra_repr(self) -> str:
        """Constructor arguments."""
        return f"p={self.p}"


class Sequential(Module):
    """Modules applied in order; children are named "0", "1", ... as in PyTorch."""

    def __init__(self, *modules: Module) -> None:
        super().__init__()
        for i, m in enumerate(modules):
            if not isinstance(m, Module):
                raise TypeError(f"Sequential: argument {i} is a {type(m).__name__}, not a Module")
            setattr(self, str(i), m)

    def forward(self, x: Any) -> Any:
        """Apply each module to the previous one's output."""
        for m in self._modules.values():
            x = m(x)
        return x

    def __getitem__(self, i: int) -> Module:
        return list(self._modules.values())[i]

    def __len__(self) -> int:
        return len(self._modules)
