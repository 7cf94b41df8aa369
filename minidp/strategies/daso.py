"""``daso``: Distributed Asynchronous and Selective Optimization (Coquelin et al., 2022).

Follows Heat's ``heat.optim.DASO`` (the paper's reference code) epoch by epoch and batch
by batch: node-local blocking gradient averaging, a global non-blocking parameter
average on one rail at a time, merged S batches later with a staleness weight, and a
schedule that stretches the interval between global syncs when the loss plateaus.
What is decided when lives in :mod:`minidp.strategies.daso_schedule`; this file carries
it out. Deviations are listed in docs/daso.md.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import numpy as np

from minidp.comm import node_allreduce, node_broadcast, rail_allreduce, rail_iallreduce
from minidp.comm.allreduce import AllreduceRequest
from minidp.optim.schedules import Schedule
from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso_schedule import BatchSchedule, DASOSchedule, Merge, Send
from minidp.trace import tracer


def downcast(x: np.ndarray, kind: str) -> np.ndarray:
    """Round ``x`` to bfloat16 or float16 precision, kept in x's dtype (an emulation).

    NumPy has no bfloat16 and MPI no half-precision sum, so the precision loss of Heat's
    down-cast is reproduced (round to nearest even on the top 16 bits of float32), not
    its bandwidth saving.
    """
    if kind == "none":
        return x
    if kind == "fp16":
        return x.astype(np.float16).astype(x.dtype)
    bits = x.astype(np.float32).view(np.uint32)
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) \
        & np.uint32(0xFFFF0000)
    return rounded.view(np.float32).astype(x.dtype)


class DASO(Strategy):
    """Node-local synchronous SGD, global parameter averaging over one rail at a time.

    Per batch b, the :class:`BatchPlan` of :class:`BatchSchedule` says what happens,
    in this order (P nodes, G ranks per node, rail k = local rank k on every node)::

        0. node sync (if on): node allreduce(grad, mean) in shared memory; then the
           local update
        1. send: the ranks of rail k copy x into a send buffer (down-cast while B < 1)
           and start rail.Iallreduce(sum) across the P nodes (a blocking one:
           rail.Allreduce); the other rails rest
        2. merge, on the ranks of the rail of the sync in flight: wait for it, then
           x = (w x + sum) / (w + P), w = 2 x the send's wait (1 if that is not
           positive), sum: the nodes' parameters at send time
        3. node.Bcast(x, root = that rail): the node is equal again
        4. if the send is blocking (S == 0, and every epoch's last batch): on rail k
           x = sum / P, then node.Bcast(x, root=k): every rank of the world is equal

    Ranks wait at node reductions and broadcasts, at blocking sends, and at a merge only
    for what the network has not finished since the send. Every action is recorded in
    the trace as an instant event ``daso <action>`` (epoch, batch and its numbers), on
    every rank, so a run's decisions can be read back and checked against Heat's.
    When things happen is the plan's alone; which ranks carry a sum is decided only in
    ``_send``, ``_merge`` and ``_average``.

    The schedule (:class:`DASOSchedule`) runs warm-up and cool-down epochs with
    B = S = L = 0, i.e. blocking parameter averaging every batch, which with linear
    local optimizers equals synchronous SGD. One node (P = 1): there is no one to
    average with, and Heat's merge would pull towards a stale copy of the node's own
    parameters, so minidp skips the global level and syncs the node every batch
    (= synchronous SGD).
    """

    name = "daso"
    options = {
        "warmup_epochs": Option(4, int, "an int >= 0", lambda v: v >= 0,
                                "epochs of blocking sync at the start (0: Heat never cycles)"),
        "cooldown_epochs": Option(4, int, "an int >= 0", lambda v: v >= 0,
                                  "epochs of blocking sync at the end"),
        "max_global_skips": Option(8, int, "an int >= 1", lambda v: v >= 1,
                                   "B after a plateau at B = 1"),
        "skip_reduction_factor": Option(2, int, "an int >= 2", lambda v: v >= 2,
                                        "B and L are divided by this on a plateau"),
        "local_skip_factor": Option(4, int, "an int >= 1", lambda v: v >= 1,
                                    "S = L = B // this when B is reset"),
        "stability_level": Option(0.05, float, "a float in [0, 1)", lambda v: 0 <= v < 1,
                                  "relative loss improvement below which a plateau counts"),
        "patience": Option(2, int, "an int >= 0", lambda v: v >= 0,
                           "bad epochs tolerated before a plateau is declared"),
        "staleness_weight": Option(2.0, float, "a float > 0", lambda v: v > 0,
                                   "weight 2 in (2S x + sum) / (2S + P)"),
        "downcast": Option("none", str, "'none', 'bf16' or 'fp16'",
                           lambda v: v in ("none", "bf16", "fp16"),
                           "precision of the global syncs while B < 1"),
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()
        # Two, because a send may start while the previous sync is still in flight.
        self.buffers = [np.empty_like(self.flat.data), np.empty_like(self.flat.data)]
        self.schedule = DASOSchedule(total_epochs=1, **self._schedule_options())
        self.batch_schedule = BatchSchedule(self.topology.local_size,
                                            self.config["staleness_weight"])
        # This rank's started syncs, oldest first (only on the ranks of their rail);
        # a blocking one is finished at its send (no request) and averaged after the merge.
        self.in_flight: deque[tuple[AllreduceRequest | None, np.ndarray]] = deque()

    def _schedule_options(self) -> dict[str, Any]:
        names = ("warmup_epochs", "cooldown_epochs", "max_global_skips", "skip_reduction_factor",
                 "local_skip_factor", "stability_level", "patience")
        return {n: self.config[n] for n in names}

    def plan(self, total_epochs: int, base_batch: int = 1,
             lr_schedule: Schedule | None = None) -> None:
        """Known total epochs place the cool-down (Heat needs them too)."""
        super().plan(total_epochs, base_batch, lr_schedule)
        self.schedule = DASOSchedule(total_epochs=total_epochs, **self._schedule_options())

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Hand this epoch's (B, S, L) and length to the batch schedule."""
        super().begin_epoch(epoch, batches)
        self.batch_schedule.begin_epoch(self.schedule.values, batches)

    def step(self, batch: int) -> None:
        """Node sync and local update, then the batch's global send, merge and broadcasts."""
        self.steps += 1
        if self.topology.num_nodes == 1:
            node_allreduce(self.flat.grad, self.topology, op="mean")
            self.optimizer_step()
            return
        plan = self.batch_schedule.plan(batch)
        if plan.node_sync:
            self._record(batch, "node sync")
            node_allreduce(self.flat.grad, self.topology, op="mean")
        self.optimizer_step()
        if plan.send:
            self._send(batch, plan.send)
        if plan.merge:
            self._merge(batch, plan.merge)
        if plan.broadcast is not None:
            self._broadcast(batch, plan.broadcast)
        if plan.send and plan.send.blocking:
            self._average(batch, plan.send)
        if plan.rails_reset:
            self._record(batch, "rails reset")

    def _record(self, batch: int, action: str, **numbers: Any) -> None:
        tracer().mark(f"daso {action}", epoch=self.epoch, batch=batch, **numbers)

    def _send(self, batch: int, send: Send) -> None:
        """Start the sum over the nodes of rail ``send.rail``'s parameters."""
        self._record(batch, "send", rail=send.rail, wait=send.wait, cast=send.cast)
        if self.topology.local_rank != send.rail:
            return
        self.buffers.reverse()  # the other buffer may hold the sync still in flight
        buffer = self.buffers[0]
        buffer[...] = downcast(self.flat.data, self.config["downcast"]) if send.cast \
            else self.flat.data
        if send.blocking:
            rail_allreduce(buffer, self.topology, op="sum")
            self.in_flight.append((None, buffer))
        else:
            self.in_flight.append((rail_iallreduce(buffer, self.topology, op="sum"), buffer))

    def _merge(self, batch: int, merge: Merge) -> None:
        """Weigh the current parameters against the nodes' sum from the send."""
        self._record(batch, "merge", rail=merge.rail, weight=merge.weight)
        if self.topology.local_rank != merge.rail:
            return
        request, total = self.in_flight.popleft()
        request.wait()
        x = self.flat.data
        x *= merge.weight
        x += total
        x /= merge.weight + self.topology.num_nodes

    def _broadcast(self, batch: int, root: int) -> None:
        self._record(batch, "broadcast", root=root)
        node_broadcast(self.flat.data, self.topology, root=root)

    def _average(self, batch: int, send: Send) -> None:
        """Finish a blocking sync: the nodes' mean on its rail, then in every node."""
        self._record(batch, "average", rail=send.rail)
        if self.topology.local_rank == send.rail:
            _, total = self.in_flight.popleft()
            # Heat sums and divides in the sent precision: the mean is rounded once more.
            kind = self.config["downcast"] if send.cast else "none"
            self.flat.data[...] = downcast(downcast(total, kind) / self.topology.num_nodes,
                                           kind)
        self._broadcast(batch, send.rail)
        self.check_finite()

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Feed the epoch's loss to the schedule, which sets the next epoch's (B, S, L)."""
        self.schedule.update(epoch + 1, train_loss)

    def epoch_stats(self) -> dict[str, Any]:
        """The (B, S, L) the epoch just ended ran with (``minidp report`` plots them)."""
        b, s, l_ = self.batch_schedule.values
        return {"global_skip": b, "batches_to_wait": s, "local_skip": l_}

    def state_dict(self) -> dict:
        """Both schedules (nothing is in flight at an epoch's end: its last sync blocks)."""
        return dict(super().state_dict(), schedule=self.schedule.state_dict(),
                    batch_schedule=self.batch_schedule.state_dict())

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""
        super().load_state_dict(state)
        self.schedule.load_state_dict(state["schedule"])
        self.batch_schedule.load_state_dict(state["batch_schedule"])
