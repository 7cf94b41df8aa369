"""Stochastic gradient descent with PyTorch's conventions: every strategy's update.

SGD (PyTorch's ``torch.optim.SGD`` with dampening 0)::

    d = g + wd*w;   buf = m*buf + d;   w -= lr * (d + m*buf  if nesterov else  buf)

Every strategy updates through this optimizer: a synchronous replica steps its whole
model from its (averaged) gradients (:meth:`SGD.step`); the others step a part of it or
another array with a gradient they hold, and may leave the momentum out, as their
papers do (:meth:`SGD.update`):

==================================  ===================================================
caller                              call
==================================  ===================================================
``sync``, ``hsgd``, ``hbsgd``,      ``step()``: the model from ``flat.grad``
``daso``
``daso``'s node replica             ``update(grad_slice, part)``: rank j's slice of the
                                    node's one copy (``out=``: into the send window)
a parameter server (``asgd`` ...)   ``update(gradient, shard, momentum=...,
                                    lr_divisor=...)``: its shard, from a worker's push
the elastic workers (``easgd-*``)   ``update(momentum=False)``: plain SGD
``hogwild``                         ``update(params=node_copy, momentum=False)``: the
                                    node's shared parameters, without a lock
==================================  ===================================================

LARS, the other optimizer, is in :mod:`minidp.optim.lars`; the look-ahead momentum of
``measgd-async``'s workers in :mod:`minidp.optim.lookahead`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from minidp._moved import moved_names
from minidp.kernels import sgd_update
from minidp.layers.flat import Parameter
from minidp.optim.optimizer import Optimizer, check_range


class SGD(Optimizer):
    """SGD with optional momentum, Nesterov momentum and L2 weight decay.

    Args:
        params: parameters to optimise (a model's flat buffers take the fused path).
        lr: learning rate, >= 0.
        momentum: heavy-ball coefficient in [0, 1).
        nesterov: Nesterov's variant (needs momentum > 0).
        weight_decay: L2 coefficient, >= 0.
    """

    def __init__(self, params: Iterable[Parameter], lr: float, momentum: float = 0.0,
                 nesterov: bool = False, weight_decay: float = 0.0) -> None:
        super().__init__(params, lr)
        self.momentum = check_range("momentum", momentum, 0.0, 1.0)
        self.weight_decay = check_range("weight_decay", weight_decay, 0.0)
        if nesterov and self.momentum == 0:
            raise ValueError("nesterov: got True with momentum 0; Nesterov needs momentum > 0")
        self.nesterov = bool(nesterov)

    def step(self) -> None:
        """One step of every parameter from its gradient (the module docstring's rule).

        A model's flat buffers take one fused pass; other parameter lists are stepped
        tensor by tensor (:meth:`_update`).
        """
        if self.flat is None:
            super().step()
            return
        self._check_intact()
        sgd_update(self.flat.data, self.flat.grad, self.state, self.lr, self.momentum,
                   self.weight_decay, self.nesterov)
        self.step_count += 1

    def update(self, grad: Any = None, part: slice | None = None, *, params: Any = None,
               out: Any = None, momentum: bool = True, lr_divisor: float = 1.0) -> None:
        """One SGD step of a part of the model, or of another array, as a strategy asks.

        Needs the model's flat buffers. With no arguments it is :meth:`step`.

        Args:
            grad: the gradient of ``part`` (None: the model's own, ``flat.grad[part]``).
            part: the slice of the flat parameters and momentum to step (None: all).
            params: the array stepped instead of the flat parameters' ``part``
                (``hogwild``: the node's shared copy).
            out: where the stepped part goes instead; the parameters are left as they
                are, the momentum is advanced all the same (a blocking DASO send, whose
                average overwrites the parameters). The bits of a copy stepped in place.
            momentum: False: plain SGD on this call (no momentum, no Nesterov), as the
                asynchronous and elastic papers' workers and servers apply.
            lr_divisor: this step's rate is ``lr / lr_divisor`` (``softsync``'s staleness).

        Every call is one counted step (DASO's replica: one call per rank and step).
        """
        if self.flat is None or not self.flat.intact(self.params):
            self._check_intact()
            raise RuntimeError("SGD.update: needs the model's flat parameters (build the "
                               "optimizer on model.parameters())")
        every = slice(None) if part is None else part
        m = self.momentum if momentum else 0.0
        sgd_update(self.flat.data[every] if params is None else params,
                   self.flat.grad[every] if grad is None else grad, self.state[every],
                   self.lr / lr_divisor, m, self.weight_decay, self.nesterov and momentum,
                   out=out)
        self.step_count += 1

    def _update(self) -> None:
        """The parameters one tensor at a time (not a model's flat buffers)."""
        for p, buf in zip(self.params, self.state_views):
            if p.grad is not None:
                sgd_update(p.data, p.grad, buf, self.lr, self.momentum, self.weight_decay,
                           self.nesterov)


# LARS and the factory had their home here until they moved (issue 38).
__getattr__ = moved_names(__name__, {"LARS": "minidp.optim.lars",
                                     "trust_ratio": "minidp.optim.lars",
                                     "make_optimizer": "minidp.optim",
                                     "OPTIMIZERS": "minidp.optim"})
