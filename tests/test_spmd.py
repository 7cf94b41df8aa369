"""Run every SPMD file in tests/mpi at world sizes 1, 2, 3 and 4 (odd sizes catch remainders).

The files of one world size run in one job (one pytest session on every rank): each
rank's start (Python, NumPy, Numba's first kernels, pytest, the module fixtures' data)
is paid once per size instead of once per file, which took the SPMD part of the suite
from about 300 s of CPU to about 100. A failure names its file and test as pytest
prints them; ``-x`` stops the job at the first.
"""

import glob
import os

import pytest
from spmd import ROOT, run_spmd

# The SPMD files use no pytest plugin; loading Hypothesis's on every rank would cost about
# 0.7 s of CPU per rank, 3 s per 4-rank job on 2 cores.
NO_PLUGINS = {"PYTEST_DISABLE_PLUGIN_AUTOLOAD": "1"}
SPMD_FILES = sorted(glob.glob(os.path.join(ROOT, "tests", "mpi", "test_*.py")))
WORLD_SIZES = [1, 2, 3, 4]
# Files with sizes of their own run as jobs of their own, beside the shared ones: the
# stopped-rank cases sleep seconds each and do not depend on remainders: 4 ranks, where
# the stopped rank is one of several. The Trainer's runs: one rank, one server with one
# worker, two workers per server. The replays: one server and three workers.
SIZES = {"test_guard": [4], "test_trainer": [1, 2, 4], "test_replay": [4],
         "test_replay_scripted": [4]}
SHARED = [path for path in SPMD_FILES if os.path.basename(path)[:-3] not in SIZES]
CASES = ([(f"{n}-ranks", SHARED, n) for n in WORLD_SIZES] +
         [(f"{name}-{n}", [os.path.join(ROOT, "tests", "mpi", f"{name}.py")], n)
          for name, sizes in sorted(SIZES.items()) for n in sizes])
# A hang guard for one job on a loaded machine, never a bound a test asserts: the shared
# 4-rank job takes 30 s alone on 2 cores.
HANG_S = 900


@pytest.mark.parametrize("paths, nprocs", [(paths, n) for _, paths, n in CASES],
                         ids=[name for name, _, _ in CASES])
def test_spmd_files(paths, nprocs):
    launch = run_spmd(["-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *paths], nprocs,
                      timeout=HANG_S, env={"MINIDP_SPMD": "1", **NO_PLUGINS})
    if launch.killed or launch.returncode != 0:
        names = ", ".join(os.path.basename(p) for p in paths)
        pytest.fail(f"{names} at {nprocs} ranks "
                    f"{'was killed after the timeout' if launch.killed else 'failed'} "
                    f"({launch.seconds:.0f} s):\n{launch.output[-6000:]}", pytrace=False)
