"""``python -m minidp train`` as a user runs it: outputs, run directories, resume, bad input."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from spmd import ROOT, run_spmd

QUICK = ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp",
         "--train-samples", "1200", "--test-samples", "400", "--no-progress"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def train(args, nprocs, data_dir, timeout=180):
    if "--batch-size" not in args and "--global-batch-size" not in args:
        args = args + ["--batch-size", "16"]
    return run_spmd(QUICK + ["--data-dir", data_dir] + args, nprocs, timeout=timeout)


def train_here(args, cwd, data_dir, env=None, timeout=120):
    """One rank, no mpiexec, in the working directory ``cwd``: (exit status, output)."""
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {}))
    proc = subprocess.run([sys.executable, *QUICK, "--data-dir", data_dir, "--batch-size", "16",
                           *args], cwd=cwd, env=full, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)
    return proc.returncode, proc.stdout


def epochs_in(out):
    return [json.loads(line)["epoch"] for line in open(os.path.join(out, "metrics.jsonl"))]


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
    (["--strategy", "easgd"], 2, "--strategy: got 'easgd', allowed: sync, hsgd, hbsgd, daso, "
                                 "asgd, amsgd, hogwild, softsync, dbs"),
    (["--ranks-per-node", "3"], 4, "ranks_per_node 3 must be a positive divisor of the world "
                                   "size 4"),
    (["--global-batch-size", "2"], 4, "--global-batch-size: got 2, allowed: a multiple of the "
                                      "4 workers"),
    (["--batch-size", "400"], 4, "batch size 400 for"),
    (["--lr", "-1"], 2, "--lr: got -1.0, allowed: a finite number > 0"),
    (["--net-latency-us", "inf"], 2, "--net-latency-us: got inf, allowed: a finite number in [0, "
                                     "1e+06]"),
    (["--stop-after", "1"], 2, "--stop-after 1: allowed only with --checkpoint-every N"),
    (["--config", "{toml}"], 2, "nesterov: got 'false' (str), allowed: a bool (true or false)"),
])
def test_bad_input_is_a_clear_error_and_a_nonzero_exit(tmp_path, data_dir, args, nprocs,
                                                       message):
    toml = tmp_path / "run.toml"
    toml.write_text('nesterov = "false"\n')
    args = [str(toml) if a == "{toml}" else a for a in args]
    launch = train(args + ["--out", str(tmp_path / "bad")], nprocs, data_dir, timeout=90)
    assert launch.returncode not in (0, None), launch.output
    assert message in launch.output
    assert launch.output.count("error: ") == 1, launch.output  # every rank alike: rank 0's


def test_runs_without_out_get_new_directories(tmp_path, data_dir):
    for _ in range(2):
        status, output = train_here(["--epochs", "1"], str(tmp_path), data_dir)
        assert status == 0, output
    assert "out: runs/0002" in output
    runs = tmp_path / "runs"
    assert sorted(os.listdir(runs)) == ["0001", "0002", "latest"]
    assert os.readlink(runs / "latest") == "0002"
    record = json.loads((runs / "0002" / "run.json").read_text())
    assert record["config"]["out"] == "runs/0002" and record["world_size"] == 1
    assert record["command"][1:3] == ["train", "--dataset"]
    assert epochs_in(runs / "0001") == epochs_in(runs / "0002") == [1]


def test_a_reused_out_is_refused_and_overwrite_replaces_it(tmp_path, data_dir):
    out = str(tmp_path / "run")
    status, output = train_here(["--epochs", "4", "--checkpoint-every", "1", "--out", out],
                                str(tmp_path), data_dir)
    assert status == 0, output
    again = ["--epochs", "2", "--batch-size", "32", "--checkpoint-every", "1", "--out", out]
    status, output = train_here(again, str(tmp_path), data_dir)
    assert status == 2
    claim = json.load(open(os.path.join(out, "run.json")))["minidp_run"]
    assert output.strip().splitlines()[-1] == (
        f"error: --out '{out}' holds another run (run.json, metrics.jsonl, summary.json, "
        f"model.npz, checkpoints, trace.json; pid {claim['pid']} on host {claim['host']} at "
        f"{claim['time']}); pass --resume to continue it, --overwrite to replace it, or no "
        "--out for a new directory under runs/")
    status, output = train_here(again + ["--overwrite"], str(tmp_path), data_dir)
    assert status == 0, output
    assert (f"--overwrite: removing run.json, metrics.jsonl, summary.json, model.npz, "
            f"checkpoints, trace.json from '{out}'") in output
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["epoch-0001", "epoch-0002"]
    assert epochs_in(out) == [1, 2]
    assert json.load(open(os.path.join(out, "run.json")))["config"]["batch_size"] == 32


def test_resume_refuses_another_configuration_and_a_finished_run(tmp_path, data_dir):
    out = str(tmp_path / "run")
    common = ["--checkpoint-every", "1", "--out", out]
    first = train(["--epochs", "2"] + common, 2, data_dir)
    assert first.returncode == 0, first.output
    refusals = [
        (["--epochs", "3", "--batch-size", "32", "--momentum", "0.5"],
         f"error: --resume: cannot continue checkpoint '{out}/checkpoints/epoch-0002': "
         "--batch-size: checkpoint 16, now 32; --momentum: checkpoint 0.9, now 0.5"),
        (["--epochs", "2"], "the run is complete (checkpoint at epoch 2, --epochs 2)"),
        (["--epochs", "1"], "the run is complete (checkpoint at epoch 2, --epochs 1)")]
    for args, message in refusals:
        launch = train(args + common + ["--resume"], 2, data_dir)
        assert launch.returncode not in (0, None), launch.output
        assert message in launch.output and launch.output.count("error: ") == 1, launch.output
    assert epochs_in(out) == [1, 2]
    # sync: every replica is the same, so one rank may continue what two started
    more = train(["--epochs", "3", "--resume"] + common, 1, data_dir)
    assert more.returncode == 0, more.output
    assert epochs_in(out) == [1, 2, 3]
    assert sorted(os.listdir(os.path.join(out, "checkpoints"))) == ["epoch-0002", "epoch-0003"]


def test_resume_auto_starts_then_continues(tmp_path, data_dir):
    out = str(tmp_path / "job")
    job = ["--epochs", "2", "--checkpoint-every", "1", "--stop-after", "1", "--resume", "auto",
           "--out", out]
    status, output = train_here(job, str(tmp_path), data_dir)
    assert status == 0, output
    assert f"out: {out}\n" in output and epochs_in(out) == [1]
    status, output = train_here(job, str(tmp_path), data_dir)
    assert status == 0, output
    assert f"out: {out} (resuming after epoch 1)" in output and epochs_in(out) == [1, 2]
    record = json.load(open(os.path.join(out, "run.json")))
    assert [r["from_epoch"] for r in record["resumed"]] == [1]


def test_a_bad_environment_variable_is_a_user_error_not_a_crash(tmp_path, data_dir):
    env = {"MINIDP_COMM_TIMEOUT": "5m"}
    proc = subprocess.run([sys.executable, "-m", "minidp", "--help"], cwd=ROOT, text=True,
                          env=dict(os.environ, **env), capture_output=True, timeout=60)
    assert proc.returncode == 0 and "train" in proc.stdout, proc.stderr
    status, output = train_here([], str(tmp_path), data_dir, env=env)
    assert status == 2
    assert output.strip().splitlines()[-1] == ("error: MINIDP_COMM_TIMEOUT: got '5m', allowed: "
                                               "a number of seconds >= 1 (e.g. 300)")


def test_console_script_is_python_m_mpi4py_m_minidp():
    import configparser
    import importlib

    setup = configparser.ConfigParser()
    setup.read(os.path.join(ROOT, "setup.cfg"))
    name, target = setup["options.entry_points"]["console_scripts"].strip().split(" = ")
    module, function = target.split(":")
    assert name == "minidp" and function == "console"
    console = getattr(importlib.import_module(module), function)
    launch = run_spmd(["-c", "import sys; from minidp.__main__ import console; "
                       "sys.argv[1:] = ['info']; console()"], 2, under_mpi4py=False, timeout=60)
    assert launch.returncode == 0, launch.output
    assert launch.output.count('"mpi_world_size": 2') == 2 and callable(console)
