"""``easgd-rr``: the original EASGD, its master taking the workers in rank order.

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015,
Algorithm 1, with an MPI master, as SC17 (You, Buluc, Demmel) runs it as its baseline.
The master and the worker's update are the family's (:mod:`minidp.strategies.easgd_base`).
"""

from __future__ import annotations

from minidp.strategies.easgd_base import ElasticServer


class ElasticRoundRobin(ElasticServer):
    """``easgd-rr``: the original EASGD; the master takes the workers one at a time, in order.

    Pattern (SC17's baseline, Zhang et al.'s Algorithm 1 with an MPI master)::

        master:  for i in workers, in rank order, forever:  recv(x^i from i); send(x~ to i);
                                                             x~ += alpha (x^i - x~)
        worker:  compute g at x^i; send(x^i); recv(x~); x^i -= lr g + alpha (x^i - x~)

    Worker i+1 cannot exchange before worker i: a worker waits in its ``send`` and
    ``recv`` (phase ``wait``/``comm_*``) for its turn, so P exchanges per round are
    serialised at the master; that is the algorithm's cost, not a bug. The order is
    fixed, so a run is reproducible bit for bit. One worker: EASGD with one worker.
    """

    name = "easgd-rr"
    # The workers' plain SGD is pulled back towards the centre at every exchange: larger
    # steps than a lone SGD's (so for every elastic id but measgd-async).
    default_rates = (0.1, 0.0)
    overlap = False
