"""``softsync``: n-softsync with a staleness-dependent learning rate (Zhang, Gupta, Lian, Liu 2016).

Zhang et al., "Staleness-aware Async-SGD for Distributed Deep Learning", IJCAI 2016
(arXiv 1511.05950). Protocol and learning-rate rule as recalled in
``shared/notes/ALGORITHMS.md`` section 6.2.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.strategies.base import Option
from minidp.strategies.ps import ParameterServer


class SoftSyncSGD(ParameterServer):
    """n-softsync: the server updates once it holds c = floor(lambda / n) gradients.

    lambda learners (workers) push gradients as in ``asgd``; the server collects them
    from any learners (a fast one may give several) and, at the c-th, applies::

        w <- w - (1/c) * sum_l alpha(sigma_l) * g_l,    alpha(sigma) = lr / max(sigma, 1)

    where sigma_l is the staleness of gradient l (updates since its learner pulled).
    ``n = lambda`` gives c = 1: ASGD with a staleness-scaled rate. ``n = 1`` gives
    c = lambda: with one gradient from every learner per update (``order=round_robin``)
    every staleness is 0 and the run is synchronous SGD on a batch of lambda x b.

    The server keeps ``--momentum`` (and ``--nesterov``) on these averaged updates, as
    ``amsgd`` does: at n = 1 an update is a synchronous step on lambda x b samples, and
    minidp's synchronous SGD uses momentum (``--momentum 0`` gives the paper's plain form).

    Communication: as :class:`ParameterServer`; workers never wait for each other, only
    for their own pulls. At an epoch's end the server applies what its buffer still
    holds as one update averaged over those gradients (flushed, so no gradient is
    lost and the epoch's evaluation sees all of them).
    """

    name = "softsync"
    options: ClassVar[dict[str, Option]] = dict(ParameterServer.options, n=Option(
        1, int, "an int >= 1 (1: softest barrier, c = workers; workers: ASGD)",
        lambda v: v >= 1))
    server_momentum = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        workers = self.topology.num_workers
        if self.config["n"] > workers:
            raise ValueError(f"rank {self.topology.rank}: softsync.n: got {self.config['n']}, "
                             f"allowed: 1 to the {workers} workers")
        self.c = workers // self.config["n"]
        self.buffered = 0
        if self.topology.role == "server":
            self.sum = np.zeros_like(self.incoming)

    def on_gradient(self, worker: int, grad: np.ndarray, staleness: int, samples: int) -> None:
        """Add alpha(sigma)/lr * g to the buffer; update at the c-th gradient."""
        if staleness > 1:
            grad *= 1.0 / staleness  # the receive buffer: scaled in place, no allocation
        self.sum += grad
        self.buffered += 1
        if self.buffered == self.c:
            self.flush()

    def flush(self) -> None:
        """Apply the buffered gradients as one update, scaled 1/(number buffered)."""
        if self.buffered:
            self.apply(self.sum, 1.0 / self.buffered)
            self.sum[...] = 0
            self.buffered = 0

    def finish_epoch(self) -> None:
        """Flush the partial buffer so every pushed gradient is applied this epoch."""
        self.flush()
