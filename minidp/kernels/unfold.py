"""im2col / col2im: unfold image patches into columns so a convolution is one matmul.

Layout (shared by the Numba kernel and the NumPy reference)::

    x     (N, C, H, W)
    cols  (C*kh*kw, N*OH*OW)    row = (c*kh + i)*kw + j, column = (n*OH + y)*OW + x

so ``W.reshape(F, C*kh*kw) @ cols`` is the convolution, with output ``(F, N*OH*OW)``.
Padding is never materialised: out-of-image taps read as zero.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels.jit import ensure_compiled, register_warmup, use_kernels


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial output size of a convolution or pooling window along one axis."""
    return (size + 2 * padding - kernel) // stride + 1


@numba.njit(cache=True, nogil=True)
def _im2col_kernel(x, kh, kw, stride, pad, oh, ow, cols):  # pragma: no cover - compiled
    n_img, n_ch, h, w = x.shape
    for c in range(n_ch):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(n_img):
                    for y in range(oh):
                        col0 = (n * oh + y) * ow
                        hy = y * stride + i - pad
                        if hy < 0 or hy >= h:
                            for xo in range(ow):
                                cols[row, col0 + xo] = 0
                            continue
                        for xo in range(ow):
                            wx = xo * stride + j - pad
                            if 0 <= wx < w:
                                cols[row, col0 + xo] = x[n, c, hy, wx]
                            else:
                                cols[row, col0 + xo] = 0


@numba.njit(cache=True, nogil=True)
def _col2im_kernel(cols, kh, kw, stride, pad, oh, ow, dx):  # pragma: no cover - compiled
    n_img, n_ch, h, w = dx.shape
    for c in range(n_ch):
        for i in range(kh):
            for j in range(kw):
                row = (c * kh + i) * kw + j
                for n in range(n_img):
                    for y in range(oh):
                        hy = y * stride + i - pad
                        if hy < 0 or hy >= h:
                            continue
                        col0 = (n * oh + y) * ow
                        for xo in range(ow):
                            wx = xo * stride + j - pad
                            if 0 <= wx < w:
                                dx[n, c, hy, wx] += cols[row, col0 + xo]


def im2col_reference(x: Any, kh: int, kw: int, stride: int, pad: int) -> Any:
    """NumPy/CuPy im2col through a strided window view (one copy)."""
    xp = array_module(x)
    n, c, h, w = x.shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    if pad:
        x = xp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    s0, s1, s2, s3 = x.strides
    windows = xp.lib.stride_tricks.as_strided(
        x, shape=(c, kh, kw, n, oh, ow),
        strides=(s1, s2, s3, s0, s2 * stride, s3 * stride))
    return xp.ascontiguousarray(windows).reshape(c * kh * kw, n * oh * ow)


def col2im_reference(cols: Any, x_shape: tuple, kh: int, kw: int, stride: int,
                     pad: int) -> Any:
    """NumPy/CuPy col2im: one strided add per kernel tap (kh*kw vectorised adds)."""
    xp = array_module(cols)
    n, c, h, w = x_shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    dxp = xp.zeros((n, c, h + 2 * pad, w + 2 * pad), dtype=cols.dtype)
    taps = cols.reshape(c, kh, kw, n, oh, ow)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += \
                taps[:, i, j].transpose(1, 0, 2, 3)
    return dxp[:, :, pad:pad + h, pad:pad + w] if pad else dxp


def im2col(x: Any, kh: int, kw: int, stride: int, pad: int) -> Any:
    """Unfold ``x`` (N, C, H, W) into columns (C*kh*kw, N*OH*OW)."""
    if not use_kernels(x):
        return im2col_reference(x, kh, kw, stride, pad)
    ensure_compiled()
    n, c, h, w = x.shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    cols = np.empty((c * kh * kw, n * oh * ow), dtype=x.dtype)
    _im2col_kernel(np.ascontiguousarray(x), kh, kw, stride, pad, oh, ow, cols)
    return cols


def col2im(cols: Any, x_shape: tuple, kh: int, kw: int, stride: int, pad: int) -> Any:
    """Fold columns back into an image of ``x_shape``, summing overlapping taps."""
    if not use_kernels(cols):
        return col2im_reference(cols, x_shape, kh, kw, stride, pad)
    ensure_compiled()
    n, c, h, w = x_shape
    oh, ow = output_size(h, kh, stride, pad), output_size(w, kw, stride, pad)
    dx = np.zeros(x_shape, dtype=cols.dtype)
    _col2im_kernel(np.ascontiguousarray(cols), kh, kw, stride, pad, oh, ow, dx)
    return dx


@register_warmup
def _warm(dtype: type) -> None:
    x = np.zeros((1, 1, 3, 3), dtype=dtype)
    cols = np.empty((4, 4), dtype=dtype)
    _im2col_kernel(x, 2, 2, 1, 0, 2, 2, cols)
    _col2im_kernel(cols, 2, 2, 1, 0, 2, 2, x)
