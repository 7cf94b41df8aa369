"""The convolution's forward and backward off "same" padding, against direct loops.

The gradient checks and PyTorch's parity ran the convolution mostly with "same"
padding (3x3, padding 1), where the transposed kernel's padding k - 1 - p equals p:
a backward that pads by p where it must pad by k - 1 - p passes them. Here a 3x3
kernel runs with padding 0, 1 and 2 and strides 1 and 2, on 3 channels (the
im2col/col2im path), 8 (the row-tap engine takes 3x3 padding 1 at stride 1) and 32
(Winograd's at the same), and every output and gradient is compared with the
definition written as plain loops over the padded input::

    out[n, f, i, j] = b[f] + sum_{c, a, e} xp[n, c, s i + a, s j + e] w[f, c, a, e]

whose derivatives, for an upstream gradient g, are the same sums read the other way.
The input is 7 x 6 (odd and even), so at stride 2 a row or column may be read by no
window: its gradient must be exactly 0.
"""

import numpy as np
import pytest

from minidp import Tensor
from minidp.autograd.ops import conv2d


def by_loops(x, w, b, g, stride, padding):
    """(out, dx, dw, db) of the convolution, one multiply-add at a time."""
    n, c, h, wd = x.shape
    f, _, k, _ = w.shape
    oh, ow = (h + 2 * padding - k) // stride + 1, (wd + 2 * padding - k) // stride + 1
    xp = np.zeros((n, c, h + 2 * padding, wd + 2 * padding))
    xp[:, :, padding:padding + h, padding:padding + wd] = x
    out = np.zeros((n, f, oh, ow))
    dxp, dw = np.zeros_like(xp), np.zeros_like(w)
    for s in range(n):
        for o in range(f):
            for i in range(oh):
                for j in range(ow):
                    total = b[o]
                    for ch in range(c):
                        for a in range(k):
                            for e in range(k):
                                r, q = stride * i + a, stride * j + e
                                total += xp[s, ch, r, q] * w[o, ch, a, e]
                                dxp[s, ch, r, q] += g[s, o, i, j] * w[o, ch, a, e]
                                dw[o, ch, a, e] += g[s, o, i, j] * xp[s, ch, r, q]
                    out[s, o, i, j] = total
    dx = dxp[:, :, padding:padding + h, padding:padding + wd]
    return out, dx, dw, g.sum(axis=(0, 2, 3))


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("padding", [0, 1, 2])
@pytest.mark.parametrize("channels", [3, 8, 32])
def test_conv3x3_forward_and_backward_equal_the_direct_loops(stride, padding, channels):
    rng = np.random.default_rng([stride, padding, channels])
    x = rng.standard_normal((2, channels, 7, 6))
    w = rng.standard_normal((2, channels, 3, 3))
    b = rng.standard_normal(2)
    xt, wt, bt = (Tensor(a.copy(), requires_grad=True) for a in (x, w, b))
    out = conv2d(xt, wt, bt, stride=stride, padding=padding)
    g = rng.standard_normal(out.shape)
    out.backward(g)
    want_out, want_dx, want_dw, want_db = by_loops(x, w, b, g, stride, padding)
    np.testing.assert_allclose(out.data, want_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(xt.grad, want_dx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(wt.grad, want_dw, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(bt.grad, want_db, rtol=1e-10, atol=1e-10)
    if stride == 2 and padding == 0:  # windows at 0, 2, 4 of 6 columns: column 5 unread
        assert np.all(xt.grad[:, :, :, 5] == 0) and np.any(xt.grad[:, :, :, 4] != 0)
