"""The fault matrix: every strategy, a worker that raises, is killed or hangs; and a server.

Each job must end on its own (not by a watchdog), non-zero, and (where the rank can still
speak or be spoken of) name the rank. Faults are injected by
``--inject-fault 3:2:KIND``: rank 3, a worker in every strategy at 4 ranks as 2x2, at its
second step; and ``0:2:KIND`` on the server of ``asgd`` at 3 ranks, as it starts serving
its second epoch.
"""

import os
import re

import numpy as np
import pytest
from spmd import WATCHDOG_FIRED
from test_train_cli import train

from minidp import strategies
from minidp.run import faults

TIMEOUT_S = 5  # --comm-timeout of these runs (start-up skew on 2 loaded cores stays below)
MARGIN_S = 120  # start-up, the first epoch's compile-free work, the launcher tearing down:
# the watchdogs' margin (a hang guard), never a bound the test asserts; Open MPI's ranks
# poll busily in their waits, and a job of 4 of them beside others on 2 cores took over 50 s
SMALL = ["--epochs", "1", "--train-samples", "800", "--test-samples", "200",
         "--comm-timeout", str(TIMEOUT_S)]
NODES = ["--ranks-per-node", "2"]
# dbs in rounds: the others wait on the server's held replies, not on the failed rank,
# and must still name it (dbs's default form fails as asgd does, which has its own rows).
EXTRA = {"daso": ["--set", "daso.warmup_epochs=0", "--set", "daso.cooldown_epochs=0"],
         "dbs": ["--set", "dbs.update=round"]}


@pytest.fixture
def data_dir(synthetic_data_dir):
    """The synthetic dataset and compiled kernels, made before any timed job (conftest)."""
    return synthetic_data_dir


KINDS = ("raise", "kill", "hang")
# `make test` gives every strategy one kind, in turn (each kind meets a third of them);
# `make test-faults` (MINIDP_FAULT_MATRIX=full) runs every strategy with every kind.
FULL = os.environ.get("MINIDP_FAULT_MATRIX") == "full"
CASES = [(s, k) for i, s in enumerate(strategies.names()) for k in KINDS
         if FULL or k == KINDS[i % len(KINDS)]]


def assert_ended_naming(launch, rank, kind, step, case):
    """The job ended on its own, non-zero, and named ``rank``.

    On its own: neither the test's kill nor MPICH's watchdog (MPIEXEC_TIMEOUT) ended it,
    whatever the machine's load made it take. Prints one row of the fault matrix
    (``pytest -rP`` shows it; docs/reliability.md).
    """
    assert not launch.killed, launch.output  # ended on its own, not by the test's watchdog
    assert WATCHDOG_FIRED not in launch.output, launch.output  # nor by mpiexec's
    assert launch.returncode not in (0, None), launch.output
    peer_lost = re.search(rf"PeerLost: rank \d+: .* MPI failed with rank\(s\) (\d+, )*{rank}\b",
                          launch.output)
    if kind == "raise":
        assert f"rank {rank}: injected fault 'raise' at step {step}" in launch.output
        assert f"uncaught RuntimeError on rank {rank}" in launch.output
        named = "its own traceback"
    elif kind == "hang":
        assert re.search(rf"waited {TIMEOUT_S} s \(MINIDP_COMM_TIMEOUT\).*rank {rank}",
                         launch.output), launch.output
        named = "CommTimeout of the others"
    else:
        # The launcher ends the others, unless a peer's failed transfer ends it first;
        # MPICH's names the process by pid, Open MPI's by rank
        open_mpi = re.search(rf"process rank {rank} .* exited on signal 9", launch.output)
        assert "Killed (signal 9)" in launch.output or open_mpi or peer_lost, launch.output
        named = "PeerLost of a peer" if peer_lost else "launcher: rank, signal 9" if open_mpi \
            else "launcher: Killed (signal 9), by pid"
    print(f"fault matrix: {case} | {kind} | {launch.seconds:.1f} s | {named} | "
          f"exit {launch.returncode}")


@pytest.mark.parametrize("strategy, kind", CASES)
def test_a_failed_worker_ends_the_job_naming_it(tmp_path, data_dir, strategy, kind):
    args = SMALL + NODES + ["--strategy", strategy, "--out", str(tmp_path / "run"),
                    "--inject-fault", f"3:2:{kind}"] + EXTRA.get(strategy, [])
    launch = train(args, 4, data_dir, timeout=TIMEOUT_S + MARGIN_S + 30)
    assert_ended_naming(launch, 3, kind, 2, f"{strategy} (rank 3, a worker)")


@pytest.mark.parametrize("kind", [k for k in KINDS if FULL or k == "raise"])
def test_a_failed_server_ends_the_job_naming_it(tmp_path, data_dir, kind):
    args = SMALL + ["--epochs", "2", "--train-samples", "192", "--strategy", "asgd", "--out",
                    str(tmp_path / "run"), "--inject-fault", f"0:2:{kind}"]
    launch = train(args, 3, data_dir, timeout=TIMEOUT_S + MARGIN_S + 30)
    assert_ended_naming(launch, 0, kind, 2, "asgd (rank 0, the server)")
    assert "epoch 1/2" in launch.output  # the server served the first epoch
    if kind == "raise":
        assert "(a server: the start of serving epoch 2)" in launch.output


def test_faults_a_server_cannot_have_are_refused_on_every_rank():
    for rank in (0, 2):
        with pytest.raises(ValueError, match=r"--inject-fault: '0:3:nan': rank 0 is a server, "
                                             r"which computes no gradient; allowed on a server: "
                                             r"raise, exit, kill, hang, sigterm, sigusr1, "
                                             r"kill-in-save"):
            faults.Injector(faults.parse("0:3:nan"), rank, 3, servers=(0,))
    injector = faults.Injector(faults.parse("1:3:slow,0:2:raise"), 1, 3, servers=(0,))
    injector.at_serve(3)  # rank 1's fault fires at its steps, not at a serve
    injector.at_step(3, np.zeros(1), 0.0)
    assert injector.slowdown == faults.SLOW_FACTOR
    with pytest.raises(RuntimeError, match=r"rank 0: injected fault 'raise' at step 2 \(a "
                                           r"server: the start of serving epoch 2\)"):
        faults.Injector(faults.parse("0:2:raise"), 0, 3, servers=(0,)).at_serve(2)


def test_an_exiting_rank_names_itself_before_the_launcher_blames_rank_0(capfd):
    import multiprocessing

    injector = faults.Injector(faults.parse("3:2:exit"), 3, 4)
    child = multiprocessing.get_context("fork").Process(
        target=injector.at_step, args=(2, np.zeros(1), 0.0))
    child.start()
    child.join(60)
    assert child.exitcode == 1
    assert capfd.readouterr().err == ("rank 3: injected fault 'exit' at step 2: leaving with "
                                      "status 1 without finalising MPI\n")


def test_a_slowdown_of_a_rank_outside_the_world_is_refused():
    with pytest.raises(ValueError, match=r"--slowdown: rank 9 in '9:2', allowed: a rank in "
                                         r"\[0, 2\)"):
        faults.Injector([], 0, 2, slowdowns={9: 2.0})
    assert faults.Injector([], 1, 2, slowdowns={1: 1.5, 0: 3.0}).slowdown == 1.5
