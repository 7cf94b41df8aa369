r"""Hybrid layouts on one node: the same global batch as R ranks x T threads, minidp and PyTorch.

    make torch
    .venv/bin/python benchmarks/bench_layouts.py [--models lenet5 cifar_cnn resnet20] \
        [--batch 128] [--cores 2] [--repeats 3]

A node of C cores (``--cores``, default: the cores this process may use) can run one rank
per core, one rank with C threads, or anything between: every layout R x T with R*T = C
(2 cores: 2 x 1 and 1 x 2) trains the same global batch (``--batch``, 128: B/R samples per
rank) of synthetic CIFAR- or MNIST-shaped data, float32, SGD lr 0.01 momentum 0.9:

* minidp ``sync`` (the hierarchical allreduce through the node's shared window), and
  ``hsgd`` where it applies (more than one rank: its first level is the node);
* PyTorch: ``DistributedDataParallel`` (gloo) on R ranks of T threads each, or, on one
  rank, the plain model on C threads.

Each layout is one job (``mpiexec -n R ... bench_layouts.py --worker``, with
``MINIDP_NUM_THREADS=T`` and ``torch.set_num_threads(T)``). In a job, every framework runs
``--blocks`` blocks of ``--steps`` steps in turn, each block after a barrier and timed on
the slowest rank; the job reports each framework's median samples per second. The
layouts' jobs run one after another, in a rotated order, ``--repeats`` times. The table
gives the median over the repeats, and each layout's speed against the best minidp
layout as the median [min, max] of the repeats' ratios; then which layout to choose.
"""

import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPES = {"mlp": (1, 28, 28), "lenet5": (1, 28, 28), "cifar_cnn": (3, 32, 32),
          "resnet20": (3, 32, 32)}
RESULT = "RESULT "


def layouts(cores: int) -> list[tuple[int, int]]:
    """Every (ranks, threads) with ranks * threads == cores, one rank per core first."""
    return [(cores // t, t) for t in range(1, cores + 1) if cores % t == 0]


# --- the worker: one layout, every model, under mpiexec -------------------------------

def worker(args: argparse.Namespace) -> None:
    """Measure every framework of one layout; rank 0 prints one RESULT line of JSON."""
    # minidp first: it exports the thread variables (MINIDP_NUM_THREADS=T) that BLAS reads
    # when NumPy loads it
    import minidp  # noqa: F401, I001
    import numpy as np
    import torch
    from mpi4py import MPI

    from minidp import Tensor, layers, strategies
    from minidp import functional as F
    from minidp.comm import Topology
    from minidp.kernels import ensure_compiled
    from minidp.optim import SGD

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import torch_models

    world = MPI.COMM_WORLD
    ranks, per_rank = world.size, args.batch // world.size
    torch.set_num_threads(args.threads)
    if ranks > 1:
        import torch.distributed as dist

        store = world.bcast(f"{args.store}.{os.getpid()}" if world.rank == 0 else None)
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=world.rank,
                                world_size=ranks)
    ensure_compiled()
    topology = Topology()

    def data(name):
        rng = np.random.default_rng([11, world.rank])
        return (rng.standard_normal((per_rank, *SHAPES[name])).astype(np.float32),
                rng.integers(0, 10, per_rank))

    def minidp_step(name, strategy_name):
        layers.manual_seed(0)
        model = layers.MODELS[name]()
        strategy = strategies.get(strategy_name, model,
                                  SGD(model.parameters(), lr=0.01, momentum=0.9), topology)
        strategy.begin_epoch(0, 1 << 30)
        x, y = data(name)

        def step(i):
            strategy.optimizer.zero_grad()
            F.cross_entropy(model(Tensor(x)), y).backward()
            strategy.step(i)
        return step

    def torch_step(name):
        torch.manual_seed(0)
        model = torch_models.build(name)
        if ranks > 1:
            model = torch.nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        x, y = (torch.from_numpy(a) for a in data(name))

        def step(i):
            opt.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
        return step

    def samples_per_second(step):
        world.Barrier()
        start = time.perf_counter()
        for i in range(args.steps):
            step(i)
        elapsed = world.allreduce(time.perf_counter() - start, op=MPI.MAX)
        return args.steps * per_rank * ranks / elapsed

    results = {}
    for name in args.models:
        steps = {"minidp sync": minidp_step(name, "sync")}
        if ranks > 1:
            steps["minidp hsgd"] = minidp_step(name, "hsgd")
        steps["pytorch"] = torch_step(name)
        for step in steps.values():  # warm-up: kernels, buffers, gloo's connections
            for i in range(3):
                step(i)
        rates = {k: [] for k in steps}
        order = list(steps)
        for b in range(args.blocks):
            for k in order[b % len(order):] + order[:b % len(order)]:
                rates[k].append(samples_per_second(steps[k]))
        results[name] = {k: statistics.median(v) for k, v in rates.items()}
    if world.rank == 0:
        print(RESULT + json.dumps(results), flush=True)
    if ranks > 1:
        dist.destroy_process_group()
        world.Barrier()
        if world.rank == 0:
            os.remove(store)
    topology.free()


# --- the driver: every layout, repeated, in rotated order -------------------------------

def run_layout(ranks: int, threads: int, args: argparse.Namespace) -> dict | None:
    """One layout's job; its results, or None (the failure printed)."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from common import mpiexec, run_job

    env = {k: v for k, v in os.environ.items() if k != "MINIDP_NUM_THREADS"}
    env["MINIDP_NUM_THREADS"] = str(threads)
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py",
           os.path.abspath(__file__), "--worker", "--threads", str(threads), "--batch",
           str(args.batch), "--steps", str(args.steps), "--blocks", str(args.blocks),
           "--store", args.store, "--models", *args.models]
    status, output = run_job(cmd, args.timeout, env=env, cwd=ROOT)
    lines = [line for line in output.splitlines() if line.startswith(RESULT)]
    if status != 0 or not lines:
        tail = "\n".join(output.strip().splitlines()[-6:])
        print(f"  {ranks} x {threads} failed (exit {status}):\n{tail}", file=sys.stderr)
        return None
    return json.loads(lines[-1][len(RESULT):])


def spread(values: list[float]) -> str:
    """'median [min, max]' of ratios."""
    return f"{statistics.median(values):.2f}x [{min(values):.2f}, {max(values):.2f}]"


def driver(args: argparse.Namespace) -> None:
    """Run every layout ``--repeats`` times, then print the table and the recommendation."""
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import common

    shapes = layouts(args.cores)
    if any(args.batch % r for r, _ in shapes):
        sys.exit(f"error: --batch: got {args.batch}, allowed: a multiple of every rank count "
                 f"of the layouts ({', '.join(str(r) for r, _ in shapes)})")
    load = os.getloadavg()[0]
    runs = []  # per repeat: {layout: results}
    for r in range(args.repeats):
        order = shapes[r % len(shapes):] + shapes[:r % len(shapes)]
        runs.append({layout: run_layout(*layout, args) for layout in order})
        print(f"repeat {r + 1} of {args.repeats} done", file=sys.stderr, flush=True)
    runs = [run for run in runs if all(res is not None for res in run.values())]
    if not runs:
        sys.exit("error: no repeat ran every layout (the failures are above)")
    rows, advice = [], []
    for name in args.models:
        def rate(run, layout, fw):
            return run[layout][name].get(fw)

        def best_minidp(run):
            return max(v for layout in shapes for k, v in run[layout][name].items()
                       if k.startswith("minidp"))

        best = {}
        for ranks, threads in shapes:
            layout = (ranks, threads)
            for fw in ("minidp sync", "minidp hsgd", "pytorch"):
                values = [rate(run, layout, fw) for run in runs]
                if values[0] is None:
                    continue
                ratios = [v / best_minidp(run) for v, run in zip(values, runs)]
                median = statistics.median(values)
                rows.append([name, f"{ranks} x {threads}", fw, f"{median:.0f}", spread(ratios)])
                key = "pytorch" if fw == "pytorch" else "minidp"
                if median > best.get(key, (0,))[0]:
                    best[key] = (median, layout, fw)
        rate_m, (r_m, t_m), fw_m = best["minidp"]
        line = f"{name}: choose {r_m} rank(s) x {t_m} thread(s) per node ({fw_m}, {rate_m:.0f} " \
               "samples/s)"
        if "pytorch" in best:
            rate_p, (r_p, t_p), _ = best["pytorch"]
            line += f"; PyTorch's best is {r_p} x {t_p} ({rate_p:.0f} samples/s): minidp's " \
                    f"best layout at {rate_m / rate_p:.2f}x its speed"
        advice.append(line)
    print(f"global batch {args.batch} on {args.cores} cores; {len(runs)} repeat(s) of "
          f"{args.blocks} blocks of {args.steps} steps per framework; load average "
          f"{load:.2f} before, {os.getloadavg()[0]:.2f} after\n")
    common.print_table(["model", "ranks x threads", "framework", "samples/s (median)",
                        "vs the best minidp layout [min, max]"], rows)
    print()
    for line in advice:
        print(line)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["lenet5", "cifar_cnn", "resnet20"],
                        choices=sorted(SHAPES))
    parser.add_argument("--batch", type=int, default=128, help="global batch (128)")
    parser.add_argument("--cores", type=int, default=len(os.sched_getaffinity(0)),
                        help="cores of the node (default: those this process may use)")
    parser.add_argument("--steps", type=int, default=10, help="steps per block (10)")
    parser.add_argument("--blocks", type=int, default=3, help="blocks per framework (3)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of every layout (3)")
    parser.add_argument("--timeout", type=float, default=1800.0, help="per job, s (1800)")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--store", default=os.path.join(os.environ.get("TMPDIR", "/tmp"),
                                                        "bench_layouts_store"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.cores < 1:
        sys.exit(f"error: --cores: got {args.cores}, allowed: >= 1")
    (worker if args.worker else driver)(args)


if __name__ == "__main__":
    main()
