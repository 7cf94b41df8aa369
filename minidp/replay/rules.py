"""The update rules of the asynchronous and elastic papers: the replay's oracle.

Written from the papers' equations, apart from :mod:`minidp.strategies` (this package
never imports it, nor :mod:`minidp.run`, which does): a strategy that drifts from its
paper makes its runs differ from their replay. Each function updates its arrays in
place and returns what ``--explain`` prints. Symbols: w or x parameters, g a gradient
(the mean over its batch), lr the learning rate, wd the weight decay, sigma a
staleness (updates since the parameters the gradient was taken at).

Precision. Every rule is evaluated in the order written here, in the run's dtype, with
one exception, :func:`sgd`: the step ``w <- w - lr d`` (and its momentum) is evaluated
in float64 from the stored values and stored back in the run's dtype, as minidp's fused
SGD kernel does. In a float64 run that is exactly the operations written; in a float32
run it is the same rounding as the kernel's.
"""

from __future__ import annotations

import numpy as np


def sgd(w: np.ndarray, g: np.ndarray, lr: float, momentum: float = 0.0,
        weight_decay: float = 0.0, nesterov: bool = False, buf: np.ndarray | None = None) -> None:
    """SGD on ``w`` in place, in PyTorch's convention (dampening 0).

    ::

        d = g + wd w;   buf <- m buf + d;   w <- w - lr (d + m buf  if nesterov else  buf)

    With m = 0 it is ``w <- w - lr (g + wd w)`` and ``buf`` (the momentum) is not needed.
    """
    wide = w.astype(np.float64)
    d = g.astype(np.float64) + weight_decay * wide
    if momentum:
        if buf is None:
            raise ValueError("sgd: momentum needs its buffer (buf)")
        b = momentum * buf.astype(np.float64) + d
        buf[...] = b
        d = d + momentum * b if nesterov else b
    w[...] = wide - lr * d


def per_gradient_staleness(grads: list[np.ndarray], sigmas: list[int]) -> np.ndarray:
    """Zhang, Gupta, Lian, Liu (IJCAI 2016): each gradient at its own staleness-aware rate.

    alpha(sigma) = alpha0 / sigma, the full rate alpha0 for a fresh gradient, so the
    update is ``w <- w - alpha0 (1/c) sum_l g_l / max(sigma_l, 1)``; returned here is the
    direction ``(1/c) sum_l g_l / max(sigma_l, 1)``, summed in arrival order.
    """
    total = np.zeros_like(grads[0])
    for g, sigma in zip(grads, sigmas):
        total += g / max(sigma, 1)
    return total / len(grads)


def mean_staleness_rate(lr: float, sigmas: list[int]) -> float:
    """Gupta, Zhang, Wang (ICDM 2016): the rate divided by the update's mean staleness.

    ``w <- w - (alpha0 / <sigma>) (1/c) sum_l g_l`` with ``<sigma>`` the mean staleness of
    the c gradients; a mean below 1 (mostly fresh gradients) keeps alpha0, so that the
    rate is never raised above it.
    """
    return lr / max(sum(sigmas) / len(sigmas), 1.0)


def mean(grads: list[np.ndarray]) -> np.ndarray:
    """``(1/c) sum_l g_l``, summed in arrival order."""
    total = np.zeros_like(grads[0])
    for g in grads:
        total += g
    return total / len(grads)


def sample_weight(g: np.ndarray, samples: int, base: int) -> np.ndarray:
    """DBS (reconstructed, docs/dbs.md), each gradient at once: ``(b_i / b) g_i``.

    g_i is the mean over b_i samples and b the fixed batch: weighted so, a sample counts
    the same whichever worker took it.
    """
    return g * (samples / base)


def round_mean(grads: dict[int, np.ndarray], samples: dict[int, int]) -> np.ndarray:
    """DBS's rounds: ``sum_i b_i g_i / sum_i b_i`` over one gradient of every worker.

    Summed in worker-rank order (a round's bits must not depend on who came first).
    """
    total_samples = sum(samples.values())
    total = np.zeros_like(next(iter(grads.values())))
    for worker in sorted(grads):
        total += grads[worker] * (samples[worker] / total_samples)
    return total


def elastic_difference(x: np.ndarray, centre: np.ndarray, alpha: float) -> np.ndarray:
    """EASGD's elastic pull ``d = alpha (x - x~)`` (Zhang, Choromanska, LeCun 2015, eq. 5-6).

    The worker then moves by -d and the centre by +d: equal and opposite.
    """
    return (x - centre) * alpha


def easgd_step(x: np.ndarray, g: np.ndarray, centre: np.ndarray | None, alpha: float,
               lr: float, weight_decay: float) -> np.ndarray | None:
    """Algorithm 1 (asynchronous EASGD), worker i's step; returns d (None: no exchange).

    Both terms are taken at the same x, the parameters before this step::

        if tau divides t:  d = alpha (x - x~);  x~ <- x~ + d     (the master)
        x <- x - lr (g(x) + wd x) - d
    """
    d = None if centre is None else elastic_difference(x, centre, alpha)
    sgd(x, g, lr, weight_decay=weight_decay)
    if d is not None:
        x -= d
    return d


def look_ahead(x: np.ndarray, v: np.ndarray, delta: float) -> np.ndarray:
    """EAMSGD's point for the gradient, ``x + delta v`` (``v`` becomes ``delta v`` in place).

    Algorithm 2 takes the gradient at the look-ahead and the elastic difference at x.
    """
    v *= delta
    return x + v


def eamsgd_step(x: np.ndarray, y: np.ndarray, v: np.ndarray, g: np.ndarray,
                centre: np.ndarray | None, alpha: float, lr: float,
                weight_decay: float) -> np.ndarray | None:
    """Algorithm 2 (asynchronous EAMSGD, Zhang et al. 2015), after :func:`look_ahead`.

    ``v`` holds ``delta v`` and ``y = x + delta v`` is where ``g`` was taken::

        if tau divides t:  d = alpha (x - x~);  x~ <- x~ + d     (at x, not at y)
        v <- delta v - lr (g(y) + wd y)
        x <- x + v - d     (evaluated as y - lr (g + wd y) - d)

    Returns d (None: no exchange); ``x`` and ``v`` are updated in place.
    """
    d = None if centre is None else elastic_difference(x, centre, alpha)
    step = (g + weight_decay * y if weight_decay else g) * lr
    x[...] = y - step
    v -= step
    if d is not None:
        x -= d
    return d
