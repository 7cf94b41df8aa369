"""One training step (forward, backward, SGD with momentum): minidp against PyTorch.

    .venv/bin/python benchmarks/bench_step.py [MODEL ...]     (make torch first)
    .venv/bin/python benchmarks/bench_step.py --memory [MODEL ...]
    python benchmarks/bench_step.py --backend cupy [MODEL ...]   (a GPU; PyTorch CUDA)

One thread each, float32, measured in the same run: mlp at batch 128, lenet5,
cifar_cnn and resnet20 at batch 64. The two frameworks' steps alternate, so that a
machine shared with other jobs slows both alike; the table gives the best step
time of each and the ratio minidp / PyTorch (targets: 1.25x for mlp, 1.5x for the
small CNNs, 1.0x for ResNet-20).

``--memory``: the peak resident set of one training step, measured the same way for
both: a fresh process per framework imports only that framework (and NumPy), builds
the model and the batch, runs one step and reports its peak resident set (VmHWM); the
table also gives the resident set before the step, so the step's own share shows.

``--backend cupy``: both frameworks on the GPU (minidp's model on CuPy, PyTorch's on
CUDA), float32, LeNet-5 at batch 256 and the CIFAR CNN at batch 128 (target: within
2x of PyTorch); each step ends by waiting for the device, so the time is the GPU's.
"""

import os
import subprocess
import sys
import time

import common
import numpy as np

from minidp import Tensor, backend, layers
from minidp import functional as F
from minidp.kernels import ensure_compiled
from minidp.optim import SGD

CASES = [("mlp", 128, (1, 28, 28), 1.25), ("lenet5", 64, (1, 28, 28), 1.5),
         ("cifar_cnn", 64, (3, 32, 32), 1.5), ("resnet20", 64, (3, 32, 32), 1.0)]
GPU_CASES = [("lenet5", 256, (1, 28, 28), 2.0), ("cifar_cnn", 128, (3, 32, 32), 2.0)]
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


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


def torch_step(torch, name, batch, shape, device="cpu"):
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


def best_times(steps, repeats=15, warmup=3, min_seconds=4.0):
    """Best wall time of each step, running them in turn (warm-up runs first)."""
    for step in steps:
        for _ in range(warmup):
            step()
    best = [float("inf")] * len(steps)
    start, runs = time.perf_counter(), 0
    while runs < repeats or time.perf_counter() - start < min_seconds:
        for i, step in enumerate(steps):
            t0 = time.perf_counter()
            step()
            best[i] = min(best[i], time.perf_counter() - t0)
        runs += 1
    return best


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
                         text=True, env=dict(os.environ, MINIDP_NUM_THREADS="1",
                                             OMP_NUM_THREADS="1"))
    before, peak = out.stdout.split()[-2:]
    return float(before), float(peak)


def main():
    args = sys.argv[1:]
    memory = "--memory" in args
    device = "cpu"
    if "--backend" in args:
        at = args.index("--backend")
        if args[at + 1:at + 2] != ["cupy"] or memory:
            raise SystemExit("--backend: allowed: cupy (without --memory)")
        backend.set_backend("cupy")
        device, args = "cuda", args[:at] + args[at + 2:]
    cases = GPU_CASES if device == "cuda" else CASES
    chosen = [a for a in args if a != "--memory"] or [name for name, *_ in cases]
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
        print("torch is not installed (make torch): minidp alone")
    ensure_compiled()  # the measured processes then load the kernels, never compile them
    rows = []
    for name, batch, shape, target in (c for c in cases if c[0] in chosen):
        frameworks = ["minidp"] + (["torch"] if torch is not None else [])
        if memory:
            row = [name, batch]
            for fw in frameworks:
                before, peak = peak_memory(fw, name, batch, shape)
                row += [f"{before:.0f}", f"{peak:.0f}"]
            rows.append(row)
            continue
        steps = [minidp_step(name, batch, shape, device)]
        if torch is not None:
            steps.append(torch_step(torch, name, batch, shape, device))
        times = best_times(steps)
        row = [name, batch, f"{times[0] * 1e3:.2f}"]
        if torch is not None:
            row += [f"{times[1] * 1e3:.2f}", f"{times[0] / times[1]:.2f}x", f"{target}x"]
        rows.append(row)
    if memory:
        headers = ["model", "batch", "minidp MB before", "minidp MB peak"]
        if torch is not None:
            headers += ["pytorch MB before", "pytorch MB peak"]
    else:
        headers = ["model", "batch", "minidp ms"]
        if torch is not None:
            headers += ["pytorch ms", "minidp/pytorch", "target"]
    common.print_table(headers, rows)


if __name__ == "__main__":
    main()
