"""The trace-format check the arrow tests rely on finds what a viewer would refuse."""

import copy

import pytest
from chrome_trace import flow_pairs, problems, unbound_flows

SOUND = {"displayTimeUnit": "ms", "traceEvents": [
    {"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "node 0 / rank 0"}},
    {"name": "process_sort_index", "ph": "M", "pid": 0, "args": {"sort_index": 0}},
    {"name": "comm_intra", "ph": "X", "pid": 0, "tid": 0, "ts": 10.0, "dur": 5.0,
     "args": {"op": "send"}},
    {"name": "p2p", "cat": "p2p", "ph": "s", "id": "0x00ff", "pid": 0, "tid": 0, "ts": 12.0,
     "args": {"what": "x", "bytes": 8}},
    {"name": "wait", "ph": "X", "pid": 1, "tid": 0, "ts": 11.0, "dur": 9.0, "args": {}},
    {"name": "p2p", "cat": "p2p", "ph": "f", "bp": "e", "id": "0x00ff", "pid": 1, "tid": 0,
     "ts": 19.5},
    {"name": "step", "ph": "i", "s": "t", "pid": 1, "tid": 0, "ts": 3.0, "args": {"step": 1}},
    {"name": "sent", "ph": "C", "pid": 1, "tid": 0, "ts": 30.0, "args": {"bytes_intra": 8}},
]}


def test_a_sound_trace_has_no_problem_and_one_bound_arrow():
    assert problems(SOUND) == []
    assert unbound_flows(SOUND["traceEvents"]) == []
    pairs, odd = flow_pairs(SOUND["traceEvents"])
    assert odd == [] and list(pairs) == ["0x00ff"]


@pytest.mark.parametrize("k, change, found", [
    (2, {"ph": "Q"}, "'ph' 'Q' is no phase"),
    (2, {"dur": -1}, "without a 'dur' >= 0"),
    (2, {"ts": float("nan")}, "no finite number 'ts'"),
    (2, {"pid": "0"}, "no int 'pid'"),
    (3, {"id": None}, "without an 'id'"),
    (3, {"id": "m 1 0 201 1"}, "no hex number"),
    (3, {"cat": None}, "without a string 'cat'"),
    (5, {"bp": "s"}, "binding point"),
    (0, {"name": "process_nom"}, "that no viewer knows"),
    (1, {"args": {"sort_index": "0"}}, "without args.sort_index"),
    (6, {"s": "x"}, "scope"),
    (7, {"args": {"bytes_intra": "8"}}, "'args' are not numbers"),
])
def test_each_break_of_the_format_is_named(k, change, found):
    broken = copy.deepcopy(SOUND)
    broken["traceEvents"][k].update(change)
    said = problems(broken)
    assert len(said) == 1 and said[0].startswith(f"event {k}: ") and found in said[0]


def test_a_flow_outside_every_slice_and_an_unpaired_end_are_found():
    events = copy.deepcopy(SOUND["traceEvents"])
    events[5]["ts"] = 25.0  # after the receiver's wait slice ended
    assert unbound_flows(events) == [events[5]]
    events.append(dict(events[5], pid=0, ts=12.5))  # a second end of the same arrow
    _, odd = flow_pairs(events)
    assert odd == ["0x00ff: 1 start(s), 2 end(s)"]
    assert problems([]) == ["the top level is not an object with a 'traceEvents' array"]
