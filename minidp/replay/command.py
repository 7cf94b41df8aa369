"""``python -m minidp replay RUN``: re-execute an asynchronous run in one process and compare.

The run's ``events.json`` gives the order in which its servers (or its master) applied
what its workers sent; the replay re-reads each worker's samples, recomputes every
gradient with minidp's autograd on one thread, applies the papers' update rules
(:mod:`minidp.replay.rules`) in that order, and compares the result with the run's
``model.npz``. Exit status:

* 0: equal, bit for bit (the largest difference printed is 0), in float64 and float32
  alike: the replay evaluates each rule in the run's own rounding;
* 1: they differ: the first differing parameter, where, and the largest difference
  (a float32 run whose servers used NumPy's SGD instead of the kernel, e.g. under
  ``NUMBA_DISABLE_JIT=1``, differs by rounding: its largest difference is small);
* 2: the run cannot be replayed, and why (:class:`CannotReplay`): it is not replayable
  (a synchronous strategy, a resumed run, ...), or what it wrote, or its dataset file,
  does not check (:mod:`minidp.replay.recorded`), so that 1 never blames a run for a
  damaged file;
* 70 (``EX_SOFTWARE``): the replay itself failed, a bug in minidp: the traceback is
  printed (never 1, which would blame the run).

``--explain N`` prints the first N updates: which worker's gradient, its staleness,
the scale or rate the rule gave it, and the samples it was computed on.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import traceback

import numpy as np

from minidp.replay.elastic import ElasticReplay
from minidp.replay.recorded import ELASTIC, CannotReplay, Recorded, Workers, read_run
from minidp.replay.servers import Differs, ServersReplay, Update

EXIT_CRASHED = 70  # sysexits.h's EX_SOFTWARE: an internal error, not a verdict on the run


def add_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the ``replay`` arguments to ``parser``; returns it."""
    parser.add_argument("path", metavar="RUN", help="a run directory (`minidp train --out`)")
    parser.add_argument("--explain", type=int, default=0, metavar="N",
                        help="print the first N updates: worker, staleness, scale, batch")
    parser.add_argument("--data-dir", default=None,
                        help="where the dataset's .mdp files are (default: the run's)")
    return parser


def compare(run: Recorded, workers: Workers, final: np.ndarray) -> tuple[bool, str]:
    """(equal, the verdict in words) of the replay's parameters against ``model.npz``."""
    mine = workers.state(final)
    names = workers.parameter_names()
    missing = [n for n in names if n not in run.result]
    if missing:
        raise CannotReplay(f"model.npz has no parameter {missing[0]!r}: not this run's model")
    first, largest, where = None, 0.0, ""
    for name in names:
        theirs, ours = run.result[name], mine[name]
        if theirs.dtype.kind != "f" or theirs.shape != ours.shape:
            raise CannotReplay(f"model.npz's {name!r} is {theirs.dtype} {theirs.shape}, the "
                               f"replay's model {ours.dtype} {ours.shape}: not this run's model")
        gap = np.abs(theirs.astype(np.float64) - ours.astype(np.float64))
        if not np.array_equal(theirs, ours):
            if first is None:
                index = np.unravel_index(int(np.argmax(gap != 0)), gap.shape)
                first = (f"first in {name!r} at index {tuple(int(i) for i in index)}: run "
                         f"{theirs[index]!r}, replay {ours[index]!r}")
            if gap.max() > largest:
                largest, where = float(gap.max()), name
    count = f"{sum(mine[n].size for n in names):,} parameters, {run.dtype}"
    if first is None:
        return True, f"equal to model.npz bit for bit ({count}; largest difference 0)"
    return False, (f"differs from model.npz ({count}): {first}; largest difference "
                   f"{largest:.3g} (in {where!r})")


def explain(updates: list[Update], n: int) -> list[str]:
    """The first ``n`` updates, one block each."""
    lines = []
    for k, u in enumerate(updates[:n]):
        lines.append(f"update {k + 1} ({u.where}): {u.rule}")
        lines += [f"    {part}" for part in u.parts]
    return lines


def staleness_line(staleness: list[int]) -> str:
    """Mean, max and the counts of each staleness."""
    if not staleness:
        return "staleness: none recorded"
    counts = np.bincount(staleness)
    spread = ", ".join(f"{s}: {c}" for s, c in enumerate(counts) if c)
    return (f"staleness mean {np.mean(staleness):.2f}, max {max(staleness)} "
            f"(how many: {spread})")


@dataclasses.dataclass
class Outcome:
    """What a replay found: its exit status, its report, and the events it went through."""

    status: int  # 0 equal, 1 differ, 2 cannot replay
    lines: list[str]
    staleness: list[int] = dataclasses.field(default_factory=list)
    updates: list[Update] = dataclasses.field(default_factory=list)


def replay(path: str, explain_first: int = 0, data_dir: str | None = None) -> Outcome:
    """Replay the run in ``path`` and compare it with its ``model.npz``."""
    from minidp.threads import limit_threads

    try:
        run = read_run(path)
        limit_threads(int(run.summary.get("threads_per_rank", 1)))
        workers = Workers(run, data_dir)
        engine = ElasticReplay(run, workers) if run.strategy in ELASTIC else \
            ServersReplay(run, workers)
        lines = [f"replay: {path}: {run.strategy} on {len(run.servers) + len(run.workers)} "
                 f"ranks ({len(run.servers)} {'master' if run.strategy in ELASTIC else 'server'}"
                 f"{'s' if len(run.servers) > 1 else ''}, {len(run.workers)} workers), "
                 f"{run.config['model']} on {run.config['dataset']}, {run.dtype}"]
        final = engine.replay()
    except CannotReplay as why:
        return Outcome(2, [f"replay: cannot replay {path}: {why}"])
    except Differs as why:
        return Outcome(1, lines + [f"result: the run does not follow its rule: {why}"])
    counts = engine.summary()
    lines.append(f"events: {counts['gradients']} gradients, {counts['updates']} "
                 f"{'exchanges' if run.strategy in ELASTIC else 'updates'}; "
                 f"{staleness_line(counts['staleness'])}")
    lines += explain(engine.updates, explain_first)
    try:
        equal, verdict = compare(run, workers, final)
    except CannotReplay as why:
        return Outcome(2, lines + [f"replay: cannot compare: {why}"])
    return Outcome(0 if equal else 1, lines + [f"result: {verdict}"], counts["staleness"],
                   engine.updates)


def run(args: argparse.Namespace) -> int:
    """The ``replay`` subcommand: print the report; the exit status."""
    if args.explain < 0:
        print(f"error: --explain: got {args.explain}, allowed: an int >= 0", file=sys.stderr)
        return 2
    try:
        outcome = replay(args.path, args.explain, args.data_dir)
    except Exception:  # what passed every check and still failed is minidp's own bug
        traceback.print_exc()
        print(f"replay: internal error while replaying {args.path} (a bug in minidp, not a "
              f"verdict on the run: please report it with the traceback above; exit status "
              f"{EXIT_CRASHED})", file=sys.stderr, flush=True)
        return EXIT_CRASHED
    stream = sys.stderr if outcome.status == 2 else sys.stdout
    print("\n".join(outcome.lines), file=stream, flush=True)
    return outcome.status
