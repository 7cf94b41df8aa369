"""Timing helpers shared by the benchmarks: best-of-repeats wall time, one thread."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

os.environ.setdefault("MINIDP_NUM_THREADS", "1")


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
