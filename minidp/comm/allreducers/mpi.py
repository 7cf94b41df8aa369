"""``mpi``: the MPI library's own allreduce on the world communicator, the reference.

Short on purpose: the algorithm is MPI's. What minidp adds is the guard (the request is
completed by a timed wait, so a rank that never arrives is named instead of hanging the
job) and the accounting: charged as a ring over the world's ranks, 2(N-1) messages and
2(N-1)/N of the bytes per rank (MPICH's choice for large buffers).

Where those bytes travel is MPI's choice, made inside the library by message size,
communicator and MPI's own idea of the nodes (one machine, for minidp's virtual
nodes), so minidp counts them by the ranks' nodes only where the nodes decide it: all
on one node, intra-node; every rank alone on its node, inter-node; otherwise under
``mpi``, a counter of their own, "MPI's algorithm, cannot be split" (docs/reporting.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp.comm.allreducers.base import FlatAllreduce, Waiting
from minidp.comm.network import ring_traffic


class MPIAllreduce(FlatAllreduce):
    """``Iallreduce(IN_PLACE, SUM)`` on the world, completed by a guarded wait.

    Pattern::

        1. world.Iallreduce(buffer): started now
        2. guard.wait: test() polls it, wait() blocks on it (naming missing ranks)
    """

    name = "mpi"
    started_name = "iallreduce"
    traffic = staticmethod(ring_traffic)

    def counted(self) -> str:
        """``intra``, ``inter``, or ``mpi`` where nodes hold several ranks and are several."""
        per_node = Counter(self.topology.nodes_of_ranks)
        if len(per_node) == 1:
            return "intra"
        return "inter" if max(per_node.values()) == 1 else "mpi"

    def exchanges(self, buf: np.ndarray, comm: MPI.Comm, p: int, r: int) -> Iterator[Waiting]:
        """One request: MPI's own (drawn as every rank's arrow into rank 0's slice)."""
        with self.topology.arrows.collective("world", "allreduce",
                                             self.traffic(p, buf.nbytes)[1]):
            request = comm.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
            yield Waiting(request, comm, self.started_name if self.started else "allreduce")
