"""SPMD: point-to-point messages: values, first come first served, refusals, accounting, timeouts.

Every rank sends to its right neighbour and receives from its left one, so each rank can
check what it got (``arange(n) + left``). Communication finishes before any assertion,
so a failed check never leaves a peer waiting.
"""

import os
import re
import time

import numpy as np
import pytest
from mpi4py import MPI

from minidp import threads
from minidp.comm import Topology, guard, p2p
from minidp.comm.network import NetworkModel, set_network_model
from minidp.trace import Tracer, set_tracer

world = MPI.COMM_WORLD
rank, size = world.rank, world.size
right, left = (rank + 1) % size, (rank - 1) % size
needs_peer = pytest.mark.skipif(size < 2, reason="a point-to-point message needs two ranks")
LATENCY = NetworkModel(latency_us=2000)


@pytest.fixture(scope="module")
def topology():
    return Topology()


@pytest.fixture(autouse=True)
def fresh_tracer_and_free_network():
    tracer = set_tracer(Tracer(rank))
    yield tracer
    set_network_model(NetworkModel())
    set_tracer(Tracer(rank))


def ring_exchange(out, into, topology, tag):
    """Blocking sends around the ring without deadlock: even ranks send first."""
    if rank % 2 == 0:
        start = time.perf_counter()
        p2p.send(out, right, tag, topology, "ring")
        seconds = time.perf_counter() - start
        message = p2p.recv(into, left, tag, topology, "ring")
    else:
        message = p2p.recv(into, left, tag, topology, "ring")
        start = time.perf_counter()
        p2p.send(out, right, tag, topology, "ring")
        seconds = time.perf_counter() - start
    return message, seconds


@needs_peer
@pytest.mark.parametrize("n", [0, 7, 200_000])  # empty, eager and rendezvous sizes
def test_blocking_ring_delivers_the_left_neighbours_values(topology, n):
    got = np.full(n + 3, -1.0)
    message, _ = ring_exchange(np.arange(n, dtype=np.float64) + rank, got, topology, 11)
    assert message == p2p.Message(left, 11, 8 * n)
    np.testing.assert_array_equal(got[:n], np.arange(n) + left)
    np.testing.assert_array_equal(got[n:], -1)  # a shorter message leaves the rest alone


@needs_peer
def test_isend_and_irecv_overlap_computation(topology):
    n = 100_000
    got = np.zeros(n, np.float32)
    incoming = p2p.irecv(got, left, 12, topology, "ring")
    world.Barrier()  # every receive is posted before any message leaves
    outgoing = p2p.isend(np.arange(n, dtype=np.float32) + rank, right, 12, topology, "ring")
    work = np.eye(64)
    for _ in range(20):
        work = work @ work  # computation while the message is in flight
        incoming.test()
        outgoing.test()
    received, sent = incoming.wait(), outgoing.wait()
    assert received == p2p.Message(left, 12, 4 * n) == incoming.wait()  # wait() is idempotent
    assert sent == p2p.Message(rank, 12, 4 * n)
    assert incoming.test() and outgoing.test()
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32) + left)
    np.testing.assert_array_equal(work, np.eye(64))


@needs_peer
def test_a_server_serves_first_come_first_served():
    topology = Topology(servers=1)
    k = 3  # worker w sends k messages, message j holding w + j + 1 copies of w
    tags, total, leftover = {}, 0.0, None
    if topology.role == "server":
        for _ in range(k * topology.num_workers):
            message = p2p.probe(topology, what="serve", peers=topology.worker_ranks)
            payload = np.empty(message.nbytes // 8)
            received = p2p.recv(payload, message.source, message.tag, topology, "payload")
            tags.setdefault(message.source, []).append((message.tag, received == message))
            total += payload.sum()
        leftover = p2p.poll(topology)  # every worker now waits for its receipt: nothing more
        for w in topology.worker_ranks:
            p2p.send(np.array([len(tags[w])], np.int64), w, 99, topology, "receipt")
    else:
        for j in range(k):
            p2p.send(np.full(rank + j + 1, float(rank)), 0, j, topology, "payload")
        receipt = np.zeros(1, np.int64)
        p2p.recv(receipt, 0, 99, topology, "receipt")
    topology.free()
    if topology.role == "server":
        assert tags == {w: [(j, True) for j in range(k)] for w in topology.worker_ranks}
        assert total == sum(w * (w + j + 1) for w in topology.worker_ranks for j in range(k))
        assert leftover is None
    else:
        assert receipt[0] == k


@needs_peer
def test_poll_and_probe_see_a_message_without_receiving_it(topology):
    world.Barrier()
    before = p2p.poll(topology, left, 14)
    world.Barrier()
    sending = p2p.isend(np.arange(6.0) + rank, right, 14, topology, "six")
    probed = p2p.probe(topology, left, 14, "six")
    still_there = p2p.poll(topology, p2p.ANY_SOURCE, 14)
    got = np.zeros(6)
    received = p2p.recv(got, left, 14, topology, "six")
    sending.wait()
    assert before is None
    assert probed == still_there == received == p2p.Message(left, 14, 48)
    np.testing.assert_array_equal(got, np.arange(6.0) + left)


@needs_peer
def test_a_message_larger_than_the_buffer_is_refused_and_left_for_a_larger_one(topology):
    sending = p2p.isend(np.arange(10.0) + rank, right, 13, topology, "ten")
    small = np.zeros(5)
    with pytest.raises(ValueError, match=rf"^rank {rank}: recv five from rank {left}: the "
                       rf"message from rank {left} with tag 13 has 80 bytes, more than the "
                       r"buffer's 40 \(buffer of shape \(5,\) float64\); it was left unreceived"):
        p2p.recv(small, left, 13, topology, "five")
    big = np.zeros(10)
    received = p2p.recv(big, left, 13, topology, "ten")
    sending.wait()
    np.testing.assert_array_equal(small, 0)  # refused before anything was written
    assert received == p2p.Message(left, 13, 80)
    np.testing.assert_array_equal(big, np.arange(10.0) + left)


@needs_peer
def test_a_posted_receive_reports_truncation_and_a_dtype_mismatch(topology):
    small = p2p.irecv(np.zeros(5), left, 16, topology, "five")
    odd = p2p.irecv(np.zeros(4, np.float32), left, 17, topology, "floats")
    first = p2p.isend(np.arange(10.0), right, 16, topology, "ten")
    second = p2p.isend(np.arange(5, dtype=np.int8), right, 17, topology, "five bytes")
    errors = []
    for request in (small, odd, small):
        with pytest.raises(ValueError) as refused:
            request.wait()
        errors.append(str(refused.value))
    first.wait()
    second.wait()
    assert errors[0].startswith(f"rank {rank}: recv five from rank {left}: the message from "
                                f"rank {left} with tag 16 is larger than the buffer (40 bytes")
    assert errors[1] == (f"rank {rank}: recv floats from rank {left}: the message from rank "
                         f"{left} with tag 17 has 5 bytes, not a whole number of float32 "
                         "elements")
    assert errors[2] == errors[0]  # a refused request stays refused


def test_bad_arguments_are_refused_naming_the_value(topology):
    buf = np.zeros(4)
    others = f"allowed: a rank in \\[0, {size}\\) other than {rank}"
    cases = [
        (ValueError, rf"^rank {rank}: dest: got {size}, {others}$",
         lambda: p2p.send(buf, size, 0, topology, "x")),
        (ValueError, rf"^rank {rank}: dest: got {rank}, {others}$",
         lambda: p2p.isend(buf, rank, 0, topology, "x")),
        (ValueError, rf"^rank {rank}: source: got -7, {others}, or ANY_SOURCE$",
         lambda: p2p.recv(buf, -7, 0, topology, "x")),
        (ValueError, rf"^rank {rank}: tag: got -1, allowed: an int in \[0, {p2p.TAG_UB}\]$",
         lambda: p2p.send(buf, right, p2p.ANY_TAG, topology, "x")),
        (ValueError, rf"^rank {rank}: tag: got {p2p.TAG_UB + 1}, allowed: an int in "
                     rf"\[0, {p2p.TAG_UB}\], or ANY_TAG$",
         lambda: p2p.irecv(buf, p2p.ANY_SOURCE, p2p.TAG_UB + 1, topology, "x")),
        (ValueError, rf"^rank {rank}: tag: got True,", lambda: p2p.poll(topology, tag=True)),
        (ValueError, rf"^rank {rank}: peers: got {rank}, {others}$",
         lambda: p2p.probe(topology, peers=[rank])),
        (ValueError, rf"^rank {rank}: peers: got \[\], allowed: a non-empty list",
         lambda: p2p.probe(topology, peers=[])),
        (TypeError, rf"^rank {rank}: buffer: got a list, allowed: a C-contiguous NumPy array",
         lambda: p2p.send([1.0, 2.0], right, 0, topology, "x")),
        (TypeError, rf"^rank {rank}: buffer: got a non-contiguous array of shape \(2,\) "
                    "float64, allowed",
         lambda: p2p.isend(buf[::2], right, 0, topology, "x")),
        (TypeError, rf"^rank {rank}: buffer: got a read-only array of shape \(4,\) float64, "
                    "allowed: a writable C-contiguous",
         lambda: p2p.recv(np.broadcast_to(buf, (4,)), p2p.ANY_SOURCE, 0, topology, "x")),
    ]
    if size == 1:
        cases.append((ValueError, r"^rank 0: source: got ANY_SOURCE in a world of 1 rank",
                      lambda: p2p.probe(topology)))
    for kind, pattern, call in cases:
        with pytest.raises(kind, match=pattern):
            call()
    if size == 1:
        assert p2p.poll(topology) is None  # nothing can be there: no other rank exists


@needs_peer
@pytest.mark.parametrize("blocking", [True, False])
def test_a_send_to_another_node_is_counted_inter_and_charged(fresh_tracer_and_free_network,
                                                              blocking):
    tracer = fresh_tracer_and_free_network
    set_network_model(LATENCY)
    topology = Topology(ranks_per_node=1)  # every rank its own node
    out, got = np.arange(512.0) + rank, np.zeros(512)
    world.Barrier()
    if blocking:
        message, seconds = ring_exchange(out, got, topology, 18)
    else:
        start = time.perf_counter()
        sending = p2p.isend(out, right, 18, topology, "ring")
        message = p2p.recv(got, left, 18, topology, "ring")
        sending.wait()
        seconds = time.perf_counter() - start
    topology.free()
    assert message == p2p.Message(left, 18, 4096)
    np.testing.assert_array_equal(got, np.arange(512.0) + left)
    # only this rank's own send is counted: receiving is not sending
    assert tracer.counters["bytes_inter"] == 4096 and tracer.counters["messages_inter"] == 1
    assert tracer.counters["bytes_intra"] == 0 and tracer.counters["messages_intra"] == 0
    assert seconds >= LATENCY.seconds(1, 4096) == 0.002
    if blocking:
        assert tracer.seconds["comm_inter"] >= 0.002


@needs_peer
def test_a_send_on_the_same_node_is_counted_intra_and_not_charged(fresh_tracer_and_free_network):
    tracer = fresh_tracer_and_free_network
    set_network_model(NetworkModel(latency_us=500_000))  # 0.5 s per message, if charged
    topology = Topology(ranks_per_node=size)  # one node
    got = np.zeros(512)
    message, _ = ring_exchange(np.arange(512.0) + rank, got, topology, 19)
    topology.free()
    assert message == p2p.Message(left, 19, 4096)
    assert tracer.counters["bytes_intra"] == 4096 and tracer.counters["messages_intra"] == 1
    assert tracer.counters["bytes_inter"] == 0 and tracer.seconds["comm_inter"] == 0
    assert tracer.counters["charged_ns"] == 0  # the model charged nothing (0.5 s if it had)


@pytest.mark.skipif(size % 2 == 1, reason="virtual nodes of 2 ranks need an even world")
def test_a_server_counts_each_message_at_its_workers_level(fresh_tracer_and_free_network):
    tracer = fresh_tracer_and_free_network
    topology = Topology(ranks_per_node=2, servers=1)  # node 0: server 0 and worker 1
    got = np.zeros(1)
    if topology.role == "server":
        for w in topology.worker_ranks:
            p2p.send(np.array([float(w)]), w, 20, topology, "parameters")
    else:
        p2p.recv(got, 0, 20, topology, "parameters")
    levels = {w: topology.level(w) for w in topology.worker_ranks}
    topology.free()
    if topology.role == "server":
        inter = [w for w in topology.worker_ranks if w >= 2]  # nodes {0, 1}, {2, 3}
        assert levels == {w: "inter" if w in inter else "intra" for w in topology.worker_ranks}
        assert tracer.counters["bytes_intra"] == 8 and tracer.counters["messages_intra"] == 1
        assert tracer.counters["bytes_inter"] == 8 * len(inter)
        assert tracer.counters["messages_inter"] == len(inter)
    else:
        assert got[0] == rank and tracer.counters["bytes_intra"] == 0


@pytest.fixture
def short_timeout_on_rank_0():
    # Only rank 0 waits in vain; the others must outwait its two timeouts at a barrier.
    if rank == 0:
        guard.set_timeout(1.0)
    yield
    guard.set_timeout(float(os.environ.get("MINIDP_COMM_TIMEOUT", "300")))


@needs_peer
def test_a_receive_from_a_silent_rank_times_out_naming_it(topology, short_timeout_on_rank_0):
    errors, got = [], np.zeros(3)
    if rank == 0:
        with pytest.raises(guard.CommTimeout) as blocking:
            p2p.recv(got, 1, 15, topology, "never sent")
        posted = p2p.irecv(got, 1, 15, topology, "never sent either")
        for _ in range(2):  # the cancelled request stays failed
            with pytest.raises(guard.CommTimeout) as nonblocking:
                posted.wait()
            errors.append(str(nonblocking.value))
        errors.insert(0, str(blocking.value))
    guard.barrier(world, "after the timeout test")
    # The cancelled receive swallowed nothing: a message sent now reaches a new receive.
    if rank == 1:
        p2p.send(np.array([1.0, 2.0, 3.0]), 0, 15, topology, "late")
    late = p2p.recv(got, 1, 15, topology, "late") if rank == 0 else None
    guard.barrier(world, "after the late message")
    if rank == 0:
        board = r"rank 1: (waiting|last) in '[^']+' #\d+, [\d.]+ s ago"
        assert errors[0].startswith("rank 0: 'recv never sent from rank 1' waited 1 s "
                                    "(MINIDP_COMM_TIMEOUT); ")
        assert re.search(board, errors[0])
        assert errors[1].startswith("rank 0: 'recv never sent either from rank 1' waited 1 s")
        assert re.search(board, errors[1]) and errors[2] == errors[1]
        assert late == p2p.Message(1, 15, 24)
        np.testing.assert_array_equal(got, [1.0, 2.0, 3.0])


def test_a_wait_naps_when_the_machines_ranks_outnumber_its_cores(topology):
    machine = world.Split_type(MPI.COMM_TYPE_SHARED)
    crowded = machine.Get_size() * threads.threads_per_rank() > threads.available_cores()
    machine.Free()
    assert guard._settings.get("nap", 0.0) == (guard.NAP_S if crowded else 0.0)
    try:
        guard.set_oversubscribed(True)
        until = time.monotonic() + 0.3
        cpu = time.process_time()
        guard._waiting(lambda: time.monotonic() > until, "nap test", rank,
                       lambda board, count: [])
        # Sleeping between polls: a small part of the wait on the CPU (spinning: all of it,
        # less only what the scheduler gave to others).
        assert time.process_time() - cpu < 0.1
    finally:
        guard.set_oversubscribed(crowded)
