"""Phase timers, counters and Chrome-trace events of one rank, arrows between ranks included.

A :class:`Tracer` sums seconds per phase (``data, forward, backward, comm_intra,
comm_inter, wait, optimizer``), counts bytes and messages per communication level, and
records what :func:`chrome_trace` (and ``run/files.py``, rank by rank) turns into the
JSON that Perfetto and chrome://tracing read, one process per rank (pid = rank):

=========  ==========================================================================
``ph``     what
=========  ==========================================================================
``X``      a slice: one phase, or one communication (its ``args``: ``op``, ``bytes``)
``i``      an instant: a strategy's decision (DASO's send, a server's update, an
           elastic exchange), and ``step``, where a worker's step begins
``s``      a flow start: a message (or a rank's part of a collective) leaves, inside
           the slice that sends it; ``args``: what moved and its bytes
``f``      the flow end with the same ``id``, ``cat`` and ``name``, inside the slice
           that receives it (``"bp": "e"``: bound to that enclosing slice), so the
           viewer draws an arrow from sender to receiver (:mod:`minidp.comm.arrows`)
``C``      at the end: the rank's byte and message counters over the whole run
``M``      the lane's name (``node 0 / rank 1``) and place (``process_sort_index``:
           the lanes grouped by node)
=========  ==========================================================================

Timestamps are microseconds on the Unix clock (``time.time``), read through
``perf_counter`` from one moment taken when the tracer starts (:func:`clock_origin`):
every rank of a machine reads the same clock, so the ranks' lanes line up and an arrow
never runs backwards in time (across machines they line up as well as the hosts' clocks
agree). The decisions and step marks are recorded for the first :data:`DETAIL_STEPS`
steps only (what the sequence diagram of ``minidp report`` draws); slices and arrows for
the whole run, up to ``max_events``.
"""

from __future__ import annotations

import contextlib
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from typing import Any

PHASES = ("data", "forward", "backward", "comm_intra", "comm_inter", "wait", "optimizer")
DETAIL_STEPS = 10  # steps whose decisions and boundaries are recorded (the diagram's)
ORIGIN_READS = 8  # brackets tried for the tracer's origin (clock_origin)


def clock_origin(reads: int = ORIGIN_READS) -> tuple[float, float]:
    """One moment on both clocks: (``perf_counter`` seconds, Unix microseconds).

    Two clocks cannot be read at once. A rank descheduled between the two reads (a
    millisecond and more on a busy machine) would shift every stamp it makes by that
    pause, and the arrows from its lane would run backwards. So the Unix clock is read
    between two ``perf_counter`` reads, ``reads`` times, and the tightest bracket is
    kept: its midpoint is within half its width (under a microsecond when nothing
    interrupts it) of the moment the Unix clock was read.
    """
    best_width, origin, unix_us = float("inf"), 0.0, 0.0
    for _ in range(reads):
        before = time.perf_counter()
        unix = time.time()
        after = time.perf_counter()
        if after - before < best_width:
            best_width, origin, unix_us = after - before, (before + after) / 2, unix * 1e6
    return origin, unix_us


class Tracer:
    """Per-rank timing and counting; cheap enough to stay on during training.

    Args:
        rank: the world rank (the trace's pid).
        lane: the rank's lane in the trace: its name (``node 0 / rank 1``) and its place
            among the lanes (:meth:`minidp.comm.Topology.lane`); default ``rank R``, R.
        record_events: keep events for the trace file (off: sums and counters only).
        max_events: events kept at most; a long run keeps its first ones.
    """

    def __init__(self, rank: int = 0, lane: tuple[str, int] | None = None,
                 record_events: bool = True, max_events: int = 200_000) -> None:
        self.rank, self.record_events, self.max_events = rank, record_events, max_events
        self.lane = lane or (f"rank {rank}", rank)
        # The same moment on this rank's perf_counter and the Unix clock every rank reads.
        self.origin, self.unix_us = clock_origin()
        self.seconds: dict[str, float] = defaultdict(float)
        self.counters: dict[str, int] = defaultdict(int)
        self.totals: dict[str, int] = defaultdict(int)  # the counters, never reset
        self.events: list[dict[str, Any]] = []
        self.step, self.detail_steps = 0, DETAIL_STEPS
        self.served: dict[int, int] = {}  # a server's decisions marked, per worker
        # Called with every event as it ends (``--explain`` prints them); None: nobody.
        self.listener: Callable[[dict[str, Any]], None] | None = None

    def now(self) -> float:
        """This moment as a trace timestamp (microseconds, Unix clock)."""
        return (time.perf_counter() - self.origin) * 1e6 + self.unix_us

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
                          "ts": (start - self.origin) * 1e6 + self.unix_us,
                          "dur": (end - start) * 1e6, "args": args})

    def mark(self, name: str, **args: Any) -> None:
        """Record an instant event: a decision at one moment, its numbers in ``args``."""
        self._record({"name": name, "ph": "i", "s": "t", "pid": self.rank, "tid": 0,
                      "ts": self.now(), "args": args})

    @property
    def detailed(self) -> bool:
        """Whether this rank is within its first :data:`DETAIL_STEPS` steps.

        Decisions are marked only then (``if tracer().detailed: tracer().mark(...)``), so
        the steps after allocate nothing for them. A server, which takes no steps, counts
        its updates against ``detail_steps`` x the workers instead.
        """
        return self.step <= self.detail_steps

    def detailed_for(self, worker: int) -> bool:
        """On a server or master: whether to mark this decision on ``worker``'s message.

        True for each worker's first :data:`DETAIL_STEPS` messages, those of its first
        steps (a worker's messages come in its steps' order). Counted per worker: a fast
        worker's later messages may come before a slow one's first.
        """
        served = self.served.get(worker, 0)
        if served >= self.detail_steps:
            return False
        self.served[worker] = served + 1
        return True

    def begin_step(self, step: int) -> None:
        """A worker's step ``step`` (of the run, from 1) begins: marked while detailed."""
        self.step = step
        if step <= self.detail_steps:
            self.mark("step", step=step)

    def flow(self, ph: str, flow_id: str, cat: str, **args: Any) -> None:
        """One end of an arrow, now: ``ph`` "s" (it leaves) or "f" (it arrives).

        Both ends carry the same ``flow_id``, ``cat`` and name (the viewers pair them by
        the three); call it inside the slice the arrow belongs to.
        """
        event = {"name": cat, "cat": cat, "ph": ph, "id": flow_id, "pid": self.rank,
                 "tid": 0, "ts": self.now()}
        if ph == "f":
            event["bp"] = "e"  # bound to the enclosing slice, not the next one
        if args:
            event["args"] = args
        self._record(event)

    def _record(self, event: dict[str, Any]) -> None:
        # Long runs keep their first max_events events: the trace stays loadable.
        if self.record_events and len(self.events) < self.max_events:
            self.events.append(event)
        if self.listener is not None:
            self.listener(event)

    def count(self, name: str, amount: int = 1) -> None:
        """Add to a counter (e.g. ``bytes_inter``)."""
        self.counters[name] += amount
        self.totals[name] += amount

    def reset(self) -> None:
        """Zero the sums and counters (events and the run's totals are kept)."""
        self.seconds.clear()
        self.counters.clear()

    def finish(self) -> list[dict[str, Any]]:
        """What this rank gives the trace file: its lane, its events, the run's counters.

        The lane's name and place come first (``"ph": "M"``), the counters over the whole
        run last (``"ph": "C"``, named ``sent``). Nothing when events are not recorded.
        """
        if not self.record_events:
            return []
        name, place = self.lane
        return [{"name": "process_name", "ph": "M", "pid": self.rank, "args": {"name": name}},
                {"name": "process_sort_index", "ph": "M", "pid": self.rank,
                 "args": {"sort_index": place}},
                *self.events,
                {"name": "sent", "ph": "C", "pid": self.rank, "tid": 0, "ts": self.now(),
                 "args": dict(sorted(self.totals.items()))}]


def chrome_trace(events_per_rank: list[list[dict[str, Any]]]) -> dict[str, Any]:
    """Merge every rank's events (:meth:`Tracer.finish`) into one Chrome trace object.

    A rank whose events do not name its lane is named ``rank R``.
    """
    events = [e for rank_events in events_per_rank for e in rank_events]
    named = {e["pid"] for e in events if e.get("name") == "process_name" and e["ph"] == "M"}
    for rank in range(len(events_per_rank)):
        if rank not in named:
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
