"""Atomic file writes: a file appears whole under its name, or not at all.

Every file minidp writes for a user (dataset files, ``run.json``, ``metrics.jsonl``,
``summary.json``, ``model.npz``, ``trace.json``, reports) goes through
:func:`atomic_write`: the bytes go to a temporary name beside the target (unique per
process), are flushed and fsynced, then renamed over the target, which POSIX makes
atomic on one file system. A crash, a full disk or an exception in the writer leaves
the old file (if any) and removes the temporary one.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` through ``write(file)`` into a unique temporary file, then rename.

    Args:
        path: the file to (re)place.
        write: writes the contents into the open file (it may seek: ``mode`` "wb" allows it).
        mode: ``"w"`` (text) or ``"wb"`` (binary).
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
