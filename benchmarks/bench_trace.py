r"""What the trace's arrows cost: a message, an allreduce and a training step, traced or not.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_trace.py
    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py benchmarks/bench_trace.py \
        --ranks-per-node 2

A run records every slice, every decision of its first steps and both ends of every
message and collective (issue 39); ``Tracer(record_events=False)`` records none of it
(the counters go on, the ids are not even hashed). Measured in the same run, in turn,
so a machine shared with other jobs slows both alike: a round trip of a 32-byte message
between ranks 0 and 1 (a pull's header: the smallest message, where the arrows' share is
largest), a 64 KiB hierarchical allreduce, and one training step of ``sync`` with the
hierarchical allreduce on the MLP at batch 32 (forward, backward, allreduce, update).
Each call is timed (its slowest rank's); each row gives the best and the median call,
traced and untraced, and their ratios.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402, F401 (one thread per rank, before minidp)
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from minidp import Tensor, layers, optim, strategies  # noqa: E402
from minidp import functional as F  # noqa: E402
from minidp.comm import Topology, allreduce, p2p  # noqa: E402
from minidp.trace import Tracer, set_tracer  # noqa: E402

world = MPI.COMM_WORLD


def timed(fn, calls: int) -> list[float]:
    """Seconds of each of ``calls`` calls of ``fn`` (each call's slowest rank's)."""
    world.Barrier()
    seconds = np.empty(calls)
    for k in range(calls):
        start = time.perf_counter()
        fn()
        seconds[k] = time.perf_counter() - start
    world.Allreduce(MPI.IN_PLACE, seconds, op=MPI.MAX)
    return list(seconds)


def cases(topology: Topology) -> dict:
    """The cases: name -> (one call, calls per turn)."""
    header = np.zeros(4, np.int64)
    r = world.rank

    def round_trip() -> None:
        if r == 0:
            p2p.send(header, 1, 5, topology, "ping")
            p2p.recv(header, 1, 6, topology, "pong")
        elif r == 1:
            p2p.recv(header, 0, 5, topology, "ping")
            p2p.send(header, 0, 6, topology, "pong")

    buffer = np.ones(16384, np.float32)
    layers.manual_seed(0)
    model = layers.model_for("mlp", (1, 28, 28), 10)
    sgd = optim.make_optimizer("sgd", model.parameters(), 0.01, 0.9, False, 0.0, 0.001)
    strategy = strategies.get("sync", model, sgd, topology, allreduce="hierarchical")
    rng = np.random.default_rng(r)
    x = rng.standard_normal((32, 1, 28, 28)).astype(np.float32)
    y = rng.integers(0, 10, 32)

    def step() -> None:
        sgd.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        strategy.step(0)

    return {"32 B round trip": (round_trip, 200),
            "64 KiB allreduce": (lambda: allreduce(buffer, topology, "hierarchical"), 50),
            "sync MLP step": (step, 5)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks-per-node", type=int, default=None)
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()
    topology = Topology(ranks_per_node=args.ranks_per_node)
    measured = cases(topology)
    times: dict[tuple[str, bool], list[float]] = {}
    for turn in range(args.rounds):
        for name, (fn, calls) in measured.items():
            for traced in (True, False) if turn % 2 else (False, True):
                # a fresh tracer each turn: a long run's events would hit the cap
                set_tracer(Tracer(world.rank, record_events=traced))
                times.setdefault((name, traced), []).extend(timed(fn, calls))
    if world.rank == 0:
        print(f"{world.size} ranks, {args.rounds} turns, each call timed (microseconds)")
        print(f"{'case':<18} {'traced':>9} {'untraced':>9} {'ratio':>6}   "
              f"{'median traced':>13} {'untraced':>9} {'ratio':>6}")
        for name in measured:
            on, off = times[name, True], times[name, False]
            best_on, best_off = min(on) * 1e6, min(off) * 1e6
            mid_on, mid_off = np.median(on) * 1e6, np.median(off) * 1e6
            print(f"{name:<18} {best_on:>9.1f} {best_off:>9.1f} {best_on / best_off:>6.3f}   "
                  f"{mid_on:>13.1f} {mid_off:>9.1f} {mid_on / mid_off:>6.3f}")


if __name__ == "__main__":
    main()
