"""Local optimizers and learning-rate schedules (no MPI here: strategies wrap these)."""

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
from minidp.optim.sgd import LARS, OPTIMIZERS, SGD, make_optimizer, trust_ratio

__all__ = ["OPTIMIZERS", "SCHEDULES", "ConstantLR", "CosineLR", "LARS", "LRScheduler",
           "Optimizer", "PolynomialLR", "SGD", "Schedule", "StepLR", "WarmupLR",
           "make_optimizer", "make_schedule", "trust_ratio"]
