"""Everything that calls MPI for training: topology, shared memory, collectives."""

from minidp.comm.allreduce import (
           ALLREDUCE_ALGORITHMS,
           AllreduceRequest,
           allreduce,
           iallreduce,
           shared_buffer,
)
from minidp.comm.shared import SharedArray
from minidp.comm.topology import Topology

__all__ = ["ALLREDUCE_ALGORITHMS", "AllreduceRequest", "SharedArray", "Topology", "allreduce",
           "iallreduce", "shared_buffer"]
