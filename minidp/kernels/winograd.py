"""Winograd F(2x2, 3x3) transforms: a 3x3 convolution (stride 1, padding 1) in 4x4 tiles.

Each 2x2 block of outputs is computed from a 4x4 input tile with 16 products per
(input, output) channel pair instead of 36 (Lavin & Gray, "Fast Algorithms for
Convolutional Neural Networks", 2016)::

    Y = A^T [ (G w G^T) . (B^T d B) ] A          (. elementwise, summed over channels)

so the 16 tile positions become 16 independent GEMMs, (F, C) @ (C, tiles): 2.25 times
fewer multiply-adds than im2col + GEMM, on matrices that are a quarter of the
columns' size. The transforms only add and subtract (B, A) or halve (G), so float32
rounding stays within a few ulps.

Layouts, for a chunk of N samples with th x tw tiles each (th = ceil(H/2)):

    x   (N, C, H, W)        V  (16, C, T)    T = N*th*tw, t = (n*th + ty)*tw + tx
    out (N, F, H, W)        M  (16, F, T)    position p = 4*xi + nu of the 4x4 tile

Backward stays in the transformed domain: ``dM = A dY A^T`` (:func:`output_grad`),
``dV = U^T dM`` and ``dx = B dV B^T`` summed over overlapping tiles
(:func:`input_grad`); ``dU = sum_t dM V^T`` and ``dw = G^T dU G``.

The kernels work tile by tile in scalar code over a zero-padded copy of each image:
vectorising across the 8-32 tiles of a row cost more in loop set-up than it saved.
Consecutive planes of a buffer (:func:`plane_buffer`) are C*T + :data:`PLANE_PAD`
elements apart: C*T is usually a multiple of 1024 (4 KiB of float32), and then the
16 stores of one tile all fall into the same set of the L1 cache; a transform ran
4-5 times slower without the pad.
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

# Y = A^T M A, V = B^T d B, U = G w G^T
B_T = np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]], dtype=np.float64)
A_T = np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64)


def tiles(h: int, w: int) -> tuple[int, int]:
    """Tiles (th, tw) covering an h x w output with 2x2 blocks."""
    return (h + 1) // 2, (w + 1) // 2


@numba.njit(cache=True, nogil=True, inline="always")
def _bt(d0, d1, d2, d3):  # pragma: no cover - compiled
    """B^T d for one column (or row) of a 4x4 tile."""
    return d0 - d2, d1 + d2, d2 - d1, d1 - d3


@numba.njit(cache=True, nogil=True, inline="always")
def _b(v0, v1, v2, v3):  # pragma: no cover - compiled
    """B v: the transpose of :func:`_bt`."""
    return v0, v1 - v2 + v3, v1 + v2 - v0, -v3


@numba.njit(cache=True, nogil=True, inline="always")
def _at(m0, m1, m2, m3):  # pragma: no cover - compiled
    """A^T m for one column of a 4x4 tile: the two output rows."""
    return m0 + m1 + m2, m1 - m2 - m3


@numba.njit(cache=True, nogil=True)
def _input_kernel(x, v):  # pragma: no cover - compiled
    n_img, n_ch, h, w = x.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    count = n_img * th * tw
    wp = 2 * tw + 2
    src, dst = x.reshape(-1), v.reshape(-1)
    padded = np.zeros((2 * th + 2) * wp, dtype=x.dtype)  # the image inside a zero border
    plane, row = np.uint64(v.shape[1]), np.uint64(wp)
    for n in range(n_img):
        for c in range(n_ch):
            image = (n * n_ch + c) * h * w
            for y in range(h):
                o, s = np.uint64((y + 1) * wp + 1), np.uint64(image + y * w)
                for k in range(w):
                    padded[o + np.uint64(k)] = src[s + np.uint64(k)]
            for ty in range(th):
                first = np.uint64(c * count + (n * th + ty) * tw)
                for tx in range(tw):
                    b = np.uint64(2 * ty * wp + 2 * tx)
                    # B^T d down the four columns, then along each resulting row
                    cols = (_bt(padded[b], padded[b + row], padded[b + 2 * row],
                                padded[b + 3 * row]),
                            _bt(padded[b + 1], padded[b + row + 1], padded[b + 2 * row + 1],
                                padded[b + 3 * row + 1]),
                            _bt(padded[b + 2], padded[b + row + 2], padded[b + 2 * row + 2],
                                padded[b + 3 * row + 2]),
                            _bt(padded[b + 3], padded[b + row + 3], padded[b + 2 * row + 3],
                                padded[b + 3 * row + 3]))
                    t = first + np.uint64(tx)
                    for xi in range(4):
                        r = _bt(cols[0][xi], cols[1][xi], cols[2][xi], cols[3][xi])
                        for nu in range(4):
                            dst[t] = r[nu]
                            t += plane


@numba.njit(cache=True, nogil=True)
def _output_kernel(m, out):  # pragma: no cover - compiled
    n_img, n_f, h, w = out.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    count = n_img * th * tw
    src, dst = m.reshape(-1), out.reshape(-1)
    plane = np.uint64(m.shape[1])
    for n in range(n_img):
        for f in range(n_f):
            image = (n * n_f + f) * h * w
            for ty in range(th):
                first = np.uint64(f * count + (n * th + ty) * tw)
                for tx in range(tw):
                    t = first + np.uint64(tx)
                    # A^T M down the four columns (position nu, nu + 4, ...), then A along rows
                    c0 = _at(src[t], src[t + 4 * plane], src[t + 8 * plane], src[t + 12 * plane])
                    c1 = _at(src[t + plane], src[t + 5 * plane], src[t + 9 * plane],
                             src[t + 13 * plane])
                    c2 = _at(src[t + 2 * plane], src[t + 6 * plane], src[t + 10 * plane],
                             src[t + 14 * plane])
                    c3 = _at(src[t + 3 * plane], src[t + 7 * plane], src[t + 11 * plane],
                             src[t + 15 * plane])
                    top0, top1, top2, top3 = c0[0], c1[0], c2[0], c3[0]
                    bot0, bot1, bot2, bot3 = c0[1], c1[1], c2[1], c3[1]
                    y, x0 = 2 * ty, 2 * tx
                    o = np.uint64(image + y * w + x0)
                    dst[o] = top0 + top1 + top2
                    if x0 + 1 < w:
                        dst[o + 1] = top1 - top2 - top3
                    if y + 1 < h:
                        o += np.uint64(w)
                        dst[o] = bot0 + bot1 + bot2
                        if x0 + 1 < w:
                            dst[o + 1] = bot1 - bot2 - bot3


@numba.njit(cache=True, nogil=True)
def _output_grad_kernel(g, dm):  # pragma: no cover - compiled
    n_img, n_f, h, w = g.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    count = n_img * th * tw
    src, dst = g.reshape(-1), dm.reshape(-1)
    plane = np.uint64(dm.shape[1])
    zero = np.zeros(1, dtype=g.dtype)[0]  # odd sizes: the block's missing values
    for n in range(n_img):
        for f in range(n_f):
            image = (n * n_f + f) * h * w
            for ty in range(th):
                first = np.uint64(f * count + (n * th + ty) * tw)
                for tx in range(tw):
                    y, x0 = 2 * ty, 2 * tx
                    o = np.uint64(image + y * w + x0)
                    right, below = x0 + 1 < w, y + 1 < h
                    y00 = src[o]
                    y01 = src[o + 1] if right else zero
                    y10 = src[o + np.uint64(w)] if below else zero
                    y11 = src[o + np.uint64(w) + 1] if right and below else zero
                    # dY A^T per row, then A (.) per column: dM = A dY A^T
                    q0 = (y00, y00 + y01, y00 - y01, -y01)
                    q1 = (y10, y10 + y11, y10 - y11, -y11)
                    t = first + np.uint64(tx)
                    for nu in range(4):
                        i = t + np.uint64(nu) * plane
                        dst[i] = q0[nu]
                        dst[i + 4 * plane] = q0[nu] + q1[nu]
                        dst[i + 8 * plane] = q0[nu] - q1[nu]
                        dst[i + 12 * plane] = -q1[nu]


@numba.njit(cache=True, nogil=True)
def _input_grad_kernel(dv, dx):  # pragma: no cover - compiled
    n_img, n_ch, h, w = dx.shape
    th, tw = (h + 1) // 2, (w + 1) // 2
    count = n_img * th * tw
    wp = 2 * tw + 2
    src, dst = dv.reshape(-1), dx.reshape(-1)
    padded = np.empty((2 * th + 2) * wp, dtype=dx.dtype)  # overlapping tiles add up here
    plane, row = np.uint64(dv.shape[1]), np.uint64(wp)
    for n in range(n_img):
        for c in range(n_ch):
            padded[:] = 0
            for ty in range(th):
                first = np.uint64(c * count + (n * th + ty) * tw)
                for tx in range(tw):
                    t = first + np.uint64(tx)
                    # B dV down the four columns (position nu, nu + 4, ...), then along rows
                    cols = (_b(src[t], src[t + 4 * plane], src[t + 8 * plane],
                               src[t + 12 * plane]),
                            _b(src[t + plane], src[t + 5 * plane], src[t + 9 * plane],
                               src[t + 13 * plane]),
                            _b(src[t + 2 * plane], src[t + 6 * plane], src[t + 10 * plane],
                               src[t + 14 * plane]),
                            _b(src[t + 3 * plane], src[t + 7 * plane], src[t + 11 * plane],
                               src[t + 15 * plane]))
                    b = np.uint64(2 * ty * wp + 2 * tx)
                    for k in range(4):
                        r = _b(cols[0][k], cols[1][k], cols[2][k], cols[3][k])
                        padded[b] += r[0]
                        padded[b + 1] += r[1]
                        padded[b + 2] += r[2]
                        padded[b + 3] += r[3]
                        b += row
            image = (n * n_ch + c) * h * w
            for y in range(h):
                o, s = np.uint64(image + y * w), np.uint64((y + 1) * wp + 1)
                for k in range(w):
                    dst[o + np.uint64(k)] = padded[s + np.uint64(k)]


# The weights' transforms, U = G w G^T before the forward products and dw = G^T dU G
# after the backward ones, once per layer and step. As NumPy code (the references
# below) each was two products 3 or 4 wide and the transposing copies around them:
# 4.9 ms of a ResNet-20 step, on one thread at any thread count, mostly BLAS's set-up of
# 20 tiny products. Here each filter's 4x4 (or 3x3) result is written out from G's
# entries (0, 1/2, -1/2, 1). Each value is what those products compute: a sum from
# zero of exact terms, in the products' order (BLAS's kernels add them so), where a
# term with a zero coefficient changes nothing once the sum has begun (for finite
# weights). With OpenBLAS the bits are the references' (tests/unit/test_kernels.py
# checks them against the references and an einsum in float64).

@numba.njit(cache=True, nogil=True, inline="always")
def _g(zero, half, a0, a1, a2):  # pragma: no cover - compiled
    """G a for three values a (a column of w, or a row of w G^T): four values."""
    return (zero + a0, zero + half * a0 + half * a1 + half * a2,
            zero + half * a0 - half * a1 + half * a2, zero + a2)


@numba.njit(cache=True, nogil=True, inline="always")
def _gt(zero, half, b0, b1, b2, b3):  # pragma: no cover - compiled
    """G^T b for four values b (a column of dU, or a row of dU G): three values."""
    return (zero + b0 + half * b1 + half * b2, zero + half * b1 - half * b2,
            zero + half * b1 + half * b2 + b3)


@numba.njit(cache=True, nogil=True)
def _weight_transform_kernel(w, u):  # pragma: no cover - compiled
    """U[4*xi + nu, f, c] = (G w[f, c] G^T)[xi, nu] of w (F, C, 3, 3)."""
    n_f, n_c = w.shape[0], w.shape[1]
    zero, half = u.dtype.type(0), u.dtype.type(0.5)
    for f in range(n_f):
        for c in range(n_c):
            # w G^T: row i of w times G^T is G applied to that row
            r0 = _g(zero, half, w[f, c, 0, 0], w[f, c, 0, 1], w[f, c, 0, 2])
            r1 = _g(zero, half, w[f, c, 1, 0], w[f, c, 1, 1], w[f, c, 1, 2])
            r2 = _g(zero, half, w[f, c, 2, 0], w[f, c, 2, 1], w[f, c, 2, 2])
            # G (w G^T), column nu: position 4*xi + nu holds its row xi
            for nu in range(4):
                col = _g(zero, half, r0[nu], r1[nu], r2[nu])
                u[nu, f, c], u[4 + nu, f, c] = col[0], col[1]
                u[8 + nu, f, c], u[12 + nu, f, c] = col[2], col[3]


@numba.njit(cache=True, nogil=True)
def _weight_grad_kernel(du, dw):  # pragma: no cover - compiled
    """Dw[f, c] = G^T dU[:, c, f] G (3x3) of dU (16, C, F), position p = 4*xi + nu."""
    n_c, n_f = du.shape[1], du.shape[2]
    zero, half = dw.dtype.type(0), dw.dtype.type(0.5)
    for c in range(n_c):
        for f in range(n_f):
            # dU G: row xi of dU times G is G^T applied to that row
            r0 = _gt(zero, half, du[0, c, f], du[1, c, f], du[2, c, f], du[3, c, f])
            r1 = _gt(zero, half, du[4, c, f], du[5, c, f], du[6, c, f], du[7, c, f])
            r2 = _gt(zero, half, du[8, c, f], du[9, c, f], du[10, c, f], du[11, c, f])
            r3 = _gt(zero, half, du[12, c, f], du[13, c, f], du[14, c, f], du[15, c, f])
            for j in range(3):  # G^T (dU G), column j
                col = _gt(zero, half, r0[j], r1[j], r2[j], r3[j])
                for i in range(3):
                    dw[f, c, i, j] = col[i]


PLANE_PAD = 16  # elements between planes: see the module docstring


# A chunk of the Winograd convolution (minidp.autograd.ops.winograd) as one kernel, which
# the region kernels below run on the rank's threads with no Python in between
# (minidp.kernels.gemm says why). ``gemm`` is NumPy's cblas_?gemm, called as NumPy's
# stacked matmul calls it for the products winograd.py writes in Python (the same
# bits): once per plane.

@numba.njit(cache=True, nogil=True)
def _plane_products(gemm, trans_a, trans_b, m, n, k, a, lda, b, ldb, c,
                    ldc):  # pragma: no cover - compiled
    """c[p] = op(a[p]) @ op(b[p]) for the 16 planes p, each row-major from its start.

    ``a``, ``b``, ``c`` are (16, ...) arrays: plane buffers or (16, rows, columns) ones.
    """
    for p in range(16):
        gemm(ROW_MAJOR, trans_a, trans_b, m, n, k, c.dtype.type(1), a[p].ctypes.data, lda,
             b[p].ctypes.data, ldb, c.dtype.type(0), c[p].ctypes.data, ldc)


@numba.njit(cache=True, nogil=True)
def _forward_chunk_kernel(gemm, x, u, bias, v, m, out):  # pragma: no cover - compiled
    """V = B^T x B (into v), M = U @ V, out = A^T M A (+ bias (F,); empty: none)."""
    n, c, h, w = x.shape
    f = u.shape[1]
    count = n * ((h + 1) // 2) * ((w + 1) // 2)
    _input_kernel(x, v)
    _plane_products(gemm, NO_TRANS, NO_TRANS, f, count, c, u, c, v, count, m, count)
    _output_kernel(m, out)
    if bias.size:
        for i in range(n):
            for ch in range(f):
                out[i, ch] += bias[ch]


@numba.njit(cache=True, nogil=True)
def _backward_chunk_kernel(gemm, g, u, v, dm, dv, want_w, gx,
                           part):  # pragma: no cover - compiled
    """DM = A g A^T; gx = B (U^T @ dM) B^T (gx empty: not wanted); dU part = V @ dM^T."""
    n, f, h, w = g.shape
    c = u.shape[2]
    count = n * ((h + 1) // 2) * ((w + 1) // 2)
    _output_grad_kernel(g, dm)
    if gx.size:
        _plane_products(gemm, TRANS, NO_TRANS, c, count, f, u, c, dm, count, dv, count)
        _input_grad_kernel(dv, gx)
    if want_w:  # part: (16, C, F)
        _plane_products(gemm, NO_TRANS, TRANS, c, f, count, v, count, dm, count, part, f)


# A region's chunks on the rank's threads in one parallel call (Plan.run_kernel): thread
# t runs the chunks starts[t]:starts[t + 1] of ``bounds``, each as one call of ``chunk``
# (the chunk kernel above, through its address: threaded.first_class), into its plane
# buffers m[t] (dm[t], dv[t]); chunk i's planes V are v[i].

@numba.njit(cache=True, nogil=True, parallel=True)
def _forward_region_kernel(bounds, starts, chunk, gemm, x, u, bias, v, m,
                           out):  # pragma: no cover - compiled
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            chunk(gemm, x[lo:hi], u, bias, v[i], m[t], out[lo:hi])


@numba.njit(cache=True, nogil=True, parallel=True)
def _backward_region_kernel(bounds, starts, chunk, gemm, g, u, v, dm, dv, want_w, gx,
                            parts):  # pragma: no cover - compiled
    for t in numba.prange(starts.size - 1):
        for i in range(starts[t], starts[t + 1]):
            lo, hi = bounds[i, 0], bounds[i, 1]
            chunk(gemm, g[lo:hi], u, v[i], dm[t], dv[t], want_w, gx[lo:hi] if gx.size else gx,
                  parts[i])


@functools.cache
def _regions(dtype: Any) -> tuple:
    """The Winograd (forward, backward) region and chunk kernels, as ``first_class`` gives them."""
    a = functools.partial(c_array, dtype)
    gemm, want_w = numba.typeof(native(dtype)), numba.types.boolean
    # a chunk's planes v, m (dm, dv) and part are one thread's or chunk's row of the
    # region's arrays: one dimension more there
    return (first_class(_forward_region_kernel, _forward_chunk_kernel,
                        (gemm, a(4), a(3), a(1), a(2), a(2), a(4)),
                        (gemm, a(4), a(3), a(1), a(3), a(3), a(4))),
            first_class(_backward_region_kernel, _backward_chunk_kernel,
                        (gemm, a(4), a(3), a(2), a(2), a(2), want_w, a(4), a(3)),
                        (gemm, a(4), a(3), a(3), a(3), a(3), want_w, a(4), a(4))))


def forward_region(gemm: Any, x: Any, u: Any, bias: Any, plan: Any, m: Any, out: Any) -> Any:
    """Every chunk of ``plan`` forward on its threads in one call; returns the chunks' V.

    ``x`` (N, C, H, W) and ``out`` (N, F, H, W) are the whole batch's, ``u`` is U (16, F,
    C), ``bias`` (F,) or None, ``m`` (plan.threads, 16, size) one thread's plane buffer
    for M a row. The planes V come back as (chunks, 16, size): chunk i's plane buffer is
    row i, as :func:`planes` reads it.
    """
    bias = np.empty(0, out.dtype) if bias is None else bias.reshape(out.shape[1])
    th, tw = tiles(*x.shape[2:])
    v = plane_buffer(x.shape[1], plan.largest * th * tw, x.dtype, stacked=len(plan.bounds))
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(x.dtype)[0]
    plan.run_kernel(kernel, chunk, gemm, x, u, bias, v, m, out)
    return v


def backward_region(gemm: Any, g: Any, u: Any, v: Any, plan: Any, dm: Any, dv: Any,
                    want_w: bool, gx: Any) -> Any:
    """Every chunk of ``plan`` backward on its threads in one call; returns the dU parts.

    ``g`` is the whole batch's output gradient, ``u`` U (16, F, C) (not transposed), ``v``
    what :func:`forward_region` returned, ``dm`` and ``dv`` (plan.threads, 16, size) the
    threads' plane buffers, ``gx`` the input gradient to fill, or None. The parts are
    (chunks, 16, C, F), in chunk order, or None.
    """
    gx = np.empty((0, 0, 0, 0), g.dtype) if gx is None else gx
    c, f = u.shape[2], u.shape[1]
    parts = np.empty((len(plan.bounds), 16, c, f), g.dtype)
    ensure_compiled(parallel=True)  # under the node's lock, before _regions compiles
    kernel, chunk = _regions(g.dtype)[1]
    plan.run_kernel(kernel, chunk, gemm, g, u, v, dm, dv, want_w, gx, parts)
    return parts if want_w else None


def plane_buffer(channels: int, count: int, dtype: Any, xp: Any = np,
                 stacked: int | None = None) -> Any:
    """An empty (16, channels*count + PLANE_PAD) buffer of transformed tiles.

    With ``stacked``, that many of them as one (stacked, 16, ...) array: a region
    kernel's buffers, one a thread or a chunk.
    """
    shape = (16, channels * count + PLANE_PAD)
    return xp.empty(shape if stacked is None else (stacked, *shape), dtype=dtype)


def planes(buffer: Any, channels: int, count: int) -> Any:
    """The (16, channels, count) view of a plane buffer, for the GEMMs."""
    return buffer[:, :channels * count].reshape(16, channels, count)


def _to_buffer(t: Any) -> Any:
    """(4, 4, N, C, th, tw) -> a plane buffer (16, C*N*th*tw) without padding."""
    return array_module(t).ascontiguousarray(t.transpose(0, 1, 3, 2, 4, 5)).reshape(16, -1)


def _from_buffer(buffer: Any, c: int, n: int, th: int, tw: int) -> Any:
    """Plane buffer -> (N, C, th, tw, 4, 4)."""
    return planes(buffer, c, n * th * tw).reshape(4, 4, c, n, th, tw).transpose(3, 2, 4, 5, 0, 1)


def _tile_view(a: Any, th: int, tw: int) -> Any:
    """Strided view (N, C, th, tw, 4, 4) of overlapping 4x4 tiles with stride 2."""
    s0, s1, s2, s3 = a.strides
    return array_module(a).lib.stride_tricks.as_strided(
        a, shape=(a.shape[0], a.shape[1], th, tw, 4, 4), strides=(s0, s1, 2 * s2, 2 * s3, s2, s3))


def input_reference(x: Any) -> Any:
    """V = B^T d B of every tile of x (padding 1), in NumPy/CuPy: a plane buffer."""
    xp = array_module(x)
    _, _, h, w = x.shape
    th, tw = tiles(h, w)
    padded = xp.pad(x, ((0, 0), (0, 0), (1, 2 * th + 1 - h), (1, 2 * tw + 1 - w)))
    bt = xp.asarray(B_T, dtype=x.dtype)
    return _to_buffer(xp.einsum("ik,nctukl,jl->ijnctu", bt, _tile_view(padded, th, tw), bt,
                                optimize=True))


def output_reference(m: Any, shape: tuple) -> Any:
    """Y = A^T M A of every tile of a plane buffer, cropped to ``shape`` (N, F, H, W)."""
    xp = array_module(m)
    n, f, h, w = shape
    th, tw = tiles(h, w)
    at = xp.asarray(A_T, dtype=m.dtype)
    y = xp.einsum("ai,nftuij,bj->nftaub", at, _from_buffer(m, f, n, th, tw), at, optimize=True)
    return xp.ascontiguousarray(y.reshape(n, f, 2 * th, 2 * tw)[:, :, :h, :w])


def output_grad_reference(g: Any) -> Any:
    """The planes dM = A dY A^T of every 2x2 block of g (N, F, H, W), in NumPy/CuPy (a buffer)."""
    xp = array_module(g)
    n, f, h, w = g.shape
    th, tw = tiles(h, w)
    padded = xp.pad(g, ((0, 0), (0, 0), (0, 2 * th - h), (0, 2 * tw - w)))
    at = xp.asarray(A_T, dtype=g.dtype)
    return _to_buffer(xp.einsum("ai,nftaub,bj->ijnftu", at, padded.reshape(n, f, th, 2, tw, 2),
                                at, optimize=True))


def input_grad_reference(dv: Any, shape: tuple) -> Any:
    """The input gradient B dV B^T of every tile, overlapping tiles summed: (N, C, H, W)."""
    xp = array_module(dv)
    n, c, h, w = shape
    th, tw = tiles(h, w)
    bt = xp.asarray(B_T, dtype=dv.dtype)
    d = xp.einsum("ik,nctuij,jl->nctukl", bt, _from_buffer(dv, c, n, th, tw), bt, optimize=True)
    padded = xp.zeros((n, c, 2 * th + 2, 2 * tw + 2), dtype=dv.dtype)
    for k in range(4):
        for col in range(4):
            padded[:, :, k:k + 2 * th:2, col:col + 2 * tw:2] += d[..., k, col]
    return xp.ascontiguousarray(padded[:, :, 1:h + 1, 1:w + 1])


def weight_transform_reference(w: Any) -> Any:
    """U = G w G^T for every (f, c), in NumPy/CuPy: (16, F, C), as two plain GEMMs."""
    xp = array_module(w)
    g = xp.asarray(G, dtype=w.dtype)
    f, c = w.shape[:2]
    right = (w.reshape(f * c * 3, 3) @ g.T).reshape(f * c, 3, 4)  # w G^T
    u = right.transpose(0, 2, 1).reshape(f * c * 4, 3) @ g.T  # (G w G^T)^T per (f, c)
    return xp.ascontiguousarray(u.reshape(f, c, 4, 4).transpose(3, 2, 0, 1)).reshape(16, f, c)


def weight_grad_reference(du: Any) -> Any:
    """The weight gradient G^T dU G of dU (16, C, F), in NumPy/CuPy: (F, C, 3, 3)."""
    xp = array_module(du)
    g = xp.asarray(G, dtype=du.dtype)
    _, c, f = du.shape
    d = xp.ascontiguousarray(du.reshape(4, 4, c, f).transpose(3, 2, 0, 1))  # (F, C, 4, 4)
    right = (d.reshape(f * c * 4, 4) @ g).reshape(f * c, 4, 3)  # dU G
    dw = right.transpose(0, 2, 1).reshape(f * c * 3, 4) @ g  # (G^T dU G)^T per (f, c)
    return xp.ascontiguousarray(dw.reshape(f, c, 3, 3).transpose(0, 1, 3, 2))


def weight_transform(w: Any) -> Any:
    """The transformed weights U = G w G^T of w (F, C, 3, 3): (16, F, C)."""
    if not use_kernels(w):
        return weight_transform_reference(w)
    ensure_compiled()
    u = np.empty((16, w.shape[0], w.shape[1]), dtype=w.dtype)
    _weight_transform_kernel(np.ascontiguousarray(w), u)
    return u


def weight_grad(du: Any) -> Any:
    """The weight gradient G^T dU G of dU (16, C, F): (F, C, 3, 3)."""
    if not use_kernels(du):
        return weight_grad_reference(du)
    ensure_compiled()
    dw = np.empty((du.shape[2], du.shape[1], 3, 3), dtype=du.dtype)
    _weight_grad_kernel(np.ascontiguousarray(du), dw)
    return dw


def input_transform(x: Any, out: Any = None) -> Any:
    """The plane buffer V of x (N, C, H, W), padding 1; into ``out`` if given."""
    if not use_kernels(x):
        return input_reference(x)
    ensure_compiled()
    n, c, h, w = x.shape
    th, tw = tiles(h, w)
    out = plane_buffer(c, n * th * tw, x.dtype) if out is None else out
    _input_kernel(np.ascontiguousarray(x), out)
    return out


def output_transform(m: Any, out: Any) -> Any:
    """Write Y = A^T M A of the plane buffer ``m`` into ``out`` (N, F, H, W)."""
    if not use_kernels(m, out) or not out.flags.c_contiguous:
        out[...] = output_reference(m, out.shape)
        return out
    ensure_compiled()
    _output_kernel(m, out)
    return out


def output_grad(g: Any, out: Any = None) -> Any:
    """The plane buffer dM of the output gradient g (N, F, H, W); into ``out`` if given."""
    if not use_kernels(g):
        return output_grad_reference(g)
    ensure_compiled()
    n, f, h, w = g.shape
    th, tw = tiles(h, w)
    out = plane_buffer(f, n * th * tw, g.dtype) if out is None else out
    _output_grad_kernel(np.ascontiguousarray(g), out)
    return out


def input_grad(dv: Any, out: Any) -> Any:
    """Write dx = B dV B^T of the plane buffer dv, overlapping tiles summed, into ``out``."""
    if not use_kernels(dv, out) or not out.flags.c_contiguous:
        out[...] = input_grad_reference(dv, out.shape)
        return out
    ensure_compiled()
    _input_grad_kernel(dv, out)
    return out


@register_warmup
def _warm(dtype: type) -> None:
    x = np.zeros((1, 1, 2, 2), dtype=dtype)
    buffer = plane_buffer(1, 1, dtype)
    _input_kernel(x, buffer)
    _output_kernel(buffer, x)
    _output_grad_kernel(x, buffer)
    _input_grad_kernel(buffer, x)
    w, u = np.zeros((1, 1, 3, 3), dtype=dtype), np.zeros((16, 1, 1), dtype=dtype)
    _weight_transform_kernel(w, u)
    _weight_grad_kernel(u, w)


@register_parallel_warmup
def _warm_chunks(dtype: type) -> None:
    if dtype in REGION_DTYPES and native(dtype) is not None:
        _regions(np.dtype(dtype))
