"""``softsync``: n-softsync, the server's learning rate modulated by the gradients' staleness.

The protocol is Gupta, Zhang, Wang, "Model Accuracy and Runtime Tradeoff in Distributed
Deep Learning: A Systematic Study", ICDM 2016 (arXiv 1509.04210), which introduces
n-softsync and divides the learning rate by the average staleness <sigma> of an
update's gradients. Zhang, Gupta, Lian, Liu, "Staleness-aware Async-SGD for
Distributed Deep Learning", IJCAI 2016 (arXiv 1511.05950), scale each gradient by its
own 1/sigma instead. Both rules are here (``rule``); docs/softsync.md says what was
read of each paper and why ``mean`` (Gupta et al.'s) is the default.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.strategies.base import Option
from minidp.strategies.ps_base import ParameterServer

RULES = ("mean", "each")


class SoftSyncSGD(ParameterServer):
    """n-softsync: the server updates once it holds c = floor(lambda / n) gradients.

    lambda learners (workers) push gradients as in ``asgd``; the server collects them
    from any learners (a fast one may give several) and, at the c-th, applies one of::

        rule=mean (Gupta et al.):  w <- w - lr / max(<sigma>, 1) * (1/c) sum_l g_l
        rule=each (Zhang et al.):  w <- w - lr * (1/c) sum_l g_l / max(sigma_l, 1)

    where sigma_l is the staleness of gradient l (server updates since its learner
    pulled) and <sigma> their mean over the update. sigma = 0 (a fresh gradient) takes
    the full rate, as does a mean below 1: dividing by less than 1 would raise the rate
    above lr. ``n = lambda`` gives c = 1: ASGD with a staleness-scaled rate. ``n = 1``
    gives c = lambda: with one gradient from every learner per update
    (``order=round_robin``) every staleness is 0 and the run is synchronous SGD on a
    batch of lambda x b.

    The server applies plain SGD (with ``--weight-decay``), as both papers do;
    ``server_momentum=true`` keeps ``--momentum`` and ``--nesterov`` at the server.

    Communication: as :class:`ParameterServer`; workers never wait for each other, only
    for their own pulls. At an epoch's end the server applies what its buffer still
    holds as one update over those gradients (flushed, so no gradient is lost and the
    epoch's evaluation sees all of them).
    """

    name = "softsync"
    # Plain SGD at the server (unless softsync.server_momentum), of the mean of c gradients.
    default_rates = (0.1, 0.0)
    options: ClassVar[dict[str, Option]] = dict(
        ParameterServer.options,
        n=Option(1, int, "an int >= 1 (1: softest barrier, c = workers; workers: ASGD)",
                 lambda v: v >= 1),
        rule=Option("mean", str, "mean (Gupta et al. 2016: lr / the mean staleness of the "
                    "update's gradients) or each (Zhang et al. 2016: each gradient / its own "
                    "staleness)", lambda v: v in RULES),
        server_momentum=Option(False, bool, "true or false: the server applies --momentum "
                               "and --nesterov (false: plain SGD, as the papers)"))

    ignored_hint = ("it applies plain SGD at the server, as the papers; "
                    "--set softsync.server_momentum=true keeps --momentum there")

    @classmethod
    def ignored_flags(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """``--momentum`` and ``--nesterov`` unless ``server_momentum`` asks for them."""
        return () if options["server_momentum"] else ("momentum", "nesterov")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workers = self.topology.num_workers
        if self.config["n"] > workers:
            raise ValueError(f"rank {self.topology.rank}: softsync.n: got {self.config['n']}, "
                             f"allowed: 1 to the {workers} workers")
        self.server_momentum = self.config["server_momentum"]
        self.per_gradient = self.config["rule"] == "each"
        self.c = workers // self.config["n"]
        self.buffered, self.staleness_sum = 0, 0
        if self.topology.role == "server":
            self.sum = np.zeros_like(self.incoming)

    def on_gradient(self, worker: int, grad: np.ndarray, staleness: int, samples: int) -> None:
        """Add the gradient (``each``: divided by its staleness) to the buffer; update at c."""
        if self.per_gradient and staleness > 1:
            grad /= staleness  # the receive buffer: scaled in place, no allocation
        self.sum += grad
        self.staleness_sum += staleness
        self.buffered += 1
        if self.buffered == self.c:
            self.flush()

    def flush(self) -> None:
        """Apply the buffered gradients' mean as one update (``mean``: lr / <sigma>)."""
        if self.buffered:
            self.sum /= self.buffered
            divisor = 1.0 if self.per_gradient else \
                max(self.staleness_sum / self.buffered, 1.0)
            self.apply(self.sum, 1.0, divisor)
            self.sum[...] = 0
            self.buffered, self.staleness_sum = 0, 0

    def finish_epoch(self) -> None:
        """Flush the partial buffer so every pushed gradient is applied this epoch."""
        self.flush()
