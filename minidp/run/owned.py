"""What in a run directory is minidp's: its exact names, checked before a run starts there.

minidp writes only these names in a run directory, and touches nothing else there::

    run.json          the claim and the record of the run (:mod:`minidp.run.run_json`)
    run.json.lock     held while a job decides whether it may take the directory
    metrics.jsonl  summary.json  model.npz  events.json  trace.json      regular files
    checkpoints/      this run's checkpoints (NAME/meta.json, NAME/rank-RRRRR.npz,
                      :mod:`minidp.run.checkpoint`) and their scratch directories
                      (NAME.tmp-RUNID while written, NAME.old-RUNID while removed)
    trace-parts/      rank-RRRRR.json: each rank's part of trace.json while it is merged
    NAME.tmp-RUNID    an atomic write in progress of one of those files, by this run

Temporary names carry the run's id (its claim's), so a leftover of one of the run's own
killed jobs is recognised as the run's, and a user's ``summary.json.tmp-mine`` is not. A
checkpoint is the run's (:func:`as_checkpoint`) when its name is exactly a checkpoint's
(:data:`NAME`), it is a directory, and its ``meta.json`` is a regular file that matches
its CRC-32 and names the run's id and the directory's name; a copy of it elsewhere in
``checkpoints/`` (``epoch-0003-copy``, ``best/``) is the user's.

:func:`survey` looks at every one of those names before a run starts in the directory
(whether it starts, resumes or overwrites), without following a link. Anything under one
of them that is not what minidp wrote there (a directory or a link where minidp writes a
file, a FIFO, a checkpoint of another run, a damaged record) is a *problem*: the run is
refused, naming it, and nothing is touched. minidp would otherwise have to write past
it, follow it or remove it. Every other name in the directory is the user's and is never
looked at.

:func:`clear` (``--overwrite``) then removes what the survey found of the run's, and
only that: files that are regular files under minidp's names, this run's checkpoints
(renamed to a scratch name first, so a crash never leaves a checkpoint's name without
its record), its scratch directories and temporary files, its trace parts; a directory
is removed only once it is empty. A checkpoint holding a file minidp did not write
cannot be removed whole: ``--overwrite`` refuses before removing anything.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

from minidp.io.nofollow import REGULAR, Directory, WrongKind
from minidp.run.compatible import checksum

RUN_JSON = "run.json"
FILES = ("metrics.jsonl", "summary.json", "model.npz", "events.json", "trace.json")
DIRECTORY, PARTS = "checkpoints", "trace-parts"
# In the order messages list them.
NAMES = (RUN_JSON, "metrics.jsonl", "summary.json", "model.npz", "events.json", DIRECTORY,
         "trace.json", PARTS)
PART = re.compile(r"rank-\d{5,}\.json")  # in trace-parts/
# In checkpoints/: a checkpoint's name, and the files in it.
NAME = re.compile(r"epoch-\d{4,}(-batch-\d{5,})?")
META, RANK_FILE = "meta.json", re.compile(r"rank-\d{5,}\.npz")
META_LIMIT = 1 << 26  # bytes of a record; minidp's are kilobytes (one row per epoch)


@dataclasses.dataclass
class Found:
    """One checkpoint of this run: its directory name, record, and entries not minidp's."""

    name: str
    meta: dict[str, Any]
    others: list[str]


@dataclasses.dataclass
class Checkpoints:
    """What ``checkpoints/`` holds of this run (:func:`survey_checkpoints`).

    Attributes:
        found: this run's checkpoints, least recently written first.
        problems: every entry under one of minidp's exact names that is not this run's
            (the run refuses to start while there is one), as a sentence naming it.
        scratch: this run's scratch directories (``NAME.tmp-RUNID``, ``NAME.old-RUNID``).
    """

    found: list[Found] = dataclasses.field(default_factory=list)
    problems: list[str] = dataclasses.field(default_factory=list)
    scratch: list[str] = dataclasses.field(default_factory=list)


def _owned(entry: str) -> bool:
    return entry == META or bool(RANK_FILE.fullmatch(entry))


def as_checkpoint(ck: Directory, entry: str, run_id: str) -> Found | str:
    """``entry`` as this run's checkpoint, or why it is not one."""
    kind = ck.kind(entry)
    if kind != "a directory":
        return f"it is {kind}"
    try:
        with ck.child(entry) as d:
            meta = json.loads(d.read(META, META_LIMIT))
            others = [e for e in d.names() if not (_owned(e) and d.kind(e) == REGULAR)]
    except FileNotFoundError:
        return f"it has no {META}"
    except WrongKind:
        return f"its {META} is {d.kind(META)}"
    except (OSError, ValueError) as exc:
        return f"its {META} is unreadable ({exc})"
    if not isinstance(meta, dict) or not isinstance(meta.get("checksum"), int) \
            or not isinstance(meta.get("sequence"), int):
        return (f"its {META} has no run id, sequence or checksum (an older minidp's, or not "
                "minidp's)")
    if meta["checksum"] != checksum(meta):
        return (f"its {META} does not match its checksum (changed or damaged since it was "
                "written)")
    if meta.get("run_id") != run_id:
        return (f"it was written by another run (run id {meta.get('run_id')!r}, this run's is "
                f"{run_id!r})")
    return Found(entry, meta, others)


def _scratch_problem(ck: Directory, entry: str) -> str | None:
    """Why the run's scratch name ``entry`` holds something that is not minidp's, or None."""
    kind = ck.kind(entry)
    if kind != "a directory":
        return ck.not_minidps(entry, kind or "", "a directory")
    with ck.child(entry) as d:
        others = [e for e in d.names() if not (_owned(e) and d.kind(e) == REGULAR)]
    return (f"'{ck.path(entry)}' holds {', '.join(others)}, which minidp did not write"
            if others else None)


def survey_checkpoints(run: Directory, run_id: str) -> Checkpoints:
    """This run's checkpoints in the run directory ``run``, and what is in their way."""
    kind = run.kind(DIRECTORY)
    if kind is None:
        return Checkpoints()
    if kind != "a directory":
        return Checkpoints(problems=[run.not_minidps(DIRECTORY, kind, "a directory")])
    with run.child(DIRECTORY) as ck:
        return checkpoints_in(ck, run_id)


def checkpoints_in(ck: Directory, run_id: str) -> Checkpoints:
    """:func:`survey_checkpoints` of the open ``checkpoints/`` directory ``ck``."""
    result = Checkpoints()
    scratch = re.compile(rf"({NAME.pattern})\.(tmp|old)-{re.escape(run_id)}")
    for entry in ck.names():
        if scratch.fullmatch(entry):
            problem = _scratch_problem(ck, entry)
            if problem:
                result.problems.append(problem)
            else:
                result.scratch.append(entry)
        elif NAME.fullmatch(entry):
            found = as_checkpoint(ck, entry, run_id)
            if isinstance(found, Found):
                result.found.append(found)
            else:
                result.problems.append(f"'{ck.path(entry)}' is not a checkpoint of this run: "
                                       f"{found}")
    result.found.sort(key=lambda f: (f.meta["sequence"], f.name))
    return result


def written(out: str, run_id: str | None) -> list[str]:
    """This run's checkpoint directories in ``out``, oldest first ([] when none can be read)."""
    if run_id is None:
        return []
    try:
        with Directory.open(out) as run:
            found = survey_checkpoints(run, run_id).found
    except OSError:
        return []
    return [os.path.join(out, DIRECTORY, f.name) for f in found]


def discard(ck: Directory, entry: str) -> None:
    """Remove the directory ``entry`` that minidp made: its files, then itself.

    Raises:
        WrongKind: it holds something minidp did not write (which stays, as it is).
    """
    with ck.child(entry) as d:
        for inside in d.names():
            if _owned(inside) and d.kind(inside) == REGULAR:
                d.remove_file(inside)
        left = d.names()
    if left:
        raise WrongKind(f"'{ck.path(entry)}' holds {', '.join(left)}, which minidp did not "
                        "write; move them away")
    ck.remove_dir(entry)


def retire(ck: Directory, entry: str, run_id: str) -> None:
    """Remove this run's checkpoint ``entry``.

    It is renamed to a scratch name first, so a crash never leaves a checkpoint's name
    without its record.
    """
    retired = f"{entry}.old-{run_id}"
    if ck.kind(retired) is not None:
        discard(ck, retired)
    ck.rename(entry, retired)
    discard(ck, retired)


@dataclasses.dataclass
class Survey:
    """What a run directory holds under minidp's names (:func:`survey`).

    Attributes:
        names: minidp's names that are there (:data:`NAMES` order).
        problems: what is under them and not minidp's, one sentence each, naming it.
        checkpoints: the run's checkpoints, least recently written first.
        scratch: the run's checkpoint scratch directories.
        temporary: the run's temporary files (``NAME.tmp-RUNID``).
        parts: the run's entries in ``trace-parts/``.
    """

    names: list[str]
    problems: list[str] = dataclasses.field(default_factory=list)
    checkpoints: list[Found] = dataclasses.field(default_factory=list)
    scratch: list[str] = dataclasses.field(default_factory=list)
    temporary: list[str] = dataclasses.field(default_factory=list)
    parts: list[str] = dataclasses.field(default_factory=list)


def present(run: Directory) -> list[str]:
    """The names of minidp's that are in ``run``, whatever they hold (:data:`NAMES` order)."""
    return [n for n in NAMES if run.kind(n) is not None]


def _regular(run: Directory, name: str, problems: list[str]) -> bool:
    """Whether ``name`` holds a regular file; anything else there is added to ``problems``."""
    kind = run.kind(name)
    if kind not in (None, REGULAR):
        problems.append(run.not_minidps(name, kind))
    return kind == REGULAR


def survey(run: Directory, run_id: str) -> Survey:
    """Everything under minidp's names in ``run``, checked for the run ``run_id`` (module doc)."""
    found = Survey(present(run))
    for name in (RUN_JSON, *FILES):
        _regular(run, name, found.problems)
        tmp = f"{name}.tmp-{run_id}"
        if _regular(run, tmp, found.problems):
            found.temporary.append(tmp)
    ours = survey_checkpoints(run, run_id)
    found.problems += ours.problems
    found.checkpoints, found.scratch = ours.found, ours.scratch
    kind = run.kind(PARTS)
    if kind not in (None, "a directory"):
        found.problems.append(run.not_minidps(PARTS, kind, "a directory"))
    elif kind is not None:
        part = re.compile(rf"{PART.pattern}(\.tmp-{re.escape(run_id)})?")
        with run.child(PARTS) as parts:
            for entry in parts.names():
                if part.fullmatch(entry) and _regular(parts, entry, found.problems):
                    found.parts.append(entry)
    return found


def removal_problems(found: Survey) -> list[str]:
    """What ``--overwrite`` could not remove whole: the run's checkpoints holding others' files."""
    return [f"'{DIRECTORY}/{f.name}' holds {', '.join(f.others)}, which minidp did "
            "not write" for f in found.checkpoints if f.others]


def clear(run: Directory, found: Survey, run_id: str) -> None:
    """Remove what ``found`` (a survey of ``run`` for ``run_id``, without problems) holds.

    ``run.json`` stays: the caller replaces it with the new claim.
    """
    for name in (*FILES, *found.temporary):
        run.remove_file(name)
    if DIRECTORY in found.names:
        with run.child(DIRECTORY) as ck:
            for scratch in found.scratch:
                discard(ck, scratch)
            for f in found.checkpoints:
                retire(ck, f.name, run_id)
            empty = not ck.names()
        if empty:
            run.remove_dir(DIRECTORY)
    if PARTS in found.names:
        with run.child(PARTS) as parts:
            for entry in found.parts:
                parts.remove_file(entry)
            empty = not parts.names()
        if empty:
            run.remove_dir(PARTS)
