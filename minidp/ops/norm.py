"""Batch normalisation (training and inference) and dropout: the ops that depend on mode.

Batch norm normalises over every axis but the channel axis 1 ((N, C) or (N, C, H, W)).
In training it uses the batch's biased variance and updates the running statistics
in place as PyTorch does (``running = (1 - momentum) * running + momentum * batch``,
with the *unbiased* variance); in inference it uses the running statistics.
"""

from __future__ import annotations

from typing import Any

from minidp.backend import array_module
from minidp.function import Function


def _channel_view(a: Any, ndim: int) -> Any:
    return a.reshape((1, -1) + (1,) * (ndim - 2))


class BatchNorm(Function):
    """y = (x - mean) / sqrt(var + eps) * weight + bias, per channel."""

    def forward(self, x: Any, weight: Any = None, bias: Any = None, running_mean: Any = None,
                running_var: Any = None, training: bool = True, momentum: float = 0.1,
                eps: float = 1e-5) -> Any:
        if x.ndim not in (2, 4):
            raise ValueError(f"batch_norm: input must be (N, C) or (N, C, H, W), got {x.shape}")
        c = x.shape[1]
        for name, a in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
            if a is not None and a.shape != (c,):
                raise ValueError(f"batch_norm: {name} shape {a.shape} must be ({c},)")
        xp = array_module(x, weight, running_mean)
        axes = (0,) if x.ndim == 2 else (0, 2, 3)
        self.count = x.size // c
        if training:
            if self.count < 2:
                raise ValueError(f"batch_norm: training needs more than one value per channel, "
                                 f"got input shape {x.shape}")
            mean = x.mean(axis=axes)
            centred = x - _channel_view(mean, x.ndim)
            var = (centred * centred).mean(axis=axes)
            if running_mean is not None:
                running_mean *= 1 - momentum
                running_mean += momentum * mean
            if running_var is not None:
                running_var *= 1 - momentum
                running_var += momentum * var * (self.count / (self.count - 1))
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batch_norm: inference mode needs running_mean and running_var")
            mean, var = running_mean, running_var
            centred = x - _channel_view(mean, x.ndim)
        self.training, self.axes, self.weight = training, axes, weight
        self.inv_std = _channel_view(1 / xp.sqrt(var + eps), x.ndim)
        self.xhat = centred * self.inv_std
        out = self.xhat * _channel_view(weight, x.ndim) if weight is not None else self.xhat
        return out + _channel_view(bias, x.ndim) if bias is not None else out

    def backward(self, g: Any) -> tuple:
        gw = (g * self.xhat).sum(axis=self.axes) if self.wants(1) else None
        gb = g.sum(axis=self.axes) if self.wants(2) else None
        gx = None
        if self.wants(0):
            dxhat = g * _channel_view(self.weight, g.ndim) if self.weight is not None else g
            if self.training:
                # d/dx of the batch statistics: remove the mean and the xhat component.
                mean_d = dxhat.mean(axis=self.axes, keepdims=True)
                mean_dx = (dxhat * self.xhat).mean(axis=self.axes, keepdims=True)
                gx = (dxhat - mean_d - self.xhat * mean_dx) * self.inv_std
            else:
                gx = dxhat * self.inv_std
        return gx, gw, gb


class Dropout(Function):
    """Zero each element with probability p and scale the rest by 1/(1-p) (training only)."""

    def forward(self, x: Any, p: float = 0.5, training: bool = True, rng: Any = None) -> Any:
        if not 0 <= p < 1:
            raise ValueError(f"dropout: p must be in [0, 1), got {p}")
        xp = array_module(x)
        if not training or p == 0:
            self.mask = None
            return x
        rng = xp.random.default_rng() if rng is None else rng
        self.mask = (rng.random(x.shape) >= p).astype(x.dtype) / (1 - p)
        return x * self.mask

    def backward(self, g: Any) -> tuple:
        return (g if self.mask is None else g * self.mask,)
