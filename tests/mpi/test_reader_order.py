"""SPMD: the order of the samples each reader gives each rank in each epoch, pinned.

A run and its replay (``minidp replay``) read the data through the same readers, so a
shuffle that is wrong the same way on both sides (a seed that ignores the epoch, a
block read by the wrong rank) is invisible to the replay. Here the expected order is
written out from the documented rule (``minidp/io/readers.py``'s module docstring and
``docs/design.md``), with the generators the rule names, apart from the readers' code:

* ``memory`` and ``strided``: one permutation of the first ``count`` records per
  (seed, epoch), ``default_rng([seed, epoch, 0])``; rank r of R takes, from each global
  batch of R x b consecutive entries, the r-th run of b; the last partial global batch
  is dropped;
* ``mpiio``: R contiguous blocks, block k = records [k count // R, (k+1) count // R);
  rank r reads block (r + e) mod R in epoch e, in pieces of at most ``max_bytes``;
  with ``default_rng([seed, e, r])`` it first draws the order of the pieces, then, piece
  by piece in that order, the order inside each; the first floor(count / R) samples;
* ``leader``: N nodes of G consecutive ranks; node i's leader reads block (i + e) mod N
  of N; ``default_rng([seed, e, i])`` permutes the block and local rank k takes entries
  [k n, (k+1) n) of it, n = floor(count / R).

The file's record i holds i (and label i mod 7), written with minidp's own writer.
"""

import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from minidp.io import mdp
from minidp.io.readers import LeaderReader, MemoryReader, MPIIOReader, StridedReader

comm = MPI.COMM_WORLD
COUNT = 61  # prime: no world size divides it, the blocks differ in size
SEED = 23
EPOCHS = 3


@pytest.fixture(scope="module")
def data_file():
    directory = comm.bcast(tempfile.mkdtemp(prefix="minidp-order-") if comm.rank == 0
                           else None)
    path = f"{directory}/order.mdp"
    if comm.rank == 0:
        ids = np.arange(COUNT, dtype=np.int32)
        mdp.write_mdp(path, ids.reshape(-1, 1), (ids % 7).astype(np.int64), 7)
    comm.Barrier()
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(directory)


def samples(stream):
    """The record numbers of a stream, checked against their labels."""
    ids = stream.x[:, 0].astype(np.int64)
    np.testing.assert_array_equal(stream.y, ids % 7)
    return ids.tolist()


def memory_rule(count, ranks, rank, epoch, batch):
    """Slice ``rank`` of every global batch of one permutation per (seed, epoch)."""
    order = np.random.default_rng([SEED, epoch, 0]).permutation(count)
    steps = count // ranks // batch
    mine = []
    for step in range(steps):
        first = step * ranks * batch + rank * batch
        mine += order[first:first + batch].tolist()
    return mine


def mpiio_rule(count, ranks, rank, epoch, per_piece):
    """The rotating block, its pieces in a drawn order, each piece shuffled in turn."""
    block = (rank + epoch) % ranks
    records = list(range(block * count // ranks, (block + 1) * count // ranks))
    pieces = [records[a:a + per_piece] for a in range(0, len(records), per_piece)]
    rng = np.random.default_rng([SEED, epoch, rank])
    mine = []
    for p in rng.permutation(len(pieces)):
        mine += [pieces[p][i] for i in rng.permutation(len(pieces[p]))]
    return mine[:count // ranks]


def leader_rule(count, ranks, rank, epoch, per_node):
    """The node's rotating block, one permutation per (seed, epoch, node), slice k."""
    nodes, node, local = ranks // per_node, rank // per_node, rank % per_node
    block = (node + epoch) % nodes
    start, stop = block * count // nodes, (block + 1) * count // nodes
    order = np.random.default_rng([SEED, epoch, node]).permutation(stop - start)
    n = count // ranks
    return [start + int(i) for i in order[local * n:(local + 1) * n]]


@pytest.mark.parametrize("kind", ["memory", "strided"])
@pytest.mark.parametrize("batch", [1, 4])
@pytest.mark.parametrize("limit", [None, 50])
def test_memory_and_strided_take_slice_r_of_each_global_batch_of_one_permutation(
        data_file, kind, batch, limit):
    reader = {"memory": MemoryReader, "strided": StridedReader}[kind](data_file, seed=SEED,
                                                                       limit=limit)
    count = limit or COUNT
    for epoch in range(EPOCHS):
        got = samples(reader.epoch(epoch, batch))
        assert got == memory_rule(count, comm.size, comm.rank, epoch, batch), (kind, epoch)


@pytest.mark.parametrize("pieces", ["one", "several"])
@pytest.mark.parametrize("limit", [None, 50])
def test_mpiio_reads_the_rotating_block_with_its_pieces_and_records_shuffled(
        data_file, pieces, limit):
    probe = MPIIOReader(data_file, seed=SEED, limit=limit)
    per_piece = 4 if pieces == "several" else COUNT  # 4 records per collective read
    reader = MPIIOReader(data_file, seed=SEED, limit=limit,
                         max_bytes=per_piece * probe.header.record_size)
    count = limit or COUNT
    for epoch in range(EPOCHS):
        got = samples(reader.epoch(epoch))
        assert got == mpiio_rule(count, comm.size, comm.rank, epoch, per_piece), epoch


@pytest.mark.parametrize("per_node", [1, 2, None])
def test_leader_gives_local_rank_k_slice_k_of_its_nodes_shuffled_block(data_file, per_node):
    if per_node is not None and comm.size % per_node:
        pytest.skip(f"{per_node} ranks per node do not divide {comm.size} ranks")
    reader = LeaderReader(data_file, seed=SEED, ranks_per_node=per_node)
    try:
        for epoch in range(EPOCHS):
            got = samples(reader.epoch(epoch))
            assert got == leader_rule(COUNT, comm.size, comm.rank, epoch,
                                      per_node or comm.size), epoch
    finally:
        reader.free()


def test_every_epoch_and_every_rank_has_its_own_order(data_file):
    # what the rules above imply, checked on the readers themselves: no epoch repeats
    # another's order, and no two ranks share a sample in one epoch
    for kind in (MemoryReader, MPIIOReader):
        reader = kind(data_file, seed=SEED)
        epochs = [samples(reader.epoch(e)) for e in range(EPOCHS)]
        assert len({tuple(e) for e in epochs}) == EPOCHS, kind.__name__
        for e in epochs:
            everyone = [i for part in comm.allgather(e) for i in part]
            assert len(set(everyone)) == len(everyone), kind.__name__
