"""DASO's (B, S, L) per epoch, worked by hand, and the down-cast emulation, without MPI.

``tests/unit/test_daso_heat.py`` holds the schedule against a transcription of Heat's
``epoch_loss_logic`` on thousands of random loss sequences; these cases show the rules.
"""


from minidp.strategies import DASOSchedule


def trajectory(losses, **kw):
    s = DASOSchedule(**kw)
    values = [s.values]
    for done, loss in enumerate(losses, start=1):
        values.append(s.update(done, loss))
    return values


def test_trajectory_through_warmup_plateaus_reset_and_cooldown():
    # 16 epochs: warm-up 2, cool-down 2; the loss improves, then stalls from epoch 4 on
    losses = [1.0, 0.8, 0.6, 0.5] + [0.5] * 11
    got = trajectory(losses, total_epochs=16, warmup_epochs=2, cooldown_epochs=2,
                     local_skip_factor=2)
    expected = [(0, 0, 0), (0, 0, 0),          # warm-up epochs 0 and 1
                (4, 1, 1),                      # hard-coded after warm-up (epoch 2)
                (4, 1, 1), (4, 1, 1),           # 0.6, 0.5 improve by > 5%
                (4, 1, 1), (4, 1, 1),           # two bad epochs: within patience
                (2, 1, 1),                      # third bad epoch: plateau, B halves
                (2, 1, 1), (2, 1, 1), (1, 1, 1),
                (1, 1, 1), (1, 1, 1),
                (8, 4, 4),                      # plateau at B = 1: S = L = 8 // 2
                (0, 0, 0), (0, 0, 0)]           # cool-down: the last 2 epochs (14, 15)
    assert got == expected


def test_the_epoch_that_ends_warmup_counts_for_the_plateau():
    # the loss stalls right after warm-up: epoch 1's 0.8 is the best, epochs 2-4 are bad
    got = trajectory([1.0, 0.8, 0.8, 0.8, 0.8], total_epochs=10, warmup_epochs=2,
                     cooldown_epochs=0)
    assert got == [(0, 0, 0), (0, 0, 0), (4, 1, 1), (4, 1, 1), (4, 1, 1), (2, 1, 1)]


def test_first_epoch_blocks_and_no_warmup_never_cycles():
    # Heat sets (4, 1, 1) when the epochs done equal warmup_epochs: never 0 at an update
    assert trajectory([1.0, 1.0, 1.0, 1.0, 1.0], total_epochs=10, warmup_epochs=0,
                      cooldown_epochs=0) == [(0, 0, 0)] * 6
    assert trajectory([1.0], total_epochs=10, warmup_epochs=1,
                      cooldown_epochs=0) == [(0, 0, 0), (4, 1, 1)]


def test_improvement_below_the_stability_level_counts_as_bad():
    s = DASOSchedule(total_epochs=10, warmup_epochs=0, cooldown_epochs=0)
    assert not s.plateau(1.0)
    assert not s.plateau(0.96) and not s.plateau(0.955)  # < 5 % better: bad epochs 1, 2
    assert s.plateau(0.951)                              # bad epoch 3: plateau
    assert s.bad_epochs == 0


def test_negative_losses_improve_by_the_same_relative_margin():
    s = DASOSchedule(total_epochs=10, warmup_epochs=0, cooldown_epochs=0, patience=0)
    assert not s.plateau(-1.0)
    assert s.plateau(-1.04)      # better means below -1 * 1.05 (not -1 * 0.95)
    assert not s.plateau(-1.06)
    assert s.plateau(-1.06)      # equal: bad


def test_plateaus_with_small_max_global_skips_leave_s_below_one():
    # reset: S = L = 2 // 4 = 0 (blocking); halving B then gives S = -1, which Heat keeps
    s = DASOSchedule(total_epochs=20, warmup_epochs=0, cooldown_epochs=0, patience=0,
                     max_global_skips=2)
    s.load_state_dict({"values": [1, 1, 1], "best": 1.0, "bad_epochs": 0})
    assert [s.update(d, 1.0) for d in range(1, 5)] == [(2, 0, 0), (1, -1, 1), (2, 0, 0),
                                                      (1, -1, 1)]


def test_heat_defaults_and_cooldown_over_warmup():
    s = DASOSchedule(total_epochs=20)
    assert (s.warmup_epochs, s.cooldown_epochs, s.max_global_skips, s.patience) == (4, 4, 8, 2)
    assert (s.skip_reduction_factor, s.local_skip_factor, s.stability_level) == (2, 4, 0.05)
    short = DASOSchedule(total_epochs=5, warmup_epochs=1, cooldown_epochs=4)
    assert short.update(1, 1.0) == (0, 0, 0)


def test_state_round_trip():
    s = DASOSchedule(total_epochs=30, warmup_epochs=1, cooldown_epochs=0)
    for done in range(1, 8):
        s.update(done, 1.0)
    t = DASOSchedule(total_epochs=30, warmup_epochs=1, cooldown_epochs=0)
    t.load_state_dict(s.state_dict())
    assert [t.update(d, 1.0) for d in range(8, 15)] == [s.update(d, 1.0) for d in range(8, 15)]
    assert len({s.update(d, 1.0) for d in range(15, 25)}) > 1  # it cycled
