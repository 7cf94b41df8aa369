"""``python -m minidp``: the help names every command; an OSError of any command is one line."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def minidp(*args):
    done = subprocess.run([sys.executable, "-m", "minidp", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, done.stdout, done.stderr


def test_the_help_describes_every_command_there_is():
    status, out, _ = minidp("--help")
    assert status == 0
    commands = out.split("{", 1)[1].split("}", 1)[0].split(",")  # usage: {info,train,...}
    assert len(commands) == 7, out
    described = re.search(r"python -m minidp ([a-z|]+)``", " ".join(out.split())).group(1)
    described = described.split("|")
    assert sorted(described) == sorted(commands), out


def test_a_file_a_command_cannot_write_is_one_line_naming_it(tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a user's file\n")
    status, out, err = minidp("data", "prepare", "synthetic", "--out", str(taken), "--quiet")
    assert status == 2, err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("error: ") and str(taken) in err, err
    assert taken.read_text() == "a user's file\n"


def test_a_refused_command_line_given_to_main_from_python_leaves_mpi_running(capsys):
    # main() called in a process that goes on (a test, a notebook): a flag argparse refuses
    # is one line and status 2, and MPI stays initialised for what the process does next.
    from mpi4py import MPI

    from minidp.__main__ import main

    MPI.COMM_WORLD.Barrier()  # MPI initialised, as in any process that imported minidp's comm
    assert main(["report", "nowhere", "--steps", "11"]) == 2
    assert "--steps: got '11', allowed: an int from 1 to 10" in capsys.readouterr().err
    assert not MPI.Is_finalized()
    assert MPI.COMM_WORLD.allreduce(1) == 1
