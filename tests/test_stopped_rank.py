"""A rank stopped (SIGSTOP) where the others wait inside a blocking MPI call is named.

``guard.collective`` meets in a timed barrier, then makes a call that MPI cannot make
non-blocking (``Split``, ``File.Open``, ``Win.Fence``...). A rank stopped after the others
saw it in the barrier holds them inside that call; without the watchdog the job hung
until the launcher's own timeout (found with a rank stopped on a second real host:
tests/test_hosts.py). On one host, any user.
"""

import re

from spmd import run_spmd

WATCHDOG_S = 3  # the script's comm timeout


def test_a_rank_stopped_before_a_blocking_call_is_named_and_the_job_ends():
    launch = run_spmd(["tests/scripts/stopped_in_collective.py"], 4, timeout=60,
                      mpiexec_timeout=30)
    assert not launch.killed and launch.returncode not in (0, None, 124), launch.output
    # Each waiting rank's watchdog fires about together; the first to end its process
    # ends the job, so on a loaded machine the others may be killed before they speak.
    named = re.findall(r"error: rank (\d): 'split for the test on MPI_COMM_WORLD' blocked "
                       rf"inside MPI for {WATCHDOG_S} s \(MINIDP_COMM_TIMEOUT\) after every "
                       r"rank had come to its barrier: a rank stopped or died before the "
                       r"call; rank 3: process \d+ stopped \(last in 'split for the test on "
                       r"MPI_COMM_WORLD' #1, ", launch.output)
    assert named and set(named) <= {"0", "1", "2"}, launch.output
    assert launch.output.count("blocked inside MPI") == len(named), launch.output
    print(f"stopped rank 3: the job ended in {launch.seconds:.1f} s, exit {launch.returncode}")
