"""`--explain`: every communication of each rank's first steps, read against the docstring."""

import os
import re
import subprocess
import sys

import pytest
from spmd import ROOT, mpiexec

from minidp.run.console import explain_steps


def test_explain_steps_come_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.setenv("MINIDP_EXPLAIN", "3")
    assert explain_steps(0) == 3
    assert explain_steps(2) == 2
    monkeypatch.setenv("MINIDP_EXPLAIN", "many")
    with pytest.raises(ValueError, match="MINIDP_EXPLAIN: got 'many', allowed: an int >= 0"):
        explain_steps(0)


def test_explain_prints_each_ranks_communications_of_the_first_steps(tmp_path,
                                                                     synthetic_data_dir):
    command = [mpiexec(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "minidp", "train",
               "--model", "mlp", "--dataset", "synthetic", "--data-dir", synthetic_data_dir,
               "--train-samples", "512", "--test-samples", "256", "--epochs", "1",
               "--batch-size", "32", "--strategy", "hsgd", "--ranks-per-node", "2",
               "--explain", "2", "--no-progress", "--out", str(tmp_path / "run")]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("--explain: HierarchicalSGD (hsgd)\nTwo synchronous levels")
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    for rank, node, rail in ((0, "0,1", "0,2"), (1, "0,1", "1,3"), (2, "2,3", "0,2"),
                             (3, "2,3", "1,3")):
        steps = [line for line in lines if line.startswith(f"rank {rank} step 1:")]
        # hsgd's gradient step: node sum in the window, the rail's slice, the copy back
        assert [re.sub(r"  [\d.]+ ms$", "", s) for s in steps] == [
            f"rank {rank} step 1: comm_intra  node_reduce with ranks {node}  2,143,272 B",
            f"rank {rank} step 1: comm_inter  rail_allreduce with ranks {rail}  1,071,636 B",
            f"rank {rank} step 1: comm_intra  node_broadcast with ranks {node}  2,143,272 B"]
    assert any(line.startswith("rank 3 step 2: comm_inter  rail_allreduce") for line in lines)
    assert not any(" step 3:" in line for line in lines)  # two steps only
