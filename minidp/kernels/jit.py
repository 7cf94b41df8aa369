"""Compile Numba kernels once per node, and decide when they are used at all.

Four ranks compiling one kernel at once took about 20 s each on a 2-core machine;
loading it from Numba's on-disk cache takes well under a second. So the first use
of any kernel takes an exclusive file lock beside the cache and compiles (or loads)
every kernel for float32 and float64 inside it: the first rank of a node compiles
and writes the cache, the others wait on the lock and then only load. A file lock
needs no MPI, so kernels stay below the communication layer.

Kernels run only on NumPy arrays and only when the JIT is on: with
``NUMBA_DISABLE_JIT=1`` (or on CuPy arrays) the plain NumPy references are used,
which keeps that mode fast enough to run the whole test suite.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from collections.abc import Callable, Iterator

import numba
import numpy as np

_warmups: list[Callable[[type], None]] = []
_state = {"ready": False, "references_only": False}


def jit_enabled() -> bool:
    """Whether Numba compiles kernels (False under ``NUMBA_DISABLE_JIT=1``)."""
    return not numba.config.DISABLE_JIT


def use_kernels(*arrays: object) -> bool:
    """Whether the Numba kernels should run on these arrays (NumPy, JIT enabled)."""
    return (jit_enabled() and not _state["references_only"]
            and all(isinstance(a, np.ndarray) for a in arrays))


@contextlib.contextmanager
def references_only() -> Iterator[None]:
    """Run the NumPy references instead of the kernels (benchmarks compare the two)."""
    previous = _state["references_only"]
    _state["references_only"] = True
    try:
        yield
    finally:
        _state["references_only"] = previous


def register_warmup(fn: Callable[[type], None]) -> Callable[[type], None]:
    """Register a function that calls a module's kernels on tiny inputs of one dtype."""
    _warmups.append(fn)
    return fn


def _lock_path() -> str:
    cache_dir = numba.config.CACHE_DIR or os.path.join(os.path.dirname(__file__), "__pycache__")
    try:
        os.makedirs(cache_dir, exist_ok=True)
        probe = os.path.join(cache_dir, ".minidp-write-test")
        with open(probe, "w"):
            pass
        os.remove(probe)
    except OSError:
        cache_dir = tempfile.gettempdir()
    return os.path.join(cache_dir, "minidp-jit.lock")


def ensure_compiled() -> None:
    """Compile or load every registered kernel, one process per node at a time."""
    if _state["ready"] or not jit_enabled():
        return
    with open(_lock_path(), "a+") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            for warm in _warmups:
                for dtype in (np.float32, np.float64):
                    warm(dtype)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    _state["ready"] = True
