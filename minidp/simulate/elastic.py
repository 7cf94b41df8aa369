"""The elastic family's costs: binomial trees (easgd-sync), one master's queue (easgd-rr).

Arithmetic only, on the units of :mod:`minidp.simulate.costs` (a :class:`Cluster` of nodes,
shared-memory passes, alpha-beta messages). ``easgd-sync`` reduces the workers' parameters
up a binomial tree and sends the centre back down one, log2 p rounds each, the sends
overlapping the next gradients; ``easgd-rr``'s master takes one exchange at a time, so a
round grows with the workers (docs/easgd.md).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from minidp.simulate.costs import Cluster, Epoch, flat_allreduce, make_epoch
from minidp.strategies import ElasticRoundRobin, ElasticSync


def _message_round(cluster: Cluster, homes: Sequence[int], pairs: list[tuple[int, int]],
                   nbytes: float) -> float:
    """One round of whole-buffer messages between ``pairs``: its slowest message."""
    crossing = [homes[a] != homes[b] for a, b in pairs]
    flows = Counter(homes[a] for (a, _), c in zip(pairs, crossing) if c)
    return cluster.message(nbytes, any(crossing), max(flows.values(), default=1))


def tree_reduce(cluster: Cluster, homes: Sequence[int], nbytes: float) -> float:
    """easgd-sync's sum to rank 0 by a binomial tree.

    MPICH's fold of a non-power-of-two world, then log2 p rounds, each its slowest
    message and one sweep adding what arrived.
    """
    p = len(homes)
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    add = cluster.node.shm(1, nbytes)
    total = _message_round(cluster, homes, [(2 * i + 1, 2 * i) for i in range(rem)],
                           nbytes) + add if rem else 0.0
    real = [2 * i if i < rem else i + rem for i in range(pof2)]
    for k in range(pof2.bit_length() - 1):
        m = 1 << k
        pairs = [(real[i + m], real[i]) for i in range(0, pof2, 2 * m)]
        total += _message_round(cluster, homes, pairs, nbytes) + add
    return total


def tree_broadcast_exposed(cluster: Cluster, homes: Sequence[int], nbytes: float) -> float:
    """What of easgd-sync's centre broadcast is left after the next step's compute.

    The binomial tree's rounds send to r + m, m = p/2, p/4, ..., 1. Rank 0 posts its
    sends after the exchange and they travel during the next compute (on a cluster one
    after the other on its link; minidp's model charges them at once); the ranks below
    forward at their next exchange, after that compute. Left over: the longer of rank
    0's sends beyond the compute and the forwarding rounds below rank 0's children.
    """
    p = len(homes)
    masks = [1 << k for k in reversed(range((p - 1).bit_length()))]
    rounds = [[(r, r + m) for r in range(0, p, 2 * m) if r + m < p] for m in masks]
    own = [_message_round(cluster, homes, [(0, m)], nbytes) for m in masks]
    chain = max(own, default=0.0) if cluster.rule == "emulated" else sum(own)
    below = sum(_message_round(cluster, homes, pairs[1:], nbytes) for pairs in rounds[1:]
                if pairs[1:])
    return max(0.0, chain - cluster.node.compute(), below)


def easgd_sync_epoch(cluster: Cluster, batches: int, nbytes: float, itemsize: int,
                     tau: int, mode: str) -> Epoch:
    """easgd-sync: every ``tau`` steps, the elastic exchange of every rank at once.

    ``reduce``: the workers' sum to rank 0 by a binomial tree, rank 0 updates the centre,
    the centre back down a binomial tree behind the next compute; ``allreduce``:
    recursive doubling of the sum and every rank updates its copy. Plus the worker's and
    the centre's elastic sweeps (difference, scale, add: three each) and the ranks
    meeting once.
    """
    homes = [r // cluster.node.ranks for r in range(cluster.ranks)]
    exchanges = -(-batches // tau)
    if cluster.ranks < 2:
        moved = 0.0
    elif mode == "reduce":
        moved = tree_reduce(cluster, homes, nbytes) + \
            tree_broadcast_exposed(cluster, homes, nbytes)
    else:
        moved = flat_allreduce(cluster, homes, "recursive_doubling", nbytes, itemsize)
    elastic = cluster.node.shm(6, nbytes) + (cluster.node.sync_s if cluster.ranks > 1 else 0)
    return make_epoch(ElasticSync.name, f"{mode}, tau={tau}", cluster, batches,
                      exchanges * (moved + elastic))


def easgd_rr_epoch(cluster: Cluster, batches: int, nbytes: float, tau: int) -> Epoch:
    """easgd-rr: the original EASGD, rank 0 a master the N - 1 workers exchange with in turn.

    An exchange of worker i: x^i to the master, the centre back (two whole buffers, across
    the network unless i shares the master's node) and the master's three sweeps. The
    master serves one exchange at a time, in rank order, so a round of exchanges lasts
    their sum; a worker's exchanging step lasts its compute plus its own exchange, or
    the master's round when that is longer (it waits for its turn). Steps without an
    exchange are compute only.
    """
    g = cluster.node.ranks
    if cluster.ranks < 2:
        raise ValueError("easgd-rr: needs a master and a worker: 2 ranks or more")
    exchange = [2 * cluster.message(nbytes, r // g != 0) + cluster.node.shm(3, nbytes)
                for r in range(1, cluster.ranks)]
    compute = cluster.node.compute()
    step = max(compute + max(exchange), sum(exchange))
    exchanges = -(-batches // tau)
    return Epoch(ElasticRoundRobin.name, f"tau={tau}", batches, batches * compute,
                 exchanges * (step - compute))
