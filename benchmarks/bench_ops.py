"""conv2d and batch norm forward+backward: minidp's kernels, its NumPy path, and PyTorch.

    .venv/bin/python benchmarks/bench_ops.py [NAME-PREFIX ...]

One thread, float32, batch 64, measured in one run. For each layer shape of LeNet-5,
the CIFAR CNN and ResNet-20: minidp with its Numba kernels (each convolution by the
engine :class:`minidp.autograd.ops.conv.Conv2d` picks for it: Winograd, row taps or chunked
im2col; the fused batch norm), the same minidp ops on the plain NumPy references
(what CuPy and ``NUMBA_DISABLE_JIT=1`` run), and PyTorch's op when torch is
installed. Prints the best time of each and the ratios minidp/PyTorch and
NumPy/minidp. Name prefixes (``resnet20``) select rows.
"""

import sys

import common  # noqa: F401 - sets one thread before minidp loads BLAS
import numpy as np

from minidp import Tensor
from minidp.autograd import ops
from minidp.kernels.jit import ensure_compiled, references_only

# (name, input shape, weight shape, stride, padding); a 1-D weight shape is a batch norm
# (followed by relu, with the residual add when marked "+res").
SHAPES = [
    ("lenet5 conv1", (64, 1, 28, 28), (6, 1, 5, 5), 1, 2),
    ("lenet5 conv2", (64, 6, 14, 14), (16, 6, 5, 5), 1, 0),
    ("cifar_cnn conv1", (64, 3, 32, 32), (32, 3, 3, 3), 1, 1),
    ("cifar_cnn conv2", (64, 32, 16, 16), (64, 32, 3, 3), 1, 1),
    ("cifar_cnn conv3", (64, 64, 8, 8), (128, 64, 3, 3), 1, 1),
    ("resnet20 conv1", (64, 3, 32, 32), (16, 3, 3, 3), 1, 1),
    ("resnet20 layer1", (64, 16, 32, 32), (16, 16, 3, 3), 1, 1),
    ("resnet20 layer2.0", (64, 16, 32, 32), (32, 16, 3, 3), 2, 1),
    ("resnet20 layer2.0 down", (64, 16, 32, 32), (32, 16, 1, 1), 2, 0),
    ("resnet20 layer2", (64, 32, 16, 16), (32, 32, 3, 3), 1, 1),
    ("resnet20 layer3", (64, 64, 8, 8), (64, 64, 3, 3), 1, 1),
    ("resnet20 bn+relu", (64, 16, 32, 32), (16,), 0, 0),
    ("resnet20 bn+res+relu", (64, 16, 32, 32), (16,), 1, 0),
]


def minidp_op(xs, ws, stride, padding, rng):
    """forward+backward of the op, the input gradient included (as inside a network)."""
    x = Tensor(rng.standard_normal(xs).astype(np.float32), requires_grad=xs[1] != 3)
    w = Tensor(rng.standard_normal(ws).astype(np.float32), requires_grad=True)
    if len(ws) == 1:
        b = Tensor(np.zeros(ws, np.float32), requires_grad=True)
        res = Tensor(rng.standard_normal(xs).astype(np.float32), requires_grad=True)
        stats = np.zeros(ws, np.float32), np.ones(ws, np.float32)

        def forward():
            return ops.batch_norm_relu(x, *stats, w, b, res if stride else None)
    else:
        def forward():
            return ops.conv2d(x, w, stride=stride, padding=padding)
    g = None

    def run():
        nonlocal g
        x.grad = w.grad = None
        out = forward()
        g = np.ones(out.shape, np.float32) if g is None else g
        out.backward(g)
    return run


def torch_op(torch, xs, ws, stride, padding, rng):
    x = torch.from_numpy(rng.standard_normal(xs).astype(np.float32)).requires_grad_(xs[1] != 3)
    if len(ws) == 1:
        bn = torch.nn.BatchNorm2d(ws[0])
        res = torch.from_numpy(rng.standard_normal(xs).astype(np.float32)).requires_grad_(True)

        def forward():
            out = bn(x)
            return torch.relu(out + res if stride else out)
    else:
        conv = torch.nn.Conv2d(xs[1], ws[0], ws[2], stride, padding, bias=False)

        def forward():
            return conv(x)
    g = None

    def run():
        nonlocal g
        x.grad = None
        out = forward()
        g = torch.ones(out.shape) if g is None else g
        out.backward(g)
    return run


def main():
    ensure_compiled()
    try:
        import torch
        torch.set_num_threads(1)
    except ImportError:
        torch = None
        print("torch is not installed (make torch): no PyTorch column")
    rng = np.random.default_rng(0)
    rows = []
    for name, xs, ws, stride, pad in SHAPES:
        if sys.argv[1:] and not any(name.startswith(p) for p in sys.argv[1:]):
            continue
        step = minidp_op(xs, ws, stride, pad, rng)
        ours = common.best_time(step)
        with references_only():
            numpy_s = common.best_time(step, repeats=5)
        row = [name, f"{xs} * {ws}", f"{ours * 1e3:.2f}", f"{numpy_s * 1e3:.2f}"]
        if torch is not None:
            theirs = common.best_time(torch_op(torch, xs, ws, stride, pad, rng))
            row += [f"{theirs * 1e3:.2f}", f"{ours / theirs:.2f}x"]
        rows.append(row + [f"{numpy_s / ours:.2f}x"])
    headers = ["op", "input * weight", "minidp ms", "numpy ms"]
    if torch is not None:
        headers += ["pytorch ms", "minidp/pytorch"]
    common.print_table(headers + ["numpy/minidp"], rows)


if __name__ == "__main__":
    main()
