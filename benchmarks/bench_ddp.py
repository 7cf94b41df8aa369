r"""Two-rank data parallelism: minidp's ``sync`` against PyTorch DDP (gloo, CPU), in one job.

    make torch
    .venv/bin/mpiexec -n 2 .venv/bin/python -m mpi4py benchmarks/bench_ddp.py \
        [--models mlp lenet5 cifar_cnn] [--repeats 5] [--steps 20] [--allreduce hierarchical]

Every rank runs both frameworks on the same synthetic batch (64 samples per rank, its
own, fixed), one thread each, float32, SGD lr 0.01 momentum 0.9: minidp's model under
``sync`` (``--allreduce``: hierarchical, the gradient buffer being the rank's segment
of the node's shared window, by default) and PyTorch's twin (``tests/torch_models.py``)
wrapped in
``DistributedDataParallel`` over a gloo process group (its default 25 MB buckets,
reduced during backward on gloo's threads). They alternate in blocks of ``--steps``
steps, each block after a barrier, ``--repeats`` times, so that a machine shared with
other jobs slows both alike. Prints per model each framework's steps per second (the
median over the repeats, a block's steps over its time on the slowest rank) and the
ratio minidp / DDP as median and [min, max] of the repeats.
"""

import argparse
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from minidp import Tensor, layers, strategies  # noqa: E402
from minidp import functional as F  # noqa: E402
from minidp.comm import ALLREDUCE_ALGORITHMS, Topology  # noqa: E402
from minidp.kernels import ensure_compiled  # noqa: E402
from minidp.optim import SGD  # noqa: E402

SHAPES = {"mlp": (1, 28, 28), "lenet5": (1, 28, 28), "cifar_cnn": (3, 32, 32),
          "resnet20": (3, 32, 32)}
TESTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests")


def batch(name: str, size: int, rank: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng([11, rank])
    return (rng.standard_normal((size, *SHAPES[name])).astype(np.float32),
            rng.integers(0, 10, size))


def minidp_step(name: str, size: int, topology: Topology, options: dict):
    layers.manual_seed(0)
    model = layers.MODELS[name]()
    strategy = strategies.get("sync", model, SGD(model.parameters(), lr=0.01, momentum=0.9),
                              topology, **options)
    strategy.begin_epoch(0, 1 << 30)
    x, y = batch(name, size, topology.rank)

    def step(i: int) -> None:
        strategy.optimizer.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        strategy.step(i)
    return step


def ddp_step(torch, name: str, size: int, rank: int):
    sys.path.insert(0, TESTS)
    import torch_models

    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch_models.build(name))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x, y = (torch.from_numpy(a) for a in batch(name, size, rank))

    def step(i: int) -> None:
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    return step


def steps_per_second(step, steps: int, world: MPI.Comm) -> float:
    """A block of ``steps`` steps after a barrier: steps over the slowest rank's time."""
    world.Barrier()
    start = time.perf_counter()
    for i in range(steps):
        step(i)
    return steps / world.allreduce(time.perf_counter() - start, op=MPI.MAX)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "lenet5", "cifar_cnn"],
                        choices=sorted(SHAPES))
    parser.add_argument("--batch-size", type=int, default=64, help="per rank (64)")
    parser.add_argument("--steps", type=int, default=20, help="steps per block (20)")
    parser.add_argument("--repeats", type=int, default=5, help="blocks of each (5)")
    parser.add_argument("--allreduce", default="hierarchical", choices=ALLREDUCE_ALGORITHMS)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    try:
        import torch
        import torch.distributed as dist
    except ImportError:
        if world.rank == 0:
            print("bench_ddp.py compares with PyTorch DDP: install PyTorch first (make torch, "
                  "the CPU build)", file=sys.stderr)
        sys.exit(2)

    torch.set_num_threads(1)
    store = world.bcast(tempfile.mkstemp(prefix="bench_ddp_")[1] if world.rank == 0 else None)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=world.rank,
                            world_size=world.size)
    ensure_compiled()
    topology = Topology()
    rows = []
    for name in args.models:
        steps = {"minidp": minidp_step(name, args.batch_size, topology,
                                       {"allreduce": args.allreduce}),
                 "ddp": ddp_step(torch, name, args.batch_size, world.rank)}
        for step in steps.values():  # warm-up: kernels, buffers, gloo's connections
            for i in range(3):
                step(i)
        rates = {k: [] for k in steps}
        for r in range(args.repeats):
            for k in (list(steps) if r % 2 == 0 else list(steps)[::-1]):
                rates[k].append(steps_per_second(steps[k], args.steps, world))
        ratios = [m / d for m, d in zip(rates["minidp"], rates["ddp"])]
        rows.append([name, f"{statistics.median(rates['minidp']):.1f}",
                     f"{statistics.median(rates['ddp']):.1f}",
                     f"{statistics.median(ratios):.2f}x [{min(ratios):.2f}, {max(ratios):.2f}]"])
    if world.rank == 0:
        print(f"{world.size} ranks, batch {args.batch_size} per rank, one thread each; minidp "
              f"sync --allreduce {args.allreduce}; {args.repeats} interleaved blocks of "
              f"{args.steps} steps\n")
        common.print_table(["model", "minidp steps/s", "DDP steps/s",
                            "minidp / DDP [min, max]"], rows)
    dist.destroy_process_group()
    topology.free()
    world.Barrier()
    if world.rank == 0:
        os.remove(store)


if __name__ == "__main__":
    main()
