"""``recursive_doubling``: whole-buffer exchanges with partners at distance 1, 2, 4, ...

Short on purpose: one textbook algorithm (with the usual fix for a world size that is
not a power of two), written as the generator of its exchanges, so that its
non-blocking form is the same code as the blocking one.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from mpi4py import MPI

from minidp.comm.allreducers.base import (
    TAG,
    FlatAllreduce,
    Waiting,
    exchange,
    post_recv,
    post_send,
)


def doubling_traffic(ranks: int, nbytes: int) -> tuple[int, float]:
    """One whole buffer per round, log2 of the power of two below ranks (+1 if not one)."""
    if ranks < 2:
        return 0, 0.0
    rounds = (ranks.bit_length() - 1) + (0 if ranks & (ranks - 1) == 0 else 1)
    return rounds, float(rounds * nbytes)


class RecursiveDoublingAllreduce(FlatAllreduce):
    """Exchange whole buffers with partners at distance 1, 2, 4, ... (log2 p rounds).

    Pattern::

        non-power-of-two fix (p = 2^k + rem): in the first 2*rem ranks, each even rank
        sends its buffer to the odd rank above it and sits out; the 2^k remaining ranks
        run the doubling rounds (partner = new_rank XOR mask); at the end every odd
        rank of the first 2*rem sends the result back to its even neighbour.

    Every send and receive is completed by a guarded wait naming the partner; the label
    names it too, so the status board shows who waits for whom.
    """

    name = "recursive_doubling"
    started_name = "recursive_doubling iallreduce"
    traffic = staticmethod(doubling_traffic)

    def exchanges(self, buf: np.ndarray, comm: MPI.Comm, p: int, r: int) -> Iterator[Waiting]:
        """The rounds, the buffer summed in place after each."""
        pof2 = 1 << (p.bit_length() - 1)
        rem = p - pof2
        tmp = self.topology.workspace.scratch(self.name, buf.size, buf.dtype)
        label = "recursive doubling allreduce with rank {}".format
        arrows = self.topology.arrows  # each message is one of the trace's arrows
        if r < 2 * rem:
            if r % 2 == 0:
                yield post_send(arrows, comm, buf, r + 1, TAG + 2, label(r + 1), "buffer to fold")
                yield post_recv(arrows, comm, buf, r + 1, TAG + 3, label(r + 1))
                return
            yield post_recv(arrows, comm, tmp, r - 1, TAG + 2, label(r - 1))
            buf += tmp
            new_rank = r // 2
        else:
            new_rank = r - rem
        mask = 1
        while mask < pof2:
            partner_new = new_rank ^ mask
            partner = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
            yield from exchange(arrows, comm, buf, partner, tmp, partner, TAG + 4,
                                label(partner), "partial sum")
            buf += tmp
            mask <<= 1
        if r < 2 * rem:
            yield post_send(arrows, comm, buf, r - 1, TAG + 3, label(r - 1), "sum")
