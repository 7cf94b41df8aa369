"""The elastic family with a master replayed: every exchange, in the order the master made it.

``easgd-rr``, ``easgd-async`` and ``measgd-async`` keep a centre x~ at a master rank.
Worker i trains its own x^i and, at its steps t with tau dividing t (t counted over
the run from 0), exchanges with the master: both move by d = alpha (x^i - x~), the
worker away from x^i's value, the centre towards it (Zhang, Choromanska, LeCun 2015,
Algorithm 1; ``measgd-async``: Algorithm 2, with Nesterov momentum on the worker).

A worker's own steps depend only on its batches and on the centres it received, and the
master's centre only on the exchanges in its order; so the replay walks the master's
exchanges in order, and before each one advances that worker through its steps without
an exchange (plain gradient steps) up to the exchanging step. The staleness of an
exchange (for ``--explain`` and the statistics) is how many times other workers moved
the centre since this worker last saw it.

alpha is the run's ``alpha``, or, when -1, beta / p with the paper's beta = 0.9 and p
the workers; each worker's rate is the run's schedule at its own step count.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from minidp.replay import rules
from minidp.replay.recorded import CannotReplay, Recorded, Workers
from minidp.replay.servers import Differs, Update

BETA = 0.9  # EASGD's centre rate, shared by the p workers when alpha is not given


@dataclasses.dataclass
class Worker:
    """One worker's state in the replay."""

    rank: int
    x: np.ndarray
    v: np.ndarray
    rows: list[list[int]]
    step: int = 0
    seen: int = -1  # the centre's version at its last exchange (-1: none yet)


class ElasticReplay:
    """Replays ``easgd-rr``, ``easgd-async`` and ``measgd-async`` runs (see the module doc)."""

    def __init__(self, run: Recorded, workers: Workers) -> None:
        self.run, self.workers = run, workers
        options = run.options
        self.alpha = BETA / len(run.workers) if options["alpha"] == -1 else options["alpha"]
        self.tau = options["tau"]
        self.nesterov = run.strategy == "measgd-async"  # Algorithm 2 (delta 0: Algorithm 1)
        self.delta = options["delta"] if self.nesterov else 0.0
        self.weight_decay = run.config["weight_decay"]
        self.schedule = run.schedule()
        self.centre = workers.initial.copy()
        self.version = 0
        self.team = {w: Worker(w, workers.initial.copy(), np.zeros_like(workers.initial),
                               run.rows(w)) for w in run.workers}
        self.master = run.rows(run.servers[0])
        self.staleness: list[int] = []
        self.updates: list[Update] = []

    def replay(self) -> np.ndarray:
        """The master's exchanges in order, each worker's other steps between; the centre."""
        for k, (rank, epoch) in enumerate(self.master):
            worker = self.team[rank]
            while worker.step < len(worker.rows) and not worker.rows[worker.step][2]:
                self.step(worker, None)
            if worker.step == len(worker.rows) or worker.rows[worker.step][0] != epoch:
                raise CannotReplay(f"the events are inconsistent: the master's exchange {k + 1} "
                                   f"(worker {rank}, epoch {epoch + 1}) has no step of that "
                                   "worker")
            self.step(worker, k)
        for worker in self.team.values():  # steps after their last exchange
            while worker.step < len(worker.rows):
                if worker.rows[worker.step][2]:
                    raise CannotReplay(f"the events are inconsistent: worker {worker.rank}'s "
                                       f"step {worker.step + 1} exchanged, the master has no "
                                       "record of it")
                self.step(worker, None)
        return self.centre

    def step(self, worker: Worker, exchange: int | None) -> None:
        """One step of ``worker``: a gradient step, with the elastic pull if ``exchange``."""
        t = worker.step
        epoch, samples, exchanged = worker.rows[t]
        if exchanged != (t % self.tau == 0):
            raise Differs(f"worker {worker.rank} step {t + 1}: the run "
                          f"{'exchanged' if exchanged else 'did not exchange'}, the rule "
                          f"(exchange when tau = {self.tau} divides the step) says otherwise")
        lr = self.schedule(t)
        x, y, where = self.workers.take(worker.rank, epoch, samples)
        centre = self.centre if exchange is not None else None
        if self.nesterov:
            point = rules.look_ahead(worker.x, worker.v, self.delta)
            g = self.workers.gradient(point, x, y)
            d = rules.eamsgd_step(worker.x, point, worker.v, g, centre, self.alpha, lr,
                                  self.weight_decay)
        else:
            g = self.workers.gradient(worker.x, x, y)
            d = rules.easgd_step(worker.x, g, centre, self.alpha, lr, self.weight_decay)
        worker.step += 1
        if d is None:
            return
        self.centre += d
        stale = self.version - worker.seen - 1 if worker.seen >= 0 else self.version
        self.staleness.append(stale)
        worker.seen = self.version
        self.version += 1
        self.updates.append(Update(
            f"master, centre version {self.version - 1} -> {self.version}",
            [f"worker {worker.rank} step {t + 1} (epoch {epoch + 1}, {where}): staleness "
             f"{stale}, |x - centre| {float(np.abs(d).max()) / max(self.alpha, 1e-300):.4g}"],
            f"d = alpha (x - centre), alpha {self.alpha:.4g}; worker lr {lr:.4g}"
            + (f", delta {self.delta:g} (gradient at the look-ahead)" if self.nesterov else "")))

    def summary(self) -> dict:
        """Counts for the report: exchanges, staleness."""
        return {"gradients": sum(len(w.rows) for w in self.team.values()),
                "updates": len(self.updates), "staleness": self.staleness}
