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
What follows is the general path, for every other convolution, and for every convolution
on a GPU: there the batch is one chunk, unfolded by one CUDA kernel and multiplied by one
batched cuBLAS product, where the two engines' array-generic code would launch a chain of
small kernels (their transforms through ``cupy.einsum``) that left ResNet-20's step
waiting on the host (docs/benchmarks.md, "One step on a GPU").

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
result is added up (NumPy's matmul cannot accumulate into its output), in chunk order.
It is computed transposed, ``cols @ g.T``: OpenBLAS runs that orientation 10-20%
faster here. On CuPy and under ``NUMBA_DISABLE_JIT=1`` the whole batch is one chunk
(the NumPy references unfold it in one vectorised copy).

With several threads per rank, each thread takes a contiguous part of the batch and
runs the chunk loop above on it with one-thread GEMMs (:mod:`minidp.kernels.threaded`):
the loops here are written as the work of one chunk, ``chunk(thread, lo, hi)``, which
a :class:`~minidp.kernels.threaded.Plan` runs; each thread has its own buffers. On the
Numba kernels, with more than one thread, the whole region is one parallel kernel call
(``minidp.kernels.unfold``'s ``forward_region`` and ``backward_region``: each thread its
chunks, the same steps with NumPy's own GEMM inside, the same bits), with no Python and
no GIL between a thread's steps (:mod:`minidp.kernels.gemm` says why). The Python steps
below run everywhere else:
on one thread, on CuPy and the NumPy references, in float64, for the transposed
backward pass (no model here takes it), where a product has a side of 1 (NumPy
runs gemv there), and for a readonly or strided array (the region kernels are compiled
for writeable C-contiguous ones).
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.autograd.ops import rowtap, winograd
from minidp.backend import array_module, is_cupy_array
from minidp.kernels import col2im, im2col, output_size, use_kernels
from minidp.kernels import unfold as unfold_chunk
from minidp.kernels.gemm import region_gemm
from minidp.kernels.threaded import Plan, fold


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


def plan(a: Any, bytes_per_sample: int) -> Plan:
    """The chunks of the batch ``a`` and the threads that run them (one chunk off the kernels)."""
    return Plan(a.shape[0], bytes_per_sample, chunked=use_kernels(a))


def per_sample(cols: Any, n: int) -> Any:
    """View (n, K, L) of columns (K, n*L): one (K, L) matrix per sample, for a stacked matmul."""
    return cols.reshape(cols.shape[0], n, -1).transpose(1, 0, 2)


def by_channel(a: Any) -> Any:
    """Copy (C, n*L) of a chunk (n, C, L): the channels' values of every sample side by side."""
    n, c, length = a.shape
    return array_module(a).ascontiguousarray(a.transpose(1, 0, 2)).reshape(c, n * length)


class Unfolder:
    """im2col of chunks of one batch, each thread's into a buffer of its own that it reuses.

    Args:
        a: the batch (N, C, H, W), C-contiguous.
        kh, kw, stride, ph, pw: the window's geometry.

    Attributes:
        plan: the chunks and the threads that unfold them.
    """

    def __init__(self, a: Any, kh: int, kw: int, stride: int, ph: int, pw: int) -> None:
        _, c, h, w = a.shape
        self.a, self.geometry = a, (kh, kw, stride, ph, pw)
        self.rows = c * kh * kw
        self.size = output_size(h, kh, stride, ph) * output_size(w, kw, stride, pw)
        self.plan = plan(a, self.rows * self.size * a.dtype.itemsize)
        count = self.rows * self.plan.largest * self.size
        # (threads, count): one thread's buffer a row, as a region kernel takes them
        self.buffers = (array_module(a).empty((self.plan.threads, count), dtype=a.dtype)
                        if len(self.plan.bounds) > 1 else None)

    def columns(self, thread: int, lo: int, hi: int) -> Any:
        """Columns (C*kh*kw, (hi-lo)*OH*OW) of samples lo..hi, in ``thread``'s buffer."""
        out = None
        if self.buffers is not None:
            buffer = self.buffers[thread]
            out = buffer[:self.rows * (hi - lo) * self.size].reshape(self.rows, -1)
        return im2col(self.a[lo:hi], *self.geometry, out=out)


def _engine(x: Any, w: Any, stride: int, padding: int) -> Any:
    """The module that computes this convolution (winograd, rowtap), or None: unfolded.

    On a GPU always unfolded (the module docstring says why).
    """
    if is_cupy_array(x):
        return None
    for engine in (winograd, rowtap):
        if engine.applies(x.shape, w.shape, stride, padding):
            return engine
    return None


class Conv2d(Function):
    """Cross-correlation of (N, C, H, W) with (F, C, kh, kw), plus an optional bias."""

    def forward(self, x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0) -> Any:
        stride, padding = _pair_to_int(stride, "stride"), _pair_to_int(padding, "padding")
        check_conv_args(x, w, b, stride, padding)
        x = array_module(x, w).ascontiguousarray(x)
        f, _, kh, kw = w.shape
        self.x, self.w, self.geometry = x, w, (kh, kw, stride, padding)
        # the bias (only the small CNNs have one) is added to each chunk's output while
        # it is in cache: the bits of one add over the whole output afterwards
        bias = None if b is None else b.reshape(f, 1, 1)
        self.engine = _engine(x, w, stride, padding)
        if self.engine is winograd:
            self.plan = self._plan(winograd)
            out, self.planes, self.transformed_w = winograd.forward(x, w, bias, self.plan)
        elif self.engine is rowtap:
            self.plan = self._plan(rowtap)
            out = rowtap.forward(x, w, bias, self.plan)
        else:
            out = self._forward_unfolded(x, w, bias)
        return out

    def _forward_unfolded(self, x: Any, w: Any, bias: Any) -> Any:
        """im2col + GEMM (+ bias), chunk by chunk."""
        xp = array_module(x, w)
        n, _, h, wd = x.shape
        f, _, kh, kw = w.shape
        _, _, stride, padding = self.geometry
        oh, ow = output_size(h, kh, stride, padding), output_size(wd, kw, stride, padding)
        out = xp.empty((n, f, oh, ow), dtype=xp.result_type(x, w))
        out3 = out.reshape(n, f, oh * ow)
        w2 = xp.ascontiguousarray(w.reshape(f, -1))
        unfold = Unfolder(x, kh, kw, stride, padding, padding)
        native = region_gemm([x, w2] + ([] if bias is None else [bias]),
                             (f, oh * ow, w2.shape[1]), unfold.plan)

        if native is not None:  # the chunks below, on the rank's threads in one kernel call
            unfold_chunk.forward_region(native, x, w2, bias, unfold.geometry, unfold.plan,
                                        unfold.buffers, out)
            return out

        def chunk(thread: int, lo: int, hi: int) -> None:
            xp.matmul(w2, per_sample(unfold.columns(thread, lo, hi), hi - lo), out=out3[lo:hi])
            if bias is not None:
                out[lo:hi] += bias

        unfold.plan.run(chunk)
        return out

    def backward(self, g: Any) -> tuple:
        xp = array_module(g)
        g = xp.ascontiguousarray(g)
        kh, kw, stride, padding = self.geometry
        gb = g.sum(axis=(0, 2, 3)) if self.wants(2) else None
        if self.engine is winograd:
            gx, gw = winograd.backward(g, self.x, self.transformed_w, self.plan,
                                       self.planes, self.wants(0), self.wants(1))
            return gx, gw, gb
        if self.engine is rowtap:
            gx, gw = rowtap.backward(g, self.x, self.w, self.plan, self.wants(0),
                                     self.wants(1))
            return gx, gw, gb
        transposable = (stride == 1 and kh - 1 <= 2 * padding and kw - 1 <= 2 * padding
                        and padding <= min(kh, kw) - 1)
        if self.wants(0) and transposable:
            gx, gw = self._backward_transposed(g)
        else:
            gx, gw = self._backward_unfolded(g)
        return gx, gw, gb

    def _plan(self, engine: Any) -> Plan:
        """The chunks of the Winograd or row-tap engine (module), from its bytes per sample.

        The forward pass keeps it for the backward pass, whose chunks must be the same:
        Winograd's backward reads the transformed input chunks that the forward kept.
        """
        per_sample = engine.bytes_per_sample(self.x.shape, self.w.shape, self.x.dtype.itemsize)
        return plan(self.x, per_sample)

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

        def chunk(thread: int, lo: int, hi: int) -> Any:
            cols = unfold.columns(thread, lo, hi)  # (F*kh*kw, nb*H*W)
            xp.matmul(wt, per_sample(cols, hi - lo), out=gx3[lo:hi])
            return cols @ by_channel(x3[lo:hi]).T if self.wants(1) else None  # (F*kh*kw, C)

        parts = unfold.plan.run(chunk)
        gw = None
        if self.wants(1):  # (F, kh, kw, C) with the taps flipped
            gw = fold(parts).reshape(f, kh, kw, c)
            gw = xp.ascontiguousarray(gw[:, ::-1, ::-1].transpose(0, 3, 1, 2))
        return gx, gw

    def _backward_unfolded(self, g: Any) -> tuple:
        """The weight gradient from recomputed columns of x; dx = col2im(W2^T @ g), per chunk."""
        xp = array_module(g)
        kh, kw, stride, p = self.geometry
        n, f, oh, ow = g.shape
        g3, w2 = g.reshape(n, f, oh * ow), xp.ascontiguousarray(self.w.reshape(f, -1))
        unfold = Unfolder(self.x, kh, kw, stride, p, p)
        gx = xp.empty(self.x.shape, dtype=g.dtype) if self.wants(0) else None
        native = region_gemm([g, self.x, w2], (f, oh * ow, w2.shape[1]), unfold.plan)

        def chunk(thread: int, lo: int, hi: int) -> Any:
            g2 = by_channel(g3[lo:hi])  # (F, nb*OH*OW)
            part = unfold.columns(thread, lo, hi) @ g2.T if self.wants(1) else None  # (C*kh*kw, F)
            if self.wants(0):
                col2im(w2.T @ g2, gx[lo:hi], kh, kw, stride, p, p)
            return part

        if native is not None:  # the same chunks, on the rank's threads in one kernel call
            parts = unfold_chunk.backward_region(native, self.x, g, w2, unfold.geometry,
                                                 unfold.plan, unfold.buffers, self.wants(1), gx)
        else:
            parts = unfold.plan.run(chunk)
        if not self.wants(1):
            return gx, None
        return gx, xp.ascontiguousarray(fold(parts).T).reshape(self.w.shape)
