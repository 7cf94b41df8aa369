"""Fused elementwise kernels: work NumPy would do in several passes and temporaries.

* ``relu_backward``: ``g * (x > 0)`` is a boolean temporary plus a multiply; fused it
  is one read of each input and one write.
* ``sgd_update``: PyTorch's SGD step with weight decay, momentum and Nesterov over a
  flat parameter buffer, one pass instead of five::

      d = g + wd*w;  buf = m*buf + d;  w -= lr * (d + m*buf if nesterov else buf)

  With ``m == 0`` the step is ``w -= lr*d`` and ``buf`` is not touched.
* ``weighted_merge``: DASO's merge ``x = (w*x + total) / (w + P)`` in one pass where
  NumPy makes three over the parameters, with NumPy's roundings (each operation in the
  arrays' dtype, in the same order).
* ``relu_forward``: ``max(x, 0)`` with NumPy's bits (a NaN passes through, -0 gives +0),
  on the rank's threads.

Each formula is written once, as a block kernel over every element of the flat arrays it
is given. The serial kernel hands it the whole arrays; the parallel one
(:func:`minidp.kernels.threaded.spread`) runs blocks of :data:`BLOCK` elements with
``prange``, handing it views of one block each. A view, not the whole array with bounds
[lo, hi): a loop from ``lo`` indexes with a number LLVM cannot prove non-negative, so
Numba's negative-index wrap stays in the loop and it is not vectorised (the parallel SGD
step ran 5 times slower per thread than the serial one, measured, until it took views).
Every element is computed alone, so both give the same bits at any thread count.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels import cuda
from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import spread

BLOCK = 1 << 14  # elements per prange iteration: 64 KB of float32 per array, within L2


@numba.njit(cache=True, nogil=True, inline="always")
def _block(b, size):  # pragma: no cover - compiled
    """The slice of block b of an array of ``size`` elements."""
    return slice(b * BLOCK, min(size, (b + 1) * BLOCK))


@numba.njit(cache=True, nogil=True)
def _relu_forward_block(x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        v = x[i]
        out[i] = v if v > 0 or v != v else 0  # NaN passes through, as in np.maximum


@numba.njit(cache=True, nogil=True)
def _relu_backward_block(grad, x, out):  # pragma: no cover - compiled
    for i in range(x.size):
        out[i] = grad[i] if x[i] > 0 else 0


@numba.njit(cache=True, nogil=True, inline="always")
def _sgd_direction(w, g, buf, i, momentum, weight_decay, nesterov):  # pragma: no cover
    """Element i's step direction from w[i] and g[i]; advances buf[i]."""
    d = g + weight_decay * w
    if momentum != 0:
        b = momentum * buf[i] + d
        buf[i] = b
        d = d + momentum * b if nesterov else b
    return d


# Two loops over one formula: a loop whose output may alias its input is not
# vectorised (2.2x slower measured in place), so the in-place step keeps its own.
@numba.njit(cache=True, nogil=True)
def _sgd_update_block(w, g, buf, lr, momentum, weight_decay,
                      nesterov):  # pragma: no cover - compiled
    for i in range(w.size):
        w[i] -= lr * _sgd_direction(w[i], g[i], buf, i, momentum, weight_decay, nesterov)


@numba.njit(cache=True, nogil=True)
def _sgd_update_into_block(w, g, buf, lr, momentum, weight_decay, nesterov,
                           out):  # pragma: no cover - compiled
    for i in range(w.size):
        out[i] = w[i] - lr * _sgd_direction(w[i], g[i], buf, i, momentum, weight_decay,
                                            nesterov)


@numba.njit(cache=True, nogil=True)
def _weighted_merge_block(x, total, weight, divisor):  # pragma: no cover - compiled
    for i in range(x.size):
        x[i] = (x[i] * weight + total[i]) / divisor


# The serial kernels: one block over the whole array.
@numba.njit(cache=True, nogil=True)
def _relu_forward_kernel(x, out):  # pragma: no cover - compiled
    _relu_forward_block(x, out)


@numba.njit(cache=True, nogil=True)
def _relu_backward_kernel(grad, x, out):  # pragma: no cover - compiled
    _relu_backward_block(grad, x, out)


@numba.njit(cache=True, nogil=True)
def _sgd_update_kernel(w, g, buf, lr, momentum, weight_decay, nesterov):  # pragma: no cover
    _sgd_update_block(w, g, buf, lr, momentum, weight_decay, nesterov)


@numba.njit(cache=True, nogil=True)
def _sgd_update_into_kernel(w, g, buf, lr, momentum, weight_decay, nesterov,
                            out):  # pragma: no cover - compiled
    _sgd_update_into_block(w, g, buf, lr, momentum, weight_decay, nesterov, out)


@numba.njit(cache=True, nogil=True)
def _weighted_merge_kernel(x, total, weight, divisor):  # pragma: no cover - compiled
    _weighted_merge_block(x, total, weight, divisor)


# The parallel kernels: the same blocks, BLOCK elements each, over the rank's threads.
@numba.njit(cache=True, nogil=True, parallel=True)
def _relu_forward_parallel(x, out):  # pragma: no cover - compiled
    for b in numba.prange((x.size + BLOCK - 1) // BLOCK):
        part = _block(b, x.size)
        _relu_forward_block(x[part], out[part])


@numba.njit(cache=True, nogil=True, parallel=True)
def _relu_backward_parallel(grad, x, out):  # pragma: no cover - compiled
    for b in numba.prange((x.size + BLOCK - 1) // BLOCK):
        part = _block(b, x.size)
        _relu_backward_block(grad[part], x[part], out[part])


@numba.njit(cache=True, nogil=True, parallel=True)
def _sgd_update_parallel(w, g, buf, lr, momentum, weight_decay,
                         nesterov):  # pragma: no cover - compiled
    for b in numba.prange((w.size + BLOCK - 1) // BLOCK):
        part = _block(b, w.size)
        _sgd_update_block(w[part], g[part], buf[part], lr, momentum, weight_decay, nesterov)


@numba.njit(cache=True, nogil=True, parallel=True)
def _sgd_update_into_parallel(w, g, buf, lr, momentum, weight_decay, nesterov,
                              out):  # pragma: no cover - compiled
    for b in numba.prange((w.size + BLOCK - 1) // BLOCK):
        part = _block(b, w.size)
        _sgd_update_into_block(w[part], g[part], buf[part], lr, momentum, weight_decay,
                               nesterov, out[part])


@numba.njit(cache=True, nogil=True, parallel=True)
def _weighted_merge_parallel(x, total, weight, divisor):  # pragma: no cover - compiled
    for b in numba.prange((x.size + BLOCK - 1) // BLOCK):
        part = _block(b, x.size)
        _weighted_merge_block(x[part], total[part], weight, divisor)


def relu_forward_reference(x: Any) -> Any:
    """``max(x, 0)`` in NumPy/CuPy."""
    return array_module(x).maximum(x, 0)


def relu_backward_reference(grad: Any, x: Any) -> Any:
    """``grad * (x > 0)`` in NumPy/CuPy."""
    return grad * (x > 0)


def sgd_update_reference(w: Any, g: Any, buf: Any, lr: float, momentum: float,
                         weight_decay: float, nesterov: bool) -> None:
    """PyTorch's SGD step, in place on ``w`` and ``buf``, in NumPy/CuPy."""
    d = g + weight_decay * w if weight_decay else g
    if momentum:
        buf *= momentum
        buf += d
        d = d + momentum * buf if nesterov else buf
    w -= lr * d


def weighted_merge_reference(x: Any, total: Any, weight: float, count: int) -> None:
    """``x <- (weight*x + total) / (weight + count)`` in place, in NumPy/CuPy."""
    x *= weight
    x += total
    x /= weight + count


def relu_forward(x: Any) -> Any:
    """``max(x, 0)``, NumPy's bits, in x's memory order (C or a linear layer's Fortran)."""
    if not use_kernels(x) or x.dtype.kind != "f" or not (x.flags.c_contiguous
                                                         or x.flags.f_contiguous):
        return relu_forward_reference(x)
    if not x.flags.c_contiguous:
        return relu_forward(x.T).T  # a linear layer's output: no copies
    ensure_compiled()
    out = np.empty(x.shape, dtype=x.dtype)
    kernel = _relu_forward_parallel if spread(x.size) else _relu_forward_kernel
    kernel(x.reshape(-1), out.reshape(-1))
    return out


def relu_backward(grad: Any, x: Any) -> Any:
    """Gradient of relu: ``grad`` where ``x > 0``, else 0."""
    if not use_kernels(grad, x) or grad.dtype != x.dtype:
        return relu_backward_reference(grad, x)
    if x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
        return relu_backward(grad.T, x.T).T  # a linear layer's output: no copies
    ensure_compiled()
    out = np.empty(x.shape, dtype=x.dtype)
    kernel = _relu_backward_parallel if spread(x.size) else _relu_backward_kernel
    kernel(np.ascontiguousarray(grad).reshape(-1), np.ascontiguousarray(x).reshape(-1),
           out.reshape(-1))
    return out


def sgd_update(w: Any, g: Any, buf: Any, lr: float, momentum: float = 0.0,
               weight_decay: float = 0.0, nesterov: bool = False, out: Any = None) -> None:
    """One SGD step on the 1-D buffers ``w`` (parameters) and ``buf`` (momentum).

    Args:
        w: parameters, updated in place unless ``out`` is given.
        g: gradient, same shape and dtype.
        buf: momentum buffer, updated in place (ignored when momentum is 0).
        lr: learning rate.
        momentum: heavy-ball coefficient.
        weight_decay: L2 coefficient added to the gradient.
        nesterov: use Nesterov's look-ahead form.
        out: where the stepped parameters go instead (``w`` is then only read): the
            bits of a copy of ``w`` stepped in place, in one pass.
    """
    array_module(w, g, buf)
    contiguous = all(a.flags.c_contiguous and a.dtype == w.dtype for a in (w, g, buf))
    if out is not None and not (contiguous and use_kernels(w, g, buf, out)
                                and out.flags.c_contiguous and out.dtype == w.dtype):
        out[...] = w  # the other paths step in place: on a copy
        sgd_update(out, g, buf, lr, momentum, weight_decay, nesterov)
        return
    if contiguous and cuda.applies(w, g, buf):
        cuda.sgd_update(w, g, buf, lr, momentum, weight_decay, nesterov)
        return
    if not (use_kernels(w, g, buf) and contiguous):
        sgd_update_reference(w, g, buf, lr, momentum, weight_decay, nesterov)
        return
    ensure_compiled()
    scalars = float(lr), float(momentum), float(weight_decay), bool(nesterov)
    parallel = spread(w.size)
    if out is None:
        kernel = _sgd_update_parallel if parallel else _sgd_update_kernel
        kernel(w.reshape(-1), g.reshape(-1), buf.reshape(-1), *scalars)
    else:
        kernel = _sgd_update_into_parallel if parallel else _sgd_update_into_kernel
        kernel(w.reshape(-1), g.reshape(-1), buf.reshape(-1), *scalars, out.reshape(-1))


def weighted_merge(x: Any, total: Any, weight: float, count: int) -> None:
    """``x <- (weight*x + total) / (weight + count)`` in place (1-D, same dtype).

    The scalars are cast to the arrays' dtype first, as NumPy does with a Python number
    (so float32 arrays are computed in float32: the reference's bits).
    """
    array_module(x, total)
    if not (use_kernels(x, total) and x.dtype == total.dtype and x.flags.c_contiguous
            and total.flags.c_contiguous):
        weighted_merge_reference(x, total, weight, count)
        return
    ensure_compiled()
    scalar = x.dtype.type
    kernel = _weighted_merge_parallel if spread(x.size) else _weighted_merge_kernel
    kernel(x.reshape(-1), total.reshape(-1), scalar(weight), scalar(weight + count))


def _warm_with(relu_forward, relu_backward, update, update_into, merge, dtype: type) -> None:
    a = np.zeros(2, dtype=dtype)
    relu_forward(a, a.copy())
    relu_backward(a, a, a.copy())
    update(a, a.copy(), a.copy(), 0.1, 0.9, 0.0, False)
    update_into(a, a.copy(), a.copy(), 0.1, 0.9, 0.0, False, a.copy())
    merge(a, a.copy(), a.dtype.type(2), a.dtype.type(4))


@register_warmup
def _warm(dtype: type) -> None:
    _warm_with(_relu_forward_kernel, _relu_backward_kernel, _sgd_update_kernel,
               _sgd_update_into_kernel, _weighted_merge_kernel, dtype)


@register_parallel_warmup
def _warm_parallel(dtype: type) -> None:
    _warm_with(_relu_forward_parallel, _relu_backward_parallel, _sgd_update_parallel,
               _sgd_update_into_parallel, _weighted_merge_parallel, dtype)
