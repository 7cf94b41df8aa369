"""Test helpers: gradient checking by central differences (use float64 inputs)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from minidp.autograd.tensor import Tensor
from minidp.backend import array_module


class GradcheckError(AssertionError):
    """An analytic gradient disagrees with its central-difference estimate."""


def numerical_grad(f: Callable[[], float], x: Any, eps: float) -> Any:
    """Central-difference gradient of the scalar ``f()`` with respect to array ``x``."""
    xp = array_module(x)
    grad = xp.zeros_like(x)
    flat, gflat = x.reshape(-1), grad.reshape(-1)
    for i in range(flat.size):
        orig = flat[i].item()
        flat[i] = orig + eps
        up = f()
        flat[i] = orig - eps
        down = f()
        flat[i] = orig
        gflat[i] = (up - down) / (2 * eps)
    return grad


def gradcheck(fn: Callable[..., Tensor], inputs: Sequence[Tensor], eps: float = 1e-6,
              atol: float = 1e-6, rtol: float = 1e-5, seed: int = 0) -> bool:
    """Compare backward() of ``fn(*inputs)`` with central differences.

    The output is contracted with fixed random weights, so every output element and
    every input element is checked, not only the gradient of a sum.

    Args:
        fn: maps the input Tensors to one output Tensor.
        inputs: float64 Tensors; those with ``requires_grad`` are checked.
        eps: finite-difference step.
        atol: absolute tolerance.
        rtol: relative tolerance.
        seed: seed of the contraction weights.

    Returns:
        True when every gradient matches.

    Raises:
        GradcheckError: naming the input, the worst element and both values.
    """
    for i, t in enumerate(inputs):
        if t.requires_grad and t.dtype != np.float64:
            raise ValueError(f"gradcheck: input {i} has dtype {t.dtype}; use float64")
    out = fn(*inputs)
    xp = array_module(out.data)
    weights = xp.asarray(np.random.default_rng(seed).standard_normal(out.shape))
    for t in inputs:
        t.grad = None
    (out * weights).sum().backward()

    def objective() -> float:
        return float((fn(*inputs).data * weights).sum())

    for i, t in enumerate(inputs):
        if not t.requires_grad:
            continue
        expected = numerical_grad(objective, t.data, eps)
        got = t.grad if t.grad is not None else xp.zeros_like(t.data)
        err = xp.abs(got - expected) - (atol + rtol * xp.abs(expected))
        if err.size and float(err.max()) > 0:
            at = np.unravel_index(int(err.argmax()), err.shape)
            raise GradcheckError(
                f"gradcheck: input {i} (shape {t.shape}) at index {at}: backward gives "
                f"{float(got[at]):.8g}, central differences give {float(expected[at]):.8g}")
    return True
