"""What a training job prints while it runs: the progress bar, epochs, the --explain transcript.

* :class:`Progress`: rank 0's (the first worker's) ``tqdm`` bar for the epoch (steps/s,
  loss, ETA), only on a terminal and without ``--no-progress``; one line per epoch.
* :class:`Explainer`: ``--explain N`` (or ``MINIDP_EXPLAIN=N``) prints, for this rank's
  first N steps, every communication it makes, in order, as the tracer records it:
  level, operation, peers, bytes, time. Rank 0 first prints the strategy's docstring,
  the paper's pseudo-code in words, so that each line can be read against it. Lines of
  different ranks interleave in the order they reach the terminal; ``grep '^rank 2 '``
  gives one rank's transcript.
"""

from __future__ import annotations

import inspect
import os
import sys
from typing import Any

from tqdm import tqdm

from minidp.comm.topology import Topology

COMMUNICATION = ("comm_intra", "comm_inter", "wait")
FLAT = ("mpi", "ring", "recursive_doubling", "iallreduce")  # ops over every rank at once


class Progress:
    """A tqdm bar per epoch on the first worker's terminal; the epoch lines on rank 0."""

    def __init__(self, rank: int, first_worker: int, enabled: bool, epochs: int,
                 batches: int) -> None:
        self.epochs, self.batches = epochs, batches
        self.shown = enabled and rank == first_worker and sys.stderr.isatty()
        self.bar: tqdm | None = None

    def step(self, epoch: int, steps: int, loss: float) -> None:
        """One step done: advance the bar (started at an epoch's first step)."""
        if not self.shown:
            return
        if self.bar is None:
            self.bar = tqdm(total=self.batches, desc=f"epoch {epoch + 1}/{self.epochs}",
                            unit="step", leave=False, dynamic_ncols=True, file=sys.stderr)
        self.bar.update(1)
        if steps % 10 == 1:  # tqdm redraws at most ~10 times a second anyway
            self.bar.set_postfix(loss=f"{loss:.4f}", refresh=False)

    def epoch_done(self, m: dict[str, Any]) -> None:
        """Close the bar; rank 0 prints the epoch's line."""
        if self.bar is not None:
            self.bar.close()
            self.bar = None
        print(f"epoch {m['epoch']}/{self.epochs}: train loss {m['train_loss']:.4f}  "
              f"test loss {m['test_loss']:.4f}  test accuracy {m['test_accuracy']:.2%}  "
              f"{m['wall_s']:.1f} s (communication {m['comm_s'] / m['wall_s']:.0%})",
              flush=True)


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
        if event["ph"] == "i":
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
