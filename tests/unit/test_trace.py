"""Phase timers, counters and the Chrome-trace export."""

import json
import time

from minidp.trace import ORIGIN_READS, Tracer, chrome_trace, clock_origin


def test_phases_sum_and_events_stop_at_the_cap():
    t = Tracer(rank=3, max_events=2)
    for _ in range(4):
        with t.phase("forward", batch=1):
            time.sleep(0.001)
    assert t.seconds["forward"] >= 0.004
    assert len(t.events) == 2 and t.events[0]["pid"] == 3 and t.events[0]["dur"] >= 1000
    t.count("bytes_inter", 10)
    t.count("bytes_inter", 5)
    t.reset()
    assert t.counters == {} and t.seconds == {} and len(t.events) == 2


def test_chrome_trace_merges_ranks_with_process_names():
    a, b = Tracer(rank=0), Tracer(rank=1)
    with a.phase("data"):
        pass
    with b.phase("wait"):
        pass
    trace = json.loads(json.dumps(chrome_trace([a.events, b.events])))
    names = {(e["pid"], e["name"]) for e in trace["traceEvents"]}
    assert {(0, "data"), (1, "wait"), (0, "process_name"), (1, "process_name")} <= names


def test_ranks_started_apart_share_one_clock():
    # Two ranks' tracers start 50 ms apart; an event on the later one right after an
    # event on the earlier one must not be stamped before it (the arrows between them
    # run forwards in time). Stamps relative to each tracer's own start would put the
    # later tracer's event about 50 ms earlier. Both stamps must also lie between two
    # reads of the Unix clock taken around them (within 100 us, generously: each tracer's
    # origin is read to well under a microsecond, and a double holds today's Unix time in
    # microseconds to a quarter of one).
    early = Tracer(rank=0)
    time.sleep(0.05)
    late = Tracer(rank=1)
    before = time.time() * 1e6
    early.mark("sent")
    late.mark("received")
    after = time.time() * 1e6
    sent, received = early.events[-1]["ts"], late.events[-1]["ts"]
    assert sent <= received
    assert before - 100 <= sent and received <= after + 100


class ScriptedClocks:
    """perf_counter and time as one scripted clock: 100 s on perf_counter is 1.7e9 s on
    the Unix clock, and each read advances it by 0.1 us. Every bracket's Unix read (the
    second of its three reads) comes after a 1 ms pause, as when the rank loses its core
    between two reads, except the bracket ``quiet``'s (from 0; None: every one pauses)."""

    UNIX_MINUS_PERF = 1_699_999_900.0

    def __init__(self, quiet: int | None) -> None:
        self.now, self.reads, self.quiet = 100.0, 0, quiet

    def perf_counter(self) -> float:
        bracket, read = divmod(self.reads, 3)
        self.reads += 1
        self.now += 1e-3 if read == 1 and bracket != self.quiet else 1e-7
        return self.now

    def time(self) -> float:
        return self.perf_counter() + self.UNIX_MINUS_PERF


def test_a_pause_between_the_two_clock_reads_does_not_shift_the_origin(monkeypatch):
    def error_us(reads, quiet):
        monkeypatch.setattr("minidp.trace.time", ScriptedClocks(quiet))
        origin, unix_us = clock_origin(reads)
        return unix_us - (origin + ScriptedClocks.UNIX_MINUS_PERF) * 1e6

    # An interrupted bracket: its stamps would be half the pause late.
    assert 400 < error_us(1, None) < 600
    assert 400 < error_us(ORIGIN_READS, None) < 600  # every bracket interrupted alike
    # The one bracket of the eight that nothing interrupted, wherever it comes, is kept:
    # off by at most half its width, 0.1 us (and the rounding of a double's microseconds
    # since 1970, a quarter of one).
    for quiet in (0, 3, ORIGIN_READS - 1):
        assert abs(error_us(ORIGIN_READS, quiet)) <= 0.5


def test_a_flow_has_its_two_ends_bound_to_their_slices():
    t = Tracer(rank=2)
    with t.phase("comm_inter", op="send"):
        t.flow("s", "0x1", "p2p", what="parameters", bytes=8)
    with t.phase("wait", op="recv"):
        t.flow("f", "0x2", "p2p")
    start, end = t.events[0], t.events[2]  # each recorded before its slice, which ends later
    assert start["ph"] == "s" and start["id"] == "0x1" and start["cat"] == start["name"] == "p2p"
    assert start["args"] == {"what": "parameters", "bytes": 8} and "bp" not in start
    assert end["ph"] == "f" and end["bp"] == "e" and end["id"] == "0x2" and "args" not in end
    # each end lies inside the slice recorded around it
    for flow, piece in ((start, t.events[1]), (end, t.events[3])):
        assert piece["ph"] == "X"
        assert piece["ts"] <= flow["ts"] <= piece["ts"] + piece["dur"]


def test_steps_and_decisions_are_marked_for_the_first_steps_only():
    t = Tracer(rank=1)
    t.detail_steps = 3
    detailed = []
    for step in range(1, 7):
        t.begin_step(step)
        detailed.append(t.detailed)
    assert [e["args"]["step"] for e in t.events if e["name"] == "step"] == [1, 2, 3]
    assert detailed == [True, True, True, False, False, False]
    off = Tracer(rank=1, record_events=False)
    off.begin_step(1)
    off.flow("s", "0x1", "p2p")
    assert off.events == [] and off.finish() == []


def test_finish_names_the_lane_first_and_ends_with_the_runs_counters():
    t = Tracer(rank=3, lane=("node 1 / rank 3", 7))
    t.count("bytes_inter", 10)
    t.reset()  # an epoch's end: the run's totals go on
    t.count("bytes_inter", 5)
    t.count("messages_p2p")
    with t.phase("forward"):
        pass
    events = t.finish()
    assert events[0] == {"name": "process_name", "ph": "M", "pid": 3,
                         "args": {"name": "node 1 / rank 3"}}
    assert events[1] == {"name": "process_sort_index", "ph": "M", "pid": 3,
                         "args": {"sort_index": 7}}
    assert events[2]["name"] == "forward"
    assert events[-1]["ph"] == "C" and events[-1]["name"] == "sent"
    assert events[-1]["args"] == {"bytes_inter": 15, "messages_p2p": 1}
    assert t.counters == {"bytes_inter": 5, "messages_p2p": 1}
    # merged: a rank that names no lane (no events) is "rank R"
    trace = chrome_trace([[], Tracer(rank=1, lane=("node 0 / rank 1", 1)).finish()])
    names = sorted((e["pid"], e["args"]["name"]) for e in trace["traceEvents"]
                   if e["name"] == "process_name")
    assert names == [(0, "rank 0"), (1, "node 0 / rank 1")]
