"""A run directory read back without MPI: configuration, epochs, summary, phases per rank.

A run directory (``--out`` of ``train``) holds ``run.json``, ``metrics.jsonl``,
``summary.json`` and ``trace.json`` (:mod:`minidp.run.files`). :func:`load_run` reads
them; :func:`label_runs` names each run by its strategy and, shortly, the settings in
which the runs differ (``sync (50 us, 1 Gb/s, 2 per node)``). A run that is still going
(or was stopped) has no ``summary.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from typing import Any

from minidp.run.config import STRATEGY_RATES, TrainConfig
from minidp.strategies import STRATEGIES
from minidp.trace import PHASES

# Settings that never make two runs differ in a way a reader compares.
NOT_SETTINGS = ("out", "data_dir", "progress", "verify", "overwrite", "resume", "checkpoint_every",
                "comm_timeout", "inject_fault", "explain")
COMM_PHASES = ("comm_intra", "comm_inter", "wait")
# summary.json's byte counters, as report.md and bytes.png name them (docs/reporting.md)
LEVELS = {"intra": "intra-node", "inter": "inter-node",
          "mpi": "MPI's allreduce (its algorithm: cannot be split)"}
# How a label writes a setting's value: short, with its unit (others: "name value").
SHORT = {"epochs": "{} epochs", "net_latency_us": "{:g} us", "net_bandwidth_gbps": "{:g} Gb/s",
         "ranks_per_node": "{} per node", "batch_size": "batch {}",
         "global_batch_size": "global batch {}", "lr": "lr {:g}", "momentum": "momentum {:g}",
         "weight_decay": "wd {:g}", "train_samples": "{} samples", "test_samples": "{} tested",
         "warmup_epochs": "warm-up {}", "nesterov": "nesterov", "model": "{}", "dataset": "{}",
         "optimizer": "{}", "schedule": "{} schedule", "allreduce": "allreduce {}"}
DEFAULTS = {f.name: f.default for f in dataclasses.fields(TrainConfig)
            if f.default is not dataclasses.MISSING}


@dataclasses.dataclass
class Run:
    """What one run directory holds: configuration, epochs, summary, per-rank phase totals."""

    path: str
    config: dict[str, Any]
    epochs: list[dict[str, Any]]
    summary: dict[str, Any] | None
    rank_phases: dict[int, dict[str, float]]  # rank -> phase -> seconds (from trace.json)
    label: str = ""

    @property
    def strategy(self) -> str:
        """The strategy id the run trained with."""
        return str(self.config.get("strategy", "?"))

    @property
    def wall_s(self) -> float:
        """Training time: the summary's, else the sum of the epochs' (an unfinished run)."""
        if self.summary is not None:
            return float(self.summary["wall_s"])
        return sum(m["wall_s"] for m in self.epochs)

    def strategy_stats(self, key: str) -> list[Any]:
        """The per-epoch values of ``metrics['strategy'][key]`` (None where absent)."""
        return [m.get("strategy", {}).get(key) for m in self.epochs]


def _read_json(path: str, what: str) -> Any:
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as error:
        raise ValueError(f"report: {what}: {path} is not valid JSON ({error})") from None


def rank_phases(trace_path: str) -> dict[int, dict[str, float]]:
    """Seconds per phase per rank over the whole run, summed from the trace's events."""
    if not os.path.exists(trace_path):
        return {}
    trace = _read_json(trace_path, "trace")
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    totals: dict[int, dict[str, float]] = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") in PHASES:
            per_rank = totals.setdefault(int(e["pid"]), dict.fromkeys(PHASES, 0.0))
            per_rank[e["name"]] += e["dur"] * 1e-6
    return dict(sorted(totals.items()))


def load_run(path: str) -> Run:
    """Read a run directory; a clear error when it is not one."""
    if not os.path.isdir(path):
        raise ValueError(f"report: RUN_DIR: got {path!r}, allowed: a directory that "
                         "`minidp train --out` wrote")
    metrics_path = os.path.join(path, "metrics.jsonl")
    run_path = os.path.join(path, "run.json")
    if not os.path.exists(run_path) or not os.path.exists(metrics_path):
        raise ValueError(f"report: RUN_DIR: {path!r} has no run.json and metrics.jsonl, "
                         "allowed: a directory that `minidp train --out` wrote")
    config = _read_json(run_path, "run.json").get("config", {})
    epochs = []
    with open(metrics_path) as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    # a diverged epoch's losses are null (strict JSON): NaN to format and plot
                    epochs.append({k: math.nan if v is None else v
                                   for k, v in json.loads(line).items()})
                except json.JSONDecodeError as error:
                    raise ValueError(f"report: {metrics_path}, line {number}: not valid "
                                     f"JSON ({error})") from None
    summary_path = os.path.join(path, "summary.json")
    summary = _read_json(summary_path, "summary") if os.path.exists(summary_path) else None
    return Run(path, config, epochs, summary, rank_phases(os.path.join(path, "trace.json")))


def chosen_options(run: Run) -> dict[str, Any]:
    """The strategy options the run set away from their defaults (``--set``)."""
    declared = STRATEGIES[run.strategy].options if run.strategy in STRATEGIES else {}
    return {k: v for k, v in sorted(run.config.get("options", {}).items())
            if k not in declared or declared[k].default != v}


def _default(run: Run, key: str) -> Any:
    """The value ``key`` takes when a run does not set it (lr and momentum: per strategy)."""
    if key in ("lr", "momentum") and run.strategy in STRATEGY_RATES:
        lr, momentum = STRATEGY_RATES[run.strategy]
        return lr if key == "lr" else momentum
    return DEFAULTS.get(key)


def _short(key: str, value: Any) -> str:
    if key in SHORT:
        with contextlib.suppress(TypeError, ValueError):  # a value of another field's type
            return SHORT[key].format(value)
    return f"{key} {value}"


def label_runs(runs: list[Run]) -> None:
    """Name each run: its strategy, its non-default options, the settings runs differ in.

    A setting is named only where the runs differ in it, and only for the runs that set
    it away from its default (a learning rate or momentum at the strategy's default is
    not named), in the short form of :data:`SHORT`: ``sync``, ``sync (50 us, 1 Gb/s)``,
    ``daso (warmup_epochs=1)``. Runs left with the same label are numbered.
    """
    keys = sorted({k for r in runs for k in r.config} -
                  {*NOT_SETTINGS, "strategy", "options"})
    differing = [k for k in keys if len({json.dumps(r.config.get(k), sort_keys=True)
                                         for r in runs}) > 1]
    for run in runs:
        parts = [f"{k}={v}" for k, v in chosen_options(run).items()]
        parts += [_short(k, run.config.get(k)) for k in differing
                  if run.config.get(k) not in (None, _default(run, k))]
        run.label = run.strategy + (f" ({', '.join(parts)})" if parts else "")
    seen: dict[str, int] = {}
    for run in runs:  # the same settings twice (repeated runs): number them
        count = seen[run.label] = seen.get(run.label, 0) + 1
        if count > 1:
            run.label += f" #{count}"


def common_settings(runs: list[Run]) -> str:
    """The settings every run shares, for the report's first line."""
    first = runs[0].config
    keys = ["model", "dataset", "epochs", "batch_size", "lr", "momentum", "dtype",
            "ranks_per_node", "net_latency_us", "net_bandwidth_gbps", "seed"]
    same = [k for k in keys if all(r.config.get(k) == first.get(k) for r in runs)]
    return ", ".join(f"{k} {first.get(k)}" for k in same if first.get(k) is not None)
