"""Pytest configuration shared by the single-process and the SPMD sessions.

``tests/mpi`` holds SPMD files: they run only under mpiexec (the launcher in
``tests/test_spmd.py`` sets ``MINIDP_SPMD=1``), never in the ordinary session.
"""

import os
import subprocess
import sys

import pytest

# helpers shared by test directories (spmd launcher, PyTorch twins)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
collect_ignore_glob = [] if os.environ.get("MINIDP_SPMD") else ["mpi/*", "scripts/*"]


@pytest.fixture(scope="session")
def synthetic_data_dir(tmp_path_factory):
    """The synthetic dataset's files and the compiled kernels, made before any timed job.

    Otherwise the first job would prepare the files on rank 0 (and, in a fresh clone,
    compile the kernels) while the other ranks wait past a short --comm-timeout.
    """
    from minidp.kernels import ensure_compiled

    ensure_compiled()
    path = str(tmp_path_factory.mktemp("data"))
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    subprocess.run([sys.executable, "-m", "minidp", "data", "prepare", "synthetic", "--out",
                    path, "--data-dir", path, "--quiet"], check=True, capture_output=True,
                   env=dict(os.environ, PYTHONPATH=root))
    return path
