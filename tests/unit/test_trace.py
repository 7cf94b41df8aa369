"""Phase timers, counters and the Chrome-trace export."""

import json
import time

from minidp.trace import Tracer, chrome_trace


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
