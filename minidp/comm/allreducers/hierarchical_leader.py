"""``hierarchical_leader``: the node's leader sums, the leaders allreduce, the leader writes back.

Short on purpose, and kept for teaching: the two-level idea at its plainest, where one
rank per node does all of the node's work. ``hierarchical`` spreads that work over every
local rank and is faster. Zero-copy for a :class:`~minidp.comm.shared.NodeBuffer`, like
``hierarchical``.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp.comm.allreducers.base import AllreduceRequest, Waiting, node_bytes, node_window
from minidp.comm.network import charged, ring_traffic
from minidp.comm.shared import SharedArray


def sum_rows(rows: np.ndarray, out: np.ndarray) -> None:
    """Sum the rows into out with contiguous adds (faster than a strided reduce)."""
    np.copyto(out, rows[0])
    for row in rows[1:]:
        out += row


class HierarchicalLeaderAllreduce(AllreduceRequest):
    """Leader-only two-level reduction.

    Pattern::

        1. every rank's buffer is (or is copied into) its segment of the node window; sync
        2. the leader sums the G segments, allreduces the sum over ``leaders``, and
           writes the result into every segment; sync
        3. every rank reads its own segment

    Step 1 and the leader's sum run at the start, the leaders' ``Iallreduce`` in the
    background of a started form, the rest in ``wait()`` (a node-wide sync). Charged:
    ``node_reduce`` and ``node_broadcast`` intra, the leaders a ring over the P nodes on
    the whole buffer.
    """

    name = "hierarchical_leader"
    shared: SharedArray  # the node window the buffer is reduced in
    zero_copy: bool  # whether that is the NodeBuffer's own window
    total: np.ndarray  # the leader's sum of the node's segments

    def communicate(self) -> Iterator[Waiting]:
        """Step 1, then (leader) the sum and the leaders' allreduce of step 2."""
        buf, topology = self.array, self.topology
        with charged("intra", "node_reduce", 0, node_bytes(buf, topology)):
            self.shared, self.zero_copy = node_window(self.buffer, topology)
            self.shared.sync()
        if not (topology.is_leader and buf.size):
            return
        self.total = topology.workspace.scratch(self.name, buf.size, buf.dtype)
        sum_rows(self.shared.whole, self.total)
        if topology.num_nodes > 1:
            with self.communication(
                    "inter", "leaders_allreduce", "leaders iallreduce",
                    *ring_traffic(topology.num_nodes, buf.nbytes)):
                request = topology.leaders.Iallreduce(MPI.IN_PLACE, self.total, op=MPI.SUM)
                yield Waiting(request, topology.leaders,
                              "leaders iallreduce" if self.started else "leaders allreduce")

    def finish(self) -> None:
        """The leader's write-back of step 2; sync; step 3."""
        if self.topology.is_leader and self.array.size:
            self.shared.whole[...] = self.total
        with charged("intra", "node_broadcast", 0, node_bytes(self.array, self.topology)):
            self.shared.sync()
            if not self.zero_copy:
                self.array[...] = self.shared.segment
