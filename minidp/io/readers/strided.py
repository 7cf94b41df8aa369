"""``strided``: the naive baseline, one record per ``File.Read_at`` at scattered offsets.

This rank's samples of the ``memory`` order, each read on its own with an independent
``File.Read_at`` on ``COMM_SELF``: what a reader that ignores the file's layout does.
Kept to be measured against (``benchmarks/bench_io.py``).
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidp.io.mdp import HEADER_SIZE, decode, label_problem
from minidp.io.readers.base import EpochStream, Reader


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
