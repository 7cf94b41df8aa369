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


def gpu_visible() -> bool:
    """Whether cupy imports and CUDA sees a device (asked without selecting the backend)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


def pytest_collection_modifyitems(config, items):
    """Tests marked ``gpu`` skip, with the reason, where no GPU is visible."""
    if any("gpu" in item.keywords for item in items) and not gpu_visible():
        skip = pytest.mark.skip(reason="no GPU: needs cupy and a CUDA device (make test-gpu)")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)


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
