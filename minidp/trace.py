"""Phase timers, counters and Chrome-trace events of one rank.

A :class:`Tracer` sums seconds per phase (``data, forward, backward, comm_intra,
comm_inter, wait, optimizer``), counts bytes and messages per communication level, and
records complete events (``"ph": "X"``) and instant events (``"ph": "i"``: a strategy's
decisions, e.g. DASO's sends) that :func:`chrome_trace` turns into the JSON that
Perfetto and chrome://tracing read (pid = rank).
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

PHASES = ("data", "forward", "backward", "comm_intra", "comm_inter", "wait", "optimizer")


class Tracer:
    """Per-rank timing and counting; cheap enough to stay on during training."""

    def __init__(self, rank: int = 0, record_events: bool = True,
                 max_events: int = 200_000) -> None:
        self.rank, self.record_events, self.max_events = rank, record_events, max_events
        self.origin = time.perf_counter()
        self.seconds: dict[str, float] = defaultdict(float)
        self.counters: dict[str, int] = defaultdict(int)
        self.events: list[dict[str, Any]] = []
        # Called with every event as it ends (``--explain`` prints them); None: nobody.
        self.listener: Callable[[dict[str, Any]], None] | None = None

    @contextlib.contextmanager
    def phase(self, name: str, **args: Any) -> Iterator[None]:
        """Time the block under ``name`` and record it as one trace event."""
        start = time.perf_counter()
        try:
            yield
        finally:
            end = time.perf_counter()
            self.seconds[name] += end - start
            self._record({"name": name, "ph": "X", "pid": self.rank, "tid": 0,
                          "ts": (start - self.origin) * 1e6, "dur": (end - start) * 1e6,
                          "args": args})

    def mark(self, name: str, **args: Any) -> None:
        """Record an instant event: a decision at one moment, its numbers in ``args``."""
        self._record({"name": name, "ph": "i", "s": "t", "pid": self.rank, "tid": 0,
                      "ts": (time.perf_counter() - self.origin) * 1e6, "args": args})

    def _record(self, event: dict[str, Any]) -> None:
        # Long runs keep their first max_events events: the trace stays loadable.
        if self.record_events and len(self.events) < self.max_events:
            self.events.append(event)
        if self.listener is not None:
            self.listener(event)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a counter (e.g. ``bytes_inter``)."""
        self.counters[name] += amount

    def reset(self) -> None:
        """Zero the sums and counters (events are kept for the trace file)."""
        self.seconds.clear()
        self.counters.clear()


def chrome_trace(events_per_rank: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Merge every rank's events into one Chrome trace object."""
    events = [e for rank_events in events_per_rank for e in rank_events]
    for rank in range(len(events_per_rank)):
        events.append({"name": "process_name", "ph": "M", "pid": rank,
                       "args": {"name": f"rank {rank}"}})
    return {"traceEvents": events, "displayTimeUnit": "ms"}


_tracer = {"current": Tracer()}


def tracer() -> Tracer:
    """The process-wide tracer the communication layer reports to."""
    return _tracer["current"]


def set_tracer(new: Tracer) -> Tracer:
    """Install a tracer (the Trainer installs one per run); returns it."""
    _tracer["current"] = new
    return new
