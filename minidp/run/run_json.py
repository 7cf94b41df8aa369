"""``run.json``: the claim of the job that holds a run directory, and the record of the run.

The claim (the entry ``minidp_run``, :mod:`minidp.run.claim`) is the first thing a run
writes in its directory: whole, to a temporary name, then hard-linked as ``run.json``
(``link`` never replaces, so a claim never lands over another's). A job that takes over
a run (``--resume`` after the holder ended) or replaces it (``--overwrite``) writes its
claim atomically over the old one, under the claim's lock. The job releases its claim
when it ends (:func:`release`), whatever the outcome: the next job then takes the run
without a word.

Once the run starts, rank 0 rewrites ``run.json`` (atomically, the claim kept) with what
the run was: configuration, versions, git commit, command line, world size, ranks per
node, the host of every rank and MPI's machines (shared-memory nodes), MPI library,
``SLURM_JOB_ID`` and start time. A resumed run keeps the first record and appends one
record per restart to its ``resumed`` list, with the settings that changed (``--lr``,
``--epochs``).

``run.json`` is read without following a link and only when it is a regular file (a
FIFO under its name would block a reader): :func:`read` says why it is not a claim.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import socket
import subprocess
import sys
from typing import Any

import minidp
from minidp.comm import Communicator, guard, mpi_library, versions
from minidp.comm.topology import machines
from minidp.io.atomic import write_into
from minidp.io.nofollow import Directory, WrongKind
from minidp.run import claim
from minidp.run.claim import MARKER

RUN_JSON = "run.json"
LIMIT = 1 << 26  # bytes: a record grows by one entry per resume


def read(run: Directory) -> tuple[dict[str, Any] | None, str | None]:
    """``run.json`` of ``run``: (its record, None) when it holds a valid claim.

    Returns (None, None) when there is no ``run.json``, (None, why) when there is one that
    is not minidp's claim (not a regular file, not JSON, no valid claim in it).
    """
    try:
        record = json.loads(run.read(RUN_JSON, LIMIT))
    except FileNotFoundError:
        return None, None
    except WrongKind:
        return None, f"'{run.path(RUN_JSON)}' is {run.kind(RUN_JSON)}"
    except (OSError, ValueError) as exc:
        return None, f"'{run.path(RUN_JSON)}' is unreadable ({exc})"
    if not isinstance(record, dict) or MARKER not in record:
        return None, f"'{run.path(RUN_JSON)}' holds no claim of minidp's"
    problem = claim.problem(record[MARKER])
    return (record, None) if problem is None else (None, f"'{run.path(RUN_JSON)}': {problem}")


def read_run_json(path: str) -> dict[str, Any] | None:
    """``path/run.json`` when it holds minidp's claim, else None (nothing raised)."""
    try:
        with Directory.open(path) as run:
            return read(run)[0]
    except OSError:
        return None


def write_claim(run: Directory, record: dict[str, Any], fresh: bool) -> None:
    """Write ``record`` (holding a claim) as ``run.json`` of ``run``.

    Args:
        run: the run directory.
        record: the whole run.json (the claim under :data:`MARKER`).
        fresh: no run.json may be there: it is made whole under a temporary name and
            linked (FileExistsError if one appeared); else the one there is replaced.
    """
    write_into(run, RUN_JSON, lambda f: json.dump(record, f, indent=1),
               tag=record[MARKER]["run_id"], exclusive=fresh)


def release(path: str, run_id: str) -> None:
    """Mark this process's claim of ``path`` as ended (nothing if it is not this process's).

    Best effort, at the end of a job whatever its outcome: a claim that could not be
    released (a full disk, a killed job) is taken over later all the same, once its
    process is seen to be gone (:func:`minidp.run.claim.holder`).
    """
    with contextlib.suppress(OSError):
        with Directory.open(path) as run:
            record, _ = read(run)
            if record is None or record[MARKER].get("run_id") != run_id or \
                    claim.holder(record[MARKER]) != claim.SELF:
                return
            record[MARKER]["ended"] = claim.this_process()["time"]
            write_claim(run, record, fresh=False)


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
    The git commit is asked on rank 0 only, the rank that writes the record: each ask
    starts two ``git`` processes, a fork of the whole rank each, which a job of a thousand
    ranks on one shared file system would otherwise start two thousand times.
    """
    hosts = guard.allgather_object(comm, socket.gethostname(), "run.json hosts")
    package = os.path.dirname(os.path.abspath(minidp.__file__))
    record = {
        "config": config,
        "versions": versions(),
        "git_commit": None if comm.Get_rank() else git_commit(package),
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


def write_run_json(path: str, run_id: str, config: dict[str, Any], comm: Communicator,
                   ranks_per_node: int, resumed_from: int | None = None) -> None:
    """Collectively record this start in ``path/run.json`` (rank 0 writes, atomically).

    The claim there is kept (this process's claim of ``run_id`` when there is none of
    that run), so the directory stays this job's.

    Args:
        path: the run directory.
        run_id: the run's id.
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
    with Directory.open(path) as run:
        found = read(run)[0] or {}
        claimed = found.get(MARKER) or {}
        if claimed.get("run_id") != run_id:
            claimed = claim.new_claim(run_id)
        if resumed_from is not None:
            record["from_epoch"] = resumed_from
            if not isinstance(found.get("config"), dict):  # missing or unreadable: starts anew
                found = dict(record, resumed=[])
            runs = found.get("resumed") if isinstance(found.get("resumed"), list) else []
            runs = [r for r in runs if isinstance(r, dict)]  # a hand-edited entry is dropped
            previous = (runs or [found])[-1].get("config")
            previous = previous if isinstance(previous, dict) else {}
            record["changed"] = {k: [previous.get(k), v] for k, v in config.items()
                                 if k not in ("resume", "overwrite") and previous.get(k) != v}
            found["resumed"] = runs + [record]
            record = found
        record[MARKER] = claimed
        write_claim(run, record, fresh=False)
