"""Where Numba caches minidp's kernels: named by what they are, not by where the checkout is.

Numba files a kernel's compiled code under a directory named by the *directory* of its
source file (a digest of ``/path/to/checkout/minidp/kernels``). A second checkout, a
fresh clone, a new virtual environment or a copy of the package on a cluster's file
system therefore found none of it and compiled every kernel again: about 90 s of CPU on
the 2-core machine of docs/benchmarks.md, the first minute and more of every fresh
clone's ``make test``.

:class:`KernelLocator` keeps Numba's file names (the module, the function, its line, the
Python version), stamps each file's entries with the SHA-256 of its source (Numba's own
stamp is, by version, the file's modification time and size or such a digest: a clone
changes the time, never the contents), and files every minidp kernel under one directory
of the cache, ``minidp-kernels``. The same kernel source so finds its compiled code
wherever the package lies, and an edited kernel file is compiled again, alone. Numba's
index also keys each entry by the signature and the CPU (its name and features), so
machines of different kinds sharing one cache directory keep apart.

As with Numba's own locators, a kernel that calls a compiled function of another file
is stamped by its own file only; minidp's kernels call only functions of their own file
(the helpers of each module sit beside its kernels). Written against the locator
interface of ``numba.core.caching`` (its implementation class is ``CacheImpl`` in Numba
0.60 and later, ``_CacheImpl`` before); where Numba has neither, :func:`install` changes
nothing and Numba's own locators file the kernels.
"""

from __future__ import annotations

import functools
import hashlib
import os
from typing import Any

from numba.core import caching, config

KERNELS = os.path.dirname(os.path.abspath(__file__))
SUBDIRECTORY = "minidp-kernels"


class KernelLocator(caching._SourceFileBackedLocatorMixin, caching._CacheLocator):
    """Numba's cache locator for the functions of ``minidp/kernels/``, under one directory.

    The file names are Numba's (the mixin's); the directory and the stamp differ from
    Numba's ``UserProvidedCacheLocator``, which names the directory by the path.
    """

    def __init__(self, py_func: Any, py_file: str) -> None:
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self._cache_path = os.path.join(config.CACHE_DIR, SUBDIRECTORY)

    def get_cache_path(self) -> str:
        """The one directory of every minidp kernel's cache files."""
        return self._cache_path

    def get_source_stamp(self) -> str:
        """The digest of the kernel file's contents (its entries are stale once it differs)."""
        return source_digest(self._py_file)

    @classmethod
    def from_function(cls, py_func: Any, py_file: str) -> KernelLocator | None:
        """A locator for a function of ``minidp/kernels/`` (None otherwise: Numba's own)."""
        if not config.CACHE_DIR or os.path.dirname(os.path.abspath(py_file)) != KERNELS:
            return None
        return super().from_function(py_func, py_file)


def source_digest(path: str) -> str:
    """SHA-256 of the file at ``path``, read again only once its time or size changes."""
    status = os.stat(path)
    return _digest(path, status.st_mtime_ns, status.st_size)


@functools.lru_cache(maxsize=None)
def _digest(path: str, mtime_ns: int, size: int) -> str:
    """The digest of one version of a file: the time and size are the cache's key."""
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _cache_impl() -> Any:
    """Numba's class that picks a cached function's locator (None where it has none)."""
    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    return impl if hasattr(impl, "_locator_classes") else None


def install() -> bool:
    """Put :class:`KernelLocator` first among Numba's locators; False where Numba differs."""
    impl = _cache_impl()
    if impl is None:
        return False
    if KernelLocator not in impl._locator_classes:
        impl._locator_classes = [KernelLocator, *impl._locator_classes]
    return True


def filed_under() -> str:
    """Where the kernels' cache entries are: what a stamp of a filled cache must name.

    Under :class:`KernelLocator`, one directory for every checkout; under Numba's own
    locators, a directory named by this checkout's path, so that a stamp written by one
    layout never vouches for entries the other would look for.
    """
    impl = _cache_impl()
    if impl is not None and KernelLocator in impl._locator_classes:
        return SUBDIRECTORY
    return KERNELS
