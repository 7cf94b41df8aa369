"""SPMD: debug-mode collective checks, timed barriers, and a stopped rank named everywhere.

The stopped-rank tests keep one rank away (asleep) while the others enter a set-up, the
initial parameter broadcast, an MPI-IO read or a ring allreduce with a short timeout:
each of them must raise CommTimeout naming the absent rank before it comes back. Each
runs on a communicator of its own, abandoned afterwards with the timed-out requests
still posted on it, so nothing left over can meet a later test's messages.
"""

import os
import re
import shutil
import subprocess
import tempfile
import time

import numpy as np
import pytest
from mpi4py import MPI

from minidp import layers, strategies
from minidp.comm import Topology, allreduce, guard
from minidp.io import mdp
from minidp.io.readers import MPIIOReader
from minidp.optim import SGD

world = MPI.COMM_WORLD
TIMEOUT = 1.0  # the present ranks' timeout in the stopped-rank tests
AWAY = 3.0  # how long the stopped rank sleeps: well past every present rank's timeout
needs_peer = pytest.mark.skipif(world.size < 2, reason="a stopped rank needs another rank")


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
    if world.size == 1:
        pytest.skip("needs a second rank to call another algorithm")
    topology = Topology()
    algorithm = "ring" if world.rank == 1 else "mpi"
    with pytest.raises(guard.CollectiveMismatch, match="rank 1 calls allreduce ring sum"):
        allreduce(np.zeros(4), topology, algorithm)


def test_timed_barrier_completes_and_checks_its_timeout():
    guard.barrier(world, "test barrier")
    with pytest.raises(ValueError, match="comm timeout: got 0, allowed: seconds > 0"):
        guard.set_timeout(0)


def own_comm(name):
    """A communicator for one stopped-rank test (every rank creates it, all present)."""
    comm = world.Dup()
    comm.Set_name(name)
    return comm


# Where the stopped rank leaves a mark once it is back (one per stop_one_rank call).
MARKS = world.bcast(tempfile.mkdtemp(prefix="minidp-away-") if world.rank == 0 else None)
CALLS = iter(range(10 ** 6))


@pytest.fixture(scope="module", autouse=True)
def remove_marks():
    yield
    world.Barrier()
    if world.rank == 0:
        shutil.rmtree(MARKS, ignore_errors=True)


def stop_one_rank(absent, enter, away=lambda: time.sleep(AWAY)):
    """Every rank but ``absent`` calls ``enter()``; ``absent`` calls ``away()`` instead.

    ``away`` takes AWAY seconds (by default it only sleeps). Returns this rank's
    CommTimeout message (None on the absent rank). Every rank meets again before
    anything is asserted.
    """
    message, back = None, os.path.join(MARKS, f"back-{next(CALLS)}")
    came_back = False
    if world.rank == absent:
        away()
        open(back, "w").close()
    else:
        guard.set_timeout(TIMEOUT)
        try:
            enter()
            message = "no CommTimeout"
        except guard.CommTimeout as timeout:
            message = str(timeout)
            came_back = os.path.exists(back)
        finally:
            guard.set_timeout(float(os.environ.get("MINIDP_COMM_TIMEOUT", "300")))
    guard.barrier(world, "after a stopped rank")
    if message is not None:
        # Raised by the timeout while the rank was away, not after it came back: an
        # order of events, not a bound on seconds that a loaded machine can break.
        assert not came_back, message
    return message


@pytest.fixture(scope="module")
def board():
    """The status board exists (the first Topology builds it), as in a run."""
    return Topology()


@needs_peer
@pytest.mark.parametrize("label", ["past the call test", "é" * 47 + " longer than a record"],
                         ids=["short", "cut mid-character"])
def test_a_rank_past_the_call_is_not_named_as_missing(board, label):
    # A collective can complete on one rank and not on another (rank 0 may have what it
    # needs from a stopped rank by way of a third one): the waiting rank must not name the
    # one that went on as "never arrived", or the culprit's name is lost among them. A
    # label longer than the record's 96 bytes is compared as the record holds it.
    status = guard._board["board"]
    others = list(range(1, world.size))
    for count, waiting, named in [(2, True, False), (1, False, False), (0, False, True),
                                  (1, True, False)]:
        world.Barrier()
        if world.rank == 1:
            status.enter(label, count)
            if not waiting:
                status.leave()
        world.Barrier()
        if world.rank == 0:
            lines = status.absent(others, label, 1)
            mentioned = any(line.startswith("rank 1:") for line in lines)
            assert mentioned == named, (count, waiting, lines)
            assert all(line.startswith("rank 1:") or "never arrived" in line
                       for line in lines)
        world.Barrier()
        if world.rank == 1:
            status.leave()
    world.Barrier()


@needs_peer
def test_a_rank_whose_watchdog_gave_up_in_the_call_is_not_named_when_gone(board):
    # Every waiting rank's watchdog fires about together; the first to give up ends its
    # process. The others must not name it "gone": it came to the call and is a victim.
    # A rank that is gone while still waiting in the call (killed there) is a culprit.
    status = guard._board["board"]
    label = "gave up test"
    for gave_up, named in [(True, False), (False, True)]:
        world.Barrier()
        if world.rank == 1:
            finished = subprocess.Popen(["true"])
            finished.wait()  # its pid now names no process: "gone"
            status.enter(label, 1)
            if gave_up:
                status.give_up()
            own, status.mine["pid"] = status.mine["pid"], finished.pid
        world.Barrier()
        if world.rank == 0 and guard._board["board"].slots.get(1) is not None:
            lines = status.absent([1], label, 1)
            assert bool(lines) == named, (gave_up, lines)
            if named:
                assert lines[0].startswith(f"rank 1: process {finished_pid(status)} is gone "
                                           "(waiting in 'gave up test' #1, "), lines
        world.Barrier()
        if world.rank == 1:
            status.mine["pid"] = own
            status.leave()
    world.Barrier()


def finished_pid(status):
    """The pid rank 1's record holds now (rank 0 reads it from the shared board)."""
    return int(status.records[status.slots[1]]["pid"])


@needs_peer
@pytest.mark.parametrize("absent", [0, -1], ids=["rank 0", "last rank"])
def test_the_roll_call_names_a_rank_that_never_comes(absent):
    absent %= world.size
    comm = own_comm("roll call test")
    message = stop_one_rank(absent, lambda: guard.roll_call(comm, "start"))
    if message is not None:
        assert message.startswith(f"rank {world.rank}: 'start (roll call) on roll call test' "
                                  f"waited {TIMEOUT:g} s (MINIDP_COMM_TIMEOUT)")
        if absent == 0:
            assert message.endswith("more for rank 0; rank 0: never answered (it never "
                                    "arrived, or still waits for a rank that did not)")
        else:
            assert message.endswith(f"; rank {absent}: never arrived")


@needs_peer
def test_a_rank_stopped_before_topology_set_up_is_named(board):
    absent = world.size - 1
    comm = own_comm("set-up test")
    message = stop_one_rank(absent, lambda: Topology(comm))
    if message is not None:
        assert message.startswith(f"rank {world.rank}: 'topology set-up on set-up test' "
                                  f"waited {TIMEOUT:g} s")
        assert f"rank {absent}: never arrived" in message


@needs_peer
def test_a_rank_stopped_before_the_initial_broadcast_is_named(board):
    absent = world.size - 1
    topology = Topology(own_comm("broadcast test"))
    model = layers.mlp(6, (5,), 3)
    optimizer = SGD(model.parameters(), lr=0.1)
    message = stop_one_rank(absent, lambda: strategies.get("sync", model, optimizer, topology))
    if message is not None:
        assert message.startswith(f"rank {world.rank}: 'broadcast parameters on broadcast "
                                  "test' waited")
        assert f"rank {absent}: never arrived" in message


@pytest.fixture(scope="module")
def small_file():
    """A 40-record .mdp file every rank can read (written by rank 0)."""
    folder = tempfile.mkdtemp(prefix="minidp-guard-") if world.rank == 0 else None
    folder = guard.bcast_object(world, folder, 0, "test folder")
    path = os.path.join(folder, "small.mdp")
    if world.rank == 0:
        idx = np.arange(40, dtype=np.int32)
        mdp.write_mdp(path, np.stack([idx, -idx], axis=1), (idx % 5).astype(np.int64), 5)
    guard.barrier(world, "test file written")
    yield path
    guard.barrier(world, "test file read")
    if world.rank == 0:
        shutil.rmtree(folder)


class StayedAway(Exception):
    """The stopped rank's way out of the read it never took part in."""


@needs_peer
def test_a_rank_stopped_in_an_mpiio_read_is_named(board, small_file, monkeypatch):
    absent = world.size - 1
    reader = MPIIOReader(small_file, own_comm("io test"))

    def away_from_the_read(request, comm, operation, wait=guard.wait):
        if operation != "read dataset block":
            return wait(request, comm, operation)
        time.sleep(AWAY)
        raise StayedAway

    def away():
        # It opens the file with the others, then stays away from the collective read.
        monkeypatch.setattr(guard, "wait", away_from_the_read)
        try:
            reader.read_block(0)
        except StayedAway:
            pass
        monkeypatch.undo()

    message = stop_one_rank(absent, lambda: reader.read_block(0), away)
    if message is not None:
        # A rank whose part of the read completed waits in the close instead.
        assert re.match(rf"rank {world.rank}: '(read dataset block|close dataset file) on io "
                        rf"test' waited {TIMEOUT:g} s", message), message
        assert f"rank {absent}: never arrived (last in 'open dataset file on io test'" \
            in message


@needs_peer
def test_a_rank_stopped_in_a_ring_allreduce_is_named(board):
    absent = world.size - 1
    topology = Topology(own_comm("ring test"))
    buffer = np.ones(64)
    message = stop_one_rank(absent, lambda: allreduce(buffer, topology, "ring"))
    if message is not None:
        left, right = (world.rank - 1) % world.size, (world.rank + 1) % world.size
        assert message.startswith(f"rank {world.rank}: 'ring allreduce from rank {left} to "
                                  f"rank {right}' waited {TIMEOUT:g} s")
        # The rank that receives from the stopped one names it; the others wait for a
        # neighbour (shown waiting in the ring, or already gone on after its own timeout).
        if left == absent:
            assert re.search(rf"; rank {absent}: last in '[^']+' #\d+, [\d.]+ s ago", message)
