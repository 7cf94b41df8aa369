"""Keep large temporaries in the heap: glibc's malloc tuned for training loops.

A training step allocates the same large arrays every time (im2col columns of
several MB, col2im and gradient buffers). glibc serves blocks above its mmap
threshold with a fresh ``mmap`` and returns them with ``munmap`` on free, so every
step pays page faults and kernel zeroing for each of them; measured here, that
doubled LeNet-5's step time (14 ms against 7.5 ms) and made it jittery. Raising the
mmap threshold (to glibc's maximum, 32 MB on 64-bit) and the trim threshold keeps
those blocks in the heap for reuse, which is what PyTorch's caching allocators
achieve for tensors.

Applied once at import on glibc systems; explicit ``MALLOC_MMAP_THRESHOLD_`` /
``MALLOC_TRIM_THRESHOLD_`` settings win, and ``MINIDP_MALLOC_TUNING=0`` turns it off.
"""

from __future__ import annotations

import ctypes
import os

M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 1024 * 1024
TRIM_THRESHOLD = 512 * 1024 * 1024


def tune_malloc() -> bool:
    """Raise glibc's mmap and trim thresholds; returns whether anything was changed."""
    if os.environ.get("MINIDP_MALLOC_TUNING", "1") == "0":
        return False
    try:
        # The running process's own symbols, libc's among them: finding libc by name
        # (ctypes.util.find_library) runs ``ldconfig -p``, a fork of the whole process,
        # in every rank (6 ms here, once NumPy and Numba are loaded).
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # not glibc (musl, macOS): nothing to tune
    changed = False
    if "MALLOC_MMAP_THRESHOLD_" not in os.environ:
        changed |= bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_MAX))
    if "MALLOC_TRIM_THRESHOLD_" not in os.environ:
        changed |= bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return changed
