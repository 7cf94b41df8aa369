"""Everything that calls MPI for training: topology, shared memory, collectives, messages.

Point-to-point messages are a module of their own: ``minidp.comm.p2p.send(...)``. The
collectives a strategy's step calls by name (``world_mean``, ``node_mean``, ``rail_sum``,
``rail_sum_start``, ...) are in :mod:`minidp.comm.levels`. ``allreduce`` itself defaults
to the ``hierarchical`` algorithm; ``sync`` passes its ``--allreduce``, whose default is
``mpi`` (docs/sync.md).
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
    node_mean,
    node_slice_mean,
    node_sync,
    rail_allreduce,
    rail_iallreduce,
    rail_mean,
    rail_sum,
    rail_sum_start,
    world_max,
    world_mean,
)
from minidp.comm.network import NetworkModel, set_network_model
from minidp.comm.shared import NodeBuffer, SharedArray
from minidp.comm.topology import Communicator, Topology, mpi_library, versions

__all__ = ["ALLREDUCE_ALGORITHMS", "AllreduceRequest", "Communicator", "NetworkModel",
           "NodeBuffer", "SharedArray", "Topology", "allreduce", "broadcast",
           "broadcast_object", "iallreduce", "mpi_library", "node_allreduce", "node_broadcast",
           "node_mean", "node_slice_mean", "node_sync", "p2p", "rail_allreduce", "rail_iallreduce",
           "rail_mean", "rail_sum", "rail_sum_start", "set_network_model", "shared_buffer",
           "versions", "world_max", "world_mean"]
