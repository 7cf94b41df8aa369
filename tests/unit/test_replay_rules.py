"""The replay's update rules (the oracle) against numbers worked by hand from the papers.

minidp.replay judges every asynchronous run; here its rules are judged: EAMSGD on a
scalar quadratic (Zhang, Choromanska, LeCun 2015, Algorithm 2), the two n-softsync rates,
DBS's sample weights, and the package's independence from the strategies it checks.
"""

import ast
import os

import numpy as np
import pytest

from minidp.replay import rules

PACKAGE = os.path.join(os.path.dirname(__file__), "..", "..", "minidp", "replay")


def eamsgd(steps, frozen):
    """The look-ahead points y_t = x_t + delta v_t, t = 1.., of the replay's EAMSGD rule on
    f(x) = x^2/2, eta 0.1, alpha 0.2, delta 0.9, x_0 = 1, centre 0 (frozen or updated)."""
    x, v, centre = np.array([1.0]), np.array([0.0]), np.array([0.0])
    points = []
    for _ in range(steps):
        y = rules.look_ahead(x, v, 0.9)
        d = rules.eamsgd_step(x, y, v, y.copy(), centre, 0.2, 0.1, 0.0)
        if not frozen:
            centre += d
        points.append(float((x + 0.9 * v)[0]))
    return points


def test_eamsgd_takes_the_elastic_difference_at_x_not_at_the_look_ahead():
    # The hand-worked numbers: the paper's look-ahead points with the centre held
    # at 0 are 0.610, 0.2731, 0.0171 (exactly 0.017101: x_3 = 0.16399, v_3 = -0.16321);
    # with the elastic term taken at the look-ahead (PyTorch's Nesterov form) they were
    # 0.610, 0.2911, 0.0553.
    assert eamsgd(3, frozen=True) == pytest.approx([0.61, 0.2731, 0.017101], abs=1e-12)
    # With the master updated every step: 0.61, 0.3131, 0.101501 (x_3 = 0.25199,
    # v_3 = -0.16721); PyTorch's form gave 0.3311.
    assert eamsgd(3, frozen=False) == pytest.approx([0.61, 0.3131, 0.101501], abs=1e-12)


def test_easgd_moves_worker_and_centre_by_the_same_pull_from_the_pre_step_x():
    x, g, centre = np.array([2.0]), np.array([0.5]), np.array([1.0])
    d = rules.easgd_step(x, g, centre, alpha=0.25, lr=0.1, weight_decay=0.0)
    assert d.tolist() == [0.25]  # 0.25 (2 - 1), at x before the gradient step
    assert x.tolist() == [2.0 - 0.1 * 0.5 - 0.25]


def test_zhang_scales_each_gradient_by_its_staleness_and_gupta_the_rate_by_their_mean():
    grads = [np.array([6.0]), np.array([6.0]), np.array([6.0])]
    # staleness 0, 2, 3: 6/1 + 6/2 + 6/3 = 11, over c = 3
    assert rules.per_gradient_staleness(grads, [0, 2, 3]).tolist() == [11 / 3]
    assert rules.mean(grads).tolist() == [6.0]
    assert rules.mean_staleness_rate(0.3, [0, 2, 4]) == pytest.approx(0.15)  # <sigma> = 2
    assert rules.mean_staleness_rate(0.3, [0, 0, 1]) == 0.3  # <sigma> < 1: the full rate


def test_dbs_weights_a_gradient_by_its_share_of_the_samples():
    assert rules.sample_weight(np.array([1.0]), 12, 8).tolist() == [1.5]  # b_i / b
    mean = rules.round_mean({3: np.array([1.0]), 1: np.array([4.0])}, {3: 2, 1: 6})
    assert mean.tolist() == [(2 * 1.0 + 6 * 4.0) / 8]  # sum b_i g_i / sum b_i


def test_sgd_is_pytorchs_with_momentum_and_nesterov():
    w, buf = np.array([1.0]), np.array([0.5])
    rules.sgd(w, np.array([2.0]), 0.1, momentum=0.9, weight_decay=0.1, nesterov=True, buf=buf)
    d = 2.0 + 0.1 * 1.0
    b = 0.9 * 0.5 + d
    assert buf.tolist() == [b] and w.tolist() == [1.0 - 0.1 * (d + 0.9 * b)]


def test_the_oracle_imports_neither_the_strategies_nor_the_run():
    for name in os.listdir(PACKAGE):
        if not name.endswith(".py"):
            continue
        with open(os.path.join(PACKAGE, name)) as f:
            tree = ast.parse(f.read())
        imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import)
                    for a in n.names} | {n.module for n in ast.walk(tree)
                                         if isinstance(n, ast.ImportFrom) and n.module}
        bad = [m for m in imported if m.startswith(("minidp.strategies", "minidp.run"))]
        assert bad == [], f"minidp/replay/{name} imports {bad}"
