"""What ``simulate`` measures on this machine: one training step on one core, one memory sweep.

Both are timed in this process (median of several runs, after warm-up), nothing is
cached: every call measures again, so the numbers follow what this machine does now.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from minidp.layers import Module

# Sample shape and training-set size of each data set, as `data prepare` writes them.
DATASETS = {"fashion-mnist": ((1, 28, 28), 60000), "mnist": ((1, 28, 28), 60000),
            "mnist-5k": ((1, 28, 28), 4000), "cifar10": ((3, 32, 32), 50000),
            "synthetic": ((1, 28, 28), 10000)}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """BLAS and Numba on one thread inside, as a rank with one core has them."""
    import numba
    from threadpoolctl import threadpool_limits

    previous = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        with threadpool_limits(limits=1):
            yield
    finally:
        numba.set_num_threads(previous)


def build_model(name: str, dataset: str, dtype: str) -> Module:
    """The model ``train`` builds for this data set, in ``dtype``."""
    from minidp import layers

    return layers.model_for(name, DATASETS[dataset][0], 10).to(np.dtype(dtype))


def _median_seconds(fn: Callable[[], object], runs: int, warmup: int = 3) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def measure_step(model: Module, dataset: str, batch: int, steps: int) -> float:
    """Median seconds of one training step on one thread: normalise, forward, backward, SGD."""
    from minidp import Tensor
    from minidp import functional as F
    from minidp.io.datasets import NORMALIZATION, normalize
    from minidp.kernels import ensure_compiled
    from minidp.optim import SGD

    ensure_compiled()
    optimizer = SGD(model.parameters(), lr=0.01, momentum=0.9)
    rng = np.random.default_rng(0)
    raw = rng.integers(0, 256, (batch, *DATASETS[dataset][0]), dtype=np.uint8)
    labels = rng.integers(0, 10, batch)
    dtype = model.flat_parameters().data.dtype
    mean, std = NORMALIZATION[dataset]

    def step() -> None:
        x = normalize(raw, mean, std).astype(dtype, copy=False)
        optimizer.zero_grad()
        F.cross_entropy(model(Tensor(x)), labels).backward()
        optimizer.step()
    with one_thread():
        return _median_seconds(step, steps)


def measure_sweep(nbytes: int) -> float:
    """Seconds per byte of ``a += b`` over a buffer of ``nbytes`` (median of 20)."""
    a = np.ones(max(1, nbytes // 4), np.float32)
    b = np.ones_like(a)
    return _median_seconds(lambda: np.add(a, b, out=a), 20) / a.nbytes


def node_cores(nodes: int, cores_per_node: float | None) -> list[list[int]]:
    """This machine's cores for each virtual node: C each, C = all cores // P by default.

    Raises ValueError unless C is a whole number and P x C cores are there.
    """
    from minidp.threads import available_cores

    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else \
        list(range(available_cores()))
    if cores_per_node is None and nodes > len(cores):
        raise ValueError(f"--nodes: got {nodes} with --validate, allowed: at most "
                         f"{len(cores)} (a core or more for each virtual node; this process "
                         f"may use {len(cores)})")
    per_node = len(cores) // nodes if cores_per_node is None else cores_per_node
    if per_node != int(per_node) or nodes * per_node > len(cores):
        raise ValueError(f"--cores-per-node: got {per_node:g} for {nodes} virtual nodes with "
                         f"--validate, allowed: a whole number >= 1 with P x C <= "
                         f"{len(cores)} (the cores this process may use)")
    c = int(per_node)
    return [cores[p * c:(p + 1) * c] for p in range(nodes)]
