"""Every convolution on a GPU takes the unfolded path, and is right (``make test-gpu``).

The host's Winograd and row-tap engines run on CuPy only through their array-generic
reference code, a chain of small kernels; on a GPU the convolution is one im2col kernel
and one batched cuBLAS product instead (``ops.conv._engine``). The values are checked
against the direct convolution of ``kernel_cases`` (NumPy's ``einsum`` over sliding
windows), in float64, forward and the three gradients.
"""

import numpy as np
import pytest
from kernel_cases import direct_conv

from minidp import Tensor
from minidp.autograd.ops.conv import Conv2d

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")

# (N, C, H, W, F, k, stride, padding): the host would take Winograd (3x3, 32 channels),
# the row taps (5x5 "same", 8 channels) and the general path (a stride of 2)
CASES = [(3, 32, 9, 7, 16, 3, 1, 1), (2, 8, 11, 10, 6, 5, 1, 2), (2, 3, 12, 9, 5, 3, 2, 0)]


def convolve(x, w, b, stride, padding, g):
    """minidp's convolution on the GPU: output and gradients (on the host), the engine."""
    tx, tw, tb = (Tensor(cupy.asarray(a), requires_grad=True) for a in (x, w, b))
    out = Conv2d.apply(tx, tw, tb, stride=stride, padding=padding)
    out.backward(cupy.asarray(g))
    return [cupy.asnumpy(a) for a in (out.data, tx.grad, tw.grad, tb.grad)], out._creator.engine


@pytest.mark.parametrize("case", CASES, ids=["winograd on the host", "row taps on the host",
                                             "unfolded on the host"])
def test_a_convolution_on_the_gpu_is_unfolded_and_equals_the_direct_sum(case):
    n, c, h, wd, f, k, stride, padding = case
    rng = np.random.default_rng(5)
    x, w, b = rng.standard_normal((n, c, h, wd)), rng.standard_normal((f, c, k, k)), \
        rng.standard_normal(f)
    oh, ow = (h + 2 * padding - k) // stride + 1, (wd + 2 * padding - k) // stride + 1
    g = rng.standard_normal((n, f, oh, ow))
    results, engine = convolve(x, w, b, stride, padding, g)
    assert engine is None
    for got, want in zip(results, direct_conv(x, w, b, g, stride, padding)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
