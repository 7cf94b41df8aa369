"""``--threads 1,2``: the thread counts a benchmark measures, read before minidp is imported.

Numba sizes its thread pool from the count minidp chooses when it is imported, so a
benchmark that measures several counts reads them first, sets ``MINIDP_NUM_THREADS`` to
the largest, and only then imports minidp (and ``common.py``, which imports it). This
module therefore imports nothing of minidp.
"""

import argparse
import sys


def thread_counts(argv: list[str]) -> list[int]:
    """The counts of ``--threads`` in ``argv``, or exit naming the argument and its value."""
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument("--threads", default="1")
    text = parser.parse_known_args(argv)[0].threads
    try:
        counts = [int(t) for t in text.split(",")]
    except ValueError:
        counts = []
    if not counts or min(counts) < 1:
        sys.exit(f"error: --threads: got {text!r}, allowed: thread counts >= 1 separated by "
                 "commas (1,2)")
    return counts
