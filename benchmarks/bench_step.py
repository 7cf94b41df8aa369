"""One training step (forward, backward, SGD with momentum): minidp against PyTorch.

    .venv/bin/python benchmarks/bench_step.py [MODEL ...]     (make torch first)
    .venv/bin/python benchmarks/bench_step.py --threads 1,2 --no-memory
    .venv/bin/python benchmarks/bench_step.py --repeats 5 --no-memory mlp
    .venv/bin/python benchmarks/bench_step.py --threads 1,2 --no-memory --no-torch
    python benchmarks/bench_step.py --backend cupy [MODEL ...]   (a GPU; PyTorch CUDA)

float32, measured in the same run: mlp at batch 128, lenet5, cifar_cnn and resnet20 at
batch 64, at each thread count of ``--threads`` (default 1; minidp's count is set by
``minidp.threads.limit_threads``, PyTorch's by ``torch.set_num_threads``). Every
(framework, thread count) pair takes its turn, so that a machine shared with other jobs
slows all alike, for at least 15 rounds and 4 s per repeat; each of ``--repeats`` (3)
repeats gives each pair's median step. A turn is ``--block`` (2) steps, each timed but
the first: the first follows the other pairs' turns, after which a pair's threads have
slept for milliseconds, a start that a training run, its steps back to back, pays once
(on the 2-core machine a minidp step at two threads after a 6 ms pause took 1.2 ms more
than one right after a step, the MLP's 5.5 ms against 4.3). ``--block 1`` times every
step, the turns one step each. The tables give the median over the repeats of those
medians, and every ratio as the median (and [min, max]) of the repeats' ratios, each
ratio between two steps of the same repeat: minidp / PyTorch at each thread count, and
each framework's speed-up over its own one-thread step.

PyTorch runs in a process of its own (``--torch-worker``, driven through a pipe; each
step's time is taken inside it), which imports neither minidp nor anything minidp set:
as a PyTorch user runs it. In one process the two would share one OpenMP runtime (the
first loaded serves both), and minidp's setting of how its idle threads wait
(:data:`minidp.threads.IDLE_WAIT`) would be PyTorch's too.

The GEMM-bound limit: each model's FLOPs per step (2 per multiply-add of its
convolutions and linear layers, forward and both backward products, none for the input
gradient of the first layer; the Winograd layers counted as direct convolutions) over
the best rate of a large float32 GEMM (``np.matmul``, 2048 x 2048, best of 5) measured at
the same thread count in the same run. ``limit`` is that time; each framework's
fraction is limit / its step (1 would be a step that only multiplies, at peak rate).
Below the rate, the kernels the BLAS runs (:func:`minidp.kernels.blas.blas_info`): the rate is
theirs, and a variable that pins them narrower than the CPU (``OPENBLAS_CORETYPE``) is
named; PyTorch's convolutions do not go through that BLAS.

Beside each (unless ``--no-memory``), the peak resident set of one training step at one
thread, measured the same way for both: a fresh process per framework imports only that
framework (and NumPy), builds the model and the batch, runs one step and reports its
peak resident set (VmHWM) and its resident set before the step, so the step's own
share shows.

``--backend cupy``: both frameworks on the GPU (minidp's model on CuPy, PyTorch's on
CUDA), float32: the four steps above at the same batches, then LeNet-5 at batch 256 and
the CIFAR CNN at batch 128 (target: within 2x of PyTorch); each step ends by waiting for
the device, so the time is the GPU's.
"""

import argparse
import os
import statistics
import subprocess
import sys
import time

from thread_counts import thread_counts

TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


def torch_step(torch, name, batch, shape, device="cpu"):
    import numpy as np

    sys.path.insert(0, TESTS)
    import torch_models

    model = torch_models.build(name).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, *shape)).astype(np.float32)).to(device)
    y = torch.from_numpy(rng.integers(0, 10, batch)).to(device)

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        if device == "cuda":
            torch.cuda.synchronize()
    return step


def torch_worker():
    """``--torch-worker``: PyTorch's steps, one command a line on stdin, one answer each.

    ``import``: 1 if PyTorch imports, else 0. ``build NAME BATCH C H W DEVICE``: the
    step's number. ``threads T``: ``torch.set_num_threads(T)``. ``step K``: step K's
    time in seconds, taken here (not the pipe's).
    """
    answers, sys.stdout = sys.stdout, sys.stderr  # what PyTorch prints is not an answer
    torch, steps = None, []
    for line in sys.stdin:
        command, *words = line.split()
        if command == "import":
            try:
                import torch
                answer = 1
            except ImportError:
                answer = 0
        elif command == "build":
            shape = tuple(map(int, words[2:5]))
            steps.append(torch_step(torch, words[0], int(words[1]), shape, words[5]))
            answer = len(steps) - 1
        elif command == "threads":
            torch.set_num_threads(int(words[0]))
            answer = "ok"
        else:
            step = steps[int(words[0])]
            start = time.perf_counter()
            step()
            answer = time.perf_counter() - start
        print(answer, file=answers, flush=True)


if __name__ == "__main__" and sys.argv[1:] == ["--torch-worker"]:
    torch_worker()
    sys.exit(0)

# Numba sizes its thread pool when it is imported, from the count minidp chooses: the
# largest count measured must be chosen before minidp (and common.py) is imported.
THREADS = thread_counts(sys.argv[1:])
os.environ["MINIDP_NUM_THREADS"] = str(max(THREADS))

import common  # noqa: E402
import numpy as np  # noqa: E402

from minidp import Tensor, backend, layers, no_grad, threads  # noqa: E402
from minidp import functional as F  # noqa: E402
from minidp.autograd import ops  # noqa: E402
from minidp.kernels import blas, ensure_compiled  # noqa: E402
from minidp.optim import SGD  # noqa: E402

CASES = [("mlp", 128, (1, 28, 28)), ("lenet5", 64, (1, 28, 28)),
         ("cifar_cnn", 64, (3, 32, 32)), ("resnet20", 64, (3, 32, 32))]
# On the GPU, the CPU's four steps (the same shapes), then the two larger batches that the
# GPU target (within 2x of PyTorch CUDA) was set on.
GPU_CASES = [*CASES, ("lenet5", 256, (1, 28, 28)), ("cifar_cnn", 128, (3, 32, 32))]


def minidp_step(name, batch, shape, device="cpu"):
    xp = backend.device_module(device)
    model = layers.MODELS[name]().to(device)
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch)
    x, y = backend.to_module(x, xp), backend.to_module(y, xp)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        opt.step()
        if device == "cuda":
            xp.cuda.get_current_stream().synchronize()
    return step


class TorchProcess:
    """The client of :func:`torch_worker`: PyTorch's steps in a process of its own.

    Started with the environment minidp found (the thread variables minidp filled in,
    listed in ``MINIDP_THREAD_DEFAULTS``, left out), so PyTorch chooses as it would alone.
    """

    def __init__(self):
        self.proc = subprocess.Popen([sys.executable, os.path.abspath(__file__),
                                      "--torch-worker"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True,
                                     env=threads.user_environment())
        self.available = self.ask("import") == "1"

    def ask(self, *words):
        """Send one command, return the worker's answer (a line)."""
        self.proc.stdin.write(" ".join(map(str, words)) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            sys.exit(f"error: the PyTorch worker ended (exit status {self.proc.wait()}) "
                     f"on {' '.join(map(str, words))!r}")
        return answer.strip()

    def step(self, name, batch, shape, device):
        """A callable that runs one step there and returns its time in seconds."""
        number = self.ask("build", name, batch, *shape, device)
        return lambda: float(self.ask("step", number))

    def set_threads(self, count):
        """PyTorch's thread count there."""
        self.ask("threads", count)

    def close(self):
        """End the worker (end of its input)."""
        self.proc.stdin.close()
        self.proc.wait()


def interleaved_medians(steps, repeats=3, warmup=3, min_steps=15, min_seconds=4.0,
                        prepare=None, block=2):
    """Per repeat, each step's median time, the steps run in turn (warm-up runs first).

    ``prepare``: one callable per step (or None), called untimed before each turn of its
    steps (the thread count of the pair it measures). A turn is ``block`` steps, all
    timed but the first (the one step timed when ``block`` is 1). A step that returns a
    number is timed by it (PyTorch's, measured in its own process).
    """
    prepare = prepare or [None] * len(steps)

    def timed(i):
        t0 = time.perf_counter()
        own = steps[i]()  # a step in another process returns the time it took there
        return own if own is not None else time.perf_counter() - t0

    def run(i):
        """One turn of step i: its times (all but the first step's, unless block is 1)."""
        if prepare[i] is not None:
            prepare[i]()
        if block > 1:
            steps[i]()
        return [timed(i) for _ in range(max(1, block - 1))]

    for i in range(len(steps)):
        for _ in range(warmup):
            run(i)
    medians = []
    for _ in range(repeats):
        times = [[] for _ in steps]
        start = time.perf_counter()
        while len(times[0]) < min_steps or time.perf_counter() - start < min_seconds:
            for i in range(len(steps)):
                times[i] += run(i)
        medians.append([statistics.median(t) for t in times])
    return medians


def step_flops(name, batch, shape):
    """FLOPs of one training step of minidp's model ``name`` (see the module docstring)."""
    layers_seen = []
    conv2d, linear = ops.conv2d, ops.linear

    def counting_conv2d(x, w, b=None, stride=1, padding=0):
        out = conv2d(x, w, b, stride=stride, padding=padding)
        layers_seen.append(2 * out.data.size * int(np.prod(w.data.shape[1:])))
        return out

    def counting_linear(x, w, b=None):
        out = linear(x, w, b)
        layers_seen.append(2 * out.data.size * w.data.shape[1])
        return out

    ops.conv2d, ops.linear = counting_conv2d, counting_linear
    try:
        x = np.zeros((batch, *shape), dtype=np.float32)
        with no_grad():
            layers.MODELS[name]()(Tensor(x))
    finally:
        ops.conv2d, ops.linear = conv2d, linear
    return 3 * sum(layers_seen) - layers_seen[0]


def peak_gemm_gflops(count, n=2048, repeats=5):
    """The best rate of an n x n float32 matmul on ``count`` threads, GFLOP/s."""
    threads.limit_threads(count)
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(np.float32) for _ in range(2))
    out = np.empty_like(a)
    return 2 * n**3 / common.best_time(lambda: np.matmul(a, b, out=out), repeats=repeats,
                                        warmup=1) / 1e9


# One step in a fresh process that imports only its own framework (and NumPy for the
# batch): resident set before the step and the peak, both from /proc/self/status
# (VmRSS, VmHWM). Not ru_maxrss: Linux carries the parent's resident set across
# fork and exec into it, so every child would report at least the benchmark's own.
MEMORY_SCRIPT = """
import sys
import numpy as np
name, batch, shape = sys.argv[1], int(sys.argv[2]), tuple(map(int, sys.argv[3:6]))
rng = np.random.default_rng(0)
x, y = rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch)
if sys.argv[6] == "torch":
    import torch
    torch.set_num_threads(1)
    sys.path.insert(0, sys.argv[7])
    import torch_models
    model = torch_models.build(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = torch.from_numpy(x), torch.from_numpy(y)
    loss = lambda: torch.nn.functional.cross_entropy(model(x), y)
else:
    from minidp import Tensor, layers, functional as F
    from minidp.kernels import ensure_compiled
    from minidp.optim import SGD
    ensure_compiled()
    model = layers.MODELS[name]()
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    loss = lambda: F.cross_entropy(model(Tensor(x)), y)
def status(key):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) / 1024 for line in f if line.startswith(key))
before = status("VmRSS:")
opt.zero_grad()
loss().backward()
opt.step()
print(before, status("VmHWM:"))
"""


def peak_memory(framework, name, batch, shape):
    """(resident MB before the step, peak resident MB) of one step, in a fresh process."""
    out = subprocess.run([sys.executable, "-c", MEMORY_SCRIPT, name, str(batch),
                          *map(str, shape), framework, TESTS], check=True, capture_output=True,
                         text=True, env=dict(threads.user_environment(),
                                             MINIDP_NUM_THREADS="1", OMP_NUM_THREADS="1"))
    before, peak = out.stdout.split()[-2:]
    return float(before), float(peak)


def spread(values):
    """'median [min, max]' of ratios."""
    return f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("models", nargs="*", help="models to measure (default: all)")
    parser.add_argument("--threads", default="1",
                        help="thread counts to measure, comma-separated (1; the issue's: 1,2)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved repeats (3)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory")
    parser.add_argument("--backend", choices=["numpy", "cupy"], default="numpy")
    parser.add_argument("--no-torch", action="store_true",
                        help="minidp alone, no PyTorch process beside it")
    parser.add_argument("--block", type=int, default=2,
                        help="steps per turn of a pair, the first untimed (2; 1: every step "
                             "timed, one a turn)")
    args = parser.parse_args()
    if args.block < 1:
        parser.error(f"--block: got {args.block}, allowed: 1 or more steps")
    device = "cpu"
    if args.backend == "cupy":
        backend.set_backend("cupy")
        device, args.no_memory = "cuda", True
    cases = GPU_CASES if device == "cuda" else CASES
    chosen = args.models or [name for name, *_ in cases]
    pytorch = None if args.no_torch else TorchProcess()
    if pytorch is not None and not pytorch.available:
        pytorch.close()
        pytorch = None
        print("torch is not installed (make torch): minidp alone")
    ensure_compiled()  # the measured processes then load the kernels, never compile them
    counts = THREADS if device == "cpu" else [1]
    frameworks = ["minidp"] + (["torch"] if pytorch is not None else [])
    load = os.getloadavg()
    peaks = {t: peak_gemm_gflops(t) for t in counts} if device == "cpu" else {}
    rows, limit_rows, target_rows = [], [], []
    for name, batch, shape in (c for c in cases if c[0] in chosen):
        steps, prepare, keys = [], [], []
        for t in counts:
            steps.append(minidp_step(name, batch, shape, device))
            prepare.append(lambda t=t: threads.limit_threads(t))
            keys.append(("minidp", t))
            if pytorch is not None:
                steps.append(pytorch.step(name, batch, shape, device))
                prepare.append(lambda t=t: pytorch.set_threads(t))
                keys.append(("torch", t))
        medians = interleaved_medians(steps, args.repeats, prepare=prepare, block=args.block)
        time_of = {k: [m[i] for m in medians] for i, k in enumerate(keys)}
        ms = {k: statistics.median(v) * 1e3 for k, v in time_of.items()}
        row = [name, batch]
        for t in counts:
            row.append(f"{ms['minidp', t]:.2f}")
            if pytorch is not None:
                ratios = [m / p for m, p in zip(time_of["minidp", t], time_of["torch", t])]
                row += [f"{ms['torch', t]:.2f}", spread(ratios)]
        for fw in frameworks:
            for t in counts[1:]:
                row.append(spread([a / b for a, b in zip(time_of[fw, counts[0]],
                                                         time_of[fw, t])]))
        if not args.no_memory:
            for fw in frameworks:
                before, peak = peak_memory(fw, name, batch, shape)
                row.append(f"{before:.0f} / {peak:.0f}")
        rows.append(row)
        if device == "cpu":
            flops = step_flops(name, batch, shape)
            limit_row = [name, f"{flops / 1e9:.3f}"]
            for t in counts:
                limit_ms = flops / (peaks[t] * 1e9) * 1e3
                limit_row += [f"{limit_ms:.2f}"] + [f"{limit_ms / ms[fw, t]:.0%}"
                                                    for fw in frameworks]
            limit_rows.append(limit_row)
        if pytorch is not None and len(counts) > 1:
            one, many = counts[0], counts[-1]
            speedup = statistics.median(a / b for a, b in zip(time_of["minidp", one],
                                                              time_of["minidp", many]))
            versus = [statistics.median(m / p for m, p in zip(time_of["minidp", t],
                                                              time_of["torch", t]))
                      for t in (one, many)]
            target_rows.append([name, f"{speedup:.2f}x", "yes" if speedup >= 1.6 else "NO",
                                f"{versus[1]:.2f}x", "yes" if versus[1] <= 1.0 else "NO",
                                f"{versus[0]:.2f}x", "yes" if versus[0] <= 1.0 else "NO"])
    headers = ["model", "batch"]
    for t in counts:
        headers.append(f"minidp {t}t ms")
        if pytorch is not None:
            headers += [f"pytorch {t}t ms", f"minidp/pytorch {t}t [min, max]"]
    for fw in frameworks:
        headers += [f"{fw} {t}t speed-up [min, max]" for t in counts[1:]]
    if not args.no_memory:
        headers += [f"{fw} MB before / peak (1 thread)" for fw in frameworks]
    print(f"median step over {args.repeats} interleaved repeats (each the median of its "
          f"steps); load average {load[0]:.2f} before, {os.getloadavg()[0]:.2f} after; "
          f"{os.cpu_count()} cores\n")
    common.print_table(headers, rows)
    if limit_rows:
        print("\nGEMM-bound limit: peak float32 GEMM rate "
              + ", ".join(f"{peaks[t]:.0f} GFLOP/s at {t} thread(s)" for t in counts))
        # the rate is that of the kernels the BLAS runs, which a variable may have pinned
        for lib in blas.blas_info():
            pinned = f" ({lib['pinned_by']})" if lib["pinned_by"] else ""
            note = f": {lib['note']}" if "note" in lib else ""
            print(f"BLAS: {lib['library']} {lib['version']}, {lib['kernels']} kernels"
                  f"{pinned}{note}")
        print()
        limit_headers = ["model", "GFLOP/step"]
        for t in counts:
            limit_headers += [f"limit {t}t ms"] + [f"{fw} {t}t fraction" for fw in frameworks]
        common.print_table(limit_headers, limit_rows)
    if target_rows:
        one, many = counts[0], counts[-1]
        print(f"\nTargets: at {many} threads minidp's step at least 1.6x its {one}-thread step "
              f"and at most 1.0x PyTorch's; at {one} thread at most 1.0x PyTorch's (medians)\n")
        common.print_table(["model", f"minidp {many}t speed-up", ">= 1.6x",
                            f"minidp/pytorch {many}t", "<= 1.0x", f"minidp/pytorch {one}t",
                            "<= 1.0x"], target_rows)
    if pytorch is not None:
        pytorch.close()


if __name__ == "__main__":
    main()
