"""Python's garbage collector while a minidp command starts: paused, then the modules frozen.

Importing minidp (NumPy, Numba and llvmlite, mpi4py and minidp's own modules) creates
about 100,000 objects that the collector tracks, and no garbage. The collector still
runs a young collection every 700 of them and walks the older generations every tenth:
some 140 collections, 60-100 ms of the 0.7-1 s that a rank spends importing on this
2-core machine (timed with ``gc.callbacks``), in every rank of every job. So in a process
started as a minidp command (``python -m minidp ...``, also behind ``python -m mpi4py``,
or the ``minidp`` script):

* the package's import pauses the collector (:func:`pause_for_command`, from
  ``minidp/__init__.py``, before NumPy loads);
* once the command's own modules are loaded (``minidp/__main__.py``), every object alive
  is frozen and the collector turned back on as it was (:func:`start_command`). Frozen
  objects (``gc.freeze``: the modules, classes and functions, which live as long as the
  process) are never walked again, not by a long run's full collections either.

A library import (a user's program, a notebook, a test) leaves the collector alone.
Pausing only defers the work there (the first collections after it walk every object
made during the pause), and freezing would also freeze the user's objects: a cycle of
theirs that became garbage later would never be freed.

The collector decides nothing a run computes: results are the same bits either way.
This module runs before NumPy loads, and imports only ``gc`` and
:mod:`minidp.run.signals` (which imports only the standard library).
"""

from __future__ import annotations

import gc

from minidp.run.signals import started_as_minidp

_state = {"was_enabled": True, "paused": False}


def pause_for_command() -> bool:
    """Stop automatic collection if this process runs a minidp command; returns whether.

    :func:`start_command` turns it back on.
    """
    if not started_as_minidp():
        return False
    _state["was_enabled"] = gc.isenabled()
    _state["paused"] = True
    gc.disable()
    return True


def start_command() -> None:
    """A command's modules are loaded: freeze what is alive, collect from now on.

    Nothing happens where :func:`pause_for_command` paused nothing (a library import,
    ``minidp.__main__.main()`` called from a user's program).
    """
    if not _state["paused"]:
        return
    gc.freeze()
    if _state["was_enabled"]:
        gc.enable()
    _state["paused"] = False
