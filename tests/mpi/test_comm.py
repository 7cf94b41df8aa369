"""SPMD: topology numbers, shared windows, and every allreduce algorithm against MPI's."""

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import (
    ALLREDUCE_ALGORITHMS,
    SharedArray,
    Topology,
    allreduce,
    iallreduce,
    shared_buffer,
)

world = MPI.COMM_WORLD
LAYOUTS = [None, 1, 2, 3, 4]  # real nodes, then virtual nodes of k ranks
_topologies = {}


def topology(ranks_per_node):
    if ranks_per_node not in _topologies:
        _topologies[ranks_per_node] = Topology(ranks_per_node=ranks_per_node)
    return _topologies[ranks_per_node]


def valid_layouts():
    return [k for k in LAYOUTS if k is None or world.size % k == 0]


@pytest.mark.parametrize("ranks_per_node", LAYOUTS)
def test_topology_numbers(ranks_per_node):
    if ranks_per_node is not None and world.size % ranks_per_node:
        with pytest.raises(ValueError, match=f"rank {world.rank}: ranks_per_node "
                                             f"{ranks_per_node} must be a positive divisor"):
            Topology(ranks_per_node=ranks_per_node)
        return
    t = topology(ranks_per_node)
    g = world.size if ranks_per_node is None else ranks_per_node  # one machine: one real node
    assert (t.local_rank, t.local_size, t.node_id) == (world.rank % g, g, world.rank // g)
    assert t.num_nodes == world.size // g and t.cross.Get_size() == t.num_nodes
    assert set(t.cross.allgather(t.local_rank)) == {t.local_rank}  # a rail: one local rank
    assert sorted(t.node.allgather(world.rank)) == list(range(t.node_id * g, t.node_id * g + g))
    assert (t.leaders is not None) == (t.local_rank == 0)


def test_shared_array_segments_are_seen_by_peers():
    t = topology(None)
    shared = SharedArray(t.node, 5, np.float64)
    shared.segment[...] = t.local_rank + 1
    shared.sync()
    np.testing.assert_array_equal(shared.whole[:, 0], np.arange(1, t.local_size + 1))
    shared.sync()
    shared.free()
    with pytest.raises(RuntimeError, match="used after free"):
        shared.segment


def integer_valued(n, dtype):
    return ((np.arange(n) * (world.rank + 3)) % 97).astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_every_algorithm_equals_mpi(algorithm, n, dtype):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        exact = integer_valued(n, dtype)
        expected = exact.copy()
        world.Allreduce(MPI.IN_PLACE, expected)
        np.testing.assert_array_equal(allreduce(exact, t, algorithm), expected)

        noisy = np.random.default_rng(world.rank).standard_normal(n).astype(dtype)
        reference = noisy.copy()
        world.Allreduce(MPI.IN_PLACE, reference)
        allreduce(noisy, t, algorithm, op="mean")
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(noisy, reference / world.size, rtol=tol, atol=tol)
        # every rank holds the very same bits
        assert len({r.tobytes() for r in world.allgather(noisy)}) == 1


@pytest.mark.parametrize("algorithm", ["mpi", "hierarchical"])
def test_nonblocking_forms(algorithm):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        buf = integer_valued(1001, np.float64)
        expected = buf.copy()
        world.Allreduce(MPI.IN_PLACE, expected)
        request = iallreduce(buf, t, algorithm)
        while not request.test():
            pass
        request.wait()
        np.testing.assert_array_equal(buf, expected)


def test_zero_copy_when_the_buffer_is_the_shared_segment():
    t = topology(None)
    buf = shared_buffer(t, 64, np.float32)
    buf[...] = world.rank
    allreduce(buf, t, "hierarchical")
    np.testing.assert_array_equal(buf, sum(range(world.size)))
    assert buf.ctypes.data == shared_buffer(t, 64, np.float32).ctypes.data


def test_bad_arguments_and_non_finite_results():
    t = topology(None)
    with pytest.raises(ValueError, match=f"rank {world.rank}: allreduce algorithm 'tree'"):
        allreduce(np.zeros(3), t, "tree")
    with pytest.raises(ValueError, match="allreduce op 'max'"):
        allreduce(np.zeros(3), t, "mpi", op="max")
    with pytest.raises(TypeError, match=r"contiguous 1-D float NumPy array, got ndarray \(2, 2\)"):
        allreduce(np.zeros((2, 2)), t, "mpi")
    buf = np.zeros(4)
    if world.rank == 0:
        buf[2] = np.nan
    with pytest.raises(FloatingPointError, match=f"rank {world.rank}: allreduce result is not "
                                                 "finite \\(first at element 2"):
        allreduce(buf, t, "ring", check_finite=True)
