"""Load a compiled kernel from Numba's cache without loading Numba's compiler.

Before Numba loads a kernel from its on-disk cache, it fills the compiler's typing and
lowering registries (``BaseContext.refresh``): it imports some 200 modules of its own
(NumPy's and Python's implementations, the typed containers, the extension entry
points) that only compiling needs. A cached kernel is machine code: rebuilding it needs
the code generator, Numba's runtime (NRT) for the kernels that allocate, and the
re-initialisation a ``prange`` kernel carries with it (its thread pool), nothing of the
registries. The refresh cost about 0.25-0.3 s of CPU in every process that calls a
kernel, a third of a training rank's start-up on the machine of docs/benchmarks.md:
every rank of every job pays it, and the test suite starts some 600 of them.

:func:`install` replaces ``Cache.load_overload`` (numba.core.caching) with the same
steps minus the refresh: initialise the runtime, then load. Compiling is unchanged:
Numba's compiler refreshes the registries itself before it compiles (a cache miss, a
new signature, a user's own ``@njit`` in the same process). Where this Numba's
internals are not the ones this was written against (numba 0.58-0.68), nothing is
replaced and each load refreshes as before.
"""

from __future__ import annotations

from typing import Any

from numba.core import caching
from numba.core.runtime import rtsys

# Numba's own method, once replaced: benchmarks/bench_start.py puts it back in a process to
# time a start with the refresh.
NUMBA_LOAD: dict = {}


def _load_without_refresh(self: Any, sig: Any, target_context: Any) -> Any:
    """``Cache.load_overload`` without ``target_context.refresh()``.

    NRT is what the refresh initialised that loaded code links against; the rest of the
    method is Numba's own (the guard turns a racing cache write into a miss).
    """
    rtsys.initialize(target_context)
    with self._guard_against_spurious_io_errors():
        return self._load_overload(sig, target_context)
    return None  # the guard swallowed an error: a miss, as in Numba's method


def install() -> bool:
    """Make cache loads skip the refresh; False where Numba's internals differ."""
    cache = getattr(caching, "Cache", None)
    needed = ("load_overload", "_load_overload", "_guard_against_spurious_io_errors")
    if cache is None or not all(hasattr(cache, name) for name in needed) \
            or not hasattr(rtsys, "initialize"):
        return False
    NUMBA_LOAD["load_overload"] = cache.load_overload
    cache.load_overload = _load_without_refresh
    return True
