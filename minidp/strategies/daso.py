"""``daso``: Distributed Asynchronous and Selective Optimization (Coquelin et al., 2022).

Follows Heat's ``heat.optim.DASO`` (the paper's reference code): node-local blocking
gradient averaging, a global non-blocking parameter average on one rail at a time,
merged S batches later with a staleness weight, and a schedule that stretches the
interval between global syncs when the loss plateaus. Deviations are listed in
docs/daso.md and marked below.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidp.comm import node_allreduce, node_broadcast, rail_allreduce, rail_iallreduce
from minidp.optim.schedules import Schedule
from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso_schedule import DASOSchedule


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


class _InFlight:
    """A global sync between its send and its receive."""

    def __init__(self, rail: int, receive_at: int, waited: int, request: Any) -> None:
        self.rail, self.receive_at, self.waited, self.request = rail, receive_at, waited, request


class DASO(Strategy):
    """Node-local synchronous SGD, global parameter averaging over one rail at a time.

    With B (global skip), S (batches to wait) and L (local skip) from the schedule, after
    the local update of batch b (last = the epoch's last batch)::

        0. node: allreduce(grad, mean) in shared memory before the update, on every
           batch of a "local sync" (L <= 1, b % L == 0, or the batch before a send)
        1. send, if b == last or b % B == 0 (every batch while B == 0): the ranks of rail
           k = (number of sends so far) mod G copy their parameters into a send buffer
           and start rail.Iallreduce(sum) across the P nodes; the other rails rest.
           If S == 0 or b == last this is blocking: x = sum / P (optionally down-cast
           to bf16/fp16), then node.Bcast(x, root=k): every rank of the world is equal.
        2. receive, S batches after a send: rail k waits, merges
           x = (2S * x_local + sum) / (2S + P)   (sum: the nodes' parameters at send time)
           and node.Bcast(x, root=k): every rank of the node is equal.

    Ranks wait at the node reductions, at blocking sends, and at a receive only for what
    the network has not finished in the S batches since the send. The schedule
    (:class:`DASOSchedule`) runs warm-up and cool-down epochs with B = S = L = 0, i.e.
    blocking parameter averaging every batch, which with linear local optimizers equals
    synchronous SGD. One node (P = 1): there is no one to average with, and Heat's merge
    would pull towards a stale copy of the node's own parameters, so minidp skips the
    global level and keeps the node sync on every batch (= synchronous SGD).
    """

    name = "daso"
    options = {
        "warmup_epochs": Option(4, int, "an int >= 0", lambda v: v >= 0,
                                "epochs of blocking sync at the start"),
        "cooldown_epochs": Option(4, int, "an int >= 0", lambda v: v >= 0,
                                  "epochs of blocking sync at the end"),
        "max_global_skips": Option(8, int, "an int >= 1", lambda v: v >= 1,
                                   "B after a plateau at B = 1"),
        "skip_reduction_factor": Option(2, int, "an int >= 2", lambda v: v >= 2,
                                        "B is divided by this on a plateau"),
        "local_skip_factor": Option(4, int, "an int >= 1", lambda v: v >= 1,
                                    "L = B // this when B is reset"),
        "stability_level": Option(0.05, float, "a float in [0, 1)", lambda v: 0 <= v < 1,
                                  "relative loss improvement below which a plateau counts"),
        "patience": Option(2, int, "an int >= 0", lambda v: v >= 0,
                           "bad epochs tolerated before a plateau is declared"),
        "staleness_weight": Option(2.0, float, "a float > 0", lambda v: v > 0,
                                   "weight 2 in (2S x + sum) / (2S + P)"),
        "downcast": Option("none", str, "'none', 'bf16' or 'fp16'",
                           lambda v: v in ("none", "bf16", "fp16"),
                           "precision of the blocking global syncs"),
    }

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()
        self.send_buffer = np.empty_like(self.flat.data)
        self.schedule = DASOSchedule(total_epochs=1, **self._schedule_options())
        self.in_flight: _InFlight | None = None
        self.sends, self.force_local = 0, False
        self.sent_on: list[tuple[int, int]] = []  # (batch, rail) of this epoch's sends
        self.received_on: list[int] = []  # batches of this epoch's non-blocking receives

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
        """Take this epoch's (B, S, L) from the schedule."""
        super().begin_epoch(epoch, batches)
        self.sent_on, self.received_on = [], []

    def _local_sync(self, batch: int) -> bool:
        skip = self.schedule.local_skip
        return self.topology.num_nodes == 1 or skip <= 1 or batch % skip == 0 or self.force_local

    def step(self, batch: int) -> None:
        """Node sync and local update, then DASO's global send/receive logic."""
        self.steps += 1
        if self._local_sync(batch):
            node_allreduce(self.flat.grad, self.topology, op="mean")
        self.optimizer_step()
        if self.topology.num_nodes == 1:
            return
        B, S = self.schedule.global_skip, self.schedule.batches_to_wait
        last = self.batches - 1
        if batch == last or B == 0 or batch % B == 0:
            self.send(batch, 0 if batch == last else min(S, last - batch))
            return
        if self.in_flight is not None and batch == self.in_flight.receive_at:
            self.receive(batch)
            if self.schedule.local_skip > 1:
                self.force_local = False
        if (batch + 1) % B == 0:
            self.force_local = True  # the batch before a send syncs its node

    def send(self, batch: int, wait: int) -> None:
        """Start a global sync on the next rail; blocking (and finished here) if wait == 0."""
        if self.in_flight is not None:
            self.receive(batch)  # never two syncs in flight
        rail = self.sends % self.topology.local_size
        self.sends += 1
        self.sent_on.append((batch, rail))
        mine = self.topology.local_rank == rail
        x = self.flat.data
        if wait == 0:
            if mine:
                self.send_buffer[...] = downcast(x, self.config["downcast"])
                rail_allreduce(self.send_buffer, self.topology, op="sum")
                x[...] = downcast(self.send_buffer, self.config["downcast"])
                x /= self.topology.num_nodes
            node_broadcast(x, self.topology, root=rail)
            self.check_finite()
            return
        request = None
        if mine:
            self.send_buffer[...] = x
            request = rail_iallreduce(self.send_buffer, self.topology, op="sum")
        self.in_flight = _InFlight(rail, batch + wait, wait, request)

    def receive(self, batch: int) -> None:
        """Merge the finished global sum into the current parameters; share in the node."""
        flight, self.in_flight = self.in_flight, None
        self.received_on.append(batch)
        x = self.flat.data
        if flight.request is not None:
            flight.request.wait()
            weight = self.config["staleness_weight"] * flight.waited
            x *= weight
            x += self.send_buffer
            x /= weight + self.topology.num_nodes
        node_broadcast(x, self.topology, root=flight.rail)

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Feed the epoch's loss to the schedule, which sets the next epoch's (B, S, L)."""
        self.schedule.update(epoch + 1, train_loss)
        self.force_local = False

    def state_dict(self) -> dict:
        """Schedule and rail counter (nothing is in flight at an epoch's end)."""
        return dict(super().state_dict(), sends=self.sends, schedule=self.schedule.state_dict())

    def load_state_dict(self, state: dict) -> None:
        """Restore what state_dict() returned."""
        super().load_state_dict(state)
        self.sends = int(state["sends"])
        self.schedule.load_state_dict(state["schedule"])
