"""2-D convolution by GEMMs on a few samples at a time (PyTorch's layout (F, C, kh, kw)).

One im2col of the whole batch is a matrix of up to 38 MB (ResNet-20's first stage:
144 rows x 64*1024 columns) that is written to memory, read back by the GEMM and
kept for backward. Here the batch is processed in chunks of a few samples
(:data:`CHUNK_BYTES`), each multiplied while its columns are still in cache::

    for each chunk of samples:
        cols   = im2col(x[chunk])                  # (C*kh*kw, nb*OH*OW), Numba
        out[n] = W.reshape(F, -1) @ cols[:, n]     # per sample: (F, OH*OW), already NCHW

Two engines take the "same" convolutions with stride 1 that dominate the CNNs here:
3x3 on 32 channels or more, Winograd's algorithm (:mod:`minidp.autograd.ops.winograd`, 2.25
times fewer multiply-adds); other odd square kernels on 8 channels or more, row-tap
GEMMs (:mod:`minidp.autograd.ops.rowtap`, taller products and a third of im2col's copying).
What follows is the general path, for every other convolution.

Backward recomputes what it needs chunk by chunk instead of keeping the columns
(which would take more memory than all of the network's activations):

* stride 1 with at least "same" padding (3x3 pad 1, 5x5 pad 2): the input gradient
  is the convolution of ``g`` with the flipped, transposed kernel, padded by
  ``k - 1 - p``. One im2col of ``g`` per chunk then serves both GEMMs:
  ``dx[n] = Wt @ cols_g[:, n]`` and ``dW' += cols_g @ x[chunk].T``; no col2im at all.
* otherwise (strides, "valid" padding, only the weight gradient wanted):
  ``dW' += cols_x @ g[chunk].T`` with the columns of x recomputed, and
  ``dx[chunk] = col2im(W2.T @ g[chunk])``.

The weight gradient is one GEMM per chunk, a long reduction over nb*OH*OW whose small
result is added up (NumPy's matmul cannot accumulate into its output). It is computed
transposed, ``cols @ g.T``: OpenBLAS runs that orientation 10-20% faster here.
On CuPy and under ``NUMBA_DISABLE_JIT=1`` the whole batch is one chunk (the NumPy
references unfold it in one vectorised copy).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from minidp.autograd.function import Function
from minidp.autograd.ops import rowtap, winograd
from minidp.backend import array_module
from minidp.kernels import col2im, im2col, output_size, use_kernels

# Columns (or Winograd tiles) of one chunk, in bytes. A ResNet-20 step was fastest
# with 1-4 MB here (within L3; a smaller chunk stays in L2 but pays the per-chunk
# Python and BLAS-call overhead more often, a whole batch goes out to memory).
CHUNK_BYTES = 1 << 21


def _pair_to_int(value: Any, name: str) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"conv2d: {name} {value!r} must be one int or a pair of equal ints")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"conv2d: {name} must be an int, got {value!r}")
    return value


def check_conv_args(x: Any, w: Any, b: Any, stride: int, padding: int) -> None:
    """Validate shapes and hyper-parameters of a convolution, naming what is wrong."""
    if x.ndim != 4:
        raise ValueError(f"conv2d: input must be (N, C, H, W), got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"conv2d: weight must be (F, C, kh, kw), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"conv2d: input has {x.shape[1]} channels but the weight of shape "
                         f"{w.shape} expects {w.shape[1]}")
    if stride < 1:
        raise ValueError(f"conv2d: stride must be >= 1, got {stride}")
    if padding < 0:
        raise ValueError(f"conv2d: padding must be >= 0, got {padding}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"conv2d: bias shape {b.shape} must be ({w.shape[0]},)")
    h, wd = x.shape[2] + 2 * padding, x.shape[3] + 2 * padding
    if h < w.shape[2] or wd < w.shape[3]:
        raise ValueError(f"conv2d: kernel {w.shape[2:]} is larger than the padded input "
                         f"({h}, {wd})")


def chunks(a: Any, bytes_per_sample: int) -> Iterator[tuple[int, int]]:
    """(lo, hi) bounds of the samples of ``a`` unfolded together (all of them off the kernels)."""
    n = a.shape[0]
    step = max(1, min(n, CHUNK_BYTES // max(1, bytes_per_sample))) if use_kernels(a) else n
    for lo in range(0, n, step):
        yield lo, min(n, lo + step)


def per_sample(cols: Any, n: int) -> Any:
    """View (n, K, L) of columns (K, n*L): one (K, L) matrix per sample, for a stacked matmul."""
    return cols.reshape(cols.shape[0], n, -1).transpose(1, 0, 2)


def by_channel(a: Any) -> Any:
    """Copy (C, n*L) of a chunk (n, C, L): the channels' values of every sample side by side."""
    n, c, length = a.shape
    return array_module(a).ascontiguousarray(a.transpose(1, 0, 2)).reshape(c, n * length)


def _accumulate(total: Any, part: Any) -> Any:
    """The running sum of a chunk loop: ``part`` first, then ``total += part`` in place."""
    if total is None:
        return part
    total += part
    return total


class Unfolder:
    """im2col of chunks of one batch into one reused buffer.

    Args:
        a: the batch (N, C, H, W), C-contiguous.
        kh, kw, stride, ph, pw: the window's geometry.
    """

    def __init__(self, a: Any, kh: int, kw: int, stride: int, ph: int, pw: int) -> None:
        _, c, h, w = a.shape
        self.a, self.geometry = a, (kh, kw, stride, ph, pw)
        self.rows = c * kh * kw
        self.size = output_size(h, kh, stride, ph) * output_size(w, kw, stride, pw)
        self.bounds = list(chunks(a, self.rows * self.size * a.dtype.itemsize))
        step = self.bounds[0][1]
        self.buffer = (array_module(a).empty(self.rows * step * self.size, dtype=a.dtype)
                       if len(self.bounds) > 1 else None)

    def columns(self, lo: int, hi: int) -> Any:
        """Columns (C*kh*kw, (hi-lo)*OH*OW) of samples lo..hi."""
        out = None
        if self.buffer is not None:
            out = self.buffer[:self.rows * (hi - lo) * self.size].reshape(self.rows, -1)
        return im2col(self.a[lo:hi], *self.geometry, out=out)


class Conv2d(Function):
    """Cross-correlation of (N, C, H, W) with (F, C, kh, kw), plus an optional bias."""

    def forward(self, x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0) -> Any:
        stride, padding = _pair_to_int(stride, "stride"), _pair_to_int(padding, "padding")
        check_conv_args(x, w, b, stride, padding)
        x = array_module(x, w).ascontiguousarray(x)
        f, _, kh, kw = w.shape
        self.x, self.w, self.geometry = x, w, (kh, kw, stride, padding)
        if winograd.applies(x.shape, w.shape, stride, padding):
            out, self.planes = winograd.forward(x, w, self._chunks(winograd))
        elif rowtap.applies(x.shape, w.shape, stride, padding):
            out = rowtap.forward(x, w, self._chunks(rowtap))
        else:
            out = self._forward_unfolded(x, w)
        if b is not None:  # one pass after the GEMMs; only the small CNNs have biases
            out += b.reshape(f, 1, 1)
        return out

    def _forward_unfolded(self, x: Any, w: Any) -> Any:
        """im2col + GEMM, chunk by chunk."""
        xp = array_module(x, w)
        n, _, h, wd = x.shape
        f, _, kh, kw = w.shape
        _, _, stride, padding = self.geometry
        oh, ow = output_size(h, kh, stride, padding), output_size(wd, kw, stride, padding)
        out = xp.empty((n, f, oh, ow), dtype=xp.result_type(x, w))
        out3 = out.reshape(n, f, oh * ow)
        w2 = w.reshape(f, -1)
        unfold = Unfolder(x, kh, kw, stride, padding, padding)
        for lo, hi in unfold.bounds:
            xp.matmul(w2, per_sample(unfold.columns(lo, hi), hi - lo), out=out3[lo:hi])
        return out

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        g = xp.ascontiguousarray(g)
        kh, kw, stride, padding = self.geometry
        gb = g.sum(axis=(0, 2, 3)) if self.wants(2) else None
        if winograd.applies(self.x.shape, self.w.shape, stride, padding):
            gx, gw = winograd.backward(g, self.x, self.w, self._chunks(winograd),
                                       self.planes, self.wants(0), self.wants(1))
            return gx, gw, gb
        if rowtap.applies(self.x.shape, self.w.shape, stride, padding):
            gx, gw = rowtap.backward(g, self.x, self.w, self._chunks(rowtap), self.wants(0),
                                     self.wants(1))
            return gx, gw, gb
        transposable = (stride == 1 and kh - 1 <= 2 * padding and kw - 1 <= 2 * padding
                        and padding <= min(kh, kw) - 1)
        if self.wants(0) and transposable:
            gx, gw = self._backward_transposed(g)
        else:
            gx, gw = self._backward_unfolded(g)
        return gx, gw, gb

    def _chunks(self, engine: Any) -> list:
        """Chunk bounds for the Winograd or row-tap engine (module), from its bytes per sample."""
        per_sample = engine.bytes_per_sample(self.x.shape, self.w.shape, self.x.dtype.itemsize)
        return list(chunks(self.x, per_sample))

    def _backward_transposed(self, g: Any) -> tuple:
        """The input gradient as conv(g, flipped W^T, padding k-1-p); dW from the same columns."""
        xp = array_module(g)
        kh, kw, _, p = self.geometry
        n, c, h, w = self.x.shape
        f = self.w.shape[0]
        wt = xp.ascontiguousarray(self.w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3))
        wt = wt.reshape(c, f * kh * kw)  # (C, F*kh*kw)
        gx = xp.empty(self.x.shape, dtype=g.dtype)
        gx3, x3 = gx.reshape(n, c, h * w), self.x.reshape(n, c, h * w)
        unfold = Unfolder(g, kh, kw, 1, kh - 1 - p, kw - 1 - p)
        gw = None
        for lo, hi in unfold.bounds:
            cols = unfold.columns(lo, hi)  # (F*kh*kw, nb*H*W)
            xp.matmul(wt, per_sample(cols, hi - lo), out=gx3[lo:hi])
            if self.wants(1):
                part = cols @ by_channel(x3[lo:hi]).T  # (F*kh*kw, C)
                gw = _accumulate(gw, part)
        if gw is not None:  # (F, kh, kw, C) with the taps flipped
            gw = xp.ascontiguousarray(gw.reshape(f, kh, kw, c)[:, ::-1, ::-1].transpose(0, 3, 1, 2))
        return gx, gw

    def _backward_unfolded(self, g: Any) -> tuple:
        """The weight gradient from recomputed columns of x; dx = col2im(W2^T @ g), per chunk."""
        xp = array_module(g)
        kh, kw, stride, p = self.geometry
        n, f, oh, ow = g.shape
        g3, w2 = g.reshape(n, f, oh * ow), self.w.reshape(f, -1)
        unfold = Unfolder(self.x, kh, kw, stride, p, p)
        gx = xp.empty(self.x.shape, dtype=g.dtype) if self.wants(0) else None
        gw = None
        for lo, hi in unfold.bounds:
            g2 = by_channel(g3[lo:hi])  # (F, nb*OH*OW)
            if self.wants(1):
                part = unfold.columns(lo, hi) @ g2.T  # (C*kh*kw, F)
                gw = _accumulate(gw, part)
            if self.wants(0):
                col2im(w2.T @ g2, gx[lo:hi], kh, kw, stride, p, p)
        return gx, None if gw is None else xp.ascontiguousarray(gw.T).reshape(self.w.shape)
