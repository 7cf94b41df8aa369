"""The learning-rate schedules a run and its replay share, pinned to rates worked by hand.

The Trainer and ``minidp replay`` both build their schedule with
``optim.make_schedule(kind, lr, epochs x batches, warmup_epochs x batches)``, so a bug
there is made on both sides and the replay cannot see it: only numbers written apart
from the code can. The rule, from the schedules' docstrings: the rate is a function of
the 0-based step t over T = total steps; ``step`` divides it by 10 at each third of
the run (every floor(T / 3) steps), ``cosine`` is lr (1 + cos(pi t / T)) / 2 and then 0,
``poly`` is lr (1 - t / T)^2 and then 0 (LARS's power 2), and a warm-up of W steps
multiplies the schedule's own rate at t by t / W for t < W.

Every table is for lr = 0.4 over T = 32 steps (no multiple of 3: thirds of 10 steps,
not 10.67 or 11). cos(pi / 4) = sqrt(2) / 2 is exact enough by hand; the rates at
other angles are written as the second formula, in the test, from ``math.cos``.
"""

import math

import pytest

from minidp.optim import make_schedule

LR, T = 0.4, 32


def rates(kind, steps, warmup=0):
    schedule = make_schedule(kind, LR, T, warmup)
    return [schedule(t) for t in steps]


def test_constant_keeps_the_rate_at_every_step():
    assert rates("constant", [0, 1, 16, 31, 32, 100]) == [0.4] * 6


def test_step_divides_by_ten_at_each_third_of_the_run():
    # floor(32 / 3) = 10: steps 0-9 at 0.4, 10-19 at 0.04, 20-29 at 0.004, 30 on at 0.0004
    steps = [0, 9, 10, 11, 19, 20, 29, 30, 31]
    expected = [0.4, 0.4, 0.04, 0.04, 0.04, 0.004, 0.004, 0.0004, 0.0004]
    assert rates("step", steps) == pytest.approx(expected, rel=1e-12, abs=0)


def test_cosine_halves_at_mid_run_and_ends_at_zero():
    half = 0.2 * math.sqrt(2) / 2  # 0.4 (1 + cos(pi/4)) / 2 = 0.2 + 0.2 sqrt(2)/2
    steps = [0, 8, 16, 24, 32, 40]  # t / T = 0, 1/4, 1/2, 3/4, 1, past the end
    expected = [0.4, 0.2 + half, 0.2, 0.2 - half, 0.0, 0.0]
    assert rates("cosine", steps) == pytest.approx(expected, rel=1e-12, abs=1e-15)
    # 0.2 + 0.1 sqrt(2) = 0.34142..., 0.2 - 0.1 sqrt(2) = 0.05857...
    assert rates("cosine", [8, 24]) == pytest.approx([0.341421356237, 0.058578643763],
                                                     abs=1e-12)


def test_poly_is_power_two_of_the_remaining_fraction():
    # 0.4 (1 - t/32)^2: 0.4, 0.4 x 9/16, 0.4 / 4, 0.4 / 16, 0, 0
    steps = [0, 8, 16, 24, 32, 40]
    expected = [0.4, 0.225, 0.1, 0.025, 0.0, 0.0]
    assert rates("poly", steps) == pytest.approx(expected, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("kind", ["constant", "step", "poly"])
def test_warm_up_ramps_linearly_from_zero_over_its_steps(kind):
    # W = 4: the schedule's rate at t times t/4 for t < 4, then the schedule itself.
    # At t < 4 constant and step give 0.4, poly 0.4 (1 - t/32)^2.
    under = {"constant": lambda t: 0.4, "step": lambda t: 0.4,
             "poly": lambda t: 0.4 * (1 - t / 32) ** 2}[kind]
    expected = [0.0, under(1) / 4, under(2) / 2, under(3) * 3 / 4, under(4)]
    assert rates(kind, [0, 1, 2, 3, 4], warmup=4) == pytest.approx(expected, rel=1e-12,
                                                                   abs=0)
    # by hand for step: 0, 0.1, 0.2, 0.3, 0.4; then the thirds of the whole run (the
    # warm-up steps are counted in T): 0.04 from step 10
    if kind == "step":
        assert rates(kind, [1, 2, 3, 9, 10], warmup=4) == pytest.approx(
            [0.1, 0.2, 0.3, 0.4, 0.04], rel=1e-12, abs=0)


def test_warm_up_before_cosine_multiplies_the_cosine_at_the_same_step():
    def cosine(t):
        return 0.4 * (1 + math.cos(math.pi * t / 32)) / 2

    expected = [0.0, cosine(1) / 8, cosine(4) / 2, cosine(7) * 7 / 8, cosine(8), 0.2]
    assert rates("cosine", [0, 1, 4, 7, 8, 16], warmup=8) == pytest.approx(expected,
                                                                           rel=1e-12, abs=0)


def test_a_run_shorter_than_three_steps_decays_every_step():
    # floor(2 / 3) = 0 would divide by zero: the step is at least 1
    schedule = make_schedule("step", 1.0, 2)
    assert [schedule(t) for t in range(3)] == pytest.approx([1.0, 0.1, 0.01], rel=1e-12)
