"""What an asynchronous run did, in order: the record ``python -m minidp replay`` re-executes.

An asynchronous run is nondeterministic only in the order of its events: which
worker's gradient a server applied when, and which versions of the parameters that
worker had read. ``asgd``, ``amsgd``, ``softsync``, ``dbs``, ``easgd-rr``,
``easgd-async`` and ``measgd-async`` record exactly that, as rows of integers (no
float, nothing timed), on every rank:

* a parameter-server worker, one row per step: ``epoch, samples, version read from
  server 0, ..., from server K-1``;
* a parameter server, one row per event in the order it handled them: ``kind, worker,
  staleness, samples`` with kind :data:`GRADIENT` (a push taken), :data:`LEAVE` (the
  worker's epoch is over at this server) or :data:`EPOCH_END` (every worker's is);
* an elastic worker, one row per step: ``epoch, samples, exchanged (0 or 1)``;
* the elastic master, one row per exchange, in the order it answered them:
  ``worker, epoch``.

At the run's end every rank's rows go to rank 0 (:func:`write_events`), which writes
``events.json`` into the run directory: a few integers per step, so a long run's file
stays small. With the run's configuration (``run.json``) and its data, that is all a
single process needs to recompute every gradient and every update.
"""

from __future__ import annotations

import json
from typing import Any

from minidp.comm import Topology, guard
from minidp.io.atomic import atomic_write

FORMAT = 1
GRADIENT, LEAVE, EPOCH_END = 0, 1, 2
SERVER_COLUMNS = ("kind", "worker", "staleness", "samples")
ELASTIC_WORKER_COLUMNS = ("epoch", "samples", "exchanged")
MASTER_COLUMNS = ("worker", "epoch")


def worker_columns(servers: int) -> tuple[str, ...]:
    """A parameter-server worker's columns: epoch, samples, the version read per server."""
    return ("epoch", "samples", *(f"version_{k}" for k in range(servers)))


class EventLog:
    """One rank's rows of integers, in the order this rank lived them.

    Args:
        columns: the name of each column (every row has one integer per column).
    """

    def __init__(self, columns: tuple[str, ...]) -> None:
        self.columns = columns
        self.rows: list[list[int]] = []

    def add(self, *values: int) -> None:
        """Append one row (``len(columns)`` integers)."""
        if len(values) != len(self.columns):
            raise ValueError(f"event row: got {len(values)} values, allowed: "
                             f"{len(self.columns)} ({', '.join(self.columns)})")
        self.rows.append([int(v) for v in values])


def write_events(path: str, strategy: str, topology: Topology, log: EventLog,
                 tag: str | None = None) -> None:
    """Collective over the world: every rank's rows gathered; rank 0 writes ``path``.

    ``tag`` (the run's id) names the temporary file, ``events.json.tmp-RUNID``, as every
    file of a run: one a killed job left is then known as the run's own.

    The guard's timed gather is an allgather, so every rank receives the rows. The file
    (JSON, written atomically) names the strategy and the roles, then holds each rank's
    role, columns and rows, in rank order.
    """
    mine: dict[str, Any] = {"rank": topology.rank, "role": topology.role,
                            "columns": list(log.columns), "rows": log.rows}
    ranks = guard.allgather_object(topology.world, mine, "events")
    if topology.rank:
        return
    record = {"format": FORMAT, "strategy": strategy, "world_size": topology.size,
              "servers": list(topology.server_ranks), "workers": list(topology.worker_ranks),
              "ranks": ranks}
    atomic_write(path, lambda f: json.dump(record, f, separators=(",", ":")), tag=tag)
