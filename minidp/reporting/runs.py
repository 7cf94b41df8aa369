"""A run directory read back without MPI: configuration, epochs, summary, its trace.

A run directory (``--out`` of ``train``) holds ``run.json``, ``metrics.jsonl``,
``summary.json`` and ``trace.json`` (:mod:`minidp.run.files`). :func:`load_run` reads
them, regular files only (a FIFO or a device is refused, never waited on:
:mod:`minidp.reporting.readback`), and checks every field the report and the plots use
(:data:`METRICS`, :data:`SUMMARY`), so a changed or truncated file is one error naming
the file, its line and the field; :func:`label_runs` names each run by its strategy and,
shortly, the settings in which the runs differ (``sync (50 us, 1 Gb/s, 2 per node)``). A
run that is still going (or was stopped) has no ``summary.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
from typing import Any

from minidp.reporting.readback import (
    FLAG,
    FRACTION,
    LOSS,
    NUMBER,
    OBJECT,
    SECONDS,
    SECONDS_BY_NAME,
    TEXT,
    Unreadable,
    count,
    fields,
    is_int,
    is_number,
    json_object,
    open_regular,
    optional,
    read_json,
)
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
# The fields of a metrics.jsonl row that the report and the plots read (run/trainer.py
# writes them), then those a row may hold; and the summary's.
METRICS = {"epoch": count(1), "train_loss": LOSS, "test_loss": LOSS,
           "test_accuracy": FRACTION, "wall_s": SECONDS}
METRICS_MAY = {"comm_s": SECONDS, "phases": SECONDS_BY_NAME, "strategy": OBJECT}
STRATEGY_STATS = {
    "staleness_histogram": ((lambda v: isinstance(v, list) and all(is_int(c) and c >= 0
                                                                   for c in v)),
                            "an array of ints >= 0"),
    "global_skip": optional(NUMBER), "batches_to_wait": optional(NUMBER),
    "local_skip": optional(NUMBER),
    "worker_mean_batch": ((lambda v: isinstance(v, dict) and all(
        k.isdigit() and is_number(x) for k, x in v.items())),
        "a JSON object of finite numbers by worker rank")}
SUMMARY = {"world_size": count(1), "wall_s": SECONDS}
SUMMARY_MAY = {"bytes_sent": ((lambda v: isinstance(v, dict) and all(
    is_number(x) and x >= 0 for x in v.values())), "a JSON object of byte counts >= 0")}
CONFIG_MAY = {"strategy": TEXT, "options": OBJECT, "nesterov": FLAG}


@dataclasses.dataclass
class Run:
    """What one run directory holds: configuration, epochs, summary, per-rank phase totals."""

    path: str
    config: dict[str, Any]
    epochs: list[dict[str, Any]]
    summary: dict[str, Any] | None
    rank_phases: dict[int, dict[str, float]]  # rank -> phase -> seconds (from trace.json)
    label: str = ""
    trace: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # its events

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


def trace_events(trace_path: str) -> list[dict[str, Any]]:
    """The events of ``trace.json`` (none if the run has no trace), a list checked."""
    if not os.path.lexists(trace_path):
        return []
    trace = read_json(trace_path, "trace.json")
    events = trace.get("traceEvents") if isinstance(trace, dict) else trace
    if not isinstance(events, list) or not all(isinstance(e, dict) for e in events):
        raise Unreadable(f"trace.json: '{trace_path}' holds no list of events, allowed: "
                         "Chrome's trace format, as minidp writes it")
    return events


def rank_phases(trace_path: str, events: list[dict[str, Any]] | None = None
                ) -> dict[int, dict[str, float]]:
    """Seconds per phase per rank over the whole run, summed from the trace's events.

    ``events``: the trace's events if read already (else read from ``trace_path``).
    """
    events = trace_events(trace_path) if events is None else events
    totals: dict[int, dict[str, float]] = {}
    for k, e in enumerate(events):
        if e.get("ph") == "X" and e.get("name") in PHASES:
            fields(e, {"pid": count(0), "dur": SECONDS}, f"trace.json: '{trace_path}', event {k}")
            per_rank = totals.setdefault(e["pid"], dict.fromkeys(PHASES, 0.0))
            per_rank[e["name"]] += e["dur"] * 1e-6
    return dict(sorted(totals.items()))


def read_metrics(path: str) -> list[dict[str, Any]]:
    """The epochs of ``metrics.jsonl``, every row checked (:data:`METRICS`).

    A diverged epoch's losses are null (strict JSON): read as NaN, to format and plot.
    """
    epochs = []
    with open_regular(path, "metrics.jsonl") as f:
        try:
            lines = list(f)
        except UnicodeDecodeError as error:
            raise Unreadable(f"metrics.jsonl: '{path}' is not UTF-8 text ({error})") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"metrics.jsonl: '{path}', line {number}"
        try:
            row = json_object(json.loads(line), where)
        except json.JSONDecodeError as error:
            raise Unreadable(f"{where}: not valid JSON at character {error.pos + 1} "
                             f"({error.msg})") from None
        fields(row, METRICS, where, METRICS_MAY)
        fields(row.get("strategy", {}), {}, f"{where}, 'strategy'", STRATEGY_STATS)
        epochs.append({k: math.nan if k in ("train_loss", "test_loss") and v is None else v
                       for k, v in row.items()})
    return epochs


def load_run(path: str) -> Run:
    """Read a run directory; a clear error when it is not one, or a file is not minidp's."""
    if not os.path.isdir(path):
        raise ValueError(f"report: RUN_DIR: got {path!r}, allowed: a directory that "
                         "`minidp train --out` wrote")
    metrics_path = os.path.join(path, "metrics.jsonl")
    run_path = os.path.join(path, "run.json")
    if not os.path.lexists(run_path) or not os.path.lexists(metrics_path):
        raise ValueError(f"report: RUN_DIR: {path!r} has no run.json and metrics.jsonl, "
                         "allowed: a directory that `minidp train --out` wrote")
    try:
        record = json_object(read_json(run_path, "run.json"), f"run.json: '{run_path}'")
        config = json_object(record.get("config", {}), f"run.json: '{run_path}', 'config'")
        fields(config, {}, f"run.json: '{run_path}', 'config'", CONFIG_MAY)
        epochs = read_metrics(metrics_path)
        summary_path = os.path.join(path, "summary.json")
        summary = None
        if os.path.lexists(summary_path):
            where = f"summary.json: '{summary_path}'"
            summary = json_object(read_json(summary_path, "summary.json"), where)
            fields(summary, SUMMARY, where, SUMMARY_MAY)
        trace_path = os.path.join(path, "trace.json")
        events = trace_events(trace_path)
        phases = rank_phases(trace_path, events)
    except Unreadable as exc:
        raise Unreadable(f"report: {exc}") from None
    return Run(path, config, epochs, summary, phases, trace=events)


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
