"""``easgd-async``: SC17's Async EASGD, the exchange overlapped, the master first come first served.

You, Buluc, Demmel, "Scaling deep learning on GPU and Knights Landing clusters", SC17.
The master and the worker's update are the family's (:mod:`minidp.strategies.easgd_base`);
``measgd-async`` (:mod:`minidp.strategies.measgd_async`) adds momentum on the workers.
"""

from __future__ import annotations

from typing import ClassVar

from minidp.strategies.base import Option
from minidp.strategies.easgd_base import ElasticAveraging, ElasticServer
from minidp.strategies.serving import ALLOWED, FCFS, is_order


class ElasticAsync(ElasticServer):
    """``easgd-async``: SC17's Async EASGD; the master answers whoever comes first.

    Pattern::

        worker:  post isend(x^i), irecv(x~)  |  compute g at x^i  |  wait both;
                 x^i -= lr g + alpha (x^i - x~)
        master:  probe(ANY_SOURCE); recv(x^i); send(x~); x~ += alpha (x^i - x~)

    The exchange travels while the worker computes (MPI progresses it inside the
    worker's waits and the network model's time runs from the post). Workers never wait
    for each other, only for the master's answer. ``order=round_robin`` serves the
    workers in rank order instead, ``order=1,1,2,3`` as the script says (deterministic:
    the staleness of every exchange is chosen; still overlapped).
    """

    name = "easgd-async"
    default_rates = (0.1, 0.0)  # plain SGD pulled towards the centre, as easgd-rr
    options: ClassVar[dict[str, Option]] = dict(
        ElasticAveraging.options,
        order=Option(FCFS, str, ALLOWED, is_order))
