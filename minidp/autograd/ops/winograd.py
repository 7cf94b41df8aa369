"""3x3 convolutions with stride 1 and padding 1 by Winograd F(2x2, 3x3), chunk by chunk.

ResNet-20 and the CIFAR CNN spend most of a training step in such convolutions. The
transforms of :mod:`minidp.kernels.winograd` turn each one into 16 GEMMs of
(F, C) @ (C, tiles), 2.25 times fewer multiply-adds than im2col + GEMM, and the
transformed tiles of a chunk of samples (a :class:`~minidp.kernels.threaded.Plan`'s,
made by :func:`minidp.autograd.ops.conv.plan`) stay in cache between the transform and
the GEMM::

    U = G w G^T                               (16, F, C), once per call
    per chunk:  V = B^T x B   M = U @ V   out = A^T M A (+ bias)   (V kept for backward)

    backward, per chunk:
    dM = A g A^T;   dx = B (U^T @ dM) B^T;   dU += V @ dM^T   (in chunk order)
    dw = G^T dU G

NumPy's stacked ``matmul`` runs the 16 products of a chunk in one call. With several
threads each runs its own chunks, with buffers of its own. On the Numba kernels, with
more than one thread, the whole region is one parallel kernel call
(``minidp.kernels.winograd``'s ``forward_region`` and ``backward_region``: each thread its
chunks, the steps below with NumPy's own GEMM inside, plane by plane as its stacked
matmul calls it; see :mod:`minidp.kernels.gemm`). Off the kernels (CuPy,
``NUMBA_DISABLE_JIT=1``) the transforms are NumPy/CuPy einsums over the whole batch.
"""

from __future__ import annotations

from typing import Any

from minidp.backend import array_module
from minidp.kernels import winograd as kernels
from minidp.kernels.gemm import region_gemm
from minidp.kernels.jit import use_kernels
from minidp.kernels.threaded import Plan, fold
from minidp.kernels.winograd import (
    input_grad,
    input_transform,
    output_grad,
    output_transform,
    plane_buffer,
    planes,
    tiles,
    weight_grad,
    weight_transform,
)

# Below this many input channels im2col + GEMM is faster (measured on ResNet-20's
# stages, 16 and 32 channels): the transforms cost about as much per channel as the
# (F, C) @ (C, tiles) products, which BLAS runs slowly when C and F are small.
MIN_CHANNELS = 32


def applies(x_shape: tuple, w_shape: tuple, stride: int, padding: int) -> bool:
    """Whether the convolution is one that this module computes."""
    return (w_shape[2:] == (3, 3) and stride == 1 and padding == 1
            and x_shape[1] >= MIN_CHANNELS)


def bytes_per_sample(x_shape: tuple, w_shape: tuple, itemsize: int) -> int:
    """Transformed tiles (input and output planes) of one sample, in bytes."""
    th, tw = tiles(*x_shape[2:])
    return 16 * (x_shape[1] + w_shape[0]) * th * tw * itemsize


def _buffers(a: Any, channels: int, plan: Plan, per_sample: int) -> Any:
    """A plane buffer per thread, which its chunks reuse (Nones off the kernels).

    On the kernels (threads, 16, size): thread t's plane buffer is row t, as a region
    kernel takes them.
    """
    if not use_kernels(a):
        return [None] * plan.threads
    return plane_buffer(channels, plan.largest * per_sample, a.dtype, array_module(a),
                        stacked=plan.threads)


def _product(a: Any, v: Any, v_channels: int, out_channels: int, count: int,
             buffer: Any) -> Any:
    """The 16 products a[p] @ V[p] as a plane buffer: ``buffer`` if given, else a new one.

    Off the kernels ``buffer`` is None and the result is a plain contiguous array, so
    that no result is ever written through a view (CuPy may copy on reshape).
    """
    xp = array_module(a)
    if buffer is None:
        return xp.matmul(a, planes(v, v_channels, count)).reshape(16, -1)
    xp.matmul(a, planes(v, v_channels, count), out=planes(buffer, out_channels, count))
    return buffer


def _fewest_tiles(plan: Plan, per_sample: int) -> int:
    """Tiles of the plan's smallest chunk: the products' columns, at their fewest."""
    return per_sample * min(hi - lo for lo, hi in plan.bounds)


def forward(x: Any, w: Any, bias: Any, plan: Plan) -> tuple:
    """The convolution of x (N, C, H, W) with w (F, C, 3, 3), padding 1: (N, F, H, W).

    ``bias`` is None or (F, 1, 1). Returns the output, the transformed input of every
    chunk (in chunk order), which the weight gradient needs again (4 times x's size;
    keeping it costs less than recomputing): a list of the chunks' planes from the Python
    steps, one (chunks, 16, size) array of plane buffers from the region kernel; and the
    transformed weights U (16, F, C), which the input gradient multiplies by again
    (transforming them runs on one thread: 0.17-0.19 ms for a 64 x 64 layer on the 2-core
    machine, 0.23-0.33 ms as NumPy's products).
    """
    xp = array_module(x, w)
    n, c, h, wd = x.shape
    f = w.shape[0]
    th, tw = tiles(h, wd)
    u = weight_transform(w)
    out = xp.empty((n, f, h, wd), dtype=x.dtype)
    m_buffers = _buffers(x, f, plan, th * tw)
    native = region_gemm([x, u] + ([] if bias is None else [bias]),
                         (f, c, _fewest_tiles(plan, th * tw)), plan)

    if native is not None:  # the chunks below, on the rank's threads in one kernel call
        return out, kernels.forward_region(native, x, u, bias, plan, m_buffers, out), u

    def chunk(thread: int, lo: int, hi: int) -> Any:
        v = input_transform(x[lo:hi])  # (16, C, T) planes
        m = _product(u, v, c, f, (hi - lo) * th * tw, m_buffers[thread])
        output_transform(m, out[lo:hi])
        if bias is not None:
            out[lo:hi] += bias
        return v

    return out, plan.run(chunk), u


def backward(g: Any, x: Any, u: Any, plan: Plan, inputs: Any, want_x: bool,
             want_w: bool) -> tuple:
    """Gradients (dx, dw) of :func:`forward` for the output gradient g; None where unwanted.

    ``inputs`` and ``u`` are the transformed input chunks and weights that
    :func:`forward` returned for the same ``plan`` (``inputs`` a list, or the region
    kernel's array: either is indexed by chunk).
    """
    xp = array_module(g)
    _, c, h, wd = x.shape
    f = u.shape[1]
    th, tw = tiles(h, wd)
    ut = u.transpose(0, 2, 1)  # (16, C, F)
    gx = xp.empty(x.shape, dtype=g.dtype) if want_x else None
    dm_buffers, dv_buffers = _buffers(g, f, plan, th * tw), _buffers(g, c, plan, th * tw)
    first = {lo: k for k, (lo, _) in enumerate(plan.bounds)}  # a chunk's index in inputs
    # the forward's chunks came from the region kernel (one array) or from Python (a list)
    native = (region_gemm([g, x, u], (f, c, _fewest_tiles(plan, th * tw)), plan)
              if not isinstance(inputs, list) else None)

    def chunk(thread: int, lo: int, hi: int) -> Any:
        count, v = (hi - lo) * th * tw, inputs[first[lo]]
        dm = output_grad(g[lo:hi], out=dm_buffers[thread])
        if want_x:
            input_grad(_product(ut, dm, f, c, count, dv_buffers[thread]), gx[lo:hi])
        if want_w:  # (16, C, F): small
            return xp.matmul(planes(v, c, count), planes(dm, f, count).transpose(0, 2, 1))
        return None

    if native is not None:  # the same chunks, on the rank's threads in one kernel call
        parts = kernels.backward_region(native, g, u, inputs, plan, dm_buffers, dv_buffers,
                                        want_w, gx)
    else:
        parts = plan.run(chunk)
    return gx, weight_grad(fold(parts)) if want_w else None
