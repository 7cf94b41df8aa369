"""Batch normalisation fused with what follows it in a ResNet: ``relu(bn(x) + residual)``.

Arrays are viewed as (N, C, L) (L = H*W, or 1 for (N, C) inputs); statistics are per
channel over N and L. NumPy computes the mean, the variance, the normalisation, the
add and the relu in about eight passes over the batch, each with its own temporary.
The kernels work one channel at a time, so the channel's values (256 KB for a
ResNet-20 stage-1 channel at batch 64) stay in the L2 cache between passes:

* forward: the sum, then the sums around that mean (two passes; each row is summed
  in the data's precision, rows in float64), then one pass writing
  ``max(scale*x + shift + residual, 0)``;
* backward: one pass gating ``g`` by ``out > 0`` (the relu) and summing ``g`` and
  ``g*(x - mean)`` (the bias and weight gradients), one writing the gated ``g`` as the
  residual's gradient (when there is a residual), one writing the input gradient.

In inference the running statistics are given, and the first passes are skipped.
Without relu the gate's threshold is -inf rather than a test between two loops:
with a branch around them LLVM left the loops of the 8x8 stage unvectorised (2x
slower).

Each channel is one call of a compiled body (``_forward_channel``, ``_backward_channel``);
the serial kernels loop over the channels, the parallel ones (on the rank's threads,
:func:`minidp.kernels.threaded.spread`) ``prange`` over them. A channel's sums are
computed by one thread in one order either way: the bits do not depend on the thread
count.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import spread

_NONE = np.zeros((0, 0, 0))  # an absent residual: one compiled signature for both cases


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _channel_sums(x, ch, shift):  # pragma: no cover - compiled
    """(sum of x - shift, sum of (x - shift)**2) over channel ch; shift in x's dtype."""
    total = 0.0
    total_sq = 0.0
    for i in range(x.shape[0]):
        row = x[i, ch]
        part = part_sq = shift - shift  # one row in the data's precision: twice the SIMD width
        for k in range(row.size):
            d = row[k] - shift
            part += d
            part_sq += d * d
        total += part
        total_sq += part_sq
    return total, total_sq


@numba.njit(cache=True, nogil=True)
def _forward_channel(x, weight, bias, residual, relu, training, eps, mean, var, out,
                     ch):  # pragma: no cover - compiled
    n, c, length = x.shape
    # in the data's precision: scale, shift, 0, the mean, and the relu's threshold (-inf
    # without relu: one loop body for both, since a branch between loops costs here)
    coef = np.zeros(5, dtype=out.dtype)
    coef[4] = 0 if relu else -np.inf
    zero, gate = coef[2], coef[4]
    if training:
        # the sums of squares around the rounded mean: no cancellation
        m = _channel_sums(x, ch, zero)[0] / (n * length)
        coef[3] = m
        total, total_sq = _channel_sums(x, ch, coef[3])
        mean[ch] = coef[3] + total / (n * length)
        var[ch] = total_sq / (n * length) - (total / (n * length)) ** 2
    inv_std = 1.0 / math.sqrt(var[ch] + eps)
    coef[0] = weight[ch] * inv_std
    coef[1] = bias[ch] - mean[ch] * weight[ch] * inv_std
    a, b = coef[0], coef[1]
    for i in range(n):
        src, dst = x[i, ch], out[i, ch]
        if residual.size:
            res = residual[i, ch]
            for k in range(length):
                v = src[k] * a + b + res[k]
                dst[k] = v if v > gate else zero
        else:
            for k in range(length):
                v = src[k] * a + b
                dst[k] = v if v > gate else zero


@numba.njit(cache=True, nogil=True, fastmath={"reassoc"})
def _backward_channel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual, gw,
                      gb, ch):  # pragma: no cover - compiled
    n, c, length = x.shape
    coef = np.zeros(6, dtype=gx.dtype)  # a, b, c below, 0, the mean, the relu's threshold
    coef[5] = 0 if relu else -np.inf
    zero, gate = coef[3], coef[5]
    count = n * length
    coef[4] = mean[ch]
    m = coef[4]
    sum_g = 0.0
    sum_gx = 0.0
    for i in range(n):
        grow, xrow, orow = g[i, ch], x[i, ch], out[i, ch]
        part_g = part_gx = zero  # one row in the data's precision: twice the SIMD width
        for k in range(length):
            gv = grow[k] if orow[k] > gate else zero
            part_g += gv
            part_gx += gv * (xrow[k] - m)
        sum_g += part_g
        sum_gx += part_gx
    if g_residual.size:
        for i in range(n):
            grow, orow, rrow = g[i, ch], out[i, ch], g_residual[i, ch]
            for k in range(length):
                rrow[k] = grow[k] if orow[k] > gate else zero
    gb[ch] = sum_g
    gw[ch] = sum_gx * inv_std[ch]
    # gx = w*inv*(g - mean(g) - xhat*mean(g*xhat)) = a*g + b*x + c, per channel;
    # in inference the statistics are constants: b = c = 0
    batch = 1.0 if training else 0.0
    a = weight[ch] * inv_std[ch]
    b = -batch * a * inv_std[ch] * inv_std[ch] * sum_gx / count
    coef[0], coef[1], coef[2] = a, b, -b * m - batch * a * sum_g / count
    ca, cb, cc = coef[0], coef[1], coef[2]
    if gx.size:
        for i in range(n):
            grow, xrow, orow, dst = g[i, ch], x[i, ch], out[i, ch], gx[i, ch]
            for k in range(length):
                gv = grow[k] if orow[k] > gate else zero
                dst[k] = ca * gv + cb * xrow[k] + cc


@numba.njit(cache=True, nogil=True)
def _forward_kernel(x, weight, bias, residual, relu, training, eps, mean, var,
                    out):  # pragma: no cover - compiled
    for ch in range(x.shape[1]):
        _forward_channel(x, weight, bias, residual, relu, training, eps, mean, var, out, ch)


@numba.njit(cache=True, nogil=True, parallel=True)
def _forward_parallel(x, weight, bias, residual, relu, training, eps, mean, var,
                      out):  # pragma: no cover - compiled
    for ch in numba.prange(x.shape[1]):
        _forward_channel(x, weight, bias, residual, relu, training, eps, mean, var, out, ch)


@numba.njit(cache=True, nogil=True)
def _backward_kernel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual, gw,
                     gb):  # pragma: no cover - compiled
    for ch in range(x.shape[1]):
        _backward_channel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual,
                          gw, gb, ch)


@numba.njit(cache=True, nogil=True, parallel=True)
def _backward_parallel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual, gw,
                       gb):  # pragma: no cover - compiled
    for ch in numba.prange(x.shape[1]):
        _backward_channel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual,
                          gw, gb, ch)


def forward_reference(x: Any, weight: Any, bias: Any, residual: Any, relu: bool,
                      training: bool, eps: float, mean: Any, var: Any) -> Any:
    """NumPy/CuPy version of the forward kernel (statistics written into mean, var)."""
    xp = array_module(x)
    if training:
        mean[...] = x.mean(axis=(0, 2))
        centred = x - mean.astype(x.dtype)[:, None]
        var[...] = (centred * centred).mean(axis=(0, 2))
    inv_std = 1 / xp.sqrt(var + eps)
    scale = (weight * inv_std).astype(x.dtype)[:, None]
    shift = (bias - mean * weight * inv_std).astype(x.dtype)[:, None]
    out = x * scale + shift
    if residual is not None:
        out += residual
    return xp.maximum(out, 0, out=out) if relu else out


def backward_reference(g: Any, x: Any, out: Any, weight: Any, mean: Any, inv_std: Any,
                       relu: bool, training: bool, want_x: bool) -> tuple:
    """NumPy/CuPy version of the backward kernel: (gx or None, gw, gb, gated g)."""
    if relu:
        g = g * (out > 0)
    xhat = (x - mean.astype(x.dtype)[:, None]) * inv_std.astype(x.dtype)[:, None]
    gb, gw = g.sum(axis=(0, 2)), (g * xhat).sum(axis=(0, 2))
    gx = None
    if want_x:
        count = x.shape[0] * x.shape[2]
        a = (weight * inv_std).astype(x.dtype)[:, None]
        gx = a * g
        if training:
            gx -= a * (gb / count)[:, None] + a * xhat * (gw / count)[:, None]
    return gx, gw, gb, g


def batchnorm_forward(x: Any, weight: Any, bias: Any, residual: Any, relu: bool,
                      training: bool, eps: float, mean: Any, var: Any) -> Any:
    """``relu(bn(x) + residual)`` of x (N, C, L); see the module docstring.

    Args:
        x: input (N, C, L).
        weight: (C,) scale (ones when the layer has no affine parameters).
        bias: (C,) shift (zeros when the layer has no affine parameters).
        residual: None or an array like x added before the relu.
        relu: apply max(., 0) last.
        training: compute the batch statistics into ``mean`` and ``var`` (biased);
            otherwise read them from there.
        eps: added to the variance.
        mean: (C,) float64 batch mean (written in training, read otherwise).
        var: (C,) float64 biased batch variance (likewise).

    Returns:
        The output, an array like x.
    """
    if not (use_kernels(x, weight, bias, mean, var) and x.flags.c_contiguous
            and (residual is None or use_kernels(residual) and residual.flags.c_contiguous)):
        return forward_reference(x, weight, bias, residual, relu, training, eps, mean, var)
    ensure_compiled()
    out = np.empty_like(x)
    kernel = _forward_parallel if spread(x.size) and x.shape[1] > 1 else _forward_kernel
    kernel(x, weight, bias, _NONE.astype(x.dtype) if residual is None else residual, relu,
           training, float(eps), mean, var, out)
    return out


def batchnorm_backward(g: Any, x: Any, out: Any, weight: Any, mean: Any, inv_std: Any,
                       relu: bool, training: bool, want_x: bool, want_residual: bool) -> tuple:
    """Gradients of :func:`batchnorm_forward`: (gx, gw, gb, g_residual), None where unwanted.

    ``out`` is the forward's output (its sign is the relu's gate); ``inv_std`` is
    ``1/sqrt(var + eps)`` of the statistics the forward used.
    """
    if not (use_kernels(g, x, out) and all(a.flags.c_contiguous for a in (g, x, out))):
        gx, gw, gb, gated = backward_reference(g, x, out, weight, mean, inv_std, relu, training,
                                               want_x)
        return gx, gw, gb, gated if want_residual else None
    ensure_compiled()
    empty = _NONE.astype(x.dtype)
    gx = np.empty_like(x) if want_x else empty
    g_residual = np.empty_like(x) if want_residual else empty
    gw, gb = np.empty(x.shape[1]), np.empty(x.shape[1])
    kernel = _backward_parallel if spread(x.size) and x.shape[1] > 1 else _backward_kernel
    kernel(g, x, out, weight, mean, inv_std, relu, training, gx, g_residual, gw, gb)
    return (gx if want_x else None), gw, gb, (g_residual if want_residual else None)


def _warm_with(forward, backward, dtype: type) -> None:
    x = np.ones((2, 1, 2), dtype=dtype)
    one, stats = np.ones(1, dtype=dtype), np.ones(1)
    empty = _NONE.astype(dtype)
    for residual in (empty, x):
        forward(x, one, one, residual, True, True, 1e-5, stats, stats.copy(), x.copy())
    for gx in (empty, x.copy()):
        backward(x, x, x, one, stats, stats, True, True, gx, gx, stats.copy(), stats.copy())


@register_warmup
def _warm(dtype: type) -> None:
    _warm_with(_forward_kernel, _backward_kernel, dtype)


@register_parallel_warmup
def _warm_parallel(dtype: type) -> None:
    _warm_with(_forward_parallel, _backward_parallel, dtype)
