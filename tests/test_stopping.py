"""Stopping on SIGTERM/SIGUSR1 and injected faults, through ``python -m minidp train``.

The signals are raised by ``--inject-fault RANK:STEP:sigterm|sigusr1``: the real handler
runs, at a known step, so where the run stops is deterministic. The tests that send real
signals to a job (at start-up, Ctrl-C to the launcher) know what each launcher does with
them: MPICH's ``mpiexec`` forwards SIGINT, Open MPI's ``mpirun`` sends SIGTERM after a
grace period (docs/reliability.md, a table per launcher).
"""

import json
import os
import re
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import spmd
from spmd import ROOT, environment_outside_mpi, launcher
from test_train_cli import QUICK, train

from minidp.reporting.launcher import mpiexec

# `make test` runs the module on one pytest-xdist worker: its fixtures are shared.
pytestmark = pytest.mark.xdist_group("stopping")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("data"))


def models_equal(a_dir, b_dir):
    a, b = np.load(os.path.join(a_dir, "model.npz")), np.load(os.path.join(b_dir, "model.npz"))
    assert a.files == b.files
    for key in a.files:
        np.testing.assert_array_equal(a[key], b[key])


def metrics(out):
    return [json.loads(line) for line in open(os.path.join(out, "metrics.jsonl"))]


@pytest.mark.parametrize("strategy, nprocs, epochs, extra, step, stopped_at", [
    ("sync", 2, 2, ["--momentum", "0.9", "--schedule", "cosine"], 50,
     "epoch-0001-batch-00014"),
    ("hsgd", 4, 1, ["--ranks-per-node", "2", "--optimizer", "lars", "--set",
                    "hsgd.level2_period=4", "--set", "hsgd.average=parameters"], 5,
     "epoch-0000-batch-00006"),
    ("hbsgd", 4, 1, ["--ranks-per-node", "2", "--set", "hbsgd.k=3"], 7,
     "epoch-0000-batch-00008"),
])
def test_a_signal_stops_between_batches_and_resume_is_bit_exact(tmp_path, data_dir, strategy,
                                                                 nprocs, epochs, extra, step,
                                                                 stopped_at):
    common = ["--strategy", strategy, "--epochs", str(epochs), "--dtype", "float64", *extra]
    whole, parts = str(tmp_path / "whole"), str(tmp_path / "parts")
    kind = "sigusr1" if strategy == "hsgd" else "sigterm"
    # The uninterrupted run gets the signal at its very last step: agreed at the end of the
    # last epoch, it finishes (and says so) rather than promise a checkpoint it never writes.
    last = epochs * (1200 // nprocs // 16)
    finished = train(common + ["--out", whole, "--inject-fault", f"1:{last}:{kind}"], nprocs,
                     data_dir)
    assert finished.returncode == 0, finished.output
    assert ("note: a stop signal (on another rank) came during the last epoch; the run "
            "finished instead of stopping: its results are written, nothing to resume (exit "
            "status 0)") in finished.output
    assert not os.path.exists(os.path.join(whole, "checkpoints"))
    stop = train(common + ["--out", parts, "--inject-fault", f"1:{step}:{kind}"], nprocs,
                 data_dir)
    assert stop.returncode == 3, stop.output
    assert f"rank 1: {kind.upper()} received; stopping at the next batch boundary" in stop.output
    assert re.search(rf"stopped on a signal .* between batches; checkpoint '.*{stopped_at}'",
                     stop.output), stop.output
    assert os.listdir(os.path.join(parts, "checkpoints")) == [stopped_at]
    assert not os.path.exists(os.path.join(parts, "model.npz"))
    again = train(common + ["--out", parts, "--resume"], nprocs, data_dir)
    assert again.returncode == 0, again.output
    batch = int(stopped_at[-5:])
    assert f"resuming in epoch {int(stopped_at[6:10]) + 1}, after batch {batch}" in again.output
    models_equal(whole, parts)
    for a, b in zip(metrics(whole), metrics(parts), strict=True):
        assert (a["epoch"], a["train_loss"], a["test_accuracy"], a["samples"]) == \
               (b["epoch"], b["train_loss"], b["test_accuracy"], b["samples"])
    # every gradient byte of the interrupted epoch counted once
    totals = [json.load(open(os.path.join(d, "summary.json")))["bytes_sent"]
              for d in (whole, parts)]
    assert totals[0] == totals[1]


@pytest.mark.parametrize("strategy, args", [
    ("daso", ["--ranks-per-node", "2", "--set", "daso.warmup_epochs=1",
              "--set", "daso.cooldown_epochs=0"]),
    ("asgd", []),
])
def test_strategies_that_cannot_stop_between_batches_stop_at_the_epoch_end(tmp_path, data_dir,
                                                                          strategy, args):
    common = ["--strategy", strategy, "--epochs", "2", "--dtype", "float64", *args]
    out = str(tmp_path / "run")
    stop = train(common + ["--out", out, "--inject-fault", "2:3:sigterm"], 4, data_dir)
    assert stop.returncode == 3, stop.output
    assert "rank 2: SIGTERM received; stopping at the end of this epoch" in stop.output
    assert "stopped on a signal (on another rank) at the end of epoch 1" in stop.output
    assert os.listdir(os.path.join(out, "checkpoints")) == ["epoch-0001"]
    assert [m["epoch"] for m in metrics(out)] == [1]
    again = train(common + ["--out", out, "--resume"], 4, data_dir)
    assert again.returncode == 0, again.output
    assert [m["epoch"] for m in metrics(out)] == [1, 2]


def test_a_checkpoint_between_batches_resumes_on_its_own_world_size_only(tmp_path, data_dir):
    out = str(tmp_path / "run")
    common = ["--epochs", "2", "--out", out]
    assert train(common + ["--inject-fault", "0:5:sigterm"], 2, data_dir).returncode == 3
    refused = train(common + ["--resume"], 4, data_dir)
    assert refused.returncode == 2, refused.output
    assert ("world size: checkpoint 2 ranks, now 4; it was taken between batches (batch 6 of "
            "epoch 1)") in refused.output


# Cheap runs: 2 ranks, float64, 2 epochs of 10 batches, a checkpoint after each.
EXACT = ["--epochs", "2", "--dtype", "float64", "--train-samples", "320", "--checkpoint-every",
         "1"]


def test_a_nan_gradient_stops_the_run_naming_step_rank_and_parameter(tmp_path, data_dir):
    out = str(tmp_path / "run")
    launch = train(EXACT + ["--out", out, "--inject-fault", "1:13:nan"], 2, data_dir)
    assert launch.returncode not in (0, None), launch.output
    assert ("error: rank 1: the gradient of parameter '1.weight' is not finite at step 13 of the "
            "run (epoch 2, batch 3); it was neither sent nor applied") in launch.output
    # the last good checkpoint is whole and finite (resuming one is tested below)
    last = os.path.join(out, "checkpoints", "epoch-0001")
    assert sorted(os.listdir(last)) == ["meta.json", "rank-00000.npz", "rank-00001.npz"]
    assert json.load(open(os.path.join(last, "meta.json")))["epoch"] == 1
    for rank in (0, 1):
        params = np.load(os.path.join(last, f"rank-0000{rank}.npz"))["params"]
        assert params.dtype == np.float64 and np.isfinite(params).all()


def test_a_kill_inside_a_checkpoint_write_leaves_the_previous_one(tmp_path, data_dir):
    whole, out = str(tmp_path / "whole"), str(tmp_path / "run")
    assert train(EXACT + ["--out", whole], 2, data_dir).returncode == 0
    launch = train(EXACT + ["--out", out, "--inject-fault", "1:2:kill-in-save"], 2, data_dir)
    assert launch.returncode not in (0, None) and not launch.killed, launch.output
    checkpoints = os.path.join(out, "checkpoints")
    run_id = json.load(open(os.path.join(out, "run.json")))["minidp_run"]["run_id"]
    scratch = f"epoch-0002.tmp-{run_id}"  # the run's scratch directory: its id in the name
    assert sorted(os.listdir(checkpoints)) == ["epoch-0001", scratch]
    # rank 1 had written its file when it was killed; the directory was never renamed
    assert "rank-00001.npz" in os.listdir(os.path.join(checkpoints, scratch))
    assert not os.path.exists(os.path.join(out, "model.npz"))
    again = train(EXACT + ["--out", out, "--resume"], 2, data_dir)
    assert again.returncode == 0, again.output
    assert "resuming after epoch 1" in again.output
    assert [m["epoch"] for m in metrics(out)] == [1, 2]
    models_equal(whole, out)  # bit for bit, float64


@pytest.mark.parametrize("spec, message", [
    ("1:0:hang", "--inject-fault: got '1:0:hang', allowed: RANK:STEP:KIND with RANK an int "
                 ">= 0, STEP an int >= 1 and KIND one of raise, exit, kill, hang, slow, nan, "
                 "sigterm, sigusr1, kill-in-save"),
    ("1:5:melt", "--inject-fault: got '1:5:melt', allowed: RANK:STEP:KIND"),
    ("7:5:hang", "--inject-fault: rank 7 in '7:5:hang', allowed: a rank in [0, 2)"),
])
def test_a_bad_fault_is_a_clear_error(tmp_path, data_dir, spec, message):
    launch = train(["--epochs", "1", "--out", str(tmp_path / "run"), "--inject-fault", spec],
                   2, data_dir, timeout=90)
    assert launch.returncode == 2, launch.output
    assert message in launch.output
    assert "Abort" not in launch.output  # every rank alike: a normal end, not MPI_Abort


def rank_processes(launcher):
    """{rank: pid} of the ranks started under the process ``launcher`` (read from /proc)."""
    ranks = {}
    for pid in spmd.descendants(launcher):
        rank = spmd.rank_of(pid)
        if rank is not None:
            ranks[rank] = int(pid)
    return ranks


def catches(pid, signum):
    """Whether the process ``pid`` has a handler for ``signum`` (its SigCgt mask)."""
    try:
        with open(f"/proc/{pid}/status") as f:
            mask = next(line for line in f if line.startswith("SigCgt:")).split()[1]
    except (OSError, StopIteration):
        return False
    return bool(int(mask, 16) >> (signum - 1) & 1)


def start_job(command, tmp_path, **env):
    env = environment_outside_mpi(PYTHONPATH=ROOT, PYTHONUNBUFFERED="1", MPIEXEC_TIMEOUT="100",
                                  **env)
    return spmd.start_job([mpiexec(), "-n", "2", *command], str(tmp_path), env)


def finish_job(job):
    output, killed = spmd.finish_job(job, 120)
    if killed:
        pytest.fail(f"the job did not end:\n{output[-4000:]}")
    return output


def test_signals_during_start_up_stop_every_rank_before_the_first_batch(tmp_path, data_dir):
    """As Slurm's --signal may: SIGTERM to rank 0 and SIGUSR1 to rank 1 while they start.

    The installed ``minidp`` console script, under mpiexec: its handlers are in place
    (the kernel's SigCgt mask of each rank says so) before MPI starts, and the signals are
    sent at once, long before the first batch.
    """
    out = tmp_path / "job"
    console = os.path.join(os.path.dirname(sys.executable), "minidp")
    job = start_job([console, *QUICK[2:], "--data-dir", data_dir, "--batch-size", "16",
                     "--epochs", "1", "--checkpoint-every", "1", "--resume", "auto", "--out",
                     str(out)], tmp_path)
    ranks = {}
    for _ in range(12000):  # 60 s at most, a hang guard
        ranks = rank_processes(job.pid)
        if len(ranks) == 2 and all(catches(pid, signal.SIGTERM) for pid in ranks.values()):
            break
        time.sleep(0.005)
    os.kill(ranks[0], signal.SIGTERM)
    os.kill(ranks[1], signal.SIGUSR1)
    output = finish_job(job)
    assert job.returncode == 3, output
    for rank, name in ((0, "SIGTERM"), (1, "SIGUSR1")):
        assert (f"rank {rank}: {name} received during start-up; stopping before the first "
                "batch (send it again to end now)") in output
    assert output.count("stopped before the first batch") == 1, output
    assert ("rank 0: stopped before the first batch: nothing to resume (a signal: SIGTERM on "
            "this rank) (exit status 3)") in output
    assert "Abort" not in output and "Traceback" not in output, output
    assert not out.exists()  # nothing claimed: the requeued job (--resume auto) starts afresh


# Open MPI's mpirun answers Ctrl-C by sending its ranks SIGCONT, then SIGTERM, then
# SIGKILL, each after odls_base_sigkill_timeout seconds (1 by default): the test gives the
# ranks this long between SIGTERM and SIGKILL, as docs/reliability.md tells a user to.
OPEN_MPI_GRACE_S = 15

# The job signalled must still be training when the signal reaches its ranks, which under
# Open MPI is OPEN_MPI_GRACE_S after the Ctrl-C: 50 epochs of the test's MLP took 12 s on
# a quick machine (CI, 2026-12-04) and ended first. At that run's quickest, 0.1 s an
# epoch, these last 100 s; the signal ends the job long before.
EPOCHS_PAST_THE_SIGNAL = 1000


def test_ctrl_c_to_mpiexec_stops_the_job_with_a_checkpoint(tmp_path, data_dir):
    out = tmp_path / "job"
    grace = {"OMPI_MCA_odls_base_sigkill_timeout": str(OPEN_MPI_GRACE_S)}
    job = start_job([sys.executable, "-m", "mpi4py", *QUICK, "--data-dir", data_dir,
                     "--batch-size", "16", "--epochs", str(EPOCHS_PAST_THE_SIGNAL), "--out",
                     str(out)], tmp_path, **(grace if launcher() == "openmpi" else {}))
    seen = []
    for line in job.stdout:  # training starts right after this line
        seen.append(line)
        if line.startswith("out: "):
            break
    job.send_signal(signal.SIGINT)  # what Ctrl-C in a terminal sends to mpiexec
    output = "".join(seen) + finish_job(job)
    assert "Traceback" not in output and "KeyboardInterrupt" not in output, output
    lines = [line for line in output.splitlines() if line.startswith("rank ")]
    stopped = [line for line in lines if " stopped on a signal " in line]
    assert len(stopped) == 1, output  # one line for the job, rank 0's
    if launcher() == "mpich":
        # Hydra forwards SIGINT to every rank (quiet: one line for the job) and exits
        # with the ranks' status
        assert job.returncode == 3 and lines == stopped, output
        received = "SIGINT"
    else:
        # mpirun turns it into SIGTERM, which each rank announces, and exits 1 whatever
        # the ranks' status
        assert job.returncode == 1, output
        announced = sorted(line for line in lines if line not in stopped)  # any order
        assert announced == [f"rank {rank}: SIGTERM received; stopping at the next batch "
                             "boundary with a checkpoint (send it again to end now)"
                             for rank in (0, 1)], output
        received = "SIGTERM"
    assert re.fullmatch(rf"rank 0: stopped on a signal \({received} on this rank\) (between "
                        r"batches|at the end of epoch \d+); checkpoint '.*'; continue with "
                        r"--resume \(exit status 3\)", stopped[0]), output
    assert os.path.isdir(stopped[0].split("checkpoint '")[1].split("'")[0])


def test_sigusr1_to_mpiexec_stops_every_rank_with_a_checkpoint_and_exit_status_3(tmp_path,
                                                                                 data_dir):
    """Both launchers forward SIGUSR1 at once, with no kill after it: the way to stop a
    job under Open MPI with the exit status a requeueing script looks for."""
    out = tmp_path / "job"
    job = start_job([sys.executable, "-m", "mpi4py", *QUICK, "--data-dir", data_dir,
                     "--batch-size", "16", "--epochs", "50", "--out", str(out)], tmp_path)
    seen = []
    for line in job.stdout:
        seen.append(line)
        if line.startswith("out: "):
            break
    job.send_signal(signal.SIGUSR1)
    output = "".join(seen) + finish_job(job)
    assert job.returncode == 3, output
    assert "Traceback" not in output, output
    for rank in (0, 1):
        assert (f"rank {rank}: SIGUSR1 received; stopping at the next batch boundary with a "
                "checkpoint (send it again to end now)") in output
    [stopped] = [line for line in output.splitlines() if " stopped on a signal " in line]
    assert re.fullmatch(r"rank 0: stopped on a signal \(SIGUSR1 on this rank\) between "
                        r"batches; checkpoint '.*'; continue with --resume \(exit status 3\)",
                        stopped), output
    assert os.path.isdir(stopped.split("checkpoint '")[1].split("'")[0])


@pytest.mark.parametrize("entry", ["main", "console"])
def test_the_handlers_are_in_place_before_mpi_starts(entry):
    """``python -m mpi4py -m minidp`` and the console script both reach minidp before MPI."""
    code = ("import signal, sys\n"
            "seen = []\n"
            "install = signal.signal\n"
            "signal.signal = lambda s, h: (seen.append((int(s), 'mpi4py.MPI' in sys.modules)), "
            "install(s, h))[1]\n"
            "from minidp import __main__ as m\n"
            "sys.argv = ['minidp', 'train', '--help']\n"
            "try:\n"
            f"    m.{entry}()\n"
            "except SystemExit:\n"
            "    pass\n"
            "print('FIRST', seen[:3])\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120,
                          env=environment_outside_mpi(PYTHONPATH=ROOT))
    first = proc.stdout.split("FIRST ")[-1].strip()
    assert first == f"[({int(signal.SIGTERM)}, False), ({int(signal.SIGUSR1)}, False), " \
        f"({int(signal.SIGINT)}, False)]", proc.stdout + proc.stderr


# Reports, at the first import of each module named, whether SIGTERM is caught by then.
AUDIT_SITE = """\
import signal, sys
WATCHED, seen = ("numpy", "numba", "mpi4py.MPI"), set()
def audit(event, args):
    if event == "import" and args[0] in WATCHED and args[0] not in seen:
        seen.add(args[0])
        caught = callable(signal.getsignal(signal.SIGTERM))
        sys.stderr.write(f"AUDIT {args[0]} {caught}\\n")
sys.addaudithook(audit)
"""


@pytest.mark.parametrize("command", ["-m minidp", "-m mpi4py -m minidp", "console", "import"])
def test_the_handlers_are_in_place_before_numpy_numba_and_mpi_load(tmp_path, command):
    """In a process started as ``minidp train`` (three ways), the package's first statement
    catches the stop signals: seconds before NumPy and Numba are loaded on a busy machine.
    A program that merely imports minidp keeps the default actions."""
    (tmp_path / "sitecustomize.py").write_text(AUDIT_SITE)
    console = os.path.join(os.path.dirname(sys.executable), "minidp")
    argv = {"console": [console, "train", "--help"],
            "import": [sys.executable, "-c", "import minidp, mpi4py.MPI"]}.get(
                command, [sys.executable, *command.split(), "train", "--help"])
    proc = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=environment_outside_mpi(PYTHONPATH=f"{tmp_path}:{ROOT}"))
    seen = dict(line.split()[1:] for line in proc.stderr.splitlines()
                if line.startswith("AUDIT "))
    caught = str(command != "import")
    assert seen == {"numpy": caught, "numba": caught, "mpi4py.MPI": caught}, \
        proc.stdout + proc.stderr
