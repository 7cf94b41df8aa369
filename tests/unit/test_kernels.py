"""Every Numba kernel equals its NumPy reference on random inputs, odd sizes included.

The kernels are called directly (not through the dispatchers), so under
``NUMBA_DISABLE_JIT=1`` the same comparison runs their Python bodies.
"""

import numpy as np
import pytest
from kernel_cases import CONV_CASES, DTYPES, POOL_CASES, rand

from minidp.kernels import batchnorm as bn
from minidp.kernels import elementwise as ew
from minidp.kernels import pooling as pl
from minidp.kernels import taps
from minidp.kernels import unfold as ic
from minidp.kernels import winograd as wg


def tolerance(dtype):
    return 1e-5 if dtype == np.float32 else 1e-12


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CONV_CASES)
def test_im2col_and_col2im_match_reference(dtype, case):
    n, c, h, w, kh, kw, s, ph, pw = case
    x = rand((n, c, h, w), dtype)
    oh, ow = ic.output_size(h, kh, s, ph), ic.output_size(w, kw, s, pw)
    cols = np.full((c * kh * kw, n * oh * ow), np.nan, dtype=dtype)
    ic._im2col_kernel(x, kh, kw, s, ph, pw, cols)
    np.testing.assert_array_equal(cols, ic.im2col_reference(x, kh, kw, s, ph, pw))
    g = rand(cols.shape, dtype, 1)
    dx = np.full_like(x, np.nan)  # the kernel zeroes it first
    ic._col2im_kernel(g, kh, kw, s, ph, pw, dx)
    tol = tolerance(dtype)
    np.testing.assert_allclose(dx, ic.col2im_reference(g, x.shape, kh, kw, s, ph, pw),
                               rtol=tol, atol=tol)


def test_im2col_reference_matches_a_direct_convolution():
    x, w = rand((2, 3, 6, 5), np.float64), rand((4, 3, 3, 3), np.float64, 1)
    out = (w.reshape(4, -1) @ ic.im2col_reference(x, 3, 3, 2, 1, 1)).reshape(4, 2, 3, 3)
    np.testing.assert_allclose(out.transpose(1, 0, 2, 3), direct_conv(x, w, 2, 1), atol=1e-12)


def direct_conv(x, w, stride, pad):
    """The textbook loops, as the truth for the im2col and Winograd references."""
    xp = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    oh = (xp.shape[2] - w.shape[2]) // stride + 1
    ow = (xp.shape[3] - w.shape[3]) // stride + 1
    out = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for y in range(oh):
        for z in range(ow):
            patch = xp[:, :, stride * y:stride * y + w.shape[2], stride * z:stride * z + w.shape[3]]
            out[:, :, y, z] = np.einsum("nchw,fchw->nf", patch, w)
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,k", [((2, 3, 5, 4), 3), ((1, 2, 3, 6), 5), ((2, 1, 1, 1), 3)])
def test_tap_kernels_match_reference_and_convolve(dtype, shape, k):
    n, c, h, w = shape
    x, plane = rand(shape, dtype), (h + k - 1) * w
    rows = np.full((c * k, n * plane), np.nan, dtype=dtype)
    taps._rows_kernel(x, k, rows)
    np.testing.assert_array_equal(rows, taps.rows_reference(x, k))
    shifts = np.full((k * c, n * plane), np.nan, dtype=dtype)
    taps._shifts_kernel(x, k, shifts)
    np.testing.assert_array_equal(shifts, taps.row_shifts_reference(x, k))
    wt = rand((4, c, k, k), dtype, 1)
    products = wt.transpose(2, 0, 1, 3).reshape(k * 4, c * k) @ rows
    out = np.full((n, 4, h, w), np.nan, dtype=dtype)
    taps._sum_taps_kernel(products, k, out)
    tol = 10 * tolerance(dtype)
    np.testing.assert_allclose(out, taps.sum_taps_reference(products, k, out.shape), rtol=tol,
                               atol=tol)
    np.testing.assert_allclose(out, direct_conv(x.astype(np.float64), wt, 1, (k - 1) // 2),
                               rtol=tol, atol=tol)


# (N, C, H, W): even and odd sizes (partial tiles), one pixel, one channel
WINOGRAD_CASES = [(2, 3, 6, 4), (1, 2, 7, 5), (3, 4, 8, 8), (1, 1, 1, 1), (2, 2, 3, 2)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", WINOGRAD_CASES)
def test_winograd_kernels_match_reference(dtype, shape):
    n, c, h, w = shape
    th, tw = wg.tiles(h, w)
    count = n * th * tw
    x, tol = rand(shape, dtype), 4 * tolerance(dtype)
    v = np.full_like(wg.plane_buffer(c, count, dtype), np.nan)
    wg._input_kernel(x, v)
    np.testing.assert_allclose(wg.planes(v, c, count),
                               wg.planes(wg.input_reference(x), c, count), rtol=tol, atol=tol)
    dm = np.full_like(v, np.nan)
    wg._output_grad_kernel(x, dm)
    np.testing.assert_allclose(wg.planes(dm, c, count),
                               wg.planes(wg.output_grad_reference(x), c, count), rtol=tol,
                               atol=tol)
    m = rand(v.shape, dtype, 1)
    out = np.full_like(x, np.nan)
    wg._output_kernel(m, out)
    np.testing.assert_allclose(out, wg.output_reference(m, shape), rtol=tol, atol=tol)
    dx = np.full_like(x, np.nan)
    wg._input_grad_kernel(m, dx)
    np.testing.assert_allclose(dx, wg.input_grad_reference(m, shape), rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("f,c", [(4, 3), (1, 1), (6, 9)])
def test_winograd_weight_kernels_match_reference_and_the_equations(dtype, f, c):
    w, du = rand((f, c, 3, 3), dtype), rand((16, c, f), dtype, 1)
    u, dw = np.full((16, f, c), np.nan, dtype), np.full_like(w, np.nan)
    wg._weight_transform_kernel(w, u)
    wg._weight_grad_kernel(du, dw)
    tol = tolerance(dtype)
    np.testing.assert_allclose(u, wg.weight_transform_reference(w), rtol=tol, atol=tol)
    np.testing.assert_allclose(dw, wg.weight_grad_reference(du), rtol=tol, atol=tol)
    # U = G w G^T and dw = G^T dU G, written apart from both, in float64
    w64, du64 = w.astype(np.float64), du.astype(np.float64).reshape(4, 4, c, f)
    np.testing.assert_allclose(u, np.einsum("ai,fcij,bj->abfc", wg.G, w64, wg.G).reshape(16, f, c),
                               rtol=tol, atol=tol)
    np.testing.assert_allclose(dw, np.einsum("ai,abcf,bj->fcij", wg.G, du64, wg.G), rtol=tol,
                               atol=tol)


def test_winograd_references_compute_a_convolution_and_its_gradients():
    x, w = rand((2, 3, 5, 6), np.float64), rand((4, 3, 3, 3), np.float64, 1)
    n, c, h, wd = x.shape
    u = np.einsum("ai,fcij,bj->abfc", wg.G, w, wg.G).reshape(16, 4, 3)
    count = n * np.prod(wg.tiles(h, wd))
    m = wg.plane_buffer(4, count, np.float64)
    wg.planes(m, 4, count)[...] = u @ wg.planes(wg.input_reference(x), 3, count)
    np.testing.assert_allclose(wg.output_reference(m, (n, 4, h, wd)), direct_conv(x, w, 1, 1),
                               atol=1e-12)
    # the input gradient of a convolution is the convolution of g with the flipped,
    # transposed kernel: check B (U^T A g A^T) B^T against it
    g = rand((n, 4, h, wd), np.float64, 2)
    dm = wg.planes(wg.output_grad_reference(g), 4, count)
    dv = wg.plane_buffer(3, count, np.float64)
    wg.planes(dv, 3, count)[...] = u.transpose(0, 2, 1) @ dm
    flipped = w[:, :, ::-1, ::-1].transpose(1, 0, 2, 3)
    np.testing.assert_allclose(wg.input_grad_reference(dv, x.shape), direct_conv(g, flipped, 1, 1),
                               atol=1e-12)


# (N, C, L): a ResNet-like channel, one value per channel and sample (the (N, C) case)
BN_SHAPES = [(4, 3, 10), (7, 2, 1)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", BN_SHAPES)
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, False), (True, True)])
def test_batchnorm_kernels_match_reference(dtype, shape, training, relu, residual):
    c = shape[1]
    x, g, res = rand(shape, dtype, 1) + 3, rand(shape, dtype, 2), rand(shape, dtype, 3)
    weight, bias = rand(c, dtype, 4), rand(c, dtype, 5)
    stats = (np.zeros(c), np.zeros(c)) if training else (rand(c, np.float64, 6),
                                                        rand(c, np.float64, 7) ** 2)
    mean, var = stats[0].copy(), stats[1].copy()
    ref_mean, ref_var = stats[0].copy(), stats[1].copy()
    empty = np.zeros((0, 0, 0), dtype)
    out = np.full_like(x, np.nan)
    bn._forward_kernel(x, weight, bias, res if residual else empty, relu, training, 1e-5, mean,
                       var, out)
    ref = bn.forward_reference(x, weight, bias, res if residual else None, relu, training, 1e-5,
                               ref_mean, ref_var)
    tol = 10 * tolerance(dtype)
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, ref_mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(var, ref_var, rtol=tol, atol=tol)
    inv_std = 1 / np.sqrt(var + 1e-5)
    gx, g_res = np.full_like(x, np.nan), np.full_like(x, np.nan) if residual else empty
    gw, gb = np.empty(c), np.empty(c)
    bn._backward_kernel(g, x, out, weight, mean, inv_std, relu, training, gx, g_res, gw, gb)
    ref_gx, ref_gw, ref_gb, gated = bn.backward_reference(g, x, out, weight, mean, inv_std, relu,
                                                          training, True)
    for got, want in ((gx, ref_gx), (gw, ref_gw), (gb, ref_gb)) + ((g_res, gated),) * residual:
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)


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
    tol = tolerance(dtype)
    np.testing.assert_allclose(dx, pl.maxpool_backward_reference(g, ref_arg, x.shape), rtol=tol,
                               atol=tol)
    if k == s:  # tiling windows: every element of dx written, the scatter-add's values
        tiles = np.full_like(x, np.nan)
        pl._maxpool_backward_tiles_kernel(g, argmax, tiles)
        np.testing.assert_array_equal(tiles, dx)
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


@pytest.mark.parametrize("order", ["FF", "CF", "FC"])
def test_relu_backward_takes_fortran_ordered_linear_outputs(order):
    # a linear layer's output and gradient come out Fortran-ordered (ops/linalg.py)
    g, x = rand((7, 5), np.float32, 4), rand((7, 5), np.float32, 5)
    g, x = (np.asfortranarray(a) if o == "F" else a for a, o in zip((g, x), order))
    out = ew.relu_backward(g, x)
    np.testing.assert_array_equal(out, ew.relu_backward_reference(g, x))
    if ew.use_kernels(g, x):  # the kernel runs in x's order (the reference: NumPy's rules)
        assert out.flags.f_contiguous == (order[1] == "F")


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


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("weight", [2.0, 0.37, 6.0])
def test_weighted_merge_gives_the_bits_of_numpys_three_passes(dtype, weight):
    """DASO's merge x = (w x + s) / (w + P): the dispatcher (the kernel, with the JIT on)
    against the equation in NumPy, one operation per pass, in the arrays' dtype."""
    x, total = rand(1001, dtype, 10) * 3, rand(1001, dtype, 11) * 7
    expected = x * dtype(weight)
    expected = expected + total
    expected = expected / dtype(weight + 4)
    ew.weighted_merge(x, total, weight, 4)
    assert x.dtype == dtype
    np.testing.assert_array_equal(x.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("nesterov", [False, True])
def test_sgd_update_into_out_leaves_w_and_gives_the_in_place_bits(dtype, nesterov):
    w, g = rand(1001, dtype, 12), rand(1001, dtype, 13)
    buf, buf_in_place = rand(1001, dtype, 14), rand(1001, dtype, 14)
    w_before, out, in_place = w.copy(), np.full_like(w, np.nan), w.copy()
    ew.sgd_update(w, g, buf, 0.05, 0.9, 1e-3, nesterov, out=out)
    ew.sgd_update(in_place, g, buf_in_place, 0.05, 0.9, 1e-3, nesterov)
    np.testing.assert_array_equal(w, w_before)
    np.testing.assert_array_equal(out, in_place)
    np.testing.assert_array_equal(buf, buf_in_place)


def test_dispatchers_agree_with_references():
    x = rand((2, 3, 9, 9), np.float32, 9)
    np.testing.assert_array_equal(ic.im2col(x, 3, 3, 2, 1, 1),
                                  ic.im2col_reference(x, 3, 3, 2, 1, 1))
    out, arg = pl.maxpool_forward(x, 3, 2)
    ref_out, ref_arg = pl.maxpool_forward_reference(x, 3, 2)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(arg, ref_arg)
    # the kernel accumulates in float64, NumPy's mean in float32: rounding differs
    np.testing.assert_allclose(pl.avgpool_forward(x, 2, 2), pl.avgpool_forward_reference(x, 2, 2),
                               rtol=1e-5, atol=1e-6)
