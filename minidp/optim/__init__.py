"""Local optimizers and learning-rate schedules (no MPI here: strategies wrap these)."""

from minidp.optim.optimizer import Optimizer
from minidp.optim.schedules import (
           ConstantLR,
           CosineLR,
           LRScheduler,
           PolynomialLR,
           Schedule,
           StepLR,
           WarmupLR,
)
from minidp.optim.sgd import LARS, SGD, trust_ratio

__all__ = ["ConstantLR", "CosineLR", "LARS", "LRScheduler", "Optimizer", "PolynomialLR",
           "SGD", "Schedule", "StepLR", "WarmupLR", "trust_ratio"]
