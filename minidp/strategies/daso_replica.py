"""DASO's identical node: one copy of the model per node, each rank carrying its slice.

An optimisation of :class:`~minidp.strategies.daso.DASO` with ``global_sync=all`` (the
default) on nodes of two or more ranks, with the same bits as the per-rank path; read
``DASO.step`` for the algorithm, and this file for what a node whose ranks agree can
skip. From the start until the first batch without the node's gradient sync, every rank
of a node holds the same parameters and momentum (they started equal, and every update
since took the same averaged gradient). Then G copies are one too many: the node keeps
one replica in two node windows (parameters, momentum) and local rank j carries out
DASO's phases on slice j of it, where the per-rank path has every rank do them on all
of x and then broadcast:

==========================  ============================================  ================
phase                       per rank (``DASO.step``)                       replica
==========================  ============================================  ================
0. node sync, update        node_mean(grad); every rank steps all of x     rank j: slice j
                                                                           of the mean
                                                                           (node_slice_mean),
                                                                           steps slice j
1. send                     rank k (or j: slice j) copies x into the       rank j's step
                            window, one sync                               goes there
2. merge                    rank k merges all of x from the window         rank j: slice j
3. node broadcast           node_broadcast(x, root k)                      nothing to send
4. blocking average         every rank divides the sum into all of x       rank j: slice j
==========================  ============================================  ================

One shared-memory sync at the batch's end shows every rank the whole x before its next
forward. The first batch without node sync ends it (:meth:`NodeReplica.engage`): the
model moves back into each rank's own arrays, and the momenta part from there.
"""

from __future__ import annotations

from minidp.comm import SharedArray, node_slice_mean, node_sync
from minidp.strategies.base import Strategy
from minidp.strategies.daso_schedule import BatchPlan
from minidp.trace import tracer


class NodeReplica:
    """The node's one replica of DASO's model, while the node's ranks are identical.

    Args:
        daso: the :class:`~minidp.strategies.daso.DASO` whose model, optimizer and
            syncs in flight it works with (its phases' helpers: ``next_window``,
            ``start_sum``, ``take_oldest``, ``merge``, ``mean_into``, ``record``).
    """

    def __init__(self, daso: Strategy) -> None:
        t, n = daso.topology, daso.flat.size
        self.daso = daso
        # Row 0 of each: the parameters, and the momentum.
        self.windows = (SharedArray(t.node, n, daso.flat.data.dtype),
                        SharedArray(t.node, n, daso.optimizer.state.dtype))
        self.private = (daso.flat.data, daso.optimizer.state)

    @property
    def shared(self) -> bool:
        """Whether the model's parameters are now the node's one replica."""
        return self.daso.flat.data is not self.private[0]

    def engage(self, identical: bool) -> bool:
        """Share the replica while the node is ``identical``, unshare once it is not.

        Returns whether this batch runs on the replica.
        """
        if identical and not self.shared:
            self._share()
        elif not identical and self.shared:
            self._unshare()
        return self.shared

    def _share(self) -> None:
        """Make the node's one replica the model's: local rank 0's values, one sync."""
        d = self.daso
        x, momentum = (shared.whole[0] for shared in self.windows)
        if d.topology.local_rank == 0:
            x[...] = d.flat.data
            momentum[...] = d.optimizer.state
        self.windows[0].sync(self.windows[1])
        d.flat.rebind_data(x)
        d.optimizer.rebind_state(momentum)

    def _unshare(self) -> None:
        """Back to a replica per rank (the momenta are about to differ): copies, no sync.

        The last replica step ended in a sync, after which no rank writes the windows.
        """
        d = self.daso
        x, momentum = self.private
        x[...] = d.flat.data
        momentum[...] = d.optimizer.state
        d.flat.rebind_data(x)
        d.optimizer.rebind_state(momentum)

    def step(self, batch: int, plan: BatchPlan) -> None:
        """A node-synced batch of the node's one replica: each rank carries its slice j.

        Local rank j averages slice j of the gradients (``node_slice_mean``: one sync),
        steps slice j of the parameters and momentum, sends slice j on rail j (a
        blocking send's step goes straight into the window), merges and averages slice
        j from its own rail's sum (no window sync: nobody reads another rank's part),
        and one sync at the end shows every rank the whole x before its next forward;
        it is also the sync ``node_slice_mean`` asks for before the gradients are
        written again. Bit for bit what every rank computes on its own replica in the
        full path: the same operations on each element.
        """
        d = self.daso
        part, mean = node_slice_mean(d.grad_buffer, d.topology)  # 0. slice j of the mean
        x, send, sent = d.flat.data[part], plan.send, None
        if send:
            d.record(batch, "send", rail=send.rail, wait=send.wait, cast=send.cast)
            window = d.next_window()
            sent = window.whole[0, part]
        with tracer().phase("optimizer"):
            d.optimizer.update(mean, part, out=sent if send and send.blocking else None)
        if send:  # 1. slice j on rail j (a blocking send's step is in the window already)
            if not send.blocking:
                sent[...] = x
            d.start_sum(sent, send, window)
        if plan.merge:  # 2. slice j of x against slice j of the sum
            d.merge(batch, plan.merge, part)
        if plan.broadcast is not None:  # 3. one replica: there is nothing to broadcast
            d.record(batch, "broadcast", root=plan.broadcast)
        if send and send.blocking:  # 4. slice j of x = slice j of the sum / P
            d.record(batch, "average", rail=send.rail)
            d.mean_into(d.take_oldest().whole[0, part], send, out=x)
            d.record(batch, "broadcast", root=send.rail)  # Heat's, needless here
            d.check_finite(x)
        # The momentum's window too: _unshare reads it.
        node_sync(*self.windows, what="replica_sync", topology=self.daso.topology)
