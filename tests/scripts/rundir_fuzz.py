"""The run-directory fuzz's worker: seeded mutations of a run, each resumed in this process.

Usage (``tests/test_rundir_fuzz.py`` runs it, one process per batch of cases)::

    python tests/scripts/rundir_fuzz.py make RUN DATA_DIR SEED
    python tests/scripts/rundir_fuzz.py cases PRISTINE OTHER OUTSIDE WORK DATA_DIR SEED FIRST \
        COUNT RESULTS

``make`` trains a run of 3 epochs stopped after 2, with a checkpoint after each: run.json,
metrics.jsonl, summary.json, model.npz, trace.json, checkpoints/epoch-0001 and -0002.
``cases`` copies PRISTINE once per case (hard links: every mutation writes a new file,
never into a linked one), applies one mutation drawn from (SEED, case) to one of the
names minidp writes, then trains it again in this process as ``minidp train --resume
auto``, ``--resume`` or ``--overwrite`` would, and writes one JSON line per case to
RESULTS: the mutation and its outcome, one of

* ``resumed``: the run finished its 3 epochs (metrics rows 1, 2, 3, a summary);
* ``refused``: minidp's own error (what ``minidp train`` prints as one line ``error:``
  with exit status 2), naming a path of the case, with nothing of the case's changed but
  its claim (``run.json``);
* ``crash`` (any other exception, with its traceback), ``hang`` (a case still running
  after :data:`HANG_S` seconds: a FIFO opened, say), ``wrong`` (a run that ended without
  its 3 epochs, or a refusal that changed files or named nothing), ``touched`` (a file
  outside the case directory changed: OUTSIDE, where planted links point, or PRISTINE).

OTHER is a second run (another seed, another run id): its files stand for a user's
copies of another run's. OUTSIDE holds copies of the run's files for links to point at.
"""

import json
import os
import random
import shutil
import signal
import socket
import sys
import traceback

import numpy as np

from minidp.run.compatible import checksum
from minidp.run.config import TrainConfig
from minidp.run.errors import UsageError
from minidp.run.trainer import Trainer

HANG_S = 300  # a hang guard: a case takes a second or two, even on a loaded machine
CK = "checkpoints"
# What minidp writes in the pristine run (files, then directories), and names it would
# write next (absent in the pristine run: planted ones are in the way of the resume).
FILES = ["run.json", "metrics.jsonl", "summary.json", "model.npz", "trace.json",
         f"{CK}/epoch-0001/meta.json", f"{CK}/epoch-0002/meta.json",
         f"{CK}/epoch-0001/rank-00000.npz", f"{CK}/epoch-0002/rank-00000.npz"]
DIRECTORIES = [CK, f"{CK}/epoch-0001", f"{CK}/epoch-0002"]
ABSENT = ["events.json", "trace-parts", "run.json.lock", f"{CK}/epoch-0003",
          f"{CK}/epoch-0002-batch-00001", "metrics.jsonl.tmp-RUN", f"{CK}/epoch-0003.tmp-RUN",
          f"{CK}/epoch-0001.old-RUN", "trace-parts/rank-00000.json"]
WRONG_VALUES = [None, "x", "", [], {}, 1.5, -1, 0, True, 10**30, [1, "a"], {"a": None}]
HOSTILE = ["../../../outside", "/etc", "a\nb", "epoch-0009"]  # strings where strings go


def config(out, data_dir, seed=0, **kwargs):
    return TrainConfig(dataset="synthetic", model="mlp", train_samples=64, test_samples=64,
                       batch_size=16, epochs=3, checkpoint_every=1, data_dir=data_dir,
                       out=out, progress=False, seed=seed, **kwargs)


def make(run, data_dir, seed):
    Trainer(config(run, data_dir, int(seed), stop_after=2)).fit()


# -- mutations: each (case, rng, target) -> a description --------------------------------

def _out_of_the_way(path):
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)


def _replace(path, data):
    """A new file at ``path`` (the old one, maybe a hard link to the pristine run, unlinked)."""
    _out_of_the_way(path)
    with open(path, "wb") as f:
        f.write(data)


def truncate(path, rng):
    data = open(path, "rb").read()
    size = rng.randrange(len(data)) if data else 0
    _replace(path, data[:size])
    return f"cut to {size} of {len(data)} bytes"


def flip(path, rng):
    data = bytearray(open(path, "rb").read())
    where = [rng.randrange(len(data)) for _ in range(rng.randint(1, 8))] if data else []
    for offset in where:
        data[offset] ^= 1 << rng.randrange(8)
    _replace(path, bytes(data))
    return f"bits flipped at {where}"


def _paths(value, prefix=()):
    yield prefix
    children = value.items() if isinstance(value, dict) else \
        enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield from _paths(child, prefix + (key,))


def _wrong_type(value, rng):
    """``value`` with one of its entries (or itself) replaced by a value of another type."""
    paths = [p for p in _paths(value) if p]
    if not paths:
        return rng.choice(WRONG_VALUES), "the whole value"
    path = rng.choice(paths)
    parent = value
    for key in path[:-1]:
        parent = parent[key]
    old = parent[path[-1]]
    new = rng.choice([v for v in WRONG_VALUES if type(v) is not type(old)] + HOSTILE)
    parent[path[-1]] = new
    return value, f"{'/'.join(map(str, path))}: {old!r:.40} -> {new!r}"


def json_type(path, rng):
    try:
        value = json.loads(open(path, "rb").read())
    except ValueError:
        return flip(path, rng)
    value, what = _wrong_type(value, rng)
    sealed = path.endswith("meta.json") and isinstance(value, dict) and rng.random() < 0.5
    if sealed:  # past the checksum: the checks behind it are reached
        value["checksum"] = checksum(value)
    _replace(path, json.dumps(value).encode())
    return what + (" (resealed)" if sealed else "")


def npz_entry(path, rng):
    """A rank file rewritten whole (a sound zip) with one entry changed."""
    with np.load(path) as f:
        entries = {k: f[k] for k in f.files}
    key = rng.choice(sorted(entries))
    if key in ("state", "checkpoint"):
        value, what = _wrong_type(json.loads(bytes(entries[key]).decode()), rng)
        entries[key] = np.frombuffer(json.dumps(value).encode(), np.uint8)
    else:
        what = rng.choice(["shape", "dtype", "removed"])
        array = entries.pop(key)
        if what == "shape":
            entries[key] = np.zeros(array.size + 1, array.dtype)
        elif what == "dtype":
            entries[key] = array.astype(np.float64 if array.dtype != np.float64 else np.float32)
    os.remove(path)
    with open(path, "wb") as f:
        np.savez(f, **entries)
    return f"entry {key}: {what}"


def link(path, rng, outside, relative):
    target = os.path.join(outside, relative if os.path.lexists(os.path.join(outside, relative))
                          else CK)
    _out_of_the_way(path)
    os.symlink(target, path)
    return f"a link to {target}"


def fifo(path, rng):
    _out_of_the_way(path)
    os.mkfifo(path)
    return "a FIFO"


def unix_socket(path, rng):
    _out_of_the_way(path)
    here = os.getcwd()
    os.chdir(os.path.dirname(path))  # a socket's path has a limit of 108 bytes: bound by name
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.bind(os.path.basename(path))
    finally:
        os.chdir(here)
    return "a socket"


def foreign(path, rng, other, relative):
    source = os.path.join(other, relative)
    if not os.path.lexists(source):
        return directory(path, rng)
    _out_of_the_way(path)
    (shutil.copytree if os.path.isdir(source) else shutil.copy)(source, path)
    return "the other run's"


def directory(path, rng):
    _out_of_the_way(path)
    os.makedirs(os.path.join(path, "mine"))
    return "a directory"


def regular(path, rng):
    _out_of_the_way(path)
    with open(path, "w") as f:
        f.write("a user's notes")
    return "a regular file"


def removed(path, rng):
    _out_of_the_way(path)
    return "removed"


def copy_beside(case, rng, other):
    """A user's copy of a checkpoint kept beside minidp's (never in the way of a resume)."""
    source = rng.choice([os.path.join(case, CK, "epoch-0002"), os.path.join(other, CK,
                                                                           "epoch-0001")])
    name = rng.choice(["epoch-0002-copy", "epoch-0009.bak", "best", "epoch-0002 (copy)",
                       "epoch-0002.tmp"])
    shutil.copytree(source, os.path.join(case, CK, name))
    return f"{name}: a copy of {os.path.relpath(source, os.path.dirname(case))}"


def mutate(case, rng, other, outside, run_id):
    """One mutation of ``case``; returns (kind, target, description)."""
    kind = rng.choice(["truncate", "flip", "json", "npz", "link", "fifo", "socket",
                       "foreign", "directory", "regular", "removed", "copy"])
    if kind == "copy":
        return kind, CK, copy_beside(case, rng, other)
    files = {"truncate": FILES, "flip": FILES, "json": [f for f in FILES if "json" in f],
             "npz": [f for f in FILES if f.endswith(".npz") and "rank" in f],
             "directory": FILES + ABSENT, "regular": DIRECTORIES + ABSENT,
             "removed": FILES + DIRECTORIES}.get(kind, FILES + DIRECTORIES + ABSENT)
    relative = rng.choice(files).replace("RUN", run_id)
    path = os.path.join(case, relative)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if kind in ("link", "foreign"):
        what = (link if kind == "link" else foreign)(path, rng, outside if kind == "link"
                                                     else other, relative)
    else:
        what = {"truncate": truncate, "flip": flip, "json": json_type, "npz": npz_entry,
                "fifo": fifo, "socket": unix_socket, "directory": directory,
                "regular": regular, "removed": removed}[kind](path, rng)
    return kind, relative, what


# -- a case: mutate, train, judge ----------------------------------------------------------

def snapshot(root):
    """Every entry under ``root`` (links not followed): kind, inode, size and mtime."""
    seen = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(folder, name)
            s = os.lstat(path)
            seen[os.path.relpath(path, root)] = (s.st_mode, s.st_ino, s.st_size, s.st_mtime_ns)
    return seen


class Hang(Exception):
    """A case ran past HANG_S seconds."""


def _alarm(signum, frame):
    raise Hang(f"still running after {HANG_S} s")


def finished(case):
    """Why the run in ``case`` did not end with its 3 epochs, or None."""
    try:
        rows = [json.loads(line)["epoch"] for line in open(os.path.join(case, "metrics.jsonl"))]
        final = json.load(open(os.path.join(case, "summary.json")))["final"]["epoch"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"its outputs are unreadable: {exc!r}"
    return None if rows == [1, 2, 3] and final == 3 else f"epochs {rows}, final {final}"


def judge_refusal(exc, case, before):
    """``refused``: minidp's own error (a UsageError, or an OSError of minidp's wording, which
    has no errno) in one line naming the case, nothing of the case changed but its claim."""
    if not isinstance(exc, UsageError) and not (isinstance(exc, OSError) and exc.errno is None):
        return {"outcome": "crash", "message": traceback.format_exc()}
    message, after = str(exc), snapshot(case)
    changed = sorted(p for p in set(before) | set(after)
                     if before.get(p) != after.get(p) and p != "run.json")
    one_line = "\n" not in message and case in message
    return {"outcome": "refused" if one_line and not changed else "wrong",
            "message": message + (f" (changed: {changed})" if changed else "")}


def run_case(index, args, rng, run_id):
    pristine, other, outside, work, data_dir = args[:5]
    case = os.path.join(work, f"case-{index:05d}")
    shutil.copytree(pristine, case, copy_function=os.link)
    kind, target, what = mutate(case, rng, other, outside, run_id)
    mode = rng.choices(["auto", "yes", "overwrite"], [6, 3, 2])[0]
    result = {"case": index, "kind": kind, "target": target, "what": what, "mode": mode}
    watched = {p: snapshot(p) for p in (outside, pristine, other)}
    before = snapshot(case)
    signal.alarm(HANG_S)
    try:
        Trainer(config(case, data_dir, resume="no" if mode == "overwrite" else mode,
                       overwrite=mode == "overwrite")).fit()
        signal.alarm(0)
        problem = finished(case)
        result.update(outcome="wrong" if problem else "resumed", message=problem)
    except Hang as exc:
        result.update(outcome="hang", message=str(exc))
    except BaseException as exc:
        signal.alarm(0)
        result.update(judge_refusal(exc, case, before))
    moved = [p for p, seen in watched.items() if snapshot(p) != seen]
    if moved:
        result.update(outcome="touched", message=f"changed outside the case: {moved}")
    shutil.rmtree(case, ignore_errors=True)
    return result


def cases(args):
    seed, first, count, results = int(args[5]), int(args[6]), int(args[7]), args[8]
    run_id = json.load(open(os.path.join(args[0], "run.json")))["minidp_run"]["run_id"]
    signal.signal(signal.SIGALRM, _alarm)
    with open(results, "a") as out:
        for index in range(first, first + count):
            result = run_case(index, args, random.Random(seed * 1_000_003 + index), run_id)
            out.write(json.dumps(result) + "\n")
            out.flush()


if __name__ == "__main__":
    if sys.argv[1] == "make":
        make(*sys.argv[2:5])
    else:
        cases(sys.argv[2:])
