"""A finished run read back for its replay: configuration, events, the model and the data.

Everything the replay starts from is what the run wrote (``run.json``, ``summary.json``,
``events.json``, ``model.npz``) and the dataset file it trained on. What cannot be
replayed exactly is refused with the reason (:class:`CannotReplay`, exit status 2):
a strategy without events, a resumed run, a reader whose shards depend on the node
layout, a model with dropout, gradients computed on a GPU.

So is what does not check, before a single gradient is taken, so that exit status 1
("differs") only ever blames the run: a file that is not a regular file (a FIFO is never
waited on: :mod:`minidp.reporting.readback`), not JSON, or not of the form minidp
writes (every configuration field and option the replay uses, :data:`CONFIG`,
:data:`OPTIONS`; every event row's length and range, and that the servers' (or the
master's) events and the workers' steps count the same pushes:
:func:`check_events`); a ``model.npz`` that is no NumPy archive of float arrays; a
dataset file whose payload does not match its header's checksum (damaged, or changed
since the run).

The model is built as the Trainer builds it (the seed, ``model_for``, the dtype): rank
0's draw, which every rank of the run started from. A worker's samples are re-read as
its Trainer read them: its shard of the epoch in the reader's order, another pass in a
new order when it runs out (:class:`minidp.io.training_data.Batches`, the same code).
"""

from __future__ import annotations

import dataclasses
import os
import re
import zipfile
from typing import Any

import numpy as np
from mpi4py import MPI

from minidp import Tensor, layers, optim
from minidp import functional as F
from minidp.io.datasets import DATASETS
from minidp.io.mdp import read_header
from minidp.io.prepare import dataset_paths
from minidp.io.readers import open_reader, verify_checksum
from minidp.io.training_data import Batches, TrainingData
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

REPLAYED = ("asgd", "amsgd", "softsync", "dbs", "easgd-rr", "easgd-async", "measgd-async")
WHY_NOT = {
    "sync": "synchronous: every rank applies the same update, so a run repeats bit for bit",
    "hsgd": "synchronous: a run repeats bit for bit", "hbsgd": "synchronous: a run repeats",
    "daso": "synchronous (decided by its schedule): a run repeats bit for bit",
    "easgd-sync": "synchronous (one tree per step): a run repeats bit for bit",
    "hogwild": "lock-free: what it applied depends on races between writes, not recorded",
    "easgd-hogwild": "lock-free: its centre depends on races between writes, not recorded",
}
READERS = ("mpiio", "memory", "strided")
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


def _load_json(path: str, what: str, missing: str = "") -> dict[str, Any]:
    """The JSON object in the regular file ``path``; CannotReplay naming what is wrong.

    ``missing``: what the message adds when there is no file (why it may be absent).
    """
    if missing and not os.path.lexists(path):
        raise CannotReplay(f"{what}: '{path}' is missing ({missing})")
    try:
        return json_object(read_json(path, what), f"{what}: '{path}'")
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None


def _fields(record: dict[str, Any], required: dict[str, Any], where: str,
            present: dict[str, Any] | None = None) -> None:
    try:
        fields(record, required, where, present)
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None


@dataclasses.dataclass
class Recorded:
    """What one run wrote, checked to be replayable.

    Attributes:
        path: the run directory.
        config: the run's configuration (``run.json``'s, options resolved).
        summary: ``summary.json``.
        events: ``events.json`` (:mod:`minidp.strategies.events`' format).
        result: ``model.npz``'s arrays, by ``state_dict`` name.
    """

    path: str
    config: dict[str, Any]
    summary: dict[str, Any]
    events: dict[str, Any]
    result: dict[str, np.ndarray]

    @property
    def strategy(self) -> str:
        """The strategy's name."""
        return str(self.config["strategy"])

    @property
    def options(self) -> dict[str, Any]:
        """The strategy's options, as the run resolved them."""
        return dict(self.config["options"])

    @property
    def dtype(self) -> np.dtype:
        """The run's float dtype."""
        return np.dtype(self.config["dtype"])

    @property
    def workers(self) -> list[int]:
        """The world ranks of the workers."""
        return list(self.events["workers"])

    @property
    def servers(self) -> list[int]:
        """The world ranks of the servers (or the master)."""
        return list(self.events["servers"])

    @property
    def base_batch(self) -> int:
        """b, the per-worker batch size of the run."""
        return int(self.summary["batch_size_per_worker"])

    @property
    def batches(self) -> int:
        """Batches per worker per epoch (the schedule's unit)."""
        return int(self.summary["batches_per_epoch"])

    def rows(self, rank: int) -> list[list[int]]:
        """World rank ``rank``'s event rows."""
        return self.events["ranks"][rank]["rows"]

    def schedule(self) -> optim.Schedule:
        """The learning-rate schedule, as the Trainer made it (per step of a worker)."""
        c = self.config
        return optim.make_schedule(c["schedule"], c["lr"], c["epochs"] * self.batches,
                                   c["warmup_epochs"] * self.batches)


def read_run(path: str) -> Recorded:
    """Read and check a run directory; raise :class:`CannotReplay` with the reason."""
    if not os.path.isdir(path):
        raise CannotReplay(f"RUN: got {path!r}, allowed: a directory that `minidp train "
                           "--out` wrote")
    record = _load_json(os.path.join(path, "run.json"), "run.json")
    where = f"run.json: '{os.path.join(path, 'run.json')}', 'config'"
    try:
        config = json_object(record.get("config"), where)
    except Unreadable as exc:
        raise CannotReplay(str(exc)) from None
    strategy = config.get("strategy")
    if strategy not in REPLAYED:
        why = WHY_NOT.get(strategy, "it records no events") if isinstance(strategy, str) \
            else "not a strategy's name"
        raise CannotReplay(f"strategy {strategy!r} is not replayed ({why}); replayed: "
                           f"{', '.join(REPLAYED)}")
    if record.get("resumed"):
        raise CannotReplay("the run was resumed from a checkpoint: the events before the "
                           "stop were not kept, so its order is known only from the resume")
    _fields(config, CONFIG, where)
    _fields(config["options"], OPTIONS[strategy], f"{where}, 'options'")
    summary_path = os.path.join(path, "summary.json")
    summary = _load_json(summary_path, "summary.json", "written when a run finishes")
    _fields(summary, SUMMARY, f"summary.json: '{summary_path}'", SUMMARY_MAY)
    if summary.get("device", "cpu") != "cpu":
        raise CannotReplay(f"the run computed its gradients on {summary['device']}; the "
                           "replay computes them on the CPU, whose rounding differs")
    if config["reader"] not in READERS:
        raise CannotReplay(f"reader {config['reader']!r}: its shards follow the node "
                           f"layout; replayed: {', '.join(READERS)}")
    events_path = os.path.join(path, "events.json")
    events = _load_json(events_path, "events.json")
    check_events(events, strategy, summary["world_size"], config["epochs"],
                 f"events.json: '{events_path}'")
    return Recorded(path, config, summary, events, _load_model(os.path.join(path, "model.npz")))


def check_events(events: dict[str, Any], strategy: str, world_size: int, epochs: int,
                 where: str) -> None:
    """Raise :class:`CannotReplay` unless ``events`` is this run's, as minidp writes it.

    The roles (servers first), every rank's columns, every row's length and the range of
    each value; and that the pushes agree: each server took as many gradients from a
    worker as the worker took steps (each step pushes one slice to every server), the
    master as many exchanges as the worker's steps say it exchanged.
    """
    _fields(events, {"format": count(FORMAT), "strategy": TEXT, "servers": _ints,
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


def _load_model(path: str) -> dict[str, np.ndarray]:
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


class Workers:
    """The run's model and every worker's samples, to take gradients as the workers did.

    Args:
        run: the run read back.
        data_dir: where the dataset files are (default: the run's ``--data-dir``).
    """

    def __init__(self, run: Recorded, data_dir: str | None = None) -> None:
        c = run.config
        self.run = run
        train = dataset_paths(c["dataset"], data_dir or c["data_dir"])[0]
        if not os.path.lexists(train):
            raise CannotReplay(f"dataset file {train} is missing: give the run's data with "
                               "--data-dir")
        try:
            self.header = read_header(train)
            # A damaged file, or one changed since the run, would make the replay differ
            # and blame the run: checked whole first, as train checks it at its start.
            verify_checksum(train, self.header, MPI.COMM_SELF)
        except (OSError, ValueError) as exc:
            raise CannotReplay(f"{re.sub(r'^rank 0: ', '', str(exc))}; give the file the run "
                               "trained on with --data-dir") from None
        records = self.header.count if c["train_samples"] is None else c["train_samples"]
        largest = max((row[1] for w in run.workers for row in run.rows(w)), default=0)
        if largest > records:
            raise CannotReplay(f"events.json: a step of {largest} samples, allowed: at most "
                               f"the {records} training samples the run used")
        self.model = self._model()
        self.flat = self.model.flat_parameters()
        self.initial = self.flat.data.copy()
        # One reader: its place among the workers is set before each epoch is read.
        self.reader = open_reader(c["reader"], train, MPI.COMM_SELF, c["seed"],
                                  c["train_samples"])
        self.reader.size = len(run.workers)
        self.data = TrainingData(self.reader, self.header, {}, self.reader.samples_per_rank,
                                 np.empty(0, np.uint8), np.empty(0, np.int64), c["dataset"],
                                 c["seed"], 0, run.summary["world_size"])
        self.open: dict[int, tuple[int, Batches]] = {}  # worker -> (epoch, its batches)

    def _model(self) -> layers.Module:
        c = self.run.config
        layers.manual_seed(c["seed"])
        model = layers.model_for(c["model"], self.header.sample_shape, self.header.num_classes)
        if any(isinstance(m, layers.Dropout) for _, m in model.named_modules()):
            raise CannotReplay(f"model {c['model']!r} has dropout, whose masks the run did "
                               "not record")
        return model.to("cpu").to(self.run.dtype)

    def take(self, worker: int, epoch: int, n: int) -> tuple[Any, Any, str]:
        """Worker ``worker``'s next ``n`` samples of ``epoch``, and where they came from."""
        current = self.open.get(worker)
        if current is None or current[0] != epoch:
            self.reader.rank = self.run.workers.index(worker)  # its shard of the workers
            data = dataclasses.replace(self.data, rank=worker)  # its passes' order
            current = self.open[worker] = (epoch, data.batches(epoch, self.run.base_batch,
                                                               self.run.dtype, "replay"))
        batches = current[1]
        x, y = batches.take(n)
        end = batches.stream.position
        return x, y, f"pass {batches.passes}, samples {end - n}-{end - 1}"

    def gradient(self, params: np.ndarray, x: Any, y: Any) -> np.ndarray:
        """The gradient of the mean cross-entropy at ``params``: a new array.

        The Trainer's forward and backward on the run's model, gradients zeroed first.
        """
        self.flat.data[...] = params
        self.flat.zero_grad()
        F.cross_entropy(self.model(Tensor(x)), y).backward()
        return self.flat.grad.copy()

    def state(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The model's ``state_dict`` with ``params`` as its parameters."""
        self.flat.data[...] = params
        return {k: np.array(v) for k, v in self.model.state_dict().items()}

    def parameter_names(self) -> list[str]:
        """The names of the parameters (``model.npz`` also holds buffers)."""
        return [name for name, _ in self.model.named_parameters()]
