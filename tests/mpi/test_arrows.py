"""SPMD: both ends of every arrow, across real ranks, for every allreduce and for messages.

Each rank records its own trace; the events are gathered (after the communication, so a
failed check leaves nobody waiting) and checked as ``trace.json`` would hold them:
every arrow has exactly one start and one end, on the ranks that sent and received,
each inside a slice of its rank (a viewer binds it there), the end no earlier than the
start; and recording the arrows changes no result's bits (tracing off gives the same).
Run at 1 to 4 ranks, as virtual nodes of 1 and 2 ranks.
"""

from collections import Counter

import numpy as np
import pytest
from chrome_trace import flow_pairs, problems, unbound_flows
from mpi4py import MPI

from minidp.comm import ALLREDUCE_ALGORITHMS, Topology, allreduce, iallreduce, p2p
from minidp.comm.levels import broadcast, node_allreduce, rail_iallreduce
from minidp.trace import Tracer, chrome_trace, set_tracer

world = MPI.COMM_WORLD
rank, size = world.rank, world.size
_topologies = {}


def topology(ranks_per_node):
    if ranks_per_node not in _topologies:
        _topologies[ranks_per_node] = Topology(ranks_per_node=ranks_per_node)
    return _topologies[ranks_per_node]


def layouts():
    return [g for g in (1, 2) if size % g == 0]


def gathered(tracer):
    """Every rank's events, as the trace file merges them (every rank gets them all)."""
    events = chrome_trace(world.allgather(tracer.finish()))["traceEvents"]
    assert problems({"traceEvents": events}) == []
    return events


def arrows_of(events):
    assert unbound_flows(events) == []
    pairs, odd = flow_pairs(events)
    assert odd == []
    for start, end in pairs.values():
        assert start["pid"] != end["pid"] and start["ts"] <= end["ts"]
    return pairs


def values(n):
    return np.arange(n, dtype=np.float64) * (rank + 1) + 0.25


def reduce(buf, t, algorithm, form):
    """One allreduce of ``buf``: blocking, started and waited, or progressed by test()."""
    if form == "blocking":
        return allreduce(buf, t, algorithm)
    request = iallreduce(buf, t, algorithm)
    while form == "tested" and not request.test():
        pass
    return request.wait()


@pytest.mark.parametrize("ranks_per_node", [1, 2])
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("form", ["blocking", "started", "tested"])
def test_recording_the_arrows_changes_no_bit_and_off_draws_none(algorithm, form,
                                                                ranks_per_node):
    if ranks_per_node not in layouts():
        pytest.skip(f"{size} ranks do not make nodes of {ranks_per_node}")
    t = topology(ranks_per_node)
    results, drawn = [], []
    for recording in (True, False):
        tracer = set_tracer(Tracer(rank, record_events=recording))
        buf = values(1001)  # not a multiple of any world size: chunks of different lengths
        reduce(buf, t, algorithm, form)
        results.append(buf)
        drawn.append([e for e in tracer.events if e["ph"] in ("s", "f")])
    assert results[0].tobytes() == results[1].tobytes()
    assert drawn[1] == [] and (drawn[0] != []) == (size > 1)


def run_and_gather(act):
    """``act()`` on every rank with a fresh recording tracer; the merged events."""
    tracer = set_tracer(Tracer(rank))
    act()
    return gathered(tracer)


@pytest.mark.parametrize("ranks_per_node", [1, 2])
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
@pytest.mark.parametrize("form", ["blocking", "started", "tested"])
def test_the_arrows_of_an_allreduce_pair_up_across_ranks(algorithm, form, ranks_per_node):
    if ranks_per_node not in layouts():
        pytest.skip(f"{size} ranks do not make nodes of {ranks_per_node}")
    t = topology(ranks_per_node)

    def act():
        for _ in range(2):  # a second call: the counts go on
            reduce(values(1001), t, algorithm, form)

    pairs = arrows_of(run_and_gather(act))
    kinds = Counter(start["cat"] for start, _ in pairs.values())
    if size == 1:
        assert pairs == {}
    elif algorithm in ("ring", "recursive_doubling"):  # its own messages, nothing else
        assert set(kinds) == {"p2p"}
        if algorithm == "ring":  # 2(p - 1) messages from each rank, twice
            assert kinds["p2p"] == 2 * 2 * (size - 1) * size
    else:
        assert set(kinds) == {"collective"}


@pytest.mark.skipif(size < 2, reason="an arrow needs two ranks")
def test_messages_and_broadcasts_pair_up_with_wildcards_and_posted_receives():
    t = topology(1)
    right, left = (rank + 1) % size, (rank - 1) % size
    out = np.full(6, rank, np.float64)
    into = np.empty(6)

    def act():
        # three messages with two tags to the right; the left one taken in another order
        sending = [p2p.isend(out, right, 31 + (k % 2), t, f"message {k}") for k in range(3)]
        p2p.recv(into, left, 32, t, "second")  # tag 32 first: the sender's message 1
        posted = p2p.irecv(into, left, 31, t, "first")
        posted.wait()
        found = p2p.probe(t, left, 31)
        p2p.recv(into, found.source, found.tag, t, "third")
        for request in sending:
            request.wait()
        broadcast(out, t, root=size - 1, what="parameters")

    pairs = arrows_of(run_and_gather(act))
    mine = [(s["pid"], f["pid"], s["args"]["what"]) for s, f in pairs.values()
            if s["cat"] == "p2p"]
    assert sorted(mine) == sorted((r, (r + 1) % size, f"message {k}") for r in range(size)
                                  for k in range(3))
    # a message 1 (tag 32) is the receiver's first take from its left
    bcast = [(s["pid"], f["pid"]) for s, f in pairs.values() if s["cat"] == "collective"]
    assert sorted(bcast) == [(size - 1, r) for r in range(size - 1)]


@pytest.mark.skipif(size % 2, reason="two nodes of two ranks each, or more")
def test_a_started_rail_sum_ends_in_the_slice_that_waits_for_it():
    t = topology(2)

    def act():
        buf = values(64)
        request = rail_iallreduce(buf, t)
        node_allreduce(values(8), t)  # work in between, with its own arrows
        request.wait()

    events = run_and_gather(act)
    pairs = arrows_of(events)
    rails = [(s, f) for s, f in pairs.values() if s["args"]["what"] == "rail sum"]
    assert len(rails) == (t.num_nodes - 1) * 2  # each rail's members into its root
    for start, end in rails:
        assert start["pid"] % 2 == end["pid"] % 2  # the same local rank: one rail
        enclosing = [e for e in events if e["ph"] == "X" and e["pid"] == end["pid"]
                     and e["ts"] <= end["ts"] <= e["ts"] + e["dur"]]
        assert "wait" in {e["name"] for e in enclosing}
        leaving = [e for e in events if e["ph"] == "X" and e["pid"] == start["pid"]
                   and e["ts"] <= start["ts"] <= e["ts"] + e["dur"]]
        assert "post" in {e["name"] for e in leaving}
