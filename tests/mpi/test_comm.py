"""SPMD: topology numbers, shared windows, and every allreduce algorithm against MPI's.

Every algorithm, blocking and started (``iallreduce(...).wait()``, and progressed by
``test()``), must give MPI's own ``Allreduce`` result; a NodeBuffer must be reduced in
its own window (no scratch window made), a plain array through a copy.
"""

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import (
    ALLREDUCE_ALGORITHMS,
    NodeBuffer,
    SharedArray,
    Topology,
    allreduce,
    iallreduce,
    node_allreduce,
    rail_allreduce,
    rail_iallreduce,
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
        with pytest.raises(ValueError, match=f"rank {world.rank}: --ranks-per-node: got "
                                             f"{ranks_per_node} for the job's {world.size}"):
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


def reduce(buf, t, algorithm, op, form):
    """``allreduce``, or the same started and waited for, or polled with test() first."""
    if form == "blocking":
        return allreduce(buf, t, algorithm, op=op)
    request = iallreduce(buf, t, algorithm, op=op)
    if form == "polled":
        while not request.test():
            pass
    return request.wait()


@pytest.mark.parametrize("form", ["blocking", "started"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [0, 1, 7, 100_003])
@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_every_algorithm_equals_mpi(algorithm, n, dtype, form):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        exact = integer_valued(n, dtype)
        expected = exact.copy()
        world.Allreduce(MPI.IN_PLACE, expected)
        np.testing.assert_array_equal(reduce(exact.copy(), t, algorithm, "sum", form), expected)
        # integer sums are exact in any order: the mean is MPI's sum over the size, bit for bit
        np.testing.assert_array_equal(reduce(exact, t, algorithm, "mean", form),
                                      expected / world.size)

        noisy = np.random.default_rng(world.rank).standard_normal(n).astype(dtype)
        reference = noisy.copy()
        world.Allreduce(MPI.IN_PLACE, reference)
        reduce(noisy, t, algorithm, "mean", form)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        np.testing.assert_allclose(noisy, reference / world.size, rtol=tol, atol=tol)
        # every rank holds the very same bits
        assert len({r.tobytes() for r in world.allgather(noisy)}) == 1


@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_started_forms_progress_with_test(algorithm):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        for n in (1001, 2):  # fewer elements than ranks: empty chunks and slices
            buf = integer_valued(n, np.float64)
            expected = buf.copy()
            world.Allreduce(MPI.IN_PLACE, expected)
            returned = reduce(buf, t, algorithm, "sum", "polled")
            assert returned is buf
            np.testing.assert_array_equal(buf, expected)


def test_two_started_operations_in_flight_at_once():
    t = topology(None)
    a, b = integer_valued(300, np.float64), integer_valued(77, np.float32)
    expected_a, expected_b = a.copy(), b.copy()
    world.Allreduce(MPI.IN_PLACE, expected_a)
    world.Allreduce(MPI.IN_PLACE, expected_b)
    first, second = iallreduce(a, t, "ring"), iallreduce(b, t, "hierarchical", op="mean")
    second.test()
    first.wait()
    second.wait()
    np.testing.assert_array_equal(a, expected_a)
    np.testing.assert_array_equal(b, expected_b / world.size)


@pytest.mark.parametrize("algorithm", ["hierarchical", "hierarchical_leader"])
@pytest.mark.parametrize("form", ["blocking", "started"])
def test_a_node_buffer_is_reduced_in_its_own_window(algorithm, form):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        n = 613  # a size no other test reduces: its scratch window would be this test's
        buffer = shared_buffer(t, n, np.float32, name="zero-copy test")
        assert isinstance(buffer, NodeBuffer)
        assert shared_buffer(t, n, np.float32, name="zero-copy test") is buffer
        buffer.array[...] = integer_valued(n, np.float32)
        expected = buffer.array.copy()
        world.Allreduce(MPI.IN_PLACE, expected)
        result = reduce(buffer, t, algorithm, "sum", form)
        assert result is buffer.array
        np.testing.assert_array_equal(buffer.array, expected)
        # the node's segments were summed where they lie: every row of the window holds
        # the sum, and no scratch window was made to copy through
        np.testing.assert_array_equal(buffer.window.whole, np.tile(expected, (t.local_size, 1)))
        assert (n, np.dtype(np.float32)) not in t.workspace.windows


@pytest.mark.parametrize("algorithm", ["hierarchical", "hierarchical_leader"])
def test_a_plain_array_goes_through_the_scratch_window(algorithm):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        n = 617
        # even a plain view of a shared segment is a plain array: copied, never matched
        segment = shared_buffer(t, n, np.float64, name="plain view test").array
        alone = integer_valued(n, np.float64)
        for buf in (segment, alone):
            buf[...] = integer_valued(n, np.float64)
            expected = buf.copy()
            world.Allreduce(MPI.IN_PLACE, expected)
            np.testing.assert_array_equal(allreduce(buf, t, algorithm), expected)
        assert (n, np.dtype(np.float64)) in t.workspace.windows


def test_node_allreduce_of_a_node_buffer_and_of_a_plain_array():
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        n = 619
        buffer = shared_buffer(t, n, np.float64, name="node test")
        plain = np.empty(n)
        for buf, array in ((buffer, buffer.array), (plain, plain)):
            array[...] = integer_valued(n, np.float64)
            expected = array.copy()
            t.node.Allreduce(MPI.IN_PLACE, expected)
            assert node_allreduce(buf, t, op="mean") is array
            np.testing.assert_array_equal(array, expected / t.local_size)
        if t.local_size > 1:  # alone on its node, a rank has nothing to reduce
            assert (n, np.dtype(np.float64)) in t.workspace.windows  # the plain array's
            np.testing.assert_array_equal(buffer.window.whole[0], buffer.array)


def test_a_node_buffer_of_another_topology_is_refused():
    mine, other = topology(None), Topology()
    buffer = shared_buffer(other, 8, np.float64, name="other")
    with pytest.raises(ValueError, match=f"rank {world.rank}: NodeBuffer.*another topology"):
        allreduce(buffer, mine, "hierarchical")
    other.free()  # frees its workspace's windows too
    with pytest.raises(RuntimeError, match="used after free"):
        buffer.window.segment


@pytest.mark.parametrize("started", [False, True])
def test_rail_reductions_sum_over_the_rail(started):
    for ranks_per_node in valid_layouts():
        t = topology(ranks_per_node)
        buf = integer_valued(501, np.float64)
        expected = buf.copy()
        t.cross.Allreduce(MPI.IN_PLACE, expected)
        if started:
            result = rail_iallreduce(buf, t, op="mean").wait()
        else:
            result = rail_allreduce(buf, t, op="mean")
        assert result is buf
        np.testing.assert_array_equal(buf, expected / t.num_nodes)


def test_bad_arguments_and_non_finite_results():
    t = topology(None)
    with pytest.raises(ValueError, match=f"rank {world.rank}: allreduce algorithm 'tree'"):
        allreduce(np.zeros(3), t, "tree")
    with pytest.raises(ValueError, match="allreduce op 'max'"):
        allreduce(np.zeros(3), t, "mpi", op="max")
    with pytest.raises(TypeError, match=r"contiguous 1-D float NumPy array or a NodeBuffer, "
                                        r"got ndarray \(2, 2\)"):
        allreduce(np.zeros((2, 2)), t, "mpi")
    buf = np.zeros(4)
    if world.rank == 0:
        buf[2] = np.nan
    with pytest.raises(FloatingPointError, match=f"rank {world.rank}: allreduce result is not "
                                                 "finite \\(first at element 2"):
        allreduce(buf, t, "ring", check_finite=True)
