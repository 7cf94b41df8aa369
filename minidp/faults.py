"""Injected faults, for tests and for teaching: ``--inject-fault RANK:STEP:KIND[,...]``.

At its STEP-th training step of the run (1-based, counted over the whole run, so a
resumed run does not repeat a fault its checkpoint is past), right after backward and
before the strategy communicates, rank RANK does KIND:

========  =========================================================================
raise     raise ``RuntimeError`` (an uncaught exception: the job is aborted)
exit      leave at once with status 1, without finalising MPI (a crashed process)
kill      send itself SIGKILL (killed by the OS or the scheduler)
hang      sleep for ever (a stuck rank: the others name it after --comm-timeout)
slow      compute 10 times slower from this step on (a straggler)
nan       put a NaN into its gradient (a numerical fault)
sigterm   send itself SIGTERM (the scheduler's warning: stop with a checkpoint)
sigusr1   send itself SIGUSR1 (the same, as Slurm's ``--signal=USR1@T`` sends)
========  =========================================================================
"""

from __future__ import annotations

import dataclasses
import os
import signal
import time

import numpy as np

KINDS = ("raise", "exit", "kill", "hang", "slow", "nan", "sigterm", "sigusr1")
SLOW_FACTOR = 10.0


@dataclasses.dataclass(frozen=True)
class Fault:
    """One fault: ``kind`` on world rank ``rank`` at its ``step``-th step of the run."""

    rank: int
    step: int
    kind: str


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
    """The faults of one rank, fired by :meth:`at_step` after each backward.

    Args:
        faults: the run's faults (every rank's).
        rank: this rank; faults of other ranks are ignored.
        world_size: ranks of the job; a fault's rank must be one of them.
    """

    def __init__(self, faults: list[Fault], rank: int, world_size: int) -> None:
        for fault in faults:
            if fault.rank >= world_size:
                raise ValueError(f"--inject-fault: rank {fault.rank} in "
                                 f"'{fault.rank}:{fault.step}:{fault.kind}', allowed: a rank "
                                 f"in [0, {world_size})")
        self.mine = {f.step: f.kind for f in faults if f.rank == rank}
        self.rank = rank
        self.slow = 1.0  # compute-time factor set by a ``slow`` fault

    def at_step(self, step: int, gradient: np.ndarray) -> None:
        """Fire this rank's fault of run step ``step`` (1-based), if there is one."""
        kind = self.mine.get(step)
        if kind is None:
            return
        if kind == "raise":
            raise RuntimeError(f"rank {self.rank}: injected fault 'raise' at step {step}")
        if kind == "exit":
            os._exit(1)
        if kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if kind == "hang":
            while True:
                time.sleep(60)
        if kind == "slow":
            self.slow = SLOW_FACTOR
        elif kind == "nan":
            gradient.reshape(-1)[0] = np.nan
        elif kind == "sigterm":
            signal.raise_signal(signal.SIGTERM)
        elif kind == "sigusr1":
            signal.raise_signal(signal.SIGUSR1)
