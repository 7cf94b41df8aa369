"""Elastic averaging SGD: the original EASGD and the SC17 redesigns, on one small base.

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015, and
You, Buluc, Demmel, "Scaling deep learning on GPU and Knights Landing clusters", SC17.
Every worker i trains its own parameters x^i; a centre variable x~ holds the consensus.
Every ``tau`` steps a worker and the centre pull towards each other by the same amount::

    d   = alpha * (x^i - x~)          both from the values before this step's update
    x^i <- x^i - lr * g(x^i) - d      the worker: its gradient step and the elastic pull
    x~  <- x~ + d                     the centre: the equal and opposite pull

so ``x~ + sum_i x^i`` changes only by the gradient steps. The variants differ in who
holds the centre and in what order the pulls happen: ``easgd-rr`` (a server, workers in
rank order), ``easgd-async`` (a server, first come first served, the exchange overlapped
with the gradient), ``measgd-async`` (the same with Nesterov momentum on the workers),
``easgd-hogwild`` (the centre in a node's shared memory, updated without a lock) and
``easgd-sync``. See docs/easgd.md.

This file is the family's base: :class:`ElasticAveraging` (options, the worker's update)
and :class:`ElasticServer` (the master rank that holds the centre, the exchange). Each
id has its own file: ``easgd_rr.py``, ``easgd_async.py``, ``measgd_async.py``,
``easgd_hogwild.py``, ``easgd_sync.py``.

Epochs are counted in steps: every worker takes the epoch's ``batches`` steps over its own
shard (the paper's workers each run over their data), so all ranks meet at an epoch's end
(statistics, evaluation of the centre, checkpoints) after the slowest worker's last step.
"""

from __future__ import annotations

import base64
import time
from typing import Any, ClassVar

import numpy as np

from minidp.comm import broadcast, guard, p2p
from minidp.strategies.base import Option, Strategy
from minidp.strategies.events import ELASTIC_WORKER_COLUMNS, MASTER_COLUMNS, EventLog
from minidp.strategies.serving import ROUND_ROBIN, ServingOrder
from minidp.trace import tracer

TAG_PARAMS, TAG_CENTRE, TAG_DONE = 211, 212, 213
DEFAULT_BETA = 0.9  # the EASGD paper's centre rate, split over the workers by default


class ElasticAveraging(Strategy):
    """What every elastic variant shares: options, the worker's update, the centre's state.

    Options: ``alpha`` (the moving rate; -1, the default, means 0.9 / p: the EASGD
    paper's beta = 0.9 shared by the p workers that pull on one centre) and ``tau``
    (steps between exchanges; an exchange happens at the worker's steps 0, tau, 2 tau,
    ... counted over the run). The workers apply plain SGD with ``--lr`` and
    ``--weight-decay``; ``--momentum`` is not used (the papers' EASGD; ``measgd-async``
    has its own ``delta``).
    """

    options: ClassVar[dict[str, Option]] = {
        "alpha": Option(-1.0, float, "a moving rate in [0, 1], or -1: 0.9 / workers",
                        lambda v: v == -1 or 0 <= v <= 1),
        "tau": Option(1, int, "an int >= 1 (steps between elastic exchanges)",
                      lambda v: v >= 1),
    }
    ignores = ("momentum", "nesterov")
    ignored_hint = "its workers apply plain SGD (measgd-async has momentum: measgd-async.delta)"
    sgd_only = "the workers apply SGD"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        alpha = self.config["alpha"]
        self.alpha = DEFAULT_BETA / self.pulling_on_a_centre() if alpha == -1 else alpha
        self.difference = np.zeros_like(self.flat.data)  # alpha * (x - centre), reused
        self.exchanges = 0  # this worker's exchanges in the current epoch

    def pulling_on_a_centre(self) -> int:
        """p, the workers whose pulls one centre takes (the default alpha is 0.9 / p)."""
        return self.topology.num_workers

    def exchanging(self) -> bool:
        """Whether the step about to be taken (``self.steps``, 0-based) exchanges."""
        return self.steps % self.config["tau"] == 0

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Every worker takes ``batches`` steps this epoch; its exchange count restarts."""
        super().begin_epoch(epoch, batches)
        self.exchanges = 0

    def local_update(self, centre: np.ndarray | None) -> None:
        """The worker's update: x <- x - lr g(x) - alpha (x - centre), pulled from the pre-step x.

        ``centre`` None: a step without an exchange (the gradient step only). The pull
        is left in ``self.difference``: what the centre must add.
        """
        x = self.flat.data
        with tracer().phase("optimizer"):
            if centre is not None:
                np.subtract(x, centre, out=self.difference)  # d = alpha (x - centre)
                self.difference *= self.alpha
            self.optimizer.update(momentum=False)  # x <- x - lr (g + wd x): plain SGD
            if centre is not None:
                x -= self.difference  # x <- x - d
                self.exchanges += 1
        if centre is not None and tracer().detailed:  # the diagram's marker
            tracer().mark("elastic exchange", alpha=self.alpha)

    def epoch_stats(self) -> dict[str, Any]:
        """Exchanges per worker this epoch (counted by each worker), on every rank."""
        counts = guard.allgather_object(
            self.topology.world, self.exchanges if self.topology.role == "worker" else None,
            "epoch stats")
        return {"alpha": self.alpha, "worker_exchanges": {
            str(r): n for r, n in enumerate(counts) if n is not None}}

    @staticmethod
    def encode(array: np.ndarray) -> dict[str, Any]:
        """An array as JSON-able checkpoint state, bit for bit (base64 of its bytes)."""
        return {"dtype": array.dtype.str, "data": base64.b64encode(array.tobytes()).decode()}

    @staticmethod
    def decode(state: dict[str, Any], into: np.ndarray) -> None:
        """Write an :meth:`encode` d array back into ``into``."""
        into[...] = np.frombuffer(base64.b64decode(state["data"]), np.dtype(state["dtype"]))


class ElasticServer(ElasticAveraging):
    """A master rank (rank 0, the server) holds the centre; the workers exchange with it.

    Communication at worker i's exchange steps (all through ``comm.p2p``)::

        1. i sends x^i (its parameters before this step's update) to rank 0   [PARAMS]
        2. rank 0 receives it, sends back x~ as it is                          [CENTRE]
           and then applies x~ <- x~ + alpha (x^i - x~)
        3. i receives x~ and applies x^i <- x^i - lr g - alpha (x^i - x~)
        At the end of its epoch's steps, i sends DONE (an 8-byte header)      [DONE]

    Rank 0's loop (``serve``) probes for the next message (``order``: any worker first
    come first served, the workers in rank order, or a script of worker ranks:
    :mod:`minidp.strategies.serving`), answers it, and stops when every worker has sent
    DONE. ``overlap``: the worker posts steps 1 and 3 (``isend``,
    ``irecv``) before computing its gradient and waits for them after (SC17's Async
    EASGD); otherwise it sends and receives after computing (the original EASGD). The
    server's parameters are the centre: its checkpointed ``params`` and the model.
    """

    overlap: ClassVar[bool] = True

    @classmethod
    def servers_needed(cls, options: dict[str, Any]) -> int:
        """One master rank."""
        return 1

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        t = self.topology
        # easgd-rr's master takes the workers in rank order; easgd-async's follows its option
        self.order = ServingOrder(self.config.get("order", ROUND_ROBIN), t.worker_ranks,
                                  f"{self.name}.order", t.rank)
        self.header = np.zeros(1, np.int64)
        self.requests: list[p2p.PeerRequest] = []
        # The replay's record (minidp.strategies.events): the worker's steps, the master's
        # exchanges in the order it answered them.
        self.events = EventLog(MASTER_COLUMNS if t.role == "server" else
                               ELASTIC_WORKER_COLUMNS)
        if t.role == "server":
            self.centre = self.flat.data
            self.incoming = np.empty_like(self.flat.data)
        else:
            self.centre = np.empty_like(self.flat.data)  # where x~ arrives
        # What the worker sends: x^i, its parameters before the step (measgd-async keeps
        # them apart while its gradient is taken at the look-ahead point).
        self.outgoing = self.flat.data
        self.reset_stats()

    # -- worker side -----------------------------------------------------------------

    def batch_size(self, base: int) -> int:
        """Post the exchange before the gradient (``overlap``); DONE once the epoch is over."""
        size = super().batch_size(base)
        if not size:
            p2p.send(self.header, 0, TAG_DONE, self.topology, "done")
            return size
        self.before_compute()
        if self.overlap and self.exchanging():
            self.start_exchange()
        return size

    def before_compute(self) -> None:
        """Before forward and backward: here nothing (the gradient is taken at x^i)."""

    def step(self, batch: int) -> None:
        """Finish the exchange (if this step has one), then the elastic and gradient update."""
        centre = None
        exchanging = self.exchanging()
        if exchanging:
            centre = self.finish_exchange() if self.overlap else self.exchange_now()
        self.events.add(self.epoch, self.base_batch, exchanging)
        self.local_update(centre)
        self.steps += 1

    def start_exchange(self) -> None:
        """Post steps 1 and 3: isend(x^i) to the master, irecv(x~) from it.

        ``outgoing`` stays untouched until :meth:`finish_exchange`: forward and backward
        only read the model.
        """
        t = self.topology
        self.requests = [p2p.irecv(self.centre, 0, TAG_CENTRE, t, "centre"),
                         p2p.isend(self.outgoing, 0, TAG_PARAMS, t, "parameters")]

    def finish_exchange(self) -> np.ndarray:
        """Wait for the posted exchange; returns x~ as the master sent it."""
        for request in self.requests:
            request.wait()
        self.requests = []
        return self.centre

    def exchange_now(self) -> np.ndarray:
        """Steps 1 and 3 at once: send x^i to the master, receive x~; returns x~."""
        p2p.send(self.outgoing, 0, TAG_PARAMS, self.topology, "parameters")
        p2p.recv(self.centre, 0, TAG_CENTRE, self.topology, "centre")
        return self.centre

    # -- server side -------------------------------------------------------------------

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Statistics restart with the epoch."""
        super().begin_epoch(epoch, batches)
        self.reset_stats()

    def serve(self) -> None:
        """Answer exchanges until every worker has sent DONE."""
        t = self.topology
        active = list(t.worker_ranks)
        self.order.restart()
        while active:
            worker = self.order.next(active)  # None: first come, first served
            message = p2p.next_request(t, active,
                                       None if worker is None else active.index(worker))
            started = time.perf_counter()
            if message.tag == TAG_DONE:
                p2p.recv(self.header, message.source, TAG_DONE, t, "done")
                active.remove(message.source)
            elif message.tag == TAG_PARAMS:
                self.exchange(message.source)
            else:
                raise ValueError(f"rank {t.rank}: unexpected message tag {message.tag} from "
                                 f"rank {message.source}")
            self.busy_s += time.perf_counter() - started
        self.serve_s = time.perf_counter() - self.stats_started

    def exchange(self, worker: int) -> None:
        """Receive x^i, answer with x~, then x~ <- x~ + alpha (x^i - x~)."""
        t = self.topology
        p2p.recv(self.incoming, worker, TAG_PARAMS, t, "parameters")
        p2p.send(self.centre, worker, TAG_CENTRE, t, "centre")
        self.events.add(worker, self.epoch)
        if tracer().detailed_for(worker):  # the diagram's marker, of its first steps
            tracer().mark("centre exchange", worker=worker, alpha=self.alpha)
        with tracer().phase("optimizer"):
            # The same operations as the worker's local_update: the same d, bit for bit.
            np.subtract(self.incoming, self.centre, out=self.incoming)
            self.incoming *= self.alpha
            self.centre += self.incoming

    # -- statistics, result --------------------------------------------------------------

    def reset_stats(self) -> None:
        """Zero the server's counters of this epoch."""
        self.stats_started = time.perf_counter()
        self.busy_s, self.serve_s = 0.0, 0.0

    def epoch_stats(self) -> dict[str, Any]:
        """Exchanges per worker and the server's busy share (time answering over serving)."""
        stats = super().epoch_stats()
        share = self.busy_s / max(self.serve_s, 1e-9) if self.topology.rank == 0 else 0.0
        stats.update(exchanges=sum(stats["worker_exchanges"].values()),
                     server_busy_share=guard.bcast_object(self.topology.world, share, 0,
                                                          "epoch stats"))
        return stats

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """The server refuses a centre that is not finite (naming the epoch)."""
        if self.topology.role == "server" and not np.all(np.isfinite(self.centre)):
            raise FloatingPointError(f"rank {self.topology.rank}: the centre is not finite "
                                     f"after epoch {epoch + 1}; lower --lr or alpha")

    def consensus(self) -> np.ndarray:
        """The centre, broadcast from the server to every rank."""
        return broadcast(self.centre, self.topology, 0, "centre parameters")
