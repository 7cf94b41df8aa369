"""Compile Numba kernels once per node, and decide when they are used at all.

Four ranks compiling one kernel at once took about 20 s each on a 2-core machine;
loading it from Numba's on-disk cache takes well under a second. So the first use
of any kernel fills the cache one kernel module at a time, each under an exclusive file
lock of its own beside the cache: a process compiles (for float32 and float64) every
module whose lock it can take and that no one has filled yet, then waits for the modules
others hold, and writes a stamp per module once it is in. The ranks of a node starting
together so fill the cache on as many cores as they are (one module each at a time),
instead of one rank compiling everything while the others wait: about a minute of CPU
split across them. Each module is compiled once. A file lock needs no MPI, so kernels
stay below the communication layer. The ``prange`` kernels are a second tier, filled the
same way but only when a process first runs one (more than one thread): most of the
compilation time is theirs, and a run of one thread per rank never calls them.

Once every kernel is in the cache, loading them all still costs each process about half
a second, most of it for kernels its model never calls (an MLP needs none of the
convolution engines). So the process that filled the cache writes a stamp beside it,
named by everything the cache's entries depend on (Numba and Python versions, the CPU,
the digest of each kernel module's contents); a process that finds the stamp takes no
lock and loads nothing up front: Numba loads each kernel from the cache at its first call
(about 15 ms), without filling its compiler's registries (:mod:`.cached`: 0.24-0.27 s of
each process's start otherwise). Editing a kernel file, another CPU sharing the
directory, or another Numba makes another stamp name, and the cache is filled again; a
second checkout or a fresh clone of the same kernels does not (:mod:`.locator` files the
kernels by their contents, not by the checkout's path).

The cache and its locks live in a per-user directory: ``NUMBA_CACHE_DIR`` when set,
else ``$XDG_CACHE_HOME/minidp/numba`` (``~/.cache/minidp/numba``), so users of one
node never share (or block on) each other's files. A lock is waited for at most
:data:`LOCK_TIMEOUT_S`; its holder writes its process id, host and start time into
the lock file, and a timeout names them.

Kernels run only on NumPy arrays and only when the JIT is on: with
``NUMBA_DISABLE_JIT=1`` (or on CuPy arrays) the plain NumPy references are used,
which keeps that mode fast enough to run the whole test suite.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import sys
import time
from collections.abc import Callable, Iterator

import llvmlite.binding as llvm
import numba
import numpy as np

from minidp.kernels import cached, locator

# Compiling every kernel (serial and parallel, float32 and float64) takes about a minute
# of CPU, and 7 minutes of wall time were measured on 2 cores shared with 15 other jobs.
LOCK_TIMEOUT_S = 1200.0

_warmups: list[Callable[[type], None]] = []
_parallel_warmups: list[Callable[[type], None]] = []
_state = {"ready": False, "parallel_ready": False, "references_only": False}


def cache_dir() -> str:
    """Where compiled kernels and the lock live (per user; see the module docstring)."""
    if numba.config.CACHE_DIR:
        return numba.config.CACHE_DIR
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "minidp", "numba")


# Numba reads its cache location when a kernel module decorates its functions, which
# happens after this module is imported: point it at the per-user directory now.
numba.config.CACHE_DIR = cache_dir()
cached.install()  # a kernel loaded from the cache skips the compiler's registries
locator.install()  # and is found by its contents, wherever the checkout is


def jit_enabled() -> bool:
    """Whether Numba compiles kernels (False under ``NUMBA_DISABLE_JIT=1``)."""
    return not numba.config.DISABLE_JIT


def use_kernels(*arrays: object) -> bool:
    """Whether the Numba kernels should run on these arrays (NumPy, JIT enabled)."""
    return (jit_enabled() and not _state["references_only"]
            and all(isinstance(a, np.ndarray) for a in arrays))


def references_forced() -> bool:
    """Whether :func:`references_only` is in force (the CUDA kernels obey it too)."""
    return _state["references_only"]


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


def register_parallel_warmup(fn: Callable[[type], None]) -> Callable[[type], None]:
    """Register a warm-up of a module's ``prange`` kernels.

    They are compiled only once a process runs one (:func:`ensure_compiled` with
    ``parallel=True``, from ``threaded.spread`` and the convolutions' region kernels).
    """
    _parallel_warmups.append(fn)
    return fn


@contextlib.contextmanager
def node_lock(path: str, timeout: float | None = LOCK_TIMEOUT_S) -> Iterator[bool]:
    """Hold the exclusive file lock ``path``; past ``timeout`` s, raise naming its holder.

    ``timeout=None``: take it only if it is free now; yields whether it was taken.
    """
    directory = os.path.dirname(path)
    try:
        os.makedirs(directory, exist_ok=True)
        lock = open(path, "a+")  # noqa: SIM115 (held across the yield)
    except OSError as exc:
        raise OSError(f"JIT cache: cannot open the lock '{path}' ({exc.strerror}); set "
                      "NUMBA_CACHE_DIR to a directory of your own") from None
    with lock:
        deadline = time.monotonic() + (timeout or 0.0)
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if timeout is None:
                    yield False
                    return
                if time.monotonic() > deadline:
                    lock.seek(0)
                    holder = lock.read().strip() or "a process that wrote nothing"
                    raise TimeoutError(f"JIT cache: the lock '{path}' is still held after "
                                       f"{timeout:g} s, by {holder}; if that process is "
                                       "gone, delete the file") from None
                time.sleep(0.05)
        try:
            lock.seek(0)
            lock.truncate()
            lock.write(f"pid {os.getpid()} on {socket.gethostname()} since "
                       f"{time.strftime('%Y-%m-%d %H:%M:%S')}")
            lock.flush()
            yield True
        finally:
            lock.truncate(0)
            fcntl.flock(lock, fcntl.LOCK_UN)


def _stamp_name(parts: list[str], suffix: str) -> str:
    """A file in the cache directory named by the digest of ``parts``."""
    parts = [numba.__version__, sys.version, llvm.get_process_triple(),
             llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten(),
             locator.filed_under(), *parts]
    digest = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:20]
    return os.path.join(cache_dir(), f"minidp-jit-{digest}{suffix}")


def _source(path: str) -> str:
    """What the cache keys a kernel file by: its name and the digest of its contents."""
    return f"{os.path.basename(path)} {locator.source_digest(path)}"


def _kernel_files(parallel: bool = False) -> dict[str, list[Callable[[type], None]]]:
    """Each kernel module's file and its warm-ups of one tier, in registration order."""
    files: dict[str, list[Callable[[type], None]]] = {}
    for warm in _parallel_warmups if parallel else _warmups:
        files.setdefault(sys.modules[warm.__module__].__file__, []).append(warm)
    return files


def _tier(parallel: bool) -> str:
    return "-parallel" if parallel else ""


def cache_stamp(parallel: bool = False) -> str:
    """The path of the stamp saying the cache holds every kernel of a tier.

    The tier: the serial kernels, or with ``parallel`` the ``prange`` ones, as their
    source is now.
    """
    return _stamp_name([_source(path) for path in sorted(_kernel_files(parallel))],
                       f"{_tier(parallel)}.complete")


def module_stamp(path: str, parallel: bool = False) -> str:
    """The stamp saying the tier's kernels of the module file ``path`` are in the cache."""
    return _stamp_name([_source(path)], f"{_tier(parallel)}.module")


def module_lock(path: str, parallel: bool = False) -> str:
    """The lock under which the tier's kernels of the module file ``path`` are compiled."""
    name = os.path.splitext(os.path.basename(path))[0]
    return os.path.join(cache_dir(), f"minidp-jit-{name}{_tier(parallel)}.lock")


def _write_stamp(path: str, what: str) -> None:
    with open(path, "w") as f:
        f.write(f"{what} compiled by pid {os.getpid()} on {socket.gethostname()} at "
                f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n")


def _fill_module(path: str, warmups: list[Callable[[type], None]], parallel: bool) -> None:
    """Compile (or load) the module's kernels of the tier for both dtypes, then stamp it.

    The caller holds the module's lock of the tier.
    """
    if not os.path.exists(module_stamp(path, parallel)):
        for warm in warmups:
            for dtype in (np.float32, np.float64):
                warm(dtype)
        _write_stamp(module_stamp(path, parallel), f"the kernels of {path}")


def ensure_compiled(parallel: bool = False) -> None:
    """Make sure every registered kernel of a tier is in the cache, compiled once per node.

    Two tiers: the serial kernels, which every kernel call needs, and with ``parallel``
    the ``prange`` ones, which only a process running more than one thread calls (their
    compilation is about 60% of the whole: a run of one thread per rank never pays it).
    Without the tier's stamp (:func:`cache_stamp`), each kernel module whose lock is free
    and whose own stamp is missing is filled here; then the modules that other processes
    hold are waited for (their lock, at most :data:`LOCK_TIMEOUT_S`), so that every
    module is in before this returns; then the stamp is written. With the stamp, nothing
    is loaded until a kernel is called.
    """
    flag = "parallel_ready" if parallel else "ready"
    if _state[flag] or not jit_enabled():
        return
    stamp = cache_stamp(parallel)
    if not os.path.exists(stamp):
        pending = {path: warmups for path, warmups in _kernel_files(parallel).items()
                   if not os.path.exists(module_stamp(path, parallel))}
        for path, warmups in list(pending.items()):  # the free ones, on this core
            with node_lock(module_lock(path, parallel), timeout=None) as taken:
                if taken:
                    _fill_module(path, warmups, parallel)
                    del pending[path]
        for path, warmups in pending.items():  # those others were filling
            with node_lock(module_lock(path, parallel), LOCK_TIMEOUT_S):
                _fill_module(path, warmups, parallel)
        _write_stamp(stamp, "every kernel" + (" of prange" if parallel else ""))
    _state[flag] = True
