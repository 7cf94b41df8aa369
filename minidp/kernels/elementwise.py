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
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from minidp.backend import array_module
from minidp.kernels import cuda
from minidp.kernels.jit import ensure_compiled, register_warmup, use_kernels


@numba.njit(cache=True, nogil=True)
def _relu_backward_kernel(grad, x, out):  # pragma: no cover - compiled
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
def _sgd_update_kernel(w, g, buf, lr, momentum, weight_decay, nesterov):  # pragma: no cover
    for i in range(w.size):
        w[i] -= lr * _sgd_direction(w[i], g[i], buf, i, momentum, weight_decay, nesterov)


@numba.njit(cache=True, nogil=True)
def _sgd_update_into_kernel(w, g, buf, lr, momentum, weight_decay, nesterov,
                            out):  # pragma: no cover - compiled
    for i in range(w.size):
        out[i] = w[i] - lr * _sgd_direction(w[i], g[i], buf, i, momentum, weight_decay,
                                            nesterov)


@numba.njit(cache=True, nogil=True)
def _weighted_merge_kernel(x, total, weight, divisor):  # pragma: no cover - compiled
    for i in range(x.size):
        x[i] = (x[i] * weight + total[i]) / divisor


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


def relu_backward(grad: Any, x: Any) -> Any:
    """Gradient of relu: ``grad`` where ``x > 0``, else 0."""
    if not use_kernels(grad, x) or grad.dtype != x.dtype:
        return relu_backward_reference(grad, x)
    if x.ndim == 2 and x.flags.f_contiguous and not x.flags.c_contiguous:
        return relu_backward(grad.T, x.T).T  # a linear layer's output: no copies
    ensure_compiled()
    out = np.empty(x.shape, dtype=x.dtype)
    _relu_backward_kernel(np.ascontiguousarray(grad).reshape(-1),
                          np.ascontiguousarray(x).reshape(-1), out.reshape(-1))
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
    if out is None:
        _sgd_update_kernel(w.reshape(-1), g.reshape(-1), buf.reshape(-1), *scalars)
    else:
        _sgd_update_into_kernel(w.reshape(-1), g.reshape(-1), buf.reshape(-1), *scalars,
                                out.reshape(-1))


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
    _weighted_merge_kernel(x.reshape(-1), total.reshape(-1), scalar(weight),
                           scalar(weight + count))


@register_warmup
def _warm(dtype: type) -> None:
    a = np.zeros(2, dtype=dtype)
    _relu_backward_kernel(a, a, a.copy())
    _sgd_update_kernel(a, a.copy(), a.copy(), 0.1, 0.9, 0.0, False)
    _sgd_update_into_kernel(a, a.copy(), a.copy(), 0.1, 0.9, 0.0, False, a.copy())
    _weighted_merge_kernel(a, a.copy(), a.dtype.type(2), a.dtype.type(4))
