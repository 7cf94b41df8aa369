"""`minidp compare` passes on what its jobs warn of, not only their last lines."""

import os
import subprocess
import sys

import pytest
from spmd import ROOT

pytest.importorskip("matplotlib")


def test_compare_passes_a_jobs_warnings_through(tmp_path, synthetic_data_dir):
    # 2 epochs leave DASO's default warm-up and cool-down (4 each) no cycling epoch: the
    # job warns at its start, long before the two lines compare shows of every job.
    command = [sys.executable, "-m", "minidp", "compare", "--strategies", "daso",
               "--ranks", "1", "--out", str(tmp_path / "cmp"), "--", "--model", "mlp",
               "--dataset", "synthetic", "--data-dir", synthetic_data_dir, "--epochs", "2",
               "--train-samples", "256", "--test-samples", "128", "--batch-size", "32"]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    warned = [line for line in done.stdout.splitlines() if line.startswith("warning: daso")]
    assert len(warned) == 1 and "leaves no cycling epoch" in warned[0], done.stdout
