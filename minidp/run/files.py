"""A run's files: metrics per epoch, the summary, the model, the trace; and their tables.

Written into ``--out`` (docs/design.md, "A run's files"), every file atomically (a temporary
name carrying the run's id, fsync, rename: :mod:`minidp.io.atomic`), so a crash never leaves
half a file, and every name inside the run directory is used without following a link
(:mod:`minidp.io.nofollow`), so nothing is ever written outside it:

* ``metrics.jsonl``: one JSON object per epoch, flushed and fsynced as it is written;
* ``model.npz`` and ``summary.json``: written before the event log (``events.json``,
  for ``minidp replay``) and any trace are gathered, so neither can cost the result;
* ``trace.json``: every rank writes its own part (:meth:`minidp.trace.Tracer.finish`:
  its lane's name and place, its events, its counters), then rank 0 merges the parts
  one at a time (no process holds every rank's events at once).

The JSON is strict (:func:`strict_json`): a number that is not finite (a diverged run's
test loss) is ``null``, never the bare ``NaN`` that JSON parsers other than Python's refuse.

A write that fails (a full disk, a file size limit, the directory removed) is one error
on every rank, naming the file (:meth:`RunFiles.agreed`): most files are written by rank
0 alone, and an error on one rank only would abort the job.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp.comm import Communicator, guard
from minidp.io.atomic import write_failed, write_into
from minidp.io.nofollow import Directory
from minidp.trace import PHASES

PARTS = "trace-parts"


def finite_or_none(value: Any) -> Any:
    """``value`` with every float that is not finite replaced by None (JSON's null)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: finite_or_none(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite_or_none(v) for v in value]
    return value


def strict_json(value: Any, **kwargs: Any) -> str:
    """``value`` as strict JSON: NaN and infinities become null (``allow_nan=False`` checks)."""
    return json.dumps(finite_or_none(value), allow_nan=False, **kwargs)


def agree(world: Communicator, rank: int, write: Callable[..., None], *args: Any) -> None:
    """``write(*args)`` on every rank of ``world``; an OSError on any rank, on every rank.

    Raises:
        OSError: the first failed rank's error (the file and why), on every rank alike.
    """
    problem = None
    try:
        write(*args)
    except OSError as exc:
        problem = str(exc)
    problems = [p for p in guard.allgather_object(world, problem, "run file written") if p]
    if problems:
        raise OSError(f"rank {rank}: {problems[0]}")


class RunFiles:
    """The output directory of one run, as rank 0 (and, for the trace, every rank) writes it.

    Every method is collective over ``world``, so a failed write is every rank's error.
    ``run_id`` (the run's, from its claim) names the temporary files.
    """

    def __init__(self, out: str, rank: int, world: Communicator, run_id: str) -> None:
        self.out, self.rank, self.world, self.run_id = out, rank, world, run_id

    def path(self, name: str) -> str:
        """``out/name``."""
        return os.path.join(self.out, name)

    def write(self, name: str, write: Callable[[Any], None], mode: str = "w",
              inside: str | None = None) -> None:
        """Write ``out/[inside/]name`` atomically, no link followed (:func:`write_into`)."""
        try:
            run = Directory.open(self.out)
        except OSError as exc:
            raise write_failed(self.path(name), exc) from None
        with run:
            if inside is None:
                write_into(run, name, write, mode, self.run_id)
                return
            try:
                directory = run.child(inside)
            except OSError as exc:
                raise write_failed(os.path.join(self.out, inside, name), exc) from None
            with directory:
                write_into(directory, name, write, mode, self.run_id)

    def agreed(self, write: Callable[..., None], *args: Any) -> None:
        """``write(*args)`` on every rank, its errors every rank's (:func:`agree`)."""
        agree(self.world, self.rank, write, *args)

    def start_metrics(self, history: list[dict[str, Any]]) -> None:
        """(Re)write metrics.jsonl with the epochs already done (a resumed run's)."""
        if self.rank == 0:
            lines = "".join(strict_json(m) + "\n" for m in history)
            self.agreed(self.write, "metrics.jsonl", lambda f: f.write(lines))
        else:
            self.agreed(lambda: None)

    def append_metrics(self, metrics: dict[str, Any]) -> None:
        """Add one epoch's line, flushed and fsynced (a killed job keeps it)."""
        self.agreed(self._append if self.rank == 0 else lambda _: None, strict_json(metrics))

    def _append(self, line: str) -> None:
        path = self.path("metrics.jsonl")
        try:
            with Directory.open(self.out) as run, run.append("metrics.jsonl") as f:
                f.write(line + "\n")
                f.flush()
                os.fsync(f.fileno())
        except OSError as exc:
            raise write_failed(path, exc) from None

    def write_results(self, state: dict[str, np.ndarray], summary: dict[str, Any]) -> None:
        """model.npz and summary.json (rank 0)."""
        def write() -> None:
            if self.rank == 0:
                self.write("model.npz", lambda f: np.savez(f, **state), "wb")
                text = strict_json(summary, indent=1)
                self.write("summary.json", lambda f: f.write(text))
        self.agreed(write)

    def write_trace(self, events: list[dict[str, Any]]) -> None:
        """Every rank writes its events; rank 0 merges them into trace.json, rank by rank."""
        size = self.world.Get_size()
        self.agreed(self._parts_directory)
        self.agreed(self.write, f"rank-{self.rank:05d}.json", lambda f: json.dump(events, f),
                    "w", PARTS)

        def merge() -> None:
            if self.rank == 0:
                with Directory.open(self.out) as run, run.child(PARTS) as parts:
                    self.write("trace.json", lambda f: _merge(f, parts, size))
                    for r in range(size):
                        parts.remove_file(f"rank-{r:05d}.json")
                    left = parts.names()
                if not left:  # a file of someone else's in it keeps it
                    run_dir = Directory.open(self.out)
                    with run_dir:
                        run_dir.remove_dir(PARTS)
        self.agreed(merge)

    def _parts_directory(self) -> None:
        if self.rank == 0:
            try:
                with Directory.open(self.out) as run:
                    run.child(PARTS, create=True).close()
            except OSError as exc:
                raise write_failed(self.path(PARTS), exc) from None


def _merge(out: Any, parts: Directory, ranks: int) -> None:
    """Stream every rank's part into one Chrome trace object."""
    out.write('{"displayTimeUnit": "ms", "traceEvents": [')
    first = True
    for r in range(ranks):
        with parts.open_read(f"rank-{r:05d}.json") as f:
            events = json.load(f)
        if not any(e.get("name") == "process_name" for e in events[:2]):
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
