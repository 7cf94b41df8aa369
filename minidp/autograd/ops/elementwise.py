"""Elementwise ops: arithmetic with broadcasting, pow, exp, log, relu, sigmoid, tanh.

Binary ops accept Tensors, raw arrays and Python scalars on either side; the
gradient of an input that was broadcast is summed back to its shape
(:func:`minidp.autograd.function.unbroadcast`). Python scalars keep the tensor's dtype
(NumPy 2 promotion), so float32 stays float32.
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function, unbroadcast
from minidp.backend import array_module
from minidp.kernels import relu_backward, relu_forward


def _shape(a: Any) -> tuple:
    return getattr(a, "shape", ())


class Add(Function):
    """a + b."""

    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = _shape(a), _shape(b)
        return a + b

    def backward(self, g: Any) -> tuple:
        return unbroadcast(g, self.shapes[0]), unbroadcast(g, self.shapes[1])


class Sub(Function):
    """a - b."""

    def forward(self, a: Any, b: Any) -> Any:
        self.shapes = _shape(a), _shape(b)
        return a - b

    def backward(self, g: Any) -> tuple:
        return unbroadcast(g, self.shapes[0]), unbroadcast(-g, self.shapes[1])


class Mul(Function):
    """a * b."""

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a * b

    def backward(self, g: Any) -> tuple:
        ga = unbroadcast(g * self.b, _shape(self.a)) if self.wants(0) else None
        gb = unbroadcast(g * self.a, _shape(self.b)) if self.wants(1) else None
        return ga, gb


class Div(Function):
    """a / b."""

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        return a / b

    def backward(self, g: Any) -> tuple:
        ga = unbroadcast(g / self.b, _shape(self.a)) if self.wants(0) else None
        gb = (unbroadcast(-g * self.a / (self.b * self.b), _shape(self.b))
              if self.wants(1) else None)
        return ga, gb


class Neg(Function):
    """-a."""

    def forward(self, a: Any) -> Any:
        return -a

    def backward(self, g: Any) -> tuple:
        return (-g,)


class Pow(Function):
    """a ** b, with a gradient for the base and, when it is a tensor, the exponent."""

    def forward(self, a: Any, b: Any) -> Any:
        self.a, self.b = a, b
        self.out = a ** b
        return self.out

    def backward(self, g: Any) -> tuple:
        xp = array_module(self.a, self.b)
        ga = gb = None
        if self.wants(0):
            ga = unbroadcast(g * self.b * self.a ** (self.b - 1), _shape(self.a))
        if self.wants(1):
            gb = unbroadcast(g * self.out * xp.log(self.a), _shape(self.b))
        return ga, gb


class Exp(Function):
    """e ** a."""

    def forward(self, a: Any) -> Any:
        self.out = array_module(a).exp(a)
        return self.out

    def backward(self, g: Any) -> tuple:
        return (g * self.out,)


class Log(Function):
    """Natural logarithm."""

    def forward(self, a: Any) -> Any:
        self.a = a
        return array_module(a).log(a)

    def backward(self, g: Any) -> tuple:
        return (g / self.a,)


class ReLU(Function):
    """max(a, 0), forward and backward through the Numba kernels (on the rank's threads)."""

    def forward(self, a: Any) -> Any:
        self.a = a
        return relu_forward(a)

    def backward(self, g: Any) -> tuple:
        return (relu_backward(g, self.a),)


class Sigmoid(Function):
    """1 / (1 + e**-a), computed without overflow for large |a|."""

    def forward(self, a: Any) -> Any:
        xp = array_module(a)
        e = xp.exp(-xp.abs(a))
        self.out = xp.where(a >= 0, 1 / (1 + e), e / (1 + e))
        return self.out

    def backward(self, g: Any) -> tuple:
        return (g * self.out * (1 - self.out),)


class Tanh(Function):
    """Hyperbolic tangent."""

    def forward(self, a: Any) -> Any:
        self.out = array_module(a).tanh(a)
        return self.out

    def backward(self, g: Any) -> tuple:
        return (g * (1 - self.out * self.out),)
