"""``python -m minidp train`` as a user runs it: outputs, exact resume, bad input."""

import json
import os

import numpy as np
import pytest
from spmd import run_spmd

QUICK = ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp",
         "--train-samples", "1200", "--test-samples", "400", "--no-progress"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def train(args, nprocs, data_dir, timeout=180):
    if "--batch-size" not in args and "--global-batch-size" not in args:
        args = args + ["--batch-size", "16"]
    return run_spmd(QUICK + ["--data-dir", data_dir] + args, nprocs, timeout=timeout)


def test_daso_run_writes_every_output(tmp_path, data_dir):
    out = str(tmp_path / "run")
    launch = train(["--strategy", "daso", "--ranks-per-node", "2", "--epochs", "3",
                    "--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=1",
                    "--net-latency-us", "50", "--net-bandwidth-gbps", "1", "--out", out],
                   4, data_dir)
    assert launch.returncode == 0, launch.output
    assert "daso on 4 rank(s) = 2 node(s) x 2" in launch.output
    metrics = [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]
    assert [m["epoch"] for m in metrics] == [1, 2, 3]
    for m in metrics:
        assert set(m) >= {"epoch", "train_loss", "test_loss", "test_accuracy", "wall_s",
                          "samples", "phases"}
        assert set(m["phases"]) == {"data", "forward", "backward", "comm_intra", "comm_inter",
                                    "wait", "optimizer"}
        assert m["samples"] == (1200 // 4 // 16) * 16 * 4
        assert m["phases"]["comm_inter"] > 0 and m["phases"]["forward"] > 0
    assert metrics[-1]["test_accuracy"] > 0.5
    summary = json.load(open(os.path.join(out, "summary.json")))
    assert summary["world_size"] == 4 and summary["topology"]["num_nodes"] == 2
    assert summary["config"]["options"]["warmup_epochs"] == 1
    assert summary["bytes_sent"]["inter"] > 0 and summary["bytes_sent"]["intra"] > 0
    assert summary["final"]["test_accuracy"] == metrics[-1]["test_accuracy"]
    model = np.load(os.path.join(out, "model.npz"))
    assert sorted(model.files) == ["1.bias", "1.weight", "3.bias", "3.weight", "5.bias",
                                   "5.weight"]
    assert model["1.weight"].shape == (512, 784)
    trace = json.load(open(os.path.join(out, "trace.json")))
    assert {e["pid"] for e in trace["traceEvents"]} == {0, 1, 2, 3}
    assert {"forward", "comm_inter", "wait"} <= {e["name"] for e in trace["traceEvents"]}


def test_resume_reaches_exactly_the_uninterrupted_state(tmp_path, data_dir):
    common = ["--strategy", "daso", "--ranks-per-node", "2", "--epochs", "3", "--momentum",
              "0.9", "--schedule", "cosine", "--checkpoint-every", "1",
              "--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=0"]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    assert train(common + ["--out", whole], 4, data_dir).returncode == 0
    first = train(common + ["--out", parts, "--stop-after", "1"], 4, data_dir)
    assert first.returncode == 0, first.output
    assert len(open(os.path.join(parts, "metrics.jsonl")).readlines()) == 1
    second = train(common + ["--out", parts, "--resume"], 4, data_dir)
    assert second.returncode == 0, second.output
    a, b = np.load(os.path.join(whole, "model.npz")), np.load(os.path.join(parts, "model.npz"))
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])
    lines = [json.loads(x) for x in open(os.path.join(parts, "metrics.jsonl"))]
    assert [m["epoch"] for m in lines] == [1, 2, 3]
    assert sorted(os.listdir(os.path.join(parts, "checkpoints"))) == ["epoch-0002", "epoch-0003"]


@pytest.mark.parametrize("args, nprocs, message", [
    (["--set", "daso.max_global_skips=many", "--strategy", "daso"], 2,
     "daso.max_global_skips: got 'many', expected int"),
    (["--set", "daso.max_global_skips=0", "--strategy", "daso"], 2,
     "daso.max_global_skips: got 0, allowed: an int >= 1"),
    (["--set", "sync.k=2"], 2, "strategy 'sync': unknown option(s) k; valid options: (none)"),
    (["--strategy", "easgd"], 2, "--strategy: got 'easgd', allowed: sync, hsgd, hbsgd, daso"),
    (["--ranks-per-node", "3"], 4, "ranks_per_node 3 must be a positive divisor of the world "
                                   "size 4"),
    (["--global-batch-size", "2"], 4, "--global-batch-size: got 2, allowed: a multiple of the "
                                      "4 workers"),
    (["--batch-size", "400"], 4, "batch size 400 for"),
    (["--lr", "-1"], 2, "--lr: got -1.0, allowed: a number > 0"),
])
def test_bad_input_is_a_clear_error_and_a_nonzero_exit(tmp_path, data_dir, args, nprocs,
                                                       message):
    launch = train(args + ["--out", str(tmp_path / "bad")], nprocs, data_dir, timeout=90)
    assert launch.returncode not in (0, None), launch.output
    assert message in launch.output
    assert launch.seconds < 60
