"""Learning-rate schedules: functions of the step number, and a scheduler that applies them.

A schedule maps step t (0-based) to a learning rate. ``WarmupLR`` puts a linear ramp
in front of any schedule (the large-batch recipe of the LARS paper: warm-up, then
polynomial decay of power 2).
"""

from __future__ import annotations

import math

from minidp.optim.optimizer import Optimizer, check_range


def check_count(name: str, value: object, minimum: int = 1) -> int:
    """Return ``value`` if it is an int >= minimum, else raise ValueError naming it."""
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise ValueError(f"{name}: got {value!r}, allowed: an int >= {minimum}")
    return value


class Schedule:
    """Base: ``schedule(step) -> lr``; a plain schedule keeps ``base_lr``."""

    def __init__(self, base_lr: float) -> None:
        self.base_lr = check_range("base_lr", base_lr, 0.0)

    def __call__(self, step: int) -> float:
        """Learning rate at ``step``."""
        return self.base_lr


ConstantLR = Schedule


class StepLR(Schedule):
    """base_lr * gamma ** (step // step_size)."""

    def __init__(self, base_lr: float, step_size: int, gamma: float = 0.1) -> None:
        super().__init__(base_lr)
        self.step_size = check_count("step_size", step_size)
        self.gamma = check_range("gamma", gamma, 0.0)

    def __call__(self, step: int) -> float:
        """Learning rate at ``step``."""
        return self.base_lr * self.gamma ** (step // self.step_size)


class CosineLR(Schedule):
    """min_lr + (base_lr - min_lr) * (1 + cos(pi * step / total_steps)) / 2, then min_lr."""

    def __init__(self, base_lr: float, total_steps: int, min_lr: float = 0.0) -> None:
        super().__init__(base_lr)
        self.total_steps = check_count("total_steps", total_steps)
        self.min_lr = check_range("min_lr", min_lr, 0.0)

    def __call__(self, step: int) -> float:
        """Learning rate at ``step``."""
        t = min(step, self.total_steps) / self.total_steps
        return self.min_lr + (self.base_lr - self.min_lr) * (1 + math.cos(math.pi * t)) / 2


class PolynomialLR(Schedule):
    """base_lr * (1 - step/total_steps) ** power, 0 from total_steps on (LARS: power 2)."""

    def __init__(self, base_lr: float, total_steps: int, power: float = 2.0) -> None:
        super().__init__(base_lr)
        self.total_steps = check_count("total_steps", total_steps)
        self.power = check_range("power", power, 0.0)

    def __call__(self, step: int) -> float:
        """Learning rate at ``step``."""
        return self.base_lr * (1 - min(step, self.total_steps) / self.total_steps) ** self.power


class WarmupLR(Schedule):
    """Linear ramp from start_factor*lr to the wrapped schedule over warmup_steps."""

    def __init__(self, schedule: Schedule, warmup_steps: int, start_factor: float = 0.0) -> None:
        super().__init__(schedule.base_lr)
        self.schedule = schedule
        self.warmup_steps = check_count("warmup_steps", warmup_steps, minimum=0)
        self.start_factor = check_range("start_factor", start_factor, 0.0, 1.0, True)

    def __call__(self, step: int) -> float:
        """Learning rate at ``step``."""
        if step >= self.warmup_steps:
            return self.schedule(step)
        frac = self.start_factor + (1 - self.start_factor) * step / self.warmup_steps
        return self.schedule(step) * frac


class LRScheduler:
    """Sets ``optimizer.lr = schedule(t)``; call :meth:`step` once per optimizer step."""

    def __init__(self, optimizer: Optimizer, schedule: Schedule) -> None:
        self.optimizer, self.schedule, self.last_step = optimizer, schedule, 0
        optimizer.lr = schedule(0)

    def step(self) -> float:
        """Advance one step and return the new learning rate."""
        self.last_step += 1
        self.optimizer.lr = self.schedule(self.last_step)
        return self.optimizer.lr


SCHEDULES = ("constant", "cosine", "step", "poly")


def make_schedule(kind: str, lr: float, total_steps: int, warmup_steps: int = 0) -> Schedule:
    """The schedule ``kind`` (:data:`SCHEDULES`) over ``total_steps``, after a linear warm-up.

    ``step`` divides the rate by 10 at each third of the run; ``poly`` is LARS's power 2.
    """
    schedule = {"constant": lambda: Schedule(lr),
                "cosine": lambda: CosineLR(lr, total_steps),
                "step": lambda: StepLR(lr, max(1, total_steps // 3)),
                "poly": lambda: PolynomialLR(lr, total_steps)}[kind]()
    return WarmupLR(schedule, warmup_steps) if warmup_steps else schedule

