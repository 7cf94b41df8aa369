"""``python -m minidp report``: one run or several side by side, as report.md and PNG plots.

The runs are read by :mod:`minidp.reporting.runs`; ``report.md`` holds a table of the
runs, the plots of :mod:`minidp.reporting.plots`, every run's sequence diagram of its
first ``--steps`` steps (``messages.png``: :mod:`minidp.reporting.sequence`, drawn by
:mod:`minidp.reporting.sequence_plot`), and every run's epochs. A run that is
still going (or was stopped) has no ``summary.json``; its finished epochs are reported
and the table says it is unfinished.

Bad input is one line ``error: report: ...`` and exit status 2, before anything is
written: a RUN_DIR that is not a run, a file in it that is not minidp's (not a regular
file, not JSON, a metrics row without a field the report needs), an ``--out`` that is
not a directory or cannot be written (its path and why).
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from minidp.io.atomic import atomic_write
from minidp.reporting.readback import Unreadable, kind_of
from minidp.reporting.runs import LEVELS, Run, common_settings, label_runs, load_run
from minidp.reporting.sequence import Diagram, NoSteps, sequence
from minidp.trace import DETAIL_STEPS, PHASES

STEPS = 3  # steps messages.png draws unless --steps says


def _mib(summary: dict[str, Any] | None, level: str) -> str:
    if summary is None:
        return "-"
    return f"{summary.get('bytes_sent', {}).get(level, 0) / 2**20:,.0f}"


def runs_table(runs: list[Run], paths: bool = True) -> list[str]:
    """Markdown rows: one per run, with the figures a comparison starts from."""
    head = ["run", "ranks", "epochs", "final test acc", "best", "training s", "s / epoch",
            "comm share", "MiB intra", "MiB inter", "MiB MPI"] + (["directory"] if paths else [])
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in runs:
        ranks = r.summary["world_size"] if r.summary else "-"
        cells = [r.label, ranks, f"{len(r.epochs)}" + ("" if r.summary else " (unfinished)")]
        if r.epochs:
            accs = [m["test_accuracy"] for m in r.epochs]
            wall = sum(m["wall_s"] for m in r.epochs)
            comm = sum(m.get("comm_s", 0.0) for m in r.epochs)
            cells += [f"{accs[-1]:.2%}", f"{max(accs):.2%}", f"{r.wall_s:.1f}",
                      f"{wall / len(r.epochs):.2f}", f"{comm / max(wall, 1e-9):.0%}",
                      *(_mib(r.summary, level) for level in LEVELS)]
        else:
            cells += ["-"] * 8
        rows.append("| " + " | ".join(str(c) for c in cells + ([f"`{r.path}`"] if paths
                                                                 else [])) + " |")
    return rows


def epochs_table(run: Run) -> list[str]:
    """Markdown rows: every epoch of one run, with its phases (busiest rank)."""
    rows = ["| epoch | train loss | test loss | test acc | wall s | " +
            " | ".join(PHASES) + " |", "|" + "---|" * (5 + len(PHASES))]
    for m in run.epochs:
        phases = " | ".join(f"{m.get('phases', {}).get(p, 0.0):.2f}" for p in PHASES)
        rows.append(f"| {m['epoch']} | {m['train_loss']:.4f} | {m['test_loss']:.4f} | "
                    f"{m['test_accuracy']:.2%} | {m['wall_s']:.2f} | {phases} |")
    return rows


def check_out(out: str) -> None:
    """Refuse an ``--out`` that is not a directory (nor a new name): ValueError naming it."""
    if os.path.lexists(out) and not os.path.isdir(out):
        there = os.stat(out) if os.path.exists(out) else os.lstat(out)
        raise ValueError(f"report: --out: '{out}' is {kind_of(there.st_mode)}, allowed: a "
                         "directory, new or existing, for report.md and the plots")


def diagrams(runs: list[Run], steps: int) -> list[tuple[Run, Diagram | str]]:
    """Each run's sequence diagram of its first ``steps`` steps, or why it has none.

    Raises:
        Unreadable: a run's trace is not minidp's (the event and the field named).
    """
    drawn: list[tuple[Run, Diagram | str]] = []
    for run in runs:
        if not run.trace:
            drawn.append((run, "no trace.json (the run has not finished)"))
            continue
        try:
            drawn.append((run, sequence(run.trace, steps)))
        except NoSteps as exc:
            drawn.append((run, str(exc)))
        except Unreadable as exc:
            raise Unreadable(f"report: {run.path}/{exc}") from None
    return drawn


def write_report(runs: list[Run], out: str, steps: int = STEPS) -> str:
    """Write ``out/report.md``, the plots and each run's ``messages.png``; the report's path.

    Raises:
        ValueError: ``out`` is not a directory, or cannot be written (its path and why),
            or a run's trace is not minidp's.
    """
    check_out(out)
    drawn = diagrams(runs, steps)  # before anything is written: a bad trace writes nothing
    try:
        return _write(runs, out, drawn, steps)
    except OSError as exc:
        where = exc.filename or out
        raise ValueError(f"report: --out: cannot write '{where}': {exc.strerror or exc}") \
            from None


def _messages(drawn: list[tuple[Run, Diagram | str]], out: str, steps: int) -> list[str]:
    """Draw every run's diagram (``messages.png``; ``messages-K.png`` for run K of several).

    Returns report.md's section of them.
    """
    from minidp.reporting import sequence_plot  # matplotlib, only when a report is made

    lines = [f"## Who sends what to whom: the first {steps} steps", "",
             "One lane per rank, grouped by node; time across. Boxes: the phases (compute "
             "tall, communication flat); arrows: every message, and every rank's part of a "
             "collective (dashed, into the group's root or out of a broadcast's), from the "
             "moment it left to the moment it had arrived, labelled with what moved and its "
             "bytes: teal inside a node, black between nodes; triangles: the strategy's "
             "decisions. Drawn from `trace.json` (docs/reporting.md).", ""]
    for k, (run, diagram) in enumerate(drawn, 1):
        if isinstance(diagram, str):
            lines += [f"{run.label}: {diagram}", ""]
            continue
        name = "messages.png" if len(drawn) == 1 else f"messages-{k}.png"
        world = len(diagram.lanes)
        title = (f"{run.label}, {world} rank(s): who sends what to whom in the first "
                 f"{steps} step(s)")
        sequence_plot.save(diagram, title, os.path.join(out, name))
        lines += [f"![{title}]({name})", ""]
    return lines


def _write(runs: list[Run], out: str, drawn: list[tuple[Run, Diagram | str]],
           steps: int) -> str:
    from minidp.reporting import plots  # matplotlib is imported only when a report is made

    os.makedirs(out, exist_ok=True)
    images = plots.plot_all(runs, out)
    lines = ["# minidp report", "",
             f"{len(runs)} run(s); shared settings: {common_settings(runs)}.", "",
             "Phases are seconds per epoch on the busiest rank (each phase's maximum over "
             "ranks); the comm share is communication and waiting (comm_intra, comm_inter, "
             "wait) over the epoch's wall time. MiB MPI: MPI's own allreduce over nodes of "
             "several ranks, whose algorithm decides which bytes leave a node, so they "
             "cannot be split into intra and inter.", "", *runs_table(runs), ""]
    for title, name in images:
        lines += [f"## {title}", "", f"![{title}]({name})", ""]
    if not images:
        lines += ["No plots: no run has finished an epoch yet.", ""]
    lines += _messages(drawn, out, steps)
    for r in runs:
        lines += [f"## Epochs: {r.label}", "", *epochs_table(r), ""]
    path = os.path.join(out, "report.md")
    atomic_write(path, lambda f: f.write("\n".join(lines)))
    return path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The ``report`` subcommand's arguments."""
    parser.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories")
    parser.add_argument("--out", required=True, metavar="DIR",
                        help="where report.md and the PNG plots go")
    parser.add_argument("--steps", type=steps_argument, default=STEPS, metavar="N",
                        help=f"steps drawn in messages.png, who sends what to whom (default "
                        f"{STEPS}; a run records its first {DETAIL_STEPS} in detail)")
    parser.set_defaults(run=run)


def steps_argument(text: str) -> int:
    """``--steps``: an int from 1 to :data:`~minidp.trace.DETAIL_STEPS`."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 1 <= value <= DETAIL_STEPS:
        raise argparse.ArgumentTypeError(
            f"got {text!r}, allowed: an int from 1 to {DETAIL_STEPS} (a run records the "
            f"steps and decisions of its first {DETAIL_STEPS} steps)")
    return value


def check_plotting() -> None:
    """A clear error when matplotlib (the optional ``report`` extra) is missing."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise ValueError("report: matplotlib is not installed, allowed: install the "
                         "'report' extra (pip install -e '.[report]'; `make venv` does)") \
            from None


def run(args: argparse.Namespace) -> int:
    """Load the runs, label them, write the report; 0, or 2 on a bad argument."""
    check_plotting()
    check_out(args.out)
    runs = [load_run(path) for path in args.runs]
    label_runs(runs)
    path = write_report(runs, args.out, args.steps)
    print(f"wrote {path} ({len(runs)} run(s))")
    return 0
