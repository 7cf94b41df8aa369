"""``daso``: Distributed Asynchronous and Selective Optimization (Coquelin et al., 2022).

Follows Heat's ``heat.optim.DASO`` (the paper's reference code) epoch by epoch and batch
by batch: node-local blocking gradient averaging, a global non-blocking parameter
average started every B batches, merged S batches later with a staleness weight, and a
schedule that stretches the interval between global syncs when the loss plateaus.
What is decided when lives in :mod:`minidp.strategies.daso_schedule`; this file carries
it out, :meth:`DASO.step` phase by phase. While a node's ranks are identical they keep
one copy of the model per node instead of one per rank, an optimisation with the same
bits: :mod:`minidp.strategies.daso_replica`. Deviations are listed in docs/daso.md.
"""

from __future__ import annotations

import sys
from collections import deque
from typing import Any

import numpy as np

from minidp.comm import (
    SharedArray,
    node_broadcast,
    node_mean,
    rail_sum,
    rail_sum_start,
)
from minidp.comm.allreducers import AllreduceRequest, chunk_bounds
from minidp.comm.wire import KINDS, HalfSum, decode, encode, round_to
from minidp.kernels import weighted_merge
from minidp.optim.schedules import Schedule
from minidp.optim.sgd import SGD
from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso_replica import NodeReplica
from minidp.strategies.daso_schedule import BatchSchedule, DASOSchedule, Merge, Send
from minidp.trace import tracer

SYNCS = ("all", "rail")


class DASO(Strategy):
    """Node-local synchronous SGD, global parameter averaging every B batches.

    Per batch b, the :class:`BatchPlan` of :class:`BatchSchedule` says what happens,
    in this order (P nodes, G ranks per node, rail k = local rank k on every node; the
    plan names rail k, the k-th send of the epoch, as Heat does), in :meth:`step`::

        0. node sync (if on): node_mean(grad) in shared memory; then the local update
        1. send: rail k's parameters x_k go into row 0 of a node window (one of two),
           16-bit words while B < 1 with a down-cast; the sum over the P nodes starts
           (rail_sum_start; a blocking send, S == 0 or the epoch's last batch: rail_sum):
             global_sync=all:  local rank j carries slice j (1/G of x) on rail j:
                               all G rails at once
             global_sync=rail: local rank k carries all of x on rail k (Heat)
        2. merge, S batches later: wait; x_k = (w x_k + sum) / (w + P), w = 2 S (twice
           the send's wait; 1 if not positive), sum: the nodes' parameters at send time
           (DASO.merge: the weight and the equation where the merge is computed)
        3. node_broadcast(x, root = that rail): the node is equal again
        4. blocking send: x = sum / P (rounded to 16 bits again with a down-cast)

    ``all`` puts each node's whole network link to work instead of one rail's, and
    computes exactly what ``rail`` does: the sum is taken over the same P numbers per
    element. It needs rail k's x on every rank: local rank k first publishes x_k in the
    window (one shared-memory sync), merges on rank k and broadcasts, and every rank
    divides the blocking sum into its own x. While the node's ranks hold the same
    parameters and optimizer state (from the start until a batch without node sync),
    they keep one replica in node windows instead and rank j carries out the same
    phases on slice j of it (:class:`~minidp.strategies.daso_replica.NodeReplica`: no
    broadcast, no copy, the same bits).

    Ranks wait at node reductions and broadcasts, at blocking sends, and at a merge only
    for what the network has not finished since the send. Every action is recorded in
    the trace as an instant event ``daso <action>`` (epoch, batch and its numbers), on
    every rank, so a run's decisions can be read back and checked against Heat's.

    The schedule (:class:`DASOSchedule`) runs warm-up and cool-down epochs with
    B = S = L = 0, i.e. blocking parameter averaging every batch, which with linear
    local optimizers equals synchronous SGD. One node (P = 1): there is no one to
    average with, and Heat's merge would pull towards a stale copy of the node's own
    parameters, so minidp skips the global level and syncs the node every batch
    (= synchronous SGD).
    """

    name = "daso"
    default_rates = (0.02, 0.9)  # momentum SGD, as sync
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
                           lambda v: v in ("none", *KINDS),
                           "16-bit words on the wire for the global syncs while B < 1"),
        "global_sync": Option("all", str, "'all' or 'rail'", lambda v: v in SYNCS,
                              "global syncs over all rails (1/G of x each) or one rail "
                              "at a time (Heat)"),
    }

    @classmethod
    def fixed_epochs(cls, options: dict[str, Any]) -> str | None:
        """The cool-down epochs are the run's last: a resume cannot move its end."""
        if options.get("cooldown_epochs"):
            return "daso places its cool-down epochs at the end of the run"
        return None

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()
        t, n = self.topology, self.flat.size
        self.all_rails = self.config["global_sync"] == "all"
        bounds = chunk_bounds(n, t.local_size)
        self.slice = slice(bounds[t.local_rank], bounds[t.local_rank + 1]) if self.all_rails \
            else slice(0, n)
        # Row 0 of a window holds the parameters a sync sends, then its sum. Two, because
        # a send may start while the previous sync is still in flight.
        self.windows = [SharedArray(t.node, n, self.flat.data.dtype) for _ in range(2)] \
            if t.num_nodes > 1 else []
        kind = self.config["downcast"]
        self.half = HalfSum(kind) if kind != "none" and t.num_nodes > 1 else None
        self.words = np.empty(n, np.uint16) if self.half else None
        # Every rank of the node holds the same parameters and optimizer state: true until
        # a batch updates without the node sync (then the momenta differ for good).
        self.node_identical = True
        # While it is, the node's ranks keep one replica and each updates its 1/G.
        self.replica = NodeReplica(self) if self.all_rails and t.num_nodes > 1 and \
            t.local_size > 1 and isinstance(self.optimizer, SGD) and \
            self.optimizer.flat is not None else None
        self.schedule = DASOSchedule(total_epochs=1, **self._schedule_options())
        self.batch_schedule = BatchSchedule(t.local_size)
        # This rank's started syncs, oldest first (only on ranks that carry a part);
        # a blocking one is finished at its send (no request) and averaged after the merge.
        self.in_flight: deque[tuple[AllreduceRequest | None, SharedArray]] = deque()

    def _schedule_options(self) -> dict[str, Any]:
        names = ("warmup_epochs", "cooldown_epochs", "max_global_skips", "skip_reduction_factor",
                 "local_skip_factor", "stability_level", "patience")
        return {n: self.config[n] for n in names}

    def plan(self, total_epochs: int, base_batch: int = 1,
             lr_schedule: Schedule | None = None) -> None:
        """Known total epochs place the cool-down (Heat needs them too).

        Rank 0 warns, in one line, when no epoch is left between warm-up and cool-down:
        the run then averages every batch, blocking, as ``sync`` does.
        """
        super().plan(total_epochs, base_batch, lr_schedule)
        self.schedule = DASOSchedule(total_epochs=total_epochs, **self._schedule_options())
        warm, cool = self.config["warmup_epochs"], self.config["cooldown_epochs"]
        if self.topology.rank == 0 and not 1 <= warm < total_epochs - cool:
            shorter = ", or --set daso.warmup_epochs=1 --set daso.cooldown_epochs=1" \
                if total_epochs >= 3 else ""
            print(f"warning: daso: --epochs {total_epochs} leaves no cycling epoch between "
                  f"daso.warmup_epochs={warm} and daso.cooldown_epochs={cool} "
                  f"({'0 never cycles, as in Heat; ' if warm == 0 else ''}(B, S, L) stays "
                  "(0, 0, 0): every batch a blocking average, as sync): give --epochs "
                  f"{max(warm, 1) + cool + 1} or more{shorter}", file=sys.stderr, flush=True)

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Hand this epoch's (B, S, L) and length to the batch schedule."""
        super().begin_epoch(epoch, batches)
        self.batch_schedule.begin_epoch(self.schedule.values, batches)

    def step(self, batch: int) -> None:
        """One batch of Heat's DASO: the plan's phases 0-4 (the class docstring)."""
        self.steps += 1
        if self.topology.num_nodes == 1:  # nobody to average with: synchronous SGD
            node_mean(self.grad_buffer, self.topology)
            self.optimizer_step()
            return
        plan = self.batch_schedule.plan(batch)
        if plan.node_sync:
            self.record(batch, "node sync")
        else:
            self.node_identical = False  # the node's momenta part, for good
        if self.replica is not None and self.replica.engage(self.node_identical):
            self.replica.step(batch, plan)  # the same phases, slice j of one node copy
        else:
            if plan.node_sync:
                node_mean(self.grad_buffer, self.topology)  # 0. node sync
            self.optimizer_step()  # the local update
            if plan.send:
                self.send(batch, plan.send)  # 1.
            if plan.merge:
                self.merge(batch, plan.merge)  # 2.
            if plan.broadcast is not None:
                self.broadcast(batch, plan.broadcast)  # 3.
            if plan.send and plan.send.blocking:
                self.average(batch, plan.send)  # 4.
        if plan.rails_reset:
            self.record(batch, "rails reset")

    # -- the phases -----------------------------------------------------------------------

    def send(self, batch: int, send: Send) -> None:
        """1. Start the sum over the nodes of rail ``send.rail``'s parameters."""
        self.record(batch, "send", rail=send.rail, wait=send.wait, cast=send.cast)
        window = self.next_window()
        sent, part, x = window.whole[0], self.slice, self.flat.data
        if self.all_rails and not self.node_identical:
            if self.topology.local_rank == send.rail:
                sent[...] = x
            window.sync()  # now every rank sends its slice of rail k's x
        elif self._carries(send.rail):
            sent[part] = x[part]
        if self._carries(send.rail):
            self.start_sum(sent[part], send, window)

    def merge(self, batch: int, merge: Merge, part: slice | None = None) -> None:
        """2. Heat's merge of the sync in flight on ``merge.rail``, in place.

        ::

            x <- (w x + sum) / (w + P),   w = staleness_weight x S  (1 where S <= 0)

        ``sum`` is the sum over the P nodes of the parameters the send carried S =
        ``merge.wait`` batches ago; x has trained on since, so the fresher local
        parameters count for more the staler the sum is (``daso.staleness_weight``, 2 in
        Heat: w = 2 S). On the per-rank path the rail's ranks merge all of x (the others
        get the node broadcast); on the node's replica (``part``: slice j) rank j merges
        slice j of x with slice j of its own rail's sum.
        """
        s = merge.wait
        w = self.config["staleness_weight"] * s if s > 0 else 1.0
        self.record(batch, "merge", rail=merge.rail, weight=w)
        if part is not None:
            x, total = self.flat.data[part], self.take_oldest().whole[0, part]
        else:
            x, total = self.flat.data, self._finished_sum(merge.rail)
            if total is None or not self._owns_result(merge.rail):
                return
        weighted_merge(x, total, w, self.topology.num_nodes)  # (w x + sum) / (w + P)

    def broadcast(self, batch: int, root: int, equal: bool = False) -> None:
        """3. Heat's node broadcast from ``root``; skipped where the node is ``equal`` already."""
        self.record(batch, "broadcast", root=root)
        if not (equal or self.all_rails and self.node_identical):
            node_broadcast(self.flat.data, self.topology, root=root)

    def average(self, batch: int, send: Send) -> None:
        """4. Finish a blocking sync: the nodes' mean on its rail, then in every node.

        With all rails every rank reads the whole sum and divides it into its parameters
        (the division costs what a copy of the mean would; the node is then equal: no
        broadcast), and checks its own 1/G for non-finite values.
        """
        self.record(batch, "average", rail=send.rail)
        x = self.flat.data
        if self.all_rails:
            self.mean_into(self._finished_sum(send.rail), send, out=x)
            self.broadcast(batch, send.rail, equal=True)
            self.check_finite(x[self.slice])
            return
        total = self._finished_sum(send.rail)
        if total is not None:
            self.mean_into(total, send, out=x)
        self.broadcast(batch, send.rail)
        self.check_finite()

    # -- the global syncs in flight (both paths) -------------------------------------------

    def next_window(self) -> SharedArray:
        """The window a new send fills: the other one may hold the sync still in flight."""
        self.windows.reverse()
        return self.windows[0]

    def start_sum(self, part: np.ndarray, send: Send, window: SharedArray) -> None:
        """Sum ``part`` over this rank's rail in place: started, or done at once if blocking.

        Queued (with its window) until the merge or the average takes it.
        """
        request = None
        if send.cast and self.half:
            # The schedule casts only while B < 1, and then S = 0: the send blocks.
            self._cast_sum(part)
        elif send.blocking:
            rail_sum(part, self.topology)
        else:
            request = rail_sum_start(part, self.topology)
        self.in_flight.append((request, window))

    def take_oldest(self) -> SharedArray:
        """Wait for the oldest sync in flight; its window (row 0: this rank's part's sum)."""
        request, window = self.in_flight.popleft()
        if request is not None:
            request.wait()
        return window

    def mean_into(self, total: np.ndarray, send: Send, out: np.ndarray) -> None:
        """``out`` <- the nodes' mean from their sum ``total`` (may be ``out`` itself)."""
        np.divide(total, self.topology.num_nodes, out=out)
        if send.cast and self.half:  # Heat divides in the sent precision: rounded again
            out[...] = round_to(out, self.half.kind)

    def record(self, batch: int, action: str, **numbers: Any) -> None:
        """The trace's instant event ``daso <action>`` of this batch (tests read them).

        With the epoch's (B, S, L), which ``minidp report``'s diagram writes beside it.
        """
        b, s, l_ = self.batch_schedule.values
        tracer().mark(f"daso {action}", epoch=self.epoch, batch=batch, **numbers, B=b, S=s,
                      L=l_)

    def _cast_sum(self, part: np.ndarray) -> None:
        """Sum ``part`` over the rail in 16-bit words (blocking); the sum back in ``part``."""
        words = encode(part, self.half.kind, self.words[:part.size])
        decode(self.half.rail_sum(words, self.topology), self.half.kind, part)

    def _finished_sum(self, rail: int) -> np.ndarray | None:
        """Wait for the oldest sync in flight; its whole sum where this rank needs it."""
        if not self._carries(rail):
            return None
        window = self.take_oldest()
        if self.all_rails:
            window.sync()  # every rail's slice of the sum is in row 0
        return window.whole[0]

    def _carries(self, rail: int) -> bool:
        """Whether this rank carries part of a sync sent on ``rail``."""
        return self.all_rails or self.topology.local_rank == rail

    def _owns_result(self, rail: int) -> bool:
        """Whether this rank computes rail ``rail``'s merge (the others get a broadcast)."""
        return self.topology.local_rank == rail or (self.all_rails and self.node_identical)

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
                    batch_schedule=self.batch_schedule.state_dict(),
                    node_identical=self.node_identical)

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""
        super().load_state_dict(state)
        self.schedule.load_state_dict(state["schedule"])
        self.batch_schedule.load_state_dict(state["batch_schedule"])
        self.node_identical = bool(state["node_identical"])
