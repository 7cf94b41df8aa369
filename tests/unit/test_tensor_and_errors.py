"""Autograd semantics and the bad-input errors of the tensor core."""

import numpy as np
import pytest

import minidp
from minidp import Tensor, no_grad
from minidp import functional as F


def test_backward_accumulates_through_shared_subexpressions():
    x = Tensor(np.array([1.0, 2.0, 3.0]), requires_grad=True)
    y = x * x
    z = (y + y * x).sum()  # d/dx (x^2 + x^3) = 2x + 3x^2
    z.backward()
    np.testing.assert_allclose(x.grad, 2 * x.data + 3 * x.data ** 2)


def test_gradients_accumulate_across_backward_calls_and_in_place():
    x = Tensor(np.ones(3), requires_grad=True)
    (x * 2).sum().backward()
    grad_array = x.grad
    (x * 3).sum().backward()
    assert x.grad is grad_array  # accumulation keeps the array (flat-buffer views stay views)
    np.testing.assert_array_equal(x.grad, [5, 5, 5])
    x.zero_grad()
    np.testing.assert_array_equal(x.grad, 0)


def test_leaf_gradient_does_not_alias_another_leaf():
    a, b = Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(2), requires_grad=True)
    (a + b).sum().backward()
    a.grad += 1
    np.testing.assert_array_equal(b.grad, [1, 1])


def test_no_grad_builds_no_graph():
    x = Tensor(np.ones(2), requires_grad=True)
    with no_grad():
        y = x * 2
    assert not y.requires_grad and y._creator is None
    assert (x * 2).requires_grad


def test_float32_stays_float32_with_python_scalars():
    x = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    y = (x * 0.5 + 1.0) ** 2 / 3.0
    assert y.dtype == np.float32
    y.sum().backward()
    assert x.grad.dtype == np.float32
    assert Tensor([1.0, 2.0]).dtype == np.float32


def test_deep_graph_needs_no_recursion():
    x = Tensor(np.ones(1), requires_grad=True)
    y = x
    for _ in range(5000):
        y = y + 1.0
    y.sum().backward()
    assert x.grad[0] == 1.0


def test_backward_on_non_scalar_without_grad_is_a_clear_error():
    x = Tensor(np.ones((2, 3)), requires_grad=True)
    with pytest.raises(ValueError, match=r"one-element tensor.*\(2, 3\)"):
        (x * 2).backward()
    with pytest.raises(ValueError, match=r"grad has shape \(3,\), expected \(2, 3\)"):
        (x * 2).backward(np.ones(3))
    with pytest.raises(RuntimeError, match="does not require grad"):
        Tensor(np.ones(1)).backward()


def test_matmul_shape_mismatch_names_both_shapes():
    with pytest.raises(ValueError, match=r"\(3, 4\) and \(5, 2\).*\(4\).*\(5\)"):
        Tensor(np.ones((3, 4))) @ Tensor(np.ones((5, 2)))
    with pytest.raises(ValueError, match=r"input of shape \(2, 5\).*weight of shape \(3, 4\)"):
        F.linear(Tensor(np.ones((2, 5))), Tensor(np.ones((3, 4))))


def test_conv_and_pool_shape_errors():
    x = Tensor(np.ones((2, 3, 8, 8), dtype=np.float32))
    with pytest.raises(ValueError, match=r"input has 3 channels.*\(6, 1, 5, 5\) expects 1"):
        F.conv2d(x, Tensor(np.ones((6, 1, 5, 5), dtype=np.float32)))
    with pytest.raises(ValueError, match=r"must be \(N, C, H, W\), got shape \(8, 8\)"):
        F.conv2d(Tensor(np.ones((8, 8))), Tensor(np.ones((1, 1, 3, 3))))
    with pytest.raises(ValueError, match="stride must be >= 1, got 0"):
        F.conv2d(x, Tensor(np.ones((4, 3, 3, 3), dtype=np.float32)), stride=0)
    with pytest.raises(ValueError, match="kernel_size 9 is larger"):
        F.max_pool2d(x, 9)
    with pytest.raises(ValueError, match="kernel_size must be a positive int, got 0"):
        F.avg_pool2d(x, 0)


def test_cross_entropy_label_errors():
    logits = Tensor(np.zeros((3, 4)))
    with pytest.raises(TypeError, match="labels must be an integer array.*float64"):
        F.cross_entropy(logits, np.array([0.0, 1.0, 2.0]))
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 4\), got values from 0 to 4"):
        F.cross_entropy(logits, np.array([0, 1, 4]))
    with pytest.raises(ValueError, match=r"got values from -1"):
        F.cross_entropy(logits, np.array([0, -1, 2]))
    with pytest.raises(ValueError, match=r"labels shape \(2,\) must be \(3,\)"):
        F.cross_entropy(logits, np.array([0, 1]))


def test_other_argument_errors():
    with pytest.raises(ValueError, match=r"dropout: p must be in \[0, 1\), got 1.5"):
        F.dropout(Tensor(np.ones(3)), p=1.5)
    with pytest.raises(ValueError, match="reduction 'avg'"):
        F.mse_loss(Tensor(np.ones(2)), Tensor(np.ones(2)), reduction="avg")
    with pytest.raises(ValueError, match=r"cannot reshape.*\(2, 3\).*\(4,\)"):
        Tensor(np.ones((2, 3))).reshape(4)
    with pytest.raises(ValueError, match="axis 3 is out of range"):
        Tensor(np.ones((2, 3))).sum(axis=3)


class FakeCupyArray:
    """Stands in for a CuPy array: only its module name matters to the mix check."""

    __module__ = "cupy._core.core"
    dtype = np.dtype(np.float32)
    shape = (3,)


def test_mixing_numpy_and_cupy_arrays_is_a_type_error():
    from minidp.backend import array_module

    with pytest.raises(TypeError, match="mix of numpy and cupy arrays"):
        array_module(np.ones(3), FakeCupyArray())


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match=r"backend: got 'jax', allowed: 'numpy', 'cupy'"):
        minidp.set_backend("jax")
    assert minidp.get_backend() == "numpy"


def test_cupy_without_gpu_is_a_clear_runtime_error():
    try:
        import cupy  # noqa: F401
        pytest.skip("cupy is installed: the GPU tests cover this backend")
    except ImportError:
        pass
    with pytest.raises(RuntimeError, match="backend 'cupy' was requested"):
        minidp.set_backend("cupy")
    assert minidp.get_backend() == "numpy"
