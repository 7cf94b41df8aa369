"""Distributed training strategies, one file per strategy id, chosen by name.

``get(name, model, optimizer, topology, allreduce=..., **options)`` builds one;
``names()`` lists the ids available; ``STRATEGIES[name].options`` declares each one's
options (``--set name.option=value``).

Each id's class is in the file of its name (``easgd-async``: ``easgd_async.py``); a
family's common part in its base file: ``base.py`` (every strategy), ``ps_base.py`` (the
parameter servers: asgd, amsgd, softsync, dbs), ``easgd_base.py`` (the elastic family).
DASO is ``daso.py`` (the step, Heat's phases), ``daso_replica.py`` (the identical
node's one replica, an optimisation with the same bits) and ``daso_schedule.py``.
"""

from __future__ import annotations

from typing import Any

from minidp.strategies.amsgd import AsyncMomentumSGD
from minidp.strategies.asgd import AsyncSGD
from minidp.strategies.base import Option, Strategy
from minidp.strategies.daso import DASO
from minidp.strategies.daso_schedule import DASOSchedule
from minidp.strategies.dbs import DynamicBatchSGD
from minidp.strategies.easgd_async import ElasticAsync
from minidp.strategies.easgd_base import ElasticAveraging, ElasticServer
from minidp.strategies.easgd_hogwild import ElasticHogwild
from minidp.strategies.easgd_rr import ElasticRoundRobin
from minidp.strategies.easgd_sync import ElasticSync
from minidp.strategies.hbsgd import HierarchicalBulkSGD
from minidp.strategies.hogwild import HogwildSGD
from minidp.strategies.hsgd import HierarchicalSGD
from minidp.strategies.measgd_async import MomentumElasticAsync
from minidp.strategies.ps_base import ParameterServer
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
