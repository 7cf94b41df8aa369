"""Atomic file writes: a file appears whole under its name, or not at all.

Every file minidp writes for a user (dataset files, ``run.json``, ``metrics.jsonl``,
``summary.json``, ``model.npz``, ``trace.json``, reports) goes through
:func:`atomic_write`: the bytes go to a temporary name beside the target (unique per
process), are flushed and fsynced, then renamed over the target, which POSIX makes
atomic on one file system. A crash, a full disk or an exception in the writer leaves
the old file (if any) and removes the temporary one.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from typing import Any


class WriteFailed(OSError):
    """A file could not be written (disk full, too large, its directory gone): one line.

    The message names the file and the reason (:func:`write_failed`).
    """


def write_failed(path: str, exc: OSError) -> WriteFailed:
    """``exc``, raised while writing ``path``, as one line that names the file.

    ``write`` and ``fsync`` report ``[Errno 28] No space left on device`` without a path;
    the user needs to know which file and where.
    """
    if isinstance(exc, WriteFailed):
        return exc
    code = errno.errorcode.get(exc.errno or 0)
    full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    return WriteFailed(f"cannot write '{path}': {exc.strerror or exc}" + (f" ({code})" if code
                                                                          else "")
                       + ("; free space there (or raise the file size limit) and run again"
                          if full else ""))


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "w") -> None:
    """Write ``path`` through ``write(file)`` into a unique temporary file, then rename.

    Args:
        path: the file to (re)place.
        write: writes the contents into the open file (it may seek: ``mode`` "wb" allows it).
        mode: ``"w"`` (text) or ``"wb"`` (binary).

    Raises:
        WriteFailed: the file could not be written; the message names it.
    """
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        with open(tmp, mode) as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise write_failed(path, exc) from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
