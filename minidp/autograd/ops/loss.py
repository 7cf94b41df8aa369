"""Softmax, log-softmax and the losses: fused cross-entropy (integer labels) and MSE.

``cross_entropy`` never forms ``log(softmax(x))``: it computes
``logsumexp(x) - x[label]`` with the row maximum subtracted, and its gradient is
``softmax(x) - onehot(label)``, scaled by the reduction. Labels are checked
(integer dtype, shape, range), because a float or out-of-range label would
otherwise index silently.
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function
from minidp.backend import array_module

REDUCTIONS = ("mean", "sum")


def _log_softmax(x: Any, axis: int) -> Any:
    xp = array_module(x)
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - xp.log(xp.exp(shifted).sum(axis=axis, keepdims=True))


class Softmax(Function):
    """exp(x) / sum(exp(x)) along ``axis``."""

    def forward(self, x: Any, axis: int = -1) -> Any:
        self.axis = axis
        self.out = array_module(x).exp(_log_softmax(x, axis))
        return self.out

    def backward(self, g: Any) -> tuple:
        return (self.out * (g - (g * self.out).sum(axis=self.axis, keepdims=True)),)


class LogSoftmax(Function):
    """x - logsumexp(x) along ``axis``."""

    def forward(self, x: Any, axis: int = -1) -> Any:
        self.axis = axis
        out = _log_softmax(x, axis)
        self.softmax = array_module(x).exp(out)
        return out

    def backward(self, g: Any) -> tuple:
        return (g - self.softmax * g.sum(axis=self.axis, keepdims=True),)


def check_labels(logits: Any, labels: Any) -> None:
    """Raise a clear error unless labels are integers in [0, C) with one per row."""
    if logits.ndim != 2:
        raise ValueError(f"cross_entropy: logits must be (N, C), got shape {logits.shape}")
    if labels.dtype.kind not in "iu":
        raise TypeError(
            f"cross_entropy: labels must be an integer array (class indices), got dtype "
            f"{labels.dtype}")
    if labels.shape != (logits.shape[0],):
        raise ValueError(f"cross_entropy: labels shape {labels.shape} must be "
                         f"({logits.shape[0]},) to match logits {logits.shape}")
    if labels.size:
        lo, hi = int(labels.min()), int(labels.max())
        if lo < 0 or hi >= logits.shape[1]:
            raise ValueError(f"cross_entropy: labels must lie in [0, {logits.shape[1]}), "
                             f"got values from {lo} to {hi}")


class CrossEntropy(Function):
    """Mean (or summed) negative log-likelihood of integer labels under softmax(logits)."""

    def forward(self, logits: Any, labels: Any, reduction: str = "mean") -> Any:
        if reduction not in REDUCTIONS:
            raise ValueError(f"cross_entropy: reduction {reduction!r}, allowed: {REDUCTIONS}")
        check_labels(logits, labels)
        xp = array_module(logits, labels)
        logp = _log_softmax(logits, 1)
        rows = xp.arange(logits.shape[0])
        self.labels, self.rows, self.logp = labels, rows, logp
        self.scale = 1.0 / max(logits.shape[0], 1) if reduction == "mean" else 1.0
        return -logp[rows, labels].sum() * self.scale

    def backward(self, g: Any) -> tuple:
        xp = array_module(self.logp)
        grad = xp.exp(self.logp)
        grad[self.rows, self.labels] -= 1
        grad *= g * self.scale
        return grad, None


class MSELoss(Function):
    """Mean (or summed) squared error."""

    def forward(self, pred: Any, target: Any, reduction: str = "mean") -> Any:
        if reduction not in REDUCTIONS:
            raise ValueError(f"mse_loss: reduction {reduction!r}, allowed: {REDUCTIONS}")
        if pred.shape != target.shape:
            raise ValueError(f"mse_loss: prediction shape {pred.shape} differs from "
                             f"target shape {target.shape}")
        self.diff = pred - target
        self.scale = 1.0 / max(pred.size, 1) if reduction == "mean" else 1.0
        return (self.diff * self.diff).sum() * self.scale

    def backward(self, g: Any) -> tuple:
        grad = 2 * self.scale * g * self.diff
        return grad, -grad
