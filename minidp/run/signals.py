"""Catching the stop signals from the first line of ``minidp train``, before NumPy and MPI.

A batch scheduler's warning (SIGTERM, or SIGUSR1 with Slurm's ``--signal``) does not
wait for a job to have started: it may come while Python imports NumPy and Numba (half
a second here, several seconds on a loaded machine), while MPI initialises, while the
kernels compile or the data is checked. Without a handler, SIGTERM kills a rank (no
checkpoint, a shared-memory segment left in ``/dev/shm``), and so does SIGUSR1, which
MPICH's launcher then misreports (it combines the statuses of the ranks it ended:
SIGUSR1's 10 with the others' SIGKILL, 9, reads "Segmentation fault (signal 11)");
SIGUSR1 that arrives after ``MPI_Init`` is swallowed by MPICH's own handler, which passes
it on only to a handler installed before it.

So the package's first statement (``minidp/__init__.py``) calls
:func:`catch_if_minidp_train`: when this process was started as ``minidp train``
(``python -m minidp train``, ``python -m mpi4py -m minidp train`` or the ``minidp``
console script), :data:`CATCHER` is installed before anything else of minidp, NumPy or
MPI is imported. What remains unprotected is Python's own start-up, before the first line
of any package runs (about 25 ms here, docs/reliability.md). ``import minidp`` in any
other program installs nothing. This module imports nothing of minidp, NumPy or MPI, and
nothing that Python's start-up has not already loaded, for that reason.

The handler only records the signal. Where the run stops is agreed later by all ranks
(:mod:`minidp.run.stopping`): before the first batch when the signal came during
start-up, else at the next batch boundary or epoch end, with a checkpoint.

SIGINT (Ctrl-C) is handled alike, without a line per rank: MPICH's ``mpiexec`` sends it
to every rank (and says so), and a second Ctrl-C makes ``mpiexec`` end the job. Open
MPI's ``mpirun`` sends its ranks SIGTERM instead (docs/reliability.md, a table per
launcher). A second signal of the same kind to one rank is named on stderr and then gets
the default action (the process ends), so a user who means it is not ignored, and the
launcher's report of it can be read against the rank's own line.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType

SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
QUIET = (signal.SIGINT,)  # the launcher sends it to every rank: one line per job, rank 0's
# Where each launcher puts a process's rank, for the message before MPI can say it.
RANK_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID")


def launcher_rank() -> str:
    """This process's rank as its launcher's environment gives it ("?" outside one)."""
    return next((os.environ[v] for v in RANK_VARIABLES if os.environ.get(v, "").isdigit()),
                "?")


class Catcher:
    """The stop request of this process: which signal came, and what its handler says.

    Attributes:
        received: the name of the first signal caught (``"SIGTERM"``), else None.
        rank: this rank, for the message (the launcher's until the run knows it).
        plan: what the handler announces after ``SIGTERM received``: where the run will
            stop.
    """

    def __init__(self) -> None:
        self.received: str | None = None
        self.rank = launcher_rank()
        self.plan = " during start-up; stopping before the first batch"
        self.seen: set[str] = set()
        self.previous: dict[int, object] = {}  # signal -> the handler found

    @property
    def installed(self) -> bool:
        """Whether the handlers are in place."""
        return bool(self.previous)

    def install(self) -> bool:
        """Catch :data:`SIGNALS` (main thread only); False if they were caught already.

        A fresh install forgets the signals of an earlier run in this process.
        """
        if self.installed:
            return False
        self.received, self.seen = None, set()
        for sig in SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)
        return True

    def uninstall(self) -> None:
        """Give the signals back to the handlers found at :meth:`install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if name in self.seen:
            # Said before the process ends: a launcher may report the death as another
            # signal (MPICH's combines the statuses of the ranks it ends).
            sys.stderr.write(f"rank {self.rank}: {name} received again; ending this process "
                             "now\n")
            sys.stderr.flush()
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.seen.add(name)
        self.received = self.received or name
        if signum not in QUIET:
            sys.stderr.write(f"rank {self.rank}: {name} received{self.plan} (send it again to "
                             "end now)\n")


    def retire(self) -> None:
        """Ignore :data:`SIGNALS` from now on: the job is over, the process is exiting.

        Python gives every signal it handles back to the default action as it exits,
        and a SIGTERM in those last milliseconds would kill a process whose run ended
        well (exit 143, ``BAD TERMINATION`` from the launcher). An ignored signal stays
        ignored through the exit.
        """
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)
        self.previous.clear()


CATCHER = Catcher()  # one per process: signal handlers are per process


def catch_stop_signals(argv: list[str]) -> None:
    """Install :data:`CATCHER` if ``argv`` (after the program name) runs ``train``."""
    if argv[:1] == ["train"]:
        CATCHER.install()


def minidp_command_line(orig_argv: list[str], argv: list[str]) -> list[str] | None:
    """What follows ``minidp`` on this process's command line, or None if it is not minidp.

    Args:
        orig_argv: the interpreter's own command line (``sys.orig_argv``): ``python
            [options] -m minidp train ...``, also behind ``-m mpi4py [its options]``.
        argv: the program's (``sys.argv``): the console script is ``.../minidp train ...``.
    """
    for i, arg in enumerate(orig_argv[:-1]):
        if arg == "-m" and orig_argv[i + 1] == "minidp":
            return orig_argv[i + 2:]
    return argv[1:] if argv and os.path.basename(argv[0]) == "minidp" else None


def started_as_minidp_train(orig_argv: list[str], argv: list[str]) -> bool:
    """Whether this process's command line runs ``minidp train`` (arguments as above)."""
    return (minidp_command_line(orig_argv, argv) or [])[:1] == ["train"]


def started_as_minidp() -> bool:
    """Whether this process was started as any minidp command (``python -m minidp ...``)."""
    return minidp_command_line(sys.orig_argv, sys.argv) is not None


def catch_if_minidp_train() -> None:
    """Install :data:`CATCHER` if this process was started as ``minidp train``.

    The package's first statement: the earliest point of the process that minidp's code
    reaches (the module body of ``minidp/__main__.py`` runs only after the package, with
    NumPy and Numba, has been imported).
    """
    if started_as_minidp_train(sys.orig_argv, sys.argv):
        CATCHER.install()
