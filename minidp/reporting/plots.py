"""The report's figures: one PNG per question a reader asks of a set of runs.

Every function takes the labelled runs of :mod:`minidp.reporting.runs` and returns a figure,
or None when no run has the data (a staleness histogram needs an asynchronous run, no
plot of epochs can be drawn before a run has finished one). Matplotlib runs on its Agg
backend: no display, the same pixels on a cluster's login node as on a laptop. Every
plot has a title, axis units and a legend naming the runs, outside the axes (beside
them, so no curve is hidden however many runs there are); a figure of one panel per
run puts at most :data:`COLUMNS` panels in a row and wraps each run's label over lines
in its title.
"""

from __future__ import annotations

import itertools
import math
import os
import textwrap
from typing import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from minidp.reporting.runs import LEVELS, Run  # noqa: E402
from minidp.trace import PHASES  # noqa: E402

PHASE_COLOURS = dict(zip(PHASES, plt.get_cmap("tab10").colors))
COLUMNS = 3  # panels per row in the per-run figures
TITLE_CHARACTERS = 34  # a panel title's line, at the default font on a 4.5-inch panel


def _legend_outside(ax: plt.Axes) -> None:
    """The legend to the right of ``ax``, top-aligned (savefig's tight box keeps it)."""
    ax.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.02, 1), borderaxespad=0)


def _panels(count: int) -> tuple[Figure, list[plt.Axes]]:
    """A figure of ``count`` panels, at most COLUMNS a row, sharing the y axis."""
    columns = min(count, COLUMNS)
    rows = math.ceil(count / columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.5 * columns + 2, 3.8 * rows + 0.8),
                             sharey=True, squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:  # the last row's empty places
        ax.set_visible(False)
    return fig, flat[:count]


def _wrap(label: str, width: int = TITLE_CHARACTERS) -> str:
    """A label over lines of at most ``width`` characters, broken between words only."""
    return textwrap.fill(label, width, break_long_words=False, break_on_hyphens=False)


def _cumulative(values: list[float]) -> list[float]:
    return list(itertools.accumulate(values))


def _epochs(ax: plt.Axes) -> None:
    """Label an axis of epochs with whole numbers only."""
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def accuracy(runs: list[Run]) -> Figure:
    """Test accuracy against training time and against epochs, every run."""
    fig, (by_time, by_epoch) = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for r in runs:
        acc = [100 * m["test_accuracy"] for m in r.epochs]
        by_time.plot(_cumulative([m["wall_s"] for m in r.epochs]), acc, marker="o",
                     label=r.label)
        by_epoch.plot([m["epoch"] for m in r.epochs], acc, marker="o", label=r.label)
    by_time.set(title="Test accuracy against training time", xlabel="training time (s)",
                ylabel="test accuracy (%)")
    by_epoch.set(title="Test accuracy against epochs")
    _epochs(by_epoch)
    for ax in (by_time, by_epoch):
        ax.grid(alpha=0.3)
    _legend_outside(by_epoch)
    return fig


def loss(runs: list[Run]) -> Figure:
    """Training loss (solid) and test loss (dashed) per epoch; one legend entry per run."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r, colour in zip(runs, itertools.cycle(plt.get_cmap("tab10").colors)):
        epochs = [m["epoch"] for m in r.epochs]
        ax.plot(epochs, [m["train_loss"] for m in r.epochs], color=colour, marker="o",
                label=r.label)
        ax.plot(epochs, [m["test_loss"] for m in r.epochs], color=colour, linestyle="--")
    ax.plot([], [], color="black", label="train (solid)")
    ax.plot([], [], color="black", linestyle="--", label="test (dashed)")
    ax.set(title="Loss per epoch (train: mean over the epoch's batches)",
           ylabel="cross-entropy loss")
    _epochs(ax)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return fig


def _stacked(ax: plt.Axes, positions: list[float], totals: list[dict[str, float]]) -> None:
    bottom = [0.0] * len(positions)
    for phase in PHASES:
        heights = [t.get(phase, 0.0) for t in totals]
        ax.bar(positions, heights, bottom=bottom, color=PHASE_COLOURS[phase], label=phase)
        bottom = [b + h for b, h in zip(bottom, heights)]


def phases_per_epoch(runs: list[Run]) -> Figure:
    """Seconds per phase in every epoch, busiest rank (each phase's maximum over ranks)."""
    fig, axes = _panels(len(runs))
    for ax, r in zip(axes, runs):
        # A row without phases (they are optional in metrics.jsonl) is an empty bar.
        _stacked(ax, [m["epoch"] for m in r.epochs], [m.get("phases", {}) for m in r.epochs])
        ax.set_title(_wrap(r.label), fontsize="medium")
        _epochs(ax)
    for ax in axes[::COLUMNS]:
        ax.set_ylabel("seconds (busiest rank per phase)")
    _legend_outside(axes[min(len(axes), COLUMNS) - 1])
    fig.suptitle("Time per phase per epoch (each phase's maximum over ranks, so a bar "
                 "can exceed the epoch)")
    fig.tight_layout()
    return fig


def phases_per_rank(runs: list[Run]) -> Figure | None:
    """Seconds per phase over the whole run for every rank: the spread over ranks."""
    traced = [r for r in runs if r.rank_phases]
    if not traced:
        return None
    fig, axes = _panels(len(traced))
    for ax, r in zip(axes, traced):
        ranks = list(r.rank_phases)
        _stacked(ax, ranks, [r.rank_phases[k] for k in ranks])
        ax.set_title(_wrap(r.label), fontsize="medium")
        ax.set(xlabel="rank", xticks=ranks)
    for ax in axes[::COLUMNS]:
        ax.set_ylabel("seconds over the run (trace.json)")
    _legend_outside(axes[min(len(axes), COLUMNS) - 1])
    fig.suptitle("Time per phase per rank: where each rank spent the run")
    fig.tight_layout()
    return fig


def bytes_per_level(runs: list[Run]) -> Figure | None:
    """MiB sent inside nodes, between nodes, and by MPI's algorithm, every finished run."""
    done = [r for r in runs if r.summary is not None]
    if not done:
        return None
    fig, ax = plt.subplots(figsize=(max(6, 1.5 * len(done) + 3), 4.5))
    width = 0.8 / len(LEVELS)
    for k, (level, name) in enumerate(LEVELS.items()):
        ax.bar([x + (k - (len(LEVELS) - 1) / 2) * width for x in range(len(done))],
               [r.summary.get("bytes_sent", {}).get(level, 0) / 2**20 for r in done],
               width, label=name)
    ax.set_xticks(range(len(done)), [_wrap(r.label, 18) for r in done],
                  fontsize="small")
    ax.set(title="Bytes sent per level over the run (all ranks)", ylabel="MiB")
    _legend_outside(ax)
    return fig


def staleness(runs: list[Run]) -> Figure | None:
    """Histogram of gradient staleness over the run (parameter-server strategies)."""
    stale = [(r, [h for h in r.strategy_stats("staleness_histogram") if h]) for r in runs]
    stale = [(r, hs) for r, hs in stale if hs]
    if not stale:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    width = 0.8 / len(stale)
    for k, (r, histograms) in enumerate(stale):
        counts = [sum(col) for col in zip(*histograms)]
        ax.bar([b + k * width for b in range(len(counts))], counts, width, label=r.label)
    ax.set(title="Staleness of applied gradients (last bin: 32 or more)",
           xlabel="staleness (server updates between pull and apply)",
           ylabel="gradients", yscale="log")
    _legend_outside(ax)
    return fig


def daso_schedule(runs: list[Run]) -> Figure | None:
    """DASO's (B, S, L) per epoch: batches between global syncs, skipped, local skips."""
    daso = [r for r in runs if any(s is not None for s in r.strategy_stats("global_skip"))]
    if not daso:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in daso:
        epochs = [m["epoch"] for m in r.epochs]
        for key, symbol, style in (("global_skip", "B", "-"), ("batches_to_wait", "S", "--"),
                                   ("local_skip", "L", ":")):
            ax.step(epochs, r.strategy_stats(key), where="mid", linestyle=style,
                    marker="o", label=f"{r.label}: {symbol}")
    ax.set(title="DASO's schedule per epoch ((0, 0, 0): blocking every batch, as in warm-up "
           "and cool-down)",
           ylabel="batches")
    _epochs(ax)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return fig


def batch_sizes(runs: list[Run]) -> Figure | None:
    """dbs: each worker's mean batch per epoch."""
    dbs = [r for r in runs if any(r.strategy_stats("batch_sizes"))]
    if not dbs:
        return None
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for r in dbs:
        means = r.strategy_stats("worker_mean_batch")
        epochs = [m["epoch"] for m in r.epochs]
        for worker in sorted({w for m in means if m for w in m}, key=int):
            # an epoch without the worker's mean (none recorded) is a gap in its line
            ax.plot(epochs, [m.get(worker, math.nan) if m else math.nan for m in means],
                    marker="o", label=f"{r.label}: rank {worker}")
    ax.set(title="Per-worker batch size (mean over each epoch's pushes)",
           ylabel="samples per gradient")
    _epochs(ax)
    ax.grid(alpha=0.3)
    _legend_outside(ax)
    return fig


FIGURES: list[tuple[str, str, Callable[[list[Run]], Figure | None]]] = [
    ("Test accuracy", "accuracy.png", accuracy),
    ("Loss", "loss.png", loss),
    ("Time per phase per epoch", "phases.png", phases_per_epoch),
    ("Time per phase per rank", "ranks.png", phases_per_rank),
    ("Bytes per level", "bytes.png", bytes_per_level),
    ("Staleness", "staleness.png", staleness),
    ("DASO schedule", "daso.png", daso_schedule),
    ("Per-worker batch sizes", "batch_sizes.png", batch_sizes),
]


def plot_all(runs: list[Run], out: str) -> list[tuple[str, str]]:
    """Write every figure that has data into ``out``; (title, file name) of each.

    Only runs with a finished epoch are drawn; with none, there is nothing to draw.
    """
    written: list[tuple[str, str]] = []
    finished = [r for r in runs if r.epochs]
    if not finished:
        return written
    for title, name, make in FIGURES:
        fig = make(finished)
        if fig is None:
            continue
        fig.savefig(os.path.join(out, name), dpi=100, bbox_inches="tight")
        plt.close(fig)
        written.append((title, name))
    return written
