"""The run-directory and checkpoint formats, fuzzed: every case resumes cleanly or is refused.

A seeded mutator (``tests/scripts/rundir_fuzz.py``, which says what each outcome means)
takes a run of 3 epochs stopped after 2, with a checkpoint after each, and changes one
of the names minidp writes: a file cut short, bits flipped, a JSON value of the wrong
type (a checkpoint's record resealed half the time, so that the checks behind its
checksum are reached), a rank file rewritten with an entry of another type, shape or
dtype, a symbolic link (to copies of the run's own files outside it: following it
would "work"), a FIFO, a socket, the file of another run, a directory where a file goes
and a file where a directory goes, a name removed, a user's copy of a checkpoint kept
beside minidp's. Each case then trains again, as ``--resume auto``, ``--resume`` or
``--overwrite``, in the worker's process (as ``minidp train`` at one rank), and must end
in one of two ways:

* a clean run: its 3 epochs in ``metrics.jsonl`` and ``summary.json``;
* a refusal: minidp's own error, one line naming a path of the run (``minidp train``
  prints it as ``error: ...`` with exit status 2), with nothing of the run changed;

never another exception (a traceback), a hang, or a file outside the case touched (the
pristine runs and the directory the planted links point at are compared, content and
all, before and after every case).

``make test`` runs :data:`CASES` cases ("quick", about a minute); ``make fuzz``
(``HYPOTHESIS_PROFILE=long``) runs 600. The outcomes are printed by mutation (``-s``).
"""

import collections
import hashlib
import json
import os
import shutil
import sys

from spmd import ROOT, finish_job, start_job

PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "quick")
CASES = {"quick": 60, "long": 600}.get(PROFILE, 60)
BATCH = 100  # cases per worker process (each case builds a Trainer: MPI's communicators
# run out after some hundreds in one process)
SEED = 40
WORKER_S = 1800  # a hang guard for one worker, never a bound a test asserts


def worker(*args):
    """Run the fuzz worker with ``args``; its output when it fails."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = start_job([sys.executable, os.path.join(ROOT, "tests", "scripts", "rundir_fuzz.py"),
                      *map(str, args)], ROOT, env)
    output, killed = finish_job(proc, WORKER_S)
    assert not killed and proc.returncode == 0, output[-5000:]


def contents(*roots):
    """Every file's bytes (a digest), every link's target, every directory, under ``roots``."""
    seen = {}
    for root in roots:
        for folder, dirs, files in os.walk(root):
            for name in dirs + files:
                path = os.path.join(folder, name)
                if os.path.islink(path):
                    seen[path] = ("link", os.readlink(path))
                elif os.path.isfile(path):
                    seen[path] = hashlib.sha256(open(path, "rb").read()).hexdigest()
                else:
                    seen[path] = "directory"
    return seen


def test_every_mutated_run_resumes_cleanly_or_is_refused_in_one_line(tmp_path,
                                                                      synthetic_data_dir):
    pristine, other, outside = (str(tmp_path / n) for n in ("pristine", "other", "outside"))
    work, results = str(tmp_path / "work"), str(tmp_path / "results.jsonl")
    os.mkdir(work)
    worker("make", pristine, synthetic_data_dir, 0)
    worker("make", other, synthetic_data_dir, 1)
    shutil.copytree(pristine, outside)  # what planted links point at
    before = contents(pristine, other, outside)
    for first in range(0, CASES, BATCH):
        worker("cases", pristine, other, outside, work, synthetic_data_dir, SEED, first,
               min(BATCH, CASES - first), results)
    found = [json.loads(line) for line in open(results)]
    assert [r["case"] for r in found] == list(range(CASES))
    table = collections.Counter((r["kind"], r["outcome"]) for r in found)
    print(f"\nrun-directory fuzz, {CASES} cases (seed {SEED}): mutation | outcome | cases")
    for (kind, outcome), count in sorted(table.items()):
        print(f"{kind} | {outcome} | {count}")
    bad = [r for r in found if r["outcome"] not in ("resumed", "refused")]
    assert not bad, "\n\n".join(json.dumps(r, indent=1) for r in bad[:5])
    assert contents(pristine, other, outside) == before
    outcomes = collections.Counter(r["outcome"] for r in found)
    assert outcomes["resumed"] and outcomes["refused"], outcomes  # both ends are reached
    assert os.listdir(work) == []  # every case cleaned up after itself
