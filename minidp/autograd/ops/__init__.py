"""Differentiable ops on Tensors: thin wrappers that apply the Function classes."""

from __future__ import annotations

from typing import Any

from minidp.autograd.ops.conv import Conv2d
from minidp.autograd.ops.elementwise import (
    Add,
    Div,
    Exp,
    Log,
    Mul,
    Neg,
    Pow,
    ReLU,
    Sigmoid,
    Sub,
    Tanh,
)
from minidp.autograd.ops.linalg import Linear, Matmul
from minidp.autograd.ops.loss import CrossEntropy, LogSoftmax, MSELoss, Softmax
from minidp.autograd.ops.norm import BatchNorm, Dropout
from minidp.autograd.ops.pool import AvgPool2d, MaxPool2d
from minidp.autograd.ops.reduction import Max, Mean, Sum
from minidp.autograd.ops.shape import Flatten, GetItem, Reshape, Transpose


def _raw(value: Any) -> Any:
    from minidp.autograd.tensor import Tensor

    return value.data if isinstance(value, Tensor) else value


def add(a: Any, b: Any) -> Any:
    """A + b with broadcasting."""
    return Add.apply(a, b)


def sub(a: Any, b: Any) -> Any:
    """A - b with broadcasting."""
    return Sub.apply(a, b)


def mul(a: Any, b: Any) -> Any:
    """A * b with broadcasting."""
    return Mul.apply(a, b)


def div(a: Any, b: Any) -> Any:
    """A / b with broadcasting."""
    return Div.apply(a, b)


def neg(a: Any) -> Any:
    """-a."""
    return Neg.apply(a)


def pow(a: Any, b: Any) -> Any:
    """A ** b with broadcasting."""
    return Pow.apply(a, b)


def exp(a: Any) -> Any:
    """Elementwise e**a."""
    return Exp.apply(a)


def log(a: Any) -> Any:
    """Elementwise natural logarithm."""
    return Log.apply(a)


def relu(a: Any) -> Any:
    """max(a, 0)."""
    return ReLU.apply(a)


def sigmoid(a: Any) -> Any:
    """Logistic function."""
    return Sigmoid.apply(a)


def tanh(a: Any) -> Any:
    """Hyperbolic tangent."""
    return Tanh.apply(a)


def sum(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Sum over axes."""
    return Sum.apply(a, axis=axis, keepdims=keepdims)


def mean(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Mean over axes."""
    return Mean.apply(a, axis=axis, keepdims=keepdims)


def max(a: Any, axis: Any = None, keepdims: bool = False) -> Any:
    """Maximum over axes."""
    return Max.apply(a, axis=axis, keepdims=keepdims)


def matmul(a: Any, b: Any) -> Any:
    """Matrix product with NumPy's broadcasting rules."""
    return Matmul.apply(a, b)


def linear(x: Any, w: Any, b: Any = None) -> Any:
    """X @ w.T + b (PyTorch's layout, w of shape (out, in))."""
    return Linear.apply(x, w, b) if b is not None else Linear.apply(x, w)


def reshape(a: Any, shape: tuple) -> Any:
    """Same data, new shape."""
    return Reshape.apply(a, shape=tuple(shape))


def transpose(a: Any, axes: Any = None) -> Any:
    """Permute axes (reverse when None)."""
    return Transpose.apply(a, axes=axes)


def flatten(a: Any, start_dim: int = 1) -> Any:
    """Merge axes from start_dim on."""
    return Flatten.apply(a, start_dim=start_dim)


def getitem(a: Any, index: Any) -> Any:
    """a[index]; Tensors inside the index are used through their data."""
    if isinstance(index, tuple):
        index = tuple(_raw(i) for i in index)
    else:
        index = _raw(index)
    return GetItem.apply(a, index=index)


def softmax(x: Any, axis: int = -1) -> Any:
    """Softmax along axis."""
    return Softmax.apply(x, axis=axis)


def log_softmax(x: Any, axis: int = -1) -> Any:
    """Log-softmax along axis."""
    return LogSoftmax.apply(x, axis=axis)


def cross_entropy(logits: Any, labels: Any, reduction: str = "mean") -> Any:
    """Fused, numerically stable softmax cross-entropy with integer labels."""
    return CrossEntropy.apply(logits, _raw(labels), reduction=reduction)


def mse_loss(pred: Any, target: Any, reduction: str = "mean") -> Any:
    """Mean squared error."""
    return MSELoss.apply(pred, target, reduction=reduction)


def conv2d(x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0) -> Any:
    """2-D convolution (cross-correlation), PyTorch's weight layout."""
    if b is None:
        return Conv2d.apply(x, w, stride=stride, padding=padding)
    return Conv2d.apply(x, w, b, stride=stride, padding=padding)


def max_pool2d(x: Any, kernel_size: Any, stride: Any = None) -> Any:
    """Max pooling; stride defaults to kernel_size."""
    return MaxPool2d.apply(x, kernel_size=kernel_size, stride=stride)


def avg_pool2d(x: Any, kernel_size: Any, stride: Any = None) -> Any:
    """Average pooling; stride defaults to kernel_size."""
    return AvgPool2d.apply(x, kernel_size=kernel_size, stride=stride)


def batch_norm(x: Any, running_mean: Any = None, running_var: Any = None, weight: Any = None,
               bias: Any = None, training: bool = True, momentum: float = 0.1,
               eps: float = 1e-5) -> Any:
    """Batch normalisation over all axes but 1 (PyTorch's argument order)."""
    return BatchNorm.apply(x, weight, bias, running_mean=_raw(running_mean),
                           running_var=_raw(running_var), training=training,
                           momentum=momentum, eps=eps)


def batch_norm_relu(x: Any, running_mean: Any = None, running_var: Any = None,
                    weight: Any = None, bias: Any = None, residual: Any = None,
                    training: bool = True, momentum: float = 0.1, eps: float = 1e-5) -> Any:
    """``relu(batch_norm(x) + residual)`` as one fused op (a ResNet's BN, add and relu)."""
    return BatchNorm.apply(x, weight, bias, residual, running_mean=_raw(running_mean),
                           running_var=_raw(running_var), training=training,
                           momentum=momentum, eps=eps, relu=True)


def dropout(x: Any, p: float = 0.5, training: bool = True, rng: Any = None) -> Any:
    """Inverted dropout: zero with probability p, scale survivors by 1/(1-p)."""
    return Dropout.apply(x, p=p, training=training, rng=rng)
