"""``ring``: reduce-scatter then allgather around a ring of the world's ranks.

Short on purpose: one textbook algorithm, written as the generator of its 2(p-1)
exchanges, so that its non-blocking form (``iallreduce(..., "ring")``, progressed by
``test()``) is the same code as the blocking one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp.comm.allreducers.base import TAG, FlatAllreduce, Waiting, chunk_bounds, exchange
from minidp.comm.network import ring_traffic


class RingAllreduce(FlatAllreduce):
    """Reduce-scatter then allgather around a ring, p-1 steps each.

    Pattern::

        step s of reduce-scatter: rank r sends chunk (r-s) to r+1, receives chunk (r-s-1)
        from r-1 and adds it; after p-1 steps rank r holds the full sum of chunk (r+1).
        allgather: the finished chunks travel p-1 steps further around the same ring.

    Each rank sends 2(p-1)/p of the buffer, in 2(p-1) messages; chunk sizes differ by
    at most one element, so any world size and buffer size work. Every exchange is an
    ``Irecv`` + ``Isend`` pair completed by guarded waits: a stopped neighbour is named
    after the timeout, and the label names both neighbours, so a rank two steps away
    from a stopped one finds it in what its own neighbour is waiting in.
    """

    name = "ring"
    started_name = "ring iallreduce"
    traffic = staticmethod(ring_traffic)

    def exchanges(self, buf: np.ndarray, comm: MPI.Comm, p: int, r: int) -> Iterator[Waiting]:
        """The 2(p-1) exchanges, each chunk added as soon as it has arrived."""
        b = chunk_bounds(buf.size, p)
        tmp = self.topology.workspace.scratch(self.name, b[1] - b[0] + 1, buf.dtype)
        right, left = (r + 1) % p, (r - 1) % p
        label = f"ring allreduce from rank {left} to rank {right}"
        arrows = self.topology.arrows  # each exchange's messages are the trace's arrows
        for step in range(p - 1):
            send, recv = (r - step) % p, (r - step - 1) % p
            n = b[recv + 1] - b[recv]
            yield from exchange(arrows, comm, buf[b[send]:b[send + 1]], right, tmp[:n], left,
                                TAG, label, f"chunk {send} to add")
            buf[b[recv]:b[recv + 1]] += tmp[:n]
        for step in range(p - 1):
            send, recv = (r + 1 - step) % p, (r - step) % p
            yield from exchange(arrows, comm, buf[b[send]:b[send + 1]], right,
                                buf[b[recv]:b[recv + 1]], left, TAG + 1, label,
                                f"summed chunk {send}")
