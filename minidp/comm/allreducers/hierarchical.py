"""``hierarchical``: every local rank reduces one slice in shared memory; the rails go across.

The node level (:class:`NodeSlices`) is also ``node_allreduce`` on its own, and the rail
level (:class:`RailAllreduce`) is ``rail_allreduce`` / ``rail_iallreduce``
(:mod:`minidp.comm.levels`): one code for the whole and for each level.

Zero-copy when the buffer is a :class:`~minidp.comm.shared.NodeBuffer`: the node's
segments are summed where they lie. A plain array is copied into the workspace's
scratch window first and the result copied back out.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp.comm.allreducers.base import (
    IN_WAIT,
    AllreduceRequest,
    Buffer,
    Round,
    Waiting,
    as_array,
    chunk_bounds,
    node_bytes,
    node_window,
)
from minidp.comm.network import charged, ring_traffic
from minidp.comm.topology import Topology
from minidp.kernels.reduce import node_sum


class NodeSlices:
    """The node level: local rank k sums slice k of the node's segments into segment 0.

    Creating it puts the buffer in the node's window (its own, for a NodeBuffer; else
    copied into the scratch window).

    Args:
        buffer: this rank's buffer.
        topology: whose node reduces it.
    """

    def __init__(self, buffer: Buffer, topology: Topology) -> None:
        self.array = as_array(buffer)
        self.shared, self.zero_copy = node_window(buffer, topology)
        b = chunk_bounds(self.array.size, topology.local_size)
        self.mine = slice(b[topology.local_rank], b[topology.local_rank + 1])

    def sum_slice(self, copy_back: bool = False, mean_over: int = 1) -> np.ndarray:
        """Sync, then sum this rank's slice over the segments into row 0; returns that part.

        With ``copy_back`` (the sum is final: nothing to add across nodes) each block of
        the sum is also copied into the other rows while it is in cache; ``mean_over``
        other than 1 divides each block by it first (a mean, in the bits of a division
        afterwards, without another pass over the slice).
        """
        self.shared.sync()
        whole, mine = self.shared.whole, self.mine
        node_sum(whole, mine.start, mine.stop, mean_over, copy_back)  # in blocks, on the threads
        return whole[0, mine]

    def copy_back(self) -> None:
        """Copy this rank's finished slice (in row 0) into every other row."""
        whole = self.shared.whole
        for row in whole[1:, self.mine]:
            row[...] = whole[0, self.mine]

    def publish(self) -> None:
        """Sync: every segment holds the whole result; a plain array reads its copy back."""
        self.shared.sync()
        if not self.zero_copy:
            self.array[...] = self.shared.segment


def rail_communication(request: AllreduceRequest, part: np.ndarray) -> Iterator[Waiting]:
    """Sum ``part`` over this rank's rail (``cross.Iallreduce``); nothing on one node.

    Charged (as a part of ``request``) as a ring over the P nodes on the part: 2(P-1)
    messages, 2(P-1)/P of its bytes, as ``rail_allreduce`` (blocking) or
    ``rail iallreduce`` (started).
    """
    topology = request.topology
    if topology.num_nodes == 1:
        return
    traffic = ring_traffic(topology.num_nodes, part.nbytes)
    drawn = topology.arrows.collective("rail", "rail sum", traffic[1])
    with request.communication("inter", "rail_allreduce", "rail iallreduce", *traffic), drawn:
        summing = topology.cross.Iallreduce(MPI.IN_PLACE, part, op=MPI.SUM)
        yield Waiting(summing, topology.cross,
                      "rail iallreduce" if request.started else "rail allreduce")


class RailAllreduce(AllreduceRequest):
    """The buffer summed over this rank's rail only (its local rank on every node).

    Only the ranks of one rail take part; the other rails are free. A mean divides by
    the number of nodes. ``waits_as``: the phase of the started form's ``wait()``
    (``comm_inter`` for a send that is blocking but started early to overlap the
    caller's own work of the same batch).
    """

    name = "rail"

    def __init__(self, buffer: np.ndarray, topology: Topology, started: bool, op: str = "sum",
                 waits_as: str = "wait") -> None:
        self.waits_as = waits_as
        super().__init__(buffer, topology, started, op)

    def rounds(self) -> Iterator[Waiting]:
        """One ``Iallreduce`` on the rail; a mean divides by the P nodes."""
        yield from rail_communication(self, self.array)
        self.to_mean(self.array, self.topology.num_nodes)


class HierarchicalAllreduce(AllreduceRequest):
    """Every local rank reduces one slice; the rails reduce the slices in parallel.

    Pattern (N ranks: P nodes of G)::

        1. every rank's buffer is (or is copied into) its segment of the node window; sync
        2. local rank k sums slice k (1/G of the buffer) over the G segments into
           segment 0, block by block
        3. rail k (``cross``) allreduces slice k across the nodes: G rails at once
        4. a mean: local rank k divides slice k by N; it copies slice k into every
           other segment; sync; each rank has the result
        On one node step 2's sum is already the whole sum: each block is divided (a
        mean) and copied back while it is in cache, and step 4 is the sync alone.

    Steps 1-2 run at the start, step 3 in the background of a started form, step 4 in
    ``wait()`` (a node-wide sync: every rank of the node calls it). Charged per phase:
    ``node_reduce`` and ``node_broadcast`` intra (the node's bytes, no messages), the
    rail a ring over the P nodes on the slice.
    """

    name = "hierarchical"

    def rounds(self) -> Iterator[Round]:
        """Steps 1-4."""
        t, across = self.topology, self.topology.num_nodes > 1
        whole_mean = t.size if self.op == "mean" and not across else 1
        drawn = t.arrows.collective("node", "node sum", node_bytes(self.array, t))
        with charged("intra", "node_reduce", 0, node_bytes(self.array, t)), drawn:  # 1, 2
            slices = NodeSlices(self.buffer, t)
            part = slices.sum_slice(copy_back=not across, mean_over=whole_mean)
        if part.size:  # 3
            yield from rail_communication(self, part)
        yield IN_WAIT
        drawn = t.arrows.from_root("node", "node result", node_bytes(self.array, t))
        with charged("intra", "node_broadcast", 0, node_bytes(self.array, t)), drawn:  # 4
            if across:
                self.to_mean(part, t.size)
                slices.copy_back()
            slices.publish()
