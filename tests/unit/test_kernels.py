"""Every Numba kernel equals its NumPy reference on random inputs, odd sizes included.

The kernels are called directly (not through the dispatchers), so under
``NUMBA_DISABLE_JIT=1`` the same comparison runs their Python bodies.
"""

import numpy as np
import pytest

from minidp.kernels import elementwise as ew
from minidp.kernels import pooling as pl
from minidp.kernels import unfold as ic

DTYPES = [np.float32, np.float64]
# (N, C, H, W, kh, kw, stride, pad): odd sizes, strides that do not divide, pads wider
# than one tap.
CONV_CASES = [(1, 1, 5, 5, 3, 3, 1, 0), (2, 3, 7, 9, 3, 3, 2, 1), (3, 2, 11, 6, 5, 2, 3, 2),
              (1, 4, 4, 4, 1, 1, 1, 0), (2, 1, 28, 28, 5, 5, 1, 2), (1, 3, 9, 7, 4, 4, 2, 3)]


def rand(shape, dtype, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_and_col2im_match_reference(dtype, case):
    n, c, h, w, kh, kw, s, p = case
    x = rand((n, c, h, w), dtype)
    oh, ow = ic.output_size(h, kh, s, p), ic.output_size(w, kw, s, p)
    cols = np.full((c * kh * kw, n * oh * ow), np.nan, dtype=dtype)
    ic._im2col_kernel(x, kh, kw, s, p, oh, ow, cols)
    np.testing.assert_array_equal(cols, ic.im2col_reference(x, kh, kw, s, p))
    g = rand(cols.shape, dtype, 1)
    dx = np.zeros_like(x)
    ic._col2im_kernel(g, kh, kw, s, p, oh, ow, dx)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(dx, ic.col2im_reference(g, x.shape, kh, kw, s, p), rtol=tol,
                               atol=tol)


def test_im2col_reference_matches_a_direct_convolution():
    x, w = rand((2, 3, 6, 5), np.float64), rand((4, 3, 3, 3), np.float64, 1)
    out = (w.reshape(4, -1) @ ic.im2col_reference(x, 3, 3, 2, 1)).reshape(4, 2, 3, 3)
    xp = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
    direct = np.zeros((2, 4, 3, 3))
    for y in range(3):
        for z in range(3):
            patch = xp[:, :, 2 * y:2 * y + 3, 2 * z:2 * z + 3]
            direct[:, :, y, z] = np.einsum("nchw,fchw->nf", patch, w)
    np.testing.assert_allclose(out.transpose(1, 0, 2, 3), direct, atol=1e-12)


POOL_CASES = [(2, 3, 8, 8, 2, 2), (1, 2, 7, 9, 3, 2), (2, 1, 5, 5, 2, 1), (3, 2, 9, 7, 3, 3),
              (1, 1, 4, 4, 4, 4)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", POOL_CASES)
def test_pooling_kernels_match_reference(dtype, case):
    n, c, h, w, k, s = case
    x = rand((n, c, h, w), dtype, 2)
    oh, ow = ic.output_size(h, k, s, 0), ic.output_size(w, k, s, 0)
    out = np.empty((n, c, oh, ow), dtype=dtype)
    argmax = np.empty((n, c, oh, ow), dtype=np.int64)
    pl._maxpool_forward_kernel(x, k, s, out, argmax)
    ref_out, ref_arg = pl.maxpool_forward_reference(x, k, s)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(argmax, ref_arg)
    g = rand(out.shape, dtype, 3)
    dx = np.zeros_like(x)
    pl._maxpool_backward_kernel(g, argmax, w, dx)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(dx, pl.maxpool_backward_reference(g, ref_arg, x.shape), rtol=tol,
                               atol=tol)
    avg = np.empty_like(out)
    pl._avgpool_forward_kernel(x, k, s, avg)
    np.testing.assert_allclose(avg, pl.avgpool_forward_reference(x, k, s), rtol=tol, atol=tol)
    dx = np.zeros_like(x)
    pl._avgpool_backward_kernel(g, k, s, dx)
    np.testing.assert_allclose(dx, pl.avgpool_backward_reference(g, x.shape, k, s), rtol=tol,
                               atol=tol)


def test_maxpool_ties_pick_the_first_maximum_like_pytorch():
    x = np.zeros((1, 1, 2, 2), dtype=np.float32)
    _, arg = pl.maxpool_forward(x, 2, 2)
    _, ref = pl.maxpool_forward_reference(x, 2, 2)
    assert arg.item() == ref.item() == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [1, 7, 1001])
def test_relu_backward_matches_reference(dtype, size):
    g, x = rand(size, dtype, 4), rand(size, dtype, 5)
    out = np.empty_like(x)
    ew._relu_backward_kernel(g, x, out)
    np.testing.assert_array_equal(out, ew.relu_backward_reference(g, x))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("momentum,weight_decay,nesterov", [
    (0.0, 0.0, False), (0.9, 0.0, False), (0.9, 1e-2, False), (0.9, 1e-2, True),
    (0.0, 5e-4, False)])
def test_sgd_update_matches_reference(dtype, momentum, weight_decay, nesterov):
    w, g, buf = rand(13, dtype, 6), rand(13, dtype, 7), rand(13, dtype, 8)
    w_ref, buf_ref = w.copy(), buf.copy()
    for _ in range(3):
        ew._sgd_update_kernel(w, g, buf, 0.1, momentum, weight_decay, nesterov)
        ew.sgd_update_reference(w_ref, g, buf_ref, 0.1, momentum, weight_decay, nesterov)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(w, w_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(buf, buf_ref, rtol=tol, atol=tol)


def test_dispatchers_agree_with_references():
    x = rand((2, 3, 9, 9), np.float32, 9)
    np.testing.assert_array_equal(ic.im2col(x, 3, 3, 2, 1), ic.im2col_reference(x, 3, 3, 2, 1))
    out, arg = pl.maxpool_forward(x, 3, 2)
    ref_out, ref_arg = pl.maxpool_forward_reference(x, 3, 2)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(arg, ref_arg)
    # the kernel accumulates in float64, NumPy's mean in float32: rounding differs
    np.testing.assert_allclose(pl.avgpool_forward(x, 2, 2), pl.avgpool_forward_reference(x, 2, 2),
                               rtol=1e-5, atol=1e-6)
