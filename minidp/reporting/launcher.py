"""Starting MPI jobs from Python: which ``mpiexec``, and a job that a timeout ends whole.

``compare``, ``simulate --validate`` and the benchmarks start their jobs here (the tests
take :func:`mpiexec` from here and launch through ``tests/spmd.py``), each in a process
group of its own, so that a timeout kills every rank and leaves no orphan holding a core.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys


def mpiexec() -> str:
    """The launcher: the mpiexec beside this Python (the mpich wheel's), else PATH's.

    With ``make venv MPI=system`` there is none beside the interpreter, and the system
    MPI's own (Open MPI's, a cluster's) is the one on PATH.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.path.exists(beside):
        return beside
    found = shutil.which("mpiexec")
    if found is None:
        raise ValueError("mpiexec: none beside this Python and none on PATH, allowed: the "
                         "mpich wheel's (pip install mpich) or a system MPI's on PATH")
    return found


def run_job(command: list[str], timeout: float, env: dict[str, str] | None = None,
            cwd: str | None = None) -> tuple[int, str]:
    """Run one job in its own process group (a timeout kills every rank); status, output.

    Also the job runner of the benchmarks and of ``simulate --validate``. The job gets
    ``env``, by default this process's ``os.environ``, which Python copied at start-up:
    importing minidp initialises MPI, and Open MPI's singleton then adds variables to
    the process's C environment (PMIX_*, OMPI_MCA_ess=singleton, ...) that a child
    ``mpiexec`` would inherit and fail on.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env=dict(os.environ) if env is None else env, cwd=cwd)
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        return -signal.SIGKILL, output + f"\n(killed after {timeout:g} s)"
    return proc.returncode, output
