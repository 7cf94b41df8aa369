"""Initialisers with PyTorch's defaults, drawn from one seedable generator.

PyTorch initialises ``Linear`` and ``Conv2d`` weights with
``kaiming_uniform_(a=sqrt(5))``, which is ``U(-1/sqrt(fan_in), 1/sqrt(fan_in))``, and
their biases with the same bound. In data-parallel training only rank 0's draw
matters: the strategies broadcast rank 0's parameters to every rank.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minidp import backend

_rng = {"generator": np.random.default_rng(0)}


def manual_seed(seed: int) -> None:
    """Seed the generator used by every initialiser (and Dropout layers created after)."""
    _rng["generator"] = np.random.default_rng(seed)


def generator() -> np.random.Generator:
    """The generator used by initialisers."""
    return _rng["generator"]


def uniform(shape: tuple, bound: float, dtype: Any = np.float32) -> Any:
    """U(-bound, bound) of ``shape`` on the selected backend (drawn on the host)."""
    values = generator().uniform(-bound, bound, size=shape).astype(dtype)
    return backend.to_device(values)


def fan_in_bound(fan_in: int) -> float:
    """PyTorch's bound 1/sqrt(fan_in) for default weights and biases (0 for fan_in 0)."""
    return 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
