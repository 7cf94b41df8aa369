"""The kernels on 1, 2 and 3 threads: each equal to its NumPy reference, and bit-reproducible.

Two kinds of parallel code (:mod:`minidp.kernels.threaded`): the Numba kernels' ``prange``
loops, called here directly (so they run on every thread whatever the array's size),
and the convolutions' regions, where each thread runs its own chunks of the batch.
The thresholds that keep small work on one thread are lowered for the convolutions,
so that these small batches are split too.

Numba cannot run more threads than ``NUMBA_NUM_THREADS``, fixed when it is imported
(minidp sets it to the thread count it chose: 2 on a 2-core machine). The 3-thread
cases then run in a child process started with 3 threads (the last test).
"""

import os
import subprocess
import sys

import numba
import numpy as np
import pytest
from kernel_cases import POOL_CASES, direct_conv, rand
from threadpoolctl import threadpool_info

from minidp import Tensor, layers, threads
from minidp import functional as F
from minidp.autograd.ops import conv as conv_op
from minidp.autograd.ops import linalg as linalg_op
from minidp.autograd.ops import rowtap, winograd
from minidp.kernels import batchnorm as bn
from minidp.kernels import checksum as ck
from minidp.kernels import elementwise as ew
from minidp.kernels import gemm, taps, threaded, unfold
from minidp.kernels import pooling as pl
from minidp.kernels import reduce as rd
from minidp.kernels import winograd as wg
from minidp.kernels.jit import ensure_compiled, use_kernels

# the counts this process can run (the last test runs 3 in a child where Numba has fewer)
THREADS = [t for t in (1, 2, 3) if t <= numba.config.NUMBA_NUM_THREADS]


@pytest.fixture(params=THREADS, ids=lambda t: f"{t}threads")
def at_threads(request):
    """Run the test with minidp's thread count set to the parameter; restore it after."""
    count = request.param
    before = threads.threads_in_force()
    threads.limit_threads(count)
    assert numba.get_num_threads() == count
    yield count
    threads.limit_threads(before)


@pytest.fixture
def small_regions(monkeypatch):
    """Split even small batches among the threads, in chunks of one or two samples."""
    monkeypatch.setattr(threaded, "MIN_BYTES_PER_THREAD", 0)
    monkeypatch.setattr(threaded, "CHUNK_BYTES", 8192)


def edge_values(size, dtype, seed):
    """Normal values with NaN, -0.0, +0.0 and infinities among them."""
    x = rand(size, dtype, seed)
    x[[0, 5, 17, size // 2, size - 1]] = [np.nan, -0.0, 0.0, np.inf, -np.inf]
    return x


SIZE = 3 * ew.BLOCK + 77  # four blocks, the last one short: uneven pieces per thread


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_kernels_on_threads_give_numpys_bits(at_threads, dtype):
    x, g = edge_values(SIZE, dtype, 1), rand(SIZE, dtype, 2)
    out = np.full_like(x, 7)
    ew._relu_forward_parallel(x, out)
    expected = np.maximum(x, 0)
    np.testing.assert_array_equal(out.view(np.uint8), expected.view(np.uint8))  # -0 -> +0
    ew._relu_backward_parallel(g, x, out)
    np.testing.assert_array_equal(out, g * (x > 0))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("momentum,weight_decay,nesterov", [
    (0.0, 0.0, False), (0.9, 1e-2, False), (0.9, 1e-2, True)])
def test_sgd_kernels_on_threads(at_threads, dtype, momentum, weight_decay, nesterov):
    w, g, buf = rand(SIZE, dtype, 3), rand(SIZE, dtype, 4), rand(SIZE, dtype, 5)
    w_ref, buf_ref = w.copy(), buf.copy()
    w_serial, buf_serial = w.copy(), buf.copy()
    out, buf_into = np.full_like(w, np.nan), buf.copy()
    ew._sgd_update_into_parallel(w, g, buf_into, 0.1, momentum, weight_decay, nesterov, out)
    ew._sgd_update_parallel(w, g, buf, 0.1, momentum, weight_decay, nesterov)
    ew.sgd_update_reference(w_ref, g, buf_ref, 0.1, momentum, weight_decay, nesterov)
    ew._sgd_update_kernel(w_serial, g, buf_serial, 0.1, momentum, weight_decay, nesterov)
    tol = 1e-6 if dtype == np.float32 else 1e-14
    np.testing.assert_allclose(w, w_ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(buf, buf_ref, rtol=tol, atol=tol)
    for a, b in ((w, w_serial), (buf, buf_serial), (out, w), (buf_into, buf)):
        np.testing.assert_array_equal(a, b)  # the one-thread bits, at every thread count


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_weighted_merge_on_threads_gives_numpys_three_passes(at_threads, dtype):
    x, total = rand(SIZE, dtype, 6) * 3, rand(SIZE, dtype, 7) * 5
    expected = x * dtype(0.37)
    expected = expected + total
    expected = expected / dtype(4.37)
    ew._weighted_merge_parallel(x, total, dtype(0.37), dtype(4.37))
    np.testing.assert_array_equal(x.view(np.uint8), expected.view(np.uint8))


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("relu,residual", [(False, False), (True, True)])
def test_batchnorm_kernels_on_threads(at_threads, dtype, training, relu, residual):
    shape = (4, 5, 37)  # 5 channels: 2 and 3 threads get unequal shares
    x, g = rand(shape, dtype, 8) * 2 + 1, rand(shape, dtype, 9)
    weight, bias = rand(5, dtype, 10), rand(5, dtype, 11)
    res = rand(shape, dtype, 12) if residual else None
    stats = [np.abs(rand(5, np.float64, 13)) + 0.5 for _ in range(2)]
    mean, var = (s.copy() for s in stats)
    empty = bn._NONE.astype(dtype)
    out = np.empty_like(x)
    bn._forward_parallel(x, weight, bias, empty if res is None else res, relu, training, 1e-5,
                         mean, var, out)
    ref_mean, ref_var = (s.copy() for s in stats)
    ref = bn.forward_reference(x, weight, bias, res, relu, training, 1e-5, ref_mean, ref_var)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    np.testing.assert_allclose(out, ref, rtol=tol, atol=tol)
    np.testing.assert_allclose(mean, ref_mean, rtol=tol, atol=tol)
    np.testing.assert_allclose(var, ref_var, rtol=tol, atol=tol)
    serial, s_mean, s_var = np.empty_like(x), *(s.copy() for s in stats)
    bn._forward_kernel(x, weight, bias, empty if res is None else res, relu, training, 1e-5,
                       s_mean, s_var, serial)
    for a, b in ((out, serial), (mean, s_mean), (var, s_var)):
        np.testing.assert_array_equal(a, b)

    inv_std = 1 / np.sqrt(var + 1e-5)
    grads = [np.empty_like(x), np.empty_like(x), np.empty(5), np.empty(5)]
    bn._backward_parallel(g, x, out, weight, mean, inv_std, relu, training, *grads)
    gx, gw, gb, gated = bn.backward_reference(g, x, out, weight, mean, inv_std, relu, training,
                                              True)
    for got, want in zip(grads, (gx, gated, gw, gb)):
        np.testing.assert_allclose(got, want, rtol=20 * tol, atol=20 * tol)
    serial = [np.empty_like(x), np.empty_like(x), np.empty(5), np.empty(5)]
    bn._backward_kernel(g, x, out, weight, mean, inv_std, relu, training, *serial)
    for a, b in zip(grads, serial):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("case", POOL_CASES + [(5, 3, 12, 10, 2, 2), (3, 5, 11, 11, 3, 2)])
def test_pooling_kernels_on_threads(at_threads, case):
    n, c, h, w, k, s = case
    x = rand((n, c, h, w), np.float32, 14)
    oh, ow = (h - k) // s + 1, (w - k) // s + 1
    out, argmax = np.empty((n, c, oh, ow), np.float32), np.empty((n, c, oh, ow), np.int64)
    pl._maxpool_forward_parallel(x, k, s, out, argmax)
    ref_out, ref_arg = pl.maxpool_forward_reference(x, k, s)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(argmax, ref_arg)
    g = rand(out.shape, np.float32, 15)
    dx = np.zeros_like(x)
    pl._maxpool_backward_parallel(g, argmax, w, dx)
    np.testing.assert_array_equal(dx, pl.maxpool_backward_reference(g, argmax, x.shape))
    if s == k:
        tiles = np.full_like(x, np.nan)
        pl._maxpool_backward_tiles_parallel(g, argmax, tiles)
        np.testing.assert_array_equal(tiles, dx)
    avg = np.empty_like(out)
    pl._avgpool_forward_parallel(x, k, s, avg)
    np.testing.assert_allclose(avg, pl.avgpool_forward_reference(x, k, s), rtol=1e-5, atol=1e-6)
    dx = np.zeros_like(x)
    pl._avgpool_backward_parallel(g, k, s, dx)
    np.testing.assert_allclose(dx, pl.avgpool_backward_reference(g, x.shape, k, s), rtol=1e-5,
                               atol=1e-6)


def test_checksum_on_threads_is_exact(at_threads, monkeypatch):
    if not numba.config.DISABLE_JIT:
        size = 2 * ck._CHUNK + 12345  # compiled: the real blocks (the constant is frozen in)
    else:  # the Python body: small blocks, or the loop takes minutes
        monkeypatch.setattr(ck, "_CHUNK", 1000)
        size = 2 * 1000 + 345
    data = np.random.default_rng(16).integers(0, 256, size, dtype=np.uint8)
    with np.errstate(over="ignore"):  # the Python body's uint64 scalars warn as they wrap
        s1, s2 = ck._checksum_parallel(data, np.uint64(2**63 + 5))  # weights pass 2**64
    assert (int(s1), int(s2)) == ck.checksum_reference(data, 2**63 + 5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("divisor,broadcast", [(1, False), (3, True), (3, False)])
def test_node_sum_on_threads_gives_the_bits_of_row_by_row_adds(at_threads, dtype, divisor,
                                                              broadcast):
    """A node window's rows (3 ranks; each row padded, as the window's segments may be),
    one rank's slice [lo, hi) of more than two blocks, summed, divided, copied."""
    lo, hi = 5, 5 + 2 * rd.BLOCK + 101
    padded = rand((3, hi + 40), dtype, 22)

    def window():  # rows of hi + 7 elements, hi + 40 apart
        return padded.copy()[:, :hi + 7]

    expected = window()
    total = expected[0, lo:hi].copy()
    for r in (1, 2):
        total = total + expected[r, lo:hi]  # in the dtype, row after row
    if divisor != 1:
        total = total / dtype(divisor)
    for r in (range(3) if broadcast else [0]):
        expected[r, lo:hi] = total
    for kernel in (rd._node_sum_parallel, rd._node_sum_kernel):
        got = window()
        assert not got.flags.c_contiguous
        kernel(got, lo, hi, dtype(divisor), broadcast)
        np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))
    got = window()
    rd.node_sum(got, lo, hi, divisor, broadcast)  # the dispatcher, kernel or NumPy's passes
    np.testing.assert_array_equal(got.view(np.uint8), expected.view(np.uint8))


def test_spread_follows_the_thread_count_and_stays_out_of_regions(small_regions):
    before = threads.threads_in_force()
    try:
        threads.limit_threads(1)
        assert not threaded.spread(10**7)
        threads.limit_threads(2)
        assert threaded.spread(threaded.SPREAD_MIN_ELEMENTS)
        assert not threaded.spread(threaded.SPREAD_MIN_ELEMENTS - 1)
        inside = threaded.Plan(4, 10, threads=2).run(lambda t, lo, hi: threaded.spread(10**7))
        assert inside == [False] * len(inside)
        assert threaded.spread(10**7)  # and again after the region
    finally:
        threads.limit_threads(before)


@pytest.mark.parametrize("n,per_sample,count", [(64, 1300, 2), (64, 3000, 3), (7, 1, 3),
                                                (5, 10**7, 4)])
def test_plan_cuts_one_threads_chunks_or_equal_parts(small_regions, n, per_sample, count):
    step = max(1, min(n, threaded.CHUNK_BYTES // per_sample))
    one = threaded.Plan(n, per_sample, threads=1)
    assert one.parts == [[(lo, min(n, lo + step)) for lo in range(0, n, step)]]
    plan = threaded.Plan(n, per_sample, threads=count)
    assert plan.threads == min(count, n)
    assert [b for part in plan.parts for b in part] == plan.bounds
    assert plan.bounds[0][0] == 0 and plan.bounds[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(plan.bounds, plan.bounds[1:]))  # contiguous
    assert all(0 < hi - lo <= step for lo, hi in plan.bounds)
    sizes = [part[-1][1] - part[0][0] for part in plan.parts]
    assert max(sizes) - min(sizes) <= 1


def blas_threads():
    """The thread count of every BLAS library loaded, as threadpoolctl reads it."""
    return [p["num_threads"] for p in threadpool_info() if p["user_api"] == "blas"]


def test_plan_runs_each_part_on_its_thread_with_one_thread_blas(small_regions):
    before = threads.threads_in_force()
    try:
        threads.limit_threads(3)
        plan = threaded.Plan(9, 10, threads=3)

        def work(thread, lo, hi):
            return thread, lo, hi, blas_threads()

        results = plan.run(work)
        assert [(lo, hi) for _, lo, hi, _ in results] == plan.bounds  # chunk order
        for t, part in enumerate(plan.parts):
            assert {r[0] for r in results if (r[1], r[2]) in part} == {t}
        assert all(blas == [1] * len(blas) for *_, blas in results)
        after = blas_threads()
        assert after == [3] * len(after)
    finally:
        threads.limit_threads(before)


def test_a_plan_too_small_to_split_runs_its_products_on_one_blas_thread():
    before = threads.threads_in_force()
    try:
        threads.limit_threads(2)
        plan = threaded.Plan(4, 10)  # 40 bytes: under MIN_BYTES_PER_THREAD, not split
        assert plan.threads == 1
        assert plan.run(lambda thread, lo, hi: blas_threads()) == [[1] * len(blas_threads())]
        assert blas_threads() == [2] * len(blas_threads())  # restored after the plan
        threads.limit_threads(1)
        assert threaded.Plan(4, 10).run(lambda thread, lo, hi: blas_threads()) == [
            [1] * len(blas_threads())]
    finally:
        threads.limit_threads(before)


@pytest.mark.parametrize("count", [1, 2])
def test_a_small_product_runs_on_one_blas_thread_a_large_one_on_all(count):
    before = threads.threads_in_force()
    try:
        threads.limit_threads(count)
        small, large = threads.GEMM_THREADS_MIN_FLOPS - 1, threads.GEMM_THREADS_MIN_FLOPS
        with threads.blas_threads_for(small):
            inside_small = blas_threads()
        with threads.blas_threads_for(large):
            inside_large = blas_threads()
        assert inside_small == [1] * len(inside_small)
        assert inside_large == [count] * len(inside_large)
        assert blas_threads() == [count] * len(inside_large)
    finally:
        threads.limit_threads(before)


@pytest.mark.parametrize("batch", [3, 64])  # LeNet-5's layer: small products, then large
def test_linear_on_threads_equals_the_float64_products(at_threads, batch):
    x, w, b = (rand(shape, np.float32, seed) for shape, seed in
               (((batch, 400), 41), ((120, 400), 42), ((120,), 43)))
    g = rand((batch, 120), np.float32, 44)
    xt, wt, bt = (Tensor(a, requires_grad=True) for a in (x, w, b))
    out = F.linear(xt, wt, bt)
    out.backward(g)
    x64, w64, g64 = (a.astype(np.float64) for a in (x, w, g))
    for got, want in ((out.data, x64 @ w64.T + b), (xt.grad, g64 @ w64),
                      (wt.grad, g64.T @ x64), (bt.grad, g64.sum(axis=0))):
        # float32 sums of up to 400 products: within 1e-5 of the largest element
        assert np.abs(got - want).max() <= 1e-5 * np.abs(want).max()


@pytest.mark.skipif(numba.config.DISABLE_JIT, reason="the region kernels are Numba's")
def test_the_gemm_and_a_chunk_kernel_are_typed_once_not_at_every_call(monkeypatch):
    # Numba would rebuild a ctypes function's type from its 14 argument types, and a
    # compiled function's FunctionType, at every kernel call: 20-100 us each
    from numba.core.typing import ctypes_utils
    from numba.experimental import function_type

    function = gemm.native(np.float32)
    kept = numba.typeof(function)
    assert kept == ctypes_utils.make_function_type(function)
    ensure_compiled(parallel=True)
    (_, chunk), _ = unfold._regions(np.dtype(np.float32))
    chunk_type = numba.typeof(chunk)
    assert chunk_type == numba.types.FunctionType(chunk.signature())

    def fail(*args):
        raise AssertionError("typed again")

    monkeypatch.setattr(ctypes_utils, "make_function_type", fail)
    monkeypatch.setattr(function_type, "FunctionType", fail)
    assert numba.typeof(function) == kept
    assert numba.typeof(chunk) == chunk_type


def test_plan_raises_a_threads_error_after_every_thread_stopped(small_regions):
    finished = []

    def work(thread, lo, hi):
        if thread == 1:
            raise ValueError(f"chunk {lo}:{hi} failed")
        finished.append((lo, hi))

    plan = threaded.Plan(6, 10, threads=3)
    with pytest.raises(ValueError, match="failed"):
        plan.run(work)
    assert sorted(finished) == plan.parts[0] + plan.parts[2]


# (engine, x shape, w shape, stride, padding): each engine, odd sizes, 7 samples
CONV_CASES = [("winograd", (7, 32, 6, 5), (8, 32, 3, 3), 1, 1),
              ("rowtap", (7, 8, 7, 6), (6, 8, 5, 5), 1, 2),
              ("unfold, transposed backward", (7, 3, 9, 8), (4, 3, 3, 3), 1, 1),
              ("unfold, col2im backward", (7, 3, 9, 8), (4, 3, 3, 3), 2, 1)]


def output_gradient(x_shape, w_shape, stride, pad, dtype, seed):
    """A random gradient of the convolution's output, (N, F, OH, OW)."""
    oh = (x_shape[2] + 2 * pad - w_shape[2]) // stride + 1
    ow = (x_shape[3] + 2 * pad - w_shape[3]) // stride + 1
    return rand((x_shape[0], w_shape[0], oh, ow), dtype, seed)


def conv_step(x, w, b, g, stride, pad):
    """minidp's output and gradients (x, w, b) of sum(out * g)."""
    tensors = [Tensor(a.copy(), requires_grad=True) for a in (x, w, b)]
    out = F.conv2d(*tensors, stride=stride, padding=pad)
    out.backward(g)
    return [out.data] + [t.grad for t in tensors]


@pytest.mark.parametrize("engine,x_shape,w_shape,stride,pad", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_convolution_regions_on_threads(at_threads, small_regions, engine, x_shape, w_shape,
                                        stride, pad):
    chosen = ("winograd" if winograd.applies(x_shape, w_shape, stride, pad) else
              "rowtap" if rowtap.applies(x_shape, w_shape, stride, pad) else "unfold")
    assert engine.startswith(chosen)
    x, w, b = rand(x_shape, np.float64, 17), rand(w_shape, np.float64, 18), rand(
        w_shape[0], np.float64, 19)
    g = output_gradient(x_shape, w_shape, stride, pad, np.float64, 20)
    # the batch is split among the threads (off the kernels it is one chunk of references)
    assert conv_op.plan(x, 1).threads == (at_threads if use_kernels(x) else 1)
    for got, want in zip(conv_step(x, w, b, g, stride, pad), direct_conv(x, w, b, g, stride, pad)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)
    x32, w32, b32, g32 = (a.astype(np.float32) for a in (x, w, b, g))
    first, second = conv_step(x32, w32, b32, g32, stride, pad), conv_step(x32, w32, b32, g32,
                                                                          stride, pad)
    for a, c in zip(first, second):
        np.testing.assert_array_equal(a, c)  # bit-identical from run to run


# each engine's functions that run a region's chunks on the threads in one kernel call
# (the transposed backward pass keeps its Python steps)
REGION_CALLS = {"winograd": (wg, ("forward_region", "backward_region")),
                "rowtap": (taps, ("forward_region", "backward_region")),
                "unfold, transposed backward": (unfold, ("forward_region",)),
                "unfold, col2im backward": (unfold, ("forward_region", "backward_region"))}


def test_numpys_own_gemm_is_found_for_the_kernels():
    # NumPy's BLAS here (its wheel's OpenBLAS, or MKL) has cblas_?gemm: were it not found,
    # every chunk would quietly run its Python steps instead
    apis = {lib["internal_api"] for lib in threadpool_info() if lib["user_api"] == "blas"}
    assert apis & {"openblas", "mkl"}, apis
    for dtype in (np.float32, np.float64):
        assert gemm.native(dtype) is not None
    assert gemm.native(np.int32) is None


def test_a_gemm_without_numpys_bits_or_a_library_ctypes_cannot_open_is_not_used(tmp_path):
    assert gemm._open(str(tmp_path / "libmissing.so")) is None
    real = gemm.native(np.float32)
    assert gemm._gives_numpys_bits(real, np.float32)

    def twice(order, trans_a, trans_b, m, n, k, alpha, *rest):  # another product: 2 A B^T
        real(order, trans_a, trans_b, m, n, k, 2 * alpha, *rest)

    assert not gemm._gives_numpys_bits(twice, np.float32)


def layout(x, order):
    """``x`` as a C-ordered array, or as a Fortran-ordered one (a transposed C array)."""
    return np.ascontiguousarray(x) if order == "C" else np.asfortranarray(x)


# (m, k, n): small; a sum over k of more than one of the BLAS's blocks; an MLP layer's
@pytest.mark.parametrize("m,k,n", [(5, 7, 3), (6, 1000, 9), (64, 128, 100)])
@pytest.mark.parametrize("orders", ["CC", "CF", "FC", "FF"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_add_product_adds_numpys_product_in_the_blas(at_threads, m, k, n, orders, dtype):
    rng = np.random.default_rng(m + k + n)
    a = layout(rng.standard_normal((m, k)).astype(dtype), orders[0])
    b = layout(rng.standard_normal((k, n)).astype(dtype), orders[1])
    a[0] = -np.abs(a[0])  # a row of negative terms times a column of zeros: -0.0 products
    b[:, 0] = 0.0
    # into zeros: the bits of NumPy's product added to them, signed zeros included
    out = np.zeros((m, n), dtype)
    assert gemm.add_product(a, b, out)
    expected = np.zeros((m, n), dtype)
    expected += a @ b
    assert out.tobytes() == expected.tobytes()
    # into a nonzero array: its values plus the product (float64 sums, apart from the BLAS)
    start = rng.standard_normal((m, n)).astype(dtype)
    out = start.copy()
    assert gemm.add_product(a, b, out)
    exact = start.astype(np.float64) + np.einsum("ik,kj->ij", a.astype(np.float64),
                                                 b.astype(np.float64))
    tolerance = (2e-5 if dtype == np.float32 else 1e-12) * np.sqrt(k)
    np.testing.assert_allclose(out, exact, rtol=tolerance, atol=tolerance)


def test_add_product_declines_what_numpys_gemm_would_not_take_and_touches_nothing():
    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((4, 6)), rng.standard_normal((6, 5))
    declined = [
        (a[:, ::2], b[::2], np.ones((4, 5))),  # a strided operand (NumPy copies it first)
        (a[:1], b, np.ones((1, 5))),  # a side of 1: NumPy multiplies by gemv
        (a.astype(np.float32), b, np.ones((4, 5))),  # mixed dtypes
        (a.astype(np.int64), b.astype(np.int64), np.ones((4, 5), np.int64)),  # no BLAS
        (a, b[:, :4], np.ones((4, 5))),  # a product that does not fit out
        (a, b, np.ones((4, 10))[:, ::2]),  # out not contiguous
    ]
    for left, right, out in declined:
        before = out.copy()
        assert not gemm.add_product(left, right, out)
        assert np.array_equal(out, before)


def test_linear_adds_its_weight_gradient_into_the_flat_buffer_with_the_old_bits(monkeypatch):
    threshold = linalg_op.ADD_INTO_MIN_SIZE

    def gradients(direct, passes, hidden=(32, 16), minimum=0):
        monkeypatch.setattr(linalg_op, "ADD_INTO_MIN_SIZE", minimum)
        layers.manual_seed(3)
        model = layers.mlp(in_features=40, hidden=hidden)
        flat = layers.FlatParameters(list(model.parameters()))
        x = Tensor(np.random.default_rng(4).standard_normal((12, 40)).astype(np.float32))
        calls = []

        def counted(a, b, out):
            calls.append((out.shape, gemm.add_product(a, b, out) if direct else False))
            return calls[-1][1]

        monkeypatch.setattr(linalg_op, "add_product", counted)
        flat.zero_grad()
        for _ in range(passes):
            F.cross_entropy(model(x), np.arange(12) % 10).backward()
        return flat.grad.copy(), calls

    # one pass: the weights' gradients added in the product, with the bits of the
    # product added after it (the three weights, each once, the last layer's first)
    direct, calls = gradients(True, 1)
    after, declined = gradients(False, 1)
    shapes = [(10, 16), (16, 32), (32, 40)]
    assert calls == [(s, True) for s in shapes] and declined == [(s, False) for s in shapes]
    assert direct.tobytes() == after.tobytes()
    # two passes without zero_grad: each pass's gradient added in
    twice, _ = gradients(True, 2)
    np.testing.assert_allclose(twice, 2 * after, rtol=1e-6, atol=1e-9)
    # at minidp's threshold: only the weights of that many entries take the product
    assert 10 * 2048 < threshold <= 2048 * 40
    _, calls = gradients(True, 1, hidden=(2048,), minimum=threshold)
    assert calls == [((2048, 40), True)]


@pytest.mark.parametrize("engine,x_shape,w_shape,stride,pad", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_region_kernels_give_the_bits_of_numpys_matmul(at_threads, small_regions, monkeypatch,
                                                       engine, x_shape, w_shape, stride, pad):
    x, w, b = (rand(s, np.float32, 27 + k) for k, s in enumerate([x_shape, w_shape, w_shape[0]]))
    g = output_gradient(x_shape, w_shape, stride, pad, np.float32, 30)
    module, names = REGION_CALLS[engine]
    calls = []
    for name in names:  # count the region kernels' calls, so that the test sees them run
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: (
            calls.append(name), real(*a))[1])
    regions = conv_step(x, w, b, g, stride, pad)
    if at_threads == 1 or not use_kernels(x):  # no GIL shared on one thread; off the kernels
        assert calls == []  # (NUMBA_DISABLE_JIT) every chunk is NumPy's
        return
    assert sorted(calls) == sorted(names), calls  # one call for all of a region's chunks
    # the same steps in Python: NumPy's matmul on the same kernels' unfoldings
    monkeypatch.setattr(gemm, "native", lambda dtype: None)
    calls.clear()
    for got, want in zip(regions, conv_step(x, w, b, g, stride, pad)):
        np.testing.assert_array_equal(got, want)
    assert calls == []


@pytest.mark.parametrize("engine,x_shape,w_shape,stride,pad", CONV_CASES,
                         ids=[c[0] for c in CONV_CASES])
def test_region_kernels_without_a_bias_or_a_weight_gradient(at_threads, small_regions,
                                                            monkeypatch, engine, x_shape,
                                                            w_shape, stride, pad):
    # ResNet-20's convolutions have no bias, and a frozen layer wants no weight gradient
    x, w = rand(x_shape, np.float32, 50), rand(w_shape, np.float32, 51)
    g = output_gradient(x_shape, w_shape, stride, pad, np.float32, 52)
    module, names = REGION_CALLS[engine]
    calls = []
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, real=real, name=name: (
            calls.append(name), real(*a))[1])

    def step():
        xt, wt = Tensor(x.copy(), requires_grad=True), Tensor(w.copy())
        out = F.conv2d(xt, wt, stride=stride, padding=pad)
        out.backward(g)
        assert wt.grad is None
        return out.data, xt.grad

    regions = step()
    assert bool(calls) == (at_threads > 1 and use_kernels(x)), calls
    monkeypatch.setattr(gemm, "native", lambda dtype: None)  # the Python steps
    for got, want in zip(regions, step()):
        np.testing.assert_array_equal(got, want)


REGION_KERNELS = [(wg, "_forward_region_kernel"), (wg, "_backward_region_kernel"),
                  (taps, "_forward_region_kernel"), (taps, "_backward_region_kernel"),
                  (unfold, "_forward_region_kernel"), (unfold, "_backward_region_kernel")]


@pytest.mark.skipif(numba.config.NUMBA_NUM_THREADS < 2 or numba.config.DISABLE_JIT,
                    reason="region kernels run on two or more threads, on the Numba kernels")
def test_each_region_kernel_is_compiled_once_for_its_chunk_kernel_as_a_first_class_function(
        small_regions):
    # a region kernel given its chunk kernel as itself would compile the chunk into the
    # parallel kernel once more (30 s apiece): each must have one overload, taking a
    # first-class function
    threads.limit_threads(2)
    try:
        for _, x_shape, w_shape, stride, pad in CONV_CASES:
            x, w, b = (rand(s, np.float32, 40 + k) for k, s in enumerate([x_shape, w_shape,
                                                                          w_shape[0]]))
            conv_step(x, w, b, output_gradient(x_shape, w_shape, stride, pad, np.float32, 43),
                      stride, pad)
    finally:
        threads.limit_threads(threads.threads_per_rank())
    for module, name in REGION_KERNELS:
        kernel = getattr(module, name)
        assert len(kernel.overloads) == 1, (module.__name__, name, kernel.signatures)
        (signature,) = kernel.signatures
        assert isinstance(signature[2], numba.types.FunctionType), (name, signature)


def test_one_thread_a_side_of_one_float64_or_two_dtypes_keep_the_python_steps():
    a32, a64 = np.zeros((2, 2), np.float32), np.zeros((2, 2))
    two, one = threaded.Plan(8, 1 << 20, threads=2), threaded.Plan(8, 1 << 20, threads=1)
    assert two.threads == 2 and one.threads == 1
    expected = gemm.native(np.float32) if use_kernels(a32) else None  # None off the kernels
    assert gemm.region_gemm([a32, a32], (2, 3, 4), two) is expected
    assert gemm.region_gemm([a32, a32], (2, 3, 4), one) is None
    assert gemm.region_gemm([a32, a32], (2, 1, 4), two) is None  # NumPy multiplies by gemv
    assert gemm.region_gemm([a64, a64], (2, 3, 4), two) is None
    assert gemm.region_gemm([a32, a64], (2, 3, 4), two) is None
    frozen = a32.copy()
    frozen.flags.writeable = False  # the region kernels are compiled for writeable arrays
    assert gemm.region_gemm([frozen, a32], (2, 3, 4), two) is None
    assert gemm.region_gemm([np.zeros((2, 4), np.float32)[:, ::2], a32], (2, 3, 4),
                              two) is None  # not C-contiguous
    # a single filter: the Python steps, still the textbook's result
    x, w, b = rand((3, 2, 6, 6), np.float64, 31), rand((1, 2, 3, 3), np.float64, 32), rand(
        1, np.float64, 33)
    g = rand((3, 1, 6, 6), np.float64, 34)
    for got, want in zip(conv_step(x, w, b, g, 1, 1), direct_conv(x, w, b, g, 1, 1)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


def lenet_gradients(x, y):
    model = layers.lenet5()
    for k, p in enumerate(model.parameters()):
        p.data[...] = rand(p.data.shape, np.float32, 30 + k) * 0.1
    F.cross_entropy(model(Tensor(x)), y).backward()
    return [p.grad.copy() for p in model.parameters()]


def test_a_model_is_bit_identical_across_runs_on_threads(at_threads, small_regions):
    x, y = rand((12, 1, 28, 28), np.float32, 21), np.arange(12) % 10
    first, second = lenet_gradients(x, y), lenet_gradients(x, y)
    for a, b in zip(first, second):
        np.testing.assert_array_equal(a, b)
    threads.limit_threads(1)
    for a, b in zip(first, lenet_gradients(x, y)):  # summation order only
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6)


def test_three_threads_in_a_process_started_with_three():
    if numba.config.NUMBA_NUM_THREADS >= 3:
        pytest.skip("this process runs the 3-thread cases itself")
    env = dict(os.environ, MINIDP_NUM_THREADS="3", NUMBA_NUM_THREADS="3")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           __file__, "-k", "3threads"], env=env, capture_output=True,
                          text=True, timeout=1200)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert " passed" in done.stdout and "skipped" not in done.stdout, done.stdout[-3000:]
