"""What a training job prints while it runs: the progress bar, epochs, the --explain transcript.

* :class:`Progress`: the first worker's progress within an epoch, without
  ``--no-progress``: a ``tqdm`` bar (steps/s, loss, ETA) when its own standard error is
  a terminal; under ``mpiexec``, whose launcher pipes every rank's output, a line at
  most every :data:`LINE_SECONDS` seconds (step, mean loss, steps/s, ETA) when the
  launcher's standard error is a terminal (:func:`launcher_at_terminal`); nothing in
  a batch job or CI, whose output goes to files and pipes. ``MINIDP_PROGRESS`` and
  ``MINIDP_PROGRESS_SECONDS`` override the choice and the interval. Rank 0 prints one
  line per epoch.
* :func:`first_line`: ``out: DIR``, and where a resumed run goes on (epochs counted
  from 1, as the epoch lines count them).
* :class:`Explainer`: ``--explain N`` (or ``MINIDP_EXPLAIN=N``) prints, for this rank's
  first N steps, every communication it makes, in order, as the tracer records it:
  level, operation, peers, bytes, time. Rank 0 first prints the strategy's docstring,
  the paper's pseudo-code in words, so that each line can be read against it. Lines of
  different ranks interleave in the order they reach the terminal; ``grep '^rank 2 '``
  gives one rank's transcript.
"""

from __future__ import annotations

import inspect
import math
import os
import sys
import time
from typing import TYPE_CHECKING, Any

from minidp.comm.topology import Topology

if TYPE_CHECKING:
    from tqdm import tqdm

COMMUNICATION = ("comm_intra", "comm_inter", "wait")
FLAT = ("mpi", "ring", "recursive_doubling", "iallreduce")  # ops over every rank at once


MODES = ("auto", "bar", "lines", "off")
LINE_SECONDS = 2.0  # lines under mpiexec: a few seconds apart, never a flood
# Set by a launcher in its ranks' environment (MPICH's Hydra, Open MPI, Slurm's srun).
LAUNCHER_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")
LAUNCHER_DEPTH = 2  # rank <- MPICH's hydra_pmi_proxy (Open MPI's prted) <- mpiexec


def _parent(pid: int) -> int:
    """The parent of process ``pid`` (0 where /proc does not say)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def _terminal_of(pid: int) -> str | None:
    """The terminal device that process ``pid``'s standard error is, or None."""
    try:
        target = os.readlink(f"/proc/{pid}/fd/2")
    except OSError:
        return None
    return target if target.startswith(("/dev/pts/", "/dev/tty")) else None


def launcher_at_terminal() -> str | None:
    """The terminal of this rank's launcher (``mpiexec``) when it writes to one, else None.

    A launcher forwards its ranks' output through pipes, so a rank's own stderr is never
    a terminal under ``mpiexec``; whether the user watches is a property of the
    launcher's stderr. Only a rank that a launcher started (its variables are set) looks,
    and only :data:`LAUNCHER_DEPTH` processes up, so a job that a program starts with
    pipes (a test, ``minidp compare``) stays quiet even when that program runs in a
    terminal. Linux's /proc; elsewhere None.
    """
    if not any(v in os.environ for v in LAUNCHER_VARIABLES):
        return None
    pid = os.getpid()
    for _ in range(LAUNCHER_DEPTH):
        pid = _parent(pid)
        if pid <= 1:
            return None
        terminal = _terminal_of(pid)
        if terminal:
            return terminal
    return None


def progress_mode(enabled: bool) -> str:
    """``bar``, ``lines`` or ``off``: the flag, ``MINIDP_PROGRESS``, then where stderr goes."""
    chosen = os.environ.get("MINIDP_PROGRESS", "auto").strip() or "auto"
    if chosen not in MODES:
        raise ValueError(f"MINIDP_PROGRESS: got {chosen!r}, allowed: {', '.join(MODES)} "
                         "(auto: a bar on a terminal, lines when mpiexec writes to one, "
                         "else nothing)")
    if not enabled or chosen == "off":
        return "off"
    if chosen != "auto":
        return chosen
    if sys.stderr.isatty():
        return "bar"
    return "lines" if launcher_at_terminal() else "off"


def line_seconds() -> float:
    """Seconds between progress lines: ``MINIDP_PROGRESS_SECONDS``, else :data:`LINE_SECONDS`."""
    text = os.environ.get("MINIDP_PROGRESS_SECONDS", "").strip()
    if not text:
        return LINE_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not (seconds >= 0 and math.isfinite(seconds)):
        raise ValueError(f"MINIDP_PROGRESS_SECONDS: got {text!r}, allowed: a finite number of "
                         "seconds >= 0 (between two progress lines)")
    return seconds


class Progress:
    """The first worker's progress within each epoch; the epoch lines on rank 0.

    Args:
        rank: this rank.
        first_worker: the rank that shows progress (a server takes no steps).
        enabled: False with ``--no-progress``.
        epochs: the run's epochs.
        batches: a worker's batches per epoch (asynchronous workers may take more).
    """

    def __init__(self, rank: int, first_worker: int, enabled: bool, epochs: int,
                 batches: int) -> None:
        self.epochs, self.batches = epochs, batches
        mode = progress_mode(enabled)
        self.every = line_seconds()
        self.mode = mode if rank == first_worker else "off"
        self.bar: tqdm | None = None
        self.epoch, self.first, self.loss_sum = -1, 0, 0.0  # lines: the epoch so far
        self.started = 0.0
        self.last_line: float | None = None  # the run's first step starts the interval

    def step(self, epoch: int, steps: int, loss: float) -> None:
        """One step done (``steps`` of the epoch so far, its loss): the bar or a line."""
        if self.mode == "bar":
            self._bar(epoch, steps, loss)
        elif self.mode == "lines":
            self._line(epoch, steps, loss)

    def _bar(self, epoch: int, steps: int, loss: float) -> None:
        if self.bar is None:
            # Imported here: only a rank 0 that draws a bar needs it (some 13 ms of a start).
            from tqdm import tqdm

            self.bar = tqdm(total=self.batches, desc=f"epoch {epoch + 1}/{self.epochs}",
                            unit="step", leave=False, dynamic_ncols=True, file=sys.stderr)
        self.bar.update(1)
        if steps % 10 == 1:  # tqdm redraws at most ~10 times a second anyway
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def _line(self, epoch: int, steps: int, loss: float) -> None:
        now = time.perf_counter()
        if self.last_line is None:
            self.last_line = now
        if epoch != self.epoch:  # the epoch's first step: its rate is timed from here
            self.epoch, self.loss_sum, self.first, self.started = epoch, loss, steps, now
            return
        self.loss_sum += loss
        # The interval runs on across epochs: epochs shorter than it still show a line
        # now and then, never more often than every `every` seconds.
        if now - self.last_line < self.every:
            return
        self.last_line = now
        done = steps - self.first  # steps timed since the epoch's first one
        rate = done / max(now - self.started, 1e-9)
        where, eta = f"step {steps}", ""
        if steps <= self.batches:  # an asynchronous worker may take more than its share
            where = f"step {steps}/{self.batches} ({steps / self.batches:.0%})"
            eta = f", ETA {(self.batches - steps) / rate:.1f} s" if rate > 0 else ""
        # One write per line: the launcher forwards it whole, between other ranks' lines.
        sys.stderr.write(f"epoch {epoch + 1}/{self.epochs}: {where}, loss "
                         f"{self.loss_sum / (done + 1):.4f} (epoch mean), {rate:.1f} "
                         f"steps/s{eta}\n")
        sys.stderr.flush()

    def epoch_done(self, m: dict[str, Any]) -> None:
        """Close the bar; rank 0 prints the epoch's line."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        print(f"epoch {m['epoch']}/{self.epochs}: train loss {m['train_loss']:.4f}  "
              f"test loss {m['test_loss']:.4f}  test accuracy {m['test_accuracy']:.2%}  "
              f"{m['wall_s']:.1f} s (communication {m['comm_s'] / m['wall_s']:.0%})",
              flush=True)


def first_line(out: str, resuming: bool, start: int, partial: dict[str, Any] | None) -> str:
    """``out: DIR``, and where a resumed run goes on, its epochs counted from 1 as above."""
    if not resuming:
        return f"out: {out}"
    where = (f"in epoch {start + 1}, after batch {partial['batch']}" if partial
             else f"after epoch {start}")
    return f"out: {out} (resuming {where})"


def explain_steps(flag: int) -> int:
    """Steps to explain: ``--explain N``, else ``MINIDP_EXPLAIN``, else 0 (off)."""
    if flag:
        return flag
    text = os.environ.get("MINIDP_EXPLAIN", "0")
    try:
        steps = int(text)
    except ValueError:
        steps = -1
    if steps < 0:
        raise ValueError(f"MINIDP_EXPLAIN: got {text!r}, allowed: an int >= 0 (steps to "
                         "explain)")
    return steps


class Explainer:
    """A tracer listener printing this rank's communications for its first ``steps`` steps.

    A worker's step starts with its forward pass; a server counts its updates instead
    (it never runs forward), so both stop after about the same stretch of the run.
    """

    def __init__(self, topology: Topology, steps: int) -> None:
        self.rank, self.steps, self.step = topology.rank, steps, 0
        self.counted = "forward" if topology.role == "worker" else "optimizer"
        nodes = topology.nodes_of_ranks
        workers = topology.worker_ranks
        self.node = [r for r in workers if nodes[r] == nodes[self.rank]]
        if self.rank in self.node:
            k = self.node.index(self.rank)
            members = {n: [r for r in workers if nodes[r] == n] for n in dict.fromkeys(
                nodes[r] for r in workers)}
            self.rail = [m[k] for m in members.values() if k < len(m)]
        else:
            self.rail = []
        self.world = list(range(topology.size))

    @staticmethod
    def introduce(strategy: type) -> None:
        """Rank 0: the strategy class's docstring, the words the transcript's lines follow."""
        print(f"--explain: {strategy.__name__} ({strategy.name})\n"
              f"{inspect.getdoc(strategy)}\n", flush=True)

    def peers(self, name: str, op: str) -> str:
        """Who takes part: named in a point-to-point label, else by the operation's level."""
        if " rank" in op or "ranks" in op:
            return ""
        if op.split()[0] in FLAT or op.startswith(("centre", "broadcast parameters")):
            group = self.world
        else:
            group = self.node if name == "comm_intra" or op.startswith("node") else self.rail
        return f" with ranks {','.join(map(str, group))}"

    def __call__(self, event: dict[str, Any]) -> None:
        """Print one traced event while this rank is within its first ``steps`` steps."""
        if event["name"] == self.counted and event["ph"] == "X":
            self.step += 1
            return
        if self.step > self.steps:  # step 0: setting up (the first broadcast)
            return
        args = event.get("args", {})
        if event["ph"] == "i" and event["name"] != "step":  # a decision (not a step's mark)
            numbers = " ".join(f"{k}={v}" for k, v in args.items())
            self._say(f"decision  {event['name']}  {numbers}")
        elif event["name"] in COMMUNICATION:
            op = str(args.get("op", "?"))
            size = f"  {int(args['bytes']):,} B" if args.get("bytes") else ""
            self._say(f"{event['name']:<10}  {op}{self.peers(event['name'], op)}{size}  "
                      f"{event['dur'] / 1e3:.2f} ms")

    def _say(self, text: str) -> None:
        # One write per line: lines of ranks sharing a terminal do not run into each other.
        sys.stdout.write(f"rank {self.rank} step {self.step}: {text}\n")
        sys.stdout.flush()
