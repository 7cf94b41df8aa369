"""Shared by the replay's SPMD files: the data, a run through the Trainer, its replay, its record.

Every run: 4 ranks (one server or master, workers 1, 2, 3), an MLP on 240 synthetic
samples of 6x6, batch 8 (10 batches per worker per epoch; a parameter server's epoch
budget is 30 batches), 2 epochs, float64 unless a case says otherwise, lr 0.05.
"""

import json
import os
from collections import Counter

from mpi4py import MPI

from minidp.io.datasets import synthetic
from minidp.io.mdp import write_mdp
from minidp.replay import replay
from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

world = MPI.COMM_WORLD
GRADIENT, EPOCH_END = 0, 2  # a server's event kinds in events.json (docs/replay.md)


def write_data(tmp_path_factory):
    """The synthetic dataset's two files, written by rank 0; their directory on every rank."""
    path = None
    if world.rank == 0:
        path = str(tmp_path_factory.mktemp("data"))
        data = synthetic(train_samples=240, test_samples=40, shape=(1, 6, 6), noise=2.0)
        write_mdp(f"{path}/synthetic-train.mdp", data.x_train, data.y_train, 10)
        write_mdp(f"{path}/synthetic-test.mdp", data.x_test, data.y_test, 10)
    return world.bcast(path)


def train(data_dir, tmp_path, strategy, options=None, **settings):
    """Train on every rank; returns the run directory (the same on every rank)."""
    out = world.bcast(str(tmp_path / strategy))
    config = TrainConfig(**dict(dict(
        strategy=strategy, options=options or {}, dataset="synthetic", model="mlp", epochs=2,
        batch_size=8, train_samples=240, test_samples=40, dtype="float64", lr=0.05,
        momentum=0.0, data_dir=data_dir, out=out, progress=False), **settings))
    Trainer(config).fit()
    return out


def replayed(out, **kwargs):
    """Rank 0 replays the run; every rank gets the outcome (so every rank fails alike)."""
    outcome = replay(out, **kwargs) if world.rank == 0 else None
    return world.bcast(outcome)


def occurred(outcome):
    """The staleness values the replay met, as {value: how many}: the case's statement."""
    return dict(sorted(Counter(outcome.staleness).items()))


def events(out):
    """The run's events.json, on every rank."""
    with open(os.path.join(out, "events.json")) as f:
        return json.load(f)


def worker_rows(out):
    """Each worker's rows (epoch, samples, versions read), by rank."""
    return {r["rank"]: r["rows"] for r in events(out)["ranks"] if r["role"] == "worker"}


def server_rows(out, server=0):
    """One server's rows (kind, worker, staleness, samples), in the order it handled them."""
    return next(r["rows"] for r in events(out)["ranks"] if r["rank"] == server)
