"""``hogwild``: lock-free SGD on one parameter array per node (Recht, Re, Wright, Niu 2011).

The "Hogwild SGD" baseline of the elastic-averaging paper (You, Buluc, Demmel, SC17):
the ranks of a node share one copy of the parameters in memory and update it without
locks. There is no server role.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.comm import SharedArray, rail_mean
from minidp.strategies.base import Option, Strategy
from minidp.trace import tracer


class HogwildSGD(Strategy):
    """Every rank of a node reads and writes one shared parameter array, with no locks.

    Per step on every worker::

        1. read: copy the node's shared parameters into the local model (plain loads
           from the MPI shared-memory window; other ranks may be writing meanwhile)
        2. compute the gradient on the local copy (no communication)
        3. write: shared <- shared - lr * g, in place in the window, no lock, no atomics
           (the optimizer's SGD update of the shared array instead of the local copy):
           concurrent writes can overwrite each other's elements; the race is the
           algorithm (Hogwild's analysis bounds its effect for sparse-enough updates)

    More than one node (minidp's choice; the paper's Hogwild is one shared-memory
    machine): every ``period`` steps, and at each epoch's end, local rank 0 of every
    node averages the node copies over the rail of leaders (``rail_mean``) and adds the
    change (average - its snapshot) to its node's array, so updates that other ranks of
    the node made meanwhile are kept, not overwritten. Only the leaders
    wait for each other there; the other ranks never wait. Every worker takes the same
    number of steps per epoch, so the leaders meet at the same steps.

    One rank: plain SGD. One node: Hogwild exactly; ``period`` is unused.
    ``--momentum`` is not used: momentum buffers have no lock-free shared form here.
    """

    name = "hogwild"
    default_rates = (0.05, 0.0)  # plain SGD on the node's shared parameters
    ignores = ("momentum", "nesterov")
    ignored_hint = "a momentum buffer has no lock-free shared form: plain SGD"
    sgd_only = "the ranks apply SGD to the node's shared parameters"
    options: ClassVar[dict[str, Option]] = {
        "period": Option(0, int, "leader steps between node averages, >= 0 (0: only at each "
                         "epoch's end)", lambda v: v >= 0)}

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        t = self.topology
        # One segment per local rank; the node's parameters live in local rank 0's.
        self.window = SharedArray(t.node, self.flat.size, self.flat.data.dtype)
        self.shared = self.window.whole[0]
        if t.local_rank == 0:
            self.shared[...] = self.flat.data
        self.window.sync()
        self.snapshot = np.empty_like(self.flat.data) if t.local_rank == 0 else None

    def batch_size(self, base: int) -> int:
        """Read the node's parameters into the local model before the next batch."""
        size = super().batch_size(base)
        if size:
            with tracer().phase("comm_intra", op="hogwild read"):
                np.copyto(self.flat.data, self.shared)
        return size

    def step(self, batch: int) -> None:
        """Write the update into the shared array without a lock; leaders average nodes."""
        self.steps += 1
        with tracer().phase("optimizer"):
            self.optimizer.update(params=self.shared, momentum=False)
        period = self.config["period"]
        if period and self.topology.is_leader and self.steps % period == 0:
            self.average_nodes()

    def average_nodes(self, quiet: bool = False) -> None:
        """Leaders: shared += mean over nodes of the node arrays - this node's snapshot.

        ``quiet``: nobody on the node writes meanwhile, so shared <- mean exactly.
        """
        if self.topology.num_nodes < 2:
            return
        np.copyto(self.snapshot, self.shared)
        mean = rail_mean(self.snapshot.copy(), self.topology)
        if quiet:
            np.copyto(self.shared, mean)
        else:
            self.shared += mean - self.snapshot

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Make every node's array the same: leaders average, then the nodes copy."""
        self.window.sync()
        if self.topology.is_leader:
            self.average_nodes(quiet=True)
        self.window.sync()
        np.copyto(self.flat.data, self.shared)
        self.check_finite()

    def consensus(self) -> np.ndarray:
        """The (averaged) shared parameters, equal on every rank after end_epoch."""
        return self.flat.data
