"""Thread control: one BLAS/Numba thread per rank unless the node's ranks leave cores free.

Oversubscription is the quiet killer of CPU data parallelism: with four ranks on two
cores, two BLAS threads per rank made matmul 8 times slower here. minidp therefore
sets the thread count itself, from the number of ranks that share this node. The
local rank count comes from the launcher's environment (MPICH/Hydra's
``MPI_LOCALNRANKS``, Open MPI's ``OMPI_COMM_WORLD_LOCAL_SIZE``, Slurm), read before
MPI is initialised, so the limit is in force before the first matmul.
``MINIDP_NUM_THREADS`` overrides the choice.
"""

from __future__ import annotations

import os

_LOCAL_SIZE_VARIABLES = (
    "MPI_LOCALNRANKS",
    "OMPI_COMM_WORLD_LOCAL_SIZE",
    "MV2_COMM_WORLD_LOCAL_SIZE",
    "SLURM_NTASKS_PER_NODE",
)

THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "NUMBA_NUM_THREADS")


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


def threads_per_rank() -> int:
    """The thread count minidp uses: ``MINIDP_NUM_THREADS``, else cores // local ranks."""
    override = os.environ.get("MINIDP_NUM_THREADS", "")
    if override:
        if not override.isdigit() or int(override) < 1:
            raise ValueError(
                f"MINIDP_NUM_THREADS: got {override!r}, allowed: a positive integer"
            )
        return int(override)
    return max(1, available_cores() // local_rank_count())


def set_thread_environment() -> int:
    """Export thread counts for libraries not yet loaded; returns the count chosen.

    Called before NumPy is imported, so OpenBLAS/MKL start with the right pool size.
    Explicit user settings of these variables are respected.
    """
    n = threads_per_rank()
    for name in THREAD_VARIABLES:
        os.environ.setdefault(name, str(n))
    return n


def limit_threads(n: int | None = None) -> int:
    """Limit the BLAS and Numba thread pools of this process now; returns the count."""
    n = threads_per_rank() if n is None else n
    import numba
    from threadpoolctl import threadpool_limits

    numba.set_num_threads(min(n, numba.config.NUMBA_NUM_THREADS))
    # after numba: setting its threads may load an OpenMP runtime that must be limited too
    threadpool_limits(limits=n)
    return n


def thread_info() -> dict:
    """Describe the thread pools in effect (for ``python -m minidp info``)."""
    from threadpoolctl import threadpool_info

    pools = [{"library": p.get("internal_api"), "threads": p.get("num_threads"),
              "version": p.get("version")} for p in threadpool_info()]
    return {"local_ranks": local_rank_count(), "cores": available_cores(),
            "threads_per_rank": threads_per_rank(), "pools": pools}
