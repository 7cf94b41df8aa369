"""The fault matrix: every strategy, a worker that raises, is killed or hangs.

Each job must end on its own, non-zero, within ``--comm-timeout`` plus a margin, and
(where the rank can still speak or be spoken of) name the rank. Faults are injected by
``--inject-fault 3:2:KIND``: rank 3, a worker in every strategy at 4 ranks as 2x2, at its
second step.
"""

import os
import re
import subprocess
import sys

import pytest
from spmd import ROOT
from test_train_cli import train

from minidp import strategies

TIMEOUT_S = 5  # --comm-timeout of these runs (start-up skew on 2 loaded cores stays below)
MARGIN_S = 25  # start-up, the first epoch's compile-free work, MPICH tearing down
SMALL = ["--epochs", "1", "--train-samples", "800", "--test-samples", "200",
         "--ranks-per-node", "2", "--comm-timeout", str(TIMEOUT_S)]
DASO = ["--set", "daso.warmup_epochs=0", "--set", "daso.cooldown_epochs=0"]


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """The dataset files and the compiled kernels, made before any timed job.

    Otherwise the first job would prepare the files on rank 0 (and, in a fresh clone,
    compile the kernels) while the other ranks wait past the short --comm-timeout.
    """
    from minidp.kernels import ensure_compiled

    ensure_compiled()
    path = str(tmp_path_factory.mktemp("data"))
    subprocess.run([sys.executable, "-m", "minidp", "data", "prepare", "synthetic", "--out",
                    path, "--data-dir", path, "--quiet"], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=ROOT))
    return path


KINDS = ("raise", "kill", "hang")
# `make test` gives every strategy one kind, in turn (each kind meets a third of them);
# `make test-faults` (MINIDP_FAULT_MATRIX=full) runs every strategy with every kind.
FULL = os.environ.get("MINIDP_FAULT_MATRIX") == "full"
CASES = [(s, k) for i, s in enumerate(strategies.names()) for k in KINDS
         if FULL or k == KINDS[i % len(KINDS)]]


@pytest.mark.parametrize("strategy, kind", CASES)
def test_a_failed_worker_ends_the_job_naming_it(tmp_path, data_dir, strategy, kind):
    args = SMALL + ["--strategy", strategy, "--out", str(tmp_path / "run"),
                    "--inject-fault", f"3:2:{kind}"] + (DASO if strategy == "daso" else [])
    launch = train(args, 4, data_dir, timeout=TIMEOUT_S + MARGIN_S + 30)
    assert not launch.killed, launch.output  # ended on its own, not by the test's watchdog
    assert launch.returncode not in (0, None), launch.output
    assert launch.seconds < TIMEOUT_S + MARGIN_S, launch.output
    if kind == "raise":
        assert "rank 3: injected fault 'raise' at step 2" in launch.output
        assert "uncaught RuntimeError on rank 3" in launch.output
    elif kind == "hang":
        assert re.search(rf"waited {TIMEOUT_S} s \(MINIDP_COMM_TIMEOUT\).*rank 3", launch.output), \
            launch.output
    else:
        # MPICH's launcher ends the others, unless a peer's failed transfer ends it first
        assert ("Killed (signal 9)" in launch.output or
                re.search(r"PeerLost: rank \d+: .* MPI failed with rank\(s\) (\d+, )*3\b",
                          launch.output)), launch.output
