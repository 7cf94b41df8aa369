"""Readers of an .mdp file for data-parallel training, all behind one interface.

``reader.epoch(e)`` returns an :class:`EpochStream` of this rank's samples for epoch
``e`` in order; ``stream.take(n)`` gives the next n samples (variable sizes, for
asynchronous strategies); ``reader.iterate(e, batch_size)`` yields equal batches.
Data order is a function of (seed, epoch) only.

* ``memory``: the whole set on every rank, one global permutation per epoch; rank r
  takes slice r of every global batch, so N ranks with batch b see, concatenated in
  rank order, exactly the batches of 1 rank with batch N*b.
* ``mpiio``: the records are split into R contiguous blocks, sizes differing by at most
  one; in epoch e rank r reads block (r + e) mod R, so over R epochs every rank reads
  every block once. A block is read with collective reads (``File.Iread_at_all``, the
  non-blocking ``Read_at_all``, completed by a timed wait that names a missing rank) of
  at most ``max_bytes`` each (one read when the block fits), shuffled inside each piece,
  pieces in a shuffled order; without ROMIO's collective buffering
  (:func:`open_for_blocks`). Every rank uses floor(N/R) samples per epoch (the
  remainder record of larger blocks is dropped), so batch counts are equal.
* ``leader``: "the node reads once": local rank 0 of each node reads the node's
  contiguous block (rotating over nodes every epoch) with one collective read
  (``Iread_at_all``) among the leaders, into an ``MPI.Win.Allocate_shared`` window; every
  rank of the node then copies its own disjoint slice of the shuffled block.
* ``strided``: the naive baseline: this rank's samples of the ``memory`` order, read one
  record at a time with ``File.Read_at`` at scattered offsets. Kept to be measured against.

Every rank validates the header; errors (bad file, too few samples, a bad batch size)
are raised identically on every rank, so nothing hangs. :func:`verify_checksum` checks
a file's payload collectively (each rank its block); a run does it when it opens its
files (:mod:`minidp.io.training_data`) unless ``--no-verify``. Every collective step (open,
read, close, fence) goes through :mod:`minidp.comm.guard`, so a rank that never comes
is named after the timeout.
"""

from __future__ import annotations

import abc

import numpy as np
from mpi4py import MPI

from minidp import backend
from minidp.comm import guard
from minidp.comm.topology import Topology
from minidp.io.filesystem import changed, open_regular, stamp_of, unreadable
from minidp.io.mdp import (
    HEADER_SIZE,
    Header,
    add_checksums,
    checksum,
    checksum_mismatch,
    decode,
    label_problem,
    open_header,
)

READERS = ("memory", "mpiio", "leader", "strided")
VERIFY_PIECE = 16 << 20  # bytes read and summed at a time by verify_checksum


def open_for_blocks(comm: MPI.Comm, path: str) -> MPI.File:
    """Open ``path`` collectively for reads of one contiguous block per rank (timed).

    With the hint ``romio_cb_read=disable``: ROMIO's collective buffering reads through
    aggregator ranks, each of one part of the file, which hand the bytes on; that pays
    where requests interleave. Here every rank asks for one contiguous range of
    megabytes, and after the first epoch for its neighbour's block, so every byte would
    be handed over, in a non-blocking exchange that MPICH moves only inside MPI calls
    (the timed wait's polls). Measured in training (4 ranks on 2 cores, 12 MB blocks):
    0.64-0.67 s of every epoch's data phase with the buffering, 0.09 s without
    (docs/benchmarks.md). The read stays collective; an MPI that does not know the
    hint ignores it.
    """
    hints = MPI.Info.Create()
    hints.Set("romio_cb_read", "disable")
    try:
        return guard.collective(comm, "open dataset file", MPI.File.Open, comm, path,
                                MPI.MODE_RDONLY, hints)
    finally:
        hints.Free()


def block_range(block: int, blocks: int, count: int) -> tuple[int, int]:
    """Records [start, stop) of contiguous block ``block`` of ``blocks`` over ``count``."""
    return block * count // blocks, (block + 1) * count // blocks


def verify_checksum(path: str, header: Header, comm: MPI.Comm) -> None:
    """Collectively check a file's payload checksum: each rank sums its block, sums combine.

    Rank r reads block r of ``comm.size`` contiguous blocks (all of the file's records,
    whatever a run's sample limit), in pieces of :data:`VERIFY_PIECE` bytes so memory
    stays bounded; the partial sums are gathered, so every rank compares the same total
    with the header and raises the same error.

    Raises:
        ValueError: on every rank of ``comm``: the checksum differs (the message names the
            file and the byte range, :func:`minidp.io.mdp.checksum_mismatch`), or a rank
            could not read its block (the first such rank's error, naming the file).
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    start, stop = block_range(rank, size, header.count)
    first, last = start * header.record_size, stop * header.record_size  # payload positions
    mine, problem = (0, 0), None
    try:  # a rank that cannot read its block says so in the allgather, never alone
        with open_regular(path) as f:
            f.seek(HEADER_SIZE + first)
            for a in range(first, last, VERIFY_PIECE):
                piece = np.frombuffer(f.read(min(VERIFY_PIECE, last - a)), np.uint8)
                mine = add_checksums(mine, checksum(piece, a))
    except (OSError, ValueError) as exc:
        problem = unreadable(path, exc)
    parts = guard.allgather_object(comm, (mine, problem), "dataset checksum")
    problems = [p for _, p in parts if p]
    if problems:
        raise ValueError(f"rank {rank}: {problems[0]}")
    total = (0, 0)
    for part, _ in parts:
        total = add_checksums(total, part)
    if total != header.checksum:
        raise ValueError(f"rank {rank}: {checksum_mismatch(path, header, total)}")


def epoch_rng(seed: int, epoch: int, rank: int = 0) -> np.random.Generator:
    """The generator of one (seed, epoch[, rank]): order depends on nothing else."""
    return np.random.default_rng([seed, epoch, rank])


class EpochStream:
    """This rank's samples of one epoch, consumed in order by take(n)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y, self.position = x, y, 0

    @property
    def remaining(self) -> int:
        """Samples not yet taken."""
        return len(self.y) - self.position

    def rewind(self, rng: np.random.Generator) -> None:
        """Start another pass over the same samples in a new order (``rng``'s permutation).

        An asynchronous worker faster than its share of an epoch reuses its shard.
        """
        order = rng.permutation(len(self.y))
        self.x, self.y, self.position = self.x[order], self.y[order], 0

    def take(self, n: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The next n samples on the selected backend, or None when fewer than n remain."""
        if not isinstance(n, (int, np.integer)) or n < 1:
            raise ValueError(f"batch size: got {n!r}, allowed: a positive int")
        if n > self.remaining:
            return None
        sl = slice(self.position, self.position + n)
        self.position += n
        return backend.to_device(self.x[sl]), backend.to_device(self.y[sl])


class Reader(abc.ABC):
    """Common part: header validation on every rank, batch iteration."""

    def __init__(self, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                 limit: int | None = None) -> None:
        self.comm = comm if comm is not None else MPI.COMM_WORLD
        self.path, self.seed = path, seed
        self.rank, self.size = self.comm.Get_rank(), self.comm.Get_size()
        # The header and the stamp of one open: every epoch's read checks the stamp first.
        self.header, self.stamp = open_header(path)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)
                                  or limit < 1):
            raise ValueError(f"rank {self.rank}: sample limit: got {limit!r}, allowed: a "
                             "positive int or None")
        # Only the first ``count`` records are used (--train-samples / --test-samples).
        self.count = self.header.count if limit is None else min(limit, self.header.count)
        if self.count < self.size:
            raise ValueError(f"rank {self.rank}: dataset file '{path}' has "
                             f"{self.count} samples, fewer than the {self.size} ranks")

    @property
    def samples_per_rank(self) -> int:
        """Samples each rank gets per epoch."""
        return self.count // self.size

    def check_batch_size(self, batch_size: int) -> None:
        """Raise unless 1 <= batch_size <= samples_per_rank."""
        if not isinstance(batch_size, (int, np.integer)) or not \
                1 <= batch_size <= self.samples_per_rank:
            raise ValueError(f"rank {self.rank}: batch size {batch_size!r} for '{self.path}': "
                             f"allowed 1 to {self.samples_per_rank} (samples per rank per epoch)")

    def batches_per_epoch(self, batch_size: int) -> int:
        """Equal on every rank: the last partial batch is dropped."""
        self.check_batch_size(batch_size)
        return self.samples_per_rank // batch_size

    @abc.abstractmethod
    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """This rank's samples of ``epoch``, in order (``batch_size``: per rank)."""

    def iterate(self, epoch: int, batch_size: int):
        """Yield batches_per_epoch(batch_size) batches (x, y) of this rank."""
        steps = self.batches_per_epoch(batch_size)
        stream = self.epoch(epoch, batch_size)
        for _ in range(steps):
            yield stream.take(batch_size)

    def memory_order(self, epoch: int, batch_size: int) -> np.ndarray:
        """This rank's sample indices in the ``memory`` order: slice r of every global batch.

        One global permutation per (seed, epoch); ``steps * size * batch_size`` samples.
        """
        steps = self.batches_per_epoch(batch_size)
        order = epoch_rng(self.seed, epoch).permutation(self.count)
        batches = order[:steps * self.size * batch_size].reshape(-1, self.size, batch_size)
        return batches[:, self.rank].reshape(-1)

    def verify(self) -> None:
        """Collectively check the payload checksum (:func:`verify_checksum` over ``comm``)."""
        verify_checksum(self.path, self.header, self.comm)

    def changed(self) -> str | None:
        """Why the path no longer names the file this reader opened, or None.

        Checked before every read (a FIFO moved in would block the open, a shorter file
        would be read past its end, which Open MPI's collective read never returns
        from) and after it (a file written in place while it was read).
        """
        return changed(self.path, self.stamp)

    def short_read(self, first: int, end: int, size: int) -> str | None:
        """The problem of reading file bytes [first, end) from a file now ``size`` bytes long."""
        if size >= end:
            return None
        return (f"dataset file '{self.path}': reading bytes {first} to {end} (rank {self.rank}) "
                f"found the file {size} bytes long: it is shorter than its header says "
                "(truncated or replaced while the run read it); prepare it again")

    def agree_whole(self, problem: str | None) -> None:
        """Collectively raise the first rank's problem with its read, on every rank alike.

        A problem one rank finds in what it read (the file changed, cut short, a label
        out of range) is its own: had it raised alone, the others would wait for it in
        their next collective and the job would be aborted, with a message per rank. The
        ranks compare (one small allgather per read), so all end with the same error,
        printed once, exit 2.
        """
        problem = first_problem(self.comm, problem, "dataset read whole")
        if problem:
            raise ValueError(f"rank {self.rank}: {problem}")


def first_problem(comm: MPI.Comm, problem: str | None, operation: str) -> str | None:
    """The first rank's problem of ``comm`` (in rank order), the same on every rank, or None.

    ``operation`` names the step on the status board (a rank that never comes is named).
    """
    problems = [p for p in guard.allgather_object(comm, problem, operation) if p]
    return problems[0] if problems else None


class MemoryReader(Reader):
    """Whole set in memory; rank r takes slice r of every global batch."""

    def __init__(self, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                 limit: int | None = None) -> None:
        super().__init__(path, comm, seed, limit)
        wanted = self.count * self.header.record_size
        raw, problem = np.empty(0, np.uint8), None
        try:
            with open_regular(path) as f:  # the file whose header was read, or an error
                problem = changed(path, self.stamp, stamp_of(f))
                if problem is None:
                    f.seek(HEADER_SIZE)
                    raw = np.fromfile(f, dtype=np.uint8, count=wanted)
                    problem = self.short_read(HEADER_SIZE, HEADER_SIZE + wanted,
                                              HEADER_SIZE + raw.size)
        except (OSError, ValueError) as exc:
            problem = unreadable(path, exc)
        self.agree_whole(problem or label_problem(path, raw, self.header, 0))
        self.x, self.y = decode(raw, self.header)

    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """This rank's slices of the global batches of ``batch_size`` per rank."""
        mine = self.memory_order(epoch, batch_size)
        return EpochStream(self.x[mine], self.y[mine])


class MPIIOReader(Reader):
    """Contiguous blocks read with collective MPI-IO, rotating over ranks every epoch."""

    def __init__(self, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                 limit: int | None = None, max_bytes: int = 256 << 20) -> None:
        super().__init__(path, comm, seed, limit)
        if max_bytes < self.header.record_size:
            raise ValueError(f"max_bytes: got {max_bytes}, allowed: >= one record "
                             f"({self.header.record_size} bytes)")
        self.max_bytes = max_bytes
        self.read_calls = 0

    def block_of(self, epoch: int) -> int:
        """The block this rank reads in ``epoch``."""
        return (self.rank + epoch) % self.size

    def read_block(self, epoch: int) -> list[np.ndarray]:
        """This rank's block of ``epoch`` as raw byte pieces of at most max_bytes each.

        Before the collective open, the ranks agree that the path still names the file
        they opened; no read asks for bytes past the end the open file has (Open MPI's
        collective read past the end of a file never returns); after the reads, the
        ranks agree on what they found (a file cut short or changed while they read, a
        label out of range), so every problem is one error on every rank.
        """
        rs = self.header.record_size
        start, stop = block_range(self.block_of(epoch), self.size, self.count)
        per_piece = max(1, self.max_bytes // rs)
        # Collective calls must match: every rank makes as many calls as the largest block.
        largest = -(-self.count // self.size)
        calls = -(-largest // per_piece)
        pieces = []
        problem = first_problem(self.comm, self.changed(), "dataset file check")
        if problem:  # on every rank alike, before anything is opened
            raise ValueError(f"rank {self.rank}: {problem}")
        # Open, the reads and Close are collective: each is timed, naming a rank that
        # never comes. No try/finally: after a failed read the other ranks are not in a
        # Close, and the job ends.
        fh = open_for_blocks(self.comm, self.path)
        size, problem = fh.Get_size(), None
        for c in range(calls):
            a = min(start + c * per_piece, stop)
            b = min(a + per_piece, stop)
            buf = np.empty((b - a) * rs, dtype=np.uint8)
            there = max(0, min(buf.size, size - (HEADER_SIZE + a * rs)))
            guard.wait(fh.Iread_at_all(HEADER_SIZE + a * rs, buf[:there]), self.comm,
                       "read dataset block")
            self.read_calls += 1
            if b > a:
                pieces.append(buf)
                problem = problem or label_problem(self.path, buf[:there], self.header, a)
        # MPICH's status of a non-blocking read counts the bytes asked, not those read:
        # the file's size after the read says whether the block was there.
        short = self.short_read(HEADER_SIZE + start * rs, HEADER_SIZE + stop * rs,
                                min(size, fh.Get_size())) if stop > start else None
        guard.collective(self.comm, "close dataset file", fh.Close)
        self.agree_whole(short or self.changed() or problem)
        return pieces

    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """The shuffled samples of this epoch's block, samples_per_rank of them."""
        rng = epoch_rng(self.seed, epoch, self.rank)
        pieces = self.read_block(epoch)
        shuffled = []
        for i in rng.permutation(len(pieces)):
            records = pieces[i].view(self.header.record_dtype)
            shuffled.append(records[rng.permutation(len(records))])
        return EpochStream(*decode(np.concatenate(shuffled)[:self.samples_per_rank],
                                   self.header))


class LeaderReader(Reader):
    """One reader per node fills a shared-memory window; the node's ranks share it out.

    Nodes are real (``Split_type(COMM_TYPE_SHARED)``) or virtual (``ranks_per_node``
    consecutive ranks); a Trainer passes its own ``topology`` (over the workers), so no
    second set of communicators is built. Synchronisation: ``Win.Fence`` before the
    leader writes (no rank still copies last epoch's data) and after (the data is
    visible to the whole node).
    """

    def __init__(self, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                 limit: int | None = None, ranks_per_node: int | None = None,
                 topology: Topology | None = None) -> None:
        super().__init__(path, comm, seed, limit)
        self.owns_topology = topology is None
        self.topology = Topology(self.comm, ranks_per_node) if topology is None else topology
        largest = -(-self.count // self.topology.num_nodes) * self.header.record_size
        self.window = guard.collective(self.topology.node, "allocate dataset window",
                                       MPI.Win.Allocate_shared,
                                       largest if self.topology.is_leader else 0, 1,
                                       comm=self.topology.node)
        buf, _ = self.window.Shared_query(0)
        self.shared = np.ndarray(buffer=buf, dtype=np.uint8, shape=(largest,))

    def block_of(self, epoch: int) -> int:
        """The block this rank's node reads in ``epoch``."""
        return (self.topology.node_id + epoch) % self.topology.num_nodes

    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """This rank's disjoint slice of its node's shuffled block."""
        rs = self.header.record_size
        start, stop = block_range(self.block_of(epoch), self.topology.num_nodes,
                                  self.count)
        nbytes = (stop - start) * rs
        node, leaders = self.topology.node, self.topology.leaders
        guard.collective(node, "dataset window fence", self.window.Fence)
        problem = None
        if self.topology.is_leader:  # as in MPIIOReader.read_block: every step timed
            problem = first_problem(leaders, self.changed(), "dataset file check")
            if problem is None:
                fh = open_for_blocks(leaders, self.path)
                there = max(0, min(nbytes, fh.Get_size() - HEADER_SIZE - start * rs))
                guard.wait(fh.Iread_at_all(HEADER_SIZE + start * rs, self.shared[:there]),
                           leaders, "read dataset block")
                short = self.short_read(HEADER_SIZE + start * rs, HEADER_SIZE + stop * rs,
                                        fh.Get_size()) if stop > start else None
                guard.collective(leaders, "close dataset file", fh.Close)
                problem = short or self.changed() or label_problem(
                    self.path, self.shared[:there], self.header, start)
        guard.collective(node, "dataset window fence", self.window.Fence)
        self.agree_whole(problem)
        order = epoch_rng(self.seed, epoch, self.topology.node_id).permutation(stop - start)
        n, k = self.samples_per_rank, self.topology.local_rank
        records = self.shared[:nbytes].view(self.header.record_dtype)
        return EpochStream(*decode(records[order[k * n:(k + 1) * n]], self.header))

    def free(self) -> None:
        """Release the shared window and communicators (collective on the node)."""
        guard.collective(self.topology.node, "free dataset window", self.window.Free)
        if self.owns_topology:
            self.topology.free()


class StridedReader(Reader):
    """Baseline: the memory reader's samples, read one record per File.Read_at call."""

    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """Read this rank's samples at their scattered offsets, one call each."""
        return EpochStream(*decode(self.read_records(self.memory_order(epoch, batch_size)),
                                   self.header))

    def read_records(self, indices: np.ndarray) -> np.ndarray:
        """Raw bytes of the given records, one independent File.Read_at call per record."""
        rs = self.header.record_size
        raw = np.empty(len(indices) * rs, dtype=np.uint8)
        problem = self.changed()
        if problem is None and len(indices):
            fh = MPI.File.Open(MPI.COMM_SELF, self.path, MPI.MODE_RDONLY)
            try:
                for k, i in enumerate(indices):
                    fh.Read_at(HEADER_SIZE + int(i) * rs, raw[k * rs:(k + 1) * rs])
                last = HEADER_SIZE + (int(indices.max()) + 1) * rs
                problem = self.short_read(HEADER_SIZE + int(indices.min()) * rs, last,
                                          fh.Get_size())
            finally:
                fh.Close()
            problem = problem or self.changed() or label_problem(self.path, raw, self.header,
                                                                 indices)
        self.agree_whole(problem)
        return raw


def open_reader(kind: str, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                limit: int | None = None) -> Reader:
    """A reader by name: ``memory``, ``mpiio``, ``leader`` or ``strided``."""
    classes = {"memory": MemoryReader, "mpiio": MPIIOReader, "leader": LeaderReader,
               "strided": StridedReader}
    if kind not in classes:
        raise ValueError(f"reader: got {kind!r}, allowed: {', '.join(READERS)}")
    return classes[kind](path, comm, seed, limit)
