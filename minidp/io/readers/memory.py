"""``memory``: the whole set on every rank, one global permutation per epoch.

Rank r takes slice r of every global batch, so N ranks with batch b see, concatenated
in rank order, exactly the batches of 1 rank with batch N*b (:meth:`Reader.memory_order`):
what lets ``sync`` on N ranks be checked against one rank with an N times larger batch.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidp.io.filesystem import changed, open_regular, stamp_of, unreadable
from minidp.io.mdp import HEADER_SIZE, decode, label_problem
from minidp.io.readers.base import EpochStream, Reader


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
