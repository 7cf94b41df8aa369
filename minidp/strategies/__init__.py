"""Distributed training strategies, one file per algorithm family, chosen by name.

``get(name, model, optimizer, topology, allreduce=..., **options)`` builds one;
``names()`` lists the ids available; ``STRATEGIES[name].options`` declares each one's
options (``--set name.option=value``).
"""

from __future__ import annotations

from typing import Any

from minidp.strategies.asgd import AsyncMomentumSGD, AsyncSGD
from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso import DASO
from minidp.strategies.daso_schedule import DASOSchedule
from minidp.strategies.dbs import DynamicBatchSGD
from minidp.strategies.easgd import (
    ElasticAsync,
    ElasticAveraging,
    ElasticHogwild,
    ElasticRoundRobin,
    ElasticServer,
)
from minidp.strategies.easgd_sync import ElasticSync
from minidp.strategies.hbsgd import HierarchicalBulkSGD
from minidp.strategies.hogwild import HogwildSGD
from minidp.strategies.hsgd import HierarchicalSGD
from minidp.strategies.measgd import MomentumElasticAsync
from minidp.strategies.ps import ParameterServer
from minidp.strategies.softsync import SoftSyncSGD
from minidp.strategies.sync import SyncSGD

STRATEGIES: dict[str, type[Strategy]] = {
    cls.name: cls for cls in (SyncSGD, HierarchicalSGD, HierarchicalBulkSGD, DASO, AsyncSGD,
                              AsyncMomentumSGD, HogwildSGD, SoftSyncSGD, DynamicBatchSGD,
                              ElasticRoundRobin, ElasticAsync, MomentumElasticAsync,
                              ElasticHogwild, ElasticSync)}


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


__all__ = ["DASO", "STRATEGIES", "AsyncMomentumSGD", "AsyncSGD", "DASOSchedule",
           "DynamicBatchSGD", "ElasticAsync", "ElasticAveraging", "ElasticHogwild",
           "ElasticRoundRobin", "ElasticServer", "ElasticSync", "HierarchicalBulkSGD",
           "HierarchicalSGD", "HogwildSGD", "MomentumElasticAsync", "Option", "ParameterServer",
           "SoftSyncSGD", "Strategy", "SyncSGD", "get", "names", "strategy_class"]
