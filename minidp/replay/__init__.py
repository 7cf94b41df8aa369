"""Replay: an asynchronous run re-executed exactly, in one process, from the papers' rules.

``python -m minidp replay RUN [--explain N]`` (:mod:`minidp.replay.command`) reads what
the run recorded (:mod:`minidp.replay.recorded`), every file first checked to be what
minidp writes (:mod:`minidp.replay.checks`), walks its servers' or master's events
in their order (:mod:`minidp.replay.servers`, :mod:`minidp.replay.elastic`), applies the
update rules written from the papers (:mod:`minidp.replay.rules`) and compares the
result with the run's ``model.npz``. None of it imports :mod:`minidp.strategies`: the
rules are the oracle the strategies are checked against (docs/replay.md).
"""

from minidp.replay.command import Outcome, replay

__all__ = ["Outcome", "replay"]
