"""Names inside a directory, used without following links: minidp touches only what it wrote.

A run directory is the user's ground as much as minidp's: beside minidp's files may sit a
user's copy of a checkpoint, a symbolic link, a directory or a FIFO under one of minidp's
names. The path *to* the directory is the user's choice and is followed like any path;
every name *inside* it is used relative to the directory's descriptor (``dir_fd``), so no
link planted there is ever followed out of it:

* a subdirectory is opened with ``O_NOFOLLOW | O_DIRECTORY``: a link or a file under
  its name is named in an error, never entered;
* a file is created with ``O_CREAT | O_EXCL | O_NOFOLLOW``: never an existing file (or
  what a link points at) reused;
* a file is read only when ``lstat`` says it is a regular file, and opened with
  ``O_NOFOLLOW | O_NONBLOCK`` (a FIFO swapped in meanwhile cannot block the reader;
  ``fstat`` then checks that the same file was opened);
* a name is replaced (``rename``) or removed (``unlink``) only when it holds a regular
  file; a directory is removed only empty (``rmdir``, which never follows a link).

Anything else under a name minidp wanted is a :class:`WrongKind` error naming the path
and what is there (``a symbolic link``, ``a FIFO (named pipe)``, ...).
"""

from __future__ import annotations

import os
import stat
from typing import Any

KINDS = {stat.S_IFREG: "a regular file", stat.S_IFDIR: "a directory",
         stat.S_IFLNK: "a symbolic link", stat.S_IFIFO: "a FIFO (named pipe)",
         stat.S_IFSOCK: "a socket", stat.S_IFCHR: "a character device",
         stat.S_IFBLK: "a block device"}
REGULAR, DIRECTORY = KINDS[stat.S_IFREG], KINDS[stat.S_IFDIR]
# Never follow a link, never block on a FIFO, never leak the descriptor into a child.
READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
SUBDIRECTORY = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


LEAVE_IT = ("minidp never follows, replaces or removes what it did not write: move it away, or "
            "choose another directory")


class WrongKind(OSError):
    """A name holds something minidp did not write there (a link, a directory, a FIFO...).

    An OSError, so that a write agreed by every rank (:func:`minidp.run.files.agree`)
    reports it as it reports a full disk: one line, naming the path.
    """


def kind_of(mode: int) -> str:
    """What a ``st_mode`` is, in words: ``a regular file``, ``a symbolic link``, ..."""
    return KINDS.get(stat.S_IFMT(mode), "a file of an unknown kind")


class Directory:
    """An open directory; every name inside it is used without following links.

    Use it as a context manager (the descriptor is closed on leaving). ``path`` is only
    for messages: operations go through the descriptor, so the directory may be renamed
    meanwhile and a name inside it still means the same file.
    """

    def __init__(self, fd: int, path: str) -> None:
        self.fd, self.shown = fd, path

    @classmethod
    def open(cls, path: str, create: bool = False) -> Directory:
        """The directory at ``path`` (followed, as every path a user gives is).

        Args:
            path: the directory.
            create: make it (and its parents) first when it is missing.

        Raises:
            OSError: it cannot be made or opened (not a directory: ENOTDIR).
        """
        if create:
            os.makedirs(path, exist_ok=True)
        return cls(os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), path)

    def __enter__(self) -> Directory:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Close the descriptor (once)."""
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def path(self, name: str = "") -> str:
        """``name`` inside the directory, as a path for messages."""
        return os.path.join(self.shown, name) if name else self.shown

    # -- what is there ----------------------------------------------------------------

    def lstat(self, name: str) -> os.stat_result | None:
        """The entry ``name`` itself (a link is not followed), or None when there is none."""
        try:
            return os.stat(name, dir_fd=self.fd, follow_symlinks=False)
        except FileNotFoundError:
            return None

    def kind(self, name: str) -> str | None:
        """What ``name`` is (:data:`KINDS`), or None when there is nothing of that name."""
        found = self.lstat(name)
        return None if found is None else kind_of(found.st_mode)

    def names(self) -> list[str]:
        """Every entry of the directory, sorted."""
        return sorted(os.listdir(self.fd))

    def not_minidps(self, name: str, found: str, wanted: str = REGULAR) -> str:
        """``'PATH' is FOUND, not WANTED that minidp wrote``: what is wrong with ``name``."""
        return f"'{self.path(name)}' is {found}, not {wanted} that minidp wrote"

    def wrong_kind(self, name: str, found: str, wanted: str = REGULAR) -> WrongKind:
        """The error for ``name`` holding ``found`` where minidp wants ``wanted``."""
        return WrongKind(f"{self.not_minidps(name, found, wanted)}; {LEAVE_IT}")

    def _expect(self, name: str, wanted: str) -> os.stat_result:
        found = self.lstat(name)
        if found is None:
            raise FileNotFoundError(2, "No such file or directory", self.path(name))
        if kind_of(found.st_mode) != wanted:
            raise self.wrong_kind(name, kind_of(found.st_mode), wanted)
        return found

    # -- subdirectories -----------------------------------------------------------------

    def child(self, name: str, create: bool = False) -> Directory:
        """The subdirectory ``name``, opened without following a link.

        Args:
            name: one name, no ``/``.
            create: make it when it is missing (a directory that is there is used).

        Raises:
            WrongKind: a link, a file or anything but a directory is there.
            FileNotFoundError: it is missing and ``create`` is False.
        """
        if create:
            try:
                os.mkdir(name, 0o755, dir_fd=self.fd)
            except FileExistsError:
                pass
        self._expect(name, DIRECTORY)
        try:
            return Directory(os.open(name, SUBDIRECTORY, dir_fd=self.fd), self.path(name))
        except NotADirectoryError:  # swapped for a link or a file since the lstat
            raise self.wrong_kind(name, self.kind(name) or "gone", DIRECTORY) from None

    def mkdir(self, name: str) -> None:
        """Make the subdirectory ``name``; an existing entry of that name is an error."""
        os.mkdir(name, 0o755, dir_fd=self.fd)

    def remove_dir(self, name: str) -> None:
        """Remove the empty subdirectory ``name`` (``rmdir`` never follows a link)."""
        os.rmdir(name, dir_fd=self.fd)

    # -- files ---------------------------------------------------------------------------

    def open_read(self, name: str) -> Any:
        """``name`` opened for reading (binary), only if it is a regular file.

        Raises:
            WrongKind: anything but a regular file is there (nothing else is opened:
                opening a device or a FIFO can block or act).
            FileNotFoundError: nothing is there.
        """
        before = self._expect(name, REGULAR)
        fd = os.open(name, READ, dir_fd=self.fd)
        opened = os.fstat(fd)
        if (opened.st_dev, opened.st_ino) != (before.st_dev, before.st_ino):
            os.close(fd)
            raise self.wrong_kind(name, "a file that changed while it was opened")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")

    def read(self, name: str, limit: int = 1 << 30) -> bytes:
        """The bytes of the regular file ``name`` (at most ``limit``: more is an error)."""
        with self.open_read(name) as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise WrongKind(f"'{self.path(name)}' holds more than {limit} bytes, more than "
                            "minidp writes there")
        return data

    def create(self, name: str, mode: str = "wb") -> Any:
        """A new file ``name``, opened for writing; an existing entry is an error (EEXIST)."""
        return os.fdopen(os.open(name, CREATE, 0o644, dir_fd=self.fd), mode)

    def append(self, name: str) -> Any:
        """The regular file ``name``, opened to append text (never a link, a FIFO...)."""
        self._expect(name, REGULAR)
        fd = os.open(name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, dir_fd=self.fd)
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise self.wrong_kind(name, "a file that changed while it was opened")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "a")

    def remove_file(self, name: str) -> bool:
        """Remove ``name`` if it is a regular file; False when nothing is there.

        Raises:
            WrongKind: something else is there (it is left as it is).
        """
        found = self.kind(name)
        if found is None:
            return False
        if found != REGULAR:
            raise self.wrong_kind(name, found)
        os.unlink(name, dir_fd=self.fd)
        return True

    def rename(self, source: str, target: str, replace_file: bool = False) -> None:
        """Rename ``source`` to ``target`` inside the directory.

        Args:
            source: an entry minidp made.
            target: a name that is free or, with ``replace_file``, a regular file.
            replace_file: allow ``target`` to be a regular file, which the rename
                replaces atomically.

        Raises:
            WrongKind: ``target`` holds anything else (nothing is renamed).
        """
        found = self.kind(target)
        if found is not None and not (replace_file and found == REGULAR):
            raise self.wrong_kind(target, found, REGULAR if replace_file else "a free name")
        os.rename(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd)

    def link(self, source: str, target: str) -> None:
        """Hard-link the file ``source`` as ``target``; fails (EEXIST) if ``target`` exists.

        ``link`` never replaces, so it claims a name exclusively for a file written whole.
        """
        os.link(source, target, src_dir_fd=self.fd, dst_dir_fd=self.fd,
                follow_symlinks=False)

    def fsync(self) -> None:
        """Make the directory's entries (a rename, a new file) durable."""
        os.fsync(self.fd)
