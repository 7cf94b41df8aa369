"""SPMD: debug-mode collective checks and timed barriers."""

import numpy as np
import pytest
from mpi4py import MPI

from minidp.comm import Topology, allreduce, guard

world = MPI.COMM_WORLD


@pytest.fixture
def debug_on():
    guard.set_debug(True)
    yield
    guard.set_debug(False)


def test_debug_mode_names_the_rank_with_another_shape(debug_on):
    topology = Topology(ranks_per_node=1)
    buf = np.zeros(8 if world.rank != world.size - 1 else 9)
    if world.size == 1:
        np.testing.assert_array_equal(allreduce(buf, topology, "hierarchical"), 0)
        return
    with pytest.raises(guard.CollectiveMismatch,
                       match=rf"rank 0 calls allreduce mpi sum with shape \(8,\) float64, "
                             rf"but rank {world.size - 1} calls allreduce mpi sum with shape "
                             r"\(9,\)"):
        allreduce(buf, topology, "mpi")
    # every rank raised before communicating, so the next collective still works
    buf = np.full(8, float(world.rank))
    assert allreduce(buf, topology, "mpi")[0] == world.size * (world.size - 1) / 2


def test_debug_mode_names_a_rank_calling_another_algorithm(debug_on):
    topology = Topology()
    algorithm = "ring" if world.rank == 1 else "mpi"
    if world.size == 1:
        return
    with pytest.raises(guard.CollectiveMismatch, match="rank 1 calls allreduce ring sum"):
        allreduce(np.zeros(4), topology, algorithm)


def test_timed_barrier_completes_and_checks_its_timeout():
    guard.barrier(world, "test barrier")
    with pytest.raises(ValueError, match="comm timeout: got 0, allowed: seconds > 0"):
        guard.set_timeout(0)
