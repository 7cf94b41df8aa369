"""Thread and allocator settings that minidp makes for itself."""

import os
import subprocess
import sys

import pytest

from minidp.threads import THREAD_VARIABLES


def run(code, **env):
    # this pytest process exported its own thread counts when it imported minidp
    full = {k: v for k, v in os.environ.items()
            if k not in ("MINIDP_NUM_THREADS", *THREAD_VARIABLES)}
    full.update(env)
    return subprocess.run([sys.executable, "-c", code], env=full, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_one_thread_per_rank_when_ranks_fill_the_cores():
    code = ("import minidp, threadpoolctl; "
            "print(max(p['num_threads'] for p in threadpoolctl.threadpool_info()))")
    cores = len(os.sched_getaffinity(0))
    assert run(code, MPI_LOCALNRANKS=str(cores)) == "1"
    assert run(code, MPI_LOCALNRANKS="1") == str(cores)
    assert run(code, MINIDP_NUM_THREADS="1", MPI_LOCALNRANKS="1") == "1"


def test_bad_thread_override_is_a_clear_error():
    proc = subprocess.run([sys.executable, "-c", "import minidp"], capture_output=True, text=True,
                          env=dict(os.environ, MINIDP_NUM_THREADS="many"))
    assert proc.returncode != 0
    assert "MINIDP_NUM_THREADS: got 'many', allowed: a positive integer" in proc.stderr


def test_malloc_tuning_applies_unless_turned_off():
    code = "from minidp import allocator; print(allocator.tune_malloc())"
    assert run(code) == "True"
    assert run(code, MINIDP_MALLOC_TUNING="0") == "False"
    assert run(code, MALLOC_MMAP_THRESHOLD_="100000", MALLOC_TRIM_THRESHOLD_="100000") == "False"


def test_guard_reads_its_variables_when_needed(monkeypatch):
    from minidp.comm import guard

    monkeypatch.setattr(guard, "_settings", {})
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "5m")
    monkeypatch.setenv("MINIDP_DEBUG", "maybe")
    with pytest.raises(ValueError, match="MINIDP_COMM_TIMEOUT: got '5m', allowed: a number of "
                                         "seconds > 0"):
        guard.comm_timeout()
    with pytest.raises(ValueError, match="MINIDP_DEBUG: got 'maybe', allowed: 0 or 1"):
        guard.debug_checks()
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "inf")
    with pytest.raises(ValueError, match="MINIDP_COMM_TIMEOUT: got 'inf'"):
        guard.comm_timeout()
    monkeypatch.setenv("MINIDP_COMM_TIMEOUT", "12.5")
    monkeypatch.setenv("MINIDP_DEBUG", "1")
    assert (guard.comm_timeout(), guard.debug_checks()) == (12.5, True)
    guard.set_timeout(3)
    assert guard.comm_timeout() == 3.0
