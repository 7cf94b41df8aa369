"""Launch SPMD programs under mpiexec so that no failure or deadlock can hang the suite.

Every launch runs in its own process group (``start_new_session``) under
``python -m mpi4py`` (an exception on one rank aborts the job), with
``MPIEXEC_TIMEOUT`` (the launcher's own watchdog: MPICH's Hydra and Open MPI's
``mpirun`` both read it) and a subprocess timeout a little longer that kills the whole
job, every process below the launcher included, if even the watchdog fails.

Shared memory that a killed or aborted job leaves is removed: the files in /dev/shm its
own processes were seen mapping (:class:`ShmWatch`), then any new one that no live
process uses (another job may run beside it). MPICH leaves ``/dev/shm/mpich_shm_*``;
Open MPI leaves its ``vader`` segments (``/dev/shm/vader_segment.*``) and its session
directory (``$TMPDIR/ompi.HOST.UID/pid.PID``, named by the launcher's process id, which
holds the shared-memory windows' files).

A launcher does not always report its own watchdog in its exit status: under load,
Hydra has been seen to print ``APPLICATION TIMED OUT`` and exit 0. A launch whose
watchdog fired is a failure whatever mpiexec returned, so the status is made non-zero
(124, as timeout(1) uses) before any caller sees it; otherwise a deadlocked SPMD file
could pass.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import glob
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from minidp.reporting.launcher import mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# What a launcher hands its ranks (MPICH's Hydra: PMI_*, HYDRA_*, MPI*; Open MPI's ORTE
# and PMIx: OMPI_*, PMIX_*): a job started from inside a rank must not inherit it, or its
# mpiexec takes itself for a part of the outer job. The Open MPI settings the Makefile
# exports for MPI=system (oversubscription, root) are the user's and stay.
LAUNCHER_PREFIXES = ("PMI_", "HYDRA_", "MPI", "OMPI_", "PMIX_")
USER_SETTINGS = ("OMPI_MCA_rmaps_base_oversubscribe", "OMPI_ALLOW_RUN_AS_ROOT",
                 "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM")


def environment_outside_mpi(**extra: str) -> dict[str, str]:
    """This process's environment without its launcher's variables, plus ``extra``."""
    env = {k: v for k, v in os.environ.items()
           if k in USER_SETTINGS or not k.startswith(LAUNCHER_PREFIXES)}
    env.update(extra)
    return env


@functools.cache
def launcher() -> str:
    """``"mpich"`` (Hydra) or ``"openmpi"``: which ``mpiexec`` the tests start jobs with.

    Read from ``mpiexec --version`` (Open MPI's names OpenRTE, Hydra's prints its build
    details), not from MPI itself: the test process must not initialise MPI.
    """
    version = subprocess.run([mpiexec(), "--version"], capture_output=True, text=True,
                             timeout=60, env=environment_outside_mpi()).stdout
    if "OpenRTE" in version or "Open MPI" in version:
        return "openmpi"
    if "HYDRA" in version:
        return "mpich"
    raise RuntimeError(f"{mpiexec()}: neither MPICH's Hydra nor Open MPI's mpirun "
                       f"(--version said {version[:200]!r})")


# What each launcher prints when MPIEXEC_TIMEOUT ends a job (WATCHDOG_FIRED is the one of
# the launcher in use; tests check that it is, or is not, in a job's output).
WATCHDOG_TEXTS = {"mpich": "APPLICATION TIMED OUT",
                  "openmpi": "The user-provided time limit for job execution has been reached"}
WATCHDOG_FIRED = WATCHDOG_TEXTS[launcher()]


# Where each launcher tells a rank its rank (Hydra, Open MPI).
RANK_VARIABLES = (b"PMI_RANK=", b"OMPI_COMM_WORLD_RANK=")


def rank_of(pid: int | str) -> int | None:
    """The MPI rank of process ``pid`` as its launcher's environment gives it (None: no
    rank, or a process that ended or is not ours to read)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read().split(b"\0")
    except OSError:
        return None
    for prefix in RANK_VARIABLES:
        for value in environ:
            if value.startswith(prefix) and value[len(prefix):].isdigit():
                return int(value[len(prefix):])
    return None


def watchdog_line(seconds: int) -> str:
    """What the launcher in use prints when a watchdog of ``seconds`` ended a job."""
    return {"mpich": f"APPLICATION TIMED OUT, TIMEOUT = {seconds}s",
            "openmpi": f"Timeout: {seconds} seconds"}[launcher()]


@dataclasses.dataclass
class Launch:
    """What one mpiexec launch did."""

    returncode: int | None
    output: str
    seconds: float
    killed: bool
    shm: frozenset[str] = frozenset()  # the job's shared-memory files (ShmWatch)
    session_dirs: tuple[str, ...] = ()  # Open MPI's session directory of its mpirun


# MPICH's shared memory (its transport and its windows), Open MPI's transport (vader) and
# its shared-memory windows (osc_sm).
SHM_PATTERNS = ("/dev/shm/mpich_shm_*", "/dev/shm/vader_segment.*", "/dev/shm/osc_sm.*")


def shm_files() -> set[str]:
    """MPI's shared-memory files in /dev/shm (every job's, this launch's or not)."""
    return {path for pattern in SHM_PATTERNS for path in glob.glob(pattern)}


def session_dirs(launcher_pid: int) -> list[str]:
    """Open MPI's session directories of the ``mpirun`` with process id ``launcher_pid``.

    ``mpirun`` makes ``ompi.HOST.UID/pid.PID`` under TMPDIR (else /tmp) and removes it as
    it exits, but not when it is killed; the files of the job's shared-memory windows are
    in it. MPICH makes none.
    """
    base = os.environ.get("TMPDIR") or tempfile.gettempdir()
    return glob.glob(os.path.join(base, f"ompi.*.{os.getuid()}", f"pid.{launcher_pid}"))


def descendants(root: int) -> set[str]:
    """The processes below ``root`` (Hydra starts each rank in a session of its own, so
    the process group does not find them)."""
    children: dict[str, list[str]] = {}
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/stat") as f:
                parent = f.read().rsplit(")", 1)[1].split()[1]
        except OSError:
            continue
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [str(root)]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def _in_use(pids: set[str] | None = None) -> set[str]:
    """The files under /dev/shm that a live process (one of ``pids``) maps or holds open."""
    used: set[str] = set()
    for pid in pids if pids is not None else filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/maps") as f:
                used.update(line.split(None, 5)[-1].strip() for line in f if "/dev/shm/" in line)
            fds = f"/proc/{pid}/fd"
            used.update(os.readlink(os.path.join(fds, fd)) for fd in os.listdir(fds))
        except OSError:  # the process ended meanwhile, or is not ours to read
            continue
    return {path for path in used if path.startswith("/dev/shm/")}


class ShmWatch:
    """The shared-memory files that the processes below ``root`` map, sampled while they run.

    What a job maps is its own, whatever other jobs do meanwhile; once the job has ended,
    what is still there of it is a leftover (MPI removes its files on a clean exit, not
    when a rank is killed or the job aborts). ``sessions`` are the session directories
    of ``root`` seen meanwhile (Open MPI's, when ``root`` is its ``mpirun``).
    """

    def __init__(self, root: int, every_s: float = 0.2) -> None:
        self.root, self.every_s, self.seen = root, every_s, set()
        self.sessions: set[str] = set()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> None:
        self.seen |= _in_use(descendants(self.root)) & shm_files()
        self.sessions.update(session_dirs(self.root))

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.sample()

    def stop(self) -> set[str]:
        """Stop sampling; the files seen."""
        self._done.set()
        self._thread.join()
        return self.seen

    def remove(self) -> None:
        """Remove what the ended job left of its files, and its launcher's session
        directory (Open MPI's; none is left when ``mpirun`` ends normally)."""
        _remove(self.stop())
        for path in self.sessions | set(session_dirs(self.root)):
            shutil.rmtree(path, ignore_errors=True)


def shm_leftovers(before: set[str]) -> set[str]:
    """The shared-memory files that appeared since ``before`` and no live process uses.

    What a killed job left behind. Another job running at the same time (``make test``
    runs two workers) keeps its own files mapped, so they are never taken for leftovers.
    """
    return (shm_files() - before) - _in_use()


def remove_shm_leftovers(before: set[str]) -> None:
    """Remove :func:`shm_leftovers` (another process may have removed one already)."""
    _remove(shm_leftovers(before))


def _remove(paths: set[str]) -> None:
    for path in paths:
        with contextlib.suppress(OSError):  # gone already: its job's other rank, or MPICH
            os.remove(path)


LAUNCHER_BANNER = re.compile(r"^-{20,}\n.*?^-{20,}\n?", re.S | re.M)


def without_launcher_banners(output: str) -> str:
    """A job's output without Open MPI's ``mpirun`` banners (blocks between lines of dashes).

    ``mpirun`` frames what it says, e.g. that a rank exited with a non-zero status, which
    it prints after every job that ends with one: what minidp printed is the rest.
    """
    return LAUNCHER_BANNER.sub("", output)


def job_status(returncode: int, output: str) -> int:
    """mpiexec's exit status, 124 where its watchdog fired but it still exited 0."""
    return 124 if returncode == 0 and WATCHDOG_FIRED in output else returncode


def kill_job(root: int) -> None:
    """SIGKILL the launcher ``root``, its process group and every process below it.

    The group alone does not reach the ranks: Hydra starts each in a session of its own,
    and Open MPI's ``mpirun`` each in a process group of its own.
    """
    for pid in descendants(root):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(int(pid), signal.SIGKILL)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(root, signal.SIGKILL)


def start_job(cmd: list[str], cwd: str, env: dict[str, str]) -> subprocess.Popen:
    """Start ``cmd`` in a process group of its own, output piped, its MPI files watched."""
    shm_before = shm_files()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    proc.shm_watch, proc.shm_before = ShmWatch(proc.pid), shm_before
    return proc


def finish_job(proc: subprocess.Popen, timeout: float) -> tuple[str, bool]:
    """A :func:`start_job` job's output, and whether it ran past ``timeout`` and was
    killed (:func:`kill_job`); the MPI files it left are removed (those it was seen using
    and its session directory, then, after a failure, any new one no live process uses)."""
    killed = False
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        killed = True
        proc.shm_watch.sample()
        kill_job(proc.pid)
        output, _ = proc.communicate()
    proc.shm_watch.remove()
    if killed or proc.returncode or WATCHDOG_FIRED in output:
        remove_shm_leftovers(proc.shm_before)
    return output, killed


def run_spmd(args: list[str], nprocs: int, timeout: float = 120.0,
             env: dict | None = None, mpiexec_timeout: float | None = None,
             under_mpi4py: bool = True) -> Launch:
    """Run ``python -m mpi4py ARGS`` on ``nprocs`` ranks and collect its output.

    Args:
        args: arguments after ``python -m mpi4py`` (a script, or ``-m module ...``).
        nprocs: number of ranks.
        timeout: seconds after which the process group is killed.
        env: extra environment variables.
        mpiexec_timeout: MPIEXEC_TIMEOUT in seconds (default: timeout - 10).
        under_mpi4py: False runs ``python ARGS`` (to test minidp's own abort hook).
    """
    watchdog = int(mpiexec_timeout if mpiexec_timeout is not None else max(timeout - 10, 5))
    full_env = dict(os.environ, PYTHONUNBUFFERED="1", MPIEXEC_TIMEOUT=str(watchdog),
                    PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    full_env.update(env or {})
    runner = ["-m", "mpi4py"] if under_mpi4py else []
    cmd = [mpiexec(), "-n", str(nprocs), sys.executable, *runner, *args]
    start = time.monotonic()
    proc = start_job(cmd, ROOT, full_env)
    output, killed = finish_job(proc, timeout)
    seconds = time.monotonic() - start
    return Launch(None if killed else job_status(proc.returncode, output), output, seconds,
                  killed, frozenset(proc.shm_watch.seen),
                  tuple(sorted(proc.shm_watch.sessions)))
