"""Allreduce of a flat float buffer, five ways, one file each, selectable by name.

``allreduce(buffer, topology, algorithm, op)`` reduces ``buffer`` in place on every
rank (``op`` "sum" or "mean"); ``iallreduce`` starts the same and returns the request
whose ``wait()`` completes it. Both are one code: ``allreduce(...)`` is
``Algorithm(...).wait()`` with nothing in between, creating the request being its start
(:mod:`.base` says how an algorithm is written as a generator of the requests it waits
for).

======================  ===============================================  ==============
algorithm               pattern                                          file
======================  ===============================================  ==============
``mpi``                 MPI's own ``Iallreduce`` on the world            ``mpi.py``
``ring``                reduce-scatter + allgather, 2(p-1) exchanges     ``ring.py``
``recursive_doubling``  whole buffers at distance 1, 2, 4, ...           ``recursive_doubling.py``
``hierarchical_leader`` leader sums the node, leaders allreduce          ``hierarchical_leader.py``
``hierarchical``        local rank k sums slice k, rail k across nodes   ``hierarchical.py``
======================  ===============================================  ==============

Every call is accounted and, across nodes, charged by the network model
(:mod:`minidp.comm.network`): the flat algorithms as a whole at the world's level, the
hierarchical ones per phase (node phases intra, rails inter). Scratch arrays and
windows are the topology's :class:`~minidp.comm.shared.Workspace`, so a training loop
allocates nothing per call. A :class:`~minidp.comm.shared.NodeBuffer`
(:func:`shared_buffer`) is reduced by the hierarchical algorithms where it lies, in the
node's window, without any copy; a plain array is copied in and out.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidp.comm import guard
from minidp.comm.allreducers.base import (
    OPS,
    AllreduceRequest,
    Buffer,
    as_array,
    chunk_bounds,
    shared_buffer,
)
from minidp.comm.allreducers.hierarchical import HierarchicalAllreduce
from minidp.comm.allreducers.hierarchical_leader import HierarchicalLeaderAllreduce
from minidp.comm.allreducers.mpi import MPIAllreduce
from minidp.comm.allreducers.recursive_doubling import RecursiveDoublingAllreduce
from minidp.comm.allreducers.ring import RingAllreduce
from minidp.comm.shared import NodeBuffer
from minidp.comm.topology import Topology

ALGORITHMS: dict[str, type[AllreduceRequest]] = {
    cls.name: cls for cls in (MPIAllreduce, RingAllreduce, RecursiveDoublingAllreduce,
                              HierarchicalLeaderAllreduce, HierarchicalAllreduce)}
ALLREDUCE_ALGORITHMS = tuple(ALGORITHMS)

__all__ = ["ALGORITHMS", "ALLREDUCE_ALGORITHMS", "OPS", "AllreduceRequest", "Buffer",
           "NodeBuffer", "allreduce", "check_buffer", "chunk_bounds", "iallreduce",
           "shared_buffer"]


def check_buffer(buffer: Any, algorithm: str, op: str, rank: int) -> np.ndarray:
    """Raise (naming the rank) unless algorithm, op and buffer are ones allreduce takes.

    Returns the buffer's array (a NodeBuffer's segment).
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"rank {rank}: allreduce algorithm {algorithm!r}, allowed: "
                         f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    if op not in OPS:
        raise ValueError(f"rank {rank}: allreduce op {op!r}, allowed: {', '.join(OPS)}")
    array = as_array(buffer)
    if not isinstance(array, np.ndarray) or array.ndim != 1 or \
            not array.flags.c_contiguous or array.dtype.kind != "f":
        raise TypeError(f"rank {rank}: allreduce buffer must be a contiguous 1-D float NumPy "
                        f"array or a NodeBuffer, got {type(array).__name__} "
                        f"{getattr(array, 'shape', '')} {getattr(array, 'dtype', '')}")
    return array


def allreduce(buffer: Buffer, topology: Topology, algorithm: str = "hierarchical",
              op: str = "sum", check_finite: bool = False) -> np.ndarray:
    """Reduce ``buffer`` in place over all ranks of ``topology.world``; returns its array.

    Args:
        buffer: a contiguous 1-D float array, or a NodeBuffer (zero-copy in the node).
        topology: the world and its nodes.
        algorithm: one of ``ALLREDUCE_ALGORITHMS``.
        op: "sum" or "mean".
        check_finite: raise FloatingPointError unless the result is all finite.
    """
    array = check_buffer(buffer, algorithm, op, topology.rank)
    guard.check_same(topology.world, f"allreduce {algorithm} {op}", array)
    return ALGORITHMS[algorithm](buffer, topology, False, op, check_finite).wait()


def iallreduce(buffer: Buffer, topology: Topology, algorithm: str = "hierarchical",
               op: str = "sum") -> AllreduceRequest:
    """Start a non-blocking allreduce of ``buffer`` by any algorithm; ``wait()`` ends it.

    The work that can be done now is done now (for ``hierarchical``, the node's slice
    sums), the rest progresses in ``test()`` and completes in ``wait()``. The buffer
    must not be touched until ``wait()``, which every rank of the world calls.

    Until then the operation holds its algorithm's scratch and tags on the topology:
    start no other operation of the same algorithm there, and no hierarchical reduction
    of a plain array of the same size and dtype (those share the scratch window).
    Operations of different algorithms may be in flight together.
    """
    array = check_buffer(buffer, algorithm, op, topology.rank)
    guard.check_same(topology.world, f"iallreduce {algorithm} {op}", array)
    return ALGORITHMS[algorithm](buffer, topology, True, op)
