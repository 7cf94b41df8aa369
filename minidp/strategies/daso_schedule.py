"""When DASO communicates: the per-epoch (B, S, L) and the per-batch plan, without MPI.

Both follow Heat's ``heat.optim.DASO`` (``epoch_loss_logic`` with ``DetectMetricPlateau``,
and ``step`` with ``_global_sync``; docs/daso.md names the commit), decision for decision,
so that tests can hold them against a transcription of Heat's code over thousands of
cases. :class:`~minidp.strategies.daso.DASO` carries the plans out.

**Epochs.** B = ``global_skip`` (batches between global syncs; 0: every batch, blocking),
S = ``batches_to_wait`` (batches between a send and its receive), L = ``local_skip``
(batches between node gradient syncs). The first epoch is always (0, 0, 0). After
epoch n - 1 finishes (n epochs done), :meth:`DASOSchedule.update` sets epoch n's::

    n < warmup_epochs                    (0, 0, 0)   blocking every batch
    n == warmup_epochs                   (4, 1, 1)   hard-coded in Heat; then the lines below
    n >= total_epochs - cooldown_epochs  (0, 0, 0)   (wins over the line above)
    otherwise, on a loss plateau:        B > 1: B //= f, L //= f, S -= 1, then if B > 0
                                                a zero S or L becomes 1
                                         B == 1: B = max_global_skips,
                                                 S = L = B // local_skip_factor

So with the defaults the cycle is (4,1,1) -> (2,1,1) -> (1,1,1) -> (8,2,2) -> (4,1,1) ...,
one arrow per plateau, and ``warmup_epochs = 0`` never cycles (n is at least 1 when the
first update comes, so n == warmup_epochs never holds: Heat's own behaviour). A plateau
is Heat's ``DetectMetricPlateau(mode="min", threshold_mode="rel")``: an epoch is good
when its loss is below best * (1 - t) (best * (1 + t) for a negative best), t =
``stability_level``; the (patience + 1)-th bad epoch in a row is a plateau, and the count
starts again.

**Batches** (:class:`BatchSchedule`): see its docstring.
"""

from __future__ import annotations

import dataclasses
import math


class DASOSchedule:
    """The epoch-level state machine above; one per rank, fed the same averaged losses."""

    def __init__(self, total_epochs: int, warmup_epochs: int = 4, cooldown_epochs: int = 4,
                 max_global_skips: int = 8, skip_reduction_factor: int = 2,
                 local_skip_factor: int = 4, stability_level: float = 0.05,
                 patience: int = 2) -> None:
        self.total_epochs, self.warmup_epochs = total_epochs, warmup_epochs
        self.cooldown_epochs, self.max_global_skips = cooldown_epochs, max_global_skips
        self.skip_reduction_factor = skip_reduction_factor
        self.local_skip_factor = local_skip_factor
        self.stability_level, self.patience = stability_level, patience
        self.global_skip = self.batches_to_wait = self.local_skip = 0
        self.best, self.bad_epochs = math.inf, 0

    @property
    def values(self) -> tuple[int, int, int]:
        """(B, S, L) for the coming epoch."""
        return self.global_skip, self.batches_to_wait, self.local_skip

    def plateau(self, loss: float) -> bool:
        """Heat's plateau test: True on the (patience + 1)-th consecutive bad epoch."""
        t = self.stability_level
        if loss < self.best * (1 - t if self.best >= 0 else 1 + t):
            self.best, self.bad_epochs = loss, 0
            return False
        self.bad_epochs += 1
        if self.bad_epochs > self.patience:
            self.bad_epochs = 0
            return True
        return False

    def _set(self, b: int, s: int, l_: int) -> None:
        self.global_skip, self.batches_to_wait, self.local_skip = b, s, l_

    def update(self, done: int, loss: float) -> tuple[int, int, int]:
        """Set (B, S, L) for epoch ``done`` (0-based) from the loss of the one before."""
        if done < self.warmup_epochs:
            self._set(0, 0, 0)
            return self.values
        if done == self.warmup_epochs:
            self._set(4, 1, 1)
        if done >= self.total_epochs - self.cooldown_epochs:
            self._set(0, 0, 0)
            return self.values
        if self.plateau(loss):
            b, s, l_ = self.values
            if b > 1:
                f = self.skip_reduction_factor
                b, s, l_ = b // f, s - 1, l_ // f
                if b > 0:  # Heat lifts zeros only: an S below zero stays
                    s, l_ = s if s else 1, l_ if l_ else 1
                self._set(b, s, l_)
            elif b == 1:
                b = self.max_global_skips
                self._set(b, b // self.local_skip_factor, b // self.local_skip_factor)
        return self.values

    def state_dict(self) -> dict:
        """Everything update() depends on."""
        return {"values": list(self.values), "best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict) -> None:
        """Restore state_dict()."""
        self._set(*(int(v) for v in state["values"]))
        self.best, self.bad_epochs = float(state["best"]), int(state["bad_epochs"])


@dataclasses.dataclass(frozen=True)
class Send:
    """Start a global sync: the ranks of ``rail`` sum their parameters over the nodes."""

    rail: int
    wait: int  # S clipped to the epoch: the merge's staleness; may be 0 or below
    cast: bool  # down-cast the parameters (Heat: only while B < 1)
    blocking: bool  # finished on this batch: x = sum / P on the rail, node broadcast


@dataclasses.dataclass(frozen=True)
class Merge:
    """Finish the sync in flight on ``rail``, sent ``wait`` batches ago (its Send's wait).

    DASO merges it where it is done (:meth:`~minidp.strategies.daso.DASO.merge`):
    x <- (w x + sum) / (w + P), the weight w from ``wait``.
    """

    rail: int
    wait: int


@dataclasses.dataclass(frozen=True)
class BatchPlan:
    """One batch's decisions, carried out in this order (after the node sync and update)."""

    node_sync: bool  # average this batch's gradients in the node before the update
    send: Send | None = None
    merge: Merge | None = None
    broadcast: int | None = None  # node broadcast from this local rank after the merge
    rails_reset: bool = False  # the epoch's last batch: the next epoch's first send is rail 0


class BatchSchedule:
    """DASO's per-batch decisions (Heat's ``step`` and ``_global_sync``) for one node.

    With (B, S, L) of the epoch, ``last`` its last batch, phase = b % B (0 when B == 0)
    and wait = S, or last - b where b + S passes the end::

        b == last or phase == 0   send on the next rail (rails rotate, from 0 each epoch)
                                  if S != 0: merge the previous sync if still in flight,
                                     and node broadcast from its rail (even if it was
                                     merged already: the node agrees again)
                                  blocking if b == last or S == 0: x = sum / P, broadcast
        (b + 1) % B == 0          node sync on from the next batch (the send's)
        phase < wait              nothing (node sync on for the last batch)
        phase == wait             merge the sync in flight, node broadcast; L > 1: node
                                  sync off; then the L rule below
        phase > wait              L == 1: on; else off at b % L == 0, on at (b+1) % L == 0;
                                  always on before the last batch

    The node gradient sync is a switch (PyTorch DDP's ``require_backward_grad_sync`` in
    Heat): each batch uses its state after the previous batch, across epochs too. So it
    is on from the batch before a send until the receive, and on every last batch. A new
    send starts before the previous sync is merged (B = 1, S > B, the last batch), so it
    carries the parameters from before that merge; on a blocking send the merge is then
    overwritten. Only the ranks of a sync's rail merge it; the node broadcast after it
    makes the node equal again.
    """

    def __init__(self, local_size: int) -> None:
        self.local_size = local_size
        self.values, self.last = (0, 0, 0), 0
        self.node_sync = True  # DDP starts with its gradient sync on
        self.rail = 0  # of the next send
        self.previous: int | None = None  # rail of the last non-blocking send this epoch
        self.in_flight: Send | None = None  # not merged yet

    def begin_epoch(self, values: tuple[int, int, int], batches: int) -> None:
        """Take the epoch's (B, S, L) and length."""
        self.values, self.last = tuple(values), batches - 1

    def plan(self, batch: int) -> BatchPlan:
        """The decisions for ``batch`` (0-based; called for every batch in order)."""
        b_, s_, l_ = self.values
        node_sync, last = self.node_sync, self.last
        phase = batch % b_ if b_ > 0 else 0
        wait = s_ if batch + s_ <= last else last - batch
        if batch == last or phase == 0:
            return self._send(batch, node_sync, wait)
        if (batch + 1) % b_ == 0:
            self.node_sync = True
            return BatchPlan(node_sync)
        if phase < wait:
            self.node_sync = self.node_sync or batch + 1 == last
            return BatchPlan(node_sync)
        merge = broadcast = None
        if phase == wait:
            merge, broadcast = self._receive(), self.previous
            if l_ > 1:
                self.node_sync = False
        if l_ == 1 or batch + 1 == last:
            self.node_sync = True
        elif l_ == 0 or batch % l_ == 0:
            self.node_sync = False
        elif (batch + 1) % l_ == 0:
            self.node_sync = True
        return BatchPlan(node_sync, merge=merge, broadcast=broadcast)

    def _send(self, batch: int, node_sync: bool, wait: int) -> BatchPlan:
        b_, s_, _ = self.values
        last = batch == self.last
        send = Send(self.rail, wait, cast=b_ < 1, blocking=last or s_ == 0)
        merge = broadcast = None
        if s_ != 0 and self.previous is not None:
            merge, broadcast = self._receive(), self.previous
        following = (self.rail + 1) % self.local_size
        if send.blocking:
            self.previous, self.rail = None, 0 if last else following
        else:
            self.in_flight, self.previous, self.rail = send, self.rail, following
        return BatchPlan(node_sync, send, merge, broadcast, rails_reset=last)

    def _receive(self) -> Merge | None:
        flight, self.in_flight = self.in_flight, None
        if flight is None:  # merged already, on the batch its wait said
            return None
        return Merge(flight.rail, flight.wait)

    def state_dict(self) -> dict:
        """The node sync switch: all else starts afresh each epoch (nothing is in flight)."""
        return {"node_sync": self.node_sync}

    def load_state_dict(self, state: dict) -> None:
        """Restore state_dict()."""
        self.node_sync = bool(state["node_sync"])
