"""Files of a run directory read back safely: regular files only, their form checked.

``report``, ``compare`` and ``replay`` read what ``train`` wrote (``run.json``,
``metrics.jsonl``, ``summary.json``, ``trace.json``, ``events.json``, ``model.npz``),
but a run directory is only a directory: anything may sit under those names. Opening a
FIFO for reading waits for a writer for ever, and a device (``/dev/zero`` behind a
symbolic link) never ends; so a file is looked at (:func:`os.stat`) before it is opened,
opened without waiting (``O_NONBLOCK``), and looked at again through its descriptor, in
case another file was moved in between. Only a regular file is read.

What is read is then held to the form minidp writes: :func:`json_object` and
:func:`fields` check types and ranges, so a changed or truncated file is one error
naming the file, the field and what is allowed (:class:`Unreadable`, a ValueError),
never a ``KeyError`` deep inside a table or a plot.
"""

from __future__ import annotations

import json
import math
import os
import stat
from collections.abc import Callable
from typing import IO, Any

KINDS = {stat.S_ISREG: "a regular file", stat.S_ISDIR: "a directory",
         stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a device",
         stat.S_ISBLK: "a device", stat.S_ISSOCK: "a socket",
         stat.S_ISLNK: "a symbolic link to nothing"}


class Unreadable(ValueError):
    """A file a command needs is not there, not a regular file, or not in minidp's form."""


def kind_of(mode: int) -> str:
    """What a path of ``st_mode`` ``mode`` is, in words (``a FIFO (named pipe)``)."""
    return next((words for test, words in KINDS.items() if test(mode)), "a special file")


def open_regular(path: str, what: str, binary: bool = False) -> IO[Any]:
    """``path`` opened for reading if it is a regular file; else :class:`Unreadable`.

    Args:
        path: the file.
        what: how the message names it (``"run.json"``).
        binary: bytes instead of UTF-8 text.

    Raises:
        Unreadable: nothing is there, a directory, a FIFO, a device, a socket; or it cannot
            be opened.
    """
    try:
        before = os.stat(path)
    except FileNotFoundError:
        raise Unreadable(f"{what}: '{path}' is missing") from None
    except OSError as exc:
        raise Unreadable(f"{what}: '{path}' cannot be read: {exc.strerror}") from None
    if not stat.S_ISREG(before.st_mode):
        raise Unreadable(f"{what}: '{path}' is {kind_of(before.st_mode)}, not a regular file "
                         "(minidp writes regular files there)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise Unreadable(f"{what}: '{path}' cannot be read: {exc.strerror}") from None
    now = os.fstat(fd)
    if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (before.st_dev,
                                                                     before.st_ino):
        os.close(fd)
        raise Unreadable(f"{what}: '{path}' was replaced while it was opened; try again")
    os.set_blocking(fd, True)  # a regular file: reads never wait for a writer anyway
    return os.fdopen(fd, "rb") if binary else os.fdopen(fd, encoding="utf-8")


def read_json(path: str, what: str) -> Any:
    """The JSON value in the regular file ``path``; :class:`Unreadable` if it is not JSON."""
    with open_regular(path, what) as f:
        try:
            return json.load(f)
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise Unreadable(f"{what}: '{path}' is not valid JSON ({error})") from None


def json_object(value: Any, where: str) -> dict[str, Any]:
    """``value`` if it is a JSON object; else :class:`Unreadable` naming ``where``."""
    if not isinstance(value, dict):
        raise Unreadable(f"{where}: got {_short(value)} ({_type(value)}), allowed: a JSON "
                         "object, as minidp writes it")
    return value


def is_int(value: Any) -> bool:
    """A JSON integer (not a bool)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """A finite JSON number (not a bool)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and \
        math.isfinite(value)


def count(minimum: int = 0) -> tuple[Callable[[Any], bool], str]:
    """A field check: an int >= ``minimum``."""
    return (lambda v: is_int(v) and v >= minimum), f"an int >= {minimum}"


NUMBER = (is_number, "a finite number")
SECONDS = ((lambda v: is_number(v) and v >= 0), "a finite number >= 0")
FRACTION = ((lambda v: is_number(v) and 0 <= v <= 1), "a number in [0, 1]")
LOSS = ((lambda v: v is None or is_number(v)), "a finite number, or null (a diverged epoch)")
TEXT = ((lambda v: isinstance(v, str)), "a string")
FLAG = ((lambda v: isinstance(v, bool)), "true or false")
OBJECT = ((lambda v: isinstance(v, dict)), "a JSON object")
SECONDS_BY_NAME = ((lambda v: isinstance(v, dict) and all(
    isinstance(k, str) and is_number(x) and x >= 0 for k, x in v.items())),
    "a JSON object of finite numbers >= 0")


def optional(check: tuple[Callable[[Any], bool], str]) -> tuple[Callable[[Any], bool], str]:
    """``check``, or null."""
    test, words = check
    return (lambda v: v is None or test(v)), f"{words}, or null"


def fields(record: dict[str, Any], required: dict[str, tuple[Callable[[Any], bool], str]],
           where: str, present: dict[str, tuple[Callable[[Any], bool], str]] | None = None
           ) -> None:
    """Check ``record``'s fields: every ``required`` one there; ``present`` ones if there.

    Raises:
        Unreadable: the first field missing or of another form, named with ``where``.
    """
    for name, (test, words) in required.items():
        if name not in record:
            raise Unreadable(f"{where}: no {name!r}, allowed: a record that has it ({words}), "
                             "as minidp writes it")
    for name, (test, words) in {**required, **(present or {})}.items():
        if name in record and not test(record[name]):
            raise Unreadable(f"{where}: {name!r} is {_short(record[name])} "
                             f"({_type(record[name])}), allowed: {words}")


def _type(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a bool",
            type(None): "null"}.get(type(value), type(value).__name__)


def _short(value: Any) -> str:
    """``value`` in JSON, cut to 60 characters (a message names it, never dumps it)."""
    text = json.dumps(value, allow_nan=True, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."
