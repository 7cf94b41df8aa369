"""A run's files: metrics per epoch, the summary, the model, the trace; and their tables.

Written into ``--out`` (docs/design.md, "A run's files"), every file atomically (temporary name
unique to the writing process, fsync, rename), so a crash never leaves half a file:

* ``metrics.jsonl``: one JSON object per epoch, flushed and fsynced as it is written;
* ``model.npz`` and ``summary.json``: written before any trace is gathered, so a large
  trace can never cost the result;
* ``trace.json``: every rank writes its own part, then rank 0 merges the parts one at
  a time (no process holds every rank's events at once).
"""

from __future__ import annotations

import json
import os
from typing import Any

import numpy as np

from minidp.comm import Communicator, guard
from minidp.io.atomic import atomic_write
from minidp.trace import PHASES


class RunFiles:
    """The output directory of one run, as rank 0 (and, for the trace, every rank) writes it."""

    def __init__(self, out: str, rank: int) -> None:
        self.out, self.rank = out, rank

    def path(self, name: str) -> str:
        """``out/name``."""
        return os.path.join(self.out, name)

    def start_metrics(self, history: list[dict[str, Any]]) -> None:
        """Rank 0: (re)write metrics.jsonl with the epochs already done (a resumed run's)."""
        if self.rank == 0:
            atomic_write(self.path("metrics.jsonl"),
                         lambda f: f.writelines(json.dumps(m) + "\n" for m in history))

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        """Rank 0: add one epoch's line, flushed and fsynced (a killed job keeps it)."""
        if self.rank == 0:
            with open(self.path("metrics.jsonl"), "a") as f:
                f.write(json.dumps(metrics) + "\n")
                f.flush()
                os.fsync(f.fileno())

    def write_results(self, state: dict[str, np.ndarray], summary: dict[str, Any]) -> None:
        """Rank 0: model.npz and summary.json."""
        if self.rank == 0:
            atomic_write(self.path("model.npz"), lambda f: np.savez(f, **state), "wb")
            atomic_write(self.path("summary.json"), lambda f: json.dump(summary, f, indent=1))

    def write_trace(self, events: list[dict[str, Any]], world: Communicator) -> None:
        """Every rank writes its events; rank 0 merges them into trace.json, rank by rank."""
        parts = self.path("trace-parts")
        if self.rank == 0:
            os.makedirs(parts, exist_ok=True)
        guard.barrier(world, "trace parts directory")
        mine = os.path.join(parts, f"rank-{self.rank:05d}.json")
        atomic_write(mine, lambda f: json.dump(events, f))
        guard.barrier(world, "trace parts written")
        if self.rank == 0:
            atomic_write(self.path("trace.json"), lambda f: _merge(f, parts, world.Get_size()))
            for r in range(world.Get_size()):
                os.remove(os.path.join(parts, f"rank-{r:05d}.json"))
            os.rmdir(parts)


def _merge(out: Any, parts: str, ranks: int) -> None:
    """Stream every rank's part into one Chrome trace object."""
    out.write('{"displayTimeUnit": "ms", "traceEvents": [')
    first = True
    for r in range(ranks):
        with open(os.path.join(parts, f"rank-{r:05d}.json")) as f:
            events = json.load(f)
        events.append({"name": "process_name", "ph": "M", "pid": r,
                       "args": {"name": f"rank {r}"}})
        for event in events:
            out.write(("" if first else ",") + json.dumps(event))
            first = False
    out.write("]}")


def phase_table(history: list[dict]) -> str:
    """A short table: accuracy, wall time and seconds per phase for every epoch.

    Phases are the maximum over ranks; "comm %" is the largest share of one rank's
    epoch spent communicating or waiting (comm_intra + comm_inter + wait).
    """
    head = ["epoch", "test acc", "wall s", *PHASES, "comm %"]
    rows = []
    for m in history:
        rows.append([str(m["epoch"]), f"{m['test_accuracy']:.2%}", f"{m['wall_s']:.1f}",
                     *(f"{m['phases'][p]:.2f}" for p in PHASES),
                     f"{m['comm_s'] / m['wall_s']:.0%}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(head, widths)),
             "-|-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)
