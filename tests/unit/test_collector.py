"""The garbage collector while a minidp command imports: paused, then frozen (run/collector.py)."""

import subprocess
import sys

import pytest

from minidp.run.signals import minidp_command_line

# Counts the collections that run while minidp imports, then reports the collector's state.
COUNTED = """
import gc, sys
collections = []
gc.callbacks.append(lambda phase, info: phase == "stop" and collections.append(info))
{before}
import minidp
print(len(collections), max([c["generation"] for c in collections], default=-1),
      gc.isenabled(), gc.get_freeze_count() > 0, end=" ")
{after}
"""
START = "from minidp.run import collector; collector.start_command(); " \
        "print(gc.isenabled(), gc.get_freeze_count() > 50000, end='')"


def run(before="", after="", cwd=None):
    code = COUNTED.format(before=before, after=after)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, timeout=300, cwd=cwd).stdout.split()


COMMAND = "sys.argv = ['/venv/bin/minidp', 'train']"  # as the minidp script starts


def test_a_command_runs_no_collection_while_it_imports_then_freezes_its_modules():
    collections, oldest, enabled, frozen, *started = run(before=COMMAND, after=START)
    # Without the pause some 140 ran here (60-100 ms of a rank's start), 10 or more of them
    # over the older generations; the young one or two left run before the pause, in the
    # package's first lines (the signals), over a few hundred objects.
    assert int(collections) <= 3 and int(oldest) <= 0
    assert (enabled, frozen) == ("False", "False")
    assert started == ["True", "True"]  # on again, every module's objects frozen


@pytest.mark.parametrize("command", [
    ["info"],
    ["train", "--dataset", "synthetic", "--model", "mlp", "--train-samples", "64",
     "--test-samples", "32", "--epochs", "1", "--no-progress", "--data-dir", "data"]])
def test_every_command_turns_the_collector_back_on_before_it_runs(tmp_path, command):
    # main() as the minidp script calls it; what it prints goes to stderr, the state after
    ran = ("from minidp.__main__ import main; sys.stdout = sys.stderr; main(); "
           "sys.stdout = sys.__stdout__; print(gc.isenabled(), gc.get_freeze_count() > 50000)")
    argv = f"sys.argv = ['/venv/bin/minidp', *{command!r}]"
    assert run(before=argv, after=ran, cwd=str(tmp_path))[4:] == ["True", "True"]


def test_a_library_import_leaves_the_collector_alone():
    collections, oldest, enabled, frozen, *started = run(after=START)
    assert int(collections) > 10 and int(oldest) >= 1 and (enabled, frozen) == ("True", "False")
    assert started == ["True", "False"]  # start_command freezes nothing of a user's


def test_a_collector_the_user_turned_off_stays_off():
    assert run(before="gc.disable()")[2:] == ["False", "False"]
    assert run(before="gc.disable(); " + COMMAND, after=START)[4:] == ["False", "True"]


@pytest.mark.parametrize("orig_argv, argv, expected", [
    (["python", "-m", "minidp", "report", "runs/1"], ["-m", "report", "runs/1"],
     ["report", "runs/1"]),
    (["python", "-u", "-m", "mpi4py", "-m", "minidp", "train"], ["minidp", "train"], ["train"]),
    (["python", "-m", "minidp"], ["-m"], []),
    (["python", "/venv/bin/minidp", "info"], ["/venv/bin/minidp", "info"], ["info"]),
    (["python", "-m", "mymodule", "train"], ["-m", "train"], None),
    (["python", "-c", "import minidp"], ["-c"], None),
    (["python"], [""], None),
])
def test_a_minidp_command_line_is_told_from_any_other(orig_argv, argv, expected):
    assert minidp_command_line(orig_argv, argv) == expected
