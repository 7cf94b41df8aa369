"""What is at a dataset file's path: opened only if regular, created only where nothing is.

A run trusts a path three times, and each time the path could name something else:

* **Opening.** ``open()`` of a FIFO blocks until a writer comes, and a device may never
  end. :func:`open_regular` opens with ``O_NONBLOCK`` (which returns at once, whatever is
  there) and looks at what it opened (``fstat`` of the descriptor, not of the name, which
  could change in between): anything but a regular file is refused, named for what it
  is, and closed unread.
* **Creating.** Preparation must never replace a file under a dataset's name: the user's
  own records may be there. :func:`create_new` writes to a unique temporary name, fsyncs,
  then links it under the name; ``link`` fails when the name exists (whatever it is:
  a file, a directory, a dangling symbolic link), as ``open(O_CREAT | O_EXCL)`` does, and
  never follows a link there. Others see the whole file or nothing.
* **Reading again.** The ``mpiio``, ``leader`` and ``strided`` readers open the training
  file by its path every epoch. A file moved in under the name, or written in place,
  would be read as if it were the one the run opened and checked. :class:`Stamp` is what
  tells them apart: the device and inode (another file moved in), the size and the
  modification time (written in place), and a CRC-32 of the 128 header bytes (a header
  rewritten with its time put back). :func:`changed` compares the path's stamp now with
  the one taken when the file was opened.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import stat
import zlib
from collections.abc import Callable
from typing import BinaryIO

from minidp.io.atomic import atomic_write

HEADER_BYTES = 128  # the .mdp header, whose CRC-32 a stamp holds


def file_kind(mode: int) -> str:
    """What a path whose ``st_mode`` is ``mode`` is, in words ("a directory", "a FIFO ...")."""
    return ("a regular file" if stat.S_ISREG(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a special file")


MDP = ("dataset file", "an .mdp file (python -m minidp data prepare writes them)")


def not_regular(path: str, mode: int, kind: tuple[str, str] = MDP) -> ValueError:
    """The error for a path that holds something other than a regular file.

    ``kind``: what the file is, and what is allowed there, in words (for a dataset's
    source: an IDX file, a CIFAR-10 batch).
    """
    return ValueError(f"{kind[0]} '{path}' is {file_kind(mode)}, not a regular file; "
                      f"allowed: {kind[1]}")


def open_regular(path: str, kind: tuple[str, str] = MDP) -> BinaryIO:
    """``path`` opened for binary reading, if it is a regular file; never blocks.

    ``kind``: what the file is and what is allowed there, for the messages.

    Raises:
        FileNotFoundError: nothing is there (the message names the path).
        ValueError: a directory, FIFO, device or socket (named for what it is).
        OSError: it cannot be opened (the message names the path and the reason).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise FileNotFoundError(f"{kind[0]} '{path}' does not exist") from None
    except IsADirectoryError:
        raise not_regular(path, stat.S_IFDIR, kind) from None
    except OSError as exc:
        failed = OSError(f"{kind[0]} '{path}' cannot be opened: {exc.strerror or exc}")
        failed.errno = exc.errno
        raise failed from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise not_regular(path, mode, kind)
    return os.fdopen(fd, "rb")


def unreadable(path: str, exc: Exception) -> str:
    """``exc``, raised while reading ``path``, as a message that names the file.

    ``read`` reports ``[Errno 5] Input/output error`` without a path; minidp's own
    errors name it already.
    """
    text = str(exc)
    if f"'{path}'" in text:
        return text
    return f"dataset file '{path}' cannot be read: {getattr(exc, 'strerror', None) or text}"


@dataclasses.dataclass(frozen=True)
class Stamp:
    """What tells the file a run opened from another one under its name.

    Attributes:
        device: ``st_dev``.
        inode: ``st_ino``: another file moved in has another one.
        size: ``st_size`` in bytes.
        mtime_ns: ``st_mtime_ns``: a write in place changes it.
        header_crc: CRC-32 of the first 128 bytes as they are (all of them, the stored
            header checksum included).
    """

    device: int
    inode: int
    size: int
    mtime_ns: int
    header_crc: int

    def differences(self, now: Stamp) -> list[str]:
        """What differs from ``now``, in words, the most telling first."""
        found = []
        if (self.device, self.inode) != (now.device, now.inode):
            found.append(f"another file is under its name (inode {self.inode} on device "
                         f"{self.device} when opened, now inode {now.inode} on device "
                         f"{now.device})")
        if self.size != now.size:
            found.append(f"its size went from {self.size} to {now.size} bytes")
        if self.mtime_ns != now.mtime_ns:
            found.append(f"it was modified (mtime {self.mtime_ns} ns when opened, now "
                         f"{now.mtime_ns} ns)")
        if self.header_crc != now.header_crc:
            found.append(f"its header bytes changed (CRC-32 {self.header_crc:#010x} when "
                         f"opened, now {now.header_crc:#010x})")
        return found


def stamp_of(f: BinaryIO) -> Stamp:
    """The stamp of an open file (its header bytes are read from offset 0)."""
    info = os.fstat(f.fileno())
    f.seek(0)
    head = f.read(HEADER_BYTES)
    return Stamp(info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns, zlib.crc32(head))


def stamp(path: str) -> Stamp:
    """The stamp of the regular file at ``path`` now (:func:`open_regular`'s errors)."""
    with open_regular(path) as f:
        return stamp_of(f)


def changed(path: str, opened: Stamp, now: Stamp | None = None) -> str | None:
    """Why ``path`` no longer names the file stamped ``opened``, or None if it still does.

    ``now``: the stamp of the file as it was just opened, if the caller holds it open
    (else the path is stamped here). The message names the file and what changed, and
    says what to do: the run stops rather than read records other than those it checked
    (and its checkpoints record).
    """
    if now is None:
        try:
            now = stamp(path)
        except (OSError, ValueError) as exc:
            return _changed(path, [f"it cannot be read as it was ({exc})"])
    found = opened.differences(now)
    return _changed(path, found) if found else None


def _changed(path: str, found: list[str]) -> str:
    return (f"dataset file '{path}' changed while the run used it: {'; '.join(found)}. The "
            "run stops rather than read other records than those it opened and checked; put "
            "the file the run opened back under its name and resume from the last "
            "checkpoint, or start a new run")


def create_new(path: str, write: Callable[[BinaryIO], None]) -> None:
    """Write a new file at ``path`` through ``write(file)``, never replacing anything there.

    :func:`minidp.io.atomic.atomic_write` with ``exclusive``: the bytes go to a temporary
    name created exclusively, are fsynced, then linked as ``path``; the temporary name is
    removed whatever happens. What this adds is the message a user reads when the name
    was taken.

    Raises:
        FileExistsError: something is at ``path`` already (left as it is).
        WriteFailed: the file could not be written (a full disk, no permission); the
            message names it.
    """
    try:
        atomic_write(path, write, "wb", exclusive=True)
    except FileExistsError:
        taken = FileExistsError(f"'{path}' exists (it may have appeared while minidp wrote "
                                "it); minidp never replaces a file, it is left as it is")
        taken.errno = errno.EEXIST
        raise taken from None
