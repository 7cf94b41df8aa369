"""What the textbook programs are compared with: minidp's strategies, the rules, a serial run.

Imported inside the SPMD job (``tests/scripts/run_textbook.py``). The programs on the
pages train minidp's MLP 12 -> 10 -> 3 in float64, seeded 0, on synthetic samples: rank
r's n samples of step s are ``default_rng([s, r]).standard_normal((n, 12))``, labelled by
the largest of their first three features; plain SGD at rate 0.1. Everything here is
written apart from the pages, from that description:

* :func:`production`: the strategy of minidp, built through ``strategies.get`` and
  driven through its public API (``plan``, ``begin_epoch``, ``batch_size``, ``step``,
  ``serve``, ``end_epoch``, ``consensus``) on the same samples, as a user's own loop
  would (``examples/sync.py``);
* :func:`servers_rules` and :func:`elastic_rules`: a first-come-first-served run
  re-executed in one process, in the order its server logged, from the replay's rules
  (:mod:`minidp.replay.rules`, the papers' equations).

Each returns what it compares, by the names the programs use: ``x`` (this rank's
parameters; a server's are the served ones) and ``centre``.
"""

from __future__ import annotations

from collections import Counter

import numpy as np
from mpi4py import MPI

from minidp import Tensor, layers, strategies
from minidp import functional as F
from minidp.comm import Topology
from minidp.optim import SGD
from minidp.replay import rules

FEATURES, HIDDEN, CLASSES, BATCH, LR = 12, 10, 3, 4, 0.1
PULL = 1  # the programs' tag of a pull (the server logs each message's tag)
SERVERS = {"asgd": 1, "amsgd": 1, "softsync": 1, "dbs": 1, "easgd-rr": 1,
           "easgd-async": 1, "measgd-async": 1}


def samples(step: int, rank: int, n: int = BATCH) -> tuple[np.ndarray, np.ndarray]:
    """Rank ``rank``'s ``n`` samples of its step ``step``, and their labels."""
    x = np.random.default_rng([step, rank]).standard_normal((n, FEATURES))
    return x, x[:, :CLASSES].argmax(axis=1)


def model() -> layers.Module:
    """The programs' model, freshly initialised (seed 0, float64)."""
    layers.manual_seed(0)
    return layers.mlp(FEATURES, (HIDDEN,), CLASSES).to(np.float64)


class Gradients:
    """The gradient of the loss at given parameters: one model, reused."""

    def __init__(self) -> None:
        self.model = model()
        self.flat = self.model.flat_parameters()
        self.start = self.flat.data.copy()  # every program's x_0 (rank 0's, broadcast)

    def __call__(self, x: np.ndarray, step: int, rank: int, n: int = BATCH) -> np.ndarray:
        data, labels = samples(step, rank, n)
        self.flat.data[...] = x
        self.flat.zero_grad()
        F.cross_entropy(self.model(Tensor(data)), labels).backward()
        return self.flat.grad.copy()


# -- minidp's strategies ---------------------------------------------------------------


def production(strategy: str, options: dict) -> dict[str, np.ndarray]:
    """Train ``strategy`` on the world with ``options``; this rank's ``x`` (and ``centre``).

    ``options`` holds the layout and length (``ranks_per_node``, ``epochs``, ``steps``:
    steps per epoch and worker), the optimizer's ``momentum``, and the strategy's own
    options. Every worker's k-th step (over the run) takes ``samples(k, rank, n)``.
    """
    options = dict(options)
    epochs, steps = options.pop("epochs", 1), options.pop("steps")
    momentum = options.pop("momentum", 0.0)
    topology = Topology(MPI.COMM_WORLD, options.pop("ranks_per_node", None),
                        SERVERS.get(strategy, 0))
    net = model()
    optimizer = SGD(net.parameters(), lr=LR, momentum=momentum)
    s = strategies.get(strategy, net, optimizer, topology, **options)
    s.plan(epochs, BATCH)
    taken = 0
    for epoch in range(epochs):
        s.begin_epoch(epoch, steps)
        if topology.role == "server":
            s.serve()
        else:
            batch = 0
            while n := s.batch_size(BATCH):
                optimizer.zero_grad()
                data, labels = samples(taken, topology.rank, n)
                F.cross_entropy(net(Tensor(data)), labels).backward()
                s.step(batch)
                batch, taken = batch + 1, taken + 1
        s.end_epoch(epoch, 1.0)
    x = s.flat.data.copy()
    centre = s.consensus().copy()  # collective: every rank calls it
    if strategy.startswith(("easgd", "measgd")):
        if strategy in SERVERS:  # the master holds the centre, the workers their x
            return {"centre": centre} if topology.rank == 0 else {"x": x}
        return {"x": x, "centre": centre}
    if strategy in SERVERS:  # the server's parameters
        return {"x": centre} if topology.rank == 0 else {}
    return {"x": x}


# -- a first-come-first-served run, re-executed from the rules ------------------------------


def servers_rules(strategy: str, options: dict, log: list, workers: int) -> dict[str, np.ndarray]:
    """The server's parameters after the messages of ``log``, in its order, by the rules.

    ``log``: the server's messages as it took them, ``(tag, worker)``, with the batch
    size granted as a third entry for ``dbs``. A pull gives the worker the parameters as
    they are (and the version, for its gradient's staleness); a push is that worker's
    next gradient, taken at what it pulled, applied by its paper's rule.
    """
    gradient = Gradients()
    x = gradient.start.copy()
    buf = np.zeros_like(x)
    pulled: dict[int, tuple[np.ndarray, int, int]] = {}
    steps: Counter[int] = Counter()
    version, held, sigmas = 0, [], []
    c = workers // options.get("n", 1)
    for tag, worker, *size in log:
        n = size[0] if size else BATCH
        if tag == PULL:
            pulled[worker] = (x.copy(), version, n)
            continue
        at, read, n = pulled[worker]
        g = gradient(at, steps[worker], worker, n)
        steps[worker] += 1
        if strategy == "softsync":  # Gupta et al.: c gradients, the mean staleness
            held.append(g)
            sigmas.append(version - read)
            if len(held) == c:
                rules.sgd(x, rules.mean(held), rules.mean_staleness_rate(LR, sigmas))
                version, held, sigmas = version + 1, [], []
        elif strategy == "dbs":
            rules.sgd(x, rules.sample_weight(g, n, BATCH), LR)
        else:
            rules.sgd(x, g, LR, momentum=options.get("momentum", 0.0), buf=buf)
            version += 1
    return {"x": x}


def elastic_rules(options: dict, log: list[int], workers: int) -> dict[str, np.ndarray]:
    """The centre and every worker's x after the exchanges of ``log``, in its order.

    ``log``: the workers in the order the master answered them. Worker i's steps between
    its exchanges involve nobody else, so each is taken when its next exchange comes;
    the exchange moves the centre and the worker by d = alpha (x^i - x~) (Algorithm 1;
    with ``delta``, Algorithm 2's look-ahead and velocity).
    """
    gradient = Gradients()
    tau, total, delta = options["tau"], options["steps"], options.get("delta", 0.0)
    alpha = 0.9 / workers
    centre = gradient.start.copy()
    ranks = range(1, workers + 1)
    x = {r: gradient.start.copy() for r in ranks}
    v = {r: np.zeros_like(centre) for r in ranks}
    done: Counter[int] = Counter()

    def step(r: int, exchange: bool) -> None:
        y = rules.look_ahead(x[r], v[r], delta)
        g = gradient(y, done[r], r)
        sent = None
        if exchange:
            sent = centre.copy()
            centre[...] += rules.elastic_difference(x[r], centre, alpha)
        rules.eamsgd_step(x[r], y, v[r], g, sent, alpha, LR, 0.0)
        done[r] += 1

    for r in log:
        while done[r] % tau:
            step(r, exchange=False)
        step(r, exchange=True)
    for r in ranks:
        while done[r] < total:
            step(r, exchange=False)
    return {"centre": centre, **{f"x{r}": x[r] for r in ranks}}
