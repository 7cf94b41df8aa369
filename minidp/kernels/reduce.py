"""A node's sum of its ranks' segments, over one rank's slice, on that rank's threads.

A node reduces in shared memory (:mod:`minidp.comm.allreducers.hierarchical`): its window
holds one row per local rank, and local rank k sums columns [lo, hi) of every row into
row 0, divides them by ``divisor`` (a mean) and, when nothing is left to do across nodes,
copies the result into the other rows while it is in cache::

    whole[0, i] = (whole[0, i] + whole[1, i] + ... + whole[G-1, i]) / divisor
    whole[r, i] = whole[0, i]                                   (broadcast)

The sums are added row after row in the window's dtype, as NumPy's in-place adds do,
and the division is one operation in that dtype: the bits of NumPy's passes. The work
goes by blocks of :data:`BLOCK` columns (every row's block stays in L2 from the sum to
the copies), serially or with ``prange`` over the blocks on the rank's threads
(:func:`minidp.kernels.threaded.spread`); each column is one thread's either way, so
the thread count changes no bit.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import spread

BLOCK = 1 << 15  # columns per block: 128 KB of float32 per row


@numba.njit(cache=True, nogil=True)
def _sum_block(whole, lo, hi, divisor, broadcast):  # pragma: no cover - compiled
    """Columns [lo, hi): the sum into row 0, the division, the copies.

    Each loop runs over a view of the block's columns from 0, not over [lo, hi) of the
    whole row: an index from ``lo`` is not provably non-negative, so Numba's
    negative-index wrap would stay in the loop and keep it from being vectorised
    (the serial sum of two 1M-column rows took 3 times as long, measured).
    """
    acc = whole[0, lo:hi]
    for r in range(1, whole.shape[0]):
        row = whole[r, lo:hi]
        for i in range(acc.size):
            acc[i] += row[i]
    if divisor != 1:
        for i in range(acc.size):
            acc[i] /= divisor
    if broadcast:
        for r in range(1, whole.shape[0]):
            row = whole[r, lo:hi]
            for i in range(acc.size):
                row[i] = acc[i]


@numba.njit(cache=True, nogil=True)
def _node_sum_kernel(whole, lo, hi, divisor, broadcast):  # pragma: no cover - compiled
    for start in range(lo, hi, BLOCK):
        _sum_block(whole, start, min(hi, start + BLOCK), divisor, broadcast)


@numba.njit(cache=True, nogil=True, parallel=True)
def _node_sum_parallel(whole, lo, hi, divisor, broadcast):  # pragma: no cover - compiled
    for b in numba.prange((hi - lo + BLOCK - 1) // BLOCK):
        start = lo + b * BLOCK
        _sum_block(whole, start, min(hi, start + BLOCK), divisor, broadcast)


def node_sum_reference(whole: Any, lo: int, hi: int, divisor: int = 1,
                       broadcast: bool = False) -> None:
    """NumPy's passes over each block: the in-place adds, the division, the copies."""
    for start in range(lo, hi, BLOCK):
        block = slice(start, min(start + BLOCK, hi))
        acc = whole[0, block]
        for row in whole[1:, block]:
            acc += row
        if divisor != 1:
            acc /= divisor
        if broadcast:
            for row in whole[1:, block]:
                row[...] = acc


def node_sum(whole: Any, lo: int, hi: int, divisor: int = 1, broadcast: bool = False) -> None:
    """Sum columns [lo, hi) of the rows of ``whole`` into row 0, in place (module docstring).

    Args:
        whole: the node window's rows (G, n), each row contiguous.
        lo: the first column of this rank's slice.
        hi: the end of the slice (one past its last column).
        divisor: divide the sums by it (1: a plain sum).
        broadcast: copy the result into every other row too.
    """
    if not (use_kernels(whole) and whole.dtype.kind == "f" and whole.strides[1] == whole.itemsize):
        node_sum_reference(whole, lo, hi, divisor, broadcast)
        return
    ensure_compiled()
    kernel = _node_sum_parallel if spread(whole.shape[0] * (hi - lo)) else _node_sum_kernel
    kernel(whole, lo, hi, whole.dtype.type(divisor), bool(broadcast))


def _warm_with(kernel, dtype: type) -> None:
    # a window's rows are a view of wider rows, unless the segments need no padding
    for whole in (np.zeros((2, 4), dtype=dtype)[:, :3], np.zeros((2, 3), dtype=dtype)):
        kernel(whole, 0, 3, dtype(2), True)


@register_warmup
def _warm(dtype: type) -> None:
    _warm_with(_node_sum_kernel, dtype)


@register_parallel_warmup
def _warm_parallel(dtype: type) -> None:
    _warm_with(_node_sum_parallel, dtype)
