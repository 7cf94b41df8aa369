"""Run directories: one run per directory, never two runs mixed, and ``run.json``.

Without ``--out`` every run gets a directory of its own under ``runs/`` (relative to the
working directory), numbered as PyTorch Lightning numbers its ``version_N``::

    runs/0001/  runs/0002/  runs/latest -> 0002

The number is one past the highest there; the directory is made with ``os.mkdir``, which
fails if another job made it first, so two jobs started at once never share one (the
loser takes the next number). ``runs/latest`` is replaced atomically (a new link under a
temporary name, then ``os.replace``), so it always points at a whole run directory.

An explicit ``--out`` holding another run's files (:data:`RUN_FILES`) is refused unless
``--resume`` continues that run or ``--overwrite`` clears it first. ``--overwrite``
removes only minidp's own files and says which; anything else there is kept.

Rank 0 decides, then broadcasts, so every rank writes to the same place and raises the
same :class:`~minidp.run.config.UsageError` when the directory is refused.

``run.json``, written by rank 0 at the start (atomically), records what the run was:
configuration, versions, git commit, command line, world size, ranks per node, the host
of every rank and MPI's machines (shared-memory nodes), MPI library, ``SLURM_JOB_ID`` and
start time. A resumed run keeps the first record and appends one record per restart to its
``resumed`` list.
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

RUN_FILES = ("run.json", "metrics.jsonl", "summary.json", "model.npz", "checkpoints")
TRACE_FILES = ("trace.json", "trace-parts")
LATEST = "latest"


def run_files(path: str) -> list[str]:
    """The names of minidp's own run files in ``path`` (trace files included)."""
    if not os.path.isdir(path):
        return []
    return [name for name in RUN_FILES + TRACE_FILES
            if os.path.lexists(os.path.join(path, name))]


def clear_run(path: str) -> list[str]:
    """Remove minidp's run files from ``path`` (nothing else); returns the names removed."""
    removed = run_files(path)
    for name in removed:
        target = os.path.join(path, name)
        if os.path.isdir(target) and not os.path.islink(target):
            shutil.rmtree(target)
        else:
            os.remove(target)
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


def _decide(out: str | None, resume: str, overwrite: bool, base: str) -> tuple[str, bool]:
    """Rank 0's choice of (directory, resuming); raises UsageError when refused."""
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
        return path, False
    has_checkpoint = bool(checkpoint.complete(out))
    if resume == "yes" and not has_checkpoint:
        raise UsageError(f"--resume: no complete checkpoint in "
                         f"'{os.path.join(out, 'checkpoints')}'; allowed: the --out of a run "
                         "with --checkpoint-every, or --resume auto to start when there is none")
    if resume != "no" and has_checkpoint:
        return out, True
    found = run_files(out)
    if found and not overwrite and resume != "auto":
        raise UsageError(f"--out '{out}' holds another run ({', '.join(found)}); pass --resume "
                         "to continue it, --overwrite to replace it, or no --out for a new "
                         f"directory under {base}/")
    if found:
        why = "--overwrite" if overwrite else "--resume auto (no complete checkpoint)"
        print(f"{why}: removing {', '.join(found)} from '{out}'", flush=True)
        clear_run(out)
    os.makedirs(out, exist_ok=True)
    return out, False


def open_run(out: str | None, resume: str, overwrite: bool, comm: Communicator,
             base: str = "runs") -> tuple[str, bool]:
    """Collectively choose this run's directory; returns (path, whether to resume).

    Args:
        out: ``--out``, or None for a new numbered directory under ``base``.
        resume: ``"no"``, ``"yes"`` (``--resume``; without ``out``: ``base/latest``'s run)
            or ``"auto"`` (resume if ``out`` has a complete checkpoint, else start there).
        overwrite: clear minidp's files from ``out`` before starting.
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

    Args:
        path: the run directory.
        config: the resolved configuration (``dataclasses.asdict``).
        comm: every rank of the job.
        ranks_per_node: ranks of one node, as the topology sees them.
        resumed_from: the checkpoint's epoch when resuming: the record is appended to the
            ``resumed`` list of the existing run.json (kept whole), with ``from_epoch``.
    """
    record = run_record(config, comm, ranks_per_node)
    if comm.Get_rank():
        return
    target = os.path.join(path, "run.json")
    if resumed_from is not None:
        record["from_epoch"] = resumed_from
        try:
            with open(target) as f:
                first = json.load(f)
        except (OSError, ValueError):  # missing or unreadable: this record starts it anew
            first = dict(record, resumed=[])
        first.setdefault("resumed", []).append(record)
        record = first
    atomic_write(target, lambda f: json.dump(record, f, indent=1))
