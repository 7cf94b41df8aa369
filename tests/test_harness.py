"""The harness itself: a failure on one rank is reported with its traceback, and a
deadlock ends as a failure within the timeout instead of hanging the suite."""

import glob

from spmd import run_spmd


def test_failure_on_one_rank_aborts_the_job_with_its_traceback():
    launch = run_spmd(["tests/scripts/fail_on_one_rank.py"], 3, timeout=60)
    assert not launch.killed
    assert launch.returncode != 0
    assert "Traceback" in launch.output
    assert "RuntimeError: rank 1 fails on purpose" in launch.output
    assert launch.seconds < 45


def test_deadlock_is_ended_by_the_mpiexec_watchdog():
    launch = run_spmd(["tests/scripts/deadlock.py"], 2, timeout=60, mpiexec_timeout=5)
    assert not launch.killed
    assert launch.returncode != 0
    assert launch.seconds < 40


def test_deadlock_past_the_watchdog_is_killed_with_its_process_group():
    shm_before = set(glob.glob("/dev/shm/mpich_shm_*"))
    launch = run_spmd(["tests/scripts/deadlock.py"], 2, timeout=8, mpiexec_timeout=600)
    assert launch.killed and launch.returncode is None
    assert launch.seconds < 30
    assert set(glob.glob("/dev/shm/mpich_shm_*")) <= shm_before
