"""``python -m minidp train`` as a user runs it: outputs, run directories, resume, bad input."""

import json
import os
import re
import shutil
import subprocess
import sys

import numpy as np
import pytest
from spmd import ROOT, WATCHDOG_FIRED, finish_job, run_spmd, start_job

from minidp.io import mdp
from minidp.run.config import TrainConfig

# `make test` runs the module on one pytest-xdist worker: its fixtures are shared.
pytestmark = pytest.mark.xdist_group("train_cli")

QUICK = ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp",
         "--train-samples", "1200", "--test-samples", "400", "--no-progress"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


HANG_S = 900  # a hang guard for one job, never a bound a test asserts: a loaded machine
# may take minutes where an idle one takes seconds


def train(args, nprocs, data_dir, timeout=HANG_S, env=None):
    if "--batch-size" not in args and "--global-batch-size" not in args:
        args = args + ["--batch-size", "16"]
    return run_spmd(QUICK + ["--data-dir", data_dir] + args, nprocs, timeout=timeout, env=env)


def start_here(args, cwd, data_dir, env=None):
    """Start one rank, no mpiexec, in the working directory ``cwd`` (:func:`train_here`)."""
    full = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
                **(env or {}))
    return start_job([sys.executable, *QUICK, "--data-dir", data_dir, "--batch-size", "16",
                      *args], cwd, full)


def train_here(args, cwd, data_dir, env=None):
    """One rank, no mpiexec, in the working directory ``cwd``: (exit status, output).

    Started as :func:`spmd.start_job` starts a job: in a process group of its own, its
    MPI shared-memory files watched; a job still running after :data:`HANG_S` seconds
    is killed (what it mapped removed) and fails the test.
    """
    proc = start_here(args, cwd, data_dir, env)
    output, killed = finish_job(proc, HANG_S)
    assert not killed, f"still running after {HANG_S} s (a hang):\n{output}"
    return proc.returncode, output


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
    (["--ranks-per-node", "3"], 4, "--ranks-per-node: got 3 for the job's 4 ranks (mpiexec -n "
                                   "4), allowed: a divisor of 4 (1, 2, 4)"),
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
    launch = train(args + ["--out", str(tmp_path / "bad")], nprocs, data_dir)
    ended_alike(launch, 2)
    assert message in launch.output
    assert launch.output.count("error: ") == 1, launch.output  # every rank alike: rank 0's


def ended_alike(launch, status):
    """Every rank reached the same end: a normal exit with ``status``, never MPI_Abort
    (which prints a banner per rank and leaves shared memory in /dev/shm)."""
    assert launch.returncode == status, launch.output
    assert "MPI_Abort" not in launch.output and "Traceback" not in launch.output, launch.output
    assert WATCHDOG_FIRED not in launch.output, launch.output


@pytest.mark.parametrize("args, env, nprocs, message", [
    (["--epochs", "1.5"], {}, 2, "error: argument --epochs: invalid int value: '1.5' (see "
                                 "python -m minidp train --help)"),
    (["--comm-timeout", "1e-9"], {}, 2, "error: --comm-timeout: got 1e-09, allowed: a finite "
                                        "number of seconds >= 1"),
    ([], {"MINIDP_COMM_TIMEOUT": "abc"}, 2, "error: MINIDP_COMM_TIMEOUT: got 'abc', allowed: a "
                                           "number of seconds >= 1 (e.g. 300)"),
    ([], {"MINIDP_BACKEND": "foo"}, 1, "error: MINIDP_BACKEND: got 'foo', allowed: numpy, "
                                       "cupy"),
    (["--slowdown", "5:2"], {}, 1, "error: --slowdown: rank 5 in '5:2', allowed: a rank in "
                                   "[0, 1)"),
    (["--test-samples", "99999999"], {}, 1, "error: --test-samples: got 99999999, allowed: 1 to "
                                            "2000 (the records in '{data}/synthetic-test.mdp')"),
    (["--data-dir", "{fifos}"], {}, 1, "error: dataset file '{fifos}/synthetic-train.mdp' is a "
                                       "FIFO (named pipe), not a regular file"),
])
def test_bad_input_issue_29_lists_is_one_line_and_status_2(tmp_path, data_dir, args, env,
                                                           nprocs, message):
    fifos = tmp_path / "fifos"
    fifos.mkdir()
    for split in ("train", "test"):  # opened, they would wait for a writer for ever
        os.mkfifo(fifos / f"synthetic-{split}.mdp")
    args = [a.format(fifos=fifos) for a in args] + ["--out", str(tmp_path / "bad")]
    message = message.format(data=data_dir, fifos=fifos)
    if nprocs == 1:  # one process, no mpiexec: what the error costs, not the launcher
        status, output = train_here(args, str(tmp_path), data_dir, env=env)
        assert status == 2 and "Traceback" not in output, output
        assert output.strip().splitlines()[-1].startswith(message), output
    else:
        launch = train(args, nprocs, data_dir, env=env)
        ended_alike(launch, 2)
        assert message in launch.output and launch.output.count("error: ") == 1, launch.output
    assert not os.path.exists(tmp_path / "bad")  # refused before the directory was claimed


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
        f"model.npz, checkpoints, trace.json; pid {claim['pid']} on host {claim['host']} "
        f"(started {claim['started']})); pass --resume to continue it, --overwrite to replace "
        "it, or no --out for a new directory under runs/")
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
                          env=dict(os.environ, **env), capture_output=True, timeout=HANG_S)
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
                       "sys.argv[1:] = ['info']; console()"], 2, under_mpi4py=False,
                       timeout=HANG_S)
    assert launch.returncode == 0, launch.output
    assert launch.output.count('"mpi_world_size": 2') == 2 and callable(console)


def test_resume_auto_never_deletes_what_minidp_did_not_write(tmp_path, data_dir):
    out = tmp_path / "theirs"  # issue 29: resume auto removed these
    (out / "checkpoints").mkdir(parents=True)
    (out / "checkpoints" / "resnet50_epoch90.pt").write_text("90 epochs of someone's work")
    (out / "summary.json").write_text('{"top1": 76.1}')
    status, output = train_here(["--epochs", "1", "--resume", "auto", "--out", str(out)],
                                str(tmp_path), data_dir)
    assert status == 2, output
    assert output.strip().splitlines()[-1] == (
        f"error: --out '{out}' holds summary.json, checkpoints but no run of minidp's (its "
        "run.json is missing), and minidp touches only what it wrote; move them away, or choose "
        "another --out")
    assert sorted(p.name for p in out.rglob("*")) == ["checkpoints", "resnet50_epoch90.pt",
                                                      "summary.json"]


def test_two_jobs_started_together_on_one_out_one_is_refused(tmp_path, data_dir):
    from concurrent.futures import ThreadPoolExecutor

    out = str(tmp_path / "one")
    with ThreadPoolExecutor(2) as pool:
        launches = list(pool.map(lambda _: train(["--epochs", "1", "--out", out], 2, data_dir),
                                 range(2)))
    assert sorted(launch.returncode for launch in launches) == [0, 2], launches
    refused = next(launch for launch in launches if launch.returncode == 2)
    ended_alike(refused, 2)
    claim = json.load(open(os.path.join(out, "run.json")))["minidp_run"]
    assert re.search(rf"error: --out '{re.escape(out)}' (is in use by a running job: |holds "
                     rf"another run \([a-z., ]+; )pid {claim['pid']} on host ", refused.output)
    assert refused.output.count("error: ") == 1, refused.output
    assert epochs_in(out) == [1]  # one run's rows, not two


def strict_rows(out):
    """metrics.jsonl, read by a parser that refuses NaN and Infinity (as JSON does)."""
    def refuse(word):
        raise ValueError(f"not JSON: {word}")
    return [json.loads(line, parse_constant=refuse)
            for line in open(os.path.join(out, "metrics.jsonl"))]


def test_resume_takes_a_new_lr_diverges_to_a_finite_checkpoint_and_refuses_other_data(
        tmp_path):
    """One batch per epoch, float64, no momentum: the step after a resume is -lr x gradient."""
    data = str(tmp_path / "data")  # its own: the training file is rewritten at the end
    common = ["--epochs", "3", "--checkpoint-every", "1", "--dtype", "float64", "--momentum",
              "0", "--train-samples", "64", "--batch-size", "32", "--stop-after", "1"]
    runs = {name: str(tmp_path / name) for name in ("base", "lr1", "lr2", "diverged")}
    assert train(common + ["--out", runs["base"]], 2, data).returncode == 0
    for name, lr in (("lr1", "0.01"), ("lr2", "0.02"), ("diverged", "1e300")):
        shutil.copytree(runs["base"], runs[name])
        launch = train(common + ["--out", runs[name], "--resume", "--lr", lr], 2, data)
        if name != "diverged":
            ended_alike(launch, 0)
    before = np.load(os.path.join(runs["base"], "model.npz"))
    after = [np.load(os.path.join(runs[n], "model.npz")) for n in ("lr1", "lr2")]
    for key in before.files:  # twice the rate, twice the step: the new --lr from its first step
        step1, step2 = after[0][key] - before[key], after[1][key] - before[key]
        np.testing.assert_allclose(step2, 2 * step1, rtol=1e-6, atol=1e-15)
    assert np.abs(after[0]["1.weight"] - before["1.weight"]).max() > 0
    changed = json.load(open(os.path.join(runs["lr1"], "run.json")))["resumed"][0]["changed"]
    default_lr = TrainConfig(strategy="sync").check().lr  # the base run's: sync's default
    assert changed == {"lr": [default_lr, 0.01], "out": [runs["base"], runs["lr1"]]}  # copied
    # diverged: the rate of 1e300 sends the parameters past float64's range in one step
    ended_alike(launch, 4)
    assert launch.output.count("error: ") == 1, launch.output
    assert (f"error: the run diverged: the test loss (nan) is not finite after epoch 2; the "
            f"last checkpoint, '{runs['diverged']}/checkpoints/epoch-0001', is finite: continue "
            f"from it with a lower rate: --resume --out {runs['diverged']} --lr 1e+299") \
        in launch.output
    assert os.listdir(os.path.join(runs["diverged"], "checkpoints")) == ["epoch-0001"]
    rows = strict_rows(runs["diverged"])
    assert [r["epoch"] for r in rows] == [1, 2] and rows[1]["test_loss"] is None
    # another training file under the same name: the checkpoint knows it is not its own
    train_file = os.path.join(data, "synthetic-train.mdp")
    x, y, header = mdp.read_mdp(train_file)
    mdp.write_mdp(train_file, x[::-1], y[::-1], header.num_classes, shuffled=True)
    refused = train(common + ["--out", runs["lr1"], "--resume"], 2, data)
    ended_alike(refused, 2)
    assert (f"error: --resume: cannot continue checkpoint '{runs['lr1']}/checkpoints/epoch-0002"
            f"': train data file '{train_file}' is another file than the checkpoint's: header "
            f"checksum: checkpoint {header.sealed_checksum}, now ") in refused.output


def test_a_full_disk_is_one_line_naming_the_file_and_leaves_no_tmp(tmp_path, data_dir):
    out = str(tmp_path / "run")
    # virtual nodes of one rank: MPI's shared windows stay below the limit, a checkpoint not
    job = ["--epochs", "3", "--checkpoint-every", "1", "--ranks-per-node", "1", "--out", out]
    status, output = train_here(job + ["--stop-after", "1"], str(tmp_path), data_dir)
    assert status == 0, output
    limited = ["tests/scripts/train_file_limit.py", str(3_000_000), *QUICK[2:], "--data-dir",
               data_dir, "--batch-size", "16", *job, "--resume", "--stop-after", "1"]
    launch = run_spmd(limited, 2, timeout=HANG_S)
    ended_alike(launch, 2)
    assert launch.output.count("error: ") == 1, launch.output
    run_id = json.load(open(os.path.join(out, "run.json")))["minidp_run"]["run_id"]
    assert (f"error: cannot write '{out}/checkpoints/epoch-0002.tmp-{run_id}/rank-00000.npz': "
            "File too large (EFBIG); free space there (or raise the file size limit) and run "
            "again") in launch.output
    assert os.listdir(os.path.join(out, "checkpoints")) == ["epoch-0001"]  # no .tmp left
    status, output = train_here(job + ["--resume"], str(tmp_path), data_dir)
    assert status == 0, output
    assert "resuming after epoch 1" in output and epochs_in(out) == [1, 2, 3]
