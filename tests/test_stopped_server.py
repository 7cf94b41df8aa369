"""A stopped or dead rank is named as such by a point-to-point timeout, not as "waiting".

A parameter server stopped by SIGSTOP leaves its status-board record as it was, "waiting
in" its serve loop, and that is what a worker's timeout used to say of it. The process
behind the record decides: stopped, gone, or (only then) what the record says.
"""

import os
import re
import signal
import subprocess

from mpi4py import MPI
from spmd import run_spmd

from minidp.comm import guard
from minidp.comm.board import condition


def test_a_worker_waiting_for_a_stopped_server_names_it_stopped():
    launch = run_spmd(["tests/scripts/stopped_server.py"], 2, timeout=120)
    assert launch.returncode == 0, launch.output
    assert re.search(r"timeout: rank 1: 'recv the answer from rank 0' waited 2 s "
                     r"\(MINIDP_COMM_TIMEOUT\); rank 0: process \d+ stopped \(waiting in "
                     r"'serve test' #1, [\d.]+ s ago\)", launch.output), launch.output


def test_the_board_names_a_stopped_and_a_gone_process_whatever_its_record_says():
    guard.ensure_board(MPI.COMM_WORLD)  # one rank: this process's own board
    board = guard._board["board"]
    child = subprocess.Popen(["sleep", "600"])
    try:
        board.mine["pid"] = child.pid  # the record of a rank whose process is the child
        board.enter("serve test", 1)
        running = board.peer_states(MPI.COMM_WORLD, [0])[0]
        assert re.fullmatch(r"rank 0: waiting in 'serve test' #1, [\d.]+ s ago", running)
        os.kill(child.pid, signal.SIGSTOP)
        assert _settled(child.pid, "stopped")
        assert re.fullmatch(rf"rank 0: process {child.pid} stopped \(waiting in 'serve test' "
                            r"#1, [\d.]+ s ago\)", board.peer_states(MPI.COMM_WORLD, [0])[0])
        assert re.fullmatch(rf"rank 0: process {child.pid} stopped \(waiting in 'serve test' "
                            r"#1, [\d.]+ s ago\)", board.absent([0], "serve test", 1)[0])
        child.kill()
        child.wait()  # reaped: no /proc entry left
        assert re.fullmatch(rf"rank 0: process {child.pid} is gone \(waiting in 'serve test' "
                            r"#1, [\d.]+ s ago\)", board.peer_states(MPI.COMM_WORLD, [0])[0])
    finally:
        board.leave()
        board.mine["pid"] = os.getpid()
        if child.poll() is None:
            child.kill()
            child.wait()


def _settled(pid, state, tries=10000):
    """Whether ``condition(pid)`` reaches ``state`` (a signal is delivered asynchronously)."""
    return any(condition(pid) == state for _ in range(tries))
