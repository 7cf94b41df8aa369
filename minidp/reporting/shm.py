"""The shared-memory files of one job: seen while it runs, removed once it is over.

MPI libraries keep a node's shared memory in files under ``/dev/shm`` (MPICH's
``mpich_shm_*``, Open MPI's ``vader_segment.*`` and ``sm_segment.*``, UCX's
``ucx_shm_*``), and remove them when the job ends normally. A job ended by a signal,
killed by a timeout or aborted leaves them, and each holds memory until the machine
reboots. Only the job's own files may be removed (other jobs run beside it), so
:class:`ShmWatch` samples, every fraction of a second while the job runs, the files
under ``/dev/shm`` that its processes map or hold open (``/proc/PID/maps`` and
``/proc/PID/fd`` of every process below the launcher: Hydra starts each rank in a
session of its own, so the process group does not find them). After the job, every
file it was seen using that no live process uses any more is removed, whatever its
name: no pattern of a library's names is guessed. Linux's ``/proc``; elsewhere nothing
is seen and nothing is removed.
"""

from __future__ import annotations

import contextlib
import os
import threading

SHM = "/dev/shm/"


def _stat(pid: int | str) -> list[str]:
    """The fields of ``/proc/PID/stat`` after the command name (field 3 on; [] if gone).

    The name is cut at its last ")": it may hold spaces and parentheses itself.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []  # gone meanwhile, or not ours to read


def descendants(root: int) -> set[int]:
    """``root`` and every process below it (by the parent ids in ``/proc``)."""
    children: dict[int, list[int]] = {}
    for pid in filter(str.isdigit, _listdir("/proc")):
        fields = _stat(pid)
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(pid))
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        found.add(pid)
        todo.extend(children.get(pid, []))
    return found


def start_time(pid: int) -> str | None:
    """Field 22 of ``/proc/PID/stat``, when the process started (None: it is gone).

    With the id, it names one process: an id is reused only by a process started later.
    """
    fields = _stat(pid)
    return fields[19] if len(fields) > 19 else None


def has_ended(pid: int, started: str | None) -> bool:
    """Whether process ``pid``, started at ``started``, is gone or a zombie.

    A zombie has released its memory already: it maps no file any more.
    """
    fields = _stat(pid)
    return len(fields) <= 19 or fields[19] != started or fields[0] in ("Z", "X")


def in_use(pids: set[int] | None = None) -> set[str]:
    """The files under ``/dev/shm`` that the processes ``pids`` (default: all) map or hold."""
    used: set[str] = set()
    for pid in pids if pids is not None else map(int, filter(str.isdigit, _listdir("/proc"))):
        try:
            with open(f"/proc/{pid}/maps") as f:
                used.update(line.split(None, 5)[-1].strip() for line in f if SHM in line)
            fds = f"/proc/{pid}/fd"
            for fd in os.listdir(fds):
                with contextlib.suppress(OSError):
                    used.add(os.readlink(os.path.join(fds, fd)))
        except OSError:
            continue
    # a mapping of a removed file reads "/dev/shm/name (deleted)": nothing left to remove
    return {p for p in used if p.startswith(SHM) and not p.endswith(" (deleted)")}


def _listdir(path: str) -> list[str]:
    try:
        return os.listdir(path)
    except OSError:
        return []


class ShmWatch:
    """The files under ``/dev/shm`` that the processes below ``root`` use, while it runs.

    Args:
        root: the launcher's process id.
        every_s: seconds between two samples.
    """

    def __init__(self, root: int, every_s: float = 0.5) -> None:
        self.root, self.every_s = root, every_s
        self.seen: set[str] = set()
        self.started: dict[int, str | None] = {}  # every process seen: its start time
        self._lock = threading.Lock()  # the watch's thread and the caller both sample
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def sample(self) -> set[int]:
        """Add what the job's processes use now; returns those processes."""
        pids = descendants(self.root)
        with self._lock:
            for pid in pids - self.started.keys():
                self.started[pid] = start_time(pid)
            self.seen |= in_use(pids)
        return pids

    def _run(self) -> None:
        while not self._done.wait(self.every_s):
            self.sample()

    def remove_leftovers(self) -> list[str]:
        """Stop watching; remove what the ended job left that no live process uses.

        Returns the paths removed (another process may have removed one meanwhile).
        """
        self._done.set()
        self._thread.join()
        left = {p for p in self.seen if os.path.lexists(p)}
        removed = []
        for path in sorted(left - in_use()) if left else []:
            with contextlib.suppress(OSError):
                os.remove(path)
                removed.append(path)
        return removed
