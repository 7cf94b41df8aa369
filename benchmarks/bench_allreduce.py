r"""Allreduce algorithms against MPICH's own Allreduce, 64 KB to 64 MB, float32.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_allreduce.py
    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py benchmarks/bench_allreduce.py \\
        --ranks-per-node 2

Prints, per size and algorithm, the best time, the algorithm bandwidth (bytes / time),
the bus bandwidth (algbw x 2(n-1)/n) and the ratio of bus bandwidths to MPICH's own
blocking ``Allreduce`` (the first row of each size) measured in the same run. minidp's
``mpi`` algorithm is MPI's ``Iallreduce`` completed by a timed wait (which names
missing ranks); the difference between the two rows is that safety's cost. Only
2-rank timings mean much on a 2-core machine.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from minidp.comm import ALLREDUCE_ALGORITHMS, Topology, allreduce, shared_buffer  # noqa: E402

world = MPI.COMM_WORLD
SIZES = [64 << 10, 1 << 20, 4 << 20, 16 << 20, 64 << 20]


def best_time(fn, seconds: float = 0.5, at_least: int = 5) -> float:
    best, runs, start = float("inf"), 0, time.perf_counter()
    # the decision to go on is rank 0's, so every rank makes the same number of calls
    while world.bcast(runs < at_least or time.perf_counter() - start < seconds):
        world.Barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, world.allreduce(time.perf_counter() - t0, op=MPI.MAX))
        runs += 1
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ranks-per-node", type=int, default=None)
    args = parser.parse_args()
    topo = Topology(ranks_per_node=args.ranks_per_node)
    n = world.size
    rows = []
    for nbytes in SIZES:
        count = nbytes // 4
        reference = np.zeros(count, np.float32)
        times = {"MPICH Allreduce": best_time(
            lambda: world.Allreduce(MPI.IN_PLACE, reference, op=MPI.SUM))}
        for algorithm in ALLREDUCE_ALGORITHMS:
            buf = np.zeros(count, np.float32)  # zeros: repeated in-place sums stay finite
            times[algorithm] = best_time(lambda: allreduce(buf, topo, algorithm))
        zero = shared_buffer(topo, count, np.float32)  # a NodeBuffer: reduced in its window
        zero.array[...] = 0
        times["hierarchical (zero-copy)"] = best_time(lambda: allreduce(zero, topo,
                                                                        "hierarchical"))
        for algorithm, t in times.items():
            algbw = nbytes / t / 1e9
            busbw = algbw * 2 * (n - 1) / n
            rows.append([f"{nbytes >> 10} KiB", algorithm, f"{t * 1e3:.3f}", f"{algbw:.2f}",
                         f"{busbw:.2f}", f"{times['MPICH Allreduce'] / t:.2f}x"])
    if world.rank == 0:
        print(f"{n} ranks, {topo.num_nodes} node(s) of {topo.local_size}")
        common.print_table(["size", "algorithm", "ms", "algbw GB/s", "busbw GB/s",
                            "busbw / MPICH"], rows)


if __name__ == "__main__":
    main()
