"""The stop signals' handler (minidp.run.signals): what it records, says and leaves behind."""

import multiprocessing
import os
import signal

import pytest

from minidp.run.signals import RANK_VARIABLES, Catcher, launcher_rank, started_as_minidp_train


def signalled_twice(kind):
    catcher = Catcher()
    catcher.install()
    signal.raise_signal(kind)
    assert catcher.received == signal.Signals(kind).name
    signal.raise_signal(kind)  # the same kind again: the default action, at once
    os._exit(0)  # not reached


def test_one_signal_is_recorded_and_a_second_of_its_kind_ends_the_process(capfd, monkeypatch):
    for name in RANK_VARIABLES:  # outside a launcher: the rank is not known yet
        monkeypatch.delenv(name, raising=False)
    fork = multiprocessing.get_context("fork")
    for kind in (signal.SIGTERM, signal.SIGINT):
        child = fork.Process(target=signalled_twice, args=(kind,))
        child.start()
        child.join(60)
        assert child.exitcode == -kind
    err = capfd.readouterr().err
    # SIGTERM is announced by the rank that got it; SIGINT, which mpiexec sends to every
    # rank, is not (one line per job: rank 0's when the run stops). The second of a kind
    # is named before it ends the process: the launcher may report another signal.
    assert err == ("rank ?: SIGTERM received during start-up; stopping before the first batch "
                   "(send it again to end now)\n"
                   "rank ?: SIGTERM received again; ending this process now\n"
                   "rank ?: SIGINT received again; ending this process now\n")


def test_a_fresh_install_forgets_and_retire_ignores(monkeypatch):
    before = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)}
    catcher = Catcher()
    catcher.received, catcher.seen = "SIGTERM", {"SIGTERM"}  # an earlier run's
    try:
        assert catcher.install() and catcher.received is None and not catcher.seen
        assert not catcher.install()  # once per process: the second is refused
        catcher.retire()  # the run is over: a signal must not kill the exiting process
        assert all(signal.getsignal(s) is signal.SIG_IGN for s in before)
        assert not catcher.installed
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)
    monkeypatch.setenv("PMI_RANK", "3")
    assert launcher_rank() == "3"


PY = "/venv/bin/python"


@pytest.mark.parametrize("orig_argv, argv, expected", [
    ([PY, "-m", "minidp", "train", "--epochs", "1"], ["-m", "train", "--epochs", "1"], True),
    ([PY, "-u", "-m", "mpi4py", "-m", "minidp", "train"], ["minidp", "train"], True),
    ([PY, "/venv/bin/minidp", "train", "--out", "x"], ["/venv/bin/minidp", "train"], True),
    ([PY, "-m", "minidp", "report", "train"], ["-m", "report", "train"], False),
    ([PY, "-m", "mpi4py", "-m", "minidp"], ["minidp"], False),
    ([PY, "/venv/bin/minidp", "info"], ["/venv/bin/minidp", "info"], False),
    ([PY, "-m", "mymodule", "train"], ["-m", "train"], False),  # imports minidp itself
    ([PY, "job.py", "train"], ["job.py", "train"], False),
    ([PY, "-c", "import minidp"], ["-c"], False),
    ([PY], [], False),
])
def test_a_process_started_as_minidp_train_is_told_from_any_other(orig_argv, argv, expected):
    assert started_as_minidp_train(orig_argv, argv) is expected
