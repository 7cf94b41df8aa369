"""Stopping on a signal: SIGTERM, SIGUSR1 or SIGINT on any rank stops every rank at one point.

A batch scheduler sends SIGTERM (or, asked with ``--signal``, SIGUSR1) some time before
it kills a job. minidp then writes a checkpoint and exits with :data:`EXIT_STOPPED`, so
the job script can requeue itself and ``--resume`` (or ``--resume auto``) continues.
The handler (:mod:`minidp.run.signals`) is installed before MPI starts and only records
the signal.

The signal may reach one rank only (``kill`` by hand) or every rank at slightly different
times (the scheduler), so the ranks must agree where to stop. Agreement rides on
communication the ranks do anyway, in lock step:

* before the first batch (:meth:`StopSignal.before_training`): one reduction, so a signal
  that came during start-up stops every rank there, with nothing written (or, resuming,
  the last checkpoint left as it is);
* strategies whose ranks take the same batches in step (``Strategy.stops_between_batches``:
  ``sync``, ``hsgd``, ``hbsgd``) poll between batches: at batch i every rank starts a
  one-integer ``Iallreduce(MAX)`` of its flag on a communicator of its own and finishes the
  one it started at batch i-1; that result is the same on every rank, so all stop after
  the same batch, one batch after the first rank saw the signal. The reduction overlaps a
  whole batch of compute, so it costs a test of a finished request per batch;
* every strategy also agrees at each epoch's end (the flag travels with the epoch's
  timers): the parameter-server and elastic strategies, whose workers are not in lock
  step, and DASO, whose syncs may be in flight between batches, stop there.

A signal agreed on at the end of the last epoch does not stop the run: its work is done,
so it writes its results and ends normally (exit 0, nothing to resume), and says so.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from minidp.comm import Communicator, guard
from minidp.run.signals import CATCHER

EXIT_STOPPED = 3  # the job stopped on a signal after writing a checkpoint: resume it


class Stopped(Exception):  # noqa: N818 (an outcome, not an error)
    """Training stopped on a signal; ``path`` is the checkpoint to resume (None: none)."""

    def __init__(self, message: str, path: str | None) -> None:
        super().__init__(message)
        self.path = path


class StopSignal:
    """The signal flag of this rank and the agreement of all ranks on where to stop.

    Args:
        comm: the communicator of every rank of the job (duplicated: the agreement's
            reductions never meet another collective).
        rank: this rank, for the messages.
        between_batches: whether :meth:`poll` is called between batches (else the
            run stops at an epoch's end only).
    """

    def __init__(self, comm: Communicator, rank: int, between_batches: bool) -> None:
        self.comm = guard.collective(comm, "stop signal set-up", comm.Dup)
        self.rank, self.between_batches = rank, between_batches
        CATCHER.rank = str(rank)
        self.sending = np.zeros(1, np.int32)  # the flag as it was when a reduction began
        self.agreed = np.zeros(1, np.int32)
        self.pending: guard.Request | None = None
        self.owns_handlers = False

    @property
    def received(self) -> str | None:
        """The name of the signal this rank got, if any."""
        return CATCHER.received

    @property
    def raised(self) -> int:
        """This rank's flag: 1 once it got a signal."""
        return int(CATCHER.received is not None)

    # -- the handler ---------------------------------------------------------------------

    def install(self) -> None:
        """Catch the signals (if ``minidp train`` has not already) and say where it stops."""
        self.owns_handlers = CATCHER.install()
        CATCHER.plan = ("; stopping at the next batch boundary" if self.between_batches else
                        "; stopping at the end of this epoch") + " with a checkpoint"

    def uninstall(self) -> None:
        """Give the signals back, if :meth:`install` caught them."""
        if self.owns_handlers:
            CATCHER.uninstall()
            self.owns_handlers = False

    def finishing(self) -> None:
        """A signal agreed at the end of the last epoch: the run finishes, and says so (rank 0).

        Its work is done, so it writes its results and ends normally: a checkpoint of a
        finished run would only be refused by the next ``--resume``.
        """
        if self.rank == 0:
            print(f"note: a stop signal ({self.received or 'on another rank'}) came during the "
                  "last epoch; the run finished instead of stopping: its results are written, "
                  "nothing to resume (exit status 0)", flush=True)

    def _got(self) -> str:
        return f"{self.received} on this rank" if self.received else "on another rank"

    def stopped(self, path: str, where: str) -> Stopped:
        """The outcome of every rank stopping ``where``, with the checkpoint ``path``."""
        return Stopped(f"rank {self.rank}: stopped on a signal ({self._got()}) {where}; "
                       f"checkpoint '{path}'; continue with --resume", path)

    def before_training(self, resumable: Callable[[], str | None]) -> None:
        """Collectively, before the first batch: stop every rank if any got a signal.

        Args:
            resumable: the checkpoint this run would resume (None: a new run), named
                when the run stops here, untouched.

        Raises:
            Stopped: on every rank, when a rank got a signal during start-up.
        """
        self.sending[0] = self.raised
        guard.wait(guard.start_max(self.comm, self.sending, self.agreed), self.comm,
                   "stop signal before training")
        if not self.agreed[0]:
            return
        last = resumable()
        outcome = ("nothing to resume" if last is None else
                   f"the last checkpoint, '{last}', is as it was; continue with --resume")
        raise Stopped(f"rank {self.rank}: stopped before the first batch: {outcome} (a signal: "
                      f"{self._got()})", last)

    # -- the agreement -------------------------------------------------------------------

    def poll(self) -> bool:
        """Between batches, on every rank alike: whether all ranks stop here."""
        if self.pending is not None:
            guard.wait(self.pending, self.comm, "stop signal agreement")
            if self.agreed[0]:
                self.pending = None
                return True
        self.sending[0] = self.raised
        self.pending = guard.start_max(self.comm, self.sending, self.agreed)
        return False

    def settle(self) -> None:
        """Finish the agreement in flight (at an epoch's end; before the job ends)."""
        if self.pending is not None:
            guard.wait(self.pending, self.comm, "stop signal agreement")
            self.pending = None

    def close(self) -> None:
        """Settle and free the communicator (collective: after a run that ended well).

        A signal from here on changes nothing: the run writes its results and ends.
        """
        CATCHER.plan = "; training is over: the run ends once its results are written"
        self.settle()
        guard.collective(self.comm, "stop signal close", self.comm.Free)
