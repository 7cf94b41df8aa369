"""Pytest configuration shared by the single-process and the SPMD sessions.

``tests/mpi`` holds SPMD files: they run only under mpiexec (the launcher in
``tests/test_spmd.py`` sets ``MINIDP_SPMD=1``), never in the ordinary session.
"""

import functools
import gc
import os
import re
import subprocess
import sys

import pytest

# helpers shared by test directories (spmd launcher, PyTorch twins)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import reference_pass  # noqa: E402 (found through the path just added)

collect_ignore_glob = [] if os.environ.get("MINIDP_SPMD") else ["mpi/*", "scripts/*"]
# The NumPy reference pass leaves out the modules that never reach a kernel's gate
collect_ignore = reference_pass.left_out()


@functools.cache
def xdist_group_of(path: str) -> str | None:
    """The ``xdist_group`` name that test module ``path`` (relative to the root) marks
    itself with, or None."""
    try:
        with open(os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               path)) as f:
            found = re.search(r"pytest\.mark\.xdist_group\(\"([^\"]+)\"\)", f.read())
    except (OSError, UnicodeDecodeError):
        return None
    return found and found.group(1)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadgroup`` that keeps a marked module's tests on one worker.

    A module marked ``pytest.mark.xdist_group(NAME)`` shares a module-scoped fixture
    that launches MPI jobs (trained runs, real hosts); its tests must run on one worker,
    or each worker runs the fixture again. pytest-xdist 3.8 groups by a suffix it writes
    into ``item._nodeid``, which pytest 9 no longer reads: the marks had no effect and
    every such fixture ran once per worker (about 130 s of the suite's CPU). Here the
    scheduler groups by the mark read from the module's source instead; unmarked tests
    are scheduled one by one as before, the groups first (xdist orders the units by size).
    """
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadGroupScheduling

    class ByMarkedModule(LoadGroupScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group_of(nodeid.split("::", 1)[0]) or super()._split_scope(nodeid)

    return ByMarkedModule(config, log)


def pytest_collection_finish(session):
    """Freeze what collection made (modules, fixtures, items: they live for the session).

    Python's collector runs thousands of times in a session and walked them every time:
    3.9 s of a 1,000-test session's 39 s of CPU, 2.7 s once they are frozen (and 0.65 ->
    0.45 s in each rank of the 4-rank SPMD job). As minidp's own commands do
    (minidp/run/collector.py).
    """
    gc.freeze()


def gpu_visible() -> bool:
    """Whether cupy imports and CUDA sees a device (asked without selecting the backend)."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no cupy, no driver, no device: all mean "no GPU here"
        return False


# Single tests that launch long jobs (30-60 s on 2 cores): collected first, so that xdist
# hands them out early, not last to one worker while the other has nothing left to run.
LONG_FIRST = ("tests/test_spmd.py", "tests/test_defaults.py")


def pytest_collection_modifyitems(config, items):
    """The long jobs first (:data:`LONG_FIRST`); tests marked ``gpu`` skip, with the
    reason, where no GPU is visible."""
    items.sort(key=lambda item: item.nodeid.split("::", 1)[0] not in LONG_FIRST)
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


@pytest.fixture(autouse=True)
def kernel_free_modules_stay_free(request):
    """A module the reference pass leaves out must not reach the kernels (reference_pass.py)."""
    yield from reference_pass.check_kernel_free(request)
