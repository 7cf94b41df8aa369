"""im2col / col2im per sample: unfold image patches into columns so a convolution is a matmul.

Layout (shared by the Numba kernels and the NumPy references)::

    x     (N, C, H, W)
    cols  (C*kh*kw, N*OH*OW)    row = (c*kh + i)*kw + j, column = (n*OH + y)*OW + x

so ``W.reshape(F, C*kh*kw) @ cols`` is the convolution, and the view
``cols.reshape(K, N, OH*OW).transpose(1, 0, 2)`` gives each sample's columns, whose
product with the weight is that sample's output already in NCHW order. The
convolution (:mod:`minidp.autograd.ops.conv`) unfolds a few samples at a time into a small
buffer that stays in cache while BLAS reads it. Padding is never
materialised: out-of-image taps read as zero. Heights and widths have their own
padding (``ph``, ``pw``), which the transposed convolution of the backward pass needs.

Both kernels loop over the rows of ``cols`` (a channel and a tap) outside and the images
inside, so each row is written (or read) from start to end. Images outside made every
image jump between the C*kh*kw rows, N*OH*OW elements apart: 1.1-2.2x slower on
LeNet-5's and the CIFAR models' layers (the second LeNet-5 convolution's unfolding took
a fifth of its step). col2im still adds each pixel's taps in (i, j) order, so its sums,
and their bits, are those of the other order.

The kernels index with unsigned integers: Numba checks every signed index for
wrap-around (a negative index counts from the end), and that check stops LLVM from
vectorising a copy loop (0.8 ns per element against 0.05 ns here).
"""

from __future__ import annotations

import functools
from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels import cuda
from minidp.kernels.gemm import NO_TRANS, REGION_DTYPES, ROW_MAJOR, TRANS, native
from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import c_array, first_class


def output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial output size of a convolution or pooling window along one axis."""
    return (size + 2 * padding - kernel) // stride + 1


@numba.njit(cache=True, nogil=True)
def _valid_range(out_size, in_size, tap, stride, pad):  # pragma: no cover - compiled
    """Outputs o in [lo, hi) whose input o*stride + tap - pad lies inside the image."""
    lo = min(out_size, max(0, -((tap - pad) // stride)))
    hi = min(out_size, max(lo, -((tap - pad - in_size) // stride)))
    return lo, hi


@numba.njit(cache=True, nogil=True)
def _zero_column(dst, first, stride, count):  # pragma: no cover - compiled
    step = np.uint64(stride)
    for k in range(count):
        dst[first + np.uint64(k) * step] = 0


@numba.njit(cache=True, nogil=True)
def _im2col_kernel(x, kh, kw, stride, ph, pw, cols):  # pragma: no cover - compiled
    n_img, n_ch, h, w = x.shape
    oh = (h + 2 * ph - kh) // stride + 1
    ow = (w + 2 * pw - kw) // stride + 1
    size = oh * ow
    src, dst = x.reshape(-1), cols.reshape(-1)
    for c in range(n_ch):
        for i in range(kh):
            y_lo, y_hi = _valid_range(oh, h, i, stride, ph)
            for j in range(kw):
                row = (c * kh + i) * kw + j
                x_lo, x_hi = _valid_range(ow, w, j, stride, pw)
                for n in range(n_img):  # inside: the row is written from start to end
                    image = (n * n_ch + c) * h * w
                    o = np.uint64((row * n_img + n) * size)
                    for k in range(y_lo * ow):
                        dst[o + np.uint64(k)] = 0
                    for k in range(y_hi * ow, size):
                        dst[o + np.uint64(k)] = 0
                    if stride == 1 and ow == w:
                        # The row is the image shifted by (i - ph, j - pw): one long copy,
                        # then the columns that wrapped around from the next row are zeroed.
                        shift = (i - ph) * w + j - pw
                        a, b = max(y_lo * ow, -shift), min(y_hi * ow, h * w - shift)
                        s0, o0 = np.uint64(image + a + shift), o + np.uint64(a)
                        for k in range(b - a):
                            dst[o0 + np.uint64(k)] = src[s0 + np.uint64(k)]
                        # column by column: a loop over rows per column is a plain strided
                        # store; a loop over the 0-2 columns per row costs a vector set-up each
                        for xo in range(x_lo):
                            _zero_column(dst, o + np.uint64(y_lo * ow + xo), ow, y_hi - y_lo)
                        for xo in range(x_hi, ow):
                            _zero_column(dst, o + np.uint64(y_lo * ow + xo), ow, y_hi - y_lo)
                        continue
                    step = np.uint64(stride)
                    for y in range(y_lo, y_hi):
                        o0 = o + np.uint64(y * ow)
                        for xo in range(x_lo):
                            dst[o0 + np.uint64(xo)] = 0
                        s0 = np.uint64(image + (y * stride + i - ph) * w + x_lo * stride + j - pw)
                        o1 = o0 + np.uint64(x_lo)
                        for k in range(x_hi - x_lo):
                            dst[o1 + np.uint64(k)] = src[s0 + np.uint64(k) * step]
                        for xo in range(x_hi, ow):
                            dst[o0 + np.uint64(xo)] = 0


@numba.njit(cache=True, nogil=True)
def _col2im_kernel(cols, kh, kw, stride, ph, pw, dx):  # pragma: no cover - compiled
    n_img, n_ch, h, w = dx.shape
    oh = (h + 2 * ph - kh) // stride + 1
    ow = (w + 2 * pw - kw) // stride + 1
    size = oh * ow
    src, dst = cols.reshape(-1), dx.reshape(-1)
    dst[:] = 0
    step = np.uint64(stride)
    for c in range(n_ch):
        for i in range(kh):
            y_lo, y_hi = _valid_range(oh, h, i, stride, ph)
            for j in range(kw):
                row = (c * kh + i) * kw + j
                x_lo, x_hi = _valid_range(ow, w, j, stride, pw)
                for n in range(n_img):  # inside: the row is read from start to end
                    image = (n * n_ch + c) * h * w
                    for y in range(y_lo, y_hi):
                        o0 = np.uint64((row * n_img + n) * size + y * ow + x_lo)
                        d0 = np.uint64(image + (y * stride + i - ph) * w + x_lo * stride + j - pw)
                        for k in range(x_hi - x_lo):
                            dst[d0 + np.uint64(k) * step] += src[o0 + np.uint64(k)]


# A chunk of the im2col convolution (minidp.autograd.ops.conv) as one kernel, which the
# region kernels below run on the rank's threads with no Python in between
# (minidp.kernels.gemm says why). ``gemm`` is NumPy's cblas_?gemm, called as NumPy's
# matmul calls it for the products conv.py writes in Python (the same bits); ``cols`` a
# thread's buffer.

@numba.njit(cache=True, nogil=True)
def _product(gemm, trans_a, trans_b, a, b, c):  # pragma: no cover - compiled
    """C = op(a) @ op(b) of C-contiguous a, b, c: ``x.T`` of NumPy reaches BLAS as x, TRANS."""
    m, n = c.shape
    k = a.shape[0] if trans_a == TRANS else a.shape[1]
    gemm(ROW_MAJOR, trans_a, trans_b, m, n, k, c.dtype.type(1), a.ctypes.data, a.shape[1],
         b.ctypes.data, b.shape[1], c.dtype.type(0), c.ctypes.data, n)


@numba.njit(cache=True, nogil=True)
def _per_sample_products(gemm, a, cols, out):  # pragma: no cover - compiled
    """out[n] = a @ (sample n's columns): NumPy's matmul of a with ``per_sample(cols)``.

    Sample n's (K, L) block of the (K, nb*L) columns starts at column n*L, its rows nb*L
    apart: what NumPy passes BLAS for each matrix of that stacked view.
    """
    nb, m, length = out.shape
    src, dst = cols.reshape(-1), out.reshape(-1)
    for n in range(nb):
        gemm(ROW_MAJOR, NO_TRANS, NO_TRANS, m, length, a.shape[1], out.dtype.type(1),
             a.ctypes.data, a.shape[1], src[n * length:].ctypes.data, nb * length,
             out.dtype.type(0), dst[n * m * length:].ctypes.data, length)


@numba.njit(cache=True, nogil=True)
def _by_channel(a):  # pragma: no cover - compiled
    """(C, nb*L) copy of a chunk (nb, C, L): conv.py's ``by_channel``."""
    nb, c, length = a.shape
    out = np.empty((c, nb * length), a.dtype)
    for ch in range(c):
        for n in range(nb):
            out[ch, n * length:(n + 1) * length] = a[n, ch]
    return out


@numba.njit(cache=True, nogil=True)
def _forward_chunk_kernel(gemm, x, w2, bias, kh, kw, stride, ph, pw, cols,
                          out):  # pragma: no cover - compiled
    """Out (nb, F, OH*OW) = w2 @ im2col(x) per sample, plus bias (F,) (empty: none)."""
    _im2col_kernel(x, kh, kw, stride, ph, pw, cols)
    _per_sample_products(gemm, w2, cols, out)
    if bias.size:
        for n in range(out.shape[0]):
            for f in range(out.shape[1]):
                out[n, f] += bias[f]


@numba.njit(cache=True, nogil=True)
def _backward_chunk_kernel(gemm, x, g3, w2, kh, kw, stride, ph, pw, cols, want_w, gx,
                           part):  # pragma: no cover - compiled
    """DW' = im2col(x) @ g.T into ``part`` (if ``want_w``) and gx = col2im(w2.T @ g).

    g3 is the chunk's output gradient (nb, F, OH*OW); gx (nb, C, H, W), empty when the
    input gradient is not wanted; part (C*kh*kw, F).
    """
    g2 = _by_channel(g3)
    if want_w:
        _im2col_kernel(x, kh, kw, stride, ph, pw, cols)
        _product(gemm, NO_TRANS, TRANS, cols, g2, part)
    if gx.size:
        taps = np.empty((w2.shape[1], g2.shape[1]), g3.dtype)
        _product(gemm, TRANS, NO_TRANS, w2, g2, taps)
        _col2im_kernel(taps, kh, kw, stride, ph, pw, gx)


# A region's chunks on the rank's threads in one parallel call (Plan.run_kernel): thread
# t runs the chunks starts[t]:starts[t + 1] of ``bounds``, each as one call of ``chunk``
# (the chunk kernel above, through its address: threaded.first_class), into row t of
# ``cols``.

@numba.njit(cache=True, nogil=True, parallel=True)
def _forward_region_kernel(bounds, starts, chunk, gemm, x, w2, bias, kh, kw, stride, ph, pw,
                           cols, out):  # pragma: no cover - compiled
    rows, length = w2.shape[1], out.shape[2]
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            columns = (hi - lo) * length
            chunk(gemm, x[lo:hi], w2, bias, kh, kw, stride, ph, pw,
                  cols[t, :rows * columns].reshape(rows, columns), out[lo:hi])


@numba.njit(cache=True, nogil=True, parallel=True)
def _backward_region_kernel(bounds, starts, chunk, gemm, x, g3, w2, kh, kw, stride, ph, pw,
                            cols, want_w, gx, parts):  # pragma: no cover - compiled
    rows, length = w2.shape[1], g3.shape[2]
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            columns = (hi - lo) * length
            chunk(gemm, x[lo:hi], g3[lo:hi], w2, kh, kw, stride, ph, pw,
                  cols[t, :rows * columns].reshape(rows, columns), want_w,
                  gx[lo:hi] if gx.size else gx, parts[i])


@functools.cache
def _regions(dtype: Any) -> tuple:
    """The im2col (forward, backward) region and chunk kernels, as ``first_class`` gives them."""
    a, i = functools.partial(c_array, dtype), numba.types.int64
    geometry = (i, i, i, i, i)
    gemm, want_w = numba.typeof(native(dtype)), numba.types.boolean
    forward = (gemm, a(4), a(2), a(1), *geometry, a(2), a(3))  # region: the same
    backward = (gemm, a(4), a(3), a(2), *geometry, a(2), want_w, a(4))  # then part / parts
    return (first_class(_forward_region_kernel, _forward_chunk_kernel, forward, forward),
            first_class(_backward_region_kernel, _backward_chunk_kernel, backward + (a(2),),
                        backward + (a(3),)))


def forward_region(gemm: Any, x: Any, w2: Any, bias: Any, geometry: tuple, plan: Any,
                   cols: Any, out: Any) -> None:
    """Every chunk of ``plan`` forward, on its threads in one call.

    ``x`` and ``out`` are the whole batch's; ``cols`` (plan.threads, size) holds one
    thread's buffer a row, of at least C*kh*kw * (samples of the largest chunk)*OH*OW
    elements.
    """
    n, f = out.shape[0], out.shape[1]
    bias = np.empty(0, out.dtype) if bias is None else bias.reshape(f)
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(x.dtype)[0]
    plan.run_kernel(kernel, chunk, gemm, x, w2, bias, *geometry, cols,
                    out.reshape(n, f, -1))


def backward_region(gemm: Any, x: Any, g: Any, w2: Any, geometry: tuple, plan: Any,
                    cols: Any, want_w: bool, gx: Any) -> Any:
    """Every chunk of ``plan`` backward, on its threads in one call.

    Returns the chunks' dW' parts (chunks, C*kh*kw, F), in chunk order, or None.
    """
    n, f = g.shape[0], g.shape[1]
    gx = np.empty((0, 0, 0, 0), g.dtype) if gx is None else gx
    parts = np.empty((len(plan.bounds), w2.shape[1], f), g.dtype)
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(g.dtype)[1]
    plan.run_kernel(kernel, chunk, gemm, x, g.reshape(n, f, -1), w2,
                    *geometry, cols, want_w, gx, parts)
    return parts if want_w else None


def _windows(x: Any, kh: int, kw: int, stride: int, ph: int, pw: int) -> Any:
    """Strided view (C, kh, kw, N, OH, OW) of the zero-padded x."""
    xp = array_module(x)
    n, c, h, w = x.shape
    oh, ow = output_size(h, kh, stride, ph), output_size(w, kw, stride, pw)
    if ph or pw:
        x = xp.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    s0, s1, s2, s3 = x.strides
    return xp.lib.stride_tricks.as_strided(
        x, shape=(c, kh, kw, n, oh, ow), strides=(s1, s2, s3, s0, s2 * stride, s3 * stride))


def im2col_reference(x: Any, kh: int, kw: int, stride: int, ph: int, pw: int) -> Any:
    """NumPy/CuPy im2col through a strided window view (one copy): (C*kh*kw, N*OH*OW)."""
    win = _windows(x, kh, kw, stride, ph, pw)
    c, _, _, n, oh, ow = win.shape
    return array_module(x).ascontiguousarray(win).reshape(c * kh * kw, n * oh * ow)


def col2im_reference(cols: Any, x_shape: tuple, kh: int, kw: int, stride: int, ph: int,
                     pw: int) -> Any:
    """NumPy/CuPy col2im: one strided add per kernel tap (kh*kw vectorised adds)."""
    xp = array_module(cols)
    n, c, h, w = x_shape
    oh, ow = output_size(h, kh, stride, ph), output_size(w, kw, stride, pw)
    dxp = xp.zeros((n, c, h + 2 * ph, w + 2 * pw), dtype=cols.dtype)
    taps = cols.reshape(c, kh, kw, n, oh, ow)
    for i in range(kh):
        for j in range(kw):
            dxp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += \
                taps[:, i, j].transpose(1, 0, 2, 3)
    return dxp[:, :, ph:ph + h, pw:pw + w]


def im2col(x: Any, kh: int, kw: int, stride: int, ph: int, pw: int, out: Any = None) -> Any:
    """Unfold ``x`` (N, C, H, W) into columns (C*kh*kw, N*OH*OW), into ``out`` if given."""
    if cuda.applies(x) and (out is None or cuda.applies(out)):
        n, c, h, w = x.shape
        oh, ow = output_size(h, kh, stride, ph), output_size(w, kw, stride, pw)
        out = array_module(x).empty((c * kh * kw, n * oh * ow), x.dtype) if out is None else out
        return cuda.im2col(x, kh, kw, stride, ph, pw, oh, ow, out)
    if not use_kernels(x):
        cols = im2col_reference(x, kh, kw, stride, ph, pw)
        if out is None:
            return cols
        out[...] = cols
        return out
    ensure_compiled()
    n, c, h, w = x.shape
    shape = (c * kh * kw, n * output_size(h, kh, stride, ph) * output_size(w, kw, stride, pw))
    out = np.empty(shape, dtype=x.dtype) if out is None else out
    _im2col_kernel(np.ascontiguousarray(x), kh, kw, stride, ph, pw, out)
    return out


def col2im(cols: Any, out: Any, kh: int, kw: int, stride: int, ph: int, pw: int) -> Any:
    """Fold columns (C*kh*kw, N*OH*OW) into ``out`` (N, C, H, W), summing overlapping taps."""
    if cuda.applies(cols, out):
        h, w = out.shape[2], out.shape[3]
        return cuda.col2im(cols, out, kh, kw, stride, ph, pw, output_size(h, kh, stride, ph),
                           output_size(w, kw, stride, pw))
    if not use_kernels(cols, out) or not out.flags.c_contiguous:
        out[...] = col2im_reference(cols, out.shape, kh, kw, stride, ph, pw)
        return out
    ensure_compiled()
    _col2im_kernel(np.ascontiguousarray(cols), kh, kw, stride, ph, pw, out)
    return out


@register_warmup
def _warm(dtype: type) -> None:
    x = np.zeros((1, 1, 3, 3), dtype=dtype)
    cols = np.empty((4, 4), dtype=dtype)
    _im2col_kernel(x, 2, 2, 1, 0, 0, cols)
    _col2im_kernel(cols, 2, 2, 1, 0, 0, x)


@register_parallel_warmup
def _warm_chunks(dtype: type) -> None:
    if dtype in REGION_DTYPES and native(dtype) is not None:
        _regions(np.dtype(dtype))
