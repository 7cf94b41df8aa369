"""The parameter-server family replayed: every server's updates, in the order it applied them.

Server k holds slice k of the parameters (contiguous, ``k P // K`` to ``(k+1) P // K``)
and a version (updates applied). A worker's step s read version v_k of every slice,
took a gradient there on its batch, and pushed slice k of it to server k. The replay
walks each server's events in order: a gradient (whose staleness is recomputed from the
versions, sigma = version now - version read), a worker leaving the epoch, the epoch's
end. Servers are interleaved as causality allows: a gradient is taken once every slice
it read exists, so the servers advance in turn and each keeps copies of only those of
its versions that a step still to be taken has read.

The rules (:mod:`minidp.replay.rules`), per strategy, at each server:

* ``asgd``: each gradient at once, ``w <- w - lr (g + wd w)``;
* ``amsgd``: the same with ``--momentum`` (``--nesterov``) kept at the server;
* ``softsync``: c = floor(workers / n) gradients per update, Gupta et al.'s rate
  ``lr / <sigma>`` or Zhang et al.'s ``g_l / sigma_l``; what is buffered at an epoch's
  end is applied as one update (minidp's choice, docs/softsync.md);
* ``dbs``: ``update=each``, every gradient weighted ``b_i / b``; ``update=round``, one
  gradient of every worker still in the epoch, ``sum b_i g_i / sum b_i``, with momentum.

The rate is the run's schedule at ``S // (b x workers)``, S the samples of the gradients
this server received before the one that completes the update.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from typing import Any, NamedTuple

import numpy as np

from minidp.replay import rules
from minidp.replay.recorded import CannotReplay, Recorded, Workers

GRADIENT, LEAVE, EPOCH_END = 0, 1, 2  # a server event's kind (minidp.strategies.events)


class Differs(Exception):
    """The run did something its paper's rules do not: the replay cannot follow it."""


class Arrived(NamedTuple):
    """A gradient slice at a server, waiting for (or taken by) the next update."""

    worker: int
    g: np.ndarray
    staleness: int
    samples: int
    step: int


@dataclasses.dataclass
class Update:
    """One update, for ``--explain``: where, what it took, with which rate."""

    where: str
    parts: list[str]
    rule: str


@dataclasses.dataclass
class Server:
    """One server's state in the replay."""

    rank: int
    part: slice
    w: np.ndarray
    buf: np.ndarray
    rows: list[list[int]]
    next: int = 0  # its next event
    version: int = 0
    samples: int = 0  # the samples of the gradients received (the rate's clock)
    taken: Counter = dataclasses.field(default_factory=Counter)  # worker -> pushes taken
    held: list[Arrived] = dataclasses.field(default_factory=list)  # for the next update
    active: set[int] = dataclasses.field(default_factory=set)


class ServersReplay:
    """Replays ``asgd``, ``amsgd``, ``softsync`` and ``dbs`` runs (see the module doc)."""

    def __init__(self, run: Recorded, workers: Workers) -> None:
        self.run, self.workers, self.opt = run, workers, run.config
        self.schedule = run.schedule()
        size = workers.initial.size
        k = len(run.servers)
        self.servers = [Server(r, slice(r * size // k, (r + 1) * size // k),
                               workers.initial[r * size // k:(r + 1) * size // k].copy(),
                               np.zeros((r + 1) * size // k - r * size // k, run.dtype),
                               run.rows(r), active=set(run.workers))
                        for r in run.servers]
        self.steps = {w: run.rows(w) for w in run.workers}
        self.reads = Counter((k, row[2 + k]) for rows in self.steps.values() for row in rows
                             for k in range(len(self.servers)))
        self.copies: dict[tuple[int, int], np.ndarray] = {}  # (server, version) -> slice
        self.grads: dict[tuple[int, int], np.ndarray] = {}  # (worker, step) -> gradient
        self.computed = Counter()  # worker -> steps whose gradient was taken
        self.where: dict[tuple[int, int], str] = {}
        self.staleness: list[int] = []
        self.updates: list[Update] = []
        self.options = run.options
        kept = run.strategy == "amsgd" or (run.strategy == "softsync" and
                                           self.options["server_momentum"]) or \
            (run.strategy == "dbs" and self.options["update"] == "round")
        self.momentum = self.opt["momentum"] if kept else 0.0
        self.nesterov = bool(self.opt["nesterov"]) and bool(kept)
        self.c = len(run.workers) // self.options["n"] if run.strategy == "softsync" else 1
        for s in self.servers:
            self.keep(s)

    # -- the walk ----------------------------------------------------------------------

    def replay(self) -> np.ndarray:
        """Every server's events in order; returns the final parameters (all slices)."""
        while any(s.next < len(s.rows) for s in self.servers):
            moved = False
            for s in self.servers:
                while s.next < len(s.rows) and self.event(s, s.rows[s.next]):
                    s.next += 1
                    moved = True
            if not moved:
                waiting = [f"server {s.rank} at event {s.next}" for s in self.servers
                           if s.next < len(s.rows)]
                raise CannotReplay("the events are inconsistent: no server can go on ("
                                   + ", ".join(waiting) + ")")
        return np.concatenate([s.w for s in self.servers])

    def event(self, s: Server, row: list[int]) -> bool:
        """Apply one event of server ``s``; False if a slice it needs does not exist yet."""
        kind, worker, staleness, samples = row
        if kind == GRADIENT:
            step = s.taken[worker]
            if not self.gradient_ready(worker, step):
                return False
            read = self.steps[worker][step][2 + self.servers.index(s)]
            sigma = s.version - read
            if sigma != staleness or self.steps[worker][step][1] != samples:
                raise Differs(f"server {s.rank}'s gradient {s.next} (worker {worker}, step "
                              f"{step + 1}): the run counted staleness {staleness} on "
                              f"{samples} samples, the versions give {sigma} on "
                              f"{self.steps[worker][step][1]}")
            s.taken[worker] += 1
            g = self.take_gradient(worker, step)[s.part]
            self.staleness.append(sigma)
            self.arrive(s, worker, g, sigma, samples, step)
            s.samples += samples
        elif kind == LEAVE:
            s.active.discard(worker)
            if self.run.strategy == "dbs" and self.options["update"] == "round":
                self.close_round(s)
        elif kind == EPOCH_END:
            if s.held:
                self.flush(s)
            s.active = set(self.run.workers)
        return True

    def arrive(self, s: Server, worker: int, g: np.ndarray, sigma: int, samples: int,
               step: int) -> None:
        """One gradient at server ``s``: applied at once, or held for its update."""
        strategy = self.run.strategy
        s.held.append(Arrived(worker, g, sigma, samples, step))
        if strategy == "dbs" and self.options["update"] == "round":
            self.close_round(s)
        elif strategy != "softsync" or len(s.held) == self.c:
            self.flush(s)

    def close_round(self, s: Server) -> None:
        """DBS rounds: update once every worker still in the epoch has given a gradient."""
        given = {a.worker for a in s.held}
        if s.held and s.active <= given:
            self.flush(s)

    def flush(self, s: Server) -> None:
        """Apply what ``s`` holds as one update, by the strategy's rule."""
        lr = self.schedule(s.samples // (self.run.base_batch * len(self.run.workers)))
        held, s.held = s.held, []
        strategy, rule = self.run.strategy, ""
        grads = [a.g for a in held]
        sigmas = [a.staleness for a in held]
        if strategy == "softsync" and self.options["rule"] == "each":
            direction = rules.per_gradient_staleness(grads, sigmas)
            rule = f"mean of g / max(sigma, 1) over {len(held)} (Zhang et al.), lr {lr:.4g}"
        elif strategy == "softsync":
            direction = rules.mean(grads)
            rate = rules.mean_staleness_rate(lr, sigmas)
            rule = (f"mean over {len(held)}, lr {lr:.4g} / max(<sigma> = "
                    f"{sum(sigmas) / len(sigmas):.3g}, 1) = {rate:.4g} (Gupta et al.)")
            lr = rate
        elif strategy == "dbs" and self.options["update"] == "round":
            direction = rules.round_mean({a.worker: a.g for a in held},
                                         {a.worker: a.samples for a in held})
            rule = f"sum b_i g_i / {sum(a.samples for a in held)} samples, lr {lr:.4g}"
        elif strategy == "dbs":
            direction = rules.sample_weight(grads[0], held[0].samples, self.run.base_batch)
            rule = f"x b_i/b = {held[0].samples}/{self.run.base_batch}, lr {lr:.4g}"
        else:
            direction, rule = grads[0], f"lr {lr:.4g}"
        rules.sgd(s.w, direction, lr, self.momentum, self.opt["weight_decay"], self.nesterov,
                  s.buf)
        s.version += 1
        self.keep(s)
        each = strategy == "softsync" and self.options["rule"] == "each"
        parts = [f"worker {a.worker} step {a.step + 1} ({self.where[a.worker, a.step]}): "
                 f"staleness {a.staleness}" + (f", x 1/{max(a.staleness, 1)}" if each else "")
                 for a in held]
        self.updates.append(Update(f"server {s.rank}, version {s.version - 1} -> {s.version}",
                                   parts, rule))

    # -- slices and gradients ------------------------------------------------------------

    def keep(self, s: Server) -> None:
        """Copy ``s``'s slice at its current version if a step still to be taken read it."""
        key = (self.servers.index(s), s.version)
        if self.reads[key]:
            self.copies[key] = s.w.copy()

    def gradient_ready(self, worker: int, step: int) -> bool:
        """Whether every slice the worker's steps up to ``step`` read exists by now."""
        for t in range(self.computed[worker], step + 1):
            row = self.steps[worker][t]
            if any((k, row[2 + k]) not in self.copies for k in range(len(self.servers))):
                return False
        return True

    def take_gradient(self, worker: int, step: int) -> np.ndarray:
        """The gradient of ``worker``'s ``step`` (its earlier steps' first, in order)."""
        while self.computed[worker] <= step:
            t = self.computed[worker]
            epoch, samples, *versions = self.steps[worker][t]
            params = np.concatenate([self.copies[k, v] for k, v in enumerate(versions)])
            for key in enumerate(versions):
                self.reads[key] -= 1
                if not self.reads[key]:
                    del self.copies[key]
            x, y, where = self.workers.take(worker, epoch, samples)
            self.grads[worker, t] = self.workers.gradient(params, x, y)
            self.where[worker, t] = f"epoch {epoch + 1}, {where}"
            self.computed[worker] += 1
        g = self.grads[worker, step]
        if all(s.taken[worker] > step for s in self.servers):
            del self.grads[worker, step]  # every server has its slice
        return g

    def summary(self) -> dict[str, Any]:
        """Counts for the report: gradients, updates, staleness."""
        return {"gradients": len(self.staleness), "updates": len(self.updates),
                "staleness": self.staleness}
