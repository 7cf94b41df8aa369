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
from minidp.strategies.easgd_base import TAG_CENTRE, ElasticAveraging
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


def tree_links(rank: int, size: int) -> tuple[int | None, list[int]]:
    """(parent, children) of ``rank`` in the binomial tree from rank 0 (MPICH's ``Bcast``).

    Rank r > 0 hears from r minus its lowest set bit and passes on to r + m for the
    powers of two m below that bit (rank 0: below ``size``), largest first::

        size 4:  0 -> 2, 0 -> 1;  2 -> 3      (ceil(log2 size) rounds)
    """
    low = rank & -rank if rank else 1 << max(size - 1, 0).bit_length()
    children = [rank + m for m in (1 << k for k in reversed(range(low.bit_length() - 1)))
                if rank + m < size]
    return (rank - low if rank else None), children


class CentreTree:
    """The new centre from rank 0 to every rank down the binomial tree, behind the next steps.

    :meth:`post` (every rank, after an exchange step): rank 0 posts ``isend`` to its
    children; the others post ``irecv`` from their parent. :meth:`take` (every rank,
    before the next exchange, and at the epoch's end): wait for the parent's copy, then
    post the sends to the own children. So rank 0's ceil(log2 p) messages travel while
    every rank computes its next gradients (the network model charges them from the
    post), and only the forwarding below rank 0's children is left when the exchange
    comes. Every message goes through ``comm.p2p`` (timed, named, counted, charged).

    Args:
        centre: every rank's copy of the centre (written only by the receive).
        topology: the job's ranks.
    """

    def __init__(self, centre: np.ndarray, topology: Topology) -> None:
        self.centre, self.topology = centre, topology
        self.parent, self.children = tree_links(topology.rank, topology.size)
        self.receiving: p2p.PeerRequest | None = None
        self.sending: list[p2p.PeerRequest] = []

    def post(self) -> None:
        """After an exchange: rank 0 sends the new centre; the others await their copy."""
        self.sent()
        if self.parent is None:
            self.forward()
        else:
            self.receiving = p2p.irecv(self.centre, self.parent, TAG_CENTRE, self.topology,
                                       "centre")

    def take(self) -> None:
        """Wait for the parent's copy of the centre and pass it on to the children."""
        if self.receiving is not None:
            self.receiving.wait()
            self.receiving = None
            self.forward()

    def forward(self) -> None:
        """Post the sends of this rank's copy to its children."""
        self.sending = [p2p.isend(self.centre, child, TAG_CENTRE, self.topology, "centre")
                        for child in self.children]

    def sent(self) -> None:
        """Wait until the children have this rank's copy (before it may change)."""
        for request in self.sending:
            request.wait()
        self.sending = []


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
        5. rank 0 sends the new x~ down a binomial tree (:class:`CentreTree`: log2 p
           rounds), behind the next steps' gradients; every rank takes its copy,
           x~_{t+1}, before the next exchange (and at the epoch's end)

    ``mode=allreduce``: steps 2 and 5 become one allreduce of sum_i x^i (recursive
    doubling with the same partial sums as the tree) and every rank applies 4 to its
    own copy. The two modes agree bit for bit. Workers wait for each other in 2 and 5
    (as in ``sync``); nothing is asynchronous, so runs are reproducible bit for bit.
    With ``beta = p alpha`` (the default) the elastic terms cancel in x~ + sum_i x^i.
    Steps without an exchange are local SGD steps. One rank: EASGD with one worker
    (x~ follows x at rate beta).
    """

    name = "easgd-sync"
    default_rates = (0.1, 0.0)  # plain SGD pulled towards the centre, as easgd-rr
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
        self.tree = None if self.replicated or t.size == 1 else CentreTree(self.centre, t)

    def step(self, batch: int) -> None:
        """Sum the workers, update workers and centre from step t, send the centre out."""
        if not self.exchanging():
            self.local_update(None)
            self.steps += 1
            return
        if self.tree is not None:
            self.tree.take()  # x~_t, sent after the last exchange
        np.copyto(self.total, self.flat.data)
        tree_sum(self.total, self.scratch, self.topology, everywhere=self.replicated)
        self.local_update(self.centre)
        if self.tree is not None:
            self.tree.sent()  # the children have x~_t: rank 0 may change it
        if self.updates_centre:
            with tracer().phase("optimizer"):
                self.total /= self.topology.size
                self.total -= self.centre
                self.total *= self.beta
                self.centre += self.total
            if tracer().detailed:  # the diagram's marker
                tracer().mark("centre update", beta=self.beta)
        if self.tree is not None:
            self.tree.post()
        self.steps += 1

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Every rank takes the last centre; refuse one that is not finite (rank, epoch)."""
        self.settle()
        if self.updates_centre and not np.all(np.isfinite(self.centre)):
            raise FloatingPointError(f"rank {self.topology.rank}: the centre is not finite "
                                     f"after epoch {epoch + 1}; lower --lr or alpha")

    def settle(self) -> None:
        """Collective: the centre in flight down the tree reaches every rank now."""
        if self.tree is not None:
            self.tree.take()
            self.tree.sent()

    def consensus(self) -> np.ndarray:
        """The centre (collective: the copy in flight is taken first), the same everywhere."""
        self.settle()
        return self.centre

    def state_dict(self) -> dict[str, Any]:
        """Steps and the centre (not among the params)."""
        return dict(super().state_dict(), centre=self.encode(self.centre))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.decode(state["centre"], self.centre)
