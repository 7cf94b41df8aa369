"""dbs's batch allocator against an independent computation, over speeds, totals and bounds.

The allocation the docs promise (docs/dbs.md): integer sizes b_i in [low, high] summing
to the total, each within one sample of the clamped proportional share
s_i = clamp(lam v_i, low, high), where lam is the scale at which the shares sum to the
total. Here lam is found by bisection in floating point (the allocator solves for it
exactly in rational numbers), so the two computations share nothing but the definition.
Whenever such sizes exist (n low <= total <= n high) the allocator returns them; when
none exist it raises, naming the total and the bounds.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minidp.strategies.dbs import proportional_sizes


def clamped_proportional(speeds, total, low, high):
    """s_i = clamp(lam v_i, low, high) with sum total, lam by bisection (float64)."""
    v = np.asarray(speeds, np.float64)
    lo, hi = 0.0, high / v.min()
    for _ in range(200):
        mid = (lo + hi) / 2
        if np.clip(mid * v, low, high).sum() < total:
            lo = mid
        else:
            hi = mid
    return np.clip(hi * v, low, high)


speeds_lists = st.lists(st.floats(1e-3, 1e3, allow_nan=False, allow_infinity=False),
                        min_size=1, max_size=12)


@settings(max_examples=400, deadline=None, database=None)
@given(speeds=speeds_lists, low=st.integers(1, 20), span=st.integers(0, 60),
       fill=st.floats(0, 1))
def test_whenever_a_split_exists_the_allocator_returns_one_near_proportional(speeds, low,
                                                                             span, fill):
    n, high = len(speeds), low + span
    total = round(n * low + fill * n * (high - low))  # every reachable total, ends included
    sizes = proportional_sizes(np.array(speeds), total, low, high)
    assert sizes.dtype == np.int64 and len(sizes) == n
    assert sizes.sum() == total
    assert sizes.min() >= low and sizes.max() <= high
    target = clamped_proportional(speeds, total, low, high)
    assert np.all(np.abs(sizes - target) < 1 + 1e-6), (sizes, target)
    v = np.array(speeds)
    faster = v[:, None] > v[None, :]
    assert np.all(sizes[:, None] >= sizes[None, :], where=faster), (speeds, sizes)


@settings(max_examples=200, deadline=None, database=None)
@given(speeds=speeds_lists, low=st.integers(1, 20), span=st.integers(0, 60),
       beyond=st.integers(1, 50), above=st.booleans())
def test_when_no_split_exists_it_is_refused_with_the_reason(speeds, low, span, beyond, above):
    n, high = len(speeds), low + span
    total = n * high + beyond if above else n * low - beyond
    with pytest.raises(ValueError, match=rf"a total of {total} cannot be split into {n} "
                                         rf"sizes in \[{low}, {high}\]"):
        proportional_sizes(np.array(speeds), total, low, high)


def test_the_issues_case_gives_the_fast_worker_the_rest():
    # It crashed server 0's serve loop ("argmax of an empty sequence"): the fast worker's
    # share was fixed at 12 first, which left the other four less than their minimum.
    assert proportional_sizes(np.array([1, 1, 1, 1, 30.0]), 15, 1, 12).tolist() == \
        [1, 1, 1, 1, 11]


@pytest.mark.parametrize("speeds", [[0.0, 1.0], [1.0, np.inf], [1.0, np.nan], [-1.0, 2.0]])
def test_speeds_must_be_finite_and_positive(speeds):
    with pytest.raises(ValueError, match=r"speeds: got .*allowed: finite numbers > 0"):
        proportional_sizes(np.array(speeds), 4, 1, 4)
