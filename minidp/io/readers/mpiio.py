"""``mpiio`` (the default): contiguous blocks read with collective MPI-IO, rotating every epoch.

The records are split into R contiguous blocks, sizes differing by at most one; in epoch
e rank r reads block (r + e) mod R, so over R epochs every rank reads every block once.
A block is read with collective reads (``File.Iread_at_all``, the non-blocking
``Read_at_all``, completed by a timed wait that names a missing rank) of at most
``max_bytes`` each (one read when the block fits), shuffled inside each piece, pieces in
a shuffled order; without ROMIO's collective buffering
(:func:`~minidp.io.readers.base.open_for_blocks`). Every rank uses floor(N/R) samples
per epoch (the remainder record of larger blocks is dropped), so batch counts are equal.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.io.mdp import HEADER_SIZE, decode, label_problem
from minidp.io.readers.base import (
    EpochStream,
    Reader,
    block_range,
    epoch_rng,
    first_problem,
    open_for_blocks,
)


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
