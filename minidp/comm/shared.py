"""SharedArray: a NumPy view over a node's ``MPI.Win.Allocate_shared`` window.

Each local rank owns one segment of ``segment_size`` elements; MPI lays the segments
out contiguously in rank order, so ``whole`` (shape ``(G, segment_size)``) addresses
every segment of the node and ``segment`` is this rank's row.

Synchronisation (MPI-3 shared memory, unified model): the window is kept in one
passive-target epoch (``Lock_all`` at creation). :meth:`sync` is the standard
``Win.Sync`` / node barrier / ``Win.Sync`` sequence (the barrier times out naming
the ranks that never arrived, :mod:`minidp.comm.guard`): every store made before it by
any rank of the node is visible to every rank after it. Writers and readers of a
region must always be separated by a sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm import guard


class SharedArray:
    """Node-shared memory with one segment per local rank.

    Args:
        node: a communicator whose ranks share memory (``Topology.node``).
        segment_size: elements per rank.
        dtype: element type.
    """

    def __init__(self, node: MPI.Comm, segment_size: int, dtype: Any = np.float32) -> None:
        if not isinstance(segment_size, (int, np.integer)) or segment_size < 0:
            raise ValueError(f"segment_size: got {segment_size!r}, allowed: an int >= 0")
        self.node, self.dtype = node, np.dtype(dtype)
        self.segment_size = int(segment_size)
        itemsize = self.dtype.itemsize
        # Allocate at least one element so every rank has a valid base address.
        self.window = guard.collective(node, "allocate shared window", MPI.Win.Allocate_shared,
                                       max(self.segment_size, 1) * itemsize, itemsize,
                                       comm=node)
        base, _ = self.window.Shared_query(0)
        rows, stride = node.Get_size(), max(self.segment_size, 1)
        # Shared_query gives rank 0's segment only; the segments are contiguous, so the
        # whole window is the memory from that address on.
        whole = MPI.buffer.fromaddress(base.address, rows * stride * itemsize)
        self._whole = np.ndarray(buffer=whole, dtype=self.dtype, shape=(rows, stride))
        self._whole = self._whole[:, :self.segment_size]
        self.window.Lock_all()
        self._freed = False

    def _check(self) -> None:
        if self._freed:
            raise RuntimeError("SharedArray: used after free()")

    @property
    def whole(self) -> np.ndarray:
        """All segments of the node, shape (local_size, segment_size)."""
        self._check()
        return self._whole

    @property
    def segment(self) -> np.ndarray:
        """This rank's segment."""
        self._check()
        return self._whole[self.node.Get_rank()]

    def sync(self) -> None:
        """Make every rank's earlier stores visible to every rank of the node."""
        self._check()
        self.window.Sync()
        guard.barrier(self.node, "shared-memory sync")
        self.window.Sync()

    def free(self) -> None:
        """Release the window (collective on the node); later use is a RuntimeError."""
        if self._freed:
            return
        self.window.Unlock_all()
        guard.collective(self.node, "free shared window", self.window.Free)
        self._freed = True
