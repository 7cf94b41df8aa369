"""Thread control: one BLAS/Numba thread per rank unless the node's ranks leave cores free.

Oversubscription is the quiet killer of CPU data parallelism: with four ranks on two
cores, two BLAS threads per rank made matmul 8 times slower here. minidp therefore
sets the thread count itself, before the first matmul, from the first of:

1. ``MINIDP_NUM_THREADS`` (minidp's own override);
2. ``OMP_NUM_THREADS`` as the user set it (a cluster's job script often does);
3. ``SLURM_CPUS_PER_TASK`` (the scheduler's cores for each rank);
4. the cores this process may use divided by the ranks on this node, from the
   launcher's environment (MPICH/Hydra's ``MPI_LOCALNRANKS``, Open MPI's
   ``OMPI_COMM_WORLD_LOCAL_SIZE``, Slurm), read before MPI is initialised.

``python -m minidp info`` prints the count and which of these chose it. A bad value
cannot break ``import minidp`` (the next source decides instead); :func:`check` makes
it a user error naming the variable when a command starts, as it does for more threads
than the cores this process may run on.

The counts minidp fills in are its own defaults, not the user's settings, and must not
pass for them in a child process: ``minidp compare`` imports minidp (one process, all
cores: 2 threads here) and then launches ``mpiexec`` jobs, whose ranks would otherwise
read the inherited ``OMP_NUM_THREADS=2`` as the user's choice and run 4 ranks x 2
threads on 2 cores. So the variables filled in are also listed, with their values, in
``MINIDP_THREAD_DEFAULTS``; a process that finds a variable still at the value listed
there treats it as unset and decides again from its own launcher's environment.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                    "NUMBA_NUM_THREADS")
DEFAULTS_VARIABLE = "MINIDP_THREAD_DEFAULTS"


def _inherited_defaults() -> set[str]:
    """Thread variables that still hold the value a minidp process filled in.

    That process is a parent, or this one once :func:`set_thread_environment` has run.
    """
    listed = (item.split("=", 1) for item in os.environ.get(DEFAULTS_VARIABLE, "").split(",")
              if "=" in item)
    return {name for name, value in listed if os.environ.get(name) == value}


# As the user's environment had it, before set_thread_environment() fills in defaults.
_INHERITED_TEXT = os.environ.get(DEFAULTS_VARIABLE, "")
_INHERITED = _inherited_defaults()
_USER_OMP = "" if "OMP_NUM_THREADS" in _INHERITED else os.environ.get("OMP_NUM_THREADS", "")

_LOCAL_SIZE_VARIABLES = (
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
)

def local_rank_count() -> int:
    """Number of ranks on this node according to the launcher, 1 outside mpiexec."""
    for name in _LOCAL_SIZE_VARIABLES:
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    return 1


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, not the machine's total)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def _count(text: str) -> int | None:
    text = text.strip()
    return int(text) if text.isdigit() and int(text) >= 1 else None


def choice() -> tuple[int, str]:
    """(threads per rank, what chose it), from the sources in the module docstring."""
    for name, text in (("MINIDP_NUM_THREADS", os.environ.get("MINIDP_NUM_THREADS", "")),
                       ("OMP_NUM_THREADS", _USER_OMP),
                       ("SLURM_CPUS_PER_TASK", os.environ.get("SLURM_CPUS_PER_TASK", ""))):
        if _count(text):
            return _count(text), f"{name}={text.strip()}"
    cores, ranks = available_cores(), local_rank_count()
    return max(1, cores // ranks), f"{cores} core(s) / {ranks} rank(s) on this node"


def threads_per_rank() -> int:
    """The thread count minidp uses (:func:`choice`)."""
    return choice()[0]


def check() -> None:
    """Raise ValueError naming a set but unusable thread variable (a user error).

    A count that is not a positive integer; ``MINIDP_NUM_THREADS`` above the cores this
    process may run on (more BLAS threads than cores only slow a rank, and
    ``MINIDP_NUM_THREADS=100000`` would start that many); ``MINIDP_THREAD_DEFAULTS`` that
    is not what a parent minidp process writes there.
    """
    for name, text in (("MINIDP_NUM_THREADS", os.environ.get("MINIDP_NUM_THREADS", "")),
                       ("OMP_NUM_THREADS", _USER_OMP)):
        if text.strip() and not _count(text):
            raise ValueError(f"{name}: got {text!r}, allowed: a positive integer (threads "
                             "per rank)")
    count, source = choice()
    cores = available_cores()
    if source.startswith("MINIDP_NUM_THREADS=") and count > cores:
        raise ValueError(f"MINIDP_NUM_THREADS: got {count}, allowed: 1 to {cores} (the cores "
                         "this process may run on; threads per rank)")
    for item in filter(None, _INHERITED_TEXT.split(",")):
        name, _, value = item.partition("=")
        if name not in THREAD_VARIABLES or not _count(value):
            raise ValueError(f"{DEFAULTS_VARIABLE}: got {_INHERITED_TEXT!r}, allowed: what "
                             "minidp writes there for its child processes, NAME=N[,NAME=N...] "
                             f"with NAME one of {', '.join(THREAD_VARIABLES)} and N >= 1; "
                             "unset it")


# How the runtimes' idle threads wait, read once by each library as it loads. Left to
# themselves, OpenBLAS's worker spins 2**28 cycles (0.1 s) after its work and GNU
# OpenMP's threads about a millisecond. A rank's other cores are shared by OpenBLAS's
# worker (a large linear layer's GEMM), Numba's OpenMP threads (every parallel kernel,
# and every convolution region: minidp.kernels.threaded.Plan.run_kernel) and minidp's
# own Python pool (the few regions that keep Python steps: float64, the transposed
# backward pass). A worker that spun for long held the core that the next pool's thread
# needed: a parallel SGD step of 0.1 ms took 3.7 ms after a GEMM, and the MLP's and
# LeNet-5's steps at 2 threads took twice their 1-thread steps (docs/benchmarks.md). So
# OpenBLAS's worker spins 2**14 cycles (7 us) and sleeps, and an OpenMP runtime sleeps at
# once (PASSIVE), except GNU OpenMP's (Numba's on Linux), whose threads spin 10000 rounds
# (GOMP_SPINCOUNT, which it reads over the wait policy; 0.1-0.3 ms on 2026-12-03's
# machine): a step's next parallel kernel or region finds them awake (2-5 us to start one
# there, against 115-150 us once they slept, on a virtual machine whose idle cores halt),
# and they are asleep before a layer as long as a large GEMM needs OpenBLAS's worker on
# the core. They spin only where the node's ranks times their threads fit its cores
# (:func:`idle_wait_settings`): a rank's spinning thread must not take another rank's core.
IDLE_WAIT = {"OPENBLAS_THREAD_TIMEOUT": "14", "OMP_WAIT_POLICY": "PASSIVE",
             "GOMP_SPINCOUNT": "10000"}


@contextlib.contextmanager
def idle_wait_settings() -> Iterator[None]:
    """:data:`IDLE_WAIT`'s values while the libraries load, where the user set none.

    Only while: they are this process's tuning, and a child process (a PyTorch job that
    ``benchmarks/bench_layouts.py`` launches) gets the user's environment, not minidp's.
    A user's ``OMP_WAIT_POLICY`` decides OpenMP's wait alone (no spin count is added to
    it), and OpenMP spins only where the ranks on this node times :func:`threads_per_rank`
    are at most the cores this process may use.
    """
    fits = local_rank_count() * threads_per_rank() <= available_cores()
    filled = [name for name in IDLE_WAIT if name not in os.environ
              and not (name == "GOMP_SPINCOUNT"
                       and ("OMP_WAIT_POLICY" in os.environ or not fits))]
    os.environ.update({name: IDLE_WAIT[name] for name in filled})
    try:
        yield
    finally:
        for name in filled:
            os.environ.pop(name, None)


def user_environment() -> dict[str, str]:
    """This process's environment without the thread counts minidp filled in.

    For a child process that is not minidp's (a PyTorch job): it chooses its threads as
    it would alone. The idle-wait settings (:data:`IDLE_WAIT`) are never left in the
    environment, so there is nothing of them to take out.
    """
    filled = _inherited_defaults()
    return {name: value for name, value in os.environ.items()
            if name not in filled and name != DEFAULTS_VARIABLE}


def set_thread_environment() -> int:
    """Export thread counts for libraries not yet loaded; returns the count chosen.

    Called before NumPy is imported, so OpenBLAS/MKL start with the right pool size.
    Explicit user settings of the library-specific variables are respected; the ones
    filled in are listed in ``MINIDP_THREAD_DEFAULTS`` (see the module docstring).
    ``NUMBA_NUM_THREADS`` is left alone where Numba was imported first.
    """
    n = threads_per_rank()
    filled = []
    for name in THREAD_VARIABLES:
        if name == "NUMBA_NUM_THREADS" and "numba" in sys.modules:
            # Numba, imported before minidp, has read it: every later compile checks that
            # it has not changed since the pool started, and a new value would fail it.
            # limit_threads sets the count in force on that pool instead. A parent's
            # default left as it was stays listed as one, not taken for the user's.
            if name in _INHERITED:
                filled.append(f"{name}={os.environ[name]}")
            continue
        users = "" if name in _INHERITED else os.environ.get(name, "")
        if not users or (name == "OMP_NUM_THREADS" and not _count(users)):
            os.environ[name] = str(n)  # unset, a parent's default, or unusable: ours
            filled.append(f"{name}={n}")
    os.environ[DEFAULTS_VARIABLE] = ",".join(filled)
    return n


def limit_threads(n: int | None = None) -> int:
    """Set this process's thread count now, for every pool at once; returns the count.

    This is the one place the count is applied: Numba's kernels (``prange``), BLAS,
    and minidp's own regions (:mod:`minidp.kernels.threaded`) all read it from here.
    """
    n = threads_per_rank() if n is None else n
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    # after numba: setting its threads may load an OpenMP runtime that must be limited too
    threadpool_limits(limits=n)
    _in_force["threads"] = n
    return n


# The count limit_threads applied last, and the BLAS libraries' controllers (looked up
# once: a threadpoolctl scan takes about 5 ms, one controller's set about 4 us).
_in_force: dict = {"threads": 1, "blas": None}


def threads_in_force() -> int:
    """The thread count :func:`limit_threads` applied last (1 before it ran)."""
    return _in_force["threads"]


@contextlib.contextmanager
def blas_single_threaded() -> Iterator[None]:
    """Run BLAS on one thread inside, as many as :func:`limit_threads` set afterwards.

    For a region whose own threads each call BLAS: with BLAS's pool at T threads too,
    T threads calling it would run T*T on T cores (a GEMM inside a parallel region runs
    single-threaded; outside one, the GEMM's own threads are the region).
    """
    if _in_force["blas"] is None:
        from threadpoolctl import ThreadpoolController

        _in_force["blas"] = ThreadpoolController().select(user_api="blas").lib_controllers
    for lib in _in_force["blas"]:
        lib.set_num_threads(1)
    try:
        yield
    finally:
        for lib in _in_force["blas"]:
            lib.set_num_threads(_in_force["threads"])


# Below this many FLOPs (2 per multiply-add) a product outside a region runs on one BLAS
# thread even when the rank has more. Waking OpenBLAS's sleeping worker (IDLE_WAIT) costs
# more than a second thread saves on a small product: measured between 0.2 ms of other
# work, as in a step, on 2 cores (docs/benchmarks.md), LeNet-5's fully connected products
# (1.3-6.1 MFLOP) took 1.2-3.3 times as long on 2 threads as on 1, while its convolution's
# 15 MFLOP products and the MLP's 34-103 MFLOP ones ran 1.05-1.86 times faster.
GEMM_THREADS_MIN_FLOPS = 10 * 10**6


def blas_threads_for(flops: int) -> contextlib.AbstractContextManager:
    """BLAS on one thread inside for a product of fewer than :data:`GEMM_THREADS_MIN_FLOPS`.

    Nothing changes on one thread or for a product large enough for every thread. For
    the products outside a region (a region's own run on one thread throughout).
    """
    if _in_force["threads"] > 1 and flops < GEMM_THREADS_MIN_FLOPS:
        return blas_single_threaded()
    return contextlib.nullcontext()


def thread_info() -> dict:
    """Describe the thread pools in effect (for ``python -m minidp info``)."""
    import numba
    from threadpoolctl import threadpool_info

    pools = [{"library": p.get("internal_api"), "threads": p.get("num_threads"),
              "version": p.get("version")} for p in threadpool_info()]
    try:  # known once a parallel kernel ran: tbb, omp or workqueue, whichever loaded first
        layer = numba.threading_layer()
    except ValueError:
        layer = f"not loaded yet (asked for: {numba.config.THREADING_LAYER})"
    n, reason = choice()
    cores, ranks = available_cores(), local_rank_count()
    return {"local_ranks": ranks, "cores": cores, "threads_per_rank": n, "chosen_by": reason,
            "pools": pools, "numba_threading_layer": layer,
            "how_to_set": (
                "ranks per node: the launcher's (mpiexec -n / -ppn, srun --ntasks-per-node); "
                "threads per rank: MINIDP_NUM_THREADS (else OMP_NUM_THREADS, "
                "SLURM_CPUS_PER_TASK, cores / ranks on the node). Keep ranks per node x "
                f"threads per rank = the node's cores (here: {ranks} x {n} on {cores}); "
                "benchmarks/bench_layouts.py measures which split is fastest for a model")}
