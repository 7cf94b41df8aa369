"""Max and average pooling over (N, C, H, W), forward and backward, without padding.

Max pooling keeps, per output, the flat index ``hy*W + wx`` of the first maximum of
its window (PyTorch's tie rule); backward adds each output gradient at that index,
so overlapping windows (stride < kernel) accumulate correctly; where windows tile the
input (stride = kernel) each input gradient takes at most one, stored into a zeroed
plane. Average pooling spreads each output gradient evenly over its window.

Every (image, channel) plane is independent: each kernel is a compiled body per plane,
looped over serially or with ``prange`` over all N*C planes on the rank's threads
(:func:`minidp.kernels.threaded.spread`); the bits are the same either way.
"""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels import cuda
from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import spread
from minidp.kernels.unfold import output_size


@numba.njit(cache=True, nogil=True)
def _maxpool_forward_plane(x, k, stride, out, argmax, n, c):  # pragma: no cover - compiled
    w = x.shape[3]
    oh, ow = out.shape[2], out.shape[3]
    if k == 2 and stride == 2:  # the CNNs' pooling: the window's four loads unrolled
        for y in range(oh):
            top, bottom = x[n, c, 2 * y], x[n, c, 2 * y + 1]
            row = 2 * y * w
            for xo in range(ow):
                at = row + 2 * xo
                best = top[2 * xo]
                if top[2 * xo + 1] > best:
                    best, at = top[2 * xo + 1], row + 2 * xo + 1
                if bottom[2 * xo] > best:
                    best, at = bottom[2 * xo], row + w + 2 * xo
                if bottom[2 * xo + 1] > best:
                    best, at = bottom[2 * xo + 1], row + w + 2 * xo + 1
                out[n, c, y, xo] = best
                argmax[n, c, y, xo] = at
        return
    for y in range(oh):
        for xo in range(ow):
            h0, w0 = y * stride, xo * stride
            best = x[n, c, h0, w0]
            best_at = h0 * w + w0
            for i in range(k):
                for j in range(k):
                    v = x[n, c, h0 + i, w0 + j]
                    if v > best:
                        best = v
                        best_at = (h0 + i) * w + w0 + j
            out[n, c, y, xo] = best
            argmax[n, c, y, xo] = best_at


@numba.njit(cache=True, nogil=True)
def _maxpool_backward_plane(grad, argmax, w, dx, n, c):  # pragma: no cover - compiled
    oh, ow = grad.shape[2], grad.shape[3]
    for y in range(oh):
        for xo in range(ow):
            at = argmax[n, c, y, xo]
            dx[n, c, at // w, at % w] += grad[n, c, y, xo]


@numba.njit(cache=True, nogil=True)
def _maxpool_backward_tiles_plane(grad, argmax, dx, n, c):  # pragma: no cover - compiled
    # Windows that tile the input (stride == k): each element of dx takes at most one
    # gradient, so the plane is zeroed and each gradient stored at its window's argmax
    # (0 + g: the bits of a scatter-add into zeros; rows and columns no window covers
    # stay 0). Branch-free: choosing each of a window's k*k values by comparing its
    # position with the argmax mispredicted about once a window, on random argmaxes
    # 3.7-6 times slower (docs/benchmarks.md).
    plane, g, at = dx[n, c].reshape(-1), grad[n, c].reshape(-1), argmax[n, c].reshape(-1)
    zero = dx.dtype.type(0)
    for i in range(plane.size):
        plane[i] = zero
    for q in range(g.size):
        plane[at[q]] = g[q] + zero


@numba.njit(cache=True, nogil=True)
def _avgpool_forward_plane(x, k, stride, out, n, c):  # pragma: no cover - compiled
    oh, ow = out.shape[2], out.shape[3]
    scale = 1.0 / (k * k)
    for y in range(oh):
        for xo in range(ow):
            acc = 0.0
            for i in range(k):
                for j in range(k):
                    acc += x[n, c, y * stride + i, xo * stride + j]
            out[n, c, y, xo] = acc * scale


@numba.njit(cache=True, nogil=True)
def _avgpool_backward_plane(grad, k, stride, dx, n, c):  # pragma: no cover - compiled
    oh, ow = grad.shape[2], grad.shape[3]
    scale = 1.0 / (k * k)
    for y in range(oh):
        for xo in range(ow):
            g = grad[n, c, y, xo] * scale
            for i in range(k):
                for j in range(k):
                    dx[n, c, y * stride + i, xo * stride + j] += g


# The kernels: every plane, in order (serial) or with prange over N*C (parallel).
@numba.njit(cache=True, nogil=True)
def _maxpool_forward_kernel(x, k, stride, out, argmax):  # pragma: no cover - compiled
    for p in range(x.shape[0] * x.shape[1]):
        _maxpool_forward_plane(x, k, stride, out, argmax, p // x.shape[1], p % x.shape[1])


@numba.njit(cache=True, nogil=True, parallel=True)
def _maxpool_forward_parallel(x, k, stride, out, argmax):  # pragma: no cover - compiled
    for p in numba.prange(x.shape[0] * x.shape[1]):
        _maxpool_forward_plane(x, k, stride, out, argmax, p // x.shape[1], p % x.shape[1])


@numba.njit(cache=True, nogil=True)
def _maxpool_backward_kernel(grad, argmax, w, dx):  # pragma: no cover - compiled
    for p in range(grad.shape[0] * grad.shape[1]):
        _maxpool_backward_plane(grad, argmax, w, dx, p // grad.shape[1], p % grad.shape[1])


@numba.njit(cache=True, nogil=True, parallel=True)
def _maxpool_backward_parallel(grad, argmax, w, dx):  # pragma: no cover - compiled
    for p in numba.prange(grad.shape[0] * grad.shape[1]):
        _maxpool_backward_plane(grad, argmax, w, dx, p // grad.shape[1], p % grad.shape[1])


@numba.njit(cache=True, nogil=True)
def _maxpool_backward_tiles_kernel(grad, argmax, dx):  # pragma: no cover - compiled
    for p in range(dx.shape[0] * dx.shape[1]):
        _maxpool_backward_tiles_plane(grad, argmax, dx, p // dx.shape[1], p % dx.shape[1])


@numba.njit(cache=True, nogil=True, parallel=True)
def _maxpool_backward_tiles_parallel(grad, argmax, dx):  # pragma: no cover - compiled
    for p in numba.prange(dx.shape[0] * dx.shape[1]):
        _maxpool_backward_tiles_plane(grad, argmax, dx, p // dx.shape[1], p % dx.shape[1])


@numba.njit(cache=True, nogil=True)
def _avgpool_forward_kernel(x, k, stride, out):  # pragma: no cover - compiled
    for p in range(x.shape[0] * x.shape[1]):
        _avgpool_forward_plane(x, k, stride, out, p // x.shape[1], p % x.shape[1])


@numba.njit(cache=True, nogil=True, parallel=True)
def _avgpool_forward_parallel(x, k, stride, out):  # pragma: no cover - compiled
    for p in numba.prange(x.shape[0] * x.shape[1]):
        _avgpool_forward_plane(x, k, stride, out, p // x.shape[1], p % x.shape[1])


@numba.njit(cache=True, nogil=True)
def _avgpool_backward_kernel(grad, k, stride, dx):  # pragma: no cover - compiled
    for p in range(grad.shape[0] * grad.shape[1]):
        _avgpool_backward_plane(grad, k, stride, dx, p // grad.shape[1], p % grad.shape[1])


@numba.njit(cache=True, nogil=True, parallel=True)
def _avgpool_backward_parallel(grad, k, stride, dx):  # pragma: no cover - compiled
    for p in numba.prange(grad.shape[0] * grad.shape[1]):
        _avgpool_backward_plane(grad, k, stride, dx, p // grad.shape[1], p % grad.shape[1])


def _windows(x: Any, k: int, stride: int) -> Any:
    """Strided view (N, C, OH, OW, k, k) of the pooling windows of x."""
    xp = array_module(x)
    n, c, h, w = x.shape
    oh, ow = output_size(h, k, stride, 0), output_size(w, k, stride, 0)
    s0, s1, s2, s3 = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, shape=(n, c, oh, ow, k, k), strides=(s0, s1, s2 * stride, s3 * stride, s2, s3))


def maxpool_forward_reference(x: Any, k: int, stride: int) -> tuple[Any, Any]:
    """Max pooling in NumPy/CuPy: returns (out, flat argmax index hy*W + wx)."""
    xp = array_module(x)
    w = x.shape[3]
    win = _windows(xp.ascontiguousarray(x), k, stride)
    n, c, oh, ow = win.shape[:4]
    flat = win.reshape(n, c, oh, ow, k * k)
    local = flat.argmax(axis=-1)
    out = xp.take_along_axis(flat, local[..., None], axis=-1)[..., 0]
    rows = xp.arange(oh).reshape(oh, 1) * stride + local // k
    cols = xp.arange(ow).reshape(1, ow) * stride + local % k
    return out, (rows * w + cols).astype(np.int64)


def maxpool_backward_reference(grad: Any, argmax: Any, x_shape: tuple) -> Any:
    """Scatter-add each output gradient at its argmax."""
    xp = array_module(grad)
    n, c, h, w = x_shape
    dx = xp.zeros((n * c, h * w), dtype=grad.dtype)
    planes = xp.arange(n * c).reshape(n * c, 1)
    xp.add.at(dx, (planes, argmax.reshape(n * c, -1)), grad.reshape(n * c, -1))
    return dx.reshape(x_shape)


def avgpool_forward_reference(x: Any, k: int, stride: int) -> Any:
    """Average pooling in NumPy/CuPy."""
    return _windows(x, k, stride).mean(axis=(-2, -1))


def avgpool_backward_reference(grad: Any, x_shape: tuple, k: int, stride: int) -> Any:
    """Spread each output gradient evenly over its window."""
    xp = array_module(grad)
    dx = xp.zeros(x_shape, dtype=grad.dtype)
    oh, ow = grad.shape[2], grad.shape[3]
    share = grad / (k * k)
    for i in range(k):
        for j in range(k):
            dx[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += share
    return dx


def maxpool_forward(x: Any, k: int, stride: int) -> tuple[Any, Any]:
    """Max pooling: (out, argmax), dispatched to Numba on NumPy arrays, CUDA on CuPy."""
    if cuda.applies(x):
        n, c, h, w = x.shape
        return cuda.maxpool_forward(x, k, stride, output_size(h, k, stride, 0),
                                    output_size(w, k, stride, 0))
    if not use_kernels(x):
        return maxpool_forward_reference(x, k, stride)
    ensure_compiled()
    n, c, h, w = x.shape
    oh, ow = output_size(h, k, stride, 0), output_size(w, k, stride, 0)
    out = np.empty((n, c, oh, ow), dtype=x.dtype)
    argmax = np.empty((n, c, oh, ow), dtype=np.int64)
    kernel = _maxpool_forward_parallel if spread(x.size) else _maxpool_forward_kernel
    kernel(np.ascontiguousarray(x), k, stride, out, argmax)
    return out, argmax


def maxpool_backward(grad: Any, argmax: Any, x_shape: tuple, k: int, stride: int) -> Any:
    """Gradient of max pooling with respect to its input (``k``, ``stride``: the windows)."""
    if cuda.applies(grad, argmax):
        return cuda.maxpool_backward(grad, argmax, x_shape, k, stride)
    if not use_kernels(grad, argmax):
        return maxpool_backward_reference(grad, argmax, x_shape)
    ensure_compiled()
    parallel = spread(math.prod(x_shape))
    if stride == k:  # no overlap: each element of dx takes at most one gradient
        dx = np.empty(x_shape, dtype=grad.dtype)
        kernel = _maxpool_backward_tiles_parallel if parallel else _maxpool_backward_tiles_kernel
        kernel(np.ascontiguousarray(grad), np.ascontiguousarray(argmax), dx)
        return dx
    dx = np.zeros(x_shape, dtype=grad.dtype)
    kernel = _maxpool_backward_parallel if parallel else _maxpool_backward_kernel
    kernel(np.ascontiguousarray(grad), argmax, x_shape[3], dx)
    return dx


def avgpool_forward(x: Any, k: int, stride: int) -> Any:
    """Average pooling, dispatched to Numba on NumPy arrays."""
    if not use_kernels(x):
        return avgpool_forward_reference(x, k, stride)
    ensure_compiled()
    n, c, h, w = x.shape
    out = np.empty((n, c, output_size(h, k, stride, 0), output_size(w, k, stride, 0)),
                   dtype=x.dtype)
    kernel = _avgpool_forward_parallel if spread(x.size) else _avgpool_forward_kernel
    kernel(np.ascontiguousarray(x), k, stride, out)
    return out


def avgpool_backward(grad: Any, x_shape: tuple, k: int, stride: int) -> Any:
    """Gradient of average pooling with respect to its input."""
    if not use_kernels(grad):
        return avgpool_backward_reference(grad, x_shape, k, stride)
    ensure_compiled()
    dx = np.zeros(x_shape, dtype=grad.dtype)
    kernel = _avgpool_backward_parallel if spread(math.prod(x_shape)) else _avgpool_backward_kernel
    kernel(np.ascontiguousarray(grad), k, stride, dx)
    return dx


def _warm_with(max_forward, max_backward, max_tiles, avg_forward, avg_backward,
               dtype: type) -> None:
    x = np.zeros((1, 1, 2, 2), dtype=dtype)
    out = np.empty((1, 1, 1, 1), dtype=dtype)
    argmax = np.zeros((1, 1, 1, 1), dtype=np.int64)
    max_forward(x, 2, 2, out, argmax)
    max_backward(out, argmax, 2, x)
    max_tiles(out, argmax, x)
    avg_forward(x, 2, 2, out)
    avg_backward(out, 2, 2, x)


@register_warmup
def _warm(dtype: type) -> None:
    _warm_with(_maxpool_forward_kernel, _maxpool_backward_kernel,
               _maxpool_backward_tiles_kernel, _avgpool_forward_kernel,
               _avgpool_backward_kernel, dtype)


@register_parallel_warmup
def _warm_parallel(dtype: type) -> None:
    _warm_with(_maxpool_forward_parallel, _maxpool_backward_parallel,
               _maxpool_backward_tiles_parallel, _avgpool_forward_parallel,
               _avgpool_backward_parallel, dtype)
