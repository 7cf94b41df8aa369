"""Optimizer base: argument checks, the learning rate, the flat fast path, state_dict.

When the parameters are exactly a model's flat buffers (the default for minidp
models), an optimizer updates them with one fused pass over the flat arrays; other
parameter lists are updated one tensor at a time. State (momentum buffers) lives
in one flat array either way, so it can be saved, restored and averaged whole.

The optimizer owns the learning rate: ``lr`` is checked once, here, when the optimizer is
built; a schedule sets it from then on (an :class:`~minidp.optim.schedules.LRScheduler`,
or a parameter server's own clock), and every update reads it from here: no strategy
holds a rate of its own.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable
from typing import Any

import numpy as np

from minidp import backend
from minidp.layers.flat import FlatParameters, Parameter


def check_range(name: str, value: Any, low: float, high: float | None = None,
                high_inclusive: bool = False) -> float:
    """Return ``value`` as float if low <= value (< or <=) high, else raise ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.floating)):
        raise TypeError(f"{name}: got {value!r}, expected a number")
    value = float(value)
    ok = value >= low and (high is None or value < high or (high_inclusive and value == high))
    if not ok or not np.isfinite(value):
        bracket = "]" if high_inclusive else ")"
        allowed = f">= {low}" if high is None else f"in [{low}, {high}{bracket}"
        raise ValueError(f"{name}: got {value}, allowed: {allowed}")
    return value


class Optimizer(abc.ABC):
    """Holds parameters, learning rate and flat state; subclasses define ``_update``."""

    def __init__(self, params: Iterable[Parameter], lr: float) -> None:
        self.params = list(params)
        if not self.params:
            raise ValueError("params: got an empty list, an optimizer needs parameters")
        for i, p in enumerate(self.params):
            if not isinstance(p, Parameter):
                raise TypeError(f"params: item {i} is a {type(p).__name__}, not a Parameter")
        self.lr = check_range("lr", lr, 0.0)
        self.step_count = 0
        self.flat = self._find_flat()
        sizes = [p.data.size for p in self.params]
        xp = backend.array_module(self.params[0].data)
        self._bind_state(xp.zeros(sum(sizes), dtype=self.params[0].data.dtype))

    def _find_flat(self) -> FlatParameters | None:
        flat = self.params[0].flat_owner
        return flat if flat is not None and flat.intact(self.params) else None

    def rebind_state(self, buffer: Any) -> None:
        """Let the flat state live in ``buffer`` from now on: its values are the state's.

        Nothing is copied (the caller fills it first, or it holds the state already): DASO
        moves an identical node's momentum into one node window, where every rank updates
        its slice (:meth:`SGD.update` of a part), and back when the node's momenta part.
        """
        if buffer.shape != self.state.shape or buffer.dtype != self.state.dtype:
            raise ValueError(f"rebind_state: buffer has shape {buffer.shape} and dtype "
                             f"{buffer.dtype}, expected {self.state.shape} and "
                             f"{self.state.dtype}")
        self._bind_state(buffer)

    def _bind_state(self, buffer: Any) -> None:
        self.state = buffer
        bounds = np.cumsum([0] + [p.data.size for p in self.params])
        self.state_views = [buffer[a:b].reshape(p.data.shape)
                            for a, b, p in zip(bounds[:-1], bounds[1:], self.params)]

    def step(self) -> None:
        """Apply one update from the current gradients."""
        self._check_intact()
        self._update()
        self.step_count += 1

    def _check_intact(self) -> None:
        if self.flat is not None and not self.flat.intact(self.params):
            raise RuntimeError("optimizer: the model's parameters were replaced after the "
                               "optimizer was built (e.g. by Module.to); build it afterwards")

    @abc.abstractmethod
    def _update(self) -> None:
        """Update parameters and state in place from the gradients."""

    def zero_grad(self) -> None:
        """Zero every gradient (one write on flat buffers)."""
        if self.flat is not None:
            self.flat.zero_grad()
        else:
            for p in self.params:
                p.zero_grad()

    def state_dict(self) -> dict[str, Any]:
        """Learning rate, step count and the flat state buffer (a host copy)."""
        return {"lr": self.lr, "step": self.step_count,
                "state": backend.to_host(self.state).copy()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what state_dict() returned."""
        saved = np.asarray(state["state"])
        if saved.shape != self.state.shape:
            raise ValueError(f"load_state_dict: optimizer state has shape {saved.shape}, "
                             f"this optimizer's has {self.state.shape}")
        self.lr, self.step_count = float(state["lr"]), int(state["step"])
        self.state[...] = backend.like(saved.astype(self.state.dtype, copy=False), self.state)
