"""``mpi``: the MPI library's own allreduce on the world communicator, the reference.

Short on purpose: the algorithm is MPI's. What minidp adds is the guard (the request is
completed by a timed wait, so a rank that never arrives is named instead of hanging the
job) and the accounting: charged as a ring over the world's ranks, 2(N-1) messages and
2(N-1)/N of the bytes per rank (MPICH's choice for large buffers).
"""

from __future__ import annotations

from collections.abc import Iterator

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

    def communicate(self) -> Iterator[Waiting]:
        """One request: MPI's own."""
        world = self.topology.world
        with self.whole():
            request = world.Iallreduce(MPI.IN_PLACE, self.array, op=MPI.SUM)
            yield Waiting(request, world, self.started_name if self.started else "allreduce")
