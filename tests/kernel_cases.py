"""Inputs shared by the kernel tests: the Numba kernels, the CUDA kernels and their source.

Each kernel is compared with its NumPy reference on these shapes, so that every
implementation meets the same edge cases.
"""

import numpy as np

DTYPES = [np.float32, np.float64]
# (N, C, H, W, kh, kw, stride, ph, pw): odd sizes, strides that do not divide, pads wider
# than one tap, unequal pads (the transposed convolution of a non-square kernel).
CONV_CASES = [(1, 1, 5, 5, 3, 3, 1, 0, 0), (2, 3, 7, 9, 3, 3, 2, 1, 1),
              (3, 2, 11, 6, 5, 2, 3, 2, 2), (1, 4, 4, 4, 1, 1, 1, 0, 0),
              (2, 1, 28, 28, 5, 5, 1, 2, 2), (1, 3, 9, 7, 4, 4, 2, 3, 3),
              (2, 2, 6, 5, 3, 2, 1, 2, 1), (2, 3, 6, 6, 3, 3, 1, 1, 1)]
# (N, C, H, W, k, stride): disjoint windows, overlapping ones, edges no window covers
POOL_CASES = [(2, 3, 8, 8, 2, 2), (1, 2, 7, 9, 2, 2), (1, 2, 7, 9, 3, 2), (2, 1, 5, 5, 2, 1),
              (3, 2, 9, 7, 3, 3), (1, 1, 4, 4, 4, 4), (2, 1, 9, 9, 3, 3), (1, 1, 6, 5, 2, 1)]


def rand(shape, dtype, seed=0):
    """Standard normal values of ``shape`` in ``dtype``, drawn from ``seed``."""
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


def direct_conv(x, w, b, g, stride, pad):
    """Output and the gradients (x, w, b) of sum(out * g), from the textbook sums.

    The convolution tests' independent reference (CPU engines and the GPU's alike).
    """
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    kh, kw = w.shape[2:]
    oh, ow = g.shape[2:]
    windows = np.lib.stride_tricks.sliding_window_view(xp, (kh, kw), axis=(2, 3))
    windows = windows[:, :, ::stride, ::stride][:, :, :oh, :ow]  # (N, C, OH, OW, kh, kw)
    out = np.einsum("ncyxij,fcij->nfyx", windows, w) + b[:, None, None]
    gw = np.einsum("ncyxij,nfyx->fcij", windows, g)
    gxp = np.zeros_like(xp)
    for i in range(kh):
        for j in range(kw):
            gxp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += np.einsum(
                "nfyx,fc->ncyx", g, w[:, :, i, j])
    gx = gxp[:, :, pad:pad + x.shape[2], pad:pad + x.shape[3]]
    return out, gx, gw, g.sum(axis=(0, 2, 3))
