"""The stop signals' handler (minidp.run.signals): what it records, says and leaves behind."""

import multiprocessing
import os
import signal

from minidp.run.signals import RANK_VARIABLES, Catcher, launcher_rank


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
    # rank, is not (one line per job: rank 0's when the run stops)
    assert err == ("rank ?: SIGTERM received during start-up; stopping before the first batch "
                   "(send it again to end now)\n")


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
