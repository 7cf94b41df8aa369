"""Starting MPI jobs from Python: which ``mpiexec``, and a job that ends whole, leaving nothing.

``compare``, ``simulate --validate`` and the benchmarks start their jobs here (the tests
take :func:`mpiexec` from here and launch through ``tests/spmd.py``), each in a process
group of its own. A job that runs past its timeout (or whose caller is interrupted, by
Ctrl-C or a signal) is ended in two steps: SIGTERM to its process group, which the
launcher forwards to every rank (MPICH's Hydra and Open MPI's ``mpirun`` both do), so
``minidp train`` stops at its next batch with a checkpoint and MPI removes its files;
then, after :data:`GRACE_S` seconds, SIGKILL to the group and to every process below the
launcher (Hydra starts each rank in a session of its own). Last, the shared-memory files
the job's processes were seen using that no live process uses any more are removed
(:mod:`minidp.reporting.shm`): those of this job only, never another's.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time

from minidp.reporting.shm import ShmWatch, has_ended, start_time

GRACE_S = 30.0  # after SIGTERM: a checkpoint's save on a loaded machine, then SIGKILL
TIMED_OUT = 124  # the status of a job ended by its timeout, as timeout(1) gives it
LINGER_S = 10.0  # at most, for killed ranks to be torn down before their files are removed


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
            cwd: str | None = None, grace_s: float = GRACE_S) -> tuple[int, str]:
    """Run one job in its own process group; (exit status, output), nothing left behind.

    Also the job runner of the benchmarks and of ``simulate --validate``. The job gets
    ``env``, by default this process's ``os.environ``, which Python copied at start-up:
    importing minidp initialises MPI, and Open MPI's singleton then adds variables to
    the process's C environment (PMIX_*, OMPI_MCA_ess=singleton, ...) that a child
    ``mpiexec`` would inherit and fail on.

    A job past ``timeout`` seconds is ended (SIGTERM, then SIGKILL after ``grace_s``: see
    the module doc) and its status is :data:`TIMED_OUT`; its output ends with a line that
    says so. An exception in the caller while it waits (KeyboardInterrupt) ends the job
    the same way before it goes on. Either way, and after a job that failed, the
    shared-memory files the job left are removed.
    """
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True,
                            env=dict(os.environ) if env is None else env, cwd=cwd)
    watch = ShmWatch(proc.pid)
    try:
        output, _ = proc.communicate(timeout=timeout)
        status = proc.returncode
    except subprocess.TimeoutExpired:
        output, how = end_job(proc, watch, grace_s)
        output += f"\n(ended after {timeout:g} s, its timeout: {how})"
        status = TIMED_OUT
    except BaseException:
        end_job(proc, watch, grace_s)
        watch.remove_leftovers()
        raise
    watch.remove_leftovers()
    return status, output


def end_job(proc: subprocess.Popen, watch: ShmWatch, grace_s: float) -> tuple[str, str]:
    """SIGTERM to the job's group, SIGKILL to all of it after ``grace_s``: (output, how)."""
    ranks = watch.sample()  # the files of the job, and its processes, before they go
    _signal_group(proc.pid, signal.SIGTERM)
    try:
        output, _ = proc.communicate(timeout=grace_s)
        how = "SIGTERM"
    except subprocess.TimeoutExpired:
        ranks |= watch.sample()
        _signal_group(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        how = f"SIGTERM, then SIGKILL after {grace_s:g} s"
    # Ranks in sessions of their own may outlive the launcher; none may stay. A killed
    # process maps its files until the kernel has torn it down: its files are removed
    # only once it has (remove_leftovers skips a file that a live process maps).
    ranks.discard(proc.pid)
    for pid in sorted(ranks):
        _kill_if_same(pid, watch.started.get(pid))
    deadline = time.monotonic() + LINGER_S
    while (time.monotonic() < deadline
           and not all(has_ended(pid, watch.started.get(pid)) for pid in ranks)):
        time.sleep(0.05)
    return output or "", how


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass  # the whole group has ended already


def _kill_if_same(pid: int, started: str | None) -> None:
    """SIGKILL ``pid`` if it is still the process that started at ``started``."""
    if started is None or start_time(pid) != started:
        return  # gone, or another process that took its id since
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
