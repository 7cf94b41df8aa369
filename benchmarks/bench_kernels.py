"""Each kernel that streams over a tensor, on one thread and on more: the split's gain.

    .venv/bin/python benchmarks/bench_kernels.py              (1 and 2 threads)
    .venv/bin/python benchmarks/bench_kernels.py --threads 1,2,4

The public kernel functions of ``minidp/kernels/`` (relu, the SGD step, DASO's merge, the
node window's sum, batch norm with its relu, pooling, the dataset checksum) on arrays of
the sizes the four models' steps give them (ResNet-20's activations at batch 64, LeNet-5's
pooling, a 270K-parameter buffer). At each thread count of ``--threads``, set by
``minidp.threads.limit_threads``, each kernel runs 3 times untimed and then 30 times; the
table gives the median time per call and each count's speed-up over the first. Under
:data:`minidp.kernels.threaded.SPREAD_MIN_ELEMENTS` elements, or on one thread, a
kernel's serial loop runs, so the first column is the serial kernels.
"""

import argparse
import os
import statistics
import time

from thread_counts import thread_counts

ARGS = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ARGS.add_argument("--threads", default="1,2", help="thread counts, comma-separated (1,2)")
COUNTS = thread_counts(["--threads", ARGS.parse_args().threads])
# Numba sizes its pool from the count minidp chooses when it is imported: the largest.
os.environ["MINIDP_NUM_THREADS"] = str(max(COUNTS))

import common  # noqa: E402
import numpy as np  # noqa: E402

from minidp.kernels import batchnorm, checksum, elementwise, pooling, reduce  # noqa: E402
from minidp.threads import limit_threads  # noqa: E402


def cases() -> dict:
    """Each kernel's call on arrays of a step's sizes."""
    rng = np.random.default_rng(0)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    w, g, buf = f32(270_000), f32(270_000), f32(270_000)
    out = np.empty_like(w)
    act = f32(64, 16, 1024)  # ResNet-20's first stage at batch 64, (N, C, H*W)
    planes = act.reshape(64, 16, 32, 32)
    whole = f32(2, 1 << 20)  # a node window of 2 ranks' 1M-element segments
    weight, bias = np.ones(16, np.float32), np.zeros(16, np.float32)
    mean, var = np.zeros(16), np.ones(16)
    pool_in = f32(64, 6, 28, 28)  # LeNet-5's first pooling
    pooled, argmax = pooling.maxpool_forward(pool_in, 2, 2)
    averaged = pooling.avgpool_forward(planes, 8, 8)
    data = rng.integers(0, 255, 20_000_000, dtype=np.uint8)
    return {
        "relu forward, 1M": lambda: elementwise.relu_forward(act),
        "relu backward, 1M": lambda: elementwise.relu_backward(act, act),
        "SGD step in place, 270K": lambda: elementwise.sgd_update(w, g, buf, 0.01, 0.9, 5e-4),
        "SGD step into a buffer, 270K": lambda: elementwise.sgd_update(w, g, buf, 0.01, 0.9,
                                                                      5e-4, out=out),
        "DASO's merge, 270K": lambda: elementwise.weighted_merge(w, g, 2.0, 4),
        "node sum, 2 x 1M": lambda: reduce.node_sum(whole, 0, 1 << 20, 2, True),
        "batch norm + relu forward, 1M": lambda: batchnorm.batchnorm_forward(
            act, weight, bias, None, True, True, 1e-5, mean, var),
        "batch norm + relu backward, 1M": lambda: batchnorm.batchnorm_backward(
            act, act, act, weight, mean, var, True, True, True, False),
        "max pool 2x2 forward, (64,6,28,28)": lambda: pooling.maxpool_forward(pool_in, 2, 2),
        "max pool 2x2 backward": lambda: pooling.maxpool_backward(pooled, argmax,
                                                                  pool_in.shape, 2, 2),
        "average pool 8x8 forward, 1M": lambda: pooling.avgpool_forward(planes, 8, 8),
        "average pool 8x8 backward": lambda: pooling.avgpool_backward(averaged, planes.shape,
                                                                      8, 8),
        "dataset checksum, 20 MB": lambda: checksum.byte_checksum(data),
    }


def median_call(fn, warmup=3, calls=30) -> float:
    """Median seconds of one call of ``fn`` over ``calls`` calls after ``warmup``."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    table = cases()
    seconds = {}
    for count in COUNTS:
        limit_threads(count)
        for name, fn in table.items():
            seconds[name, count] = median_call(fn)
    headers = ["kernel"] + [f"{t} thread(s) us" for t in COUNTS] + [
        f"{t}t speed-up" for t in COUNTS[1:]]
    rows = [[name] + [f"{seconds[name, t] * 1e6:.0f}" for t in COUNTS]
            + [f"{seconds[name, COUNTS[0]] / seconds[name, t]:.2f}x" for t in COUNTS[1:]]
            for name in table]
    print(f"load average {os.getloadavg()[0]:.2f}; {os.cpu_count()} cores\n")
    common.print_table(headers, rows)


if __name__ == "__main__":
    main()
