"""The extra passes of an asynchronous worker (``Batches``), pinned to the documented seeds.

A parameter-server worker faster than its share of an epoch runs out of its shard and
starts another pass over it. The run and its replay take these passes through the same
``Batches`` (``minidp/io/training_data.py``), so a wrong seed is made on both sides and
only numbers written apart from the code see it. The rule (``Batches``' docstring):
pass p >= 1 of world rank r in epoch e, in a world of R ranks, puts the previous
pass's order through ``default_rng([seed, e, r + p R]).permutation``: every pass of
every rank has its own generator, none shared with another rank's pass or with a
reader's own shuffle ``default_rng([seed, e, k])``, k < R. A batch larger than what is
left of the pass starts the next pass (the rest of the old one is not used).

Here a worker is world rank 2 of R = 4 (a server and three workers), so rank 1 of the
three workers that share the data: its shard is the ``memory`` reader's slice 1 of each
global batch, written out as in ``tests/mpi/test_reader_order.py``. The file's record i
holds i (sample and label).
"""

import dataclasses

import numpy as np
import pytest
from mpi4py import MPI

from minidp.io.mdp import read_header, write_mdp
from minidp.io.readers import MemoryReader
from minidp.io.training_data import TrainingData

COUNT, SEED = 40, 9
WORKERS, WORKER = 3, 1  # the reader splits the data over the workers
WORLD, RANK = 4, 2  # the passes' seeds count world ranks
BASE = 4  # the reader's unit: 40 // 3 = 13 samples, 3 batches of 4, so a shard of 12


@pytest.fixture
def data(tmp_path):
    path = str(tmp_path / "passes.mdp")
    ids = np.arange(COUNT)
    write_mdp(path, ids.reshape(-1, 1).astype(np.float32), ids, COUNT)
    reader = MemoryReader(path, MPI.COMM_SELF, SEED)
    reader.rank, reader.size = WORKER, WORKERS  # as the replay places its one reader
    return TrainingData(reader, read_header(path), {}, reader.samples_per_rank,
                        np.empty(0, np.float32), np.empty(0, np.int64), "synthetic", SEED,
                        RANK, WORLD)


def first_pass(epoch):
    """Slice 1 of each global batch of 3 x 4 of the epoch's one permutation."""
    order = np.random.default_rng([SEED, epoch, 0]).permutation(COUNT)
    return np.concatenate([order[s * 12 + 4:s * 12 + 8] for s in range(3)])


def next_pass(previous, epoch, p):
    """Pass p: the previous pass's order, permuted by default_rng([seed, e, r + p R])."""
    return previous[np.random.default_rng([SEED, epoch, RANK + p * WORLD]).permutation(12)]


@pytest.mark.parametrize("epoch", [0, 1])
def test_a_worker_that_runs_ahead_gets_each_pass_in_its_own_documented_order(data, epoch):
    batches = data.batches(epoch, BASE, np.dtype(np.float64), "asgd")
    pass0 = first_pass(epoch)
    pass1 = next_pass(pass0, epoch, 1)  # seed [9, e, 6]
    pass2 = next_pass(pass1, epoch, 2)  # seed [9, e, 10]
    # sizes as dbs gives them: 4, 4, 4 end pass 0; 5, 5 take 10 of pass 1; the next 5 do
    # not fit in the 2 left, so pass 2 begins; 7 more end it
    expected = [pass0[0:4], pass0[4:8], pass0[8:12], pass1[0:5], pass1[5:10], pass2[0:5],
                pass2[5:12]]
    passes = [0, 0, 0, 1, 1, 2, 2]
    for want, n, p in zip(expected, [4, 4, 4, 5, 5, 5, 7], passes):
        x, y = batches.take(n)
        assert y.tolist() == want.tolist(), f"pass {p}"
        np.testing.assert_allclose(x[:, 0] * np.sqrt(2), want, rtol=1e-6)  # x stays with y
        assert batches.passes == p
    # pass 0 is the shard the reader gave: the passes reorder it, they never add a sample
    assert sorted(pass1.tolist()) == sorted(pass2.tolist()) == sorted(pass0.tolist())


def test_the_passes_of_two_ranks_with_one_shard_differ(data):
    # Two world ranks reading the same shard (the memory reader's slice 1): their second
    # passes must not be the same order, or two workers would apply the same gradients.
    orders = []
    for rank in (1, 2):
        other = dataclasses.replace(data, rank=rank)
        batches = other.batches(0, BASE, np.dtype(np.float64), "asgd")
        batches.take(12)
        orders.append(batches.take(12)[1].tolist())
    assert orders[0] != orders[1]
    assert orders[1] == next_pass(first_pass(0), 0, 1).tolist()
