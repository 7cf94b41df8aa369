"""Helpers shared by the benchmarks: best-of-repeats wall time, one thread, training jobs."""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from collections.abc import Callable

os.environ.setdefault("MINIDP_NUM_THREADS", "1")  # before minidp sets up its threads
from minidp.reporting.launcher import mpiexec, run_job  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def train_job(flags: list[str], out: str, ranks: int, timeout: float) -> dict | None:
    """Run ``mpiexec -n RANKS python -m mpi4py -m minidp train FLAGS --out OUT``.

    Prints the command line; returns the run's summary, or None when the job failed or
    ran past ``timeout`` seconds (then its whole process group is killed).
    """
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "minidp", "train",
           *flags, "--out", out]
    shown = [os.path.relpath(c, ROOT) if c.startswith(ROOT + os.sep) else c for c in cmd]
    print("$ " + shlex.join(shown).replace(os.path.dirname(out), "$TMP"), flush=True)
    status, output = run_job(cmd, timeout, cwd=ROOT)
    if status != 0:
        tail = "\n".join(output.strip().splitlines()[-4:])
        print(f"  failed (exit {status}):\n{tail}", file=sys.stderr, flush=True)
        return None
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def best_time(fn: Callable[[], object], repeats: int = 20, warmup: int = 3,
              min_seconds: float = 0.0) -> float:
    """Best wall time of ``fn()`` over ``repeats`` runs after ``warmup`` runs, in seconds."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    start = time.perf_counter()
    runs = 0
    while runs < repeats or time.perf_counter() - start < min_seconds:
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        runs += 1
    return best


def print_table(headers: list[str], rows: list[list[object]]) -> None:
    """Print rows as an aligned plain-text table (also valid Markdown)."""
    cells = [[str(c) for c in r] for r in [headers] + rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    for k, r in enumerate(cells):
        print("| " + " | ".join(c.rjust(w) for c, w in zip(r, widths)) + " |")
        if k == 0:
            print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
