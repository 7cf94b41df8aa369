"""SPMD, float64: the parameter-server family and hogwild against exact references."""

import numpy as np
import pytest
from mpi4py import MPI
from strategy_runs import CLASSES, FEATURES, build
from strategy_runs import sub_topology as topology

from minidp import Tensor, layers
from minidp import functional as F
from minidp.comm import Topology
from minidp.optim import SGD, LRScheduler, StepLR
from minidp.strategies.dbs import proportional_sizes

world = MPI.COMM_WORLD
BASE = 4


def batch(epoch, worker, step, n):
    rng = np.random.default_rng([11, epoch, worker, step])
    return rng.standard_normal((n, FEATURES)), rng.integers(0, CLASSES, n)


def gradient(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(Tensor(x)), y).backward()


def drive(name, topo, epochs=2, batches=3, optimizer=None, schedule=None, **options):
    """Run the strategy's roles; returns (centre parameters, per-epoch stats, strategy)."""
    s = build(name, topo, optimizer, **options)
    s.plan(epochs, BASE, schedule)
    stats = []
    for epoch in range(epochs):
        s.begin_epoch(epoch, batches)
        if topo.role == "server":
            s.serve()
        else:
            step = 0
            while n := s.batch_size(BASE):
                gradient(s.model, *batch(epoch, topo.rank, step, n))
                s.step(step)
                step += 1
        s.end_epoch(epoch, 1.0)
        centre = s.consensus().copy()
        stats.append(topo.world.bcast(s.epoch_stats()))
    return centre, stats, s


def sequential(epochs, rounds, workers, optimizer=None, lr=0.1, schedule=None):
    """Single-process SGD where step k of an epoch uses every worker's step-k batch."""
    layers.manual_seed(0)
    model = layers.mlp(FEATURES, (10,), CLASSES).to(np.float64)
    opt = SGD(model.parameters(), lr=lr, **(optimizer or {}))
    scheduler = LRScheduler(opt, schedule) if schedule else None
    for epoch in range(epochs):
        for k in range(rounds):
            parts = [batch(epoch, w, k, BASE) for w in workers]
            gradient(model, np.concatenate([p[0] for p in parts]),
                     np.concatenate([p[1] for p in parts]))
            opt.step()
            if scheduler:
                scheduler.step()
    return model.flat_parameters().data.copy()


@pytest.mark.parametrize("name,optimizer", [("asgd", {}), ("amsgd", {"momentum": 0.9}),
                                            ("amsgd", {"momentum": 0.9, "nesterov": True})])
def test_one_worker_is_sequential_sgd_step_for_step(name, optimizer):
    if world.size < 2:
        pytest.skip("needs a server and a worker: 2 ranks or more")
    topo = topology(2, 1)
    if topo is not None:
        got, stats, _ = drive(name, topo, optimizer=optimizer)
        expected = sequential(2, 3, [1], optimizer)
        np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
        assert [s["updates"] for s in stats] == [3, 3]
        assert [s["staleness_max"] for s in stats] == [0, 0]
    world.Barrier()


@pytest.mark.parametrize("schedule,optimizer,kept", [(None, {}, False),
                                                     (StepLR(0.1, 2), {}, False),
                                                     (None, {"momentum": 0.9}, True),
                                                     (None, {"momentum": 0.9}, False)])
def test_softsync_n1_in_turn_is_synchronous_sgd(schedule, optimizer, kept):
    if world.size < 2:
        pytest.skip("needs a server and a worker: 2 ranks or more")
    topo = topology(world.size, 1)
    got, stats, _ = drive("softsync", topo, n=1, order="round_robin", schedule=schedule,
                          optimizer=optimizer, server_momentum=kept)
    # The server's momentum only when asked for (server_momentum): else plain SGD.
    expected = sequential(2, 3, topo.worker_ranks, optimizer if kept else {},
                          schedule=schedule)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    for s in stats:
        assert s["updates"] == 3 and s["gradients"] == 3 * topo.num_workers
        assert s["staleness_max"] == 0
    assert np.abs(got - sequential(1, 1, topo.worker_ranks)).max() > 1e-3  # it moved


def test_softsync_n_workers_in_turn_has_the_expected_staleness():
    if world.size < 2:
        pytest.skip("needs a server and a worker: 2 ranks or more")
    topo = topology(world.size, 1)
    workers = topo.num_workers
    _, stats, _ = drive("softsync", topo, n=workers, order="round_robin")
    # Every worker pulls, then every worker pushes: in each round the j-th push
    # (0-based) finds j updates since its pull.
    expected = [0] * 33
    for j in range(workers):
        expected[j] += 3
    assert stats[0]["staleness_histogram"] == expected
    assert stats[0]["updates"] == 3 * workers  # c = 1: one update per gradient


@pytest.mark.parametrize("servers", [1, 2])
def test_asgd_loses_no_gradient_and_uses_the_budget(servers):
    if world.size <= servers:
        with pytest.raises(ValueError, match="needs at least one worker"):
            Topology(world, servers=servers)
        return
    topo = topology(world.size, servers)
    centre, stats, s = drive("asgd", topo, batches=4, servers=servers)
    assert np.all(np.isfinite(centre))
    pushes = world.allreduce(s.steps if topo.role == "worker" else 0)
    assert pushes == sum(st["gradients"] for st in stats) == sum(st["updates"] for st in stats)
    for st in stats:
        assert sum(st["worker_samples"].values()) == 4 * BASE * topo.num_workers
    gathered = world.allgather(centre)
    assert all(np.array_equal(g, gathered[0]) for g in gathered)


def test_shard_epochs_give_every_worker_its_own_equal_share():
    if world.size < 2:
        pytest.skip("needs a server and a worker: 2 ranks or more")
    topo = topology(world.size, 1)
    _, stats, s = drive("asgd", topo, batches=4, epoch="shard")
    for st in stats:
        assert st["worker_samples"] == {str(w): 4 * BASE for w in topo.worker_ranks}
    if topo.role == "worker":
        assert s.steps == 2 * 4  # every epoch exactly its shard's batches, no more


def test_dbs_batch_sizes_sum_to_the_total_and_follow_the_speeds():
    assert proportional_sizes(np.array([1.0, 2.0, 3.0]), 60, 1, 100).tolist() == [10, 20, 30]
    assert proportional_sizes(np.ones(3), 64, 1, 100).sum() == 64
    clamped = proportional_sizes(np.array([1.0, 10.0, 10.0]), 60, 8, 100)
    assert clamped.tolist() == [8, 26, 26]
    assert proportional_sizes(np.array([1.0, 3.0, 100.0]), 12, 2, 6).tolist() == [2, 4, 6]
    assert proportional_sizes(np.array([1.0] * 5 + [20.0]), 48, 2, 32).sum() == 48
    with pytest.raises(ValueError, match="cannot be split"):
        proportional_sizes(np.ones(3), 60, 30, 100)
    if world.size < 3:
        pytest.skip("the allocation needs two workers and a server: 3 ranks or more")
    topo = topology(world.size, 1)
    _, stats, _ = drive("dbs", topo, epochs=2, batches=6, min_batch=1, max_batch=16)
    last = stats[-1]
    sizes, speeds = last["batch_sizes"], last["throughput"]
    assert sum(sizes.values()) == BASE * topo.num_workers
    total = sum(speeds.values())
    for r, b in sizes.items():
        if 1 < b < 16:
            assert abs(b - BASE * topo.num_workers * speeds[r] / total) <= 1


def held_first(workers):
    """A script that names the first worker four times in a row, then the others once:
    under dbs's rounds its second pull waits for the round, and the script must pass it."""
    return ",".join([f"{workers[0]}x4"] + [str(w) for w in workers[1:]])


@pytest.mark.parametrize("servers,order", [(1, "fcfs"), (1, "round_robin"), (2, "fcfs"),
                                           (1, held_first)])
def test_dbs_rounds_of_fixed_sizes_are_synchronous_sgd(servers, order):
    if world.size <= servers:
        pytest.skip("needs the servers and a worker")
    topo = topology(world.size, servers)
    order = order if isinstance(order, str) else order(topo.worker_ranks)
    momentum = {"momentum": 0.9}
    got, stats, s = drive("dbs", topo, optimizer=momentum, servers=servers, order=order,
                          update="round", min_batch=BASE, max_batch=BASE)
    expected = sequential(2, 3, topo.worker_ranks, momentum)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-13)
    for st in stats:
        assert st["updates"] == 3 and st["gradients"] == 3 * topo.num_workers
        assert st["staleness_max"] == 0
    if topo.role == "worker":
        assert s.steps == 2 * 3


def local_sgd(epochs, batches, workers, period=0, lr=0.1):
    """Hogwild with one rank per node, written out: each node runs plain SGD on its own
    batches; the nodes' parameters are averaged after every ``period``-th step (counted
    over the run) and at each epoch's end."""
    layers.manual_seed(0)
    models = [layers.mlp(FEATURES, (10,), CLASSES).to(np.float64) for _ in workers]
    for m in models[1:]:
        m.flat_parameters().data[...] = models[0].flat_parameters().data
    flats = [m.flat_parameters().data for m in models]
    optimizers = [SGD(m.parameters(), lr=lr) for m in models]

    def average():
        mean = sum(flats) / len(flats)
        for f in flats:
            f[...] = mean

    steps = 0
    for epoch in range(epochs):
        for k in range(batches):
            for m, opt, w in zip(models, optimizers, workers):
                gradient(m, *batch(epoch, w, k, BASE))
                opt.step()
            steps += 1
            if period and steps % period == 0:
                average()
        average()
    return flats[0].copy()


@pytest.mark.parametrize("period", [0, 2])
def test_hogwild_one_rank_per_node_is_local_sgd_averaged_on_schedule(period):
    topo = topology(world.size, 0, 1)
    got, _, s = drive("hogwild", topo, epochs=2, batches=3, period=period)
    gathered = world.allgather(got)
    assert all(np.array_equal(g, gathered[0]) for g in gathered)
    np.testing.assert_allclose(got, local_sgd(2, 3, range(world.size), period), rtol=0,
                               atol=1e-13)
    if world.size == 1:
        np.testing.assert_allclose(got, sequential(2, 3, [0]), rtol=0, atol=1e-13)


@pytest.mark.parametrize("name,servers", [("hogwild", 0), ("asgd", 1), ("easgd-async", 1)])
def test_a_strategy_that_steps_parts_of_the_model_refuses_lars(name, servers):
    # the server's shard, the elastic worker's plain SGD, hogwild's shared copy: SGD.step's
    # arguments, which LARS has not; one check, in the base class, for all of them
    if world.size <= servers:
        pytest.skip("needs a worker beside the server")
    with pytest.raises(ValueError, match=rf"rank {world.rank}: --optimizer: got LARS, allowed "
                                         rf"with {name}: sgd \(the \w+ appl"):
        build(name, topology(world.size, servers), optimizer={"lars": True})


def test_an_order_that_cannot_be_followed_is_refused_on_every_rank():
    if world.size < 3:
        pytest.skip("needs a server and two workers: 3 ranks or more")
    topo = topology(world.size, 1)
    workers = ", ".join(map(str, topo.worker_ranks))
    with pytest.raises(ValueError, match=rf"^rank {world.rank}: asgd.order: got '1,{world.size}' "
                                         rf"\({world.size} not a worker\), allowed: the worker "
                                         rf"ranks {workers}, each named at least once$"):
        build("asgd", topo, order=f"1,{world.size}")
    with pytest.raises(ValueError, match=rf"^rank {world.rank}: softsync.order: got '1x2' "
                                         r"\(worker\(s\) 2"):
        build("softsync", topo, order="1x2")
    two = topology(world.size, 2)
    with pytest.raises(ValueError, match=rf"^rank {world.rank}: amsgd.order: got '2' with 2 "
                                         r"servers, allowed: fcfs, or round_robin or a script "
                                         r"with one server$"):
        build("amsgd", two, servers=2, order="2")
