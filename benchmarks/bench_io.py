"""Reading a dataset file: collective contiguous MPI-IO against naive readers.

    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_io.py \
        [--size-mb 220] [--shape 1,28,28]      (or -n 4: the training runs' 2 x 2)

Generates (once) an .mdp file of at least 200 MB of uint8 records (Fashion-MNIST's
1x28x28 by default, ``--shape 3,32,32`` for CIFAR-10's) and
times, per rank and in one run, reading this rank's share of one epoch three ways:

* ``mpiio``: minidp's reader, this rank's contiguous block by collective ``Iread_at_all``
  (without ROMIO's collective buffering, ``readers.open_for_blocks``): epoch 0's block,
  and epoch 1's (each rank its neighbour's block, as every later epoch);
* ``strided``: the same number of records at scattered offsets, one ``Read_at`` each;
* ``numpy.fromfile``: plain file reads of exactly the byte range ``mpiio`` reads.

Throughput is all ranks' bytes over the slowest rank's time, best of 3; the file sits
in the page cache (it was just written or read), so this measures each reader's own
overhead, which is the point of contiguous reads.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from minidp.io.mdp import HEADER_SIZE, read_header, write_mdp  # noqa: E402
from minidp.io.readers import MPIIOReader, StridedReader, block_range  # noqa: E402

comm = MPI.COMM_WORLD


def ensure_file(path: str, size_mb: int, shape: tuple[int, ...]) -> None:
    record = int(np.prod(shape)) + 8
    count = size_mb * 2**20 // record + 1
    if comm.rank == 0:
        try:
            header = read_header(path)
            ok = header.count == count and header.sample_shape == shape
        except (FileNotFoundError, ValueError):
            ok = False
        if not ok:
            rng = np.random.default_rng(0)
            x = rng.integers(0, 256, (count, *shape), dtype=np.uint8)
            write_mdp(path, x, rng.integers(0, 10, count), 10, progress=True)
    comm.Barrier()


def timed(fn) -> float:
    best = float("inf")
    for _ in range(3):
        comm.Barrier()
        t0 = time.perf_counter()
        fn()
        best = min(best, comm.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mb", type=int, default=220)
    parser.add_argument("--shape", default="1,28,28", help="sample shape, e.g. 3,32,32")
    args = parser.parse_args()
    shape = tuple(int(d) for d in args.shape.split(","))
    args.path = os.path.join("data", f"bench-io-{'x'.join(map(str, shape))}.mdp")
    os.makedirs("data", exist_ok=True)
    ensure_file(args.path, args.size_mb, shape)

    mpiio = MPIIOReader(args.path)
    strided = StridedReader(args.path)
    header = mpiio.header
    start, stop = block_range(mpiio.block_of(0), comm.size, header.count)
    my_bytes = (stop - start) * header.record_size
    scattered = np.random.default_rng(comm.rank).permutation(header.count)[:stop - start]
    total = comm.allreduce(my_bytes)

    results = {
        "mpiio (Iread_at_all, contiguous)": timed(lambda: mpiio.read_block(0)),
        # Epoch 1: every rank reads its neighbour's block, the rotation of every later
        # epoch; ROMIO's collective buffering would hand each block over between ranks.
        "mpiio, a rotated epoch's block": timed(lambda: mpiio.read_block(1)),
        "numpy.fromfile (same ranges)": timed(lambda: np.fromfile(
            args.path, dtype=np.uint8, count=my_bytes,
            offset=HEADER_SIZE + start * header.record_size)),
        "strided (Read_at per record)": timed(lambda: strided.read_records(scattered)),
    }
    if comm.rank == 0:
        base = results["mpiio (Iread_at_all, contiguous)"]
        print(f"{header.count} records of {header.record_size} B = {total / 2**20:.0f} MiB, "
              f"{comm.size} ranks")
        common.print_table(["reader", "seconds", "MB/s", "mpiio speed / this"], [
            [name, f"{s:.3f}", f"{total / s / 1e6:.0f}", f"{s / base:.2f}x"]
            for name, s in results.items()])


if __name__ == "__main__":
    main()
