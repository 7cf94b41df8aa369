"""Run every SPMD file in tests/mpi at world sizes 1, 2, 3 and 4 (odd sizes catch remainders)."""

import glob
import os

import pytest
from spmd import ROOT, run_spmd

# The SPMD files use no pytest plugin; loading Hypothesis's on every rank would cost about
# 0.7 s of CPU per rank, 3 s per 4-rank job on 2 cores.
NO_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
SPMD_FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "mpi", "test_*.py")))
WORLD_SIZES = [1, 2, 3, 4]
# The stopped-rank cases sleep seconds each and do not depend on remainders: 4 ranks,
# where the stopped rank is one of several. The Trainer's runs: one rank, one server with
# one worker, two workers per server. The replays: one server and three workers.
SIZES = {"test_guard": [4], "test_trainer": [1, 2, 4], "test_replay": [4],
         "test_replay_scripted": [4]}
CASES = [(path, n) for path in SPMD_FILES
         for n in SIZES.get(os.path.basename(path)[:-3], WORLD_SIZES)]


@pytest.mark.parametrize("path, nprocs", CASES,
                         ids=[f"{os.path.basename(p)[:-3]}-{n}" for p, n in CASES])
def test_spmd_file(path, nprocs):
    launch = run_spmd(["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", path], nprocs,
                      timeout=240, env={"MINIDP_SPMD": "1", **NO_PLUGINS})
    if launch.killed or launch.returncode != 0:
        pytest.fail(f"{os.path.basename(path)} at {nprocs} ranks "
                    f"{'was killed after the timeout' if launch.killed else 'failed'} "
                    f"({launch.seconds:.0f} s):\n{launch.output[-6000:]}", pytrace=False)
