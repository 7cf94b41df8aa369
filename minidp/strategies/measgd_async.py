"""``measgd-async``: EAMSGD, elastic averaging with Nesterov momentum on the workers.

Zhang, Choromanska, LeCun, "Deep learning with Elastic Averaging SGD", NIPS 2015,
Algorithm 2 (asynchronous EAMSGD), which SC17 (You, Buluc, Demmel) runs as "Async
MEASGD" with the exchange overlapped as in its Async EASGD. Worker i, with moving rate
alpha, learning rate eta and momentum delta::

    x <- x^i
    if tau divides t^i:   x^i <- x^i - alpha (x - x~);   x~ <- x~ + alpha (x - x~)   (master)
    v^i <- delta v^i - eta g(x + delta v^i)
    x^i <- x^i + v^i

The elastic difference is taken at x, the iterate, never at the look-ahead point
x + delta v where the gradient is taken; the master receives x (and computes the same
difference). The authors' code (``mpiT``, ``optim-eamsgd.lua``) performs these steps in
this order. ``delta = 0`` is Algorithm 1, ``easgd-async``. The momentum's two halves
(the look-ahead before forward, the step after backward) are the optimizer's,
:class:`minidp.optim.LookAhead`; the elastic pull around them is this file's.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from minidp.optim import LookAhead
from minidp.strategies.base import Option
from minidp.strategies.easgd_async import ElasticAsync
from minidp.trace import tracer


class MomentumElasticAsync(ElasticAsync):
    """``measgd-async``: Async EASGD whose workers take Nesterov steps (EAMSGD, Algorithm 2).

    Communication as ``easgd-async``: before forward, the worker posts ``isend(x^i)``
    and ``irecv(x~)`` to the master; after backward it waits for both. One step of
    worker i, as the authors' ``optim-eamsgd.lua`` orders it (v is the paper's velocity,
    kept in the optimizer's state; x^i is kept apart while the model holds the look-ahead)::

        before forward:  x <- x^i;  v <- delta v;  model <- x + v          (the look-ahead y)
        forward, backward at y:  g = grad f(y) + wd y
        step:  d = alpha (x - x~)  (exchange steps only, from the x~ received)
               model <- y - eta g - d   (= x + v_new - d, the new x^i)
               v <- v - eta g          (= delta v_old - eta g)

    The master applies ``x~ += alpha (x - x~)`` with the x it received, unchanged from
    ``easgd-async``: momentum lives on the workers only (SC17's Async MEASGD; its
    baseline ``amsgd`` keeps momentum at the server). Between steps the model holds
    x^i, so checkpoints, the statistics and ``delta = 0`` (``easgd-async``'s update)
    see the iterate, not the look-ahead.
    """

    name = "measgd-async"
    default_rates = (0.02, 0.0)  # its momentum is measgd-async.delta, not --momentum
    ignored_hint = "its momentum is measgd-async.delta (EAMSGD's delta, on the workers)"
    options: ClassVar[dict[str, Option]] = dict(
        ElasticAsync.options,
        delta=Option(0.9, float, "a momentum in [0, 1)", lambda v: 0 <= v < 1))

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        # v is the optimizer's momentum state (zero at the start), delta its momentum
        self.momentum = LookAhead(self.optimizer, self.config["delta"])
        self.outgoing = np.empty_like(self.flat.data)  # x^i while the model holds y

    def before_compute(self) -> None:
        """Keep x^i (what the exchange sends), then move the model to x + delta v."""
        self.momentum.look_ahead(keep=self.outgoing)

    def local_update(self, centre: np.ndarray | None) -> None:
        """The pull d from x (not the look-ahead), the Nesterov step from y, then x^i - d."""
        with tracer().phase("optimizer"):
            if centre is not None:
                np.subtract(self.outgoing, centre, out=self.difference)  # d = alpha (x - x~)
                self.difference *= self.alpha
            self.momentum.step()  # model <- y - lr g = x + v_new;  v <- v - lr g
            if centre is not None:
                self.flat.data -= self.difference  # x^i <- x + v_new - d
                self.exchanges += 1
