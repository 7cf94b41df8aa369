"""``easgd-sync``: SC17's Sync EASGD, every worker and the centre updated from the same step.

You, Buluc, Demmel, "Scaling Deep Learning on GPU and Knights Landing clusters", SC17
(arXiv 1708.02983): "Original EASGD used round-robin method for communication and
updating ... which is inefficient on HPC clusters"; Sync EASGD is their deterministic
redesign, here with the workers' sum moved to the master by a binomial tree and the
new centre sent back by one, log2 P rounds each, instead of P point-to-point exchanges
with the master (docs/easgd.md says what of the paper was read).
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.comm import Topology, p2p
from minidp.strategies.base import Option
from minidp.strategies.easgd import TAG_CENTRE, ElasticAveraging
from minidp.trace import tracer

TAG_FOLD, TAG_TREE, TAG_RESULT = 214, 215, 216
MODES = ("reduce", "allreduce")


def tree_sum(buffer: np.ndarray, scratch: np.ndarray, topology: Topology, everywhere: bool,
             what: str = "partial sum") -> None:
    """Sum ``buffer`` over the world: at rank 0 (binomial tree) or on every rank.

    Both forms add the same partial sums in the same shape, so they agree bit for bit
    (IEEE addition is commutative)::

        fold (p = 2^k + rem): ranks 2j+1 (j < rem) send to 2j, which adds; 2^k remain
        binomial (everywhere=False): round m = 1, 2, 4, ...: a rank whose bit m is set
            sends its partial to the rank m below and stops; that rank adds it. The sum
            ends at rank 0 after log2 rounds; only log2 p messages reach it.
        recursive doubling (everywhere=True): round m: partners (new rank XOR m)
            swap partials and both add; then each 2j sends the sum back to 2j+1.

    Every message goes through ``comm.p2p`` (timed, naming a silent peer, counted and
    charged by the level it crosses). ``scratch`` receives partials (same size).
    """
    p, r = topology.size, topology.rank
    if p == 1:
        return
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    if r < 2 * rem and r % 2:
        p2p.send(buffer, r - 1, TAG_FOLD, topology, what)
        if everywhere:
            p2p.recv(buffer, r - 1, TAG_RESULT, topology, "sum")
        return
    if r < 2 * rem:
        p2p.recv(scratch, r + 1, TAG_FOLD, topology, what)
        buffer += scratch
    new = r // 2 if r < 2 * rem else r - rem

    def world(new_rank: int) -> int:
        return 2 * new_rank if new_rank < rem else new_rank + rem

    mask = 1
    while mask < pof2:
        partner = world(new ^ mask)
        if everywhere:
            sending = p2p.isend(buffer, partner, TAG_TREE, topology, what)
            p2p.recv(scratch, partner, TAG_TREE, topology, what)
            sending.wait()
        elif new & mask:
            p2p.send(buffer, partner, TAG_TREE, topology, what)
            return
        else:
            p2p.recv(scratch, partner, TAG_TREE, topology, what)
        buffer += scratch
        mask <<= 1
    if everywhere and r < 2 * rem:
        p2p.send(buffer, r + 1, TAG_RESULT, topology, "sum")


def tree_broadcast(buffer: np.ndarray, topology: Topology, what: str = "centre") -> None:
    """Copy rank 0's ``buffer`` to every rank by a binomial tree (MPICH's ``Bcast`` shape).

    Rank r > 0 receives from r minus its lowest set bit, then every rank sends to
    r + m for m = the powers of two below that bit (rank 0: below p), largest first::

        p = 4:  round 1: 0 -> 2;   round 2: 0 -> 1, 2 -> 3

    ceil(log2 p) rounds; rank 0 sends ceil(log2 p) messages instead of p - 1; every
    message goes through ``comm.p2p`` (timed, named, counted, charged to its sender).
    """
    p, r = topology.size, topology.rank
    mask = 1
    while mask < p:
        if r & mask:
            p2p.recv(buffer, r - mask, TAG_CENTRE, topology, what)
            break
        mask <<= 1
    mask >>= 1
    while mask:
        if r + mask < p:
            p2p.send(buffer, r + mask, TAG_CENTRE, topology, what)
        mask >>= 1


class ElasticSync(ElasticAveraging):
    """Sync EASGD: all workers and the centre move together, from the same time step.

    Every rank is a worker; rank 0 is also the master that holds the centre x~, and
    every rank keeps a copy of it. At an exchange step t (every ``tau`` steps), with p
    workers::

        1. worker i computes g^i at x^i_t                        (no communication)
        2. sum_i x^i_t to rank 0 by a binomial tree reduce (``tree_sum``: log2 p
           rounds; a rank waits for its children, then sends to its parent)
        3. worker i: x^i <- x^i - lr g^i - alpha (x^i_t - x~_t)   (its copy of x~_t)
        4. rank 0:   x~ <- x~ + beta (sum / p - x~_t)
        5. rank 0 sends the new x~ down a binomial tree (``tree_broadcast``: log2 p
           rounds); every copy is then x~_{t+1}, the centre of the next exchange

    ``mode=allreduce``: steps 2 and 5 become one allreduce of sum_i x^i (recursive
    doubling with the same partial sums as the tree) and every rank applies 4 to its
    own copy. The two modes agree bit for bit. Workers wait for each other in 2 and 5
    (as in ``sync``); nothing is asynchronous, so runs are reproducible bit for bit.
    With ``beta = p alpha`` (the default) the elastic terms cancel in x~ + sum_i x^i.
    Steps without an exchange are local SGD steps. One rank: EASGD with one worker
    (x~ follows x at rate beta).
    """

    name = "easgd-sync"
    options: ClassVar[dict[str, Option]] = dict(
        ElasticAveraging.options,
        beta=Option(-1.0, float, "the centre's rate in [0, 2), or -1: workers x alpha",
                    lambda v: v == -1 or 0 <= v < 2),
        mode=Option("reduce", str, "reduce (tree reduce to rank 0, the centre back down a "
                    "tree) or allreduce (every rank updates its copy)", lambda v: v in MODES))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        t = self.topology
        beta = self.config["beta"]
        self.beta = t.num_workers * self.alpha if beta == -1 else beta
        if self.alpha + self.beta >= 2:
            raise ValueError(f"rank {t.rank}: easgd-sync: alpha + beta = {self.alpha:g} + "
                             f"{self.beta:g}, allowed: below 2 (the distance to the centre "
                             "shrinks by |1 - alpha - beta| per exchange); lower alpha or "
                             "set easgd-sync.beta")
        self.replicated = self.config["mode"] == "allreduce"
        self.updates_centre = self.replicated or t.rank == 0
        self.centre = self.flat.data.copy()  # x_0 on every rank after the broadcast
        self.total = np.empty_like(self.flat.data)
        self.scratch = np.empty_like(self.flat.data)

    def step(self, batch: int) -> None:
        """Sum the workers, update workers and centre from step t, send the centre out."""
        if not self.exchanging():
            self.local_update(None)
            self.steps += 1
            return
        np.copyto(self.total, self.flat.data)
        tree_sum(self.total, self.scratch, self.topology, everywhere=self.replicated)
        self.local_update(self.centre)
        if self.updates_centre:
            with tracer().phase("optimizer"):
                self.total /= self.topology.size
                self.total -= self.centre
                self.total *= self.beta
                self.centre += self.total
        if not self.replicated and self.topology.size > 1:
            tree_broadcast(self.centre, self.topology)
        self.steps += 1

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Refuse a centre that is not finite (naming the rank and the epoch)."""
        if self.updates_centre and not np.all(np.isfinite(self.centre)):
            raise FloatingPointError(f"rank {self.topology.rank}: the centre is not finite "
                                     f"after epoch {epoch + 1}; lower --lr or alpha")

    def consensus(self) -> np.ndarray:
        """The centre: every rank's copy is the same after each exchange."""
        return self.centre

    def state_dict(self) -> dict[str, Any]:
        """Steps and the centre (not among the params)."""
        return dict(super().state_dict(), centre=self.encode(self.centre))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.decode(state["centre"], self.centre)
