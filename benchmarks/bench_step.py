"""One training step (forward, backward, SGD with momentum): minidp against PyTorch.

    .venv/bin/python benchmarks/bench_step.py        (make torch first for the comparison)

One thread each, float32, measured in the same run: mlp at batch 128, lenet5 and
cifar_cnn at batch 64. Prints the best step time of each and the ratio
minidp / PyTorch (targets: 1.25x for mlp, 1.5x for the CNNs).
"""

import os
import sys

import common
import numpy as np

from minidp import Tensor, layers
from minidp import functional as F
from minidp.kernels import ensure_compiled
from minidp.optim import SGD

CASES = [("mlp", 128, (1, 28, 28), 1.25), ("lenet5", 64, (1, 28, 28), 1.5),
         ("cifar_cnn", 64, (3, 32, 32), 1.5)]


def minidp_step(name, batch, shape):
    model = layers.MODELS[name]()
    opt = SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal((batch, *shape)).astype(np.float32), rng.integers(0, 10, batch)

    def step():
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        opt.step()
    return step


def torch_step(torch, name, batch, shape):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests"))
    import torch_models

    model = torch_models.build(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    x = torch.from_numpy(rng.standard_normal((batch, *shape)).astype(np.float32))
    y = torch.from_numpy(rng.integers(0, 10, batch))

    def step():
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def main():
    ensure_compiled()
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
        print("torch is not installed (make torch): timing minidp alone")
    rows = []
    for name, batch, shape, target in CASES:
        ours = common.best_time(minidp_step(name, batch, shape), repeats=30, min_seconds=2)
        row = [name, batch, f"{ours * 1e3:.2f}"]
        if torch is not None:
            theirs = common.best_time(torch_step(torch, name, batch, shape), repeats=30,
                                      min_seconds=2)
            row += [f"{theirs * 1e3:.2f}", f"{ours / theirs:.2f}x", f"{target}x"]
        rows.append(row)
    headers = ["model", "batch", "minidp ms"]
    if torch is not None:
        headers += ["pytorch ms", "minidp/pytorch", "target"]
    common.print_table(headers, rows)


if __name__ == "__main__":
    main()
