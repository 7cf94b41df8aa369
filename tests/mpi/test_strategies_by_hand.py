"""SPMD: the strategies' own updates against the numbers worked by hand for the replay's rules.

``tests/unit/test_rules_by_hand.py`` pins the replay's rules to arithmetic written out;
here the strategies meet the same arithmetic, so that a rule made wrong the same way on
both sides (which the replay's bit-for-bit comparison cannot see) is caught on each
side. Every run is float64 with w_0 = 1 in every coordinate and gradients set by hand
(every coordinate the same), so each coordinate follows the scalar recurrence of the
comments. lr 0.1 and weight decay 0.1 unless said.

The servers take their workers in turn (``order=round_robin``), which fixes who pulls
and pushes when: in each round every worker pulls, then every worker pushes, so the
j-th push of a round (0-based) meets staleness j when each gradient is an update. A
scripted order (``order=2,3,1x12,...``) fixes it likewise where a case needs more.
Ranks beyond a case's roles wait at the barrier; a case skips below its rank count.
"""

import numpy as np
import pytest
from mpi4py import MPI
from strategy_runs import CLASSES, FEATURES, sub_topology

from minidp import layers, strategies
from minidp.optim import SGD, LRScheduler, make_schedule

world = MPI.COMM_WORLD
BASE = 4


def close(value):
    return pytest.approx(value, rel=0, abs=1e-12)


def roles(ranks, servers):
    """The topology of the first ``ranks`` world ranks (None elsewhere), or a skip."""
    if world.size < ranks:
        pytest.skip(f"needs {ranks} ranks")
    return sub_topology(ranks, servers)


def build(name, topo, optimizer=None, **options):
    """The strategy on a small model whose parameters are all 1 (before any copy is made)."""
    model = layers.mlp(FEATURES, (10,), CLASSES).to(np.float64)
    model.flat_parameters().data[...] = 1.0
    return strategies.get(name, model, SGD(model.parameters(), lr=0.1, **(optimizer or {})),
                          topo, **options)


def drive(name, topo, grads, optimizer, batches, schedule=None, **options):
    """One epoch of ``batches``; worker r's k-th gradient is ``grads[r][k]`` everywhere.

    The worker's rate follows ``schedule`` per its own step (the Trainer's scheduler);
    a server reads it at its clock (``plan``). Returns (the consensus, the strategy).
    """
    s = build(name, topo, optimizer, **options)
    s.plan(1, BASE, schedule)
    scheduler = LRScheduler(s.optimizer, schedule) if schedule else None
    s.begin_epoch(0, batches)
    if topo.role == "server":
        s.serve()
    else:
        step = 0
        while s.batch_size(BASE):
            s.flat.grad[...] = grads[topo.rank][step]
            s.step(step)
            step += 1
            if scheduler:
                scheduler.step()
        assert step == len(grads[topo.rank]), f"rank {topo.rank} took {step} steps"
    s.end_epoch(0, 1.0)
    return s.consensus().copy(), s


def test_amsgd_one_worker_keeps_nesterov_momentum_and_weight_decay_at_the_server():
    topo = roles(2, 1)
    if topo is not None:
        got, _ = drive("amsgd", topo, {1: [2.0, 4.0, -1.0]},
                       {"momentum": 0.5, "nesterov": True, "weight_decay": 0.1}, batches=3)
        # d = 2.1, buf 2.1, w = 1 - 0.1 (2.1 + 1.05) = 0.685; d = 4.0685, buf 5.1185,
        # w = 0.685 - 0.1 (4.0685 + 2.55925) = 0.022225; d = -0.9977775, buf 1.5614725,
        # w = 0.022225 - 0.1 (-0.9977775 + 0.78073625) = 0.043929125
        assert got.tolist() == [close(0.043929125)] * got.size
    world.Barrier()


def test_asgd_rate_follows_the_servers_sample_clock_in_turn_with_staleness_0_1():
    topo = roles(3, 1)
    if topo is not None:
        # step schedule over T = 3: 0.1 x 0.1^k at clock k = samples before // (4 x 2)
        got, s = drive("asgd", topo, {1: [2.0, -1.0], 2: [4.0, 3.0]},
                       {"momentum": 0.5, "weight_decay": 0.1}, batches=2,
                       schedule=make_schedule("step", 0.1, 3), order="round_robin")
        # pushes in turn: w1 (2, sigma 0), w2 (4, sigma 1), w1 (-1, 0), w2 (3, 1); clock
        # 0, 0, 1, 1: w = 1 - 0.1 (2 + 0.1) = 0.79; 0.79 - 0.1 (4 + 0.079) = 0.3821;
        # 0.3821 - 0.01 (-1 + 0.03821) = 0.3917179; 0.3917179 - 0.01 (3 + 0.03917179)
        # = 0.3613261821 (--momentum unused by asgd)
        assert got.tolist() == [close(0.3613261821)] * got.size
        stats = s.epoch_stats()
        if topo.rank == 0:
            print(f"asgd in turn: staleness histogram {stats['staleness_histogram'][:3]}")
            assert stats["staleness_histogram"][:3] == [2, 2, 0]
    world.Barrier()


@pytest.mark.parametrize("rule,n,wd,grads,expected", [
    # n = 2 of 3 workers: c = floor(3/2) = 1, lr / max(sigma, 1): 1 - 0.1 x 1 = 0.9,
    # 0.9 - 0.1 x 2 = 0.7, 0.7 - 0.05 x 4 = 0.5 (c rounded up to 2 would average two)
    ("mean", 2, 0.0, {1: [1.0], 2: [2.0], 3: [4.0]}, 0.5),
    # n = 3: c = 1, g / max(sigma, 1): 1 - 0.1 (6 + 0.1) = 0.39; 0.39 - 0.1 (6 + 0.039)
    # = -0.2139; -0.2139 - 0.1 (6/2 - 0.02139) = -0.511761
    ("each", 3, 0.1, {1: [6.0], 2: [6.0], 3: [6.0]}, -0.511761),
])
def test_softsync_in_turn_meets_staleness_0_1_2_with_its_rule(rule, n, wd, grads, expected):
    topo = roles(4, 1)
    if topo is not None:
        got, s = drive("softsync", topo, grads, {"weight_decay": wd}, batches=1, n=n,
                       rule=rule, order="round_robin")
        assert got.tolist() == [close(expected)] * got.size
        stats = s.epoch_stats()
        if topo.rank == 0:
            print(f"softsync n={n} {rule}: staleness {stats['staleness_histogram'][:3]}")
            assert stats["staleness_histogram"][:3] == [1, 1, 1]
            assert stats["updates"] == 3
    world.Barrier()


@pytest.mark.parametrize("rule,expected", [
    # the third buffer, mean staleness 4/3: lr / (4/3) = 0.075 on the mean (6 + 3 + 6) / 3
    # = 5: 0.7 - 0.375 = 0.325 (the rate not divided: 0.2)
    ("mean", 0.325),
    # each gradient over its own staleness: (6/2 + 3/2 + 6/1) / 3 = 3.5 at lr 0.1:
    # 0.7 - 0.35 = 0.35 (divided by sigma + 1: 3 and 0.4)
    ("each", 0.35),
])
def test_softsync_scripted_buffer_of_mean_staleness_above_1(rule, expected):
    topo = roles(4, 1)
    if topo is not None:
        # c = 3 (n = 1), budget 3 x 4 x 3 = 36 samples: 9 batches. The script: workers 2
        # and 3 pull at version 0; worker 1 pulls and pushes six times: updates 1 and 2,
        # of the means (3 + 0 + 0) / 3 = 1 and (3 + 3 + 0) / 3 = 2 at sigma 0:
        # w = 1 - 0.1 - 0.2 = 0.7; then workers 2 and 3 push (sigma 2 each, gradients 6
        # and 3) and worker 1 pulls and pushes 6 (sigma 0): the third update
        got, s = drive("softsync", topo, {1: [3.0, 0.0, 0.0, 3.0, 3.0, 0.0, 6.0], 2: [6.0],
                                          3: [3.0]}, {}, batches=3, n=1, rule=rule,
                       order="2,3,1x12,2,3,1x2")
        assert got.tolist() == [close(expected)] * got.size
        stats = s.epoch_stats()
        if topo.rank == 0:
            print(f"softsync scripted {rule}: staleness {stats['staleness_histogram'][:3]}")
            assert stats["staleness_histogram"][:3] == [7, 0, 2]
            assert stats["updates"] == 3
    world.Barrier()


def test_easgd_round_robin_default_alpha_weight_decay_and_each_workers_schedule():
    topo = roles(3, 1)
    if topo is not None:
        # alpha -1: 0.9 / 2 = 0.45; a worker's rate 0.1 at its step 0, 0.01 at its step 1
        got, s = drive("easgd-rr", topo, {1: [2.0, 1.0], 2: [-1.0, 3.0]},
                       {"weight_decay": 0.1}, batches=2, schedule=make_schedule("step", 0.1, 2))
        # x1 = 0.79, x2 = 1.09; w1: d = -0.0945, x1 = 0.87371, centre 0.9055;
        # w2: d = 0.083025, x2 = 0.975885, centre 0.988525
        assert got.tolist() == [close(0.988525)] * got.size
        if topo.role == "worker":
            x = {1: 0.87371, 2: 0.975885}[topo.rank]
            assert s.flat.data.tolist() == [close(x)] * got.size
    world.Barrier()


def test_measgd_decays_the_look_ahead_and_pulls_from_x():
    topo = roles(2, 1)
    if topo is not None:
        got, s = drive("measgd-async", topo, {1: [2.0, 1.0, -1.0]}, {"weight_decay": 0.1},
                       batches=3, alpha=0.25, delta=0.5)
        # x = 0.79, v = -0.21; y = 0.685, d = -0.0525, x = 0.63065, centre 0.9475;
        # y = 0.524725, d = -0.0792125, x = 0.69869025, centre 0.8682875
        assert got.tolist() == [close(0.8682875)] * got.size
        if topo.role == "worker":
            assert s.flat.data.tolist() == [close(0.69869025)] * got.size
    world.Barrier()


def test_hogwild_and_easgd_hogwild_apply_weight_decay_on_one_rank():
    topo = roles(1, 0)
    if topo is not None:
        grads = {0: [2.0, 4.0, -1.0]}
        got, _ = drive("hogwild", topo, grads, {"weight_decay": 0.1}, batches=3)
        # 1 - 0.1 (2 + 0.1) = 0.79; 0.79 - 0.1 (4 + 0.079) = 0.3821;
        # 0.3821 - 0.1 (-1 + 0.03821) = 0.478279
        assert got.tolist() == [close(0.478279)] * got.size
        got, s = drive("easgd-hogwild", topo, grads, {"weight_decay": 0.1}, batches=3,
                       alpha=0.25)
        # s0: d = 0, x = 0.79.  s1: d = 0.25 (0.79 - 1) = -0.0525,
        # x = 0.79 - 0.4079 + 0.0525 = 0.4346, centre 0.9475.  s2: d = 0.25 (0.4346 -
        # 0.9475) = -0.128225, x = 0.4346 + 0.095654 + 0.128225 = 0.658479,
        # centre 0.819275
        assert got.tolist() == [close(0.819275)] * got.size
        assert s.flat.data.tolist() == [close(0.658479)] * got.size
    world.Barrier()


def test_dbs_speed_estimate_is_the_moving_average_of_samples_per_second():
    topo = roles(3, 1)
    if topo is not None:
        s = build("dbs", topo, ema=0.75)
        s.plan(1, BASE)
        if topo.rank == 0:
            # each push reports (samples, seconds); v = samples / seconds, the first as
            # it is, then v <- 0.75 v + 0.25 v_new; sizes every 2 pushes (one per worker)
            s.observe(1, 4, 0.5)  # 8 samples/s
            s.observe(2, 4, 2.0)  # 2
            assert s.speeds == {1: 8.0, 2: 2.0}
            # 8 x (8, 2) / 10 = 6.4, 1.6: floors 6, 1, the larger remainder (w2) + 1
            assert s.sizes == {1: 6, 2: 2}
            s.observe(1, 6, 0.25)  # 24 samples/s: 0.75 x 8 + 0.25 x 24 = 12
            assert s.speeds == {1: 12.0, 2: 2.0} and s.sizes == {1: 6, 2: 2}  # 1 push
            s.observe(2, 2, 0.5)  # 4 samples/s: 0.75 x 2 + 0.25 x 4 = 2.5
            assert s.speeds == {1: 12.0, 2: 2.5}
            # 8 x (12, 2.5) / 14.5 = 6.62, 1.38: floors 6, 1, w1's remainder the larger
            assert s.sizes == {1: 7, 2: 1} and s.history == [[6, 2], [7, 1]]
            assert s.epoch_stats()["throughput"] == {"1": 12.0, "2": 2.5}
        else:
            s.epoch_stats()
    world.Barrier()
