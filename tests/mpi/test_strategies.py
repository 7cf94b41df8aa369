"""SPMD, float64: the hierarchical strategies reduce exactly to ``sync`` where they should.

``sync`` here is the flat baseline, MPI's own allreduce (``--allreduce mpi``, sync's
default): ``hsgd`` runs the same node-then-rails reduction as ``sync --allreduce
hierarchical``, so comparing with that would compare a thing with itself.
"""

import numpy as np
import pytest
from mpi4py import MPI
from strategy_runs import PER_RANK, global_batch, layouts, run, world

from minidp import Tensor, layers, strategies
from minidp import functional as F
from minidp.comm import ALLREDUCE_ALGORITHMS, Topology
from minidp.io.mdp import write_mdp
from minidp.io.readers import MemoryReader
from minidp.optim import SGD

OPTIMIZERS = {"sgd": {}, "momentum": {"momentum": 0.9}, "nesterov": {"momentum": 0.9,
              "nesterov": True}, "weight_decay": {"momentum": 0.9, "weight_decay": 1e-2}}
REDUCTIONS = {  # strategy and options that must equal sync
    "hsgd-gradients": ("hsgd", {}),
    "hsgd-parameters": ("hsgd", {"average": "parameters"}),
    "hbsgd-k1": ("hbsgd", {"k": 1}),
    "daso-warmup": ("daso", {"warmup_epochs": 2, "cooldown_epochs": 0}),
    # epoch 1 would cycle after warm-up, but the cool-down wins
    "daso-cooldown": ("daso", {"warmup_epochs": 1, "cooldown_epochs": 1}),
    # Heat's single rail: the full node sync and update (all rails slice them, 2 x 2)
    "daso-rail": ("daso", {"warmup_epochs": 2, "cooldown_epochs": 0, "global_sync": "rail"}),
}


def flat_sync(ranks_per_node, **kw):
    return run("sync", ranks_per_node, allreduce="mpi", **kw)[0]


def same_on_every_rank(x):
    gathered = world.allgather(x)
    return all(np.array_equal(g, gathered[0]) for g in gathered)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
@pytest.mark.parametrize("case", REDUCTIONS)
def test_reduces_to_sync(case, optimizer):
    name, options = REDUCTIONS[case]
    for ranks_per_node in layouts():
        expected = flat_sync(ranks_per_node, optimizer=OPTIMIZERS[optimizer])
        got, _ = run(name, ranks_per_node, optimizer=OPTIMIZERS[optimizer], **options)
        assert same_on_every_rank(got)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
        assert np.abs(got - flat_sync(ranks_per_node, epochs=1)).max() > 1e-3  # it moved


def test_hsgd_applies_lars_to_the_averaged_gradient():
    lars = {"lars": True, "momentum": 0.9, "weight_decay": 1e-3}
    for ranks_per_node in layouts():
        expected = flat_sync(ranks_per_node, optimizer=lars)
        got, _ = run("hsgd", ranks_per_node, optimizer=lars)
        assert same_on_every_rank(got)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
        # LARS per replica on local gradients (parameter averaging) is another algorithm
        local, _ = run("hsgd", ranks_per_node, optimizer=lars, average="parameters")
        if world.size > 1:
            assert np.abs(local - expected).max() > 1e-9


def test_sync_is_bitwise_identical_on_every_rank_for_every_algorithm():
    results = [run("sync", 2 if world.size % 2 == 0 else 1, allreduce=a)[0]
               for a in ALLREDUCE_ALGORITHMS]
    for r in results:
        assert same_on_every_rank(r)
        np.testing.assert_allclose(r, results[0], rtol=0, atol=1e-12)


def test_hbsgd_with_k_above_one_differs_but_ends_epochs_equal():
    for ranks_per_node in layouts():
        got, s = run("hbsgd", ranks_per_node, k=3)
        assert same_on_every_rank(got)  # the epoch-end model average
        expected = flat_sync(ranks_per_node)
        if s.topology.num_nodes > 1:
            assert np.abs(got - expected).max() > 1e-9


def test_hsgd_level_one_keeps_nodes_equal_between_level_two_syncs():
    checks = []

    def after(s, epoch, b):
        node = s.topology.node.allgather(s.flat.data.copy())
        checks.append(all(np.array_equal(n, node[0]) for n in node))
    for ranks_per_node in layouts():
        checks.clear()
        run("hsgd", ranks_per_node, average="parameters", level2_period=4, after_step=after)
        assert all(checks)


def replica_gradient(model, w, x, y):
    """The gradient of the cross entropy at parameters ``w`` on (x, y), as a flat array."""
    flat = model.flat_parameters()
    flat.data[...] = w
    flat.zero_grad()
    F.cross_entropy(model(Tensor(x)), y).backward()
    return flat.grad.copy()


def local_sgd_reference(ranks_per_node, epochs=2, batches=5, lr=0.1, gradients="own",
                        average_every=None, node_every=None):
    """Every rank's parameters after plain SGD with averaging on a schedule, in NumPy.

    Written from the algorithms' equations, apart from the strategies: all N replicas are
    held here; per step each computes its gradient on its slice of the global batch;
    ``gradients="node"`` replaces each by its node's mean (HBSGD's bulk-synchronous
    groups); then w_r <- w_r - lr g_r; then, at steps t with t % average_every == 0, every
    replica becomes the world's mean, else at t % node_every == 0 its node's mean; each
    epoch ends with a world mean unless its last step made one.
    """
    n = world.size
    layers.manual_seed(0)
    model = layers.mlp(12, (10,), 3).to(np.float64)
    w = np.tile(model.flat_parameters().data.copy(), (n, 1))
    nodes = [list(range(k, k + ranks_per_node)) for k in range(0, n, ranks_per_node)]
    t = 0
    for epoch in range(epochs):
        for b in range(batches):
            t += 1
            x, y = global_batch(epoch, b, n)
            g = np.stack([replica_gradient(model, w[r], x[r * PER_RANK:(r + 1) * PER_RANK],
                                           y[r * PER_RANK:(r + 1) * PER_RANK])
                          for r in range(n)])
            if gradients == "node":
                for node in nodes:
                    g[node] = g[node].mean(axis=0)
            w = w - lr * g
            if average_every and t % average_every == 0:
                w[:] = w.mean(axis=0)
            elif node_every and t % node_every == 0:
                for node in nodes:
                    w[node] = w[node].mean(axis=0)
        if not (average_every and t % average_every == 0):
            w[:] = w.mean(axis=0)
    return w


def test_hsgd_local_sgd_equals_the_hand_computed_schedule():
    """Parameter averaging: the node level is the mean of the ranks' pre-average parameters."""
    for ranks_per_node in layouts():
        steps = []

        def after(s, epoch, b):
            steps.append(s.flat.data.copy())
        got, _ = run("hsgd", ranks_per_node, average="parameters", level1_period=1,
                     level2_period=4, after_step=after)
        expected = local_sgd_reference(ranks_per_node, average_every=4, node_every=1)
        np.testing.assert_allclose(got, expected[world.rank], rtol=0, atol=1e-12)
        # between world averages the nodes differ (the node branch ran), unless one node
        if ranks_per_node < world.size:
            differ = world.allgather(steps[0])
            assert np.abs(differ[0] - differ[-1]).max() > 1e-6


def test_hbsgd_k3_equals_the_hand_computed_k_avg_schedule():
    """Node gradient means every step, world parameter means at steps 3, 6, ... (K-AVG)."""
    for ranks_per_node in layouts():
        got, _ = run("hbsgd", ranks_per_node, k=3, batches=4)
        expected = local_sgd_reference(ranks_per_node, batches=4, gradients="node",
                                       average_every=3)
        np.testing.assert_allclose(got, expected[world.rank], rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def data_file(tmp_path_factory):
    path = None
    if world.rank == 0:
        rng = np.random.default_rng(3)
        path = str(tmp_path_factory.mktemp("data") / "d.mdp")
        write_mdp(path, rng.standard_normal((97, 1, 3, 4)).astype(np.float32),
                  rng.integers(0, 3, 97), 3, progress=False)
    return world.bcast(path)


def train_on_reader(reader, topo, batch_size, epochs=2):
    layers.manual_seed(0)
    model = layers.mlp(12, (10,), 3).to(np.float64)
    s = strategies.get("sync", model, SGD(model.parameters(), lr=0.1, momentum=0.9), topo)
    for epoch in range(epochs):
        for x, y in reader.iterate(epoch, batch_size):
            s.optimizer.zero_grad()
            F.cross_entropy(model(Tensor(x.astype(np.float64))), y).backward()
            s.step(0)
    return s.flat.data.copy()


def test_sync_with_memory_reader_equals_one_rank_with_n_times_the_batch(data_file):
    got = train_on_reader(MemoryReader(data_file, world), Topology(ranks_per_node=1), 3)
    single = Topology(MPI.COMM_SELF)
    expected = train_on_reader(MemoryReader(data_file, MPI.COMM_SELF), single, 3 * world.size)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)


def test_bad_options_are_clear_errors():
    with pytest.raises(ValueError, match=r"strategy 'daso': unknown option\(s\) skips; valid "
                                         "options: cooldown_epochs"):
        run("daso", 1, skips=3)
    with pytest.raises(TypeError, match=r"hbsgd.k: got '2.5', expected int: an int >= 1"):
        strategies.STRATEGIES["hbsgd"].parse_options({"k": "2.5"})
    with pytest.raises(ValueError, match=r"hbsgd.k: got 0, allowed: an int >= 1"):
        strategies.STRATEGIES["hbsgd"].parse_options({"k": 0})
    with pytest.raises(ValueError, match="hsgd periods: got level1_period 1, level2_period 2 "
                                         "with average='gradients'"):
        run("hsgd", 1, level2_period=2)
    with pytest.raises(ValueError, match="strategy: got 'nope', allowed: sync, hsgd, hbsgd, "
                                         "daso"):
        strategies.get("nope")
