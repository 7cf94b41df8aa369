"""What handing work to a rank's other threads costs, and from what size a second one pays.

    .venv/bin/python benchmarks/bench_wake.py              (1 and 2 threads)
    .venv/bin/python benchmarks/bench_wake.py --threads 1,4

minidp's thread pools sleep soon after they are idle (``IDLE_WAIT`` in
``minidp/threads.py``: OpenBLAS's worker after 7 us of spinning, Numba's OpenMP threads
after 10000 rounds where GNU OpenMP runs them, the Python pool at once), so a use after
a pause pays a wake-up, whose cost depends on the machine (a virtual machine's idle core
may have to be rescheduled by the host). The thresholds that keep small work on one
thread are set from these costs:

* **Hand-offs**: an empty ``prange`` kernel (Numba's OpenMP pool, which runs the
  convolutions' regions too) called back to back and after 1 ms of one-thread work; an
  empty region of the Python pool (:meth:`minidp.kernels.threaded.Plan.run`, the
  regions that keep Python steps); BLAS set to one thread and back
  (:func:`minidp.threads.blas_single_threaded`).
* **Products** (:data:`minidp.threads.GEMM_THREADS_MIN_FLOPS`): the four models' linear
  layers and a LeNet-5 convolution chunk's products, on one BLAS thread and on the
  largest count, each after 0.2 ms of one-thread work (as between a step's GEMMs).
  ``rule`` is the count minidp runs the product on; ``best`` the faster measured.
* **Streaming kernels** (:data:`minidp.kernels.threaded.SPREAD_MIN_ELEMENTS`): relu
  forward, serial and ``prange``, from 64K to 2M float32 elements, the same way.
* **Convolution regions** (:mod:`minidp.kernels.gemm`): a layer's forward and backward
  pass of each engine at ``bench_step.py``'s batch, on one thread, and on the largest
  count with each region run as one parallel kernel (minidp's way) and as Python steps
  around the same kernels on the Python pool (``gemm.native`` turned off), each after
  1 ms of one-thread work.

Times are medians of 40 calls (hand-offs: 300), the smallest of two rounds.
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

import bench_ops  # noqa: E402
import common  # noqa: E402
import numba  # noqa: E402
import numpy as np  # noqa: E402

from minidp import Tensor, threads  # noqa: E402
from minidp import functional as F  # noqa: E402
from minidp.autograd.ops import rowtap, winograd  # noqa: E402
from minidp.kernels import elementwise, gemm, threaded  # noqa: E402

# (M, K, N) of each product: a linear layer's forward (out, in) @ (in, batch) and its
# weight gradient, at the batches of bench_step.py, and a LeNet-5 conv2 chunk's
MATMULS = [("mlp fc1 forward", (512, 784, 128)), ("mlp fc1 weight gradient", (512, 128, 784)),
           ("mlp fc2 forward", (256, 512, 128)), ("mlp fc3 forward", (10, 256, 128)),
           ("lenet5 fc1 forward", (120, 400, 64)), ("lenet5 fc2 forward", (84, 120, 64)),
           ("lenet5 fc1 weight gradient", (120, 64, 400)),
           ("cifar_cnn fc1 forward", (256, 2048, 64)),
           ("lenet5 conv2 chunk, weight gradient", (150, 3200, 16))]
RELU_SIZES = [1 << 16, 1 << 17, 1 << 18, 1 << 19, 1 << 20, 1 << 21]
# A layer of each engine, by its name in bench_ops.py (its shapes are there); a model's
# first layer takes no input gradient, as in a step
CONV_LAYERS = ["lenet5 conv1", "lenet5 conv2", "resnet20 layer1", "cifar_cnn conv3"]


@numba.njit(nogil=True)
def busy(iterations):  # pragma: no cover - compiled
    """One thread's arithmetic for a while, touching no memory (the pools fall asleep)."""
    a = 0.0
    for _ in range(iterations):
        a = a * 0.999999 + 1.0
    return a


@numba.njit(nogil=True, parallel=True)
def empty_prange(out):  # pragma: no cover - compiled
    """A parallel kernel with nothing to do but start every thread."""
    for i in numba.prange(out.size):
        out[i] = i


def iterations_for(seconds):
    """How many iterations of :func:`busy` take about ``seconds``."""
    busy(10)
    start = time.perf_counter()
    busy(1_000_000)
    return int(1_000_000 * seconds / (time.perf_counter() - start))


def median_us(call, calls=40, before=None):
    """Median time of ``call`` in microseconds, the smaller of two rounds."""
    rounds = []
    for _ in range(2):
        times = []
        for _ in range(calls):
            if before is not None:
                before()
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        rounds.append(statistics.median(times) * 1e6)
    return min(rounds)


def handoffs(count, pause):
    """Rows of the hand-off table at ``count`` threads."""
    threads.limit_threads(count)
    out = np.zeros(count)
    empty_prange(out)
    plan = threaded.Plan(count * 4, threaded.MIN_BYTES_PER_THREAD, threads=count)

    def region():
        plan.run(lambda thread, lo, hi: None)

    def blas_one():
        with threads.blas_single_threaded():
            pass

    return [[f"empty prange kernel, back to back ({count} threads)",
             f"{median_us(lambda: empty_prange(out), 300):.1f}"],
            [f"empty prange kernel, after 1 ms of work ({count} threads)",
             f"{median_us(lambda: empty_prange(out), 100, before=pause):.1f}"],
            [f"empty region of the Python pool ({count} threads)",
             f"{median_us(region, 300):.1f}"],
            ["BLAS to one thread and back", f"{median_us(blas_one, 300):.1f}"]]


def products(count, pause):
    """Rows of the product table: each shape on one BLAS thread and on ``count``."""
    rng = np.random.default_rng(0)
    rows = []
    for name, (m, k, n) in MATMULS:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        out = np.empty((m, n), np.float32)
        times = {}
        for threads_used in (1, count):
            threads.limit_threads(threads_used)
            times[threads_used] = median_us(lambda: np.matmul(a, b, out=out), before=pause)
        flops = 2 * m * k * n
        rule = 1 if flops < threads.GEMM_THREADS_MIN_FLOPS else count
        best = min(times, key=times.get)
        rows.append([name, f"{m}x{k} @ {k}x{n}", f"{flops / 1e6:.1f}", f"{times[1]:.0f}",
                     f"{times[count]:.0f}", f"{times[1] / times[count]:.2f}x", rule, best])
    return rows


def streaming(count, pause):
    """Rows of the relu table: serial and prange on ``count`` threads, by size."""
    threads.limit_threads(count)
    rng = np.random.default_rng(1)
    rows = []
    for size in RELU_SIZES:
        x = rng.standard_normal(size).astype(np.float32)
        out = np.empty_like(x)
        serial = median_us(lambda: elementwise._relu_forward_kernel(x, out), before=pause)
        parallel = median_us(lambda: elementwise._relu_forward_parallel(x, out), before=pause)
        spread = "prange" if size >= threaded.SPREAD_MIN_ELEMENTS else "serial"
        rows.append([f"{size // 1024}K", f"{serial:.0f}", f"{parallel:.0f}",
                     f"{serial / parallel:.2f}x", spread])
    return rows


def regions(count, pause):
    """Rows of the region table: each layer's forward + backward, three ways."""
    rng = np.random.default_rng(2)
    rows = []
    shapes = {name: rest for name, *rest in bench_ops.SHAPES}
    for name in CONV_LAYERS:
        x_shape, w_shape, stride, pad = shapes[name]
        want_x = not name.endswith("conv1")
        engine = ("Winograd" if winograd.applies(x_shape, w_shape, stride, pad) else
                  "row taps" if rowtap.applies(x_shape, w_shape, stride, pad) else "im2col")
        name = f"{name} ({engine}{'' if want_x else ', weight gradient only'})"
        x = Tensor(rng.standard_normal(x_shape).astype(np.float32), requires_grad=want_x)
        w = Tensor(rng.standard_normal(w_shape).astype(np.float32), requires_grad=True)
        b = Tensor(rng.standard_normal(w_shape[0]).astype(np.float32), requires_grad=True)
        g = F.conv2d(x, w, b, stride=stride, padding=pad).data.copy()

        def step():
            F.conv2d(x, w, b, stride=stride, padding=pad).backward(g)

        threads.limit_threads(1)
        one_thread = median_us(step, before=pause)
        threads.limit_threads(count)
        region_kernel = median_us(step, before=pause)
        native, gemm.native = gemm.native, lambda dtype: None
        try:
            python_steps = median_us(step, before=pause)
        finally:
            gemm.native = native
        rows.append([name, f"{one_thread:.0f}", f"{python_steps:.0f}", f"{region_kernel:.0f}",
                     f"{one_thread / python_steps:.2f}x", f"{one_thread / region_kernel:.2f}x"])
    return rows


def main():
    count = max(COUNTS)
    if count < 2:
        raise SystemExit("error: --threads must include a count above 1 (got "
                         f"{','.join(map(str, COUNTS))})")
    short, long = iterations_for(0.2e-3), iterations_for(1e-3)
    load = os.getloadavg()[0]
    print(f"load average {load:.2f}; {os.cpu_count()} cores; Numba threading layer after "
          f"the first kernel: ", end="")
    empty_prange(np.zeros(count))
    print(numba.threading_layer())
    print()
    common.print_table(["hand-off", "median us"], handoffs(count, lambda: busy(long)))
    print()
    common.print_table(["product", "shape", "MFLOP", "1 thread us", f"{count} threads us",
                        "speed-up", "rule", "best"], products(count, lambda: busy(short)))
    print(f"\nrule: one BLAS thread under GEMM_THREADS_MIN_FLOPS = "
          f"{threads.GEMM_THREADS_MIN_FLOPS / 1e6:g} MFLOP\n")
    common.print_table(["relu elements", "serial us", f"prange on {count} us", "speed-up",
                        "minidp runs"], streaming(count, lambda: busy(short)))
    print(f"\nminidp runs prange from SPREAD_MIN_ELEMENTS = "
          f"{threaded.SPREAD_MIN_ELEMENTS // 1024}K elements\n")
    common.print_table(["conv layer, forward + backward, batch 64", "1 thread us",
                        f"{count} threads, Python steps us",
                        f"{count} threads, region kernel us", "speed-up, Python steps",
                        "speed-up, region kernel"],
                       regions(count, lambda: busy(long)))


if __name__ == "__main__":
    main()
