"""Atomic file writes: a file appears whole under its name, or not at all.

Every file minidp writes for a user (dataset files, ``run.json``, ``metrics.jsonl``,
``summary.json``, ``model.npz``, ``trace.json``, reports) goes through
:func:`atomic_write` (or, inside a directory opened once, :func:`write_into`): the bytes
go to a temporary name beside the target, are flushed and fsynced, then renamed over
the target, which POSIX makes atomic on one file system. A crash, a full disk or an
exception in the writer leaves the old file (if any) and removes the temporary one.

Nothing of anyone else's is written through or replaced (:mod:`minidp.io.nofollow`):

* the temporary file is created exclusively (``O_EXCL | O_NOFOLLOW``), so a link
  planted under its name is never followed; its name is ``NAME.tmp-TAG``, where TAG is
  the caller's (a run's id: a name only that run writes, so a leftover of its own killed
  job is recognised and replaced) or else this process's id and random digits;
* the target is replaced only when it is a regular file (or missing): a directory, a
  link or a FIFO under the name is an error that names it, and stays as it is.
"""

from __future__ import annotations

import errno
import os
import secrets
from collections.abc import Callable
from typing import Any

from minidp.io.nofollow import REGULAR, Directory, WrongKind


class WriteFailed(OSError):
    """A file could not be written (disk full, too large, its directory gone): one line.

    The message names the file and the reason (:func:`write_failed`).
    """


def write_failed(path: str, exc: OSError) -> WriteFailed:
    """``exc``, raised while writing ``path``, as one line that names the file.

    ``write`` and ``fsync`` report ``[Errno 28] No space left on device`` without a path;
    the user needs to know which file and where. An error that already names its path
    (:class:`WriteFailed`, :class:`~minidp.io.nofollow.WrongKind`) is kept as it is.
    """
    if isinstance(exc, WriteFailed):
        return exc
    if isinstance(exc, WrongKind):  # minidp's own message: it names the path
        return WriteFailed(str(exc))
    code = errno.errorcode.get(exc.errno or 0)
    full = exc.errno in (errno.ENOSPC, errno.EFBIG, errno.EDQUOT)
    return WriteFailed(f"cannot write '{path}': {exc.strerror or exc}" + (f" ({code})" if code
                                                                          else "")
                       + ("; free space there (or raise the file size limit) and run again"
                          if full else ""))


def _create_temporary(directory: Directory, name: str, mode: str, tag: str | None) -> tuple:
    """(file, its name): a new temporary file for ``name``, created exclusively.

    With a ``tag`` the name is fixed, and a regular file already under it is a leftover
    of the same writer (a killed job of the same run): it is removed. Anything else
    there is an error. Without one, a name that is taken is never touched: another is
    drawn.
    """
    for _ in range(8):
        tmp = f"{name}.tmp-{tag or f'{os.getpid()}-{secrets.token_hex(4)}'}"
        try:
            return directory.create(tmp, mode), tmp
        except FileExistsError:
            if tag is not None:
                directory.remove_file(tmp)  # WrongKind unless a regular file: a leftover
    raise FileExistsError(errno.EEXIST, "no free temporary name", directory.path(name))


def write_into(directory: Directory, name: str, write: Callable[[Any], None],
               mode: str = "w", tag: str | None = None, exclusive: bool = False) -> None:
    """Write ``directory/name`` atomically through ``write(file)``, never following a link.

    Args:
        directory: the open directory the file goes into.
        name: the file's name (one name, no ``/``).
        write: writes the contents into the open file (it may seek: ``mode`` "wb" allows it).
        mode: ``"w"`` (text) or ``"wb"`` (binary).
        tag: the temporary name's suffix (``NAME.tmp-TAG``); None: unique to this call.
        exclusive: publish with ``link``, which never replaces: anything under ``name``
            (even a link to nowhere) makes it fail with FileExistsError.

    Raises:
        FileExistsError: ``exclusive``, and ``name`` was taken (the temporary file is gone).
        WriteFailed: the file could not be written, or ``name`` holds something that is
            not a regular file; the message names it.
    """
    path = directory.path(name)
    tmp = None
    try:
        f, tmp = _create_temporary(directory, name, mode, tag)
        with f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            directory.link(tmp, name)
        else:
            directory.rename(tmp, name, replace_file=True)
            tmp = None
    except FileExistsError as exc:
        if exclusive and tmp is not None:  # the name was taken: the caller's to report
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
        raise write_failed(path, exc) from None
    except OSError as exc:
        raise write_failed(path, exc) from None
    finally:
        if tmp is not None and directory.kind(tmp) == REGULAR:
            os.unlink(tmp, dir_fd=directory.fd)


def atomic_write(path: str, write: Callable[[Any], None], mode: str = "w",
                 tag: str | None = None, exclusive: bool = False) -> None:
    """Write ``path`` through ``write(file)`` into a temporary file, then rename.

    The directory of ``path`` is followed (it is the caller's); the file's own name is
    not (:func:`write_into`).

    Args:
        path: the file to (re)place.
        write: writes the contents into the open file (it may seek: ``mode`` "wb" allows it).
        mode: ``"w"`` (text) or ``"wb"`` (binary).
        tag: the temporary name's suffix; None: unique to this call.
        exclusive: never replace: a file (or anything) under the name is a FileExistsError.

    Raises:
        FileExistsError: ``exclusive``, and the name was taken.
        WriteFailed: the file could not be written; the message names it.
    """
    try:
        directory = Directory.open(os.path.dirname(path) or ".")
    except OSError as exc:
        raise write_failed(path, exc) from None
    with directory:
        write_into(directory, os.path.basename(path), write, mode, tag, exclusive)
