"""The claim: which job holds a run directory, and whether that job still runs.

One live job per run directory. ``run.json``'s entry ``minidp_run`` (:data:`MARKER`) is
the claim of the job that holds the directory, made by its rank 0 process::

    run_id        the run's id (random): made when the run starts, kept by every job
                  that continues it (--resume); checkpoints and temporary names carry it
    host, pid     rank 0's host name and process id
    boot_id       that host's boot (/proc/sys/kernel/random/boot_id)
    start_ticks   the process's start in clock ticks after boot (/proc/PID/stat, field 22)
    started       the same start as a time, for people
    time          when the claim was made (or taken over)
    slurm         the Slurm job id and restart count, when Slurm started the job
    ended         when the job released the claim (at its end, whatever the outcome)

Whether the job that holds a claim still runs (:func:`holder`):

* released (``ended`` set): nobody holds the directory;
* this very process: the claim is this job's own;
* the same host (host name and boot id): the process with that pid *and that start* is
  alive (a pid reused by another process has another start, so it is not taken for the
  job; a zombie has ended);
* another host, or the same host before a reboot: an earlier run of the same Slurm job
  (same job id, a lower restart count: a requeued job) has ended; anything else cannot
  be seen from here, and the directory is refused (saying so) rather than shared. The
  claim's age says nothing (a run may train for days), so it is not used.

Without ``/proc`` (not Linux) the start time is unknown: a pid that is alive counts as
the job (a reused pid is then taken for it: refused, never shared).

Deciding (reading a claim, then writing one) is itself exclusive: the decision holds
``run.json.lock`` (:func:`deciding`), created with ``O_EXCL`` and removed when the
decision is made, so of two jobs that find one claim gone, one takes it over and the
other then finds that job's claim alive.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import secrets
import socket
import time
from collections.abc import Iterator
from typing import Any

from minidp.io.nofollow import Directory, WrongKind
from minidp.run.errors import UsageError

MARKER = "minidp_run"  # run.json's key: the claim that makes a directory minidp's run
LOCK = "run.json.lock"
LOCK_WAIT_S = 30.0  # a decision takes milliseconds; removing a large run takes seconds
UNREADABLE_S = 2.0  # a lock's holder writes it within microseconds of making it
FREE, SELF, ALIVE, GONE, UNKNOWN = "free", "self", "alive", "gone", "unknown"
FIELDS = {"run_id": str, "host": str, "pid": int, "time": str}  # every claim has these
RUN_ID = re.compile(r"[0-9a-f]{16}")  # it goes into file names: nothing else is one


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def boot_id() -> str | None:
    """This host's boot id (Linux), or None."""
    text = _read("/proc/sys/kernel/random/boot_id")
    return text.strip() if text else None


def process_start(pid: int) -> tuple[int, str] | None:
    """(start in clock ticks after boot, state letter) of process ``pid``; None: no such one.

    Raises:
        OSError: /proc cannot say (not Linux).
    """
    if not os.path.isdir("/proc/self"):
        raise OSError("no /proc")
    text = _read(f"/proc/{pid}/stat")
    if text is None:
        return None
    fields = text.rsplit(")", 1)[1].split()  # the name in parentheses may hold spaces
    return int(fields[19]), fields[0]


def _started(ticks: int) -> str | None:
    """A start in ticks after boot as an ISO time (from /proc/stat's ``btime``)."""
    for line in (_read("/proc/stat") or "").splitlines():
        if line.startswith("btime "):
            seconds = int(line.split()[1]) + ticks / os.sysconf("SC_CLK_TCK")
            return datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc).isoformat(
                timespec="seconds")
    return None


def this_process() -> dict[str, Any]:
    """Who this process is: host, boot, pid, start (what a claim or a lock records)."""
    me: dict[str, Any] = {"host": socket.gethostname(), "boot_id": boot_id(), "pid": os.getpid()}
    try:
        start = process_start(os.getpid())
    except OSError:
        start = None
    if start is not None:
        me.update(start_ticks=start[0], started=_started(start[0]))
    me["time"] = _now()
    if os.environ.get("SLURM_JOB_ID"):
        me["slurm"] = {"job_id": os.environ["SLURM_JOB_ID"],
                       "restart_count": os.environ.get("SLURM_RESTART_COUNT", "0")}
    return me


def new_claim(run_id: str | None = None) -> dict[str, Any]:
    """This process's claim of a run: of the run ``run_id``, or of a new run."""
    return {"run_id": run_id or secrets.token_hex(8), **this_process(), "ended": None}


def problem(claim: Any) -> str | None:
    """Why ``claim`` is not a claim minidp wrote (a field missing or of a wrong type), or None."""
    if not isinstance(claim, dict):
        return f"its {MARKER!r} entry is not an object"
    wrong = [k for k, kind in FIELDS.items()
             if not isinstance(claim.get(k), kind) or isinstance(claim.get(k), bool)]
    if not isinstance(claim.get("start_ticks", 0), int) or \
            not isinstance(claim.get("ended"), (str, type(None))):
        wrong += ["start_ticks or ended"]
    if "run_id" not in wrong and not RUN_ID.fullmatch(claim["run_id"]):
        wrong.append("run_id (16 hexadecimal digits)")
    return f"its {MARKER!r} entry has no valid {', '.join(wrong)}" if wrong else None


def describe(claim: dict[str, Any]) -> str:
    """``pid P on host H (started T)``: the process a claim or a lock names."""
    when = claim.get("started") or claim.get("time") or "?"
    return f"pid {claim.get('pid', '?')} on host {claim.get('host', '?')} (started {when})"


def _same_slurm_job_requeued(claim: dict[str, Any]) -> bool:
    """Whether this job is a later run (requeue) of the Slurm job that made ``claim``."""
    theirs, job = claim.get("slurm"), os.environ.get("SLURM_JOB_ID")
    if not isinstance(theirs, dict) or not job or theirs.get("job_id") != job:
        return False
    try:
        return int(os.environ.get("SLURM_RESTART_COUNT", "0")) > int(theirs["restart_count"])
    except (KeyError, TypeError, ValueError):
        return False


def holder(claim: dict[str, Any]) -> str:
    """Whether the job of ``claim`` runs: FREE, SELF, ALIVE, GONE or UNKNOWN (module doc)."""
    if claim.get("ended"):
        return FREE
    me = this_process()
    same_host = claim.get("host") == me["host"] and claim.get("boot_id") == me["boot_id"]
    if not same_host:
        return GONE if _same_slurm_job_requeued(claim) else UNKNOWN
    pid, ticks = claim["pid"], claim.get("start_ticks")
    if pid == me["pid"] and ticks == me.get("start_ticks"):
        return SELF
    try:
        found = process_start(pid)
    except OSError:  # no /proc: the pid alone
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return GONE
        except PermissionError:
            return ALIVE
        return ALIVE
    if found is None or found[1] in ("Z", "X"):  # no such process, or a zombie
        return GONE
    return ALIVE if found[0] == ticks else GONE


def _lock_holder(directory: Directory) -> dict[str, Any] | None:
    """Who holds the lock, from its file; None while its holder is still writing it."""
    try:
        record = json.loads(directory.read(LOCK, 1 << 16))
    except FileNotFoundError:
        return {}
    except ValueError:
        return None
    valid = isinstance(record, dict) and problem(dict(record, run_id="0" * 16, ended=None)) \
        is None
    return record if valid else None


@contextlib.contextmanager
def deciding(directory: Directory) -> Iterator[None]:
    """Hold ``run.json.lock`` in ``directory`` while reading and writing its claim.

    A lock held by a live job is waited for (its decision takes milliseconds), up to
    :data:`LOCK_WAIT_S` seconds. A lock whose holder has gone (it was killed while it
    decided) is never removed here (two jobs could both remove it, then both hold a
    lock): the message names the file to remove.

    Raises:
        UsageError: the lock is held too long, or left by a job that is gone or unknown.
    """
    started = time.monotonic()
    me = json.dumps(this_process())
    while True:
        try:
            with directory.create(LOCK, "w") as f:
                f.write(me)
                f.flush()
                os.fsync(f.fileno())
            break
        except FileExistsError:
            if directory.kind(LOCK) not in (None, "a regular file"):
                raise directory.wrong_kind(LOCK, directory.kind(LOCK) or "") from None
            record = _lock_holder(directory)
            if record == {}:  # removed meanwhile: try again at once
                continue
            state = UNKNOWN if record is None else holder(dict(record, ended=None))
            late = time.monotonic() - started > (LOCK_WAIT_S if record else UNREADABLE_S)
            if state == GONE or (late and state == UNKNOWN and record is not None):
                where = "" if state == GONE else " on another host, where minidp cannot see it"
                raise UsageError(
                    f"'{directory.path(LOCK)}' was left by {describe(record)}{where}, a job "
                    "that was opening this run directory and "
                    + ("is no longer running" if state == GONE else "may have ended")
                    + f"; if no job is starting in '{directory.path()}', remove that file and "
                    "run again") from None
            if late and record is None:
                raise UsageError(f"'{directory.path(LOCK)}' is not a lock minidp can read (it "
                                 "names no job); if no job is starting in "
                                 f"'{directory.path()}', remove it and run again") from None
            if late:
                raise UsageError(f"--out '{directory.path()}': {describe(record)} has been "
                                 f"opening it for over {LOCK_WAIT_S:.0f} s (it holds "
                                 f"'{directory.path(LOCK)}'); wait for that job, or choose "
                                 "another --out") from None
            time.sleep(0.05)
    try:
        yield
    finally:
        with contextlib.suppress(FileNotFoundError, WrongKind):
            directory.remove_file(LOCK)
