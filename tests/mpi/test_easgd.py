"""SPMD, float64: the elastic-averaging family against exact checks (docs/easgd.md)."""

import os
import re
import sys

import numpy as np
import pytest
from mpi4py import MPI
from spmd import environment_outside_mpi, finish_job, mpiexec, start_job
from strategy_runs import CLASSES, FEATURES, build
from strategy_runs import sub_topology as topology

from minidp import Tensor, layers
from minidp import functional as F
from minidp.comm import guard
from minidp.optim import SGD
from minidp.trace import tracer

world = MPI.COMM_WORLD
BASE, LR = 4, 0.1
SERVED = ("easgd-rr", "easgd-async", "measgd-async")


def topology_for(name, ranks_per_node=None):
    """Every world rank; rank 0 serves for the server variants (None: too few ranks, or
    ``ranks_per_node`` does not divide the world)."""
    servers = 1 if name in SERVED else 0
    if world.size <= servers or (ranks_per_node and world.size % ranks_per_node):
        return None
    return topology(world.size, servers, ranks_per_node)


def batch(epoch, worker, step):
    rng = np.random.default_rng([11, epoch, worker, step])
    return rng.standard_normal((BASE, FEATURES)), rng.integers(0, CLASSES, BASE)


def gradient(model, x, y):
    model.zero_grad()
    F.cross_entropy(model(Tensor(x)), y).backward()


def drive(name, topo, epochs=2, batches=3, lr=LR, on_step=None, start=None, **options):
    """Run the strategy's roles; returns (centre, per-epoch stats, strategy, x_0).

    ``start(s)`` may move a worker's parameters before training; ``on_step(s, before)``
    sees each worker step with the parameters it started from.
    """
    s = build(name, topo, **options)
    s.optimizer.lr = lr
    x0 = s.flat.data.copy()
    if start is not None and topo.role == "worker":
        start(s)
    s.plan(epochs, BASE)
    stats = []
    for epoch in range(epochs):
        s.begin_epoch(epoch, batches)
        if topo.role == "server":
            s.serve()
        else:
            step = 0
            while s.batch_size(BASE):
                gradient(s.model, *batch(epoch, topo.rank, step))
                before = s.flat.data.copy()
                s.step(step)
                if on_step is not None:
                    on_step(s, before)
                step += 1
        s.end_epoch(epoch, 1.0)
        stats.append(s.epoch_stats())
    centre = s.consensus().copy()
    return centre, stats, s, x0


def worker_sum(topo, s):
    """Sum of the workers' parameters (servers add nothing), on every rank."""
    mine = s.flat.data if topo.role == "worker" else np.zeros_like(s.flat.data)
    return topo.world.allreduce(mine, op=MPI.SUM)


VARIANTS = [("easgd-rr", {}, None), ("easgd-async", {"order": "round_robin"}, None),
            ("easgd-async", {"order": "fcfs", "tau": 2}, None),
            ("measgd-async", {"order": "fcfs"}, None),
            ("easgd-sync", {"mode": "reduce"}, None),
            ("easgd-sync", {"mode": "allreduce", "tau": 2}, None),
            ("easgd-hogwild", {}, 1),
            # 4 ranks as 2 virtual nodes x 2: messages cross nodes, the tree too
            ("easgd-async", {"order": "round_robin"}, 2), ("easgd-sync", {"mode": "reduce"}, 2)]


@pytest.mark.parametrize("name,options,ranks_per_node", VARIANTS)
def test_centre_plus_workers_changes_only_by_the_gradient_steps(name, options,
                                                                ranks_per_node):
    topo = topology_for(name, ranks_per_node)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    total, momentum = {}, {}
    delta = 0.9 if name == "measgd-async" else 0.0

    def record(s, before):
        g = s.flat.grad.copy()
        if delta:  # EAMSGD (Zhang et al. Alg. 2): x moves by v = delta v - lr g besides the pull
            v = momentum.get("v", np.zeros_like(g)) * delta - LR * g
            momentum["v"] = v
            total["steps"] = total.get("steps", 0) - v
        else:
            total["steps"] = total.get("steps", 0) + LR * g

    centre, stats, s, x0 = drive(name, topo, on_step=record, **options)
    centres = topo.num_nodes if name == "easgd-hogwild" else 1
    gradient_steps = topo.world.allreduce(total.get("steps", np.zeros_like(x0)), op=MPI.SUM)
    before = (centres + topo.num_workers) * x0
    after = centres * centre + worker_sum(topo, s)
    np.testing.assert_allclose(after, before - gradient_steps, rtol=0, atol=1e-12)
    assert np.abs(gradient_steps).max() > 1e-3  # the workers moved
    if topo.num_workers > 1:
        assert np.abs(centre - x0).max() > 1e-4  # and pulled the centre with them
    exchanges = stats[0]["worker_exchanges"]
    assert sorted(exchanges) == [str(r) for r in topo.worker_ranks]


def sequential(worker, epochs=2, batches=3, lr=LR):
    """The worker's own run of plain SGD over its batches, in one process."""
    layers.manual_seed(0)
    model = layers.mlp(FEATURES, (10,), CLASSES).to(np.float64)
    opt = SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        for step in range(batches):
            gradient(model, *batch(epoch, worker, step))
            opt.step()
    return model.flat_parameters().data.copy()


@pytest.mark.parametrize("name,ranks_per_node,pulling", [
    ("easgd-rr", None, "workers"), ("easgd-async", None, "workers"),
    ("measgd-async", None, "workers"), ("easgd-sync", None, "workers"),
    ("easgd-hogwild", 1, 1), ("easgd-hogwild", 2, 2)])
def test_the_default_alpha_is_beta_09_over_the_workers_pulling_on_one_centre(
        name, ranks_per_node, pulling):
    # Zhang et al. and SC17: beta = p alpha = 0.9, p the workers one centre takes pulls
    # from; easgd-hogwild's node centre takes only its node's G workers.
    topo = topology_for(name, ranks_per_node)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    workers = world.size - (1 if name in SERVED else 0)
    p = workers if pulling == "workers" else pulling
    assert build(name, topo).alpha == 0.9 / p


@pytest.mark.parametrize("name", ["easgd-rr", "easgd-async", "easgd-hogwild", "easgd-sync"])
def test_alpha_zero_gives_independent_sgd_and_a_still_centre(name):
    topo = topology_for(name)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    centre, _, s, x0 = drive(name, topo, alpha=0.0)
    np.testing.assert_array_equal(centre, x0)
    if topo.role == "worker":
        np.testing.assert_array_equal(s.flat.data, sequential(topo.rank))


def easgd_in_rank_order(workers, epochs=2, batches=3, lr=LR):
    """Zhang et al.'s Algorithm 1 with one master, the workers taken in rank order at
    every step, in one process: d = alpha (x^i - x~); x^i <- x^i - lr g(x^i) - d;
    x~ <- x~ + d, alpha = 0.9 / p."""
    layers.manual_seed(0)
    models = [layers.mlp(FEATURES, (10,), CLASSES).to(np.float64) for _ in workers]
    xs = [m.flat_parameters() for m in models]
    for x in xs[1:]:
        x.data[...] = xs[0].data
    centre, alpha = xs[0].data.copy(), 0.9 / len(workers)
    for epoch in range(epochs):
        for step in range(batches):
            for worker, model, x in zip(workers, models, xs):
                gradient(model, *batch(epoch, worker, step))
                d = alpha * (x.data - centre)
                x.data[...] = x.data - lr * x.grad - d
                centre += d
    return centre, [x.data for x in xs]


def test_round_robin_is_algorithm_1_with_the_workers_in_rank_order():
    topo = topology_for("easgd-rr")
    if topo is None:
        pytest.skip("needs a master and a worker: 2 ranks or more")
    centre, _, s, _ = drive("easgd-rr", topo)
    expected_centre, expected_workers = easgd_in_rank_order(topo.worker_ranks)
    np.testing.assert_allclose(centre, expected_centre, rtol=0, atol=1e-13)
    if topo.role == "worker":
        mine = expected_workers[topo.worker_ranks.index(topo.rank)]
        np.testing.assert_allclose(s.flat.data, mine, rtol=0, atol=1e-13)


def easgd_in_scripted_order(workers, script, epochs=2, batches=3, lr=LR):
    """Algorithm 1 with the master taking the workers as ``script`` (a list of ranks) says,
    in one process: each epoch from the script's first entry, cycling; a named worker
    takes its next step (each one an exchange, tau = 1) or, its steps done, its DONE;
    after that its entries are passed over."""
    layers.manual_seed(0)
    models = {w: layers.mlp(FEATURES, (10,), CLASSES).to(np.float64) for w in workers}
    xs = {w: m.flat_parameters() for w, m in models.items()}
    for x in xs.values():
        x.data[...] = xs[workers[0]].data
    centre, alpha = xs[workers[0]].data.copy(), 0.9 / len(workers)
    for epoch in range(epochs):
        steps, active, entry = dict.fromkeys(workers, 0), list(workers), 0
        while active:
            worker = script[entry % len(script)]
            entry += 1
            if worker not in active:
                continue
            if steps[worker] == batches:
                active.remove(worker)  # its DONE
                continue
            x = xs[worker]
            gradient(models[worker], *batch(epoch, worker, steps[worker]))
            d = alpha * (x.data - centre)
            x.data[...] = x.data - lr * x.grad - d
            centre += d
            steps[worker] += 1
    return centre, {w: x.data for w, x in xs.items()}


@pytest.mark.parametrize("name", ["easgd-async", "measgd-async"])
def test_a_scripted_master_is_algorithm_1_in_the_scripts_order(name):
    topo = topology_for(name)
    if topo is None:
        pytest.skip("needs a master and a worker: 2 ranks or more")
    # the last worker twice, then every worker in rank order: worker order 3 3 1 2 3 ...
    # at 4 ranks (measgd-async with delta = 0 is easgd-async: Algorithm 1 too)
    workers = topo.worker_ranks
    options = {"delta": 0.0} if name == "measgd-async" else {}
    text = f"{workers[-1]}x2," + ",".join(map(str, workers))
    centre, _, s, _ = drive(name, topo, order=text, **options)
    script = [workers[-1], workers[-1], *workers]
    expected_centre, expected_workers = easgd_in_scripted_order(workers, script)
    np.testing.assert_allclose(centre, expected_centre, rtol=0, atol=1e-13)
    if topo.role == "worker":
        np.testing.assert_allclose(s.flat.data, expected_workers[topo.rank], rtol=0,
                                   atol=1e-13)
    in_rank_order, _ = easgd_in_rank_order(workers)
    if len(workers) > 1:  # the script's order is another run: the centre shows it
        assert np.abs(expected_centre - in_rank_order).max() > 1e-6


def spread(s):
    """Move each worker away from the centre by its own amount."""
    s.flat.data += 0.01 * (s.topology.rank + 1) * np.linspace(-1, 1, s.flat.size)


@pytest.mark.parametrize("mode", ["reduce", "allreduce"])
def test_sync_with_lr_zero_contracts_the_mean_distance_by_one_minus_alpha_beta(mode):
    topo = topology_for("easgd-sync")
    alpha, distances = 0.1, []

    def measure(s, before):
        mean = topo.world.allreduce(s.flat.data, op=MPI.SUM) / topo.size
        distances.append(mean - s.consensus())

    drive("easgd-sync", topo, lr=0.0, on_step=measure, start=spread, alpha=alpha, mode=mode)
    factor = 1 - alpha - topo.size * alpha
    start = topo.world.allreduce(0.01 * (topo.rank + 1) * np.linspace(-1, 1, distances[0].size),
                                 op=MPI.SUM) / topo.size
    for t, d in enumerate(distances):
        np.testing.assert_allclose(d, factor ** (t + 1) * start, rtol=1e-12, atol=1e-15)


def test_one_worker_exchanges_pull_both_by_alpha_from_the_pre_step_values():
    if world.size < 2:
        pytest.skip("needs a master and a worker: 2 ranks or more")
    topo = topology(2, 1)
    if topo is None:  # ranks 2.. take no part; they wait for the pair to finish
        world.Barrier()
        return
    alpha, seen = 0.2, []

    def check(s, before):
        # s.centre holds the centre this step exchanged with: the server's, as it was.
        expected = before - s.optimizer.lr * s.flat.grad - alpha * (before - s.centre)
        np.testing.assert_allclose(s.flat.data, expected, rtol=0, atol=1e-15)
        seen.append(before - s.centre)

    for lr in (LR, 0.0):
        seen.clear()
        drive("easgd-rr", topo, lr=lr, on_step=check, start=spread, alpha=alpha)
        if topo.role == "worker" and lr == 0.0:
            for t in range(1, len(seen)):  # the server applied the same pull
                np.testing.assert_allclose(seen[t], (1 - 2 * alpha) * seen[t - 1],
                                           rtol=1e-12, atol=1e-16)
    world.Barrier()


@pytest.mark.parametrize("ranks_per_node", [None, 2])
def test_sync_reduce_and_broadcast_equals_the_allreduce_replicas_bit_for_bit(ranks_per_node):
    topo = topology_for("easgd-sync", ranks_per_node)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    for tau in (1, 2):
        reduce, _, a, _ = drive("easgd-sync", topo, mode="reduce", tau=tau)
        replica, _, b, _ = drive("easgd-sync", topo, mode="allreduce", tau=tau)
        np.testing.assert_array_equal(reduce, replica)
        np.testing.assert_array_equal(a.flat.data, b.flat.data)
        assert all(np.array_equal(c, replica) for c in world.allgather(b.centre))


def test_sync_sends_the_centre_down_a_tree_log2_p_messages_from_rank_0():
    topo = topology_for("easgd-sync")
    counters = tracer().counters

    def sent():
        return counters["messages_intra"] + counters["messages_inter"]

    def messages(batches):  # sent by this rank in a run of that many exchange steps
        before = sent()
        _, _, s, _ = drive("easgd-sync", topo, mode="reduce", epochs=1, batches=batches)
        return sent() - before, s

    two, _ = messages(2)
    six, s = messages(6)
    exchanges = 4  # the difference: what four more steps sent (not the start's broadcast)
    rounds = (topo.size - 1).bit_length()  # ceil(log2 p)
    counts = world.allgather(six - two)
    assert counts[0] == exchanges * rounds  # the root only sends the centre, down a tree
    # every other rank: one partial sum up, the centre to its children down
    children = [sum(1 for m in (1, 2, 4, 8) if r + m < topo.size and m < (r & -r))
                for r in range(topo.size)]
    assert counts[1:] == [exchanges * (1 + children[r]) for r in range(1, topo.size)]
    centres = world.allgather(s.centre)
    assert all(np.array_equal(c, centres[0]) for c in centres)  # one centre everywhere


def test_measgd_with_delta_zero_is_easgd_async_in_the_same_order():
    topo = topology_for("measgd-async")
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    plain, _, a, _ = drive("easgd-async", topo, order="round_robin")
    zero, _, b, _ = drive("measgd-async", topo, order="round_robin", delta=0.0)
    np.testing.assert_array_equal(plain, zero)
    np.testing.assert_array_equal(a.flat.data, b.flat.data)
    moving, _, _, _ = drive("measgd-async", topo, order="round_robin")
    assert np.abs(moving - plain).max() > 1e-6  # delta 0.9 is another run


def eamsgd_by_hand(steps, eta=0.1, alpha=0.2, delta=0.9):
    """Zhang, Choromanska, LeCun 2015, Algorithm 2 on f(x) = x^2/2 (g(x) = x), one worker,
    tau = 1, x_0 = 1, v_0 = 0, centre 0: (look-ahead points, iterates, centres)."""
    x, v, centre = 1.0, 0.0, 0.0
    looks, iterates, centres = [], [], []
    for _ in range(steps):
        d = alpha * (x - centre)  # at x, not at the look-ahead
        centre += d
        y = x + delta * v
        looks.append(y)
        v = delta * v - eta * y
        x = x - d + v
        iterates.append(x)
        centres.append(centre)
    return looks, iterates, centres


def test_measgd_is_eamsgd_on_a_scalar_quadratic():
    if world.size < 2:
        pytest.skip("needs a master and a worker: 2 ranks or more")
    topo = topology(2, 1)
    if topo is None:
        world.Barrier()
        return
    looks, iterates, centres = eamsgd_by_hand(3)
    # by hand: d = 0.2, v = -0.1, x = 1 - 0.2 - 0.1 = 0.7, y = 0.7 - 0.09 = 0.61; then
    # d = 0.2 (0.7 - 0.2) = 0.1, v = -0.09 - 0.061 = -0.151, x = 0.449, y = 0.3131; ...
    np.testing.assert_allclose(looks, [1.0, 0.61, 0.3131], rtol=0, atol=1e-12)
    np.testing.assert_allclose(iterates, [0.7, 0.449, 0.25199], rtol=0, atol=1e-12)
    np.testing.assert_allclose(centres, [0.2, 0.3, 0.3298], rtol=0, atol=1e-12)
    s = build("measgd-async", topo, alpha=0.2, delta=0.9, order="round_robin")
    s.optimizer.lr = 0.1
    s.flat.data[...] = 0.0 if topo.role == "server" else 1.0  # centre 0, worker at 1
    s.plan(1, BASE)
    s.begin_epoch(0, 3)
    if topo.role == "server":
        s.serve()
        np.testing.assert_allclose(s.centre, centres[-1], rtol=0, atol=1e-14)
    else:
        seen, after = [], []
        while s.batch_size(BASE):
            seen.append(s.flat.data.copy())  # where the gradient is taken
            s.flat.grad[...] = s.flat.data  # the quadratic's gradient there
            s.step(len(after))
            after.append(s.flat.data.copy())
        for t in range(3):  # every coordinate follows the scalar recurrence
            np.testing.assert_allclose(seen[t], looks[t], rtol=0, atol=1e-14)
            np.testing.assert_allclose(after[t], iterates[t], rtol=0, atol=1e-14)
    world.Barrier()


@pytest.mark.parametrize("name", ["easgd-sync", "easgd-rr"])
def test_sync_and_round_robin_runs_repeat_bit_for_bit(name):
    topo = topology_for(name)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    first, _, a, _ = drive(name, topo, tau=2)
    again, _, b, _ = drive(name, topo, tau=2)
    np.testing.assert_array_equal(first, again)
    np.testing.assert_array_equal(a.flat.data, b.flat.data)


@pytest.mark.parametrize("name", ["easgd-async", "easgd-sync", "easgd-hogwild"])
def test_exchanges_happen_exactly_every_tau_steps(name):
    topo = topology_for(name)
    if topo is None:
        pytest.skip("too few ranks for this variant's roles, or ranks_per_node does not "
                    "divide the world")
    _, stats, _, _ = drive(name, topo, batches=4, tau=3)
    # steps 0..3 then 4..7: exchanges at 0, 3 and at 6
    assert [set(st["worker_exchanges"].values()) for st in stats] == [{2}, {1}]


def test_bad_options_name_the_option_value_and_rank():
    topo = topology_for("easgd-sync")
    with pytest.raises(ValueError, match=r"easgd-sync.alpha: got 1.5, allowed: a moving rate"):
        build("easgd-sync", topo, alpha=1.5)
    with pytest.raises(ValueError, match=rf"rank {world.rank}: easgd-sync: alpha \+ beta = "
                                         r"0.9 \+ 1.5, allowed: below 2"):
        build("easgd-sync", topo, alpha=0.9, beta=1.5)
    with pytest.raises(ValueError, match=r"measgd-async.delta: got 1.0, allowed: a momentum"):
        build("measgd-async", topo, delta=1.0)


@pytest.fixture
def short_timeout_on_rank_0():
    # Only rank 0 waits in vain; the silent rank outwaits it at a barrier.
    if world.rank == 0:
        guard.set_timeout(1.0)
    yield
    guard.set_timeout(float(os.environ.get("MINIDP_COMM_TIMEOUT", "300")))


@pytest.mark.parametrize("name", ["easgd-async", "easgd-sync"])
def test_a_silent_worker_is_named_after_the_timeout(name, short_timeout_on_rank_0):
    if world.size < 2:
        pytest.skip("needs a master and a worker: 2 ranks or more")
    topo = topology(2, 1 if name in SERVED else 0)
    error = None
    if topo is not None:
        s = build(name, topo)
        s.plan(1, BASE)
        s.begin_epoch(0, 2)
        if topo.rank == 0:
            with pytest.raises(guard.CommTimeout) as caught:
                if topo.role == "server":
                    s.serve()
                else:
                    s.batch_size(BASE)
                    gradient(s.model, *batch(0, 0, 0))
                    s.step(0)
            error = str(caught.value)
    world.Barrier()
    if error is not None:
        # easgd-sync: rank 0 waits for rank 1's partial sum in the tree reduce.
        labels = {"easgd-async": ["serve (probe from rank 1)"],
                  "easgd-sync": ["recv partial sum from rank 1"]}
        assert re.match(r"rank 0: '(.+)' waited 1 s \(MINIDP_COMM_TIMEOUT\); ", error)
        assert re.match(r"rank 0: '([^']+)'", error).group(1) in labels[name], error
        assert re.search(r"rank 1: (waiting|last) in '[^']+' #\d+", error)


KILLED = """
import os, signal
import numpy as np
from strategy_runs import build, FEATURES, CLASSES
from minidp import Tensor, functional as F
from minidp.comm import Topology
topo = Topology(servers=1)
s = build("easgd-async", topo)
s.plan(1, 4)
s.begin_epoch(0, 50)
if topo.role == "server":
    s.serve()
else:
    step = 0
    rng = np.random.default_rng(topo.rank)
    while s.batch_size(4):
        if topo.rank == 2 and step == 3:
            os.kill(os.getpid(), signal.SIGKILL)
        s.optimizer.zero_grad()
        F.cross_entropy(s.model(Tensor(rng.standard_normal((4, FEATURES)))),
                        rng.integers(0, CLASSES, 4)).backward()
        s.step(step)
        step += 1
"""


def test_a_killed_worker_ends_the_job(tmp_path):
    # A job of its own (started from a 1-rank session only): its rank 2 SIGKILLs itself.
    if world.size != 1:
        pytest.skip("launches a job of its own: from the 1-rank session only")
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    env = environment_outside_mpi(PYTHONPATH=os.pathsep.join([root, here]),
                                  MPIEXEC_TIMEOUT="100", MINIDP_COMM_TIMEOUT="90")
    proc = start_job([mpiexec(), "-n", "3", sys.executable, "-m", "mpi4py", str(script)],
                     root, env)
    output, killed = finish_job(proc, 120)
    if killed:
        pytest.fail(f"the job outlived its killed worker:\n{output[-3000:]}")
    assert proc.returncode != 0, output
    assert "CommTimeout" not in output, output  # ended by the kill, not a timeout
    assert re.search(r"signal 9|KILLED", output, re.IGNORECASE), output
