"""Row-tap unfolding: a k x k "same" convolution as one GEMM over k taps and a shifted sum.

im2col copies every input value k*k times (once per tap), and BLAS runs the product
``(F, C*k*k) @ (C*k*k, L)`` slowly when F is small (16 rows for ResNet-20's first
stage). Unfolding only the k column taps, over rows padded top and bottom, copies
each value k times; the k row taps become rows of a k times taller product::

    R[(c, j), n, r, x] = x[n, c, r - p, x + j - p]            (C*k, N*Hp*W)   rows(x)
    P = W3 @ R,   W3[(i, f), (c, j)] = w[f, c, i, j]          (k*F, N*Hp*W)
    out[n, f, y, x] = sum_i P[(i, f), n, y + i, x]                            sum_taps(P)

with p = (k-1)/2 and Hp = H + 2p. The weight gradient pairs the rows of the output
gradient with copies of x shifted down by 0..k-1 rows (:func:`row_shifts`)::

    S[(i, c), n, r, x] = x[n, c, r - i, x]                    (k*C, N*Hp*W)

Layouts are row-major over the bracketed index, then n, r (or y) and x. The kernels
index with unsigned integers (see :mod:`minidp.kernels.unfold`) so their copies
vectorise.
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels.gemm import NO_TRANS, REGION_DTYPES, ROW_MAJOR, TRANS, native
from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import c_array, first_class


@numba.njit(cache=True, nogil=True)
def _rows_kernel(x, k, out):  # pragma: no cover - compiled
    n_img, n_ch, h, w = x.shape
    p = (k - 1) // 2
    plane = (h + 2 * p) * w
    src, dst = x.reshape(-1), out.reshape(-1)
    for c in range(n_ch):
        for j in range(k):
            lo, hi = min(w, max(0, p - j)), max(0, min(w, w + p - j))  # columns inside x
            for n in range(n_img):
                o = np.uint64(((c * k + j) * n_img + n) * plane)
                for q in range(p * w):  # the padding rows
                    dst[o + np.uint64(q)] = 0
                    dst[o + np.uint64(plane - p * w + q)] = 0
                image = (n * n_ch + c) * h * w
                for y in range(h):
                    row = o + np.uint64((y + p) * w)
                    for q in range(lo):
                        dst[row + np.uint64(q)] = 0
                    s, d = np.uint64(image + y * w + lo + j - p), row + np.uint64(lo)
                    for q in range(hi - lo):
                        dst[d + np.uint64(q)] = src[s + np.uint64(q)]
                    for q in range(max(lo, hi), w):
                        dst[row + np.uint64(q)] = 0


@numba.njit(cache=True, nogil=True)
def _shifts_kernel(x, k, out):  # pragma: no cover - compiled
    n_img, n_ch, h, w = x.shape
    plane = (h + k - 1) * w
    src, dst = x.reshape(-1), out.reshape(-1)
    for i in range(k):
        for c in range(n_ch):
            for n in range(n_img):
                o = np.uint64(((i * n_ch + c) * n_img + n) * plane)
                for q in range(i * w):
                    dst[o + np.uint64(q)] = 0
                s, d = np.uint64((n * n_ch + c) * h * w), o + np.uint64(i * w)
                for q in range(h * w):
                    dst[d + np.uint64(q)] = src[s + np.uint64(q)]
                for q in range((i + h) * w, plane):
                    dst[o + np.uint64(q)] = 0


@numba.njit(cache=True, nogil=True)
def _sum_taps_kernel(pm, k, out):  # pragma: no cover - compiled
    n_img, n_f, h, w = out.shape
    size, plane = h * w, (h + k - 1) * w
    src, dst = pm.reshape(-1), out.reshape(-1)
    for n in range(n_img):
        for f in range(n_f):
            d = np.uint64((n * n_f + f) * size)
            s = np.uint64((f * n_img + n) * plane)
            for q in range(size):
                dst[d + np.uint64(q)] = src[s + np.uint64(q)]
            for i in range(1, k):
                s = np.uint64(((i * n_f + f) * n_img + n) * plane + i * w)
                for q in range(size):
                    dst[d + np.uint64(q)] += src[s + np.uint64(q)]


# A chunk of the row-tap convolution (minidp.autograd.ops.rowtap) as one kernel, which
# the region kernels below run on the rank's threads with no Python in between
# (minidp.kernels.gemm says why). ``gemm`` is NumPy's cblas_?gemm, called as NumPy's
# matmul calls it for the products rowtap.py writes in Python (the same bits); ``rows``
# and ``spare`` a thread's buffers, C-contiguous and of the shapes the steps need.

@numba.njit(cache=True, nogil=True)
def _product(gemm, trans_a, trans_b, a, b, c):  # pragma: no cover - compiled
    """C = op(a) @ op(b) of C-contiguous a, b, c: ``x.T`` of NumPy reaches BLAS as x, TRANS.

    unfold.py's helper again: a kernel calls compiled functions of its own file only, since
    the cache stamps each file by its own contents (:mod:`.locator`).
    """
    m, n = c.shape
    k = a.shape[0] if trans_a == TRANS else a.shape[1]
    gemm(ROW_MAJOR, trans_a, trans_b, m, n, k, c.dtype.type(1), a.ctypes.data, a.shape[1],
         b.ctypes.data, b.shape[1], c.dtype.type(0), c.ctypes.data, n)


@numba.njit(cache=True, nogil=True)
def _forward_chunk_kernel(gemm, x, w3, bias, k, rows, spare, out):  # pragma: no cover
    """Out = sum_taps(W3 @ rows(x)) (+ bias (F,); empty: none) for the chunk x."""
    _rows_kernel(x, k, rows)
    _product(gemm, NO_TRANS, NO_TRANS, w3, rows, spare)
    _sum_taps_kernel(spare, k, out)
    if bias.size:
        for n in range(out.shape[0]):
            for f in range(out.shape[1]):
                out[n, f] += bias[f]


@numba.njit(cache=True, nogil=True)
def _backward_chunk_kernel(gemm, g, x, w3t, k, rows, spare, want_w, gx,
                           part):  # pragma: no cover - compiled
    """Gx = sum_taps(W3' @ rows(g)) (gx empty: not wanted); dW' = rows(g) @ S(x).T into part."""
    _rows_kernel(g, k, rows)
    if gx.size:
        _product(gemm, NO_TRANS, NO_TRANS, w3t, rows, spare)
        _sum_taps_kernel(spare, k, gx)
    if want_w:  # the product's buffer is free again: it takes the shifted copies of x
        _shifts_kernel(x, k, spare)
        _product(gemm, NO_TRANS, TRANS, rows, spare, part)


# A region's chunks on the rank's threads in one parallel call (Plan.run_kernel): thread
# t runs the chunks starts[t]:starts[t + 1] of ``bounds``, each as one call of ``chunk``
# (the chunk kernel above, through its address: threaded.first_class), into row t of
# ``rows`` and of ``spare``.

@numba.njit(cache=True, nogil=True, parallel=True)
def _forward_region_kernel(bounds, starts, chunk, gemm, x, w3, bias, k, rows, spare,
                           out):  # pragma: no cover - compiled
    c, f = x.shape[1], out.shape[1]
    per_sample = (x.shape[2] + k - 1) * x.shape[3]
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            columns = (hi - lo) * per_sample
            chunk(gemm, x[lo:hi], w3, bias, k, rows[t, :c * k * columns].reshape(c * k, columns),
                  spare[t, :k * f * columns].reshape(k * f, columns), out[lo:hi])


@numba.njit(cache=True, nogil=True, parallel=True)
def _backward_region_kernel(bounds, starts, chunk, gemm, g, x, w3t, k, rows, spare, want_w,
                            gx, parts):  # pragma: no cover - compiled
    c, f = x.shape[1], g.shape[1]
    per_sample = (x.shape[2] + k - 1) * x.shape[3]
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            columns = (hi - lo) * per_sample
            chunk(gemm, g[lo:hi], x[lo:hi], w3t, k,
                  rows[t, :f * k * columns].reshape(f * k, columns),
                  spare[t, :k * c * columns].reshape(k * c, columns), want_w,
                  gx[lo:hi] if gx.size else gx, parts[i])


@functools.cache
def _regions(dtype: Any) -> tuple:
    """The row-tap (forward, backward) region and chunk kernels, as ``first_class`` gives them."""
    a, i = functools.partial(c_array, dtype), numba.types.int64
    gemm, want_w = numba.typeof(native(dtype)), numba.types.boolean
    forward = (gemm, a(4), a(2), a(1), i, a(2), a(2), a(4))  # region: the same
    backward = (gemm, a(4), a(4), a(2), i, a(2), a(2), want_w, a(4))  # then part / parts
    return (first_class(_forward_region_kernel, _forward_chunk_kernel, forward, forward),
            first_class(_backward_region_kernel, _backward_chunk_kernel, backward + (a(2),),
                        backward + (a(3),)))


def forward_region(gemm: Any, x: Any, w3: Any, bias: Any, k: int, plan: Any, rows: Any,
                   spare: Any, out: Any) -> None:
    """Every chunk of ``plan`` forward, on its threads in one call.

    ``x`` and ``out`` are the whole batch's; ``rows`` and ``spare`` (plan.threads, size)
    hold one thread's buffers a row.
    """
    bias = np.empty(0, out.dtype) if bias is None else bias.reshape(out.shape[1])
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(x.dtype)[0]
    plan.run_kernel(kernel, chunk, gemm, x, w3, bias, k, rows, spare, out)


def backward_region(gemm: Any, g: Any, x: Any, w3t: Any, k: int, plan: Any, rows: Any,
                    spare: Any, want_w: bool, gx: Any) -> Any:
    """Every chunk of ``plan`` backward, on its threads in one call.

    Returns the chunks' dW' parts (chunks, F*k, k*C), in chunk order, or None.
    """
    gx = np.empty((0, 0, 0, 0), g.dtype) if gx is None else gx
    f, c = g.shape[1], x.shape[1]
    parts = np.empty((len(plan.bounds), f * k, k * c), g.dtype)
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(g.dtype)[1]
    plan.run_kernel(kernel, chunk, gemm, g, x, w3t, k, rows, spare, want_w,
                    gx, parts)
    return parts if want_w else None


def rows_reference(x: Any, k: int) -> Any:
    """R of the module docstring, in NumPy/CuPy."""
    xp = array_module(x)
    n, c, h, w = x.shape
    p = (k - 1) // 2
    padded = xp.pad(x, ((0, 0), (0, 0), (p, p), (p, p)))
    taps = xp.stack([padded[:, :, :, j:j + w] for j in range(k)], axis=2)  # (N, C, k, Hp, W)
    return xp.ascontiguousarray(taps.transpose(1, 2, 0, 3, 4)).reshape(c * k, -1)


def row_shifts_reference(x: Any, k: int) -> Any:
    """S of the module docstring, in NumPy/CuPy."""
    xp = array_module(x)
    n, c, h, w = x.shape
    shifted = xp.stack([xp.pad(x, ((0, 0), (0, 0), (i, k - 1 - i), (0, 0))) for i in range(k)])
    return xp.ascontiguousarray(shifted.transpose(0, 2, 1, 3, 4)).reshape(k * c, -1)


def sum_taps_reference(pm: Any, k: int, shape: tuple) -> Any:
    """Out of the module docstring, for ``shape`` (N, F, H, W), in NumPy/CuPy."""
    n, f, h, w = shape
    blocks = pm.reshape(k, f, n, h + k - 1, w)
    out = sum(blocks[i, :, :, i:i + h] for i in range(k))  # (F, N, H, W)
    return array_module(pm).ascontiguousarray(out.transpose(1, 0, 2, 3))


def tap_rows(x: Any, k: int, out: Any = None) -> Any:
    """R (C*k, N*Hp*W) of x (N, C, H, W) for a k x k kernel; into ``out`` if given."""
    if not use_kernels(x):
        return rows_reference(x, k)
    ensure_compiled()
    n, c, h, w = x.shape
    out = np.empty((c * k, n * (h + k - 1) * w), dtype=x.dtype) if out is None else out
    _rows_kernel(np.ascontiguousarray(x), k, out)
    return out


def row_shifts(x: Any, k: int, out: Any = None) -> Any:
    """S (k*C, N*Hp*W) of x (N, C, H, W); into ``out`` if given."""
    if not use_kernels(x):
        return row_shifts_reference(x, k)
    ensure_compiled()
    n, c, h, w = x.shape
    out = np.empty((k * c, n * (h + k - 1) * w), dtype=x.dtype) if out is None else out
    _shifts_kernel(np.ascontiguousarray(x), k, out)
    return out


def sum_taps(pm: Any, k: int, out: Any) -> Any:
    """Write the sum over row taps of P (k*F, N*Hp*W) into ``out`` (N, F, H, W)."""
    if not use_kernels(pm, out) or not out.flags.c_contiguous:
        out[...] = sum_taps_reference(pm, k, out.shape)
        return out
    ensure_compiled()
    _sum_taps_kernel(np.ascontiguousarray(pm), k, out)
    return out


@register_warmup
def _warm(dtype: type) -> None:
    x = np.zeros((1, 1, 2, 2), dtype=dtype)
    cols = np.empty((3, 8), dtype=dtype)
    _rows_kernel(x, 3, cols)
    _shifts_kernel(x, 3, cols)
    _sum_taps_kernel(cols, 3, x)


@register_parallel_warmup
def _warm_chunks(dtype: type) -> None:
    if dtype in REGION_DTYPES and native(dtype) is not None:
        _regions(np.dtype(dtype))
