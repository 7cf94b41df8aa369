"""Every CUDA kernel (minidp/kernels/cuda.py) against its NumPy reference (``make test-gpu``).

The kernels gather in the references' order, so float64 results are equal bit for bit;
float32 too, except the SGD step, which the kernel computes in double as Numba does.
"""

import numpy as np
import pytest
from kernel_cases import CONV_CASES, DTYPES, POOL_CASES, rand

from minidp.kernels import cuda
from minidp.kernels import elementwise as ew
from minidp.kernels import pooling as pl
from minidp.kernels import unfold as ic

pytestmark = pytest.mark.gpu
cupy = pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_and_col2im_equal_the_references(dtype, case):
    n, c, h, w, kh, kw, s, ph, pw = case
    x = rand((n, c, h, w), dtype)
    assert cuda.applies(cupy.asarray(x))
    cols = ic.im2col(cupy.asarray(x), kh, kw, s, ph, pw)
    np.testing.assert_array_equal(cols.get(), ic.im2col_reference(x, kh, kw, s, ph, pw))
    g = rand(cols.shape, dtype, 1)
    dx = cupy.full(x.shape, np.nan, dtype=dtype)  # overwritten, never read
    ic.col2im(cupy.asarray(g), dx, kh, kw, s, ph, pw)
    np.testing.assert_array_equal(dx.get(), ic.col2im_reference(g, x.shape, kh, kw, s, ph, pw))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES)
def test_max_pooling_equals_the_reference_ties_included(dtype, case):
    n, c, h, w, k, s = case
    x = np.round(rand((n, c, h, w), dtype) * 2)  # few distinct values: many ties
    out, argmax = pl.maxpool_forward(cupy.asarray(x), k, s)
    ref_out, ref_argmax = pl.maxpool_forward_reference(x, k, s)
    np.testing.assert_array_equal(out.get(), ref_out)
    np.testing.assert_array_equal(argmax.get(), ref_argmax)
    g = rand(ref_out.shape, dtype, 2)
    dx = pl.maxpool_backward(cupy.asarray(g), argmax, x.shape, k, s)
    np.testing.assert_array_equal(dx.get(), pl.maxpool_backward_reference(g, ref_argmax,
                                                                           x.shape))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum, weight_decay, nesterov",
                         [(0.0, 0.0, False), (0.9, 1e-4, False), (0.9, 5e-4, True)])
def test_the_fused_sgd_step_equals_the_reference(dtype, momentum, weight_decay, nesterov):
    w, g, buf = (rand(1001, dtype, seed) for seed in (3, 4, 5))
    dw, dg, dbuf = cupy.asarray(w), cupy.asarray(g), cupy.asarray(buf)
    for _ in range(3):
        ew.sgd_update(dw, dg, dbuf, 0.05, momentum, weight_decay, nesterov)
        ew.sgd_update_reference(w, g, buf, 0.05, momentum, weight_decay, nesterov)
    tol = 1e-5 if dtype == np.float32 else 1e-15
    np.testing.assert_allclose(dw.get(), w, rtol=tol, atol=tol)
    np.testing.assert_allclose(dbuf.get(), buf, rtol=tol, atol=tol)


def test_the_kernels_can_be_switched_off(monkeypatch):
    monkeypatch.setenv("MINIDP_CUDA_KERNELS", "0")
    assert not cuda.applies(cupy.zeros(3))
