"""The data's guarantees seen from the command line: one line, exit 2, nothing replaced.

A user's training file beside a missing test file is refused and kept (issue 40: the
first run prepared over it and trained on other records, exit 0); a label out of range
that one worker of a parameter-server run reads is one line, not an abort;
``python -m minidp data prepare`` refuses what it cannot do in one line.
"""

import os
import subprocess
import sys

from spmd import ROOT, WATCHDOG_FIRED, run_spmd

from minidp.io.datasets import synthetic
from minidp.io.mdp import HEADER_SIZE, write_mdp

TRAIN = ["-m", "minidp", "train", "--dataset", "synthetic", "--model", "mlp", "--epochs", "1",
         "--batch-size", "16", "--no-progress"]


def ended_alike(launch, status):
    """Every rank ended alike with ``status``: no abort, no traceback, no watchdog."""
    assert launch.returncode == status, launch.output
    assert "MPI_Abort" not in launch.output and "Traceback" not in launch.output, launch.output
    assert WATCHDOG_FIRED not in launch.output, launch.output
    assert launch.output.count("error: ") == 1, launch.output  # printed once, by rank 0


def data_prepare(*args):
    """``python -m minidp data prepare ARGS`` in one process: (exit status, output)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "minidp", "data", "prepare", *args, "--quiet"],
                          env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=300)
    return proc.returncode, proc.stdout


def test_a_users_training_file_without_a_test_file_is_refused_and_kept(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    users = synthetic(400, 10, seed=7, num_classes=4)
    write_mdp(str(data / "synthetic-train.mdp"), users.x_train, users.y_train, 4)
    before = (data / "synthetic-train.mdp").read_bytes()
    launch = run_spmd(TRAIN + ["--data-dir", str(data), "--out", str(tmp_path / "run")], 2,
                      timeout=180)
    ended_alike(launch, 2)
    assert (f"error: dataset 'synthetic': '{data}/synthetic-train.mdp' is not what minidp "
            "prepares from synthetic's source (its header says 400 records of (1, 28, 28) "
            "float32 samples, int64 labels, 4 classes; this source has 10000 records of (1, 28, "
            "28) float32 samples, int64 labels, 10 classes, shuffled); minidp never replaces a "
            "file, and it will not pair yours with a test set of its own: put your test records "
            f"beside it as '{data}/synthetic-test.mdp'") in launch.output, launch.output
    assert os.listdir(data) == ["synthetic-train.mdp"]
    assert (data / "synthetic-train.mdp").read_bytes() == before
    assert not (tmp_path / "run").exists()  # refused before the run directory was claimed


def test_a_label_one_worker_reads_is_one_line_and_status_2_with_a_server(tmp_path):
    """asgd on 3 ranks: rank 2, the second worker, reads the last block (records 300-599)."""
    data = tmp_path / "data"
    data.mkdir()
    pair = synthetic(600, 100, seed=1)
    write_mdp(str(data / "synthetic-train.mdp"), pair.x_train, pair.y_train, 10)
    write_mdp(str(data / "synthetic-test.mdp"), pair.x_test, pair.y_test, 10)
    with open(data / "synthetic-train.mdp", "r+b") as f:  # the label of record 599
        f.seek(HEADER_SIZE + 600 * (4 * 28 * 28 + 8) - 8)
        f.write((10).to_bytes(8, "little"))
    launch = run_spmd(TRAIN + ["--data-dir", str(data), "--out", str(tmp_path / "run"),
                               "--strategy", "asgd", "--no-verify", "--comm-timeout", "60"], 3,
                      timeout=180)
    ended_alike(launch, 2)
    assert (f"error: dataset file '{data}/synthetic-train.mdp': label 10 of record 599 is "
            "outside the allowed range [0, 10) of the header's 10 classes; the file's labels do "
            "not fit its header: prepare it again") in launch.output, launch.output


def test_data_prepare_refuses_in_one_line_and_replaces_nothing(tmp_path):
    (tmp_path / "file").write_text("mine")
    status, output = data_prepare("synthetic", "--out", str(tmp_path / "file"))
    assert (status, output) == (2, f"error: dataset directory '{tmp_path}/file' is not a "
                                   "directory; allowed: a directory, or a path where one can "
                                   "be made\n")
    data = tmp_path / "data"
    data.mkdir()
    mine = synthetic(20, 20, seed=3)
    write_mdp(str(data / "synthetic-test.mdp"), mine.x_test, mine.y_test, 10)
    before = (data / "synthetic-test.mdp").read_bytes()
    status, output = data_prepare("synthetic", "--out", str(data))
    assert status == 2 and output.count("\n") == 1, output
    assert output.startswith(f"error: dataset 'synthetic': '{data}/synthetic-test.mdp' is not "
                             "what minidp prepares from synthetic's source (its header says 20 "
                             "records"), output
    assert os.listdir(data) == ["synthetic-test.mdp"]
    assert (data / "synthetic-test.mdp").read_bytes() == before
    os.remove(data / "synthetic-test.mdp")
    assert data_prepare("synthetic", "--out", str(data))[0] == 0
    prepared = {n: (data / n).read_bytes() for n in sorted(os.listdir(data))}
    inodes = [os.stat(data / n).st_ino for n in prepared]
    status, output = data_prepare("synthetic", "--out", str(data))  # again: both kept
    assert status == 0, output
    assert {n: (data / n).read_bytes() for n in sorted(os.listdir(data))} == prepared
    assert [os.stat(data / n).st_ino for n in prepared] == inodes
