"""Every MINIDP_* variable with a garbage value: one line naming it, exit status 2, any command.

In-process, :func:`minidp.run.environment.check` must name each variable the package
reads (the list is the one docs/configuration.md describes, so a new variable without a
check fails here). Then the commands themselves, as a user starts them: each refuses a
bad variable before doing anything, and ``MINIDP_BACKEND=cupy`` on a machine without
CuPy is one line from a job of two ranks, not a traceback per rank.
"""

import os
import re
import subprocess
import sys

import pytest
from spmd import ROOT, remove_shm_leftovers, run_spmd, shm_files, without_launcher_banners

from minidp import backend, threads
from minidp.run import config_page, environment

# A value each variable's reader would take for something else, or fail on later.
GARBAGE = {
    "MINIDP_NUM_THREADS": "two",
    "MINIDP_THREAD_DEFAULTS": "OMP_NUM_THREADS",
    "MINIDP_BACKEND": "torch",
    "MINIDP_CUDA_KERNELS": "off",  # read as "not 0": the kernels stayed on
    "MINIDP_HOST_REPLICA": "yes",
    "MINIDP_MALLOC_TUNING": "false",  # read as "not 0": tuning stayed on
    "MINIDP_COMM_TIMEOUT": "5m",
    "MINIDP_DEBUG": "maybe",
    "MINIDP_EXPLAIN": "all",
    "MINIDP_PROGRESS": "bars",
    "MINIDP_PROGRESS_SECONDS": "nan",
    "MINIDP_MPIEXEC_ARGS": "-hosts 'a:2",
}
# Read by threads.py at import, before minidp fills its defaults in: set as imported.
AT_IMPORT = {"MINIDP_THREAD_DEFAULTS": "_INHERITED_TEXT"}


def test_every_variable_the_package_reads_has_a_garbage_case():
    described = {n for names in config_page.ENVIRONMENT for n in names.split(", ")
                 if n.startswith("MINIDP_")}
    assert set(GARBAGE) == described


@pytest.mark.parametrize("name", sorted(GARBAGE))
def test_a_garbage_value_is_named_with_what_is_allowed(monkeypatch, name):
    for other in GARBAGE:
        monkeypatch.delenv(other, raising=False)
    monkeypatch.setattr(threads, "_INHERITED_TEXT", "")
    value = GARBAGE[name]
    if name in AT_IMPORT:
        monkeypatch.setattr(threads, AT_IMPORT[name], value)
    else:
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=rf"^{name}: got {re.escape(repr(value))}, allowed: "):
        environment.check()


def test_good_values_pass(monkeypatch):
    for name in GARBAGE:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(threads, "_INHERITED_TEXT", "OMP_NUM_THREADS=2,NUMBA_NUM_THREADS=2")
    good = {"MINIDP_NUM_THREADS": "1", "MINIDP_BACKEND": "numpy", "MINIDP_CUDA_KERNELS": "0",
            "MINIDP_HOST_REPLICA": "", "MINIDP_MALLOC_TUNING": "1",
            "MINIDP_COMM_TIMEOUT": "30", "MINIDP_DEBUG": "off", "MINIDP_EXPLAIN": "2",
            "MINIDP_PROGRESS": "lines", "MINIDP_PROGRESS_SECONDS": "0.5",
            "MINIDP_MPIEXEC_ARGS": "-hosts 'a:2,b:2'"}
    for name, value in good.items():
        monkeypatch.setenv(name, value)
    environment.check()
    assert environment.mpiexec_args() == ["-hosts", "a:2,b:2"]


def command(args, **env):
    """``python -m minidp ARGS`` in a fresh process with ``env`` added; (status, output)."""
    full = {k: v for k, v in os.environ.items() if k not in GARBAGE}
    full.update(env)
    done = subprocess.run([sys.executable, "-m", "minidp", *args], cwd=ROOT, env=full,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.parametrize("args", [
    ["report", "nowhere", "--out", "{tmp}/report"],
    ["compare", "--strategies", "sync", "--out", "{tmp}/cmp", "--", "--epochs", "1"],
    ["simulate", "--nodes", "2", "--step-ms", "1", "--mem-gbps", "5"],
    ["replay", "nowhere"],
    ["data", "prepare", "synthetic", "--out", "{tmp}/data", "--data-dir", "{tmp}/data"],
], ids=lambda a: a[0])
def test_every_command_refuses_a_bad_variable_before_it_starts(tmp_path, args):
    status, output = command([a.format(tmp=tmp_path) for a in args],
                             MINIDP_PROGRESS_SECONDS="-1")
    assert status == 2, output
    assert output == ("error: MINIDP_PROGRESS_SECONDS: got '-1', allowed: a finite number of "
                      "seconds >= 0 (between two progress lines)\n")
    assert os.listdir(tmp_path) == []  # nothing written, nothing prepared


def test_info_shows_a_bad_variable_instead_of_refusing():
    status, output = command(["info"], MINIDP_DEBUG="maybe")
    assert status == 0, output
    assert '"environment": "MINIDP_DEBUG: got \'maybe\', allowed: 0 or 1' in output


@pytest.mark.skipif(backend.gpu_info()["devices"] > 0, reason="CuPy sees a GPU here")
def test_cupy_backend_without_cupy_is_one_line_once_from_a_job():
    before = shm_files()
    launch = run_spmd(["-m", "minidp", "train", "--epochs", "1"], 2, timeout=120,
                      env={"MINIDP_BACKEND": "cupy"})
    try:
        assert launch.returncode == 2, launch.output
        why = backend.gpu_info()["why"].split(" (")[0]  # "cupy is not installed", or CUDA's
        assert without_launcher_banners(launch.output).strip().splitlines() == [
            f"error: MINIDP_BACKEND: got 'cupy', but {why}; allowed: numpy, or cupy where "
            "CuPy is installed (pip install -e '.[gpu]') and sees a GPU"], launch.output
        assert not launch.shm & shm_files()  # the job ended normally: MPI removed its files
    finally:
        remove_shm_leftovers(before)


def test_a_program_that_uses_an_unavailable_backend_gets_the_reason_not_numpy():
    code = ("import minidp\n"
            "try:\n    minidp.Tensor([1.0])\nexcept RuntimeError as exc:\n    print(exc)\n"
            "minidp.set_backend('numpy')\nprint(minidp.get_backend())")
    if backend.gpu_info()["devices"] > 0:
        pytest.skip("CuPy sees a GPU here")
    full = {k: v for k, v in os.environ.items() if k not in GARBAGE}
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, env=dict(full, MINIDP_BACKEND="cupy"), timeout=120)
    assert done.returncode == 0, done.stderr
    first, second = done.stdout.splitlines()
    assert first.startswith("MINIDP_BACKEND: got 'cupy', but ")
    assert second == "numpy"  # chosen in code, it replaces the variable's request
