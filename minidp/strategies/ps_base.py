"""The parameter-server family's common part: roles, the pull/push protocol, the serve loop.

``asgd``, ``amsgd``, ``softsync`` and ``dbs`` are short classes on
:class:`ParameterServer`; each overrides what its paper changes (what the server does
with an arriving gradient, or how large the next batch of a worker is).

Roles: ranks 0..K-1 are servers (``--set NAME.servers=K``, default 1), the others are
workers. Server k owns slice k of the flat parameter vector (contiguous, sizes differing
by at most one element), as real parameter servers shard a model.

Epochs are counted in samples, not in steps: server 0 holds the epoch's budget (the
samples a synchronous run would use: ``batches x batch x workers``) and grants each
pull a batch while the budget lasts. A fast worker therefore takes more of an epoch
than a slow one (it reuses its shard in a new order when it runs out), which is what
lets an asynchronous run finish an epoch in the time of the *total* throughput
instead of the slowest worker's. ``epoch=shard`` gives each worker its own equal
budget instead (``batches x batch``: its shard, as ASGD over fixed data partitions
runs), so a fast worker's epoch ends early and the slowest worker's sets the pace.
The epoch ends for a worker when server 0 answers its pull with 0; after every
worker has heard that, all ranks meet for the epoch's end (statistics, evaluation of
the servers' parameters, checkpoints).
"""

from __future__ import annotations

import time
from typing import Any, ClassVar

import numpy as np

from minidp.comm import broadcast, p2p
from minidp.comm.allreducers import chunk_bounds
from minidp.strategies.base import Option, Strategy
from minidp.strategies.events import (
    EPOCH_END,
    GRADIENT,
    LEAVE,
    SERVER_COLUMNS,
    EventLog,
    worker_columns,
)
from minidp.strategies.serving import ALLOWED, FCFS, ServingOrder, is_order
from minidp.trace import tracer

TAG_PULL, TAG_REPLY, TAG_PARAMS, TAG_PUSH, TAG_GRADIENT, TAG_DONE = range(201, 207)
HISTOGRAM_BINS = 33  # staleness 0..31, and one bin for 32 or more


class ParameterServer(Strategy):
    """Asynchronous SGD through parameter servers (Downpour-style), first come first served.

    Communication (worker w, servers 0..K-1, all point-to-point through ``comm.p2p``)::

        1. pull (Trainer asks batch_size): w sends [PULL, wanted batch] to server 0;
           server 0 answers [granted batch, version] and, when granted > 0, its slice
           of the parameters; then w pulls from servers 1..K-1 the same way. Granted 0
           ends w's epoch: w sends DONE to servers 1..K-1 instead.
        2. w computes a gradient on the granted batch at the pulled parameters
           (no communication; a slow worker is slow here).
        3. push (step): w sends to every server [version pulled, samples, compute us]
           and the gradient's slice.
        Server loop (serve): probe(ANY_SOURCE) and answer whatever came first
        (``order``: probe the next worker of the order instead):
        a pull (grant while the epoch's budget lasts; the answer goes out with
        isend from a copy of the slice, completed at w's next pull), a push
        (receive, then on_gradient: here w <- w - lr * g at once, version += 1), a DONE.

    Staleness of a gradient = server version when it is applied - version pulled.
    Workers wait for their own pulls (and, for large gradients, until the server takes
    their push: MPI's rendezvous); they never wait for each other. The server waits only
    when idle: it never waits for a worker to take its parameters. With one worker this
    is exactly sequential SGD. ``order`` (one server) fixes the order instead of the
    scheduler: ``round_robin`` takes the workers' messages in turn, a script such as
    ``2,3,1x12`` takes them as written (:mod:`minidp.strategies.serving`); the run, every
    gradient's staleness included, is then the same every time.
    """

    options: ClassVar[dict[str, Option]] = {
        "servers": Option(1, int, "an int >= 1 (ranks 0..K-1 serve parameter slices)",
                          lambda v: v >= 1),
        "order": Option(FCFS, str, f"{ALLOWED}; round_robin and scripts with one server",
                        is_order),
        "epoch": Option("budget", str, "budget (the workers share the epoch's samples: fast "
                        "ones take more) or shard (each worker its own equal share)",
                        lambda v: v in ("budget", "shard")),
    }
    server_momentum: ClassVar[bool] = False  # asgd: plain SGD at the server
    sgd_only = "the server applies SGD to its parameter slice"
    ignored_hint = "it applies plain SGD at the server (amsgd keeps momentum there)"

    @classmethod
    def servers_needed(cls, options: dict[str, Any]) -> int:
        """K server ranks, from the ``servers`` option."""
        return options["servers"]

    @classmethod
    def ignored_flags(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """``--momentum`` and ``--nesterov`` unless the server keeps a momentum buffer."""
        return () if cls.server_momentum else ("momentum", "nesterov")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        t = self.topology
        order = self.config["order"]
        if order != FCFS and t.num_servers > 1:
            # A worker pulls from the servers one after another: two servers each waiting
            # for its own choice of worker could wait for each other through them.
            raise ValueError(f"rank {t.rank}: {self.name}.order: got {order!r} with "
                             f"{t.num_servers} servers, allowed: fcfs, or round_robin or a "
                             "script with one server")
        self.order = ServingOrder(order, t.worker_ranks, f"{self.name}.order", t.rank)
        bounds = chunk_bounds(self.flat.size, t.num_servers)
        self.slices = [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:])]
        self.header = np.zeros(4, np.int64)
        self.reply = np.zeros(4, np.int64)
        self.versions_read = np.zeros(t.num_servers, np.int64)
        self.granted, self.pulled_at = 0, 0.0
        self.version = 0  # updates this server has applied over the run
        self.samples_applied = 0  # samples behind those updates (the LR schedule's clock)
        self.active: list[int] = []  # server: workers whose epoch goes on (set by serve)
        # The replay's record (minidp.strategies.events): a worker's steps, a server's events.
        self.events = EventLog(SERVER_COLUMNS if t.role == "server" else
                               worker_columns(t.num_servers))
        if t.role == "server":
            self.shard = self.slices[t.rank]
            self.incoming = np.empty(self.shard.stop - self.shard.start, self.flat.data.dtype)
            # Replies go out non-blocking from a copy per worker: a blocking send of the
            # parameters would hold the server until the worker takes them (MPI's
            # rendezvous for large messages), i.e. as long as that worker is descheduled.
            self.outgoing = {w: (np.zeros(4, np.int64), np.empty_like(self.incoming))
                             for w in t.worker_ranks}
            self.sending: dict[int, list[p2p.PeerRequest]] = {w: [] for w in t.worker_ranks}
        self.reset_stats()

    # -- worker side -------------------------------------------------------------------

    def batch_size(self, base: int) -> int:
        """1. pull: the next batch's size from server 0 (0 ends the epoch), the parameters."""
        self.granted = self.pull_parameters(base)
        return self.granted

    def step(self, batch: int) -> None:
        """3. push: the gradient's slices, each tagged with the version it was computed at."""
        self.steps += 1
        self.push_gradient()

    def pull_parameters(self, wanted: int) -> int:
        """Ask for ``wanted`` samples; receive each server's slice and version; the grant.

        Server 0 answers first: [granted, version], then its slice when granted > 0; the
        other servers then the same way. Granted 0 ends this worker's epoch, and the
        other servers are told DONE instead of asked.
        """
        t = self.topology
        self.header[:] = (wanted, 0, 0, 0)
        p2p.send(self.header, 0, TAG_PULL, t, "pull")
        p2p.recv(self.reply, 0, TAG_REPLY, t, "pull reply", self.reply_from(0))
        granted = int(self.reply[0])
        if granted == 0:
            for server in t.server_ranks[1:]:
                p2p.send(self.header, server, TAG_DONE, t, "done")
            return 0
        for server in t.server_ranks:
            if server:
                p2p.send(self.header, server, TAG_PULL, t, "pull")
                p2p.recv(self.reply, server, TAG_REPLY, t, "pull reply",
                         self.reply_from(server))
            self.versions_read[server] = self.reply[1]
            p2p.recv(self.flat.data[self.slices[server]], server, TAG_PARAMS, t, "parameters")
        self.pulled_at = time.perf_counter()
        return granted

    def push_gradient(self) -> None:
        """Send every server [version pulled, samples, compute us] and its gradient slice.

        The step is recorded for the replay first (epoch, samples, the versions read).
        """
        t = self.topology
        self.events.add(self.epoch, self.granted, *self.versions_read)
        compute_us = int((time.perf_counter() - self.pulled_at) * 1e6)
        for server in t.server_ranks:
            self.header[:] = (self.versions_read[server], self.granted, compute_us, 0)
            p2p.send(self.header, server, TAG_PUSH, t, "push")
            p2p.send(self.flat.grad[self.slices[server]], server, TAG_GRADIENT, t,
                     "push gradient")

    def reply_from(self, server: int) -> list[int]:
        """The ranks a pull's answer waits on, named if it never comes: the server."""
        return [server]

    # -- server side ---------------------------------------------------------------------

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Server 0 opens the epoch's sample budget(s); statistics restart."""
        super().begin_epoch(epoch, batches)
        workers = self.topology.worker_ranks
        # Each worker's entry is a one-element counter; shared, it is the same object.
        if self.config["epoch"] == "shard":
            self.budgets = {w: [batches * self.base_batch] for w in workers}
        else:
            shared = [batches * self.base_batch * len(workers)]
            self.budgets = dict.fromkeys(workers, shared)
        self.reset_stats()

    def serve(self) -> None:
        """Answer pulls, pushes and DONEs until every worker's epoch is over."""
        t = self.topology
        self.active = list(t.worker_ranks)
        self.order.restart()
        while self.active:
            # fcfs: whoever comes first; else the order's next worker that can send
            worker = self.order.next(self.active, self.holds)
            message = p2p.next_request(t, self.active,
                                       None if worker is None else self.active.index(worker))
            started = time.perf_counter()
            self.handle(message.source, message.tag)
            self.stats["busy_s"] += time.perf_counter() - started
        for worker in t.worker_ranks:
            self.sent(worker)
        self.events.add(EPOCH_END, -1, 0, 0)
        self.finish_epoch()
        self.stats["serve_s"] = time.perf_counter() - self.stats_started

    def handle(self, worker: int, tag: int) -> None:
        """Take one message of ``worker``: a DONE, a push or a pull."""
        t = self.topology
        p2p.recv(self.header, worker, tag, t, "request")
        if tag == TAG_DONE:
            self.leave(worker)
        elif tag == TAG_PUSH:
            version_read, samples = int(self.header[0]), int(self.header[1])
            self.observe(worker, samples, int(self.header[2]) * 1e-6)
            p2p.recv(self.incoming, worker, TAG_GRADIENT, t, "gradient")
            staleness = self.version - version_read
            self.record(worker, staleness, samples)
            self.events.add(GRADIENT, worker, staleness, samples)
            version = self.version
            self.on_gradient(worker, self.incoming, staleness, samples)
            self.mark_gradient(worker, staleness, applied=self.version != version)
            self.samples_applied += samples  # after: the LR of this gradient is its round's
        elif tag == TAG_PULL:
            self.on_pull(worker, int(self.header[0]))
        else:
            raise ValueError(f"rank {t.rank}: unexpected message tag {tag} from rank {worker}")

    def holds(self, worker: int) -> bool:
        """Whether ``worker``'s pull waits at this server (here never; ``dbs``'s rounds)."""
        return False

    def mark_gradient(self, worker: int, staleness: int, applied: bool) -> None:
        """The trace's decision (the diagram's marker): a gradient taken, the rate in force.

        For each worker's first steps only (:meth:`minidp.trace.Tracer.detailed_for`),
        so a long run's later ones cost nothing.
        """
        if tracer().detailed_for(worker):
            tracer().mark("server update" if applied else "server gradient", worker=worker,
                          staleness=staleness, lr=self.optimizer.lr, version=self.version)

    def on_pull(self, worker: int, wanted: int) -> None:
        """A pull asking for ``wanted`` samples: answered at once (``dbs`` may hold it)."""
        self.answer(worker, wanted)

    def answer(self, worker: int, wanted: int) -> None:
        """Grant a batch (server 0, from the epoch's budget) and send this server's slice."""
        t = self.topology
        granted = wanted
        if t.rank == 0:
            granted = self.assign_batch(worker, wanted)
            budget = self.budgets[worker]
            granted = granted if 0 < granted <= budget[0] else 0
            budget[0] -= granted
        self.sent(worker)
        header, params = self.outgoing[worker]
        header[:] = (granted, self.version, 0, 0)
        self.sending[worker].append(p2p.isend(header, worker, TAG_REPLY, t, "pull reply"))
        if granted:
            params[:] = self.flat.data[self.shard]
            self.sending[worker].append(p2p.isend(params, worker, TAG_PARAMS, t, "parameters"))
        else:
            self.leave(worker)

    def leave(self, worker: int) -> None:
        """``worker``'s epoch is over at this server."""
        self.active.remove(worker)
        self.events.add(LEAVE, worker, 0, 0)

    def sent(self, worker: int) -> None:
        """Complete the last reply to ``worker`` (taken already unless the epoch ends)."""
        for request in self.sending[worker]:
            request.wait()
        self.sending[worker].clear()

    def assign_batch(self, worker: int, wanted: int) -> int:
        """Server 0: the batch size ``worker`` takes next (here: what it asked for)."""
        return wanted

    def observe(self, worker: int, samples: int, compute_s: float) -> None:
        """Server: a worker reports its batch and compute time with each push."""

    def on_gradient(self, worker: int, grad: np.ndarray, staleness: int, samples: int) -> None:
        """ASGD: apply every gradient at once, as it arrives."""
        self.apply(grad, 1.0)

    def finish_epoch(self) -> None:
        """Server: called once every worker's epoch is over (softsync flushes here)."""

    def apply(self, grad: np.ndarray, scale: float = 1.0, lr_divisor: float = 1.0) -> None:
        """One server update of this shard: w <- w - (lr / lr_divisor) (scale g + wd w).

        Through the optimizer (SGD.update of the shard; momentum where the server keeps it). The
        gradient is scaled, not the rate, so weight decay acts once per update; it is
        scaled in place (callers pass a receive or accumulation buffer they reuse). The
        rate runs on the server's own clock: ``lr_schedule(samples applied // (b x
        workers))``, set on the optimizer before the step.
        """
        with tracer().phase("optimizer"):
            if self.lr_schedule is not None:
                round_samples = self.base_batch * self.topology.num_workers
                self.optimizer.lr = self.lr_schedule(self.samples_applied // round_samples)
            if scale != 1.0:
                grad *= scale
            self.optimizer.update(grad, self.shard, momentum=self.server_momentum,
                                  lr_divisor=lr_divisor)
        self.version += 1
        self.stats["updates"] += 1

    # -- statistics, result, checkpoints ----------------------------------------------------

    def reset_stats(self) -> None:
        """Zero this epoch's counters."""
        self.stats_started = time.perf_counter()
        self.stats: dict[str, Any] = {
            "updates": 0, "busy_s": 0.0, "serve_s": 0.0,
            "staleness_histogram": [0] * HISTOGRAM_BINS, "staleness_sum": 0,
            "staleness_max": 0, "gradients": 0,
            "worker_samples": {r: 0 for r in self.topology.worker_ranks},
            "worker_steps": {r: 0 for r in self.topology.worker_ranks}}

    def record(self, worker: int, staleness: int, samples: int) -> None:
        """Count one arriving gradient: its staleness and its worker's samples."""
        s = self.stats
        s["staleness_histogram"][min(staleness, HISTOGRAM_BINS - 1)] += 1
        s["staleness_sum"] += staleness
        s["staleness_max"] = max(s["staleness_max"], staleness)
        s["gradients"] += 1
        s["worker_samples"][worker] += samples
        s["worker_steps"][worker] += 1

    def epoch_stats(self) -> dict[str, Any]:
        """Server 0's view of the epoch: updates, staleness, per-worker work, busy share."""
        s = self.stats
        if self.topology.rank != 0:
            return {}
        steps = s["worker_steps"]
        return {
            "updates": s["updates"], "gradients": s["gradients"],
            "staleness_mean": s["staleness_sum"] / max(s["gradients"], 1),
            "staleness_max": s["staleness_max"],
            "staleness_histogram": s["staleness_histogram"],
            "worker_samples": {str(r): n for r, n in s["worker_samples"].items()},
            "worker_mean_batch": {str(r): s["worker_samples"][r] / max(steps[r], 1)
                                  for r in steps},
            "server_busy_share": s["busy_s"] / max(s["serve_s"], 1e-9)}

    def consensus(self) -> np.ndarray:
        """The servers' parameters, every slice broadcast from its server to every rank."""
        for server, part in zip(self.topology.server_ranks, self.slices):
            broadcast(self.flat.data[part], self.topology, server, "centre parameters")
        return self.flat.data

    def state_dict(self) -> dict[str, Any]:
        """Steps, the server's version and the samples behind it."""
        return dict(super().state_dict(), version=self.version,
                    samples_applied=self.samples_applied)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        super().load_state_dict(state)
        self.version, self.samples_applied = int(state["version"]), int(state["samples_applied"])
