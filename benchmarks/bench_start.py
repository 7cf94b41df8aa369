"""A process's start: importing minidp, then its first kernel, with and without Numba's refresh.

    .venv/bin/python benchmarks/bench_start.py            (15 processes of each kind)
    .venv/bin/python benchmarks/bench_start.py --repeats 30

Every rank of every job starts a Python process that imports NumPy, Numba, mpi4py and
minidp and then loads its kernels from Numba's cache (the test suite starts about 600).
Three kinds of process, started in turn so that a busy machine slows each alike:

* ``import``: ``import minidp`` alone;
* ``kernel``: then the first kernel call (the dataset checksum a run begins with, and
  relu), as minidp loads it: without the compiler's registries (minidp/kernels/cached.py);
* ``numba``: the same with Numba's own cache load put back, which refreshes them first.

The table gives each kind's median CPU time (user + system, the process's own) and wall
time, and the kernel start's share of the one with Numba's refresh. The kernels must be
in the cache already (any earlier minidp run on this machine, or ``make test``).
"""

import argparse
import resource
import statistics
import subprocess
import sys
import time

import common

from minidp.kernels import cached

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--repeats", type=int, default=15, help="processes of each kind (15)")

KERNEL = """
import numpy as np
from minidp.kernels import checksum, relu_forward
checksum.byte_checksum(np.arange(4096, dtype=np.uint8))
relu_forward(np.linspace(-1, 1, 1000, dtype=np.float32))
"""
NUMBA = """
from numba.core import caching
del caching.FunctionCache.load_overload  # back to Numba's, which it inherits from Cache
""" + KERNEL
KINDS = {"import": "import minidp", "kernel": "import minidp" + KERNEL,
         "numba": "import minidp" + NUMBA}


def start(code: str) -> tuple[float, float]:
    """CPU and wall seconds of one process running ``code``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return cpu, wall


def main() -> None:
    repeats = ARGS.parse_args().repeats
    if not cached.install():
        raise SystemExit("this Numba's cache is not the one minidp/kernels/cached.py knows: "
                         "every load refreshes, there is nothing to compare")
    start(KINDS["kernel"])  # fills the cache if a kernel is missing, untimed
    times: dict[str, list[tuple[float, float]]] = {kind: [] for kind in KINDS}
    for _ in range(repeats):
        for kind, code in KINDS.items():
            times[kind].append(start(code))
    print(f"{repeats} processes of each kind, started in turn; medians\n")
    medians = {kind: (statistics.median(c for c, _ in runs), statistics.median(w for _, w in runs))
               for kind, runs in times.items()}
    common.print_table(["process", "CPU s", "wall s"],
                       [[kind, f"{cpu:.3f}", f"{wall:.3f}"]
                        for kind, (cpu, wall) in medians.items()])
    (kernel, _), (numba, _) = medians["kernel"], medians["numba"]
    print(f"\nthe first kernel without the refresh: {kernel / numba:.2f}x the CPU of Numba's "
          f"own load ({numba - kernel:.3f} s less per process)")


if __name__ == "__main__":
    main()
