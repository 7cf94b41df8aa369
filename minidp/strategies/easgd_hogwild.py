"""``easgd-hogwild``: SC17's Hogwild EASGD, the centre in a node's shared memory, no lock.

You, Buluc, Demmel, "Scaling deep learning on GPU and Knights Landing clusters", SC17:
the master's lock around the centre's update removed. The worker's update is the
family's (:mod:`minidp.strategies.easgd_base`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minidp.comm import SharedArray, rail_mean
from minidp.strategies.easgd_base import ElasticAveraging
from minidp.trace import tracer


class ElasticHogwild(ElasticAveraging):
    """``easgd-hogwild``: the centre lives in the node's shared memory, updated with no lock.

    Per exchange step on every worker (no server, no message inside a node)::

        1. read: copy the node's shared x~ (plain loads; others may be writing)
        2. x^i -= lr g + d  with  d = alpha (x^i - x~_read)
        3. write: x~ += d, in place in the shared window, no lock, no atomics

    Two ranks writing at once can lose one's ``+= d`` for the elements they overlap on
    (NumPy adds in vectorised chunks, so races are of chunks, not single words): the
    invariant ``x~ + sum x^i`` then holds only up to those lost pulls. That is Hogwild's
    bargain (SC17's Hogwild EASGD removes the lock that guards the master's update).

    More than one node (minidp's choice; the paper has one shared-memory machine): each
    node has its own centre; at every epoch's end the leaders average them over the rail
    (``rail_mean``) so there is one centre, equal on every node. One rank: EASGD
    with one worker.
    """

    name = "easgd-hogwild"
    default_rates = (0.1, 0.0)  # plain SGD pulled towards the centre, as easgd-rr

    def pulling_on_a_centre(self) -> int:
        """A node's centre takes the pulls of the node's G workers only: alpha = 0.9 / G."""
        return self.topology.local_size

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        t = self.topology
        # One segment per local rank; the node's centre lives in local rank 0's.
        self.window = SharedArray(t.node, self.flat.size, self.flat.data.dtype)
        self.centre = self.window.whole[0]
        if t.local_rank == 0:
            self.centre[...] = self.flat.data
        self.window.sync()
        self.read = np.empty_like(self.flat.data)

    def step(self, batch: int) -> None:
        """Read the centre, update, add the pull to the centre without a lock."""
        if self.exchanging():
            self.local_update(self.read_centre())  # 1, 2: x^i -= lr g + d
            self.add_to_centre(self.difference)  # 3: x~ += d
        else:
            self.local_update(None)
        self.steps += 1

    def read_centre(self) -> np.ndarray:
        """A copy of the node's x~ as it is now (plain loads; others may be writing)."""
        with tracer().phase("comm_intra", op="easgd-hogwild read centre"):
            np.copyto(self.read, self.centre)
        return self.read

    def add_to_centre(self, pull: np.ndarray) -> None:
        """x~ += pull, in place in the node's window: no lock, no atomics."""
        with tracer().phase("comm_intra", op="easgd-hogwild write centre"):
            np.add(self.centre, pull, out=self.centre)

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """One centre: the leaders average the node centres; every node sees the result."""
        self.window.sync()
        if self.topology.is_leader and self.topology.num_nodes > 1:
            self.centre[...] = rail_mean(self.centre.copy(), self.topology)
        self.window.sync()
        if not np.all(np.isfinite(self.centre)):
            raise FloatingPointError(f"rank {self.topology.rank}: the centre is not finite "
                                     f"after epoch {epoch + 1}; lower --lr or alpha")

    def consensus(self) -> np.ndarray:
        """The node's centre (after ``end_epoch``, the same on every node)."""
        return self.centre

    def state_dict(self) -> dict[str, Any]:
        """Steps and the centre (it lives in shared memory, outside the checkpointed params)."""
        return dict(super().state_dict(), centre=self.encode(self.centre))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`; collective over the node (the centre is shared)."""
        super().load_state_dict(state)
        if self.topology.local_rank == 0:
            self.decode(state["centre"], self.centre)
        self.window.sync()
