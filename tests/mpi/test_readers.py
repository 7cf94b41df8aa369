"""SPMD: the readers' block partition, rotation, equivalences and collective errors."""

import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from minidp.io import mdp
from minidp.io.readers import (
    MemoryReader,
    MPIIOReader,
    StridedReader,
    block_range,
    open_for_blocks,
)

comm = MPI.COMM_WORLD
COUNT = 103  # prime: no world size divides it


@pytest.fixture(scope="module")
def workdir():
    path = tempfile.mkdtemp(prefix="minidp-readers-") if comm.rank == 0 else None
    path = comm.bcast(path)
    yield path
    comm.Barrier()
    if comm.rank == 0:
        shutil.rmtree(path)


def make_file(directory, name, count):
    """Record i holds sample (i, -i) and label i % 7, so every sample names itself."""
    path = os.path.join(directory, name)
    if comm.rank == 0:
        idx = np.arange(count, dtype=np.int32)
        mdp.write_mdp(path, np.stack([idx, -idx], axis=1), (idx % 7).astype(np.int64), 7)
    comm.Barrier()
    return path


@pytest.fixture(scope="module")
def data_file(workdir):
    return make_file(workdir, "data.mdp", COUNT)


def test_mpiio_blocks_partition_the_records(data_file):
    reader = MPIIOReader(data_file)
    blocks = comm.allgather(block_range(reader.block_of(0), comm.size, COUNT))
    covered = sorted(i for a, b in blocks for i in range(a, b))
    assert covered == list(range(COUNT))  # disjoint and covering
    sizes = [b - a for a, b in blocks]
    assert max(sizes) - min(sizes) <= 1


def test_each_rank_reads_every_block_once_over_size_epochs(data_file):
    reader = MPIIOReader(data_file)
    seen_blocks = []
    for epoch in range(comm.size):
        stream = reader.epoch(epoch)
        start, stop = block_range(reader.block_of(epoch), comm.size, COUNT)
        ids = stream.x[:, 0]
        assert len(ids) == COUNT // comm.size
        assert np.all((ids >= start) & (ids < stop)) and len(set(ids)) == len(ids)
        np.testing.assert_array_equal(stream.x[:, 1], -ids)
        np.testing.assert_array_equal(stream.y, ids % 7)
        seen_blocks.append(reader.block_of(epoch))
    assert sorted(seen_blocks) == list(range(comm.size))
    assert reader.read_calls == comm.size  # one collective read per block


def test_bounded_pieces_read_the_block_in_several_collective_calls(data_file):
    reader = MPIIOReader(data_file, max_bytes=5 * 16)  # records are 16 bytes: 5 per call
    ids = reader.epoch(1).x[:, 0]
    start, stop = block_range(reader.block_of(1), comm.size, COUNT)
    assert reader.read_calls == -(-(-(-COUNT // comm.size)) // 5)  # same count on every rank
    assert len(ids) == COUNT // comm.size and len(set(ids)) == len(ids)
    assert np.all((ids >= start) & (ids < stop))


def test_block_reads_open_the_file_without_collective_buffering(data_file):
    """Each rank reads one contiguous block: ROMIO's aggregators would only add a hop."""
    fh = open_for_blocks(comm, data_file)
    try:
        hints = fh.Get_info()
        assert hints.Get("romio_cb_read") == "disable"
        hints.Free()
    finally:
        fh.Close()


def test_memory_reader_on_n_ranks_equals_one_rank_with_n_times_the_batch(data_file):
    batch = 4
    mine = list(MemoryReader(data_file, seed=3).iterate(2, batch))
    gathered = comm.allgather([x[:, 0] for x, _ in mine])
    single = list(MemoryReader(data_file, MPI.COMM_SELF, seed=3).iterate(2, batch * comm.size))
    assert len(single) == len(mine)
    for step, (x, y) in enumerate(single):
        np.testing.assert_array_equal(np.concatenate([g[step] for g in gathered]), x[:, 0])
        np.testing.assert_array_equal(y, x[:, 0] % 7)


def test_strided_reader_reads_the_memory_readers_samples(data_file):
    strided = [x for x, _ in StridedReader(data_file, seed=5).iterate(0, 3)]
    memory = [x for x, _ in MemoryReader(data_file, seed=5).iterate(0, 3)]
    for a, b in zip(strided, memory, strict=True):
        np.testing.assert_array_equal(a, b)


def test_variable_batch_sizes(data_file):
    stream = MPIIOReader(data_file).epoch(0)
    sizes = [1, 5, 2, 7]
    got = [stream.take(n) for n in sizes]
    assert [len(y) for _, y in got] == sizes
    assert stream.take(stream.remaining + 1) is None


def test_bad_batch_sizes_raise_on_every_rank(data_file):
    reader = MPIIOReader(data_file)
    for bad in (0, COUNT // comm.size + 1):
        with pytest.raises(ValueError, match=rf"rank {comm.rank}: batch size {bad} .*allowed 1 "
                                             rf"to {COUNT // comm.size}"):
            reader.batches_per_epoch(bad)


def test_fewer_samples_than_ranks_is_an_error_on_every_rank(workdir):
    path = make_file(workdir, "tiny.mdp", 2)
    if comm.size > 2:
        with pytest.raises(ValueError, match=r"has 2 samples, fewer than the \d ranks"):
            MPIIOReader(path)
    else:
        assert MPIIOReader(path).samples_per_rank == 2 // comm.size


def test_collective_checksum_verification(workdir, data_file):
    MPIIOReader(data_file).verify()
    bad = os.path.join(workdir, "bad.mdp")
    if comm.rank == 0:
        shutil.copy(data_file, bad)
        with open(bad, "r+b") as f:
            f.seek(mdp.HEADER_SIZE + 16 * (COUNT - 1))  # last record: in the last rank's block
            f.write(b"\x7f")
    comm.Barrier()
    with pytest.raises(ValueError, match="checksum mismatch"):
        MPIIOReader(bad).verify()


@pytest.mark.parametrize("ranks_per_node", [1, 2, None])
def test_leader_reader_shares_each_node_block_disjointly(data_file, ranks_per_node):
    from minidp.io.readers import LeaderReader

    if ranks_per_node is not None and comm.size % ranks_per_node:
        with pytest.raises(ValueError, match=f"--ranks-per-node: got {ranks_per_node} for the "
                                             f"job's {comm.size} ranks"):
            LeaderReader(data_file, ranks_per_node=ranks_per_node)
        return
    reader = LeaderReader(data_file, ranks_per_node=ranks_per_node)
    blocks = []
    nodes = reader.topology.num_nodes
    for epoch in range(nodes):
        ids = reader.epoch(epoch).x[:, 0]
        start, stop = block_range(reader.block_of(epoch), nodes, COUNT)
        assert len(ids) == COUNT // comm.size and np.all((ids >= start) & (ids < stop))
        node_ids = np.concatenate(reader.topology.node.allgather(ids))
        assert len(set(node_ids)) == len(node_ids)  # ranks of a node never share a sample
        blocks.append(reader.block_of(epoch))
    assert sorted(blocks) == list(range(nodes))
    reader.free()


@pytest.mark.parametrize("kind", ["mpiio", "leader", "strided"])
def test_a_file_cut_short_after_it_was_opened_is_one_error_naming_the_bytes(workdir, kind):
    from minidp.io.readers import LeaderReader

    path = make_file(workdir, f"cut-{kind}.mdp", COUNT)
    reader = LeaderReader(path) if kind == "leader" else \
        MPIIOReader(path) if kind == "mpiio" else StridedReader(path)
    keep = COUNT - 3  # the last 3 records go: the last block (every reader's) is short
    comm.Barrier()  # every rank has opened it whole
    if comm.rank == 0:
        os.truncate(path, mdp.HEADER_SIZE + keep * 16)
    comm.Barrier()
    with pytest.raises(ValueError) as refused:
        reader.epoch(0)
    message = str(refused.value)
    assert message.startswith(f"rank {comm.rank}: dataset file '{path}': reading bytes ")
    assert message.endswith(f"found the file {mdp.HEADER_SIZE + keep * 16} bytes long: it is "
                            "shorter than its header says (truncated or replaced while the run "
                            "read it); prepare it again")
    if kind == "mpiio":  # the last rank reads the last block, from its first record
        start = mdp.HEADER_SIZE + block_range(comm.size - 1, comm.size, COUNT)[0] * 16
        assert (f"reading bytes {start} to {mdp.HEADER_SIZE + COUNT * 16} (rank "
                f"{comm.size - 1}) found") in message
    # every rank raises the same error (the rank prefix aside): printed once, exit 2
    assert len({m.split(": ", 1)[1] for m in comm.allgather(message)}) == 1
    if kind == "leader":
        reader.free()
