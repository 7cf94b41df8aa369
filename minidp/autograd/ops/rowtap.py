"""k x k "same" convolutions (stride 1, odd k, padding (k-1)/2) by row-tap GEMMs, per chunk.

For ResNet-20's first stage (16 channels, 32x32) im2col + GEMM multiplies a
(16, 144) weight by 144-row columns: BLAS runs at two thirds of its speed with so
few rows, and the columns are 9 copies of the input. Unfolding only the k column
taps (:mod:`minidp.kernels.taps`) gives a (3F, 3C) @ (3C, columns) product, 10-15%
faster in BLAS, on a third of the copying; a shifted sum adds the k row taps::

    forward:  out = sum_taps(W3 @ rows(x))
    backward: dx  = sum_taps(W3' @ rows(g))      (W' the flipped, transposed kernel)
              dW' = rows(g) @ row_shifts(x).T    (W' again: taps reversed)

One ``rows(g)`` per chunk serves both gradients, whose chunk sums are added in chunk
order. With several threads each runs its own chunks (a
:class:`~minidp.kernels.threaded.Plan`), with buffers of its own. On the Numba kernels,
with more than one thread, the whole region is one parallel kernel call
(``minidp.kernels.taps``' ``forward_region`` and ``backward_region``: each thread its
chunks, the steps below with NumPy's own GEMM inside, the same bits; see
:mod:`minidp.kernels.gemm`). Off the kernels (CuPy, ``NUMBA_DISABLE_JIT=1``)
the whole batch is one chunk of NumPy/CuPy references.
"""

from __future__ import annotations

from typing import Any

from minidp.backend import array_module
from minidp.kernels import taps
from minidp.kernels.gemm import region_gemm
from minidp.kernels.jit import use_kernels
from minidp.kernels.taps import row_shifts, sum_taps, tap_rows
from minidp.kernels.threaded import Plan, fold

# From this many input channels on; below (the first layer's 3) the (k*F, k*C) product
# is too thin for BLAS and im2col's (F, C*k*k) one is faster.
MIN_CHANNELS = 8


def applies(x_shape: tuple, w_shape: tuple, stride: int, padding: int) -> bool:
    """Whether the convolution is one that this module computes."""
    k = w_shape[2]
    return (w_shape[3] == k and k % 2 == 1 and stride == 1 and padding == (k - 1) // 2
            and x_shape[1] >= MIN_CHANNELS)


def bytes_per_sample(x_shape: tuple, w_shape: tuple, itemsize: int) -> int:
    """Unfolded rows and products of one sample, in bytes."""
    _, c, h, w = x_shape
    f, _, k, _ = w_shape
    return k * (c + f) * (h + k - 1) * w * itemsize


class _Buffers:
    """Reused arrays for the chunks of a batch, each thread's own (None off the kernels).

    ``flat[i]`` is (threads, size): one thread's buffer i a row, as a region kernel takes
    them; buffer i of a chunk is ``rows[i]`` rows of its samples' columns.
    """

    def __init__(self, a: Any, rows: tuple, plan: Plan, columns_per_sample: int) -> None:
        self.rows, self.per_sample = rows, columns_per_sample
        self.flat = ([array_module(a).empty((plan.threads, r * plan.largest * columns_per_sample),
                                            dtype=a.dtype) for r in rows]
                     if use_kernels(a) and len(plan.bounds) > 1 else None)

    def get(self, thread: int, i: int, lo: int, hi: int) -> Any:
        """``thread``'s array i as a contiguous (rows[i], columns of samples lo..hi), or None."""
        if self.flat is None:
            return None
        rows = self.rows[i]
        return self.flat[i][thread, :rows * (hi - lo) * self.per_sample].reshape(rows, -1)


def forward(x: Any, w: Any, bias: Any, plan: Plan) -> Any:
    """The convolution of x (N, C, H, W) with w (F, C, k, k), padding (k-1)/2 (+ bias)."""
    xp = array_module(x, w)
    n, c, h, wd = x.shape
    f, k = w.shape[0], w.shape[2]
    w3 = xp.ascontiguousarray(w.transpose(2, 0, 1, 3)).reshape(k * f, c * k)  # (i,f), (c,j)
    out = xp.empty((n, f, h, wd), dtype=x.dtype)
    buffers = _Buffers(x, (c * k, k * f), plan, (h + k - 1) * wd)
    native = region_gemm([x, w3] + ([] if bias is None else [bias]), (k * f, c * k),
                         plan)
    if native is not None:  # the chunks below, on the rank's threads in one kernel call
        taps.forward_region(native, x, w3, bias, k, plan, *buffers.flat, out)
        return out

    def chunk(thread: int, lo: int, hi: int) -> None:
        rows = tap_rows(x[lo:hi], k, out=buffers.get(thread, 0, lo, hi))
        sum_taps(xp.matmul(w3, rows, out=buffers.get(thread, 1, lo, hi)), k, out[lo:hi])
        if bias is not None:
            out[lo:hi] += bias

    plan.run(chunk)
    return out


def backward(g: Any, x: Any, w: Any, plan: Plan, want_x: bool, want_w: bool) -> tuple:
    """Gradients (dx, dw) of :func:`forward` for the output gradient g; None where unwanted."""
    xp = array_module(g)
    _, c, h, wd = x.shape
    f, k = w.shape[0], w.shape[2]
    flipped = w[:, :, ::-1, ::-1]
    w3t = xp.ascontiguousarray(flipped.transpose(2, 1, 0, 3)).reshape(k * c, f * k)
    gx = xp.empty(x.shape, dtype=g.dtype) if want_x else None
    buffers = _Buffers(g, (f * k, k * c), plan, (h + k - 1) * wd)
    native = region_gemm([g, x, w3t], (k * c, f * k), plan)

    def chunk(thread: int, lo: int, hi: int) -> Any:
        rows = tap_rows(g[lo:hi], k, out=buffers.get(thread, 0, lo, hi))  # (F*k, nb*Hp*W)
        if want_x:
            sum_taps(xp.matmul(w3t, rows, out=buffers.get(thread, 1, lo, hi)), k, gx[lo:hi])
        if not want_w:
            return None
        # the product's buffer is free again: it takes the shifted copies of x
        return rows @ row_shifts(x[lo:hi], k, out=buffers.get(thread, 1, lo, hi)).T  # (f,j'),(i',c)

    if native is not None:  # the same chunks, on the rank's threads in one kernel call
        parts = taps.backward_region(native, g, x, w3t, k, plan, *buffers.flat, want_w, gx)
    else:
        parts = plan.run(chunk)
    gw = None
    if want_w:
        gw = fold(parts).reshape(f, k, k, c)
        gw = xp.ascontiguousarray(gw[:, ::-1, ::-1].transpose(0, 3, 2, 1))
    return gx, gw
