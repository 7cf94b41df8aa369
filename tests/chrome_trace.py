"""A schema check of Chrome's trace event format, as Perfetto and chrome://tracing read it.

Perfetto's trace processor is not installed here (its Python package fetches a binary
at run time), so the tests hold ``trace.json`` to the format's document instead ("Trace
Event Format", the JSON object form): :func:`problems` lists every event that a viewer
would refuse or misread, :func:`unbound_flows` every flow event that no slice of its
own thread encloses (a viewer drops such an arrow: Perfetto counts it as
``flow_no_enclosing_slice``), and :func:`flow_pairs` the arrows themselves.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from typing import Any

PHASES = {"B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "M", "N", "O", "D",
          "P", "R", "c"}
METADATA = {"process_name": ("name", str), "process_sort_index": ("sort_index", int),
            "thread_name": ("name", str), "thread_sort_index": ("sort_index", int),
            "process_labels": ("labels", str)}


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def problems(trace: Any) -> list[str]:
    """What in ``trace`` (the parsed JSON) breaks the format; empty when it is sound."""
    if not isinstance(trace, dict) or not isinstance(trace.get("traceEvents"), list):
        return ["the top level is not an object with a 'traceEvents' array"]
    found = []
    if trace.get("displayTimeUnit", "ms") not in ("ms", "ns"):
        found.append(f"displayTimeUnit {trace['displayTimeUnit']!r} is not 'ms' or 'ns'")
    for k, e in enumerate(trace["traceEvents"]):
        found += [f"event {k}: {p}" for p in _event(e)]
    return found


def _event(e: Any) -> list[str]:
    if not isinstance(e, dict):
        return ["not an object"]
    out = []
    ph = e.get("ph")
    if ph not in PHASES:
        return [f"'ph' {ph!r} is no phase of the format"]
    if not isinstance(e.get("name"), str):
        out.append("no string 'name'")
    if not _int(e.get("pid")) or e["pid"] < 0:
        out.append("no int 'pid' >= 0")
    if "args" in e and not isinstance(e["args"], dict):
        out.append("'args' is not an object")
    if ph == "M":
        return out + _metadata(e)
    if not _number(e.get("ts")):
        out.append("no finite number 'ts'")
    if "tid" in e and not _int(e["tid"]):
        out.append("'tid' is not an int")
    if ph == "X" and (not _number(e.get("dur")) or e["dur"] < 0):
        out.append("a complete event ('X') without a 'dur' >= 0")
    if ph in ("i", "I") and e.get("s", "t") not in ("g", "p", "t"):
        out.append(f"an instant's scope 's' {e.get('s')!r} is not g, p or t")
    if ph in ("s", "t", "f"):
        if not isinstance(e.get("id"), (str, int)) or isinstance(e.get("id"), bool):
            out.append("a flow event without an 'id' (string or int)")
        elif isinstance(e["id"], str) and not _hex(e["id"]):
            out.append(f"a flow id {e['id']!r} that is no hex number (Perfetto reads it so)")
        if not isinstance(e.get("cat"), str):
            out.append("a flow event without a string 'cat'")
        if "bp" in e and e["bp"] != "e":
            out.append(f"a flow's binding point 'bp' {e['bp']!r} is not 'e'")
    if ph == "C" and not (isinstance(e.get("args"), dict) and e["args"] and
                          all(_number(v) for v in e["args"].values())):
        out.append("a counter event ('C') whose 'args' are not numbers")
    return out


def _hex(text: str) -> bool:
    digits = text[2:] if text.lower().startswith("0x") else text
    try:
        return 0 <= int(digits, 16) < 2 ** 64
    except ValueError:
        return False


def _metadata(e: dict[str, Any]) -> list[str]:
    if e.get("name") not in METADATA:
        return [f"metadata {e.get('name')!r} that no viewer knows"]
    key, kind = METADATA[e["name"]]
    value = e.get("args", {}).get(key)
    if not isinstance(value, kind) or isinstance(value, bool):
        return [f"metadata {e['name']} without args.{key} ({kind.__name__})"]
    return []


def unbound_flows(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The flow events (``s``, ``f``) that lie in no ``X`` slice of their pid and tid."""
    slices: dict[tuple[int, int], list[tuple[float, float]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            slices[e["pid"], e.get("tid", 0)].append((e["ts"], e["ts"] + e["dur"]))
    for spans in slices.values():
        spans.sort()
    loose = []
    for e in events:
        if e.get("ph") not in ("s", "f"):
            continue
        spans = slices.get((e["pid"], e.get("tid", 0)), [])
        # The slices starting at or before the event; one of them must still be open.
        i = bisect.bisect_right(spans, (e["ts"], math.inf))
        if not any(end >= e["ts"] for _, end in spans[:i]):
            loose.append(e)
    return loose


def flow_pairs(events: list[dict[str, Any]]) -> tuple[dict[str, tuple[dict, dict]], list[str]]:
    """Every arrow: id -> (its start, its end); and each id without exactly one of each."""
    ends: dict[str, dict[str, list[dict]]] = defaultdict(lambda: {"s": [], "f": []})
    for e in events:
        if e.get("ph") in ("s", "f"):
            ends[e["id"]][e["ph"]].append(e)
    pairs, odd = {}, []
    for flow, both in ends.items():
        if len(both["s"]) == 1 and len(both["f"]) == 1:
            pairs[flow] = (both["s"][0], both["f"][0])
        else:
            odd.append(f"{flow}: {len(both['s'])} start(s), {len(both['f'])} end(s)")
    return pairs, odd
