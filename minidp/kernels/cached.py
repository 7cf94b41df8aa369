"""Load a compiled kernel from Numba's cache without filling its compiler's registries.

Before Numba loads a kernel from its on-disk cache, it fills the compiler's typing and
lowering registries (``BaseContext.refresh``): it imports some 70 more of its modules
(its implementations of NumPy and of Python's built-ins, the typed containers) and
installs their definitions, which only compiling needs. A cached kernel is machine code:
rebuilding it needs the code generator and the symbols the code links against (Numba's
runtime, NRT, for the kernels that allocate; the hash secrets that
``numba.cpython.hashing`` registers when imported, for code that hashes), and the
re-initialisation a ``prange`` kernel carries with it (its thread pool), nothing of the
registries. The refresh cost 0.24-0.27 s of CPU in every process that calls a kernel
(``benchmarks/bench_start.py``), a third of a training rank's start on the machine of
docs/benchmarks.md: every rank of every job pays it, and the test suite starts some 600.

:func:`install` gives the CPU dispatchers' cache (``numba.core.caching.FunctionCache``)
a ``load_overload`` of its own that does the same steps minus the refresh: register those
symbols, then load. Numba's method stays on the base class, ``Cache``, where CUDA's cache
still finds it. Compiling is unchanged: Numba's compiler refreshes the registries itself
before it compiles (a cache miss, a new signature, a user's own ``@njit`` in the same
process). Written against Numba 0.58-0.68: where the methods it calls are missing,
nothing is replaced, and each load refreshes as before.
"""

from __future__ import annotations

from typing import Any

from numba.core import caching
from numba.core.runtime import rtsys


def _load_without_refresh(self: Any, sig: Any, target_context: Any) -> Any:
    """``Cache.load_overload`` without ``target_context.refresh()``.

    The refresh's side effects that loaded code needs come first: NRT, and the hash
    secrets (registered as LLVM symbols by importing ``numba.cpython.hashing``; no minidp
    kernel hashes today, a later one may). The rest is Numba's own method; it returns
    None for a miss, and where the guard swallows a spurious file error (Windows only).
    """
    from numba.cpython import hashing  # noqa: F401 (its import registers the symbols)

    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)


def install() -> bool:
    """Make the CPU dispatchers' cache loads skip the refresh; False where Numba differs."""
    cache = getattr(caching, "FunctionCache", None)
    needed = ("load_overload", "_load_overload", "_guard_against_spurious_io_errors")
    if cache is None or not all(hasattr(cache, name) for name in needed) \
            or not hasattr(rtsys, "initialize"):
        return False
    cache.load_overload = _load_without_refresh
    return True
