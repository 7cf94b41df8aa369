"""Every replay rule against numbers worked by hand, weight decay and momentum included.

``minidp replay`` judges a run by re-executing it from the papers' rules
(``minidp/replay/rules.py``) and comparing bits; a rule made wrong the same way in the
strategy and in the replay passes that comparison. Only numbers worked out apart from
both stop such a pair, so here every rule, and every way the replay's servers and
master compose the rules (the rate's clock, c, the flush at an epoch's end, the kept
momentum, the weight decay's place), is run on a scalar and compared with the
arithmetic written out in the test.

The replays run on events written by hand (the order a run would have recorded) and on
scripted gradients: :class:`Scripted` stands in for the model and the data, giving
worker w's k-th gradient as the test lists it (the rules only ever see gradients), and
records the parameters each was taken at. lr 0.1, weight decay 0.1 and w_0 = 1 unless
a case says otherwise; ``w`` below is the one parameter.
"""

from collections import Counter

import numpy as np
import pytest

from minidp.replay import rules
from minidp.replay.elastic import ElasticReplay
from minidp.replay.recorded import Recorded
from minidp.replay.servers import Differs, ServersReplay

G, L, E = 0, 1, 2  # a server event: a gradient, a worker leaving the epoch, the epoch's end


def close(value):
    return pytest.approx(value, rel=0, abs=1e-12)


# -- the rules one by one -----------------------------------------------------------------


def test_sgd_weight_decay_adds_wd_w_to_the_gradient():
    w = np.array([2.0])
    rules.sgd(w, np.array([0.5]), 0.1, weight_decay=0.1)
    assert w.tolist() == close([2.0 - 0.1 * (0.5 + 0.2)])  # 1.93


def test_sgd_momentum_keeps_the_buffer_of_decayed_gradients_over_two_steps():
    w, buf = np.array([2.0]), np.zeros(1)
    rules.sgd(w, np.array([0.5]), 0.1, momentum=0.9, weight_decay=0.1, buf=buf)
    # d = 0.5 + 0.1 x 2 = 0.7; buf = 0.7; w = 2 - 0.07 = 1.93
    assert (w.tolist(), buf.tolist()) == (close([1.93]), close([0.7]))
    rules.sgd(w, np.array([0.3]), 0.1, momentum=0.9, weight_decay=0.1, buf=buf)
    # d = 0.3 + 0.193 = 0.493; buf = 0.63 + 0.493 = 1.123; w = 1.93 - 0.1123 = 1.8177
    assert (w.tolist(), buf.tolist()) == (close([1.8177]), close([1.123]))
    with pytest.raises(ValueError, match="momentum needs its buffer"):
        rules.sgd(w, np.array([0.3]), 0.1, momentum=0.9)


def test_zhang_divides_each_gradient_by_its_own_staleness_fresh_and_one_alike():
    grads = [np.array([8.0])] * 4
    # sigma 0, 1, 2, 4: 8/1 + 8/1 + 8/2 + 8/4 = 22, over c = 4: 5.5
    assert rules.per_gradient_staleness(grads, [0, 1, 2, 4]).tolist() == [5.5]


def test_gupta_divides_the_rate_by_the_mean_staleness_never_raising_it():
    assert rules.mean_staleness_rate(0.1, [2, 2, 0]) == close(0.075)  # <sigma> = 4/3
    assert rules.mean_staleness_rate(0.1, [1, 2]) == close(0.1 / 1.5)
    assert rules.mean_staleness_rate(0.1, [0, 1]) == 0.1  # <sigma> = 1/2: lr, not 2 lr


def test_easgd_step_with_weight_decay_and_without_an_exchange():
    x, centre = np.array([2.0]), np.array([1.0])
    d = rules.easgd_step(x, np.array([0.5]), centre, 0.25, 0.1, 0.1)
    # d = 0.25 (2 - 1) = 0.25 at the pre-step x; x = 2 - 0.1 (0.5 + 0.2) - 0.25 = 1.68
    assert d.tolist() == [0.25] and x.tolist() == close([1.68])
    x = np.array([2.0])
    assert rules.easgd_step(x, np.array([0.5]), None, 0.25, 0.1, 0.1) is None
    assert x.tolist() == close([1.93])  # the gradient step alone


def test_eamsgd_decays_the_look_ahead_not_the_iterate():
    x, v, centre = np.array([1.0]), np.array([0.5]), np.array([0.5])
    y = rules.look_ahead(x, v, 0.9)  # v = 0.45, y = 1.45
    assert (y.tolist(), v.tolist()) == (close([1.45]), close([0.45]))
    d = rules.eamsgd_step(x, y, v, np.array([2.0]), centre, 0.2, 0.1, 0.1)
    # d = 0.2 (1 - 0.5) = 0.1 at x; the step 0.1 (2 + 0.1 x 1.45) = 0.2145 (decay of y:
    # of x it would be 0.21); x = 1.45 - 0.2145 - 0.1 = 1.1355; v = 0.45 - 0.2145 = 0.2355
    assert d.tolist() == close([0.1])
    assert (x.tolist(), v.tolist()) == (close([1.1355]), close([0.2355]))


# -- the servers' and the master's replays on scripted gradients ----------------------------


class Scripted:
    """Stands in for the run's model and data: worker w's k-th gradient is ``grads[w][k]``.

    Records where each gradient was taken (the parameters it was given), so a case can
    check that the replay took it at the version the worker read.
    """

    def __init__(self, grads, initial=(1.0,)):
        self.grads, self.initial = grads, np.array(initial)
        self.count, self.at = Counter(), {}

    def take(self, worker, epoch, n):
        k = self.count[worker]
        self.count[worker] += 1
        return (worker, k), n, f"scripted step {k + 1}"

    def gradient(self, params, x, y):
        self.at[x] = params.tolist()
        return np.array([float(self.grads[x[0]][x[1]])] * len(params))


def recorded(strategy, options, servers, workers, *, lr=0.1, weight_decay=0.1, momentum=0.0,
             nesterov=False, schedule="constant", batches=4, batch=4):
    """A run's record, written by hand: ``servers``/``workers`` map a rank to its rows."""
    ranks = sorted({**servers, **workers})
    config = dict(strategy=strategy, options=options, dtype="float64", schedule=schedule,
                  lr=lr, epochs=1, warmup_epochs=0, momentum=momentum, nesterov=nesterov,
                  weight_decay=weight_decay)
    events = {"strategy": strategy, "servers": sorted(servers), "workers": sorted(workers),
              "ranks": [{"rank": r, "rows": {**servers, **workers}[r]} for r in ranks]}
    summary = {"batch_size_per_worker": batch, "batches_per_epoch": batches,
               "world_size": len(ranks)}
    return Recorded("by-hand", config, summary, events, {})


def replay_servers(run, grads):
    scripted = Scripted(grads)
    replay = ServersReplay(run, scripted)
    return replay.replay().tolist(), replay, scripted


# Three updates of asgd at one server: w1 reads v0, pushes (sigma 0); w2, which read v0 too,
# pushes next (sigma 1); w1, which read v1, pushes after it (sigma 1). b = 4.
ASGD_SERVER = [[G, 1, 0, 4], [G, 2, 1, 4], [G, 1, 1, 4], [L, 1, 0, 0], [L, 2, 0, 0],
               [E, -1, 0, 0]]
ASGD_WORKERS = {1: [[0, 4, 0], [0, 4, 1]], 2: [[0, 4, 0]]}
ASGD_GRADS = {1: [2.0, -1.0], 2: [4.0]}


def test_asgd_applies_each_gradient_at_the_rate_of_its_clock_with_weight_decay():
    # --schedule step over T = 1 epoch x 3 batches: floor(3 / 3) = 1, so the rate is
    # 0.1 x 0.1^k at clock k = (samples received before) // (b x workers = 8).
    run = recorded("asgd", {"n": 1}, {0: ASGD_SERVER}, ASGD_WORKERS, momentum=0.5,
                   schedule="step", batches=3)
    w, replay, scripted = replay_servers(run, ASGD_GRADS)
    # 1: clock 0 // 8 = 0, lr 0.1: w = 1 - 0.1 (2 + 0.1) = 0.79
    # 2: clock 4 // 8 = 0, lr 0.1: w = 0.79 - 0.1 (4 + 0.079) = 0.3821
    # 3: clock 8 // 8 = 1, lr 0.01: w = 0.3821 - 0.01 (-1 + 0.03821) = 0.3917179
    # (asgd ignores --momentum 0.5: plain SGD at the server)
    assert w == close([0.3917179])
    assert replay.staleness == [0, 1, 1]
    assert scripted.at == {(1, 0): [1.0], (2, 0): [1.0], (1, 1): [0.79]}  # at the version read


def test_amsgd_keeps_nesterov_momentum_and_weight_decay_at_the_server():
    run = recorded("amsgd", {}, {0: ASGD_SERVER}, ASGD_WORKERS, momentum=0.5, nesterov=True)
    w, _, _ = replay_servers(run, ASGD_GRADS)
    # 1: d = 2 + 0.1 = 2.1; buf = 2.1; w = 1 - 0.1 (2.1 + 0.5 x 2.1) = 0.685
    # 2: d = 4 + 0.0685 = 4.0685; buf = 1.05 + 4.0685 = 5.1185;
    #    w = 0.685 - 0.1 (4.0685 + 2.55925) = 0.022225
    # 3: d = -1 + 0.0022225 = -0.9977775; buf = 2.55925 - 0.9977775 = 1.5614725;
    #    w = 0.022225 - 0.1 (-0.9977775 + 0.78073625) = 0.043929125
    assert w == close([0.043929125])


# softsync, three workers, n = 1: c = 3. w1 alone fills the first two updates (its steps
# 0-2 read v0, 3-5 read v1); w2 and w3, which read v0, arrive after both (sigma 2), with
# w1's step 6 (it read v2): <sigma> = 4/3. w1's step 7 (read v3) is left in the buffer
# when the epoch ends: applied alone.
SOFTSYNC_SERVER = ([[G, 1, 0, 4]] * 3 + [[G, 1, 0, 4]] * 3 +
                   [[G, 2, 2, 4], [G, 3, 2, 4], [G, 1, 0, 4], [G, 1, 0, 4]] +
                   [[L, w, 0, 0] for w in (2, 3, 1)] + [[E, -1, 0, 0]])
SOFTSYNC_WORKERS = {1: [[0, 4, 0]] * 3 + [[0, 4, 1]] * 3 + [[0, 4, 2], [0, 4, 3]],
                    2: [[0, 4, 0]], 3: [[0, 4, 0]]}
SOFTSYNC_GRADS = {1: [1.0, 2.0, 3.0, 3.0, -1.0, 1.0, 0.0, 5.0], 2: [4.0], 3: [2.0]}


def test_softsync_gupta_divides_the_rate_by_the_updates_mean_staleness():
    run = recorded("softsync", {"n": 1, "rule": "mean", "server_momentum": False},
                   {0: SOFTSYNC_SERVER}, SOFTSYNC_WORKERS)
    w, replay, _ = replay_servers(run, SOFTSYNC_GRADS)
    # 1: mean (1, 2, 3) = 2, <sigma> 0: w = 1 - 0.1 (2 + 0.1) = 0.79
    # 2: mean (3, -1, 1) = 1: w = 0.79 - 0.1 (1 + 0.079) = 0.6821
    # 3: mean (4, 2, 0) = 2, <sigma> 4/3, lr 0.075: w = 0.6821 - 0.075 (2 + 0.06821)
    #    = 0.52698425
    # epoch end, the one left: w = 0.52698425 - 0.1 (5 + 0.052698425) = 0.0217144075
    assert w == close([0.0217144075])
    assert replay.staleness == [0, 0, 0, 0, 0, 0, 2, 2, 0, 0]
    assert len(replay.updates) == 4


def test_softsync_zhang_divides_each_gradient_with_the_servers_momentum_if_kept():
    options = {"n": 1, "rule": "each", "server_momentum": False}
    run = recorded("softsync", options, {0: SOFTSYNC_SERVER}, SOFTSYNC_WORKERS, momentum=0.5)
    w, _, _ = replay_servers(run, SOFTSYNC_GRADS)
    # 1, 2 as Gupta's (every sigma 0): 0.79, 0.6821
    # 3: (4/2 + 2/2 + 0/1) / 3 = 1: w = 0.6821 - 0.1 (1 + 0.06821) = 0.575279
    # end: w = 0.575279 - 0.1 (5 + 0.0575279) = 0.06952621 (--momentum ignored)
    assert w == close([0.06952621])
    kept = recorded("softsync", dict(options, server_momentum=True), {0: SOFTSYNC_SERVER},
                    SOFTSYNC_WORKERS, momentum=0.5)
    w, _, _ = replay_servers(kept, SOFTSYNC_GRADS)
    # 1: d = 2 + 0.1 = 2.1; buf = 2.1; w = 1 - 0.21 = 0.79
    # 2: d = 1 + 0.079 = 1.079; buf = 1.05 + 1.079 = 2.129; w = 0.79 - 0.2129 = 0.5771
    # 3: d = 1 + 0.05771 = 1.05771; buf = 1.0645 + 1.05771 = 2.12221; w = 0.364879
    # end: d = 5 + 0.0364879 = 5.0364879; buf = 1.061105 + 5.0364879 = 6.0975929;
    #      w = 0.364879 - 0.60975929 = -0.24488029
    assert w == close([-0.24488029])


def test_softsync_with_n_not_dividing_the_workers_updates_every_floor_of_their_ratio():
    # 3 workers, n = 2: c = floor(3 / 2) = 1, an update per gradient at lr / max(sigma, 1).
    # w1, w2, w3 all read v0 and arrive in turn: sigma 0, 1, 2. No weight decay.
    server = [[G, 1, 0, 4], [G, 2, 1, 4], [G, 3, 2, 4]] + [[L, w, 0, 0] for w in (1, 2, 3)] \
        + [[E, -1, 0, 0]]
    workers = {w: [[0, 4, 0]] for w in (1, 2, 3)}
    run = recorded("softsync", {"n": 2, "rule": "mean", "server_momentum": False},
                   {0: server}, workers, weight_decay=0.0)
    w, replay, _ = replay_servers(run, {1: [1.0], 2: [2.0], 3: [4.0]})
    # 1 - 0.1 x 1 = 0.9; 0.9 - 0.1 x 2 = 0.7; 0.7 - (0.1 / 2) x 4 = 0.5
    assert w == close([0.5]) and len(replay.updates) == 3
    # c rounded up (2) would hold the first two: then w2's gradient met version 0, not 1
    run.config["options"]["n"] = 1  # c = 3: the recorded staleness no longer fits
    with pytest.raises(Differs, match="the run counted staleness 1"):
        replay_servers(run, {1: [1.0], 2: [2.0], 3: [4.0]})


# dbs: w1 takes 6 samples a step, w2 (slower) 2; b = 4.
DBS_EACH_SERVER = [[G, 1, 0, 6], [G, 2, 1, 2], [G, 1, 1, 6], [L, 1, 0, 0], [L, 2, 0, 0],
                   [E, -1, 0, 0]]
DBS_EACH_WORKERS = {1: [[0, 6, 0], [0, 6, 1]], 2: [[0, 2, 0]]}


def test_dbs_each_weights_the_gradient_by_its_samples_not_the_decay():
    run = recorded("dbs", {"update": "each"}, {0: DBS_EACH_SERVER}, DBS_EACH_WORKERS,
                   momentum=0.5)
    w, _, _ = replay_servers(run, {1: [1.0, -2.0], 2: [3.0]})
    # 1: (6/4) x 1 = 1.5: w = 1 - 0.1 (1.5 + 0.1) = 0.84
    # 2: (2/4) x 3 = 1.5: w = 0.84 - 0.1 (1.5 + 0.084) = 0.6816
    # 3: (6/4) x -2 = -3: w = 0.6816 - 0.1 (-3 + 0.06816) = 0.974784 (--momentum unused)
    assert w == close([0.974784])


def test_dbs_rounds_average_by_samples_with_momentum_and_close_when_a_worker_leaves():
    # round 1: w1 (6 samples), w2 (2); round 2: w2 first, then w1; round 3: w1 only, then
    # w2 leaves and the round closes on the one worker still in the epoch
    server = [[G, 1, 0, 6], [G, 2, 0, 2], [G, 2, 0, 2], [G, 1, 0, 6], [G, 1, 0, 6],
              [L, 2, 0, 0], [L, 1, 0, 0], [E, -1, 0, 0]]
    workers = {1: [[0, 6, 0], [0, 6, 1], [0, 6, 2]], 2: [[0, 2, 0], [0, 2, 1]]}
    run = recorded("dbs", {"update": "round"}, {0: server}, workers, momentum=0.5)
    w, replay, _ = replay_servers(run, {1: [1.0, 1.0, 2.0], 2: [3.0, -1.0]})
    # 1: (6 x 1 + 2 x 3) / 8 = 1.5; d = 1.6; buf = 1.6; w = 1 - 0.16 = 0.84
    # 2: (6 x 1 + 2 x -1) / 8 = 0.5; d = 0.584; buf = 0.8 + 0.584 = 1.384; w = 0.7016
    # 3: 6 x 2 / 6 = 2; d = 2.07016; buf = 0.692 + 2.07016 = 2.76216; w = 0.425384
    assert w == close([0.425384])
    assert replay.staleness == [0] * 5 and len(replay.updates) == 3


def replay_master(strategy, options, master, workers, grads, **settings):
    run = recorded(strategy, options, {0: master}, workers, **settings)
    scripted = Scripted(grads)
    replay = ElasticReplay(run, scripted)
    centre = replay.replay().tolist()
    return centre, {w: replay.team[w].x.tolist() for w in workers}, replay


def test_easgd_async_pulls_worker_and_centre_from_the_pre_step_values_with_decay():
    # tau 1, alpha 0.25; the master takes w1 s0, w2 s0, w2 s1, w1 s1
    workers = {1: [[0, 4, 1], [0, 4, 1]], 2: [[0, 4, 1], [0, 4, 1]]}
    master = [[1, 0], [2, 0], [2, 0], [1, 0]]
    centre, x, replay = replay_master("easgd-async", {"alpha": 0.25, "tau": 1}, master,
                                      workers, {1: [2.0, 1.0], 2: [-1.0, 3.0]})
    # w1 s0: d = 0; x1 = 1 - 0.1 (2 + 0.1) = 0.79.   w2 s0: d = 0; x2 = 1 - 0.1 (-1 + 0.1)
    # = 1.09.   w2 s1: d = 0.25 (1.09 - 1) = 0.0225; x2 = 1.09 - 0.1 (3 + 0.109) - 0.0225
    # = 0.7566; centre 1.0225.   w1 s1: d = 0.25 (0.79 - 1.0225) = -0.058125;
    # x1 = 0.79 - 0.1 (1 + 0.079) + 0.058125 = 0.740225; centre 0.964375
    assert centre == close([0.964375])
    assert x == {1: close([0.740225]), 2: close([0.7566])}
    # staleness: moves of the centre by others since the worker last saw it (0 before
    # its first exchange counts every move): w1 0, w2 1, w2 0, w1 2 (w2 moved it twice)
    assert replay.staleness == [0, 1, 0, 2]


def test_easgd_round_robin_default_alpha_and_each_workers_own_schedule():
    # alpha -1: 0.9 / 2 workers = 0.45. --schedule step over T = 2 steps: a worker's rate
    # is 0.1 at its step 0, 0.01 at its step 1 (its own count, not the master's).
    workers = {1: [[0, 4, 1], [0, 4, 1]], 2: [[0, 4, 1], [0, 4, 1]]}
    master = [[1, 0], [2, 0], [1, 0], [2, 0]]
    centre, x, _ = replay_master("easgd-rr", {"alpha": -1.0, "tau": 1}, master, workers,
                                 {1: [2.0, 1.0], 2: [-1.0, 3.0]}, schedule="step", batches=2)
    # s0: x1 = 0.79, x2 = 1.09, centre 1.   w1 s1: d = 0.45 (0.79 - 1) = -0.0945;
    # x1 = 0.79 - 0.01 (1 + 0.079) + 0.0945 = 0.87371; centre 0.9055.   w2 s1:
    # d = 0.45 (1.09 - 0.9055) = 0.083025; x2 = 1.09 - 0.01 (3 + 0.109) - 0.083025
    # = 0.975885; centre 0.988525
    assert centre == close([0.988525])
    assert x == {1: close([0.87371]), 2: close([0.975885])}


def test_easgd_with_tau_two_takes_plain_gradient_steps_between_exchanges():
    workers = {1: [[0, 4, 1], [0, 4, 0], [0, 4, 1]]}
    centre, x, _ = replay_master("easgd-async", {"alpha": 0.5, "tau": 2}, [[1, 0], [1, 0]],
                                 workers, {1: [1.0, 1.0, 1.0]}, weight_decay=0.0)
    # s0: d = 0, x = 0.9; s1 (no exchange): x = 0.8; s2: d = 0.5 (0.8 - 1) = -0.1,
    # x = 0.8 - 0.1 + 0.1 = 0.8, centre 1 - 0.1 = 0.9
    assert centre == close([0.9]) and x == {1: close([0.8])}


def test_measgd_takes_the_decay_at_the_look_ahead_and_the_pull_at_x():
    # one worker, tau 1, alpha 0.25, delta 0.5, weight decay 0.1; gradients 2, 1, -1
    workers = {1: [[0, 4, 1]] * 3}
    centre, x, _ = replay_master("measgd-async", {"alpha": 0.25, "tau": 1, "delta": 0.5},
                                 [[1, 0]] * 3, workers, {1: [2.0, 1.0, -1.0]})
    # s0: v = 0, y = 1, d = 0; step 0.1 (2 + 0.1) = 0.21; x = 0.79, v = -0.21
    # s1: v = -0.105, y = 0.685; d = 0.25 (0.79 - 1) = -0.0525; step 0.1 (1 + 0.0685)
    #     = 0.10685; x = 0.685 - 0.10685 + 0.0525 = 0.63065; v = -0.21185; centre 0.9475
    # s2: v = -0.105925, y = 0.524725; d = 0.25 (0.63065 - 0.9475) = -0.0792125;
    #     step 0.1 (-1 + 0.0524725) = -0.09475275; x = 0.69869025; centre 0.8682875
    assert centre == close([0.8682875])
    assert x == {1: close([0.69869025])}
