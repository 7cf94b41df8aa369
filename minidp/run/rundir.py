"""Run directories: one run per directory, one live job per run, nothing touched but minidp's.

Without ``--out`` every run gets a directory of its own under ``runs/`` (relative to the
working directory), numbered as PyTorch Lightning numbers its ``version_N``::

    runs/0001/  runs/0002/  runs/latest -> 0002

The number is one past the highest there; the directory is made with ``os.mkdir``, which
fails if another job made it first, so two jobs started at once never share one (the
loser takes the next number). ``runs/latest`` is minidp's when it is a link to a bare
number beside it; only then is it replaced (atomically: a new link under a temporary
name, then ``os.replace``), and only then does ``--resume`` without ``--out`` follow it.
Anything else named ``latest`` (a directory of an older minidp, a user's file or link)
is left as it is, with a note.

**Deciding** (:func:`open_run`): rank 0 decides, then broadcasts, so every rank writes to
the same place and raises the same :class:`~minidp.run.errors.UsageError` when the
directory is refused. The decision holds the claim's lock (:func:`minidp.run.claim.deciding`):

1. ``run.json`` (:mod:`minidp.run.run_json`): with none, the directory must hold none of
   minidp's names (else they are someone else's: refused, naming them); the job claims
   it, exclusively, and starts. A ``run.json`` that holds no claim of minidp's is refused.
2. The job that holds the claim (:func:`minidp.run.claim.holder`): alive, or on a host
   minidp cannot see, and never released: refused, naming that job (never told to
   ``--overwrite``: two jobs must not write one run). Gone: taken over, with a note.
   Released: taken over.
3. Everything under minidp's names is surveyed (:mod:`minidp.run.owned`): anything there
   that minidp did not write (a link, a directory where a file goes, another run's
   checkpoint) is refused, naming it, whatever the flags.
4. Then: ``--resume`` or ``--resume auto`` with a checkpoint of this run continues it
   (the claim taken over, the run's id kept). ``--overwrite`` removes the run's files
   (:func:`minidp.run.owned.clear`) and claims the directory for a new run (a new id).
   ``--resume`` without a checkpoint, ``--resume auto`` of a run without one (it never
   deletes) and no flag on an existing run are refused, saying what to do.

An ``--out`` that cannot be made or written is one line naming it and what to do.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import sys
from typing import NamedTuple

from minidp.comm import Communicator, guard
from minidp.io.nofollow import LEAVE_IT, Directory, kind_of
from minidp.run import claim, owned, run_json
from minidp.run.claim import MARKER
from minidp.run.errors import UsageError

LATEST = "latest"
NUMBER = re.compile(r"\d{4,}")
ADVICE = {errno.EACCES: "choose a --out where you may write (or change its permissions)",
          errno.EPERM: "choose a --out where you may write (or change its permissions)",
          errno.EROFS: "its file system is read-only: choose a --out on a writable one",
          errno.ENOTDIR: "a part of that path is a file, not a directory: choose another --out",
          errno.ENOSPC: "free space there, or choose a --out on another file system",
          errno.EDQUOT: "free space there (a quota), or choose a --out on another file system"}


class Opened(NamedTuple):
    """The run directory a job writes: its path, whether it resumes, the run's id."""

    path: str
    resuming: bool
    run_id: str


def unusable(out: str, exc: OSError) -> str:
    """One line for an ``--out`` that cannot be made or written: the path, why, what to do."""
    if exc.errno is None:  # minidp's own message (a WrongKind): it names the path
        return str(exc)
    where = exc.filename or out
    return (f"--out '{out}': cannot create or write the run directory ('{where}': "
            f"{exc.strerror} ({errno.errorcode.get(exc.errno, exc.errno)})); "
            f"{ADVICE.get(exc.errno, 'choose another --out')}")


def _not_ours(out: str, names: list[str], why: str | None) -> UsageError:
    reason = why or "its run.json is missing"
    return UsageError(f"--out '{out}' holds {', '.join(names) or 'run.json'} but no run of "
                      f"minidp's ({reason}), and minidp touches only what it wrote; move them "
                      "away, or choose another --out")


def _held(out: str, holder: dict, state: str) -> UsageError:
    """The refusal of a directory whose job runs (or may run, unseen on another host)."""
    if state == claim.ALIVE:
        return UsageError(f"--out '{out}' is in use by a running job: {claim.describe(holder)}"
                          ", from its run.json; one job writes a run directory at a time: wait "
                          "for that job to end, or choose another --out")
    return UsageError(f"--out '{out}' is held by {claim.describe(holder)}, which minidp cannot "
                      f"see from host {claim.this_process()['host']}, and its claim was never "
                      "released, so it may still run: if it has ended, run this on host "
                      f"{holder['host']} (where minidp can tell), or choose another --out")


def _claim_anew(run: Directory, fresh: bool) -> str:
    """Write a new run's claim as ``run.json``; returns the run's id."""
    record = {MARKER: claim.new_claim()}
    run_json.write_claim(run, record, fresh)
    return record[MARKER]["run_id"]


def _note_gone(out: str, holder: dict, state: str) -> None:
    if state == claim.GONE:
        print(f"note: --out '{out}' was held by {claim.describe(holder)}, which is no longer "
              "running (it ended without releasing it: killed?); this job takes it over",
              flush=True)


def _decide_in(run: Directory, out: str, resume: str, overwrite: bool, base: str) -> Opened:
    """The decision for the open directory ``run`` (``--out`` ``out``), its lock held."""
    record, why = run_json.read(run)
    if record is None:
        names = owned.present(run)
        if why is not None or names:
            raise _not_ours(out, names, why)
        if resume == "yes":
            raise UsageError(f"--resume: '{out}' holds no run to continue")
        return Opened(out, False, _claim_anew(run, fresh=True))
    holder = record[MARKER]
    state = claim.holder(holder)
    if state in (claim.ALIVE, claim.UNKNOWN):
        raise _held(out, holder, state)
    run_id = holder["run_id"]
    found = owned.survey(run, run_id)
    if found.problems:
        raise UsageError(f"--out '{out}': {'; '.join(found.problems)}; {LEAVE_IT}")
    if resume != "no" and found.checkpoints:
        _note_gone(out, holder, state)
        record[MARKER] = claim.new_claim(run_id)  # the run goes on: its id stays
        run_json.write_claim(run, record, fresh=False)
        return Opened(out, True, run_id)
    who = claim.describe(holder)
    if resume == "yes":
        raise UsageError(f"--resume: no complete checkpoint of the run in "
                         f"'{os.path.join(out, owned.DIRECTORY)}'; allowed: the --out of a "
                         "run with --checkpoint-every, or --resume auto to start when there is "
                         "none")
    if resume == "auto":
        raise UsageError(f"--resume auto: '{out}' holds a run of minidp's ({who}: "
                         f"{', '.join(found.names)}) with no complete checkpoint to continue; "
                         "--resume auto never deletes: pass --overwrite (instead of --resume "
                         "auto) to replace it, or choose another --out")
    if not overwrite:
        raise UsageError(f"--out '{out}' holds another run ({', '.join(found.names)}; {who});"
                         " pass --resume to continue it, --overwrite to replace it, or no --out "
                         f"for a new directory under {base}/")
    kept = owned.removal_problems(found)
    if kept:
        raise UsageError(f"--overwrite: '{out}' cannot be cleared: {'; '.join(kept)}; minidp "
                         "removes only what it wrote: move them away")
    _note_gone(out, holder, state)
    print(f"--overwrite: removing {', '.join(found.names)} from '{out}'", flush=True)
    owned.clear(run, found, run_id)
    return Opened(out, False, _claim_anew(run, fresh=False))


def _open(out: str, resume: str, overwrite: bool, base: str) -> Opened:
    """Open (or make) ``out`` and decide under its claim's lock."""
    if resume == "yes" and not os.path.isdir(out):
        raise UsageError(f"--resume: no complete checkpoint in "
                         f"'{os.path.join(out, owned.DIRECTORY)}' ('{out}' is not a "
                         "directory)")
    with Directory.open(out, create=True) as run, claim.deciding(run):
        return _decide_in(run, out, resume, overwrite, base)


def latest_run(base: str) -> str:
    """The run directory that ``base/latest`` names.

    Only minidp's link (or an older minidp's directory of that name) is followed.

    Raises:
        UsageError: there is none, or it is anything else (named).
    """
    latest = os.path.join(base, LATEST)
    try:
        found = os.lstat(latest)
    except FileNotFoundError:
        raise UsageError(f"--resume: no --out given and '{latest}' does not exist; allowed: "
                         "--out DIR of the run to continue") from None
    if stat.S_ISDIR(found.st_mode):
        return latest  # an older minidp's default --out: a run directory itself
    target = os.readlink(latest) if stat.S_ISLNK(found.st_mode) else None
    if target is None or not NUMBER.fullmatch(target):
        what = f"a link to '{target}'" if target is not None else kind_of(found.st_mode)
        raise UsageError(f"--resume: no --out given, and '{latest}' is {what}, not minidp's "
                         f"link to a run directory beside it ({base}/NNNN); pass --out DIR of "
                         "the run to continue")
    return os.path.join(base, target)


def _decide(out: str | None, resume: str, overwrite: bool, base: str) -> Opened:
    """Rank 0's choice of directory, claimed; raises UsageError when refused."""
    if out is None and resume == "auto":
        raise UsageError("--resume auto: needs --out DIR, the directory this job writes "
                         f"whenever it runs ({base}/{LATEST} may be another job's run)")
    if out is None and resume == "yes":
        out = latest_run(base)
    if out is not None:
        return _open(out, resume, overwrite, base)
    return _open(new_run_dir(base), "no", False, base)


def resumable(out: str | None, resume: str, base: str = "runs") -> str | None:
    """The checkpoint a run of ``--out``/``--resume`` would continue, if there is one.

    For the message of a run stopped before it started: never raises, never blocks.
    """
    if resume == "no" or (out is None and resume != "yes"):
        return None
    try:
        path = out if out is not None else latest_run(base)
    except (UsageError, OSError):
        return None
    record = run_json.read_run_json(path)
    written = owned.written(path, record[MARKER]["run_id"]) if record else []
    return written[-1] if written else None


def open_run(out: str | None, resume: str, overwrite: bool, comm: Communicator,
             base: str = "runs") -> Opened:
    """Collectively choose (and claim) this run's directory (module doc).

    Args:
        out: ``--out``, or None for a new numbered directory under ``base``.
        resume: ``"no"``, ``"yes"`` (``--resume``; without ``out``: ``base/latest``'s run)
            or ``"auto"`` (resume if ``out`` has a checkpoint of its run, else start there).
        overwrite: clear minidp's run from ``out`` before starting a new one there.
        comm: every rank of the job; rank 0 decides and makes the directory.
        base: where numbered directories go.

    Raises:
        UsageError: on every rank, when the directory is refused.
    """
    decision: Opened | str = ""
    if comm.Get_rank() == 0:
        try:
            decision = _decide(out, resume, overwrite, base)
        except UsageError as exc:
            decision = str(exc)
        except OSError as exc:
            decision = unusable(out if out is not None else base, exc)
    decision = guard.bcast_object(comm, decision, 0, "open run directory")
    if isinstance(decision, str):
        raise UsageError(decision)
    return Opened(*decision)


def new_run_dir(base: str = "runs") -> str:
    """Make ``base/NNNN``, one past the highest number there, and point ``base/latest`` at it."""
    os.makedirs(base, exist_ok=True)
    numbers = [int(n) for n in os.listdir(base) if NUMBER.fullmatch(n)]
    number = max(numbers, default=0) + 1
    while True:
        name = f"{number:04d}"
        try:
            os.mkdir(os.path.join(base, name))
            break
        except FileExistsError:  # another job took it a moment ago
            number += 1
    path = os.path.join(base, name)
    if not point_latest(base, name):
        latest = os.path.join(base, LATEST)
        print(f"note: '{latest}' is not minidp's link (it is "
              f"{kind_of(os.lstat(latest).st_mode)}); it is left as it is, this run writes to "
              f"'{path}'", file=sys.stderr)
    return path


def point_latest(base: str, name: str) -> bool:
    """Atomically make ``base/latest`` a link to ``name``.

    Returns False (and does nothing) when the name holds anything but minidp's link
    (module doc).
    """
    latest = os.path.join(base, LATEST)
    if os.path.lexists(latest) and not (os.path.islink(latest)
                                        and NUMBER.fullmatch(os.readlink(latest))):
        return False
    tmp = os.path.join(base, f".{LATEST}-{os.getpid()}-{os.urandom(4).hex()}")
    os.symlink(name, tmp)
    try:
        os.replace(tmp, latest)
    except OSError:  # replaced by a directory meanwhile: it stays
        os.remove(tmp)
        return False
    return True
