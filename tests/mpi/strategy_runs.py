"""Shared driver of the strategy SPMD tests: a small float64 model on fixed data."""

import numpy as np
from mpi4py import MPI

from minidp import Tensor, layers, strategies
from minidp import functional as F
from minidp.comm import Topology
from minidp.optim import LARS, SGD

world = MPI.COMM_WORLD
_topologies = {}
FEATURES, CLASSES, PER_RANK = 12, 3, 4


def topology(ranks_per_node):
    if ranks_per_node not in _topologies:
        _topologies[ranks_per_node] = Topology(ranks_per_node=ranks_per_node)
    return _topologies[ranks_per_node]


_sub_topologies = {}


def sub_topology(comm_size, servers, ranks_per_node=None):
    """A topology over the first ``comm_size`` world ranks (None on the others)."""
    key = (comm_size, servers, ranks_per_node)
    if key not in _sub_topologies:
        sub = world.Split(0 if world.rank < comm_size else MPI.UNDEFINED, key=world.rank)
        _sub_topologies[key] = None if sub == MPI.COMM_NULL else Topology(sub, ranks_per_node,
                                                                          servers)
    return _sub_topologies[key]


def layouts():
    """Virtual node sizes valid at this world size: 1 rank per node, 2 (2x2), all (3x1)."""
    return sorted({k for k in (1, 2, world.size) if world.size % k == 0})


def global_batch(epoch, batch, ranks, per_rank=PER_RANK):
    rng = np.random.default_rng([7, epoch, batch])
    x = rng.standard_normal((ranks * per_rank, FEATURES))
    y = rng.integers(0, CLASSES, ranks * per_rank)
    return x, y


def build(name, topo, optimizer=None, **options):
    layers.manual_seed(0)
    model = layers.mlp(FEATURES, (10,), CLASSES).to(np.float64)
    optimizer = dict(optimizer or {})
    if optimizer.pop("lars", False):
        opt = LARS(model.parameters(), lr=2.0, **optimizer)
    else:
        opt = SGD(model.parameters(), lr=0.1, **optimizer)
    return strategies.get(name, model, opt, topo, **options)


def run(name, ranks_per_node, epochs=2, batches=5, optimizer=None, after_step=None,
        **options):
    """Train ``name`` on every rank; returns this rank's parameters and the strategy."""
    topo = topology(ranks_per_node)
    s = build(name, topo, optimizer, **options)
    s.plan(epochs)
    for epoch in range(epochs):
        s.begin_epoch(epoch, batches)
        for b in range(batches):
            x, y = global_batch(epoch, b, topo.size)
            mine = slice(topo.rank * PER_RANK, (topo.rank + 1) * PER_RANK)
            s.optimizer.zero_grad()
            loss = F.cross_entropy(s.model(Tensor(x[mine])), y[mine])
            loss.backward()
            s.step(b)
            if after_step is not None:
                after_step(s, epoch, b)
        s.end_epoch(epoch, 1.0)
    return s.flat.data.copy(), s
