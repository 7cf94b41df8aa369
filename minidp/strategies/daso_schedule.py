"""DASO's (B, S, L) schedule: warm-up, plateau-driven cycling, cool-down (Heat's constants).

B = ``global_skip`` (batches between global syncs; 0: every batch, blocking),
S = ``batches_to_wait`` (batches between a send and its receive),
L = ``local_skip`` (batches between node-local gradient syncs). After epoch n - 1
finishes (n epochs done), :meth:`DASOSchedule.update` sets the values for epoch n::

    n < warmup_epochs                    (0, 0, 0)   blocking every batch
    n == warmup_epochs                   (4, 1, 1)   hard-coded in Heat
    n >= total_epochs - cooldown_epochs  (0, 0, 0)   (wins over the line above)
    otherwise, on a loss plateau:        B > 1: B //= f, L //= f, S -= 1, then S, L >= 1
                                         B == 1: B = max_global_skips,
                                                 L = B // local_skip_factor, S = B // 4

So the cycle after warm-up is (4,1,1) -> (2,1,1) -> (1,1,1) -> (8,2,2) -> (4,1,1) ...,
one arrow per plateau. A plateau is Heat's ``DetectMetricPlateau(mode="min",
patience=2, threshold=0.05, threshold_mode="rel")``: an epoch is bad unless its loss
is below best * (1 - 0.05); the third consecutive bad epoch (more than ``patience``)
is a plateau, and the count starts again.
"""

from __future__ import annotations

import math


class DASOSchedule:
    """The state machine above; one instance per rank, fed the same averaged losses."""

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
        self.update(0, None)

    @property
    def values(self) -> tuple[int, int, int]:
        """(B, S, L) for the coming epoch."""
        return self.global_skip, self.batches_to_wait, self.local_skip

    def plateau(self, loss: float) -> bool:
        """Heat's plateau test: True on the (patience+1)-th consecutive bad epoch."""
        if loss < self.best * (1 - self.stability_level):
            self.best, self.bad_epochs = loss, 0
            return False
        self.bad_epochs += 1
        if self.bad_epochs > self.patience:
            self.bad_epochs = 0
            return True
        return False

    def _set(self, b: int, s: int, l_: int) -> None:
        self.global_skip, self.batches_to_wait, self.local_skip = b, s, l_

    def update(self, done: int, loss: float | None) -> tuple[int, int, int]:
        """Set (B, S, L) for epoch ``done`` (0-based) from the loss of the one before."""
        if done >= self.total_epochs - self.cooldown_epochs or done < self.warmup_epochs:
            self._set(0, 0, 0)
        elif done == self.warmup_epochs:
            self._set(4, 1, 1)
        elif loss is not None and self.plateau(loss):
            if self.global_skip > 1:
                b = self.global_skip // self.skip_reduction_factor
                l_ = self.local_skip // self.skip_reduction_factor
                s = self.batches_to_wait - 1
                self._set(b, max(s, 1), max(l_, 1)) if b > 0 else self._set(b, s, l_)
            else:
                b = self.max_global_skips
                self._set(b, b // 4, b // self.local_skip_factor)
        return self.values

    def state_dict(self) -> dict:
        """Everything update() depends on."""
        return {"values": list(self.values), "best": self.best, "bad_epochs": self.bad_epochs}

    def load_state_dict(self, state: dict) -> None:
        """Restore state_dict()."""
        self._set(*(int(v) for v in state["values"]))
        self.best, self.bad_epochs = float(state["best"]), int(state["bad_epochs"])
