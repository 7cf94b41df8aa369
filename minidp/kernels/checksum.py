"""The dataset file's position-weighted byte checksum, in one pass.

``S1 = sum(b_k)`` and ``S2 = sum((start + k + 1) * b_k)`` modulo 2**64 over a byte
range that starts at payload position ``start`` (see :mod:`minidp.io.mdp`). NumPy
needs a uint64 copy and a weight array per chunk (about 0.1 GB/s here); the kernel
streams the bytes once. On the rank's threads (:func:`minidp.kernels.threaded.spread`)
each block of :data:`_CHUNK` bytes gets its own two sums, added afterwards: integer sums
modulo 2**64 in any order, so the result is exact at every thread count.
"""

from __future__ import annotations

import numba
import numpy as np

from minidp.kernels.jit import (
    ensure_compiled,
    register_parallel_warmup,
    register_warmup,
    use_kernels,
)
from minidp.kernels.threaded import spread

_CHUNK = 1 << 22


@numba.njit(cache=True, nogil=True)
def _checksum_kernel(data, start):  # pragma: no cover - compiled
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    weight = np.uint64(start)
    for k in range(data.size):
        weight += np.uint64(1)
        b = np.uint64(data[k])
        s1 += b
        s2 += weight * b
    return s1, s2


@numba.njit(cache=True, nogil=True, parallel=True)
def _checksum_parallel(data, start):  # pragma: no cover - compiled
    blocks = (data.size + _CHUNK - 1) // _CHUNK
    sums = np.zeros((blocks, 2), dtype=np.uint64)
    for b in numba.prange(blocks):
        lo = b * _CHUNK
        sums[b, 0], sums[b, 1] = _checksum_kernel(data[lo:min(data.size, lo + _CHUNK)],
                                                  start + np.uint64(lo))
    s1 = np.uint64(0)
    s2 = np.uint64(0)
    for b in range(blocks):
        s1 += sums[b, 0]
        s2 += sums[b, 1]
    return s1, s2


def checksum_reference(data: np.ndarray, start: int = 0) -> tuple[int, int]:
    """NumPy version, in 4 MiB pieces so memory stays bounded."""
    s1 = s2 = np.uint64(0)
    with np.errstate(over="ignore"):
        for a in range(0, data.size, _CHUNK):
            chunk = data[a:a + _CHUNK].astype(np.uint64)
            weights = np.arange(start + a + 1, start + a + 1 + chunk.size, dtype=np.uint64)
            s1 += chunk.sum(dtype=np.uint64)
            s2 += np.dot(chunk, weights)
    return int(s1), int(s2)


def byte_checksum(data: np.ndarray, start: int = 0) -> tuple[int, int]:
    """(S1, S2) of the bytes of ``data`` placed at payload position ``start``."""
    data = np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    if not use_kernels(data):
        return checksum_reference(data, start)
    ensure_compiled()
    kernel = _checksum_parallel if spread(data.size) and data.size > _CHUNK else _checksum_kernel
    s1, s2 = kernel(data, np.uint64(start))
    return int(s1), int(s2)


@register_warmup
def _warm(dtype: type) -> None:
    _checksum_kernel(np.zeros(2, dtype=np.uint8), np.uint64(0))


@register_parallel_warmup
def _warm_parallel(dtype: type) -> None:
    _checksum_parallel(np.zeros(2, dtype=np.uint8), np.uint64(0))
