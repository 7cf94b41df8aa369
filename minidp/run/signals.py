"""Catching the stop signals from the first line of ``minidp train``, before MPI starts.

A batch scheduler's warning (SIGTERM, or SIGUSR1 with Slurm's ``--signal``) does not
wait for a job to have started: it may come while Python imports NumPy, while MPI
initialises, while the kernels compile or the data is checked. Without a handler,
SIGTERM kills a rank (no checkpoint, a shared-memory segment left in ``/dev/shm``), and
SIGUSR1 that arrives after ``MPI_Init`` is swallowed by MPICH's own handler, which
passes it on only to a handler installed before it. So ``minidp train`` installs
:data:`CATCHER` as its first statement (:mod:`minidp.__main__`), before anything imports
``mpi4py.MPI`` (neither ``python -m mpi4py`` nor the console script does before that);
this module imports nothing of MPI for that reason.

The handler only records the signal. Where the run stops is agreed later by all ranks
(:mod:`minidp.run.stopping`): before the first batch when the signal came during
start-up, else at the next batch boundary or epoch end, with a checkpoint.

SIGINT (Ctrl-C) is handled alike, without a line per rank: MPICH's ``mpiexec`` sends it
to every rank (and says so), and a second Ctrl-C makes ``mpiexec`` end the job. A second
signal of the same kind to one rank gets the default action (the process ends), so a
user who means it is not ignored.
"""

from __future__ import annotations

import os
import signal
import sys
from types import FrameType
from typing import Any

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
        self.previous: dict[int, Any] = {}

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
