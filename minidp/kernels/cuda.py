"""CUDA counterparts of the Numba kernels, for CuPy arrays: im2col, col2im, max pooling, SGD.

The NumPy references run on CuPy too, but as many launches and temporaries: col2im
is kh*kw strided adds, max pooling's backward a scatter-add (atomics, in no fixed
order), the SGD step five passes. Here each is one ``cupy.ElementwiseKernel``, one
GPU thread per element of its output, in the layouts of :mod:`.unfold` and
:mod:`.pooling`::

    im2col        thread per column entry (row=(c*kh+i)*kw+j, col=(n*OH+y)*OW+x):
                  reads its tap of x, or 0 outside the image
    col2im        thread per input pixel: gathers the column entries of every tap that
                  covers it, taps in the reference's order (no atomics)
    maxpool fwd   thread per output: first maximum of its window (PyTorch's tie rule)
    maxpool bwd   thread per input pixel: sums the gradients of the outputs whose
                  argmax it is, outputs in row-major order (the reference's add order)
    sgd_update    thread per parameter: the fused step of :mod:`.elementwise`, in double

Gathering instead of scattering makes col2im and the pooling backward deterministic,
and equal to the references bit for bit in float64 (the same sums in the same order).
Kernels compile on first use (CuPy caches them on disk). ``MINIDP_CUDA_KERNELS=0``
falls back to the references everywhere.
"""

from __future__ import annotations

import functools
import os
from types import SimpleNamespace
from typing import Any

import numpy as np

from minidp.backend import array_module, is_cupy_array
from minidp.kernels.jit import references_forced

_SIZES = "int32 n_img, int32 c_in, int32 h, int32 w, int32 kh, int32 kw, int32 stride"

_IM2COL = """
    const long long per_row = (long long)n_img * oh * ow;
    const long long row = i / per_row, column = i % per_row;
    const int j = row % kw, di = (row / kw) % kh, c = row / ((long long)kw * kh);
    const int xo = column % ow, yo = (column / ow) % oh, n = column / ((long long)ow * oh);
    const int hy = yo * stride + di - ph, wx = xo * stride + j - pw;
    col = (hy >= 0 && hy < h && wx >= 0 && wx < w)
        ? x[(((long long)n * c_in + c) * h + hy) * w + wx] : (T)0;
"""

_COL2IM = """
    const int wx = i % w, hy = (i / w) % h;
    const int c = (i / ((long long)w * h)) % c_in, n = i / ((long long)w * h * c_in);
    const long long per_row = (long long)n_img * oh * ow;
    T sum = 0;
    for (int di = 0; di < kh; ++di) {
        const int ty = hy + ph - di;
        if (ty < 0 || ty % stride != 0 || ty / stride >= oh) continue;
        for (int dj = 0; dj < kw; ++dj) {
            const int tx = wx + pw - dj;
            if (tx < 0 || tx % stride != 0 || tx / stride >= ow) continue;
            const long long row = ((long long)c * kh + di) * kw + dj;
            sum += cols[row * per_row + ((long long)n * oh + ty / stride) * ow + tx / stride];
        }
    }
    dx = sum;
"""

_MAXPOOL_FORWARD = """
    const int xo = i % ow, yo = (i / ow) % oh;
    const long long plane = i / ((long long)ow * oh);
    const int h0 = yo * stride, w0 = xo * stride;
    const T* p = &x[plane * h * w];
    T best = p[h0 * w + w0];
    long long at = h0 * w + w0;
    for (int di = 0; di < k; ++di)
        for (int dj = 0; dj < k; ++dj) {
            const T v = p[(h0 + di) * w + w0 + dj];
            if (v > best) { best = v; at = (h0 + di) * w + w0 + dj; }
        }
    out = best;
    argmax = at;
"""

_MAXPOOL_BACKWARD = """
    const int wx = i % w, hy = (i / w) % h;
    const long long plane = i / ((long long)w * h);
    const long long me = (long long)hy * w + wx;
    const int y_lo = hy < k ? 0 : (hy - k) / stride + 1, y_hi = min(oh - 1, hy / stride);
    const int x_lo = wx < k ? 0 : (wx - k) / stride + 1, x_hi = min(ow - 1, wx / stride);
    T sum = 0;
    for (int yo = y_lo; yo <= y_hi; ++yo)
        for (int xo = x_lo; xo <= x_hi; ++xo) {
            const long long o = (plane * oh + yo) * ow + xo;
            if (argmax[o] == me) sum += grad[o];
        }
    dx = sum;
"""

_SGD = """
    double d = (double)g + weight_decay * (double)w;
    if (momentum != 0) {
        const double b = momentum * (double)buf + d;
        buf = b;
        d = nesterov ? d + momentum * b : b;
    }
    w = (double)w - lr * d;
"""


# name -> (input parameters, output parameters, body), as cupy.ElementwiseKernel takes them
KERNELS = {
    "im2col": (f"raw T x, {_SIZES}, int32 ph, int32 pw, int32 oh, int32 ow", "T col", _IM2COL),
    "col2im": (f"raw T cols, {_SIZES}, int32 ph, int32 pw, int32 oh, int32 ow", "T dx",
               _COL2IM),
    "maxpool_forward": ("raw T x, int32 h, int32 w, int32 k, int32 stride, int32 oh, int32 ow",
                        "T out, int64 argmax", _MAXPOOL_FORWARD),
    "maxpool_backward": ("raw T grad, raw int64 argmax, int32 h, int32 w, int32 k, "
                         "int32 stride, int32 oh, int32 ow", "T dx", _MAXPOOL_BACKWARD),
    "sgd_update": ("T g, float64 lr, float64 momentum, float64 weight_decay, bool nesterov",
                   "T w, T buf", _SGD),
}


@functools.lru_cache(maxsize=None)
def _kernels() -> SimpleNamespace:
    """The compiled kernels (built once per process, on first use)."""
    import cupy

    return SimpleNamespace(**{
        name: cupy.ElementwiseKernel(inputs, outputs, body, f"minidp_{name}")
        for name, (inputs, outputs, body) in KERNELS.items()})


def applies(*arrays: Any) -> bool:
    """Whether these kernels take these arrays: all CuPy and C-contiguous, kernels not off.

    Off: ``MINIDP_CUDA_KERNELS=0``, or inside :func:`.jit.references_only`.
    """
    return all(is_cupy_array(a) and a.flags.c_contiguous for a in arrays) and \
        os.environ.get("MINIDP_CUDA_KERNELS", "1") != "0" and not references_forced()


def _ints(*values: int) -> list[np.int32]:
    return [np.int32(v) for v in values]


def im2col(x: Any, kh: int, kw: int, stride: int, ph: int, pw: int, oh: int, ow: int,
           out: Any) -> Any:
    """Unfold ``x`` (N, C, H, W) into ``out`` (C*kh*kw, N*OH*OW)."""
    n, c, h, w = x.shape
    return _kernels().im2col(x, *_ints(n, c, h, w, kh, kw, stride, ph, pw, oh, ow), out)


def col2im(cols: Any, out: Any, kh: int, kw: int, stride: int, ph: int, pw: int, oh: int,
           ow: int) -> Any:
    """Fold ``cols`` into ``out`` (N, C, H, W), overwriting it."""
    n, c, h, w = out.shape
    return _kernels().col2im(cols, *_ints(n, c, h, w, kh, kw, stride, ph, pw, oh, ow), out)


def maxpool_forward(x: Any, k: int, stride: int, oh: int, ow: int) -> tuple[Any, Any]:
    """(out, argmax) of max pooling ``x`` (N, C, H, W), argmax as the flat index hy*W + wx."""
    xp = array_module(x)
    n, c, h, w = x.shape
    out = xp.empty((n, c, oh, ow), dtype=x.dtype)
    argmax = xp.empty((n, c, oh, ow), dtype=np.int64)
    _kernels().maxpool_forward(x, *_ints(h, w, k, stride, oh, ow), out, argmax)
    return out, argmax


def maxpool_backward(grad: Any, argmax: Any, x_shape: tuple, k: int, stride: int) -> Any:
    """The input gradient of max pooling: each pixel sums the gradients it was the max of."""
    h, w = x_shape[2], x_shape[3]
    dx = array_module(grad).empty(x_shape, dtype=grad.dtype)
    oh, ow = grad.shape[2], grad.shape[3]
    return _kernels().maxpool_backward(grad, argmax, *_ints(h, w, k, stride, oh, ow), dx)


def sgd_update(w: Any, g: Any, buf: Any, lr: float, momentum: float, weight_decay: float,
               nesterov: bool) -> None:
    """The fused SGD step in place on ``w`` and ``buf`` (1-D, one dtype)."""
    _kernels().sgd_update(g, float(lr), float(momentum), float(weight_decay), bool(nesterov),
                          w, buf)
