"""What every reader of an .mdp file shares: the header's checks, the epoch's stream, the order.

A reader (one per file of this package) gives this rank's samples of an epoch as an
:class:`EpochStream`; the base :class:`Reader` checks the header and the sample limit
on every rank, counts batches, and holds the one order every reader derives its own
from (:meth:`Reader.memory_order`, :func:`epoch_rng`: a function of the seed and the
epoch only). The helpers here are what more than one reader does: split the records
into contiguous blocks (:func:`block_range`), open the file for collective block reads
(:func:`open_for_blocks`), agree on a problem so that it is one error on every rank
(:func:`first_problem`, :meth:`Reader.agree_whole`), and check a file's payload
checksum collectively, each rank its block (:func:`verify_checksum`).
"""

from __future__ import annotations

import abc
from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp import backend
from minidp.comm import guard
from minidp.io.filesystem import changed, open_regular, unreadable
from minidp.io.mdp import (
    HEADER_SIZE,
    Header,
    add_checksums,
    checksum,
    checksum_mismatch,
    open_header,
)

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


def first_problem(comm: MPI.Comm, problem: str | None, operation: str) -> str | None:
    """The first rank's problem of ``comm`` (in rank order), the same on every rank, or None.

    ``operation`` names the step on the status board (a rank that never comes is named).
    """
    problems = [p for p in guard.allgather_object(comm, problem, operation) if p]
    return problems[0] if problems else None


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

    def iterate(self, epoch: int, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
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
