"""DASO's (B, S, L) schedule and the down-cast emulation, without MPI."""

import numpy as np
import pytest

from minidp.strategies import DASOSchedule
from minidp.strategies.daso import downcast


def trajectory(losses, **kw):
    s = DASOSchedule(**kw)
    values = [s.values]
    for done, loss in enumerate(losses, start=1):
        values.append(s.update(done, loss))
    return values


def test_trajectory_through_warmup_plateaus_and_cooldown():
    # 16 epochs: warm-up 2, cool-down 2; the loss improves, then stalls from epoch 4 on
    losses = [1.0, 0.8, 0.6, 0.5] + [0.5] * 11
    got = trajectory(losses, total_epochs=16, warmup_epochs=2, cooldown_epochs=2)
    expected = [(0, 0, 0), (0, 0, 0),          # warm-up epochs 0 and 1
                (4, 1, 1),                      # hard-coded after warm-up (epoch 2)
                (4, 1, 1), (4, 1, 1),           # 0.6, 0.5 improve by > 5%
                (4, 1, 1), (4, 1, 1),           # two bad epochs: within patience
                (2, 1, 1),                      # third bad epoch: plateau, B halves
                (2, 1, 1), (2, 1, 1), (1, 1, 1),
                (1, 1, 1), (1, 1, 1), (8, 2, 2),  # plateau at B = 1: reset to max_global_skips
                (0, 0, 0), (0, 0, 0)]           # cool-down: the last 2 epochs (14, 15)
    assert got == expected


def test_improvement_below_the_stability_level_counts_as_bad():
    s = DASOSchedule(total_epochs=10, warmup_epochs=0, cooldown_epochs=0)
    assert not s.plateau(1.0)
    assert not s.plateau(0.96) and not s.plateau(0.955)  # < 5 % better: bad epochs 1, 2
    assert s.plateau(0.951)                              # bad epoch 3: plateau
    assert s.bad_epochs == 0


def test_heat_defaults_and_cooldown_over_warmup():
    s = DASOSchedule(total_epochs=20)
    assert (s.warmup_epochs, s.cooldown_epochs, s.max_global_skips, s.patience) == (4, 4, 8, 2)
    assert (s.skip_reduction_factor, s.local_skip_factor, s.stability_level) == (2, 4, 0.05)
    short = DASOSchedule(total_epochs=5, warmup_epochs=1, cooldown_epochs=4)
    assert short.update(1, 1.0) == (0, 0, 0)


def test_state_round_trip():
    s = DASOSchedule(total_epochs=30, warmup_epochs=0, cooldown_epochs=0)
    for done in range(1, 8):
        s.update(done, 1.0)
    t = DASOSchedule(total_epochs=30, warmup_epochs=0, cooldown_epochs=0)
    t.load_state_dict(s.state_dict())
    assert [t.update(d, 1.0) for d in range(8, 15)] == [s.update(d, 1.0) for d in range(8, 15)]


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_downcast_emulation(dtype):
    x = np.array([1.0, 1 + 2**-8, 1 + 2**-7 + 2**-9, 3.14159, -2.5e-3], dtype)
    b = downcast(x, "bf16")
    assert b.dtype == dtype
    bits = b.astype(np.float32).view(np.uint32)
    assert np.all(bits & 0xFFFF == 0)                 # only bfloat16's 16 bits remain
    np.testing.assert_allclose(b, x, rtol=2**-8)
    assert b[1] == 1.0                                 # tie rounds to even
    assert downcast(x, "fp16")[3] == np.float16(3.14159)
    assert downcast(x, "none") is x
