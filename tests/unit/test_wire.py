"""The 16-bit wire formats of DASO's down-cast: rounding, decoding, the MPI sum."""

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm.wire import HalfSum, decode, encode, round_to


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_bf16_keeps_the_top_16_bits_rounded_to_nearest_even(dtype):
    x = np.array([1.0, 1 + 2**-8, 1 + 2**-7 + 2**-9, 3.14159, -2.5e-3, 1 + 3 * 2**-8], dtype)
    words = encode(x, "bf16", np.empty(x.size, np.uint16))
    b = decode(words, "bf16", np.empty_like(x))
    assert b.dtype == dtype
    assert np.all(b.astype(np.float32).view(np.uint32) & 0xFFFF == 0)
    np.testing.assert_allclose(b, x, rtol=2**-8)
    assert b[1] == 1.0                   # a tie rounds to the even neighbour (down)
    assert b[5] == 1 + 4 * 2**-8         # ... and up when the even one is above
    assert b[2] == 1 + 2**-7             # below half rounds down
    np.testing.assert_array_equal(round_to(x, "bf16"), b)
    assert words[0] == 0x3F80            # 1.0 in bfloat16


def test_fp16_is_ieee_half_and_nan_survives_bf16():
    x = np.array([3.14159, 65504.0, np.nan, -np.inf], np.float32)
    assert round_to(x, "fp16")[0] == np.float16(3.14159)
    words = encode(x, "fp16", np.empty(4, np.uint16))
    np.testing.assert_array_equal(words, x.astype(np.float16).view(np.uint16))
    b = round_to(x, "bf16")
    assert np.isnan(b[2]) and b[3] == -np.inf
    big = np.array([np.float32(np.nan)]).view(np.uint32) | np.uint32(0x7FFFFFFF)
    assert np.isnan(round_to(big.view(np.float32), "bf16")[0])  # no carry into infinity


@pytest.mark.parametrize("kind", ["bf16", "fp16"])
def test_the_mpi_sum_adds_in_float32_and_rounds_once(kind):
    a = np.array([1.0, 2.0**-9, 300.0, -7.25], np.float32)
    b = np.array([2.0**-8, 1.0, 0.5, 7.25], np.float32)
    wa = encode(a, kind, np.empty(4, np.uint16))
    wb = encode(b, kind, np.empty(4, np.uint16))
    op = HalfSum(kind)
    try:
        op.op.Reduce_local(wa, wb)
    finally:
        op.free()
    got = decode(wb, kind, np.empty(4, np.float32))
    expected = round_to(round_to(a, kind) + round_to(b, kind), kind)
    np.testing.assert_array_equal(got, expected)
    assert op.op == MPI.OP_NULL


def test_a_bad_kind_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="wire format: got 'bf8', allowed: bf16, fp16"):
        encode(np.ones(2), "bf8", np.empty(2, np.uint16))
