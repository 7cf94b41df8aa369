"""How the kernels split their work among the rank's threads.

Two ways, each where it pays:

* A kernel that streams over a tensor (batch norm, pooling, the elementwise and
  optimizer kernels) is split by Numba: ``prange`` over channels, images or blocks of
  elements, each thread's piece large. :func:`spread` decides: on one thread, or under
  :data:`SPREAD_MIN_ELEMENTS`, the kernel's serial loop runs instead, since waking the
  other threads costs microseconds that a small array does not repay. The serial and
  the parallel loops call one compiled body per channel, image or block, so they give
  the same bits.
* A convolution's loop over its batch, below.

The convolutions (:mod:`minidp.autograd.ops.conv` and its engines) process a batch in
chunks of a few samples: unfold or transform (Numba), multiply (BLAS), fold or
transform back (Numba), each chunk while it is in cache. With T threads
(:func:`minidp.threads.threads_in_force`) the batch is cut into T contiguous parts of
equal numbers of samples (give or take one), each part into chunks as one thread would
cut it, and thread t runs part t's chunks from start to finish: its own unfolding, its
own GEMMs, into its own buffers. So every stage of a chunk runs in parallel, the GEMMs
included, and each GEMM has the shape one thread gave it; BLAS's own threads would
instead split each small per-sample product, with a fork and a join every time.

* BLAS runs on one thread while a region runs (:func:`minidp.threads.blas_single_threaded`):
  T threads each calling a T-thread BLAS would put T*T threads on T cores.
* A region runs one of two ways on two or more threads. On the Numba kernels in float32
  (with NumPy's own ``cblas_sgemm`` found, :mod:`minidp.kernels.gemm`) each engine has a
  region kernel: one parallel Numba call whose ``prange`` over the T threads gives
  thread t part t's chunks, each run by the engine's chunk kernel (unfold or transform,
  GEMMs called inside, fold or transform back) into thread t's buffers
  (:meth:`Plan.run_kernel`). No Python runs in the region and no GIL is taken; its
  threads are Numba's OpenMP threads, the ones the streaming kernels run on, which spin
  briefly after each kernel (:data:`minidp.threads.IDLE_WAIT`), so that the step's next
  region or kernel finds them awake. Elsewhere (float64, the transposed backward pass, a
  product with a side of 1: :func:`minidp.kernels.gemm.region_gemm`) the Python
  threads of one persistent pool each run their part's chunks as Python steps around
  serial kernels (:meth:`Plan.run`); those kernels are compiled serial because Numba's
  workqueue threading layer, the one that is always there, aborts when two threads
  launch parallel kernels at once. On one thread the Python steps run; a region kernel
  runs the same steps with the products NumPy's matmul would call, so both give the same
  bits. (The Python pool ran every region until 2026-12-03: a thread that came back from
  a kernel to its chunk's few lines of Python while the other held the GIL slept, and
  on a virtual machine whose idle cores halt it was woken 50-250 us later; handing a
  region to the sleeping pool cost 190-240 us, against 2-5 us to start a parallel kernel
  on threads still spinning.)
* Results come back in chunk order, and the callers add the weight gradient's chunk
  sums in that order, so a run at a fixed thread count is bit-reproducible whichever
  thread finishes first. One thread cuts the chunks one thread always cut (the bits of
  the code before threads); T threads cut other chunks, so a weight gradient is summed
  in another order and its last bits change with the thread count.
* A batch with less than :data:`MIN_BYTES_PER_THREAD` of unfolded data per thread is
  not split: the region then runs on the caller's thread, in one-thread chunks.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import TypeVar

import numba
import numpy as np
from numba.core.types.function_type import CompileResultWAP
from numba.core.typing.typeof import typeof_impl
from numba.experimental import function_type  # noqa: F401 (how a call types and passes one)

from minidp.kernels.jit import ensure_compiled
from minidp.threads import blas_single_threaded, threads_in_force

# Columns (or Winograd tiles) of one chunk, in bytes. A ResNet-20 step was fastest
# with 1-4 MB here (within L3; a smaller chunk stays in L2 but pays the per-chunk
# overhead more often, a whole batch goes out to memory). Measured with chunks of
# Python steps, before the region kernels.
CHUNK_BYTES = 1 << 21

# Under this many elements a kernel stays on one thread: a parallel launch costs 2-5 us
# while the other threads still spin, 15-80 us once they sleep (minidp.threads.IDLE_WAIT;
# the longer they slept, the more), what 64K-128K float32 elements take to stream through
# one core. Measured between GEMMs, as in a step, with the threads asleep: relu on 64K
# elements 14 us serial, 21 us on 2 threads; on 128K 36 and 30 us.
SPREAD_MIN_ELEMENTS = 1 << 17

# Below this much unfolded data per thread, handing work to the other threads (about
# 50 us per region when they sleep, measured with the Python pool) costs more than a
# second thread saves; LeNet-5's layers at batch 64 carry
# 4-5 MB, its smallest batches (and every evaluation batch of a few samples) less.
MIN_BYTES_PER_THREAD = 1 << 18

_R = TypeVar("_R")
_pool: dict = {"size": 0, "executor": None}
_lock = threading.Lock()
_region = threading.local()  # .inside: this thread runs part of a Plan


def spread(elements: int) -> bool:
    """Whether a kernel over ``elements`` values runs its ``prange`` loop (see above).

    Never inside a :class:`Plan`'s region: there each thread is one of the T already
    (and Numba's workqueue layer aborts on parallel launches from two threads at once).
    """
    if (elements < SPREAD_MIN_ELEMENTS or threads_in_force() == 1
            or getattr(_region, "inside", False)):
        return False
    ensure_compiled(parallel=True)  # the prange kernels, once per node, at the first use
    return True


def _executor(workers: int) -> ThreadPoolExecutor:
    """The process's pool, of at least ``workers`` threads.

    It only grows: a smaller thread count leaves threads idle, asleep on its queue.
    """
    with _lock:
        if _pool["size"] < workers:
            if _pool["executor"] is not None:
                _pool["executor"].shutdown(wait=True)
            _pool["executor"] = ThreadPoolExecutor(workers, thread_name_prefix="minidp-conv")
            _pool["size"] = workers
        return _pool["executor"]


def _even(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """``parts`` contiguous ranges covering [lo, hi), their sizes differing by at most 1."""
    size, extra = divmod(hi - lo, parts)
    bounds, start = [], lo
    for k in range(parts):
        end = start + size + (k < extra)
        bounds.append((start, end))
        start = end
    return bounds


class Plan:
    """Which samples of a batch each thread processes, and in which chunks.

    Args:
        n: samples in the batch.
        bytes_per_sample: what one sample unfolds (or transforms) into, in bytes.
        chunked: False off the kernels (CuPy, ``NUMBA_DISABLE_JIT=1``): the whole batch
            is one chunk of the vectorised NumPy/CuPy references, on one thread.
        threads: the thread count to plan for (default: the count in force).

    Attributes:
        parts: one list of (lo, hi) chunk bounds per thread, in sample order.
    """

    def __init__(self, n: int, bytes_per_sample: int, chunked: bool = True,
                 threads: int | None = None) -> None:
        threads = threads_in_force() if threads is None else threads
        step = max(1, min(n, CHUNK_BYTES // max(1, bytes_per_sample))) if chunked else n
        # a batch too small to split still runs its chunks' small products on one BLAS
        # thread: BLAS's own threads on them cost more than they save (run)
        self.one_blas_thread = chunked and threads > 1
        if (not chunked or threads < 2 or n < threads
                or n * bytes_per_sample < threads * MIN_BYTES_PER_THREAD):
            self.parts = [[(lo, min(n, lo + step)) for lo in range(0, n, step)]]
            return
        self.parts = [_even(lo, hi, math.ceil((hi - lo) / step))
                      for lo, hi in _even(0, n, threads)]

    @property
    def bounds(self) -> list[tuple[int, int]]:
        """Every chunk's (lo, hi), in sample order."""
        return [b for part in self.parts for b in part]

    @property
    def threads(self) -> int:
        """How many threads run the plan."""
        return len(self.parts)

    @property
    def largest(self) -> int:
        """Samples in the largest chunk (what a thread's buffers must hold)."""
        return max(hi - lo for lo, hi in self.bounds)

    def run_kernel(self, kernel: Callable, *args: object) -> None:
        """Run every chunk in one parallel kernel call: ``kernel(bounds, starts, *args)``.

        ``bounds`` (chunks, 2) holds every chunk's (lo, hi) in sample order and ``starts``
        (threads + 1) where each thread's chunks begin in it, so the kernel's ``prange``
        over the threads gives thread t the chunks ``starts[t]:starts[t + 1]``, each run
        as one call of its chunk kernel (the first of ``args``, :func:`first_class`)
        into thread t's buffers. No Python thread and no GIL in the region: Numba's
        threads run it, the ones its streaming kernels run on (see
        :data:`minidp.threads.IDLE_WAIT`). BLAS runs on one thread meanwhile, as in
        :meth:`run`.
        """
        bounds = np.array(self.bounds, dtype=np.int64).reshape(-1, 2)
        starts = np.cumsum([0] + [len(part) for part in self.parts], dtype=np.int64)
        with blas_single_threaded():
            kernel(bounds, starts, *args)

    def run(self, work: Callable[[int, int, int], _R]) -> list[_R]:
        """Call ``work(thread, lo, hi)`` for every chunk; the results in chunk order.

        Thread 0 is the caller's; the others are the pool's. Each thread runs its part's
        chunks in order, with BLAS on one thread while the plan runs whenever the rank has
        more than one (its products are per chunk or per sample, small). An
        exception in any thread is raised here once every thread has stopped, so no
        thread still writes into the caller's arrays when it returns.
        """
        def part(t: int) -> list[_R]:
            _region.inside = self.threads > 1
            try:
                return [work(t, lo, hi) for lo, hi in self.parts[t]]
            finally:
                _region.inside = False

        if self.threads == 1:
            if not self.one_blas_thread:
                return part(0)
            with blas_single_threaded():
                return part(0)
        ensure_compiled()  # here, not in two threads at once
        with blas_single_threaded():
            executor = _executor(self.threads - 1)
            futures: list[Future] = [executor.submit(part, t) for t in range(1, self.threads)]
            try:
                results = part(0)
            finally:
                for future in futures:
                    future.exception()  # waits
        for future in futures:
            results += future.result()
        return results


def c_array(dtype: object, ndim: int) -> object:
    """Numba's type of a C-contiguous, aligned, writeable array (for explicit signatures)."""
    return numba.types.Array(numba.from_dtype(np.dtype(dtype)), ndim, "C")


def first_class(region: Callable, chunk: Callable, chunk_args: tuple,
                region_args: tuple) -> tuple:
    """(region kernel, its chunk kernel as a first-class function), compiled once.

    The chunk kernel is compiled for the types ``chunk_args``, the region kernel for the
    plan's ``bounds`` and ``starts`` (:meth:`Plan.run_kernel`), the chunk kernel as a
    first-class function of ``chunk_args`` (Numba's ``FunctionType``), then
    ``region_args``. Each engine lists those types in its ``_regions(dtype)`` (``a(n)``:
    an n-dimensional C array of the dtype) and keeps what this returns.

    A region kernel takes its chunk kernel as a first-class function and calls it through
    its address. A Numba function passed as itself would be compiled into the region
    kernel: LLVM then optimises the whole chunk again inside the parallel kernel's code,
    twice (the loop body and the kernel around it), and the three engines' region
    kernels took 93 s more to compile than their chunk kernels alone; through the
    address a region kernel compiles in 1.5 s, and the chunk kernel once, by itself.

    Both are compiled, or loaded from Numba's cache, here; then the region kernel
    compiles no more, so that nothing can compile the chunk into it, and a call with an
    array of another type (strided, readonly, another dtype or number of dimensions)
    raises TypeError instead (:func:`minidp.kernels.gemm.region_gemm` keeps such arrays
    on the Python steps). The chunk kernel goes in wrapped as its compiled code (Numba's
    ``CompileResultWAP``, its type kept: :class:`_ChunkKernel`): the dispatcher would be
    converted anew at every call (100 us).
    Call it once per process, after ``ensure_compiled(parallel=True)`` (the node's lock:
    the ranks of a node compile once); the engines keep what it returns.

    An exception inside a chunk kernel cannot cross its first-class call (Numba's C
    wrapper prints it and returns), so the chunk kernels raise none: they index without
    bounds checks, and allocate only a few kilobytes of scratch.
    """
    chunk_signature = numba.types.void(*chunk_args)
    chunk.compile(chunk_signature)
    region.compile(numba.types.void(numba.types.int64[:, ::1], numba.types.int64[::1],
                                    numba.types.FunctionType(chunk_signature), *region_args))
    region.disable_compile()
    return region, _ChunkKernel(chunk.overloads[chunk_signature.args])


class _ChunkKernel(CompileResultWAP):
    """A chunk kernel's compiled code, as a first-class function typed once.

    Numba types each argument of a kernel call, and would build a new ``FunctionType``
    for a compiled function every time; this one keeps it (as the BLAS's product keeps
    its own: :func:`minidp.kernels.gemm._typed`).
    """

    def __init__(self, compiled: object) -> None:
        super().__init__(compiled)
        self.numba_type = numba.types.FunctionType(self.signature())


@typeof_impl.register(_ChunkKernel)
def _typeof_chunk_kernel(value: _ChunkKernel, context: object) -> object:
    return value.numba_type


def fold(parts: list) -> object:
    """The sum of a list of arrays in list order: ``total = parts[0]; total += ...``."""
    total = parts[0]
    for part in parts[1:]:
        total += part
    return total
