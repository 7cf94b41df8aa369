"""SPMD: the Trainer through its Python API: data checks on every rank, evaluation sharding."""

import json
import os

import numpy as np
import pytest
from mpi4py import MPI

from minidp.io.datasets import synthetic
from minidp.io.mdp import write_mdp
from minidp.run import run_json
from minidp.run.config import TrainConfig
from minidp.run.trainer import Trainer

world = MPI.COMM_WORLD


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    path = None
    if world.rank == 0:
        path = str(tmp_path_factory.mktemp("data"))
        data = synthetic(train_samples=300, test_samples=103)
        write_mdp(f"{path}/synthetic-train.mdp", data.x_train, data.y_train, 10, progress=False)
        write_mdp(f"{path}/synthetic-test.mdp", data.x_test, data.y_test, 10, progress=False)
    return world.bcast(path)


def config(data_dir, tmp, **kw):
    return TrainConfig(**dict(dict(dataset="synthetic", model="mlp", epochs=1, batch_size=8,
                                   data_dir=data_dir, out=str(tmp), progress=False), **kw))


def test_dataset_missing_on_some_ranks_is_an_error_on_every_rank(data_dir, tmp_path):
    if world.size == 1:
        pytest.skip("needs a second rank whose --data-dir differs")
    mine = data_dir if world.rank != world.size - 1 else str(tmp_path / "elsewhere")
    with pytest.raises(FileNotFoundError, match=rf"rank {world.rank}: dataset files unusable on "
                                                rf"rank\(s\) {world.size - 1}: .*every rank must "
                                                "read the same --data-dir"):
        Trainer(config(mine, tmp_path))


def test_only_the_rank_that_writes_run_json_asks_git_for_the_commit(data_dir, tmp_path,
                                                                  monkeypatch):
    asked = []
    ask = run_json.git_commit
    monkeypatch.setattr(run_json, "git_commit", lambda directory: asked.append(directory) or
                        ask(directory))
    out = world.bcast(str(tmp_path / "run"))
    Trainer(config(data_dir, out)).fit()
    assert world.allgather(len(asked)) == [1] + [0] * (world.size - 1)
    with open(os.path.join(out, "run.json")) as f:
        recorded = json.load(f)["git_commit"]
    assert world.allgather(recorded) == [ask(world.bcast(asked[0] if asked else None))] * \
        world.size


def test_evaluation_covers_the_test_set_once(data_dir, tmp_path):
    trainer = Trainer(config(data_dir, world.bcast(str(tmp_path)), test_samples=101))
    counts = world.allgather(len(trainer.data.test_y))
    assert sum(counts) == 101 and max(counts) - min(counts) <= 1
    loss, accuracy = trainer.evaluate()
    assert world.allgather((loss, accuracy)) == [(loss, accuracy)] * world.size
    assert 0 <= accuracy <= 1 and np.isfinite(loss)


@pytest.mark.parametrize("strategy,options", [("asgd", {}), ("dbs", {}),
                                              ("softsync", {"n": 1}), ("asgd", {"servers": 2})])
def test_parameter_server_epochs_use_every_sample_once(data_dir, tmp_path, strategy, options):
    servers = options.get("servers", 1)
    if world.size <= servers:
        with pytest.raises(ValueError, match=f"needs {servers} server rank"):
            Trainer(config(data_dir, tmp_path, strategy=strategy, options=options))
        return
    out = world.bcast(str(tmp_path))
    trainer = Trainer(config(data_dir, out, strategy=strategy, epochs=2, options=options,
                             slowdown=f"{world.size - 1}:2"))
    assert trainer.topology.role == ("server" if world.rank < servers else "worker")
    summary = trainer.fit()
    workers = world.size - servers
    for m in summary["epochs"]:
        stats = m["strategy"]
        assert sum(stats["worker_samples"].values()) == m["samples"]
        assert stats["gradients"] == m["steps"]
        if strategy != "dbs":
            assert m["samples"] == trainer.batches * 8 * workers
        else:
            assert trainer.batches * 8 * workers - 4 * 8 < m["samples"] <= \
                trainer.batches * 8 * workers
        assert 0 <= stats["server_busy_share"] <= 1
    centre = trainer.strategy.consensus().copy()
    assert all(np.array_equal(c, centre) for c in world.allgather(centre))
    if world.rank == 0:
        model = np.load(f"{out}/model.npz")
        state = trainer.model.state_dict()
        trainer.strategy.flat.data[...] = centre
        for key in model.files:
            np.testing.assert_array_equal(model[key], np.asarray(state[key]))


def deterministic_strategies():
    """Strategies whose result does not depend on arrival order at this world size.

    Two ranks: every family (one server and one worker, or two single-rank nodes);
    four ranks as 2x2: the gradients in a node window, shared by two ranks, and DASO's
    identical node, whose parameters move into a node window (the staging follows).
    """
    if world.size == 2:
        return ["sync", "hsgd", "hbsgd", "daso", "easgd-sync", "asgd", "amsgd", "softsync",
                "dbs", "easgd-rr", "easgd-async", "measgd-async", "hogwild", "easgd-hogwild"]
    return ["hsgd", "daso"] if world.size == 4 else []


@pytest.mark.parametrize("strategy", deterministic_strategies())
def test_computing_on_a_replica_changes_no_bit(data_dir, tmp_path, monkeypatch, strategy):
    """The GPU path's staging (parameters up, gradients down, BatchNorm statistics both
    ways) run with a host replica: every strategy's result is the host run's, bit for bit."""
    results = []
    for replica in ("0", "1"):
        monkeypatch.setenv("MINIDP_HOST_REPLICA", replica)
        out = world.bcast(str(tmp_path / replica))
        trainer = Trainer(config(data_dir, out, strategy=strategy, dtype="float64",
                                 train_samples=160, test_samples=40,
                                 ranks_per_node=world.size // 2))
        assert type(trainer.compute).__name__ == ("DeviceReplica" if replica == "1"
                                                  else "HostCompute")
        summary = trainer.fit()
        results.append((trainer.consensus_state(), summary["final"]["test_loss"]))
    (host, host_loss), (replica, replica_loss) = results
    assert replica_loss == host_loss
    for key in host:
        np.testing.assert_array_equal(replica[key], host[key], err_msg=key)
