"""A finished run read back for its replay: configuration, events, the model and the data.

Everything the replay starts from is what the run wrote (``run.json``, ``summary.json``,
``events.json``, ``model.npz``) and the dataset file it trained on. What cannot be
replayed exactly is refused with the reason (:class:`CannotReplay`, exit status 2):
a strategy without events, a resumed run, a reader whose shards depend on the node
layout, a model with dropout, gradients computed on a GPU. So is what does not check
(:mod:`minidp.replay.checks`: the files' form; here, a dataset file whose payload does
not match its header's checksum, damaged or changed since the run), before a single
gradient is taken, so that exit status 1 ("differs") only ever blames the run.

The model is built as the Trainer builds it (the seed, ``model_for``, the dtype): rank
0's draw, which every rank of the run started from. A worker's samples are re-read as
its Trainer read them: its shard of the epoch in the reader's order, another pass in a
new order when it runs out (:class:`minidp.io.training_data.Batches`, the same code).
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import numpy as np
from mpi4py import MPI

from minidp import Tensor, layers, optim
from minidp import functional as F
from minidp.io.mdp import read_header
from minidp.io.prepare import dataset_paths
from minidp.io.readers import open_reader, verify_checksum
from minidp.io.training_data import Batches, TrainingData
from minidp.replay.checks import (
    CONFIG,
    ELASTIC,
    OPTIONS,
    SUMMARY,
    SUMMARY_MAY,
    CannotReplay,
    Unreadable,
    check_events,
    check_fields,
    json_object,
    load_json,
    load_model,
)

__all__ = ["ELASTIC", "CannotReplay", "Recorded", "Workers", "read_run"]

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
    record = load_json(os.path.join(path, "run.json"), "run.json")
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
    check_fields(config, CONFIG, where)
    check_fields(config["options"], OPTIONS[strategy], f"{where}, 'options'")
    summary_path = os.path.join(path, "summary.json")
    summary = load_json(summary_path, "summary.json", "written when a run finishes")
    check_fields(summary, SUMMARY, f"summary.json: '{summary_path}'", SUMMARY_MAY)
    if summary.get("device", "cpu") != "cpu":
        raise CannotReplay(f"the run computed its gradients on {summary['device']}; the "
                           "replay computes them on the CPU, whose rounding differs")
    if config["reader"] not in READERS:
        raise CannotReplay(f"reader {config['reader']!r}: its shards follow the node "
                           f"layout; replayed: {', '.join(READERS)}")
    events_path = os.path.join(path, "events.json")
    events = load_json(events_path, "events.json")
    check_events(events, strategy, summary["world_size"], config["epochs"],
                 f"events.json: '{events_path}'")
    return Recorded(path, config, summary, events, load_model(os.path.join(path, "model.npz")))


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
