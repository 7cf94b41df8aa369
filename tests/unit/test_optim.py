"""SGD and LARS update rules, LR schedules, and argument checks."""


import numpy as np
import pytest

from minidp import layers
from minidp.layers import Parameter
from minidp.optim import (
    LARS,
    SGD,
    CosineLR,
    LookAhead,
    LRScheduler,
    PolynomialLR,
    StepLR,
    WarmupLR,
    trust_ratio,
)


def test_lars_trust_ratio_test_vector():
    # torchlars' test vector: ||w||=1.234, ||g||=5.678, wd=1e-4, eps=1e-8, trust=0.001
    assert trust_ratio(1.234, 5.678, 1e-4, 0.001, 1e-8) == pytest.approx(2.17325e-4, rel=1e-5)
    assert trust_ratio(0.0, 5.678, 1e-4, 0.001, 1e-8) == 1.0
    assert trust_ratio(1.234, 0.0, 1e-4, 0.001, 1e-8) == 1.0


@pytest.mark.parametrize("scale", [1e-3, 1.0, 1e4])
def test_lars_update_norm_is_lr_trust_w_whatever_the_gradient_scale(scale):
    rng = np.random.default_rng(0)
    p = Parameter(rng.standard_normal((5, 7)))
    q = Parameter(rng.standard_normal(3) * 4)
    before = [p.data.copy(), q.data.copy()]
    p.grad, q.grad = rng.standard_normal((5, 7)) * scale, rng.standard_normal(3) * scale
    opt = LARS([p, q], lr=0.1, momentum=0.0, weight_decay=0.0, trust_coefficient=0.001, eps=0.0)
    opt.step()
    for new, old in zip((p.data, q.data), before):
        assert np.linalg.norm(new - old) == pytest.approx(0.1 * 0.001 * np.linalg.norm(old),
                                                          rel=1e-12)


def test_lars_with_weight_decay_that_matters_equals_the_paper_written_out():
    """Algorithm 1 of You, Gitman, Ginsburg (2017) at constant lr, weight decay 0.5."""
    rng = np.random.default_rng(1)
    shapes = [(6, 4), (4,)]
    ws = [rng.standard_normal(s) for s in shapes]
    grads = [[rng.standard_normal(s) * 3 for s in shapes] for _ in range(4)]
    lr, m, wd, trust, eps = 0.3, 0.9, 0.5, 0.02, 1e-8
    params = [Parameter(w.copy()) for w in ws]
    opt = LARS(params, lr=lr, momentum=m, weight_decay=wd, trust_coefficient=trust, eps=eps)
    expected, velocity = [w.copy() for w in ws], [np.zeros(s) for s in shapes]
    for step in grads:
        for p, g in zip(params, step):
            p.grad = g.copy()
        opt.step()
        for i, g in enumerate(step):
            w = expected[i]
            local = trust * np.linalg.norm(w) / (np.linalg.norm(g) + wd * np.linalg.norm(w) + eps)
            velocity[i] = m * velocity[i] + lr * local * (g + wd * w)
            expected[i] = w - velocity[i]
    for p, w in zip(params, expected):
        np.testing.assert_allclose(p.data, w, rtol=1e-13, atol=1e-15)
    # the weight decay is large enough that leaving it out of the ratio moves the result
    assert trust_ratio(1.234, 5.678, wd, trust, eps) < 0.91 * trust_ratio(1.234, 5.678, 0.0,
                                                                            trust, eps)


def test_lars_excludes_biases_when_asked():
    p, b = Parameter(np.ones((2, 2))), Parameter(np.ones(2))
    p.grad, b.grad = np.ones((2, 2)), np.ones(2)
    opt = LARS([p, b], lr=0.5, momentum=0.0, weight_decay=0.1, exclude_bias_and_bn=True)
    opt.step()
    np.testing.assert_allclose(b.data, 1 - 0.5 * 1.0)  # plain SGD, no weight decay
    assert opt.last_ratios[1] == 1.0 and opt.last_ratios[0] < 1e-2


def reference_sgd(w, grads, lr, momentum, nesterov, wd):
    """PyTorch's SGD written out step by step."""
    buf = None
    for g in grads:
        d = g + wd * w
        if momentum:
            buf = d.copy() if buf is None else momentum * buf + d
            d = d + momentum * buf if nesterov else buf
        w = w - lr * d
    return w


@pytest.mark.parametrize("momentum,nesterov,wd", [(0, False, 0), (0.9, False, 0),
                                                   (0.9, True, 1e-2), (0.5, False, 5e-4)])
@pytest.mark.parametrize("flat", [True, False])
def test_sgd_matches_pytorch_convention(momentum, nesterov, wd, flat):
    layers.manual_seed(3)
    model = layers.mlp(6, (5,), 3).to(np.float64)
    params = model.parameters() if flat else [Parameter(p.data.copy()) for p in model.parameters()]
    w0 = [p.data.copy() for p in params]
    rng = np.random.default_rng(1)
    grads = [[rng.standard_normal(p.shape) for p in params] for _ in range(4)]
    opt = SGD(params, lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    assert (opt.flat is not None) == flat
    for step in grads:
        for p, g in zip(params, step):
            if p.grad is None:
                p.grad = g.copy()
            else:
                p.grad[...] = g
        opt.step()
    for i, p in enumerate(params):
        expected = reference_sgd(w0[i], [s[i] for s in grads], 0.1, momentum, nesterov, wd)
        np.testing.assert_allclose(p.data, expected, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("momentum,nesterov,wd", [(0, False, 0), (0.9, False, 0),
                                                   (0.9, True, 1e-2), (0.5, False, 5e-4)])
def test_parts_stepped_one_by_one_give_the_whole_steps_bits(momentum, nesterov, wd):
    # DASO's identical node: one replica, each rank steps its part (float32: any other
    # order of operations would show in the bits); out= leaves the part for the average
    rng = np.random.default_rng(5)
    layers.manual_seed(4)
    whole, parts = layers.mlp(6, (5,), 3), layers.mlp(6, (5,), 3)
    parts.flat_parameters().data[...] = whole.flat_parameters().data
    opt_whole, opt_parts = (SGD(m.parameters(), lr=0.1, momentum=momentum, nesterov=nesterov,
                                weight_decay=wd) for m in (whole, parts))
    start = rng.standard_normal(opt_whole.state.size).astype(np.float32)
    opt_whole.state[...], opt_parts.state[...] = start, start
    n = opt_whole.state.size
    for _ in range(3):
        grad = rng.standard_normal(n).astype(np.float32)
        whole.flat_parameters().grad[...] = grad
        opt_whole.step()
        for part in (slice(0, n // 3), slice(n // 3, n)):
            opt_parts.update(grad[part], part)
    np.testing.assert_array_equal(parts.flat_parameters().data, whole.flat_parameters().data)
    np.testing.assert_array_equal(opt_parts.state, opt_whole.state)
    assert opt_parts.step_count == 6  # counted per call: one call per rank and step
    x = parts.flat_parameters().data.copy()
    out = np.full(n // 2, np.nan, np.float32)
    opt_parts.update(grad[:n // 2], slice(0, n // 2), out=out)
    np.testing.assert_array_equal(parts.flat_parameters().data, x)
    opt_whole.step()
    np.testing.assert_array_equal(out, whole.flat_parameters().data[:n // 2])
    np.testing.assert_array_equal(opt_parts.state[:n // 2], opt_whole.state[:n // 2])


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.9, False, 0), (0.9, True, 1e-2)])
def test_sgd_steps_a_part_another_array_without_momentum_and_at_a_divided_rate(momentum,
                                                                                 nesterov, wd):
    # what a parameter server (its shard, momentum if kept, softsync's divided rate), an
    # elastic worker (plain SGD) and hogwild (the node's copy) ask of the optimizer,
    # against PyTorch's SGD written out on the same numbers
    layers.manual_seed(2)
    model = layers.mlp(6, (5,), 3).to(np.float64)
    opt = SGD(model.parameters(), lr=0.1, momentum=momentum, nesterov=nesterov, weight_decay=wd)
    flat, n = model.flat_parameters(), opt.state.size
    rng = np.random.default_rng(3)
    shard, grads = slice(n // 4, n // 2), [rng.standard_normal(n // 2 - n // 4) for _ in range(3)]
    w0, untouched = flat.data[shard].copy(), flat.data.copy()
    for g in grads:
        opt.update(g, shard, lr_divisor=2.5)
    expected = reference_sgd(w0, grads, 0.1 / 2.5, momentum, nesterov, wd)
    np.testing.assert_allclose(flat.data[shard], expected, rtol=1e-13, atol=1e-15)
    outside = np.ones(n, bool)
    outside[shard] = False
    np.testing.assert_array_equal(flat.data[outside], untouched[outside])
    state, w1, g = opt.state.copy(), flat.data.copy(), rng.standard_normal(n)
    flat.grad[...] = g
    opt.update(momentum=False)  # plain SGD: the momentum neither used nor advanced
    np.testing.assert_allclose(flat.data, w1 - 0.1 * (g + wd * w1), rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(opt.state, state)
    other, w2 = rng.standard_normal(n), flat.data.copy()
    stepped = other.copy()
    opt.update(params=stepped, momentum=False)  # hogwild: the node's copy, not the model
    np.testing.assert_allclose(stepped, other - 0.1 * (g + wd * other), rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(flat.data, w2)
    assert opt.step_count == 5


def test_sgd_step_with_arguments_needs_the_flat_buffers():
    p = Parameter(np.ones(3))
    p.grad = np.ones(3)
    with pytest.raises(RuntimeError, match="needs the model's flat parameters"):
        SGD([p], lr=0.1).update(momentum=False)


def test_lookahead_is_eamsgds_worker_step_written_out():
    # Zhang et al. 2015, Algorithm 2 on one worker without exchanges:
    #   v <- delta v - lr (g(x + delta v) + wd (x + delta v));   x <- x + v
    layers.manual_seed(5)
    model = layers.mlp(4, (3,), 2).to(np.float64)
    opt = SGD(model.parameters(), lr=0.05, weight_decay=1e-2)
    momentum, flat = LookAhead(opt, delta=0.8), model.flat_parameters()
    x, v = flat.data.copy(), np.zeros(flat.size)
    rng = np.random.default_rng(6)
    keep = np.empty(flat.size)
    for _ in range(4):
        g = rng.standard_normal(flat.size)  # the gradient the model gives at y = x + delta v
        momentum.look_ahead(keep)
        np.testing.assert_allclose(keep, x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(flat.data, x + 0.8 * v, rtol=1e-14, atol=1e-15)
        flat.grad[...] = g
        momentum.step()
        y = x + 0.8 * v
        v = 0.8 * v - 0.05 * (g + 1e-2 * y)
        x = x + v
        np.testing.assert_allclose(flat.data, x, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(opt.state, v, rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match=r"delta: got 1.0, allowed: in \[0.0, 1.0\)"):
        LookAhead(opt, delta=1.0)


def test_rebound_state_is_the_buffer_and_takes_the_updates():
    model = layers.mlp(4, (3,), 2)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.flat_parameters().grad[...] = 1
    opt.step()
    buffer = opt.state.copy()  # the caller fills it: nothing is copied
    before = buffer.copy()
    opt.rebind_state(buffer)
    assert opt.state is buffer
    opt.step()
    np.testing.assert_allclose(buffer, 0.9 * before + 1, rtol=1e-6)
    assert all(np.shares_memory(v, buffer) for v in opt.state_views)
    with pytest.raises(ValueError, match="rebind_state: buffer has shape"):
        opt.rebind_state(np.zeros(3, np.float32))


def test_optimizer_state_round_trips():
    model = layers.mlp(4, (3,), 2)
    opt = SGD(model.parameters(), lr=0.1, momentum=0.9)
    model.flat_parameters().grad[...] = 1
    opt.step()
    saved = opt.state_dict()
    opt2 = SGD(model.parameters(), lr=0.5, momentum=0.9)
    opt2.load_state_dict(saved)
    np.testing.assert_array_equal(opt2.state, opt.state)
    assert opt2.lr == 0.1 and opt2.step_count == 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(lr=-0.1), r"lr: got -0.1, allowed: >= 0"),
    (dict(lr=0.1, momentum=1.5), r"momentum: got 1.5, allowed: in \[0.0, 1.0\)"),
    (dict(lr=0.1, momentum=-0.1), "momentum: got -0.1"),
    (dict(lr=0.1, weight_decay=-1), "weight_decay: got -1"),
    (dict(lr=0.1, nesterov=True), "Nesterov needs momentum > 0"),
    (dict(lr=float("nan")), "lr: got nan"),
])
def test_sgd_rejects_out_of_range_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        SGD(layers.mlp(4, (3,), 2).parameters(), **kwargs)


def test_optimizer_notices_replaced_parameters():
    model = layers.mlp(4, (3,), 2)
    opt = SGD(model.parameters(), lr=0.1)
    model.to(np.float64)
    with pytest.raises(RuntimeError, match="replaced after the optimizer was built"):
        opt.step()


def test_schedules():
    assert StepLR(1.0, 10, 0.5)(25) == 0.25
    cos = CosineLR(1.0, 100, min_lr=0.1)
    assert cos(0) == 1.0 and cos(100) == pytest.approx(0.1) and cos(50) == pytest.approx(0.55)
    poly = PolynomialLR(2.0, 10)
    assert poly(0) == 2.0 and poly(5) == pytest.approx(0.5) and poly(10) == 0.0
    warm = WarmupLR(PolynomialLR(1.0, 100), warmup_steps=10)
    assert warm(0) == 0.0 and warm(5) == pytest.approx(0.5 * 0.95 ** 2)
    assert warm(10) == pytest.approx(0.9 ** 2)
    opt = SGD(layers.mlp(4, (3,), 2).parameters(), lr=1.0)
    sched = LRScheduler(opt, StepLR(1.0, 2, 0.1))
    assert [sched.step() for _ in range(4)] == pytest.approx([1.0, 0.1, 0.1, 0.01])


def test_schedule_arguments_are_checked():
    with pytest.raises(ValueError, match="total_steps: got 0, allowed: an int >= 1"):
        PolynomialLR(1.0, 0)
    with pytest.raises(ValueError, match="warmup_steps: got -1, allowed: an int >= 0"):
        WarmupLR(CosineLR(1.0, 10), -1)
    with pytest.raises(ValueError, match=r"base_lr: got -1.0, allowed: >= 0"):
        StepLR(-1.0, 5)
