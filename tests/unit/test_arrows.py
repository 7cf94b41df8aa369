"""The arrows' ids: both ends of a message or a collective find the same id, no other."""

import pytest

from minidp.comm.arrows import Arrows, Group, flow_id
from minidp.trace import Tracer, set_tracer, tracer


@pytest.fixture(autouse=True)
def own_tracer():
    before = tracer()
    yield
    set_tracer(before)


def flows(events, ph):
    return [e for e in events if e["ph"] == ph]


def on(rank, act):
    """The flow events rank ``rank``'s own tracer records while ``act()`` runs."""
    t = set_tracer(Tracer(rank))
    act()
    return t.events


def test_an_id_is_a_64_bit_hex_number_of_what_names_the_message():
    a = flow_id("m", 1, 0, 201, 1)
    assert a == flow_id("m", 1, 0, 201, 1)
    assert a.startswith("0x") and len(a) == 18 and int(a, 16) < 2 ** 64
    assert len({flow_id("m", s, d, t, k) for s in range(3) for d in range(3)
                for t in (201, 202) for k in range(1, 4)}) == 3 * 3 * 2 * 3


def test_each_receive_pairs_with_the_send_of_the_same_sender_tag_and_count():
    sender, receiver = Arrows(1, {}), Arrows(0, {})
    sent = on(1, lambda: [sender.message_sent(0, tag, what, n) for tag, what, n in
                          [(201, "pull", 32), (204, "gradient", 800), (201, "pull", 32),
                           (201, "pull", 32)]])
    # The receiver takes the tags in another order than they were sent (wildcards);
    # per tag the order is the sender's (MPI's non-overtaking rule).
    got = on(0, lambda: [receiver.message_received(1, tag) for tag in (204, 201, 201, 201)])
    starts = flows(sent, "s")
    ends = flows(got, "f")
    assert len(starts) == len(ends) == 4
    assert {e["id"] for e in starts} == {e["id"] for e in ends}
    assert len({e["id"] for e in starts}) == 4
    # the gradient's end is the receiver's first, and its start is the sender's second
    assert ends[0]["id"] == starts[1]["id"] and starts[1]["args"] == {"what": "gradient",
                                                                      "bytes": 800}
    # a message from another sender (or to another receiver) is another arrow
    other = on(0, lambda: Arrows(0, {}).message_received(2, 201))
    assert flows(other, "f")[0]["id"] not in {e["id"] for e in starts}


def twice(arrows, *args, **kwargs):
    """Two collectives of one group on one rank, each a ``with`` block."""
    for _ in range(2):
        with arrows.collective(*args, **kwargs):
            pass


def test_a_reduction_draws_one_arrow_per_member_into_the_roots_slice():
    members = [2, 3, 5]
    per_rank = {r: on(r, lambda r=r: twice(Arrows(r, {"node": Group("node 1", members)}),
                                           "node", "node sum", 64))
                for r in members}
    assert flows(per_rank[2], "s") == []  # the root draws only the ends
    ends = flows(per_rank[2], "f")
    starts = flows(per_rank[3], "s") + flows(per_rank[5], "s")
    assert len(ends) == len(starts) == 4  # two collectives, two arrows each
    assert sorted(e["id"] for e in ends) == sorted(e["id"] for e in starts)
    assert all(e["args"] == {"what": "node sum", "bytes": 64, "group": "node 1"}
               for e in starts)
    assert flows(per_rank[3], "f") == flows(per_rank[5], "f") == []


def test_a_broadcast_draws_arrows_out_of_its_root_and_a_lone_rank_none():
    members = [0, 1, 2]
    per_rank = {r: on(r, lambda r=r: twice(Arrows(r, {"world": Group("world", members)}),
                                           "world", "parameters", 100, source=1))
                for r in members}
    starts = flows(per_rank[1], "s")
    ends = flows(per_rank[0], "f") + flows(per_rank[2], "f")
    assert len(starts) == 4 and sorted(e["id"] for e in starts) == sorted(e["id"] for e in ends)
    assert flows(per_rank[1], "f") == []
    alone = on(0, lambda: twice(Arrows(0, {"node": Group("node 0", [0])}), "node", "x", 1))
    assert alone == []
    unknown = on(0, lambda: twice(Arrows(0, {}), "rail", "x", 1))  # a server: no rail
    assert unknown == []


def test_the_root_draws_its_ends_as_it_leaves_and_a_failed_collective_none():
    t = set_tracer(Tracer(0))
    arrows = Arrows(0, {"node": Group("node 0", [0, 1])})
    with arrows.collective("node", "node sum", 8):
        assert t.events == []  # the root has nothing before the parts are in
    assert [e["ph"] for e in t.events] == ["f"]
    with pytest.raises(RuntimeError), arrows.collective("node", "node sum", 8):
        raise RuntimeError("a peer was lost")
    assert len(t.events) == 1


def test_nothing_is_drawn_while_events_are_off_but_counting_goes_on():
    arrows = Arrows(1, {})
    set_tracer(Tracer(1, record_events=False))
    arrows.message_sent(0, 7, "x", 8)
    assert tracer().events == [] and arrows.sent == {(0, 7): 1}
    recording = set_tracer(Tracer(1))
    arrows.message_sent(0, 7, "x", 8)  # the second message: its id says k = 2
    assert recording.events[0]["id"] == flow_id("m", 1, 0, 7, 2)
