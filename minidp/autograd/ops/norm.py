"""Batch normalisation (training and inference), fused with a residual add and a relu; dropout.

Batch norm normalises over every axis but the channel axis 1 ((N, C) or (N, C, H, W)).
In training it uses the batch's biased variance and updates the running statistics
in place as PyTorch does (``running = (1 - momentum) * running + momentum * batch``,
with the *unbiased* variance); in inference it uses the running statistics.

A ResNet follows every batch norm by a relu, and the last of each block by the
residual add first: ``relu(bn(x) + residual)`` is one op here (``relu=True`` and an
optional ``residual`` input), computed by the fused kernels of
:mod:`minidp.kernels.batchnorm`. Backward needs x, the output (the relu's gate) and
the per-channel statistics; the normalised input is recomputed, never stored.
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.backend import array_module
from minidp.kernels import batchnorm_backward, batchnorm_forward


class BatchNorm(Function):
    """y = relu?((x - mean) / sqrt(var + eps) * weight + bias + residual?), per channel."""

    def forward(self, x: Any, weight: Any = None, bias: Any = None, residual: Any = None,
                running_mean: Any = None, running_var: Any = None, training: bool = True,
                momentum: float = 0.1, eps: float = 1e-5, relu: bool = False) -> Any:
        if x.ndim not in (2, 4):
            raise ValueError(f"batch_norm: input must be (N, C) or (N, C, H, W), got {x.shape}")
        c = x.shape[1]
        for name, a in (("weight", weight), ("bias", bias), ("running_mean", running_mean),
                        ("running_var", running_var)):
            if a is not None and a.shape != (c,):
                raise ValueError(f"batch_norm: {name} shape {a.shape} must be ({c},)")
        if residual is not None and residual.shape != x.shape:
            raise ValueError(f"batch_norm: residual shape {residual.shape} must be the input's "
                             f"{x.shape}")
        xp = array_module(x, weight, running_mean)
        x3 = xp.ascontiguousarray(x).reshape(x.shape[0], c, -1)  # (N, C, L)
        count = x3.shape[0] * x3.shape[2]
        if training:
            if count < 2:
                raise ValueError(f"batch_norm: training needs more than one value per channel, "
                                 f"got input shape {x.shape}")
            mean, var = xp.empty(c), xp.empty(c)
        else:
            if running_mean is None or running_var is None:
                raise ValueError("batch_norm: inference mode needs running_mean and running_var")
            mean, var = running_mean.astype(float), running_var.astype(float)
        self.weight = xp.ones(c, dtype=x.dtype) if weight is None else weight
        shift = xp.zeros(c, dtype=x.dtype) if bias is None else bias
        if residual is not None:
            residual = xp.ascontiguousarray(residual).reshape(x3.shape)
        out = batchnorm_forward(x3, self.weight, shift, residual, relu, training, eps, mean, var)
        if training:
            if running_mean is not None:
                running_mean *= 1 - momentum
                running_mean += (momentum * mean).astype(running_mean.dtype)
            if running_var is not None:
                running_var *= 1 - momentum
                running_var += (momentum * var * (count / (count - 1))).astype(running_var.dtype)
        self.x3, self.out, self.relu, self.training = x3, out, relu, training
        self.mean, self.inv_std = mean, 1 / xp.sqrt(var + eps)
        return out.reshape(x.shape)

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        g3 = xp.ascontiguousarray(g).reshape(self.x3.shape)
        gx, gw, gb, gr = batchnorm_backward(g3, self.x3, self.out, self.weight, self.mean,
                                            self.inv_std, self.relu, self.training,
                                            self.wants(0), self.wants(3))
        dtype = self.x3.dtype
        return (None if gx is None else gx.reshape(g.shape),
                gw.astype(dtype) if self.wants(1) else None,
                gb.astype(dtype) if self.wants(2) else None,
                None if gr is None else gr.reshape(g.shape))


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
        self.mask = (xp.asarray(rng.random(x.shape)) >= p).astype(x.dtype) / (1 - p)
        return x * self.mask

    def backward(self, g: Any) -> tuple:
        return (g if self.mask is None else g * self.mask,)
