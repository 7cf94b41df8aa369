"""``make mutants``: does the suite see every update? Realistic one-line bugs, one at a time.

``tests/mutants.toml`` lists the mutants: each names a file, an exact piece of its text
(found exactly once), what replaces it, the tests that must catch it, and why it matters.
This script copies the working tree to a scratch directory (``$TMPDIR/minidp-mutants``,
kept between runs so Numba's kernel cache stays warm), checks that the listed tests pass
there unmutated, then for each mutant: applies it to the scratch copy, runs its tests until
one fails (caught) or all pass (survived), and puts the file back. It prints a line per
mutant, then ``caught N of N``, and exits 1 when a mutant survived, 2 when the list does not
fit the code (a text not found once) or the tests fail without a mutant.

A test is ``FILE::NAME`` (pytest in one process) or ``mpiK:FILE::NAME`` (the SPMD file
under ``mpiexec -n K``, as ``make test`` runs it). A mutant with ``equivalent = "why"``
provably changes no behaviour; it is listed with its reason and not counted.

    .venv/bin/python tests/mutants.py            # every mutant
    .venv/bin/python tests/mutants.py hsgd asgd  # those whose id contains a word given
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib

from spmd import finish_job, mpiexec, start_job

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIST = os.path.join(ROOT, "tests", "mutants.toml")
SCRATCH = os.path.join(tempfile.gettempdir(), "minidp-mutants")
TIMEOUT_S = 300
COMM_TIMEOUT_S = 30
PYTHON = sys.executable


@dataclasses.dataclass
class Mutant:
    """One deliberate bug: ``find`` becomes ``replace`` in ``file``."""

    id: str
    file: str
    find: str
    replace: str
    tests: list[str]
    why: str
    equivalent: str = ""


def load(path: str = LIST) -> list[Mutant]:
    """The mutants of the list, checked against the tree: each text found exactly once."""
    with open(path, "rb") as f:
        entries = tomllib.load(f)["mutant"]
    mutants = [Mutant(**entry) for entry in entries]
    problems = []
    for m in mutants:
        with open(os.path.join(ROOT, m.file)) as f:
            count = f.read().count(m.find)
        if count != 1:
            problems.append(f"{m.id}: {m.file} holds its text {count} times, allowed: once")
        if m.find == m.replace:
            problems.append(f"{m.id}: the replacement is the text itself")
        if not m.tests and not m.equivalent:
            problems.append(f"{m.id}: names no test that must catch it")
    ids = [m.id for m in mutants]
    problems += [f"{i}: listed twice" for i in sorted({i for i in ids if ids.count(i) > 1})]
    if problems:
        raise ValueError("tests/mutants.toml does not fit the code:\n  " + "\n  ".join(problems))
    return mutants


def tracked_files() -> list[str]:
    """The working tree's files that git tracks or would track (not the ignored ones)."""
    out = subprocess.run(["git", "-C", ROOT, "ls-files", "--cached", "--others",
                          "--exclude-standard"], capture_output=True, text=True, check=True)
    return [f for f in out.stdout.splitlines() if os.path.isfile(os.path.join(ROOT, f))]


def sync_scratch() -> None:
    """Make the scratch copy equal to the working tree, copying only what changed."""
    for name in tracked_files():
        src, dst = os.path.join(ROOT, name), os.path.join(SCRATCH, name)
        if os.path.exists(dst) and os.path.getmtime(dst) == os.path.getmtime(src) \
                and os.path.getsize(dst) == os.path.getsize(src):
            continue
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        shutil.copy2(src, dst)  # keeps the time stamp: Numba's cache stays valid


def command(test: str) -> list[str]:
    """The command that runs one test spec in the scratch copy."""
    pytest = ["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider"]
    if test.startswith("mpi"):
        ranks, _, node = test[3:].partition(":")
        return [mpiexec(), "-n", ranks, PYTHON, "-m", "mpi4py", *pytest, node]
    return [PYTHON, *pytest, test]


def passes(test: str) -> tuple[bool, float]:
    """Run one test in the scratch copy: (passed, seconds). A timeout counts as a failure."""
    # A mutant that deadlocks (a wrong partner) ends at the guard's timeout, not the job's.
    env = dict(os.environ, PYTHONPATH=SCRATCH, MPIEXEC_TIMEOUT=str(TIMEOUT_S - 30),
               MINIDP_COMM_TIMEOUT=str(COMM_TIMEOUT_S),
               PYTEST_DISABLE_PLUGIN_AUTOLOAD="1", MINIDP_SPMD="1", PYTHONUNBUFFERED="1")
    started = time.perf_counter()
    proc = start_job(command(test), SCRATCH, env)
    _, killed = finish_job(proc, TIMEOUT_S)
    return not killed and proc.returncode == 0, time.perf_counter() - started


def catches(m: Mutant) -> tuple[str | None, float]:
    """Apply ``m`` in the scratch copy, run its tests: (the test that failed or None, s)."""
    path = os.path.join(SCRATCH, m.file)
    with open(path) as f:
        original = f.read()
    stamp = os.stat(path)
    with open(path, "w") as f:
        f.write(original.replace(m.find, m.replace))
    spent = 0.0
    try:
        for test in m.tests:
            ok, seconds = passes(test)
            spent += seconds
            if not ok:
                return test, spent
        return None, spent
    finally:
        with open(path, "w") as f:
            f.write(original)
        os.utime(path, ns=(stamp.st_atime_ns, stamp.st_mtime_ns))


def main(words: list[str]) -> int:
    """Run the mutants (those whose id contains one of ``words``, if given)."""
    try:
        mutants = load()
    except ValueError as exc:
        print(exc, file=sys.stderr)
        return 2
    chosen = [m for m in mutants if not words or any(w in m.id for w in words)]
    counted = [m for m in chosen if not m.equivalent]
    sync_scratch()
    tests = sorted({t for m in counted for t in m.tests})
    print(f"scratch copy {SCRATCH}; {len(tests)} test(s) first, unmutated", flush=True)
    for test in tests:
        ok, seconds = passes(test)
        if not ok:
            print(f"the tests must pass without a mutant: {test} fails ({seconds:.0f} s); "
                  f"run it: cd {SCRATCH} && {' '.join(command(test))}", file=sys.stderr)
            return 2
    started, survivors = time.perf_counter(), []
    for m in chosen:
        if m.equivalent:
            print(f"  equivalent {m.id}: {m.equivalent}", flush=True)
            continue
        caught, seconds = catches(m)
        if caught is None:
            survivors.append(m)
        verdict = f"caught by {caught}" if caught else "SURVIVED"
        print(f"  {m.id:<38} {seconds:5.0f} s  {verdict}", flush=True)
    n = len(counted)
    print(f"caught {n - len(survivors)} of {n} ({time.perf_counter() - started:.0f} s)")
    for m in survivors:
        print(f"survived: {m.id} ({m.file}: {m.find!r} -> {m.replace!r}): {m.why}")
    return 1 if survivors else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
