"""Which timed-out rank waits for another to speak first (``guard._hand_over``, ``board.blind``).

The first process to end ends the job, so a rank that cannot see the cause of a hang
waits one timeout more (at most 30 s) before it ends: a rank on the cause's node names it
first. The lines are the status board's descriptions as the jobs of
``tests/test_hosts.py`` print them.
"""

import pytest

from minidp.comm import guard
from minidp.comm.board import blind

REMOTE_2 = "rank 2: on another node, state not visible here"
REMOTE_3 = "rank 3: on another node, state not visible here"
# rank 0, on this node, running and blocked in a call of its own
BLOCKED_0 = ("rank 0: never arrived (waiting in 'dataset file check on MPI_COMM_WORLD' #3, "
             "5.0 s ago)")
STOPPED_3 = ("rank 3: process 16418 stopped (waiting in 'open dataset file on "
             "MPI_COMM_WORLD' #3, 5.0 s ago)")
GONE_1 = "rank 1: process 16400 is gone (last in 'node mean on node' #12, 5.0 s ago)"
LATE_1 = "rank 1: never arrived (last in 'forward on rank' #40, 5.0 s ago)"


@pytest.mark.parametrize("details, waits", [
    ([REMOTE_2, REMOTE_3], True),  # every missing rank out of sight
    ([BLOCKED_0, REMOTE_2, REMOTE_3], True),  # the CI failure: rank 0 is a victim too
    ([BLOCKED_0], False),  # nobody elsewhere could say more
    ([STOPPED_3, REMOTE_2], False),  # the stop is in sight: this rank names it
    ([GONE_1, REMOTE_2], False),
    ([LATE_1, REMOTE_2], False),  # a rank of this node running late, in no wait
    ([], False),
])
def test_a_rank_blind_to_the_cause_hands_over_one_that_sees_it_does_not(details, waits):
    assert blind(details) is waits


@pytest.mark.parametrize("timeout, waited", [
    (5.0, [5.0]),  # the host tests' --comm-timeout: a rank 5 s late in its wait still speaks
    (1.0, [1.0]),
    (300.0, [30.0]),  # the default timeout: a lost node ends the job 30 s later, not 300
])
def test_a_blind_rank_waits_one_timeout_at_most_30_s_and_a_seeing_one_not_at_all(
        monkeypatch, timeout, waited):
    """The failure this pins: rank 1 (host 1, blind) timed out and ended the job 2 s
    later, before rank 2 (host 2, whose wait began over 2 s after rank 1's) named the
    stopped rank 3."""
    slept = []
    monkeypatch.setattr(guard.time, "sleep", slept.append)
    monkeypatch.setitem(guard._settings, "timeout", timeout)
    guard._hand_over([BLOCKED_0, REMOTE_2, REMOTE_3])
    assert slept == waited
    slept.clear()
    guard._hand_over([STOPPED_3, REMOTE_2])
    assert slept == []
