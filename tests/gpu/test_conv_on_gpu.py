"""Every convolution on a GPU takes the unfolded path, and is right (``make test-gpu``).

The host's Winograd and row-tap engines run on CuPy only through their array-generic
reference code, a chain of small kernels; on a GPU the convolution is one im2col kernel
and one batched cuBLAS product instead (``ops.conv._engine``). The values are checked
against a direct convolution written here with NumPy's ``einsum`` over sliding windows,
in float64, forward and both gradients.
"""

import numpy as np
import pytest

from minidp import Tensor
from minidp.autograd.ops.conv import Conv2d

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

# (N, C, H, W, F, k, stride, padding): the host would take Winograd (3x3, 32 channels),
# the row taps (5x5 "same", 8 channels) and the general path (a stride of 2)
CASES = [(3, 32, 9, 7, 16, 3, 1, 1), (2, 8, 11, 10, 6, 5, 1, 2), (2, 3, 12, 9, 5, 3, 2, 0)]


def direct(x, w, b, stride, padding, g):
    """out = conv(x, w) + b, and the gradients of sum(out * g) by the chain rule, by hand."""
    xp = np.pad(x, ((0, 0), (0, 0), (padding, padding), (padding, padding)))
    k = w.shape[2]
    win = np.lib.stride_tricks.sliding_window_view(xp, (k, k), axis=(2, 3))
    win = win[:, :, ::stride, ::stride]  # (N, C, OH, OW, k, k)
    out = np.einsum("ncyxij,fcij->nfyx", win, w) + b[None, :, None, None]
    gw = np.einsum("ncyxij,nfyx->fcij", win, g)
    gxp = np.zeros_like(xp)
    oh, ow = g.shape[2:]
    for i in range(k):
        for j in range(k):
            gxp[:, :, i:i + stride * oh:stride, j:j + stride * ow:stride] += np.einsum(
                "nfyx,fc->ncyx", g, w[:, :, i, j])
    gx = gxp[:, :, padding:padding + x.shape[2], padding:padding + x.shape[3]]
    return out, gx, gw, g.sum(axis=(0, 2, 3))


def convolve(xp, x, w, b, stride, padding, g):
    """minidp's convolution of the arrays moved to ``xp``: output, gradients, the engine."""
    tx, tw, tb = (Tensor(xp.asarray(a), requires_grad=True) for a in (x, w, b))
    out = Conv2d.apply(tx, tw, tb, stride=stride, padding=padding)
    out.backward(xp.asarray(g))
    host = [cupy.asnumpy(a) if xp is cupy else a for a in
            (out.data, tx.grad, tw.grad, tb.grad)]
    return host, out._creator.engine


@pytest.mark.parametrize("case", CASES, ids=["winograd on the host", "row taps on the host",
                                             "unfolded on the host"])
def test_a_convolution_on_the_gpu_is_unfolded_and_equals_the_direct_sum(case):
    n, c, h, wd, f, k, stride, padding = case
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((n, c, h, wd)), rng.standard_normal((f, c, k, k)), \
        rng.standard_normal(f)
    oh, ow = (h + 2 * padding - k) // stride + 1, (wd + 2 * padding - k) // stride + 1
    g = rng.standard_normal((n, f, oh, ow))
    results, engine = convolve(cupy, x, w, b, stride, padding, g)
    assert engine is None
    for got, want in zip(results, direct(x, w, b, stride, padding, g)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
