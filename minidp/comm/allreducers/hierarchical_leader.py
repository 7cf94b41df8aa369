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

from minidp.comm.allreducers.base import (
    IN_WAIT,
    AllreduceRequest,
    Round,
    Waiting,
    node_bytes,
    node_window,
)
from minidp.comm.network import charged, ring_traffic


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
    background of a started form, the rest in ``wait()`` (a node-wide sync); a mean
    divides every rank's result by the N ranks. Charged: ``node_reduce`` and
    ``node_broadcast`` intra, the leaders a ring over the P nodes on the whole buffer.
    """

    name = "hierarchical_leader"

    def rounds(self) -> Iterator[Round]:
        """Steps 1-3."""
        buf, t = self.array, self.topology
        drawn = t.arrows.collective("node", "node buffer", node_bytes(buf, t))
        with charged("intra", "node_reduce", 0, node_bytes(buf, t)), drawn:  # 1
            shared, zero_copy = node_window(self.buffer, t)
            shared.sync()
        leads = t.is_leader and buf.size > 0
        if leads:  # 2: the leader's sum, the leaders' allreduce
            total = t.workspace.scratch(self.name, buf.size, buf.dtype)
            sum_rows(shared.whole, total)
            if t.num_nodes > 1:
                traffic = ring_traffic(t.num_nodes, buf.nbytes)
                drawn = t.arrows.collective("leaders", "node sum", traffic[1])
                with self.communication("inter", "leaders_allreduce", "leaders iallreduce",
                                        *traffic), drawn:
                    request = t.leaders.Iallreduce(MPI.IN_PLACE, total, op=MPI.SUM)
                    yield Waiting(request, t.leaders,
                                  "leaders iallreduce" if self.started else "leaders allreduce")
        yield IN_WAIT
        if leads:  # 2: the leader writes the sum into every segment
            shared.whole[...] = total
        drawn = t.arrows.from_root("node", "node result", node_bytes(buf, t))
        with charged("intra", "node_broadcast", 0, node_bytes(buf, t)), drawn:  # 3
            shared.sync()
            if not zero_copy:
                buf[...] = shared.segment
        self.to_mean(buf, t.size)
