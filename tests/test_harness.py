"""The harness itself: a failure on one rank is reported with its traceback, and a
deadlock ends as a failure within the timeout instead of hanging the suite.

What ended each job is read from its output (the traceback, the watchdog's line, the
CommTimeout), never from how many seconds it took on a loaded machine. Every test runs
under both launchers (MPICH's Hydra, Open MPI's mpirun): tests/spmd.py knows each one's
watchdog and files.
"""


import os

from spmd import WATCHDOG_FIRED, job_status, launcher, run_spmd, watchdog_line


def test_failure_on_one_rank_aborts_the_job_with_its_traceback():
    launch = run_spmd(["tests/scripts/fail_on_one_rank.py"], 3, timeout=60)
    assert not launch.killed
    assert launch.returncode != 0
    assert "Traceback" in launch.output
    assert "RuntimeError: rank 1 fails on purpose" in launch.output
    assert WATCHDOG_FIRED not in launch.output  # the abort ended it, not the watchdog


def test_deadlock_is_ended_by_the_mpiexec_watchdog():
    launch = run_spmd(["tests/scripts/deadlock.py"], 2, timeout=60, mpiexec_timeout=5)
    assert not launch.killed
    assert launch.returncode != 0
    assert watchdog_line(5) in launch.output


def test_a_watchdog_that_fired_fails_the_job_whatever_the_launcher_returned():
    # Hydra under load has printed its watchdog's line and exited 0
    assert job_status(0, f"...\n{watchdog_line(5)}\n{WATCHDOG_FIRED}") == 124
    assert job_status(0, "all ranks done") == 0
    assert job_status(110, WATCHDOG_FIRED) == 110


def test_deadlock_past_the_watchdog_is_killed_with_its_process_group():
    launch = run_spmd(["tests/scripts/deadlock.py"], 2, timeout=8, mpiexec_timeout=600)
    assert launch.killed and launch.returncode is None
    assert WATCHDOG_FIRED not in launch.output  # the test's kill ended it
    # The job's own files, seen mapped by its process group before the kill: another
    # test's job may leave (and remove) files meanwhile, so the directory is not compared.
    assert launch.shm, f"a 2-rank job on one host maps {launcher()}'s shared memory"
    assert not [path for path in launch.shm if os.path.exists(path)]
    # and Open MPI's session directory of the killed mpirun (MPICH makes none)
    assert launch.session_dirs or launcher() == "mpich"
    assert not [path for path in launch.session_dirs if os.path.exists(path)]


def test_missing_rank_ends_with_a_timeout_naming_it():
    launch = run_spmd(["tests/scripts/missing_rank.py"], 2, timeout=60, mpiexec_timeout=50)
    assert not launch.killed and launch.returncode != 0
    assert "CommTimeout: rank 0: 'rail allreduce on rail 0' waited 3 s" in launch.output
    assert "rank 1: never arrived" in launch.output  # the timeout, not its return, ended it
    assert WATCHDOG_FIRED not in launch.output


def test_abort_hook_ends_a_script_not_run_under_mpi4py():
    launch = run_spmd(["tests/scripts/abort_hook.py"], 3, timeout=60, mpiexec_timeout=50,
                      under_mpi4py=False)
    assert not launch.killed and launch.returncode != 0
    assert "RuntimeError: rank 1 fails on purpose" in launch.output
    assert "aborting the job" in launch.output
    assert WATCHDOG_FIRED not in launch.output
