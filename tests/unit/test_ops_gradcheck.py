"""Every op is gradient-checked in float64 against central differences."""

import numpy as np
import pytest

from minidp import Tensor
from minidp import functional as F
from minidp.autograd import ops
from minidp.autograd.gradcheck import GradcheckError, gradcheck
from minidp.autograd.ops import rowtap, winograd


def t(shape, seed=0, positive=False, grad=True):
    rng = np.random.default_rng(seed)
    data = rng.uniform(0.5, 2.0, shape) if positive else rng.standard_normal(shape)
    return Tensor(data.astype(np.float64), requires_grad=grad)


# Every binary op is checked on a broadcasting pair in both directions, scalars included.
BROADCAST_PAIRS = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((1,), (2, 3))]


@pytest.mark.parametrize("op", ["add", "sub", "mul", "div", "pow"])
@pytest.mark.parametrize("shapes", BROADCAST_PAIRS)
def test_binary_ops_with_broadcasting(op, shapes):
    a, b = t(shapes[0], 1, positive=True), t(shapes[1], 2, positive=True)
    fn = {"add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y,
          "div": lambda x, y: x / y, "pow": lambda x, y: x ** y}[op]
    assert gradcheck(fn, [a, b])
    assert gradcheck(fn, [b, a])


@pytest.mark.parametrize("fn", [
    lambda x: 2.5 + x, lambda x: x - 1.5, lambda x: 3.0 - x, lambda x: x * -2.0,
    lambda x: 1.0 / x, lambda x: x / 4.0, lambda x: x ** 3, lambda x: x ** 0.5,
    lambda x: 2.0 ** x, lambda x: -x])
def test_ops_with_python_scalars(fn):
    assert gradcheck(fn, [t((3, 5), 3, positive=True)])


@pytest.mark.parametrize("name", ["exp", "log", "relu", "sigmoid", "tanh"])
def test_unary_ops(name):
    x = t((4, 5), 4, positive=(name == "log"))
    if name == "relu":  # keep away from the kink, where the derivative is undefined
        x.data[np.abs(x.data) < 1e-3] = 0.5
    assert gradcheck(lambda a: getattr(a, name)(), [x])


@pytest.mark.parametrize("reduce", ["sum", "mean", "max"])
@pytest.mark.parametrize("axis,keepdims", [(None, False), (0, False), (1, True), ((0, 2), False),
                                           (-1, True)])
def test_reductions(reduce, axis, keepdims):
    x = t((3, 4, 5), 5)
    assert gradcheck(lambda a: getattr(a, reduce)(axis=axis, keepdims=keepdims), [x])


def test_max_shares_gradient_between_ties():
    x = Tensor(np.array([[1.0, 3.0, 3.0], [2.0, 0.0, 1.0]]), requires_grad=True)
    x.max(axis=1).sum().backward()
    np.testing.assert_array_equal(x.grad, [[0, 0.5, 0.5], [1, 0, 0]])


@pytest.mark.parametrize("shapes", [((3, 4), (4, 5)), ((2, 3, 4), (4, 2)), ((4,), (4, 3)),
                                    ((3, 4), (4,)), ((2, 1, 3, 4), (5, 4, 2))])
def test_matmul(shapes):
    assert gradcheck(lambda a, b: a @ b, [t(shapes[0], 6), t(shapes[1], 7)])


def test_linear_with_and_without_bias():
    x, w, b = t((5, 4), 1), t((3, 4), 2), t((3,), 3)
    assert gradcheck(F.linear, [x, w, b])
    assert gradcheck(F.linear, [x, w])
    assert gradcheck(F.linear, [t((2, 5, 4), 4), w, b])


def test_shape_ops():
    x = t((2, 3, 4), 8)
    assert gradcheck(lambda a: a.reshape(4, 6), [x])
    assert gradcheck(lambda a: a.reshape(-1), [x])
    assert gradcheck(lambda a: a.transpose(2, 0, 1), [x])
    assert gradcheck(lambda a: a.T, [x])
    assert gradcheck(lambda a: F.flatten(a), [x])
    assert gradcheck(lambda a: a.flatten(), [x])


def test_indexing_by_integer_arrays_accumulates_repeats():
    x = t((5, 3), 9)
    idx = np.array([0, 2, 2, 4])
    assert gradcheck(lambda a: a[idx], [x])
    assert gradcheck(lambda a: a[idx, np.array([0, 1, 1, 2])], [x])
    assert gradcheck(lambda a: a[1:4, ::2], [x])
    y = Tensor(np.zeros(3), requires_grad=True)
    y[np.array([1, 1, 1])].sum().backward()
    np.testing.assert_array_equal(y.grad, [0, 3, 0])


@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_and_log_softmax(axis):
    x = t((4, 6), 10)
    assert gradcheck(lambda a: F.softmax(a, axis=axis), [x])
    assert gradcheck(lambda a: F.log_softmax(a, axis=axis), [x])


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_cross_entropy_and_mse(reduction):
    labels = np.array([0, 3, 2, 3, 1])
    assert gradcheck(lambda a: F.cross_entropy(a, labels, reduction=reduction), [t((5, 4), 11)])
    assert gradcheck(lambda a, b: F.mse_loss(a, b, reduction=reduction),
                     [t((3, 4), 12), t((3, 4), 13)])


def test_cross_entropy_is_stable_for_huge_logits():
    logits = Tensor(np.array([[1000.0, 0.0], [0.0, -1000.0]]), requires_grad=True)
    loss = F.cross_entropy(logits, np.array([0, 1]))
    assert np.isclose(loss.item(), 500.0)
    loss.backward()
    assert np.all(np.isfinite(logits.grad))


@pytest.mark.parametrize("stride,padding", [(1, 0), (2, 1), (2, 0), (1, 2), (3, 1)])
def test_conv2d(stride, padding):
    x, w, b = t((2, 3, 7, 6), 14), t((4, 3, 3, 2), 15), t((4,), 16)
    assert gradcheck(lambda a, c, d: F.conv2d(a, c, d, stride=stride, padding=padding), [x, w, b])
    assert gradcheck(lambda a, c: F.conv2d(a, c, stride=stride, padding=padding), [x, w])


# which engine computes a "same" convolution: Winograd, row taps or im2col (the channel
# thresholds of the first two set to 1 or out of reach)
ENGINES = {"winograd": (1, 1), "rowtap": (10**9, 1), "im2col": (10**9, 10**9)}


@pytest.mark.parametrize("engine", sorted(ENGINES))
def test_conv2d_same_padding_by_each_engine(monkeypatch, engine):
    monkeypatch.setattr(winograd, "MIN_CHANNELS", ENGINES[engine][0])
    monkeypatch.setattr(rowtap, "MIN_CHANNELS", ENGINES[engine][1])
    # odd sizes: partial 2x2 Winograd tiles at the bottom and right edges
    x, w, b = t((2, 3, 5, 4), 23), t((2, 3, 3, 3), 24), t((2,), 25)
    assert gradcheck(lambda a, c, d: F.conv2d(a, c, d, padding=1), [x, w, b])
    if engine != "winograd":  # Winograd is 3x3 only
        assert gradcheck(lambda a, c: F.conv2d(a, c, padding=2), [x, t((2, 3, 5, 5), 26)])


def test_winograd_transforms_the_weights_once_for_both_passes(monkeypatch):
    # U = G w G^T (0.2 ms for a 64 x 64 layer, on one thread): the backward pass
    # multiplies by the forward's U, with the same bits as transforming w again
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    transforms = []
    transform = winograd.weight_transform
    monkeypatch.setattr(winograd, "weight_transform", lambda w: transforms.append(w) or
                        transform(w))
    x, w, b = t((2, 3, 5, 4), 27), t((2, 3, 3, 3), 28), t((2,), 29)
    F.conv2d(x, w, b, padding=1).backward(np.random.default_rng(30).standard_normal((2, 2, 5, 4)))
    assert len(transforms) == 1
    assert gradcheck(lambda a, c, d: F.conv2d(a, c, d, padding=1), [x, w, b])


@pytest.mark.parametrize("pool", [F.max_pool2d, F.avg_pool2d])
@pytest.mark.parametrize("kernel,stride", [(2, None), (3, 2), (2, 1), (3, 3)])
def test_pooling_overlapping_and_not(pool, kernel, stride):
    x = t((2, 3, 7, 8), 17)
    assert gradcheck(lambda a: pool(a, kernel, stride), [x])


@pytest.mark.parametrize("shape", [(6, 3), (4, 3, 5, 5)])
@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_both_modes(shape, training):
    c = shape[1]
    x, w, b = t(shape, 18), t((c,), 19), t((c,), 20)
    rm = np.random.default_rng(1).standard_normal(c)
    rv = np.random.default_rng(2).uniform(0.5, 2, c)

    def fn(a, weight, bias):
        # fresh copies: training mode updates the running statistics in place
        return F.batch_norm(a, rm.copy(), rv.copy(), weight, bias, training=training)

    assert gradcheck(fn, [x, w, b])
    assert gradcheck(lambda a: F.batch_norm(a, rm.copy(), rv.copy(), training=training), [x])


def test_batch_norm_running_statistics_follow_pytorch_rule():
    x = np.random.default_rng(0).standard_normal((8, 2, 3, 3))
    rm, rv = np.zeros(2), np.ones(2)
    F.batch_norm(Tensor(x), rm, rv, training=True, momentum=0.1)
    mean = x.mean(axis=(0, 2, 3))
    var = x.var(axis=(0, 2, 3), ddof=1)
    np.testing.assert_allclose(rm, 0.1 * mean)
    np.testing.assert_allclose(rv, 0.9 + 0.1 * var)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_relu_with_residual(training):
    x, w, b, r = t((4, 3, 3, 2), 26), t((3,), 27), t((3,), 28), t((4, 3, 3, 2), 29)
    rm, rv = np.zeros(3), np.ones(3)

    def fn(a, weight, bias, res):
        return ops.batch_norm_relu(a, rm.copy(), rv.copy(), weight, bias, res, training=training)

    assert gradcheck(fn, [x, w, b, r])
    fused = fn(x, w, b, r).data
    unfused = (F.batch_norm(x, rm.copy(), rv.copy(), w, b, training=training) + r).relu().data
    np.testing.assert_allclose(fused, unfused, atol=1e-12)


def test_dropout_gradient_uses_the_same_mask():
    x = t((6, 7), 21)
    rng_state = np.random.default_rng(5)
    out = F.dropout(x, p=0.4, rng=rng_state)
    out.backward(np.ones(x.shape))
    kept = out.data != 0
    np.testing.assert_allclose(x.grad[kept], 1 / 0.6)
    assert np.all(x.grad[~kept] == 0)
    assert gradcheck(lambda a: F.dropout(a, p=0.3, rng=np.random.default_rng(7)), [x])
    np.testing.assert_array_equal(F.dropout(x, p=0.5, training=False).data, x.data)


def test_gradcheck_catches_a_wrong_gradient():
    from minidp.autograd.function import Function

    class WrongSquare(Function):
        def forward(self, a):
            self.a = a
            return a * a

        def backward(self, g):
            return (g * self.a,)  # missing the factor 2

    with pytest.raises(GradcheckError, match="input 0"):
        gradcheck(lambda a: WrongSquare.apply(a), [t((3,), 22)])
