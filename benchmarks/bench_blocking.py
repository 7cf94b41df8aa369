r"""A blocking DASO batch against a ``sync --allreduce hierarchical`` step, interleaved.

    .venv/bin/mpiexec -n 4 .venv/bin/python -m mpi4py benchmarks/bench_blocking.py \
        [--model mlp] [--steps 300] [--net-latency-us 50] [--net-bandwidth-gbps 1]

Four ranks as 2 nodes x 2 (``--ranks-per-node``), one thread each, the network model of
the README's headline. Both strategies are built in one job on the same model (float32,
SGD lr 0.05, momentum 0.9); every step hands both the same fixed gradients (a rank's
own) and runs ``strategy.step``, DASO in a blocking epoch (B = S = L = 0: node sync,
update, parameter average over the nodes, every batch), the two alternating step by
step after a world barrier, so that a machine shared with other jobs slows both alike.
Forward and backward are left out: they are the same for both.

Prints per strategy the median step time (the slowest rank's median; p25-p75 of that
rank beside it) and the CPU time per step averaged over the ranks (``process_time``:
what the step computes and polls, nearly independent of the machine's load), and
DASO's ratio to sync for both. The first ``--warmup`` steps are not counted.
"""

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402
import numpy as np  # noqa: E402
from mpi4py import MPI  # noqa: E402

from minidp import layers, strategies  # noqa: E402
from minidp.comm import NetworkModel, Topology, set_network_model  # noqa: E402
from minidp.kernels import ensure_compiled  # noqa: E402
from minidp.optim import SGD  # noqa: E402


def build(name, model, topology, **options):
    layers.manual_seed(0)
    net = layers.MODELS[model]()
    strategy = strategies.get(name, net, SGD(net.parameters(), lr=0.05, momentum=0.9),
                              topology, **options)
    strategy.begin_epoch(0, 1 << 30)
    return strategy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="mlp", choices=sorted(layers.MODELS))
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--warmup", type=int, default=10)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--net-latency-us", type=float, default=50.0)
    parser.add_argument("--net-bandwidth-gbps", type=float, default=1.0)
    args = parser.parse_args()
    world = MPI.COMM_WORLD
    ensure_compiled()
    set_network_model(NetworkModel(args.net_latency_us, args.net_bandwidth_gbps))
    topology = Topology(ranks_per_node=args.ranks_per_node)
    runs = {"sync": build("sync", args.model, topology, allreduce="hierarchical"),
            "daso": build("daso", args.model, topology)}  # its first epoch: (0, 0, 0)
    grad = np.random.default_rng(world.rank).standard_normal(
        runs["sync"].flat.size).astype(np.float32) * 1e-3
    wall = {name: [] for name in runs}
    cpu = dict.fromkeys(runs, 0.0)
    for i in range(args.warmup + args.steps):
        order = list(runs) if i % 2 else list(runs)[::-1]
        for name in order:
            strategy = runs[name]
            strategy.flat.grad[...] = grad
            world.Barrier()
            c0, t0 = time.process_time(), time.perf_counter()
            strategy.step(i)
            if i >= args.warmup:
                wall[name].append(time.perf_counter() - t0)
                cpu[name] += time.process_time() - c0
    gathered = world.gather((wall, cpu), root=0)
    if world.rank != 0:
        return
    rows, medians, cpus = [], {}, {}
    for name in runs:
        per_rank = [np.array(w[name]) * 1e3 for w, _ in gathered]
        slowest = max(per_rank, key=np.median)
        medians[name] = float(np.median(slowest))
        cpus[name] = float(np.mean([c[name] for _, c in gathered])) * 1e3 / args.steps
        rows.append([name, f"{medians[name]:.2f}",
                     f"{np.percentile(slowest, 25):.2f}-{np.percentile(slowest, 75):.2f}",
                     f"{cpus[name]:.2f}"])
    print(f"{args.model}, {world.size} ranks as {world.size // args.ranks_per_node} x "
          f"{args.ranks_per_node}, {args.steps} steps each, network model "
          f"{args.net_latency_us:g} us, {args.net_bandwidth_gbps:g} Gbit/s\n")
    common.print_table(["step", "median ms", "p25-p75 ms", "cpu ms / step"], rows)
    print(f"\nblocking DASO / sync: {medians['daso'] / medians['sync']:.2f}x time, "
          f"{cpus['daso'] / cpus['sync']:.2f}x cpu")


if __name__ == "__main__":
    main()
