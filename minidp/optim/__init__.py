"""Local optimizers and learning-rate schedules (no MPI here: strategies wrap these).

``sgd.py``: SGD, the update every strategy steps through (``step``: the whole model;
``update``: a part of it, a server's shard, another array; the rate is the optimizer's
own). ``lars.py``: LARS, the trust
ratio per parameter tensor. ``lookahead.py``: the look-ahead momentum of EAMSGD's
workers. ``schedules.py``: the rate as a function of the step. ``make_optimizer``
builds the one ``--optimizer`` names.
"""

from __future__ import annotations

from collections.abc import Iterable

from minidp.layers.flat import Parameter
from minidp.optim.lars import LARS, trust_ratio
from minidp.optim.lookahead import LookAhead
from minidp.optim.optimizer import Optimizer
from minidp.optim.schedules import (
    SCHEDULES,
    ConstantLR,
    CosineLR,
    LRScheduler,
    PolynomialLR,
    Schedule,
    StepLR,
    WarmupLR,
    make_schedule,
)
from minidp.optim.sgd import SGD

OPTIMIZERS = ("sgd", "lars")


def make_optimizer(kind: str, params: Iterable[Parameter], lr: float, momentum: float = 0.0,
                   nesterov: bool = False, weight_decay: float = 0.0,
                   trust_coefficient: float = 0.001) -> SGD | LARS:
    """The local optimizer ``kind`` (:data:`OPTIMIZERS`); LARS has no Nesterov form."""
    if kind == "lars":
        return LARS(params, lr=lr, momentum=momentum, weight_decay=weight_decay,
                    trust_coefficient=trust_coefficient)
    return SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)


__all__ = ["OPTIMIZERS", "SCHEDULES", "ConstantLR", "CosineLR", "LARS", "LRScheduler",
           "LookAhead", "Optimizer", "PolynomialLR", "SGD", "Schedule", "StepLR", "WarmupLR",
           "make_optimizer", "make_schedule", "trust_ratio"]
