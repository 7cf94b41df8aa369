"""Injected faults, for tests and for teaching: ``--inject-fault RANK:STEP:KIND[,...]``.

Where a fault fires, and what its STEP counts:

* on a worker, at its STEP-th training step of the run (1-based, counted over the whole
  run, so a resumed run does not repeat a fault its checkpoint is past), right after
  backward and before the strategy communicates;
* on a server (rank 0 of ``asgd``, the parameter-server and elastic families), which
  takes no steps, as it starts serving epoch STEP of the run (1-based), before it answers
  any message: its workers are then waiting for it, as they would be for a crashed server;
* ``kill-in-save`` on any rank, inside the checkpoint written after epoch STEP, once this
  rank's file is on disk and before the checkpoint directory is renamed: the moment
  that tests that a checkpoint exists whole or not at all.

============  ======================================================================
raise         raise ``RuntimeError`` (an uncaught exception: the job is aborted)
exit          leave at once with status 1, without finalising MPI (a crashed process)
kill          send itself SIGKILL (killed by the OS or the scheduler)
hang          sleep for ever (a stuck rank: the others name it after --comm-timeout)
slow          compute 10 times slower from this step on (a straggler; workers only)
nan           put a NaN into its gradient (a numerical fault; workers only)
sigterm       send itself SIGTERM (the scheduler's warning: stop with a checkpoint)
sigusr1       send itself SIGUSR1 (the same, as Slurm's ``--signal=USR1@T`` sends)
kill-in-save  send itself SIGKILL while writing the checkpoint of epoch STEP
============  ======================================================================
"""

from __future__ import annotations

import dataclasses
import os
import signal
import sys
import time

import numpy as np

KINDS = ("raise", "exit", "kill", "hang", "slow", "nan", "sigterm", "sigusr1", "kill-in-save")
STEP_KINDS = KINDS[:-1]  # fired at a step (a worker) or at the start of serving (a server)
WORKER_ONLY = ("slow", "nan")  # a server computes no gradient
SERVER_KINDS = tuple(k for k in STEP_KINDS if k not in WORKER_ONLY)
SLOW_FACTOR = 10.0


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on world rank ``rank`` at its ``step`` (see the module doc)."""

    rank: int
    step: int
    kind: str

    def __str__(self) -> str:
        return f"{self.rank}:{self.step}:{self.kind}"


def parse(spec: str | None) -> list[Fault]:
    """``"1:5:hang,0:9:nan"`` as Faults; an empty or None spec is no fault."""
    faults = []
    for item in (spec or "").split(","):
        if not item.strip():
            continue
        parts = item.strip().split(":")
        try:
            rank, step = int(parts[0]), int(parts[1])
        except (ValueError, IndexError):
            rank = step = -1
        if len(parts) != 3 or rank < 0 or step < 1 or parts[2] not in KINDS:
            raise ValueError(f"--inject-fault: got {item.strip()!r}, allowed: RANK:STEP:KIND "
                             f"with RANK an int >= 0, STEP an int >= 1 and KIND one of "
                             f"{', '.join(KINDS)}, comma-separated (e.g. 1:5:hang)")
        faults.append(Fault(rank, step, parts[2]))
    return faults


class Injector:
    """The faults of one rank: :meth:`at_step` (workers), :meth:`at_serve`, :meth:`in_save`.

    Every rank checks every fault, so a bad one is the same error on every rank.

    Args:
        faults: the run's faults (every rank's).
        rank: this rank; faults of other ranks are ignored.
        world_size: ranks of the job; a fault's rank must be one of them.
        servers: the server ranks of the strategy (none for the synchronous family).
        slowdowns: ``--slowdown``'s {rank: factor}: stragglers on purpose (a server's
            computes nothing, so it changes nothing); every rank must be in the world.
    """

    def __init__(self, faults: list[Fault], rank: int, world_size: int,
                 servers: tuple[int, ...] = (), slowdowns: dict[int, float] | None = None
                 ) -> None:
        slowdowns = slowdowns or {}
        for r, factor in slowdowns.items():
            if r >= world_size:
                raise ValueError(f"--slowdown: rank {r} in '{r}:{factor:g}', allowed: a rank in "
                                 f"[0, {world_size})")
        for fault in faults:
            if fault.rank >= world_size:
                raise ValueError(f"--inject-fault: rank {fault.rank} in '{fault}', allowed: a "
                                 f"rank in [0, {world_size})")
            if fault.rank in servers and fault.kind in WORKER_ONLY:
                raise ValueError(f"--inject-fault: '{fault}': rank {fault.rank} is a server, "
                                 f"which computes no gradient; allowed on a server: "
                                 f"{', '.join(SERVER_KINDS)}, kill-in-save")
        self.mine = [f for f in faults if f.rank == rank]
        self.rank = rank
        self.slowdown = slowdowns.get(rank, 1.0)  # compute-time factor: --slowdown or ``slow``

    def _due(self, step: int, kinds: tuple[str, ...]) -> list[str]:
        return [f.kind for f in self.mine if f.step == step and f.kind in kinds]

    def at_step(self, step: int, gradient: np.ndarray, compute_s: float) -> None:
        """A worker after backward of run step ``step`` (1-based), which took ``compute_s``.

        Fires this rank's faults of that step, then, on a straggler (``--slowdown F`` or
        a ``slow`` fault), sleeps (F - 1) x ``compute_s``: its compute looks F times slower.
        """
        for kind in self._due(step, STEP_KINDS):
            if kind == "slow":
                self.slowdown = max(self.slowdown, SLOW_FACTOR)
            elif kind == "nan":
                gradient.reshape(-1)[0] = np.nan
            else:
                self._stop(kind, f"step {step}")
        if self.slowdown > 1:
            time.sleep((self.slowdown - 1) * compute_s)

    def at_serve(self, epoch: int) -> None:
        """A server, before it serves epoch ``epoch`` (1-based): fire that STEP's faults."""
        for kind in self._due(epoch, SERVER_KINDS):
            self._stop(kind, f"step {epoch} (a server: the start of serving epoch {epoch})")

    def in_save(self, epoch: int) -> None:
        """Inside the checkpoint of epoch ``epoch``, this rank's file written: kill-in-save."""
        if self._due(epoch, ("kill-in-save",)):
            os.kill(os.getpid(), signal.SIGKILL)

    def _stop(self, kind: str, where: str) -> None:
        """A kind of :data:`SERVER_KINDS`: end or stop the process, or signal it to stop."""
        if kind == "raise":
            raise RuntimeError(f"rank {self.rank}: injected fault 'raise' at {where}")
        if kind == "exit":
            # The launcher reports the first process to exit as rank 0's: name the rank.
            sys.stderr.write(f"rank {self.rank}: injected fault 'exit' at {where}: leaving with "
                             "status 1 without finalising MPI\n")
            sys.stderr.flush()
            os._exit(1)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(60)
        signal.raise_signal(signal.SIGTERM if kind == "sigterm" else signal.SIGUSR1)
