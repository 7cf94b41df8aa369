"""SPMD: the network model charges inter-node operations what it says, intra-node ones nothing."""

import time

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import Topology, allreduce
from minidp.comm.network import NetworkModel, ring_traffic, set_network_model
from minidp.trace import Tracer, set_tracer

world = MPI.COMM_WORLD
MODEL = NetworkModel(latency_us=3000, bandwidth_gbps=0.2)
N = 50_000  # float32: 200 kB


@pytest.fixture(autouse=True)
def model():
    set_network_model(MODEL)
    yield
    set_network_model(NetworkModel())


def timed(buf, topology, algorithm):
    tracer = set_tracer(Tracer(world.rank))
    world.Barrier()
    start = time.perf_counter()
    allreduce(buf, topology, algorithm)
    return time.perf_counter() - start, tracer


@pytest.mark.skipif(world.size < 2, reason="an inter-node operation needs two nodes")
@pytest.mark.parametrize("algorithm", ["mpi", "ring", "hierarchical"])
def test_inter_node_allreduce_takes_at_least_the_modelled_time(algorithm):
    topology = Topology(ranks_per_node=1)  # every rank its own node
    buf = np.ones(N, np.float32)
    seconds, tracer = timed(buf, topology, algorithm)
    messages, nbytes = ring_traffic(world.size, buf.nbytes)
    assert seconds >= MODEL.seconds(messages, nbytes)
    assert tracer.counters["bytes_inter"] == int(nbytes)
    assert tracer.counters["messages_inter"] == messages
    assert tracer.seconds["comm_inter"] >= MODEL.seconds(messages, nbytes)
    # the charges add up to the model's time of the whole ring, to the nanosecond per step
    assert abs(tracer.counters["charged_ns"] - MODEL.seconds(messages, nbytes) * 1e9) \
        <= messages
    assert tracer.counters["bytes_intra"] == 0  # alone on its node: nothing shared
    np.testing.assert_array_equal(buf, world.size)


@pytest.mark.parametrize("ranks_per_node", [1, 2, world.size])
def test_mpis_allreduce_is_counted_by_nodes_where_they_decide_it(ranks_per_node):
    """One node: intra; a rank per node: inter; nodes of several ranks: MPI's own counter."""
    if world.size % ranks_per_node:
        pytest.skip(f"{ranks_per_node} ranks per node do not divide {world.size} ranks")
    topology = Topology(ranks_per_node=ranks_per_node)
    buf = np.ones(N, np.float32)
    _, tracer = timed(buf, topology, "mpi")
    nodes = world.size // ranks_per_node
    where = "intra" if nodes == 1 else "inter" if ranks_per_node == 1 else "mpi"
    # MPI's allreduce is charged as a ring: 2(N-1) messages of 1/N of the buffer each
    sent = {"bytes": 2 * (world.size - 1) * buf.nbytes // world.size,
            "messages": 2 * (world.size - 1)}
    for counter in ("intra", "inter", "mpi"):
        for kind in ("bytes", "messages"):
            expected = sent[kind] if counter == where else 0
            assert tracer.counters[f"{kind}_{counter}"] == expected, (counter, kind)
    np.testing.assert_array_equal(buf, world.size)


@pytest.mark.skipif(world.size < 4, reason="needs 2 nodes of 2")
def test_hierarchical_charges_only_the_rails_slice():
    topology = Topology(ranks_per_node=2)
    buf = np.ones(N, np.float32)
    seconds, tracer = timed(buf, topology, "hierarchical")
    messages, nbytes = ring_traffic(topology.num_nodes, buf.nbytes // 2)
    assert tracer.counters["bytes_inter"] == int(nbytes) and messages == 2
    assert seconds >= MODEL.seconds(messages, nbytes)
    assert abs(tracer.counters["charged_ns"] - MODEL.seconds(messages, nbytes) * 1e9) \
        <= messages


@pytest.mark.parametrize("algorithm", ["mpi", "hierarchical"])
def test_intra_node_operations_are_not_charged(algorithm):
    topology = Topology(ranks_per_node=world.size)  # one node
    buf = np.ones(N, np.float32)
    _, tracer = timed(buf, topology, algorithm)
    assert tracer.counters["bytes_inter"] == 0 and tracer.seconds["comm_inter"] == 0
    # what the model charged, not how long a loaded machine took: nothing at all
    assert tracer.counters["charged_ns"] == 0
    assert tracer.counters["bytes_intra"] > 0 or world.size == 1
    np.testing.assert_array_equal(buf, world.size)


def test_model_arguments_are_checked():
    with pytest.raises(ValueError, match="--net-latency-us: got -1"):
        NetworkModel(latency_us=-1)
