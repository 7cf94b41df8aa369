"""conv2d forward+backward: the Numba im2col/col2im path against the plain NumPy path.

    .venv/bin/python benchmarks/bench_ops.py

Same minidp ``conv2d``, same BLAS GEMMs, one thread, float32, batch 64; only the
unfolding differs: Numba kernels against the NumPy references (strided-view copy
for im2col, one strided add per kernel tap for col2im). Shapes are LeNet-5's two
convolutions and ``cifar_cnn``'s three. Prints the ratio measured in this run.
"""

import common  # noqa: F401 - sets one thread before minidp loads BLAS
import numpy as np

from minidp import Tensor
from minidp import functional as F
from minidp.kernels.jit import ensure_compiled, references_only

# (name, input shape, weight shape, padding)
SHAPES = [
    ("lenet5 conv1", (64, 1, 28, 28), (6, 1, 5, 5), 2),
    ("lenet5 conv2", (64, 6, 14, 14), (16, 6, 5, 5), 0),
    ("cifar_cnn conv1", (64, 3, 32, 32), (32, 3, 3, 3), 1),
    ("cifar_cnn conv2", (64, 32, 16, 16), (64, 32, 3, 3), 1),
    ("cifar_cnn conv3", (64, 64, 8, 8), (128, 64, 3, 3), 1),
]


def conv_step(x, w, b, padding):
    def run():
        w.grad = b.grad = x.grad = None
        out = F.conv2d(x, w, b, padding=padding)
        out.backward(np.ones(out.shape, dtype=np.float32))
    return run


def main():
    ensure_compiled()
    rng = np.random.default_rng(0)
    rows = []
    for name, xs, ws, pad in SHAPES:
        x = Tensor(rng.standard_normal(xs).astype(np.float32), requires_grad=True)
        w = Tensor(rng.standard_normal(ws).astype(np.float32), requires_grad=True)
        b = Tensor(np.zeros(ws[0], np.float32), requires_grad=True)
        step = conv_step(x, w, b, pad)
        numba_s = common.best_time(step)
        with references_only():
            numpy_s = common.best_time(step)
        rows.append([name, f"{xs} * {ws}", f"{numba_s * 1e3:.2f}", f"{numpy_s * 1e3:.2f}",
                     f"{numpy_s / numba_s:.2f}x"])
    common.print_table(["layer", "input * weight", "numba ms", "numpy ms", "speed-up"], rows)


if __name__ == "__main__":
    main()
