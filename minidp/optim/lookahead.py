"""Nesterov momentum in look-ahead form: the update of EAMSGD's workers (``measgd-async``).

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015,
Algorithm 2: the gradient is taken at the look-ahead point x + delta v, not at the
iterate x (Sutskever et al.'s form of Nesterov's momentum)::

    v <- delta v - lr (g(x + delta v) + wd (x + delta v));    x <- x + v

The model holds the look-ahead point y = x + delta v while forward and backward run,
so the step splits in two, around them::

    look_ahead(keep):  keep <- x;   v <- delta v;   model <- x + v        (model = y)
    (forward, backward at y: g)
    step():            s = lr (g + wd y);   model <- y - s;   v <- v - s
                       (model = x + delta v_old - s = x + v_new: the new iterate)

The rate and the weight decay are the wrapped :class:`~minidp.optim.sgd.SGD`'s (their
one owner, set by the scheduler as for any worker) and v is its momentum state, so a
checkpoint keeps v as it keeps any momentum; its own ``momentum`` is not used (delta
is). The elastic pull the strategy adds after :meth:`LookAhead.step` is EAMSGD's, not
this file's (:mod:`minidp.strategies.measgd_async`).
"""

from __future__ import annotations

import numpy as np

from minidp.optim.optimizer import check_range
from minidp.optim.sgd import SGD


class LookAhead:
    """EAMSGD's worker momentum over an :class:`SGD` of a model's flat buffers.

    Args:
        optimizer: the SGD whose rate, weight decay and state (v, zero at the start)
            this uses; built on ``model.parameters()``.
        delta: the momentum in [0, 1).
    """

    def __init__(self, optimizer: SGD, delta: float) -> None:
        if not isinstance(optimizer, SGD) or optimizer.flat is None:
            raise ValueError("LookAhead: needs an SGD built on a model's flat parameters "
                             f"(model.parameters()), got {type(optimizer).__name__}")
        self.optimizer = optimizer
        self.delta = check_range("delta", delta, 0.0, 1.0)
        self.scaled = np.empty_like(optimizer.flat.data)  # s = lr (g + wd y), reused

    @property
    def velocity(self) -> np.ndarray:
        """v, the SGD's momentum state."""
        return self.optimizer.state

    def look_ahead(self, keep: np.ndarray) -> None:
        """Before forward: ``keep`` <- x, then v <- delta v and the model <- x + v."""
        x, v = self.optimizer.flat.data, self.optimizer.state
        np.copyto(keep, x)
        v *= self.delta
        x += v

    def step(self) -> None:
        """After backward at y: s = lr (g + wd y); the model <- y - s and v <- v - s."""
        opt, s = self.optimizer, self.scaled
        y, g, v = opt.flat.data, opt.flat.grad, opt.state
        if opt.weight_decay:
            np.multiply(y, opt.weight_decay, out=s)
            s += g
            s *= opt.lr
        else:
            np.multiply(g, opt.lr, out=s)
        y -= s
        v -= s
        opt.step_count += 1
