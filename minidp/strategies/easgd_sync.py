"""``easgd-sync``: SC17's Sync EASGD, every worker and the centre updated from the same step.

You, Buluc, Demmel, SC17, section 6 (as summarised in ``shared/notes/ALGORITHMS.md``
section 7.2): the deterministic redesign of EASGD, with the workers' sum moved by a
tree reduction instead of P point-to-point exchanges with the master.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.comm import Topology, broadcast, p2p
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


class ElasticSync(ElasticAveraging):
    """Sync EASGD: all workers and the centre move together, from the same time step.

    Every rank is a worker; rank 0 is also the master that holds the centre x~. At an
    exchange step t (every ``tau`` steps), with p workers::

        1. worker i computes g^i at x^i_t                      | overlapped with 2
        2. mode=reduce: rank 0 broadcasts x~_t: it posts isend(x~) to every rank
           before the gradient, the others irecv; all wait after backward
        3. sum_i x^i_t to rank 0 by a binomial tree reduce (``tree_sum``: log2 p
           rounds; a rank waits for its children, then sends to its parent)
        4. worker i: x^i <- x^i - lr g^i - alpha (x^i_t - x~_t)
        5. rank 0:   x~ <- x~ + beta (sum / p - x~_t)

    ``mode=allreduce``: every rank keeps a replica of x~; steps 2 and 3 become one
    allreduce of sum_i x^i (recursive doubling with the same partial sums as the
    tree), and every rank applies 5 to its replica. The two modes agree bit for bit.
    Workers wait for each other in 3 (as in ``sync``); nothing is asynchronous, so runs
    are reproducible bit for bit. With ``beta = p alpha`` (the default) the elastic
    terms cancel in x~ + sum_i x^i. Steps without an exchange are local SGD steps.
    One rank: EASGD with one worker (x~ follows x at rate beta).
    """

    name = "easgd-sync"
    options: ClassVar[dict[str, Option]] = dict(
        ElasticAveraging.options,
        beta=Option(-1.0, float, "the centre's rate in [0, 2), or -1: workers x alpha",
                    lambda v: v == -1 or 0 <= v < 2),
        mode=Option("reduce", str, "reduce (tree reduce to rank 0, centre broadcast from "
                    "it) or allreduce (a centre replica on every rank)", lambda v: v in MODES))

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
        self.holds_centre = self.replicated or t.rank == 0
        self.centre = self.flat.data.copy()  # x_0 on every rank after the broadcast
        self.total = np.empty_like(self.flat.data)
        self.scratch = np.empty_like(self.flat.data)
        self.requests: list[p2p.PeerRequest] = []

    def batch_size(self, base: int) -> int:
        """At an exchange step (mode=reduce), post the centre's broadcast before computing."""
        size = super().batch_size(base)
        t = self.topology
        if size and not self.replicated and self.exchanging() and t.size > 1:
            if t.rank == 0:
                self.requests = [p2p.isend(self.centre, r, TAG_CENTRE, t, "centre")
                                 for r in range(1, t.size)]
            else:
                self.requests = [p2p.irecv(self.centre, 0, TAG_CENTRE, t, "centre")]
        return size

    def step(self, batch: int) -> None:
        """Finish the broadcast, sum the workers, update workers and centre from step t."""
        if not self.exchanging():
            self.local_update(None)
            self.steps += 1
            return
        for request in self.requests:
            request.wait()  # rank 0: its sends are done before x~ changes
        self.requests = []
        np.copyto(self.total, self.flat.data)
        tree_sum(self.total, self.scratch, self.topology, everywhere=self.replicated)
        self.local_update(self.centre)
        if self.holds_centre:
            with tracer().phase("optimizer"):
                self.total /= self.topology.size
                self.total -= self.centre
                self.total *= self.beta
                self.centre += self.total
        self.steps += 1

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Refuse a centre that is not finite (naming the rank and the epoch)."""
        if self.holds_centre and not np.all(np.isfinite(self.centre)):
            raise FloatingPointError(f"rank {self.topology.rank}: the centre is not finite "
                                     f"after epoch {epoch + 1}; lower --lr or alpha")

    def consensus(self) -> np.ndarray:
        """The centre: rank 0's, broadcast (mode=reduce), or this rank's replica."""
        if not self.replicated:
            broadcast(self.centre, self.topology, 0, "centre parameters")
        return self.centre

    def state_dict(self) -> dict[str, Any]:
        """Steps and, where this rank holds it, the centre (not among the params)."""
        state = super().state_dict()
        if self.holds_centre:
            state["centre"] = self.encode(self.centre)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        if self.holds_centre:
            self.decode(state["centre"], self.centre)
