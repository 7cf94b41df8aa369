"""What a run prints: progress within epochs (terminal, mpiexec, batch jobs) and `--explain`."""

import fcntl
import os
import pty
import re
import select
import signal
import struct
import subprocess
import sys
import termios
import time
import types

import pytest
from spmd import ROOT, ShmWatch, mpiexec, remove_shm_leftovers, shm_files

from minidp.run import console
from minidp.run.console import Progress, explain_steps, progress_mode

STEP_LINE = re.compile(r"^epoch (\d+)/(\d+): step (\d+)/(\d+) \(\d+%\), loss [\d.]+ \(epoch "
                       r"mean\), [\d.]+ steps/s, ETA [\d.]+ s\r?$", re.M)
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+: train loss", re.M)


def in_terminal(command, env, timeout=150):
    """Run ``command`` with a pseudo-terminal as stdin, stdout and stderr: (status, output).

    The terminal has 24 rows of 80 columns (a new pty has 0 x 0, where a bar has no
    room). The process group is killed after ``timeout`` seconds; the MPICH
    shared-memory files a failed or killed job left are removed.
    """
    shm_before = shm_files()
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen(command, cwd=ROOT, env=env, stdin=terminal, stdout=terminal,
                            stderr=terminal, start_new_session=True)
    watch = ShmWatch(proc.pid)
    os.close(terminal)
    chunks, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        if select.select([controller], [], [], 0.2)[0]:
            try:
                data = os.read(controller, 65536)
            except OSError:  # EIO: every writer has closed the terminal
                break
            if not data:
                break
            chunks.append(data)
        elif proc.poll() is not None:
            break
    else:
        watch.sample()
        os.killpg(proc.pid, signal.SIGKILL)
    os.close(controller)
    status = proc.wait()
    watch.remove()
    if status:
        remove_shm_leftovers(shm_before)
    return status, b"".join(chunks).decode(errors="replace")


def train_command(data_dir, out, *flags, ranks=4):
    launcher = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py"] if ranks else \
        [sys.executable]
    nodes = ["--ranks-per-node", "2"] if ranks else []
    return [*launcher, "-m", "minidp", "train", "--model", "lenet5", "--dataset", "synthetic",
            "--data-dir", data_dir, "--train-samples", "1024", "--test-samples", "256",
            "--epochs", "2", "--strategy", "hsgd", *nodes, "--out", out, *flags]


def test_progress_under_mpiexec_in_a_terminal_is_lines_within_each_epoch(tmp_path,
                                                                          synthetic_data_dir):
    # interval 0: a line at every step after the first (which starts the epoch's clock),
    # so the count is exact (the interval: next test)
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1",
               MINIDP_PROGRESS_SECONDS="0")
    status, out = in_terminal(train_command(synthetic_data_dir, str(tmp_path / "a")), env)
    assert status == 0, out
    steps = STEP_LINE.findall(out)
    batches = 1024 // 4 // 32
    assert [(int(e), int(s)) for e, _, s, _ in steps] == [
        (e, s) for e in (1, 2) for s in range(2, batches + 1)], out
    assert {(t, n) for _, t, _, n in steps} == {("2", str(batches))}
    for epoch in ("1", "2"):  # within the epoch: its steps come before its line
        last_step = max(m.start() for m in STEP_LINE.finditer(out) if m[1] == epoch)
        assert last_step < next(m.start() for m in EPOCH_LINE.finditer(out) if m[1] == epoch)
    status, out = in_terminal(train_command(synthetic_data_dir, str(tmp_path / "b"),
                                            "--no-progress"), env)
    assert status == 0, out
    assert len(EPOCH_LINE.findall(out)) == 2 and "step" not in out, out
    # one process in a terminal: its own stderr is one, so a tqdm bar redrawn in place
    status, out = in_terminal(train_command(synthetic_data_dir, str(tmp_path / "c"),
                                            ranks=0), env)
    assert status == 0, out
    assert re.search(r"\repoch 1/2: +\d+%\|.*\| *\d+/32 \[.*step/s", out), out
    assert not STEP_LINE.search(out)


def test_progress_lines_are_at_most_every_interval(monkeypatch, capsys):
    monkeypatch.setenv("MINIDP_PROGRESS", "lines")
    monkeypatch.setenv("MINIDP_PROGRESS_SECONDS", "2")
    now = [100.0]
    monkeypatch.setattr(console, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    progress = Progress(rank=1, first_worker=1, enabled=True, epochs=3, batches=10)
    for step, seconds in enumerate([0.0, 1.0, 1.5, 2.5, 3.0, 4.5], 1):
        now[0] = 100.0 + seconds
        progress.step(0, step, loss=float(step))
    for step, seconds in enumerate([5.0, 5.5, 6.0, 6.6], 1):  # the next epoch, 1.6 s long
        now[0] = 100.0 + seconds
        progress.step(1, step, loss=0.5)
    lines = capsys.readouterr().err.splitlines()
    # the first step starts the clock; 2.5 s (step 4) and 4.5 s (step 6) are 2 s apart;
    # the interval runs on into the next epoch (6.6 s), whose rate is its own; its first
    # step (5.0 s) has no rate yet, so no line
    assert lines == ["epoch 1/3: step 4/10 (40%), loss 2.5000 (epoch mean), 1.2 steps/s, "
                     "ETA 5.0 s",
                     "epoch 1/3: step 6/10 (60%), loss 3.5000 (epoch mean), 1.1 steps/s, "
                     "ETA 3.6 s",
                     "epoch 2/3: step 4/10 (40%), loss 0.5000 (epoch mean), 1.9 steps/s, "
                     "ETA 3.2 s"]
    other = Progress(rank=0, first_worker=1, enabled=True, epochs=3, batches=10)
    other.step(0, 1, 1.0)
    assert other.mode == "off"  # a server (rank 0 here) takes no steps


def test_progress_mode_follows_the_flag_the_variable_and_the_terminal(monkeypatch):
    for name in ("MINIDP_PROGRESS", *console.LAUNCHER_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    assert progress_mode(True) == "off"  # pytest's stderr is captured: not a terminal
    monkeypatch.setenv("MINIDP_PROGRESS", "lines")  # a batch job's log, on request
    assert progress_mode(True) == "lines" and progress_mode(False) == "off"
    monkeypatch.setenv("MINIDP_PROGRESS", "bars")
    with pytest.raises(ValueError, match="MINIDP_PROGRESS: got 'bars', allowed: auto, bar, "
                                         "lines, off"):
        progress_mode(True)
    monkeypatch.setenv("MINIDP_PROGRESS_SECONDS", "-1")
    with pytest.raises(ValueError, match="MINIDP_PROGRESS_SECONDS: got '-1', allowed: a finite"):
        console.line_seconds()


def test_explain_steps_come_from_the_flag_else_the_environment(monkeypatch):
    monkeypatch.setenv("MINIDP_EXPLAIN", "3")
    assert explain_steps(0) == 3
    assert explain_steps(2) == 2
    monkeypatch.setenv("MINIDP_EXPLAIN", "many")
    with pytest.raises(ValueError, match="MINIDP_EXPLAIN: got 'many', allowed: an int >= 0"):
        explain_steps(0)


def test_explain_prints_each_ranks_communications_of_the_first_steps(tmp_path,
                                                                     synthetic_data_dir):
    command = [mpiexec(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "minidp", "train",
               "--model", "mlp", "--dataset", "synthetic", "--data-dir", synthetic_data_dir,
               "--train-samples", "512", "--test-samples", "256", "--epochs", "1",
               "--batch-size", "32", "--strategy", "hsgd", "--ranks-per-node", "2",
               "--explain", "2", "--no-progress", "--out", str(tmp_path / "run")]
    env = dict(os.environ, MPIEXEC_TIMEOUT="120", MINIDP_NUM_THREADS="1")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=150)
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert out.startswith("--explain: HierarchicalSGD (hsgd)\nTwo synchronous levels")
    lines = [line for line in out.splitlines() if line.startswith("rank ")]
    for rank, node, rail in ((0, "0,1", "0,2"), (1, "0,1", "1,3"), (2, "2,3", "0,2"),
                             (3, "2,3", "1,3")):
        steps = [line for line in lines if line.startswith(f"rank {rank} step 1:")]
        # hsgd's gradient step: node sum in the window, the rail's slice, the copy back
        assert [re.sub(r"  [\d.]+ ms$", "", s) for s in steps] == [
            f"rank {rank} step 1: comm_intra  node_reduce with ranks {node}  2,143,272 B",
            f"rank {rank} step 1: comm_inter  rail_allreduce with ranks {rail}  1,071,636 B",
            f"rank {rank} step 1: comm_intra  node_broadcast with ranks {node}  2,143,272 B"]
    assert any(line.startswith("rank 3 step 2: comm_inter  rail_allreduce") for line in lines)
    assert not any(" step 3:" in line for line in lines)  # two steps only
