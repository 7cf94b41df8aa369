"""What a run wrote, checked before its replay: nothing that does not check is replayed.

So that exit status 1 ("differs") only ever blames the run, every file the replay starts
from is held to the form minidp writes before a single gradient is taken; what does not
check is :class:`CannotReplay` (exit status 2) with the file, the field or row, and what
is allowed:

* a file that is not a regular file (a FIFO is never waited on:
  :mod:`minidp.reporting.readback`), or not JSON;
* ``run.json``: every configuration field and option the rules read (:data:`CONFIG`,
  :data:`OPTIONS`); ``summary.json``: the world size and the batches (:data:`SUMMARY`);
* ``events.json`` (:func:`check_events`): the format, the strategy, the roles, every
  rank's columns, every row's length and the range of each value, and that the servers'
  (or the master's) events and the workers' steps count the same pushes;
* ``model.npz`` (:func:`load_model`): a NumPy archive of arrays of numbers, no pickle.

The format is restated here from :mod:`minidp.strategies.events` rather than imported:
the replay is the oracle the strategies are checked against and imports none of them.
"""

from __future__ import annotations

import os
import zipfile
from typing import Any

import numpy as np

from minidp import layers, optim
from minidp.io.datasets import DATASETS
from minidp.reporting.readback import (
    FLAG,
    OBJECT,
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

ELASTIC = ("easgd-rr", "easgd-async", "measgd-async")


def _one_of(*allowed: Any) -> tuple[Any, str]:
    return (lambda v: v in allowed and type(v) is type(allowed[0])), \
        f"one of {', '.join(map(repr, allowed))}"


def _number(test: Any, words: str) -> tuple[Any, str]:
    return (lambda v: is_number(v) and test(v)), words


# run.json's configuration: every field the replay reads, in the form train writes it.
CONFIG = {"strategy": TEXT, "model": _one_of(*layers.MODELS), "dataset": _one_of(*DATASETS),
          "data_dir": TEXT, "reader": TEXT, "dtype": _one_of("float32", "float64"),
          "seed": count(0), "train_samples": optional(count(1)),
          "schedule": _one_of(*optim.SCHEDULES), "lr": _number(lambda v: v > 0, "a number > 0"),
          "epochs": count(1), "warmup_epochs": count(0),
          "momentum": _number(lambda v: 0 <= v < 1, "a number in [0, 1)"),
          "weight_decay": _number(lambda v: v >= 0, "a number >= 0"), "nesterov": FLAG,
          "options": OBJECT}
# The options each strategy's rules read (as train resolves them: every one present).
_ELASTIC = {"alpha": _number(lambda v: v == -1 or 0 <= v <= 1, "-1 or a number in [0, 1]"),
            "tau": count(1)}
OPTIONS = {"asgd": {}, "amsgd": {},
           "softsync": {"n": count(1), "rule": _one_of("mean", "each"),
                        "server_momentum": FLAG},
           "dbs": {"update": _one_of("each", "round")},
           "easgd-rr": _ELASTIC, "easgd-async": _ELASTIC,
           "measgd-async": {**_ELASTIC, "delta": _number(lambda v: 0 <= v < 1,
                                                         "a number in [0, 1)")}}
SUMMARY = {"world_size": count(2), "batch_size_per_worker": count(1),
           "batches_per_epoch": count(1)}
SUMMARY_MAY = {"threads_per_rank": count(1), "device": TEXT}
# events.json, as minidp.strategies.events writes it (restated: the replay imports no
# strategy): the columns of each role's rows, and a server's kinds of event.
FORMAT = 1
GRADIENT, LEAVE, EPOCH_END = 0, 1, 2
SERVER_COLUMNS = ["kind", "worker", "staleness", "samples"]
ELASTIC_WORKER_COLUMNS = ["epoch", "samples", "exchanged"]
MASTER_COLUMNS = ["worker", "epoch"]


class CannotReplay(Exception):
    """The run cannot be replayed exactly; the message says why (exit status 2)."""


def load_json(path: str, what: str, missing: str = "") -> dict[str, Any]:
    """The JSON object in the regular file ``path``; CannotReplay naming what is wrong.

    ``missing``: what the message adds when there is no file (why it may be absent).
    """
    if missing and not os.path.lexists(path):
        raise CannotReplay(f"{what}: '{path}' is missing ({missing})")
    try:
        return json_object(read_json(path, what), f"{what}: '{path}'")
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None


def check_fields(record: dict[str, Any], required: dict[str, Any], where: str,
                 present: dict[str, Any] | None = None) -> None:
    """Check a record's fields (:func:`minidp.reporting.readback.fields`); CannotReplay."""
    try:
        fields(record, required, where, present)
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None


def check_events(events: dict[str, Any], strategy: str, world_size: int, epochs: int,
                 where: str) -> None:
    """Raise :class:`CannotReplay` unless ``events`` is this run's, as minidp writes it.

    The roles (servers first), every rank's columns, every row's length and the range of
    each value; and that the pushes agree: each server took as many gradients from a
    worker as the worker took steps (each step pushes one slice to every server), the
    master as many exchanges as the worker's steps say it exchanged.
    """
    check_fields(events, {"format": count(FORMAT), "strategy": TEXT, "servers": _ints,
                     "workers": _ints, "ranks": _records}, where)
    servers, workers = events["servers"], events["workers"]
    if events["format"] != FORMAT or events["strategy"] != strategy or \
            len(events["ranks"]) != world_size:
        raise CannotReplay(f"{where} is not this run's (format {events['format']} of "
                           f"{events['strategy']!r} on {len(events['ranks'])} ranks; the run: "
                           f"format {FORMAT} of {strategy!r} on {world_size})")
    k = len(servers)
    if not 1 <= k < world_size or servers != list(range(k)) or \
            workers != list(range(k, world_size)) or (strategy in ELASTIC and k != 1):
        raise CannotReplay(f"{where}: servers {_cut(servers)} and workers {_cut(workers)}, "
                           f"allowed: ranks 0 to K-1 and K to {world_size - 1}"
                           + (" with K = 1 (the master)" if strategy in ELASTIC else ""))
    for rank, entry in enumerate(events["ranks"]):
        server = rank < k
        columns = (MASTER_COLUMNS if server else ELASTIC_WORKER_COLUMNS) \
            if strategy in ELASTIC else SERVER_COLUMNS if server else \
            ["epoch", "samples", *(f"version_{s}" for s in range(k))]
        at = f"{where}, rank {rank}"
        if entry.get("rank") != rank or entry.get("role") != ("server" if server else
                                                              "worker") \
                or entry.get("columns") != columns or not isinstance(entry.get("rows"), list):
            raise CannotReplay(f"{at}: got rank {_cut(entry.get('rank'))}, role "
                               f"{_cut(entry.get('role'))}, columns {_cut(entry.get('columns'))}"
                               f", allowed: rank {rank}, role "
                               f"{'server' if server else 'worker'}, columns {columns} and "
                               "its rows")
        ranges = _ranges(columns, workers, epochs)
        for n, row in enumerate(entry["rows"]):
            if not isinstance(row, list) or len(row) != len(columns) or not all(
                    is_int(v) and low <= v and (high is None or v <= high)
                    for v, (low, high) in zip(row, ranges)):
                allowed = ", ".join(f"{c} >= {lo}" if hi is None else f"{c} in [{lo}, {hi}]"
                                    for c, (lo, hi) in zip(columns, ranges))
                raise CannotReplay(f"{at}, row {n}: got {_cut(row)}, allowed: {allowed}")
    _check_pushes(events["ranks"], strategy, k, where)


def _ranges(columns: list[str], workers: list[int], epochs: int
            ) -> list[tuple[int, int | None]]:
    """The range of each column's values (None: no upper bound; versions are >= 0)."""
    bounds = {"epoch": (0, epochs - 1), "exchanged": (0, 1), "kind": (GRADIENT, EPOCH_END),
              "worker": (-1, workers[-1])}
    return [bounds.get(c, (0, None)) for c in columns]


def _check_pushes(ranks: list[dict[str, Any]], strategy: str, k: int, where: str) -> None:
    """Each server's (the master's) record of a worker against the worker's own steps."""
    for server in ranks[:k]:  # whose event: a worker's (a server's epoch end: nobody's)
        who = [row[0] for row in server["rows"]] if strategy in ELASTIC else \
            [row[1] for row in server["rows"] if row[0] != EPOCH_END]
        if any(w < k for w in who):
            raise CannotReplay(f"{where}, rank {server['rank']}: an event of rank "
                               f"{min(who)}, allowed: a worker's rank ({k} or more)")
    for entry in ranks[k:]:
        w, rows = entry["rank"], entry["rows"]
        if any(row[1] < 1 for row in rows):
            raise CannotReplay(f"{where}, rank {w}: a step of no samples, allowed: >= 1")
        if strategy in ELASTIC:
            theirs = sum(row[0] == w for row in ranks[0]["rows"])
            mine = sum(row[2] for row in rows)
            if theirs != mine:
                raise CannotReplay(f"{where}: worker {w}'s steps exchanged {mine} times, the "
                                   f"master records {theirs} exchanges with it")
            continue
        for server in ranks[:k]:
            pushes = [row for row in server["rows"] if row[0] == GRADIENT and row[1] == w]
            if len(pushes) != len(rows) or any(row[3] < 1 for row in pushes):
                raise CannotReplay(f"{where}: worker {w} took {len(rows)} steps, server "
                                   f"{server['rank']} records {len(pushes)} gradients from it"
                                   " (each of at least one sample)")


_ints = ((lambda v: isinstance(v, list) and all(is_int(r) for r in v)), "an array of ints")
_records = ((lambda v: isinstance(v, list) and all(isinstance(r, dict) for r in v)),
            "an array of JSON objects, one per rank")


def _cut(value: Any) -> str:
    """``value`` for a message, cut to 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def load_model(path: str) -> dict[str, np.ndarray]:
    """``model.npz``'s arrays: a NumPy archive of numbers (no pickles), else CannotReplay."""
    not_ours = f"model.npz: '{path}' is not the NumPy archive of arrays minidp writes"
    try:
        with open_regular(path, "model.npz", binary=True) as f:
            saved = np.load(f)  # allow_pickle=False: a pickle is an error, never run
            if not isinstance(saved, np.lib.npyio.NpzFile):
                raise CannotReplay(f"{not_ours} (one array, not an archive)")
            with saved:
                result = {k: saved[k] for k in saved.files}
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None
    except (ValueError, OSError, EOFError, KeyError, zipfile.BadZipFile) as exc:
        why = str(exc) if len(str(exc)) <= 80 else str(exc)[:77] + "..."
        raise CannotReplay(f"{not_ours} ({type(exc).__name__}: {why})") from None
    odd = [k for k, a in result.items() if a.dtype.kind not in "fiub"]
    if odd:
        raise CannotReplay(f"{not_ours}: {odd[0]!r} holds {result[odd[0]].dtype}, allowed: "
                           "numbers")
    return result
