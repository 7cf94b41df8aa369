"""Distributed training strategies, one file per algorithm family, chosen by name.

``get(name, model, optimizer, topology, allreduce=..., **options)`` builds one;
``names()`` lists the ids available; ``STRATEGIES[name].options`` declares each one's
options (``--set name.option=value``).
"""

from __future__ import annotations

from typing import Any

from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso import DASO
from minidp.strategies.daso_schedule import DASOSchedule
from minidp.strategies.hbsgd import HierarchicalBulkSGD
from minidp.strategies.hsgd import HierarchicalSGD
from minidp.strategies.sync import SyncSGD

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (SyncSGD, HierarchicalSGD, HierarchicalBulkSGD, DASO)}


def names() -> list[str]:
    """The ids of every available strategy."""
    return list(STRATEGIES)


def strategy_class(name: str) -> type[Strategy]:
    """The class of strategy ``name``; an unknown name is an error listing the valid ones."""
    if name not in STRATEGIES:
        raise ValueError(f"strategy: got {name!r}, allowed: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]


def get(name: str, *args: Any, **kwargs: Any) -> Strategy:
    """Build strategy ``name`` (arguments as :class:`Strategy`)."""
    return strategy_class(name)(*args, **kwargs)


__all__ = ["DASO", "DASOSchedule", "HierarchicalBulkSGD", "HierarchicalSGD", "Option",
           "STRATEGIES", "Strategy", "SyncSGD", "get", "names", "strategy_class"]
