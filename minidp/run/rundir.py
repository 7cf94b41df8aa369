"""Run directories: one run per directory, never two runs mixed, and ``run.json``.

Without ``--out`` every run gets a directory of its own under ``runs/`` (relative to the
working directory), numbered as PyTorch Lightning numbers its ``version_N``::

    runs/0001/  runs/0002/  runs/latest -> 0002

The number is one past the highest there; the directory is made with ``os.mkdir``, which
fails if another job made it first, so two jobs started at once never share one (the
loser takes the next number). ``runs/latest`` is replaced atomically (a new link under a
temporary name, then ``os.replace``), so it always points at a whole run directory.

**The claim.** ``run.json`` is the marker minidp owns: a run creates it exclusively
(``link``, which fails on an existing name as ``O_CREAT | O_EXCL`` does) before it writes
anything else there, holding :data:`MARKER` (the process id, host and time of the
claim). Exactly one of two jobs started together on one ``--out`` creates it; the other
is refused, naming the first (:func:`claim`). A directory is *minidp's run* when its
``run.json`` holds the marker.

**Nothing minidp did not write is deleted.** ``--overwrite`` removes minidp's own files
(:data:`RUN_FILES`, :data:`TRACE_FILES`; inside ``checkpoints/`` only checkpoint
directories, inside ``trace-parts/`` only rank parts) and only from a directory that is
minidp's run; anything else there is kept. An ``--out`` holding files of those names
without minidp's ``run.json`` is refused, naming them. ``--resume auto`` never deletes:
with a complete checkpoint it resumes; in a directory with no run of minidp's it starts
(refusing if minidp's file names are there); in minidp's run with no checkpoint it
refuses, saying what to do.

Rank 0 decides, then broadcasts, so every rank writes to the same place and raises the
same :class:`~minidp.run.config.UsageError` when the directory is refused.

``run.json``, rewritten by rank 0 once the run starts (atomically, the marker kept),
records what the run was: configuration, versions, git commit, command line, world size,
ranks per node, the host of every rank and MPI's machines (shared-memory nodes), MPI
library, ``SLURM_JOB_ID`` and start time. A resumed run keeps the first record and
appends one record per restart to its ``resumed`` list, with the settings that changed
(``--lr``, ``--epochs``).
"""

from __future__ import annotations

import datetime
import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from typing import Any

import minidp
from minidp.comm import Communicator, guard, mpi_library, versions
from minidp.comm.topology import machines
from minidp.io.atomic import atomic_write
from minidp.run import checkpoint
from minidp.run.errors import UsageError

RUN_FILES = ("run.json", "metrics.jsonl", "summary.json", "model.npz", "events.json",
             "checkpoints")
TRACE_FILES = ("trace.json", "trace-parts")
LATEST = "latest"
MARKER = "minidp_run"  # run.json's key: the claim (pid, host, time) that makes it minidp's
# What minidp writes inside its two directories: checkpoints (and their .tmp while written),
# and each rank's trace part (and its atomic write's temporary name).
OWN_ENTRIES = {"checkpoints": re.compile(r"epoch-\d{4,}(-batch-\d{5,})?(\.tmp)?"),
               "trace-parts": re.compile(r"rank-\d{5,}\.json(\.tmp-\d+)?")}


def run_files(path: str) -> list[str]:
    """The names of minidp's own run files in ``path`` (trace files included)."""
    if not os.path.isdir(path):
        return []
    return [name for name in RUN_FILES + TRACE_FILES
            if os.path.lexists(os.path.join(path, name))]


def _json_object(path: str) -> dict[str, Any] | None:
    """The JSON object in the file ``path``, or None (missing, unreadable, not an object)."""
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def read_run_json(path: str) -> dict[str, Any] | None:
    """``path/run.json`` as a dict if it is minidp's (it holds :data:`MARKER`), else None."""
    record = _json_object(os.path.join(path, "run.json"))
    return record if record is not None and isinstance(record.get(MARKER), dict) else None


def _who(record: dict[str, Any] | None) -> str:
    """``pid P on host H at T``: the job that claimed a directory, from its run.json."""
    claim = (record or {}).get(MARKER) or {}
    return (f"pid {claim.get('pid', '?')} on host {claim.get('host', '?')} at "
            f"{claim.get('time', '?')}")


def claim(path: str) -> None:
    """Make ``path`` (created if missing) this job's: create its run.json exclusively.

    The claim is written whole to a temporary name, then hard-linked as ``run.json``:
    ``link`` fails when the name exists, as ``open(O_CREAT | O_EXCL)`` does, and the
    other job never reads a run.json that is still empty.

    Raises:
        UsageError: another job created run.json first (the message names it).
    """
    os.makedirs(path, exist_ok=True)
    target = os.path.join(path, "run.json")
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    record = {MARKER: {"pid": os.getpid(), "host": socket.gethostname(), "time": now}}
    tmp = f"{target}.tmp-claim-{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(record, f)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, target)
    except FileExistsError:
        raise UsageError(f"--out '{path}' was claimed by another job ({_who(read_run_json(path))}"
                         ", from its run.json); wait for it to end, or choose another --out") \
            from None
    finally:
        os.remove(tmp)


def _remove(target: str) -> None:
    if os.path.isdir(target) and not os.path.islink(target):
        shutil.rmtree(target)
    else:
        os.remove(target)


def clear_run(path: str) -> list[str]:
    """Remove minidp's run files from ``path`` (nothing else); returns the names removed.

    Inside ``checkpoints/`` and ``trace-parts/`` only minidp's entries go
    (:data:`OWN_ENTRIES`); the directory itself goes once it is empty.
    """
    removed = run_files(path)
    for name in removed:
        target = os.path.join(path, name)
        if name in OWN_ENTRIES and os.path.isdir(target) and not os.path.islink(target):
            for entry in os.listdir(target):
                if OWN_ENTRIES[name].fullmatch(entry):
                    _remove(os.path.join(target, entry))
            if not os.listdir(target):
                os.rmdir(target)
        else:
            _remove(target)
    for name in RUN_FILES + TRACE_FILES:  # interrupted atomic writes of those files
        for tmp in glob.glob(os.path.join(glob.escape(path), f"{name}.tmp-*")):
            os.remove(tmp)
    return removed


def new_run_dir(base: str = "runs") -> str:
    """Make ``base/NNNN``, one past the highest number there, and point ``base/latest`` at it."""
    os.makedirs(base, exist_ok=True)
    numbers = [int(n) for n in os.listdir(base) if re.fullmatch(r"\d{4,}", n)]
    number = max(numbers, default=0) + 1
    while True:
        name = f"{number:04d}"
        try:
            os.mkdir(os.path.join(base, name))
            break
        except FileExistsError:  # another job took it a moment ago
            number += 1
    point_latest(base, name)
    return os.path.join(base, name)


def point_latest(base: str, name: str) -> bool:
    """Atomically make ``base/latest`` a link to ``name``; False if a real directory is there.

    A ``runs/latest`` directory of an older minidp (whose default ``--out`` it was) is
    left alone: it holds a run.
    """
    latest = os.path.join(base, LATEST)
    if os.path.isdir(latest) and not os.path.islink(latest):
        return False
    tmp = os.path.join(base, f".{LATEST}-{os.getpid()}-{os.urandom(4).hex()}")
    os.symlink(name, tmp)
    os.replace(tmp, latest)
    return True


def _not_ours(out: str, found: list[str]) -> UsageError:
    return UsageError(f"--out '{out}' holds {', '.join(found)} but no run of minidp's (its "
                      "run.json is missing or not minidp's), and minidp deletes only what it "
                      "wrote; move them away, or choose another --out")


def _decide(out: str | None, resume: str, overwrite: bool, base: str) -> tuple[str, bool]:
    """Rank 0's choice of (directory, resuming), claimed; raises UsageError when refused."""
    if out is None and resume == "auto":
        raise UsageError("--resume auto: needs --out DIR, the directory this job writes "
                         f"whenever it runs ({base}/{LATEST} may be another job's run)")
    if out is None and resume == "yes":
        latest = os.path.join(base, LATEST)
        if not os.path.lexists(latest):
            raise UsageError(f"--resume: no --out given and '{latest}' does not exist; "
                             "allowed: --out DIR of the run to continue")
        out = os.path.join(base, os.readlink(latest)) if os.path.islink(latest) else latest
    if out is None:
        path = new_run_dir(base)
        if not os.path.islink(os.path.join(base, LATEST)):
            print(f"note: '{base}/{LATEST}' is a directory (an older minidp's output), not a "
                  f"link; it is left as it is, this run writes to '{path}'", file=sys.stderr)
        claim(path)
        return path, False
    has_checkpoint = bool(checkpoint.complete(out))
    if resume == "yes" and not has_checkpoint:
        raise UsageError(f"--resume: no complete checkpoint in "
                         f"'{os.path.join(out, 'checkpoints')}'; allowed: the --out of a run "
                         "with --checkpoint-every, or --resume auto to start when there is none")
    if resume != "no" and has_checkpoint:
        return out, True
    found, ours = run_files(out), read_run_json(out)
    if found and ours is None:
        raise _not_ours(out, found)
    if found and resume == "auto":
        raise UsageError(f"--resume auto: '{out}' holds a run of minidp's ({_who(ours)}: "
                         f"{', '.join(found)}) with no complete checkpoint to continue; "
                         "--resume auto never deletes: pass --overwrite (instead of --resume "
                         "auto) to replace it, or choose another --out")
    if found and not overwrite:
        raise UsageError(f"--out '{out}' holds another run ({', '.join(found)}; {_who(ours)}); "
                         "pass --resume to continue it, --overwrite to replace it, or no --out "
                         f"for a new directory under {base}/")
    if found:
        print(f"--overwrite: removing {', '.join(found)} from '{out}'", flush=True)
        clear_run(out)
    claim(out)
    return out, False


def resumable(out: str | None, resume: str, base: str = "runs") -> str | None:
    """The checkpoint a run of ``--out``/``--resume`` would continue, if there is one."""
    if resume == "no" or (out is None and resume != "yes"):
        return None
    written = checkpoint.complete(out if out is not None else os.path.join(base, LATEST))
    return written[-1] if written else None


def open_run(out: str | None, resume: str, overwrite: bool, comm: Communicator,
             base: str = "runs") -> tuple[str, bool]:
    """Collectively choose (and claim) this run's directory; returns (path, whether to resume).

    Args:
        out: ``--out``, or None for a new numbered directory under ``base``.
        resume: ``"no"``, ``"yes"`` (``--resume``; without ``out``: ``base/latest``'s run)
            or ``"auto"`` (resume if ``out`` has a complete checkpoint, else start there).
        overwrite: clear minidp's files from ``out`` (minidp's run only) before starting.
        comm: every rank of the job; rank 0 decides and makes the directory.
        base: where numbered directories go.

    Raises:
        UsageError: on every rank, when the directory is refused.
    """
    decision: tuple[str, bool] | str = ""
    if comm.Get_rank() == 0:
        try:
            decision = _decide(out, resume, overwrite, base)
        except UsageError as exc:
            decision = str(exc)
        except OSError as exc:
            decision = f"--out: {exc}"
    decision = guard.bcast_object(comm, decision, 0, "open run directory")
    if isinstance(decision, str):
        raise UsageError(decision)
    return decision


def git_commit(directory: str) -> str | None:
    """HEAD of the git work tree that tracks the package in ``directory``, else None."""
    try:
        tracked = subprocess.run(["git", "-C", directory, "ls-files", "--error-unmatch",
                                  "__init__.py"], capture_output=True, timeout=10)
        head = subprocess.run(["git", "-C", directory, "rev-parse", "HEAD"],
                              capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    if tracked.returncode or head.returncode:
        return None
    return head.stdout.strip() or None


def run_record(config: dict[str, Any], comm: Communicator, ranks_per_node: int) -> dict[str, Any]:
    """What ``run.json`` says about this start (collective: every rank's host is gathered).

    ``hosts`` is every rank's hostname; ``machines`` MPI's shared-memory nodes with their
    hosts and ranks (one per host on a cluster); ``nodes`` says whether the run's nodes
    are those (``"machines"``) or virtual nodes of ``--ranks-per-node`` (``"virtual"``).
    """
    hosts = guard.allgather_object(comm, socket.gethostname(), "run.json hosts")
    record = {
        "config": config,
        "versions": versions(),
        "git_commit": git_commit(os.path.dirname(os.path.abspath(minidp.__file__))),
        "command": list(sys.argv),
        "world_size": comm.Get_size(), "ranks_per_node": ranks_per_node, "hosts": hosts,
        "machines": machines(comm),
        "nodes": "machines" if config.get("ranks_per_node") is None else "virtual",
        "mpi_library": mpi_library(),
        "start_time": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if os.environ.get("SLURM_JOB_ID"):
        record["slurm_job_id"] = os.environ["SLURM_JOB_ID"]
    return record


def write_run_json(path: str, config: dict[str, Any], comm: Communicator, ranks_per_node: int,
                   resumed_from: int | None = None) -> None:
    """Collectively record this start in ``path/run.json`` (rank 0 writes, atomically).

    The claim (:data:`MARKER`) of the file there is kept (this process's when there is
    none), so the directory stays minidp's run.

    Args:
        path: the run directory.
        config: the resolved configuration (``dataclasses.asdict``).
        comm: every rank of the job.
        ranks_per_node: ranks of one node, as the topology sees them.
        resumed_from: the checkpoint's epoch when resuming: the record is appended to the
            ``resumed`` list of the existing run.json (kept whole), with ``from_epoch``
            and ``changed``: each setting whose value differs from the previous start's,
            as ``[before, now]`` (a new ``--lr`` after a divergence, more ``--epochs``).
    """
    record = run_record(config, comm, ranks_per_node)
    if comm.Get_rank():
        return
    target = os.path.join(path, "run.json")
    found = _json_object(target) or {}
    claimed = found.get(MARKER) if isinstance(found.get(MARKER), dict) else {
        "pid": os.getpid(), "host": socket.gethostname(), "time": record["start_time"]}
    if resumed_from is not None:
        record["from_epoch"] = resumed_from
        if not isinstance(found.get("config"), dict):  # missing or unreadable: starts anew
            found = dict(record, resumed=[])
        runs = found.get("resumed") if isinstance(found.get("resumed"), list) else []
        previous = (runs or [found])[-1].get("config") or {}
        record["changed"] = {k: [previous.get(k), v] for k, v in config.items()
                             if k not in ("resume", "overwrite") and previous.get(k) != v}
        found["resumed"] = runs + [record]
        record = found
    record[MARKER] = claimed
    atomic_write(target, lambda f: json.dump(record, f, indent=1))
