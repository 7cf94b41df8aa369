"""Everything that calls MPI for training: topology, shared memory, collectives, messages.

Point-to-point messages are a module of their own: ``minidp.comm.p2p.send(...)``.
"""

from minidp.comm import p2p
from minidp.comm.allreducers import (
    ALLREDUCE_ALGORITHMS,
    AllreduceRequest,
    allreduce,
    iallreduce,
    shared_buffer,
)
from minidp.comm.levels import (
    broadcast,
    broadcast_object,
    node_allreduce,
    node_broadcast,
    rail_allreduce,
    rail_iallreduce,
    world_max,
)
from minidp.comm.network import NetworkModel, set_network_model
from minidp.comm.shared import NodeBuffer, SharedArray
from minidp.comm.topology import Communicator, Topology, mpi_library, versions

__all__ = ["ALLREDUCE_ALGORITHMS", "AllreduceRequest", "Communicator", "NetworkModel",
           "NodeBuffer", "SharedArray", "Topology", "allreduce", "broadcast",
           "broadcast_object", "iallreduce", "mpi_library", "node_allreduce", "node_broadcast",
           "p2p", "rail_allreduce", "rail_iallreduce", "set_network_model", "shared_buffer",
           "versions", "world_max"]
