"""Who sends what to whom in a run's first steps: the data of ``messages.png``.

:func:`sequence` reads a run's ``trace.json`` events (as :mod:`minidp.trace` records
them) into a :class:`Diagram`: one lane per rank, grouped by node; the first N steps
of every worker; the phases of those steps as boxes; every message and every rank's
part of a collective as an arrow from the moment it left its sender to the moment its
receiver had it (the two ends of one flow id, :mod:`minidp.comm.arrows`), labelled with
what moved and its bytes, node-level (``intra``) or rail-level (``inter``); the
strategy's decisions as markers with a short text (a server's with the arrow that came
in last before it: the gradient it applies, the parameters it pulls towards).
:mod:`minidp.reporting.sequence_plot` draws it; tests check its arrows against what the
run did, not pixels.

Steps: a worker marks the start of each step (``step``, before it asks for its batch,
so a parameter server's pull is in the step it serves); the worker's step N ends where
its step N + 1 starts (or with its last slice). An arrow belongs to the step of its
worker end (the sender when it is a worker, else the receiver) at its own time there;
the diagram keeps steps 1..N. A server takes no steps: its lane shows what happens
between the first worker's step 1 and the last worker's step N.

Every field used is checked (:func:`minidp.reporting.readback.fields`): a trace that is
not minidp's is one error naming the event, never a ``KeyError``.
"""

from __future__ import annotations

import bisect
import dataclasses
import re
from typing import Any

from minidp.reporting.readback import (
    NUMBER,
    OBJECT,
    SECONDS,
    TEXT,
    Unreadable,
    count,
    fields,
)

LANE = re.compile(r"node (\d+) / rank (\d+)")
# The decisions drawn, each as a short text from its numbers (DASO's node sync, which
# happens at nearly every batch, shows in its arrows instead).
DECISIONS = {
    "daso send": "send rail {rail}, B,S,L={B},{S},{L}",
    "daso merge": "merge rail {rail}, w={weight:g}",
    "daso broadcast": "bcast from {root}",
    "daso average": "average rail {rail}",
    "daso rails reset": "rails reset",
    "server update": "v{version}: stale {staleness}, lr {lr:.2g}",
    "server gradient": "grad: stale {staleness}, lr {lr:.2g}",
    "elastic exchange": "elastic α={alpha:.2g}",
    "centre exchange": "x̃ ← rank {worker}, α={alpha:.2g}",
    "centre update": "x̃ update β={beta:.2g}",
}
COMPUTE = ("data", "forward", "backward", "optimizer")
DRAWN = (*COMPUTE, "comm_intra", "comm_inter", "wait", "post", "idle")  # slices drawn


class NoSteps(Unreadable):
    """The trace holds no step to draw (an older minidp's run, or a run without a step)."""


@dataclasses.dataclass(frozen=True)
class Lane:
    """One rank's lane: its rank, name (``node 0 / rank 1``), node, and place."""

    rank: int
    name: str
    node: int
    place: int


@dataclasses.dataclass(frozen=True)
class Box:
    """A slice drawn on a lane: its phase, from ``start`` to ``end`` (ms into the diagram)."""

    rank: int
    phase: str
    start: float
    end: float


@dataclasses.dataclass(frozen=True)
class Arrow:
    """One message (or one rank's part of a collective), sender to receiver.

    ``sent`` and ``arrived`` are ms into the diagram; ``level`` is ``intra`` (both ranks
    on one node) or ``inter``; ``kind`` ``p2p`` or ``collective``.
    """

    source: int
    dest: int
    step: int
    what: str
    nbytes: int
    sent: float
    arrived: float
    level: str
    kind: str


@dataclasses.dataclass(frozen=True)
class Marker:
    """A decision on a lane at ``time`` (ms), in a few words."""

    rank: int
    time: float
    step: int
    text: str


@dataclasses.dataclass
class Diagram:
    """A run's first ``steps`` steps, ready to draw (times in ms from ``origin_us``)."""

    steps: int
    lanes: list[Lane]
    boxes: list[Box]
    arrows: list[Arrow]
    markers: list[Marker]
    step_starts: list[tuple[int, int, float]]  # (rank, step, ms)
    origin_us: float
    length: float  # ms


def _where(k: int) -> str:
    return f"trace.json, event {k}"


def _lanes(events: list[dict[str, Any]]) -> dict[int, Lane]:
    """Every rank's lane from the metadata (a rank without it: its own node)."""
    names: dict[int, str] = {}
    places: dict[int, int] = {}
    for k, e in enumerate(events):
        if e.get("ph") != "M":
            continue
        fields(e, {"pid": count(0), "args": OBJECT}, _where(k))
        if e.get("name") == "process_name":
            fields(e["args"], {"name": TEXT}, f"{_where(k)}, 'args'")
            names[e["pid"]] = e["args"]["name"]
        elif e.get("name") == "process_sort_index":
            fields(e["args"], {"sort_index": count(0)}, f"{_where(k)}, 'args'")
            places[e["pid"]] = e["args"]["sort_index"]
    ranks = sorted({e["pid"] for e in events if isinstance(e.get("pid"), int)} | set(names))
    lanes = {}
    for r in ranks:
        name = names.get(r, f"rank {r}")
        found = LANE.match(name)
        node = int(found.group(1)) if found else r
        lanes[r] = Lane(r, name, node, places.get(r, r))
    return lanes


class _Steps:
    """When each worker's steps begin: the step of a rank at a moment."""

    def __init__(self) -> None:
        self.starts: dict[int, list[tuple[float, int]]] = {}

    def add(self, rank: int, ts: float, step: int) -> None:
        self.starts.setdefault(rank, []).append((ts, step))

    def close(self) -> None:
        """Sort each rank's marks; of a step marked twice keep the later start.

        A worker marks a step before it asks for its batch; at an epoch's end that ask
        gets none, and the next epoch marks the same step again: the step that ran.
        """
        for rank, marks in self.starts.items():
            last = {step: ts for ts, step in sorted(marks)}
            self.starts[rank] = sorted((ts, step) for step, ts in last.items())

    def worker(self, rank: int) -> bool:
        return rank in self.starts

    def at(self, rank: int, ts: float) -> int:
        """The step ``rank`` is in at ``ts`` (0: before its first step)."""
        marks = self.starts.get(rank, [])
        i = bisect.bisect_right(marks, (ts, float("inf")))
        return marks[i - 1][1] if i else 0


def sequence(events: list[dict[str, Any]], steps: int = 3) -> Diagram:
    """The diagram of the first ``steps`` steps of the run whose trace holds ``events``.

    Raises:
        ValueError: ``steps`` is not an int >= 1.
        Unreadable: an event the diagram uses is not in minidp's form (named), or the
            trace has no step marks (a run recorded before them, or with no step).
    """
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"report: --steps: got {steps!r}, allowed: an int >= 1")
    lanes = _lanes(events)
    marks = _Steps()
    for k, e in enumerate(events):
        if e.get("ph") == "i" and e.get("name") == "step":
            fields(e, {"pid": count(0), "ts": NUMBER, "args": OBJECT}, _where(k))
            fields(e["args"], {"step": count(1)}, f"{_where(k)}, 'args'")
            marks.add(e["pid"], e["ts"], e["args"]["step"])
    marks.close()
    if not marks.starts:
        raise NoSteps("trace.json has no step marks (a run of minidp before issue 39, or one "
                      "that took no step): no diagram of its first steps")
    # The window: from the first step 1 to the end of the last worker's step N.
    first = min(m[0][0] for m in marks.starts.values())
    ends = {}
    for r, m in marks.starts.items():
        later = [ts for ts, s in m if s > steps and ts > first]
        ends[r] = min(later) if later else None
    last_event = max((e["ts"] + e.get("dur", 0) for e in events
                      if e.get("ph") in ("X", "i") and isinstance(e.get("ts"), (int, float))),
                     default=first)
    last = max(end if end is not None else last_event for end in ends.values())

    def inside(rank: int, ts: float) -> bool:
        """Whether a moment on ``rank``'s lane is in the diagram (a worker: its steps)."""
        if not first <= ts <= last:
            return False
        if not marks.worker(rank):
            return True
        return 1 <= marks.at(rank, ts) <= steps and (ends[rank] is None or ts < ends[rank])

    def ms(ts: float) -> float:
        return (ts - first) / 1e3

    boxes, decisions = [], []
    starts: dict[str, tuple[int, dict[str, Any]]] = {}
    ends_of: dict[str, tuple[int, dict[str, Any]]] = {}
    for k, e in enumerate(events):
        ph = e.get("ph")
        if ph == "X" and e.get("name") in DRAWN:
            fields(e, {"pid": count(0), "ts": NUMBER, "dur": SECONDS}, _where(k))
            r, a, b = e["pid"], e["ts"], e["ts"] + e["dur"]
            if inside(r, a) or inside(r, b):
                boxes.append(Box(r, e["name"], ms(max(a, first)), ms(min(b, last))))
        elif ph == "i" and e.get("name") in DECISIONS:
            fields(e, {"pid": count(0), "ts": NUMBER, "args": OBJECT}, _where(k))
            decisions.append((k, e))
        elif ph in ("s", "f"):
            fields(e, {"pid": count(0), "ts": NUMBER, "id": TEXT, "cat": TEXT}, _where(k))
            (starts if ph == "s" else ends_of)[e["id"]] = (k, e)
    arrows = []
    # On a lane without steps (a server), what arrived last, when: (ts, step, drawn).
    arrivals: dict[int, list[tuple[float, int, bool]]] = {}
    for flow, (k, s) in starts.items():
        if flow not in ends_of:
            continue
        f = ends_of[flow][1]
        source, dest = s["pid"], f["pid"]
        worker, at = (source, s["ts"]) if marks.worker(source) else (dest, f["ts"])
        step = marks.at(worker, at)
        drawn = inside(source, s["ts"]) and inside(dest, f["ts"])
        arrivals.setdefault(dest, []).append((f["ts"], step, drawn))
        if not drawn:
            continue
        args = s.get("args", {})
        fields(args, {"what": TEXT, "bytes": count(0)}, f"{_where(k)}, 'args'")
        level = "intra" if lanes[source].node == lanes[dest].node else "inter"
        arrows.append(Arrow(source, dest, step, args["what"], args["bytes"], ms(s["ts"]),
                            ms(f["ts"]), level, s["cat"]))
    arrows.sort(key=lambda a: (a.sent, a.source, a.dest))
    for came in arrivals.values():
        came.sort()
    markers = []
    for k, e in decisions:
        r, ts = e["pid"], e["ts"]
        if marks.worker(r):
            step, drawn = marks.at(r, ts), inside(r, ts)
        else:  # a server decides on what came last: drawn with it, in its step
            came = arrivals.get(r, [])
            i = bisect.bisect_right(came, (ts, float("inf"), True))
            step, drawn = came[i - 1][1:] if i else (0, False)
        if drawn:
            markers.append(Marker(r, ms(ts), step, _decision(e, k)))
    markers = _together(sorted(markers, key=lambda m: (m.rank, m.time)), ms(last) * 0.004)
    step_starts = sorted((r, s, ms(ts)) for r, m in marks.starts.items() for ts, s in m
                         if inside(r, ts))
    ordered = sorted(lanes.values(), key=lambda lane: (lane.place, lane.rank))
    return Diagram(steps, ordered, boxes, arrows, sorted(markers, key=lambda m: m.time),
                   step_starts, first, ms(last))


def _together(markers: list[Marker], within: float) -> list[Marker]:
    """One marker for a rank's decisions taken together (``within`` ms of the first).

    DASO decides a send, an average and a broadcast in one batch's few microseconds:
    one triangle, their texts one per line, reads better than three on top of each other.
    """
    merged: list[Marker] = []
    for m in markers:
        prev = merged[-1] if merged else None
        if prev is not None and prev.rank == m.rank and m.time - prev.time <= within:
            merged[-1] = dataclasses.replace(prev, text=f"{prev.text}\n{m.text}")
        else:
            merged.append(m)
    return merged


def _decision(event: dict[str, Any], k: int) -> str:
    """A decision's short text (``send rail 1 (B,S,L)=(4,1,1)``)."""
    try:
        return DECISIONS[event["name"]].format(**event["args"])
    except (KeyError, ValueError, TypeError) as error:
        raise Unreadable(f"{_where(k)}: the decision {event['name']!r} lacks a number it "
                         f"shows or has one of another form ({error}), allowed: what minidp "
                         "records") from None


def size_text(nbytes: int) -> str:
    """Bytes in a few characters: ``812 B``, ``3.1 kB``, ``1.6 MB``."""
    for unit, scale in (("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"
