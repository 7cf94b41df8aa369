"""What in a run directory is minidp's: its exact names, checked before a run starts there.

minidp writes only these names in a run directory, and touches nothing else there::

    run.json          the claim and the record of the run (:mod:`minidp.run.run_json`)
    run.json.lock     held while a job decides whether it may take the directory
    metrics.jsonl  summary.json  model.npz  events.json  trace.json      regular files
    checkpoints/      this run's checkpoints and their scratch directories
                      (:mod:`minidp.run.checkpoint`)
    trace-parts/      rank-RRRRR.json: each rank's part of trace.json while it is merged
    NAME.tmp-RUNID    an atomic write in progress of one of those files, by this run

Temporary names carry the run's id (its claim's), so a leftover of one of the run's own
killed jobs is recognised as the run's, and a user's ``summary.json.tmp-mine`` is not.

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
import re

from minidp.io.nofollow import REGULAR, Directory
from minidp.run import checkpoint
from minidp.run.checkpoint import Found

RUN_JSON = "run.json"
FILES = ("metrics.jsonl", "summary.json", "model.npz", "events.json", "trace.json")
PARTS = "trace-parts"
# In the order messages list them.
NAMES = (RUN_JSON, "metrics.jsonl", "summary.json", "model.npz", "events.json",
         checkpoint.DIRECTORY, "trace.json", PARTS)
PART = re.compile(r"rank-\d{5,}\.json")


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
    ours = checkpoint.survey(run, run_id)
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
    return [f"'{checkpoint.DIRECTORY}/{f.name}' holds {', '.join(f.others)}, which minidp did "
            "not write" for f in found.checkpoints if f.others]


def clear(run: Directory, found: Survey, run_id: str) -> None:
    """Remove what ``found`` (a survey of ``run`` for ``run_id``, without problems) holds.

    ``run.json`` stays: the caller replaces it with the new claim.
    """
    for name in (*FILES, *found.temporary):
        run.remove_file(name)
    if checkpoint.DIRECTORY in found.names:
        with run.child(checkpoint.DIRECTORY) as ck:
            for scratch in found.scratch:
                checkpoint.discard(ck, scratch)
            for f in found.checkpoints:
                checkpoint.retire(ck, f.name, run_id)
            empty = not ck.names()
        if empty:
            run.remove_dir(checkpoint.DIRECTORY)
    if PARTS in found.names:
        with run.child(PARTS) as parts:
            for entry in found.parts:
                parts.remove_file(entry)
            empty = not parts.names()
        if empty:
            run.remove_dir(PARTS)
