"""Stopping on a signal: SIGTERM or SIGUSR1 on any rank stops every rank at one batch boundary.

A batch scheduler sends SIGTERM (or, asked with ``--signal``, SIGUSR1) some time before
it kills a job. minidp then writes a checkpoint and exits with :data:`EXIT_STOPPED`, so
the job script can requeue itself and ``--resume`` (or ``--resume auto``) continues.

The signal may reach one rank only (``kill`` by hand) or every rank at slightly different
times (the scheduler), so the ranks must agree where to stop. The handler only sets a
flag. Agreement rides on communication the ranks do anyway, in lock step:

* strategies whose ranks take the same batches in step (``Strategy.stops_between_batches``:
  ``sync``, ``hsgd``, ``hbsgd``) poll between batches: at batch i every rank starts a
  one-integer ``Iallreduce(MAX)`` of its flag on a communicator of its own and finishes the
  one it started at batch i-1; that result is the same on every rank, so all stop after
  the same batch, one batch after the first rank saw the signal. The reduction overlaps a
  whole batch of compute, so it costs a test of a finished request per batch;
* every strategy also agrees at each epoch's end (the flag travels with the epoch's
  timers): the parameter-server and elastic strategies, whose workers are not in lock
  step, and DASO, whose syncs may be in flight between batches, stop there.

A second signal of the same kind while the first is pending gets the default action
(the process ends), so a user who means it is not ignored.
"""

from __future__ import annotations

import signal
import sys
from types import FrameType
from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm import guard

EXIT_STOPPED = 3  # the job stopped on a signal after writing a checkpoint: resume it
SIGNALS = (signal.SIGTERM, signal.SIGUSR1)


class Stopped(Exception):  # noqa: N818 (an outcome, not an error)
    """Training stopped on a signal after writing the checkpoint ``path``."""

    def __init__(self, message: str, path: str) -> None:
        super().__init__(message)
        self.path = path


class StopSignal:
    """The signal flag of this rank and the agreement of all ranks on where to stop.

    Args:
        comm: the communicator of every rank of the job (duplicated: the agreement's
            reductions never meet another collective).
        rank: this rank, for the message.
        between_batches: whether :meth:`poll` is called between batches (else the
            run stops at an epoch's end only).
    """

    def __init__(self, comm: MPI.Comm, rank: int, between_batches: bool) -> None:
        self.comm = guard.collective(comm, "stop signal set-up", comm.Dup)
        self.rank, self.between_batches = rank, between_batches
        self.received: str | None = None  # name of the signal this rank got
        self.flag = np.zeros(1, np.int32)  # this rank's flag, as a reduction's input
        self.sending = np.zeros(1, np.int32)  # the flag as it was when a reduction began
        self.agreed = np.zeros(1, np.int32)
        self.pending: MPI.Request | None = None
        self.previous: dict[int, Any] = {}

    # -- the handler ---------------------------------------------------------------------

    def install(self) -> None:
        """Catch SIGTERM and SIGUSR1 (main thread only, as Python allows)."""
        for sig in SIGNALS:
            self.previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        """Give the signals back to the handlers found at :meth:`install`."""
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)
        self.previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        name = signal.Signals(signum).name
        if self.received == name:
            signal.signal(signum, signal.SIG_DFL)
            signal.raise_signal(signum)
            return
        self.received, self.flag[0] = name, 1
        where = "the next batch boundary" if self.between_batches else "the end of this epoch"
        sys.stderr.write(f"rank {self.rank}: {name} received; stopping at {where} with a "
                         "checkpoint (send it again to end now)\n")

    # -- the agreement -------------------------------------------------------------------

    def poll(self) -> bool:
        """Between batches, on every rank alike: whether all ranks stop here."""
        if self.pending is not None:
            guard.wait(self.pending, self.comm, "stop signal agreement")
            if self.agreed[0]:
                self.pending = None
                return True
        self.sending[...] = self.flag
        self.pending = self.comm.Iallreduce(self.sending, self.agreed, op=MPI.MAX)
        return False

    def settle(self) -> None:
        """Finish the agreement in flight (at an epoch's end; before the job ends)."""
        if self.pending is not None:
            guard.wait(self.pending, self.comm, "stop signal agreement")
            self.pending = None

    def close(self) -> None:
        """Settle and free the communicator (collective: after a run that ended well)."""
        self.settle()
        guard.collective(self.comm, "stop signal close", self.comm.Free)
