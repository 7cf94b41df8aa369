"""SPMD: the readers' block partition, rotation, equivalences and collective errors."""

import os
import shutil
import tempfile

import numpy as np
import pytest
from mpi4py import MPI

from minidp.io import filesystem, mdp
from minidp.io.readers import (
    LeaderReader,
    MemoryReader,
    MPIIOReader,
    StridedReader,
    block_range,
    epoch_rng,
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


def open_kind(kind, path):
    return LeaderReader(path) if kind == "leader" else \
        MPIIOReader(path) if kind == "mpiio" else StridedReader(path)


def raised_on_every_rank_alike(reader):
    """The error of reading epoch 0: raised on every rank, the same but for the rank."""
    with pytest.raises(ValueError) as refused:
        reader.epoch(0)
    message = str(refused.value)
    assert message.startswith(f"rank {comm.rank}: ")
    # every rank raises the same error (the rank prefix aside): printed once, exit 2
    assert len({m.split(": ", 1)[1] for m in comm.allgather(message)}) == 1
    if isinstance(reader, LeaderReader):
        reader.free()
    return message.split(": ", 1)[1]


@pytest.mark.parametrize("kind", ["mpiio", "leader", "strided"])
def test_a_file_cut_short_after_it_was_opened_is_one_error_naming_the_bytes(workdir, kind):
    """Cut short between the check of the file and its read: the read stops at its end.

    The stamp is taken again after the cut, as if the file had been cut between the
    reader's check and its open; Open MPI's collective read past the end of a file never
    returned (issue 43): the read asks only for the bytes the open file has.
    """
    path = make_file(workdir, f"cut-{kind}.mdp", COUNT)
    reader = open_kind(kind, path)
    cut = mdp.HEADER_SIZE + (COUNT - 3) * 16 + 5  # inside a record: the last block is short
    comm.Barrier()  # every rank has opened it whole
    if comm.rank == 0:
        os.truncate(path, cut)
    comm.Barrier()
    reader.stamp = filesystem.stamp(path)  # the check before the read sees no change
    message = raised_on_every_rank_alike(reader)
    assert message.startswith(f"dataset file '{path}': reading bytes ")
    assert message.endswith(f"found the file {cut} bytes long: it is "
                            "shorter than its header says (truncated or replaced while the run "
                            "read it); prepare it again")
    if kind == "mpiio":  # the last rank reads the last block, from its first record
        start = mdp.HEADER_SIZE + block_range(comm.size - 1, comm.size, COUNT)[0] * 16
        assert (f"reading bytes {start} to {mdp.HEADER_SIZE + COUNT * 16} (rank "
                f"{comm.size - 1}) found") in message


def replace_with(path, labels_plus, how):
    """Rank 0 puts a file of the same size with other labels under ``path``.

    ``how``: "moved" renames a new file over it (another inode); "in place" writes the
    new bytes into the same inode, as ``cp`` over it would (the header's checksums differ).
    """
    if comm.rank == 0:
        idx = np.arange(COUNT, dtype=np.int32)
        other = f"{path}.other"
        mdp.write_mdp(other, np.stack([idx, -idx], axis=1),
                      ((idx + labels_plus) % 7).astype(np.int64), 7)
        if how == "moved":
            os.replace(other, path)
        else:
            with open(other, "rb") as src, open(path, "r+b") as dst:
                dst.write(src.read())
            os.remove(other)
    comm.Barrier()


@pytest.mark.parametrize("how", ["moved", "in place"])
@pytest.mark.parametrize("kind", ["mpiio", "leader", "strided"])
def test_a_file_replaced_after_it_was_opened_is_one_error_before_any_read(workdir, kind, how):
    path = make_file(workdir, f"swap-{kind}-{how[:2]}.mdp", COUNT)
    reader = open_kind(kind, path)
    before = filesystem.stamp(path)
    reader.epoch(0)  # the file the reader opened: read as it is
    comm.Barrier()
    replace_with(path, 3, how)
    message = raised_on_every_rank_alike(reader)
    assert message.startswith(f"dataset file '{path}' changed while the run used it: ")
    now = filesystem.stamp(path)
    if how == "moved":
        assert (f"another file is under its name (inode {before.inode} on device "
                f"{before.device} when opened, now inode {now.inode} on device "
                f"{now.device})") in message
    else:
        assert now.inode == before.inode and now.size == before.size
    assert (f"its header bytes changed (CRC-32 {before.header_crc:#010x} when opened, now "
            f"{now.header_crc:#010x})") in message
    assert "size" not in message  # the same size: what the reader checked before
    assert message.endswith("The run stops rather than read other records than those it "
                            "opened and checked; put the file the run opened back under its "
                            "name and resume from the last checkpoint, or start a new run")


@pytest.mark.parametrize("kind", ["mpiio", "leader", "strided"])
def test_a_fifo_moved_in_after_the_file_was_opened_is_refused_never_opened(workdir, kind):
    path = make_file(workdir, f"fifo-{kind}.mdp", COUNT)
    reader = open_kind(kind, path)
    comm.Barrier()
    if comm.rank == 0:
        os.remove(path)
        os.mkfifo(path)  # an open() of it would wait for a writer for ever
    comm.Barrier()
    message = raised_on_every_rank_alike(reader)
    assert message.startswith(f"dataset file '{path}' changed while the run used it: it cannot "
                              f"be read as it was (dataset file '{path}' is a FIFO (named "
                              "pipe), not a regular file; ")


@pytest.mark.parametrize("kind", ["memory", "mpiio", "leader", "strided"])
def test_a_label_out_of_range_is_one_error_naming_the_file_and_record(workdir, kind):
    """One rank reads the bad label (the last rank, or a leader); every rank raises."""
    path = make_file(workdir, f"label-{kind}.mdp", COUNT)
    bad = COUNT - 1  # in the last block
    if kind == "strided":  # only the samples of the memory order are read: the last rank's
        bad = int(epoch_rng(0, 0).permutation(COUNT)[COUNT // comm.size * comm.size - 1])
    if comm.rank == 0:
        with open(path, "r+b") as f:  # the label: 8 bytes after the record's sample
            f.seek(mdp.HEADER_SIZE + bad * 16 + 8)
            f.write((9).to_bytes(8, "little"))
    comm.Barrier()
    expected = (f"dataset file '{path}': label 9 of record {bad} is outside the allowed range "
                "[0, 7) of the header's 7 classes; the file's labels do not fit its header: "
                "prepare it again")
    if kind == "memory":  # it reads the whole file when it is made
        with pytest.raises(ValueError) as refused:
            MemoryReader(path)
        assert str(refused.value) == f"rank {comm.rank}: {expected}"
        return
    assert raised_on_every_rank_alike(open_kind(kind, path)) == expected


def test_the_memory_reader_reads_the_records_of_the_file_whose_header_it_read(workdir,
                                                                              monkeypatch):
    """Another file moved in between the header's read and the records' is refused."""
    from minidp.io.readers import base

    path = make_file(workdir, "memory-swap.mdp", COUNT)
    opened = mdp.open_header(path)  # the header and stamp, as the reader takes them first
    comm.Barrier()
    replace_with(path, 3, "moved")  # then, before it reads the records, another file
    monkeypatch.setattr(base, "open_header", lambda _: opened)
    with pytest.raises(ValueError) as refused:
        MemoryReader(path)
    message = str(refused.value)
    assert message.startswith(f"rank {comm.rank}: dataset file '{path}' changed while the run "
                              f"used it: another file is under its name (inode "
                              f"{opened[1].inode} on device"), message
    assert len({m.split(": ", 1)[1] for m in comm.allgather(message)}) == 1
