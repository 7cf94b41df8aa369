r"""Asynchronous strategies against ``sync``: accuracy, a straggler, the server's load.

    .venv/bin/python benchmarks/bench_async.py --part all            # 16 min on 2 cores
    .venv/bin/python benchmarks/bench_async.py --quick               # a minute: does it run
    .venv/bin/python benchmarks/bench_async.py --part accuracy --epochs 2 --only asgd \
        --lr asgd=0.1                                                # one learning-rate probe

Every run is its own job (``mpiexec -n 4 python -m mpi4py -m minidp train``, LeNet-5 on
full Fashion-MNIST, batch 64 per worker, seed 0); the tables are read back from the
runs' ``summary.json`` and every ratio compares runs of this one invocation.

* ``accuracy``: final test accuracy of each strategy and its gap to ``sync`` in points
  (target: every strategy within 1.5 points). The parameter-server strategies have 3
  workers (rank 0 serves); ``asgd``, ``softsync``, ``dbs`` and ``hogwild`` apply plain
  SGD, so their learning rates differ from sync's (``RECIPES``; ``--lr`` overrides).
* ``straggler``: the same with ``--slowdown 3:3`` (rank 3, a worker in every strategy,
  computes 3x slower). Time to reach sync's final accuracy of this run (cumulative
  ``wall_s`` at the first epoch at or above it), total time, mean staleness, and the
  ratios: each strategy against ``sync``, ``dbs`` against ``asgd`` (target: 1.3x sooner)
  and against ``asgd-shard`` (``asgd.epoch=shard``: every worker its own equal share of
  an epoch, ASGD over fixed data partitions as the DBS paper's baseline runs it).
  ``--async-epochs`` gives the other strategies more epochs than sync, to reach its
  accuracy; ``--dbs-variant`` adds dbs rows with other options.
* ``server``: the server's busy share (time answering and applying over time serving)
  for ``asgd`` on the MLP with 3 workers, with one server (4 ranks) and with
  ``asgd.servers=2`` (5 ranks). ``metrics.jsonl`` holds server 0's share only; the
  share of each server is also read from ``trace.json`` (busy = every event of the
  serve loop except the idle probe, over busy + idle).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

ROOT = common.ROOT
# label: (strategy, lr, momentum, --set options); rates from 2- and 5-epoch runs, see
# docs/benchmarks.md.
RECIPES: dict[str, tuple[str, float, float, list[str]]] = {
    "sync": ("sync", 0.05, 0.9, []),
    "asgd": ("asgd", 0.1, 0.0, []),
    "asgd-shard": ("asgd", 0.1, 0.0, ["asgd.epoch=shard"]),  # the DBS paper's ASGD
    "amsgd": ("amsgd", 0.01, 0.9, []),
    "softsync": ("softsync", 0.1, 0.5, ["softsync.server_momentum=true"]),  # as measured
    "dbs": ("dbs", 0.1, 0.0, []),
    "dbs-round": ("dbs", 0.05, 0.9, ["dbs.update=round"]),  # synchronous steps: sync's rate
    "hogwild": ("hogwild", 0.1, 0.0, []),
}
STRAGGLER = "3:3"
SERVE_IDLE = "serve (probe"  # the op of a server waiting for work (phase "idle")


def train(args: argparse.Namespace, out: str, strategy: str, lr: float, momentum: float,
          sets: list[str], ranks: int = 4, model: str | None = None,
          epochs: int | None = None, slowdown: str | None = None) -> dict | None:
    """Run one training job into ``out``; its summary, or None when the job failed."""
    cmd = ["--model", model or args.model, "--dataset", "fashion-mnist",
           "--strategy", strategy, "--epochs", str(epochs or args.epochs),
           "--batch-size", "64", "--lr", f"{lr:g}", "--momentum", f"{momentum:g}",
           "--seed", "0", "--data-dir", args.data_dir, "--no-progress"]
    if args.train_samples:
        cmd += ["--train-samples", str(args.train_samples)]
    if args.test_samples:
        cmd += ["--test-samples", str(args.test_samples)]
    if slowdown:
        cmd += ["--slowdown", slowdown]
    for item in sets:
        cmd += ["--set", item]
    return common.train_job(cmd, out, ranks, args.timeout)


def recipe(args: argparse.Namespace, label: str) -> tuple[str, float, float, list[str]]:
    """RECIPES[label] with the learning rate (and momentum) of ``--lr label=LR[/M]``."""
    strategy, lr, momentum, sets = RECIPES[label]
    for item in args.lr:
        name, _, value = item.partition("=")
        if name == label:
            lr_text, _, momentum_text = value.partition("/")
            lr, momentum = float(lr_text), float(momentum_text or momentum)
    return strategy, lr, momentum, sets


def selected(args: argparse.Namespace, labels: list[str]) -> list[str]:
    """The labels ``--only`` keeps (sync always, as every ratio's reference)."""
    return [k for k in labels if not args.only or k in args.only or k == "sync"]


def epochs_of(summary: dict | None) -> list[dict[str, Any]]:
    return summary["epochs"] if summary else []


def time_to(summary: dict | None, target: float) -> float | None:
    """Cumulative wall seconds at the first epoch whose test accuracy >= target."""
    elapsed = 0.0
    for m in epochs_of(summary):
        elapsed += m["wall_s"]
        if m["test_accuracy"] >= target:
            return elapsed
    return None


def mean_staleness(summary: dict | None) -> str:
    """Staleness over the run, weighted by each epoch's gradients ('-' without a server)."""
    stats = [m["strategy"] for m in epochs_of(summary) if "staleness_mean" in
             m.get("strategy", {})]
    if not stats:
        return "-"
    total = sum(s["gradients"] for s in stats)
    mean = sum(s["staleness_mean"] * s["gradients"] for s in stats) / max(total, 1)
    return f"{mean:.2f} (max {max(s['staleness_max'] for s in stats)})"


def accuracy(summary: dict | None) -> float | None:
    return summary["final"]["test_accuracy"] if summary else None


def seconds(value: float | None) -> str:
    return "not reached" if value is None else f"{value:.1f}"


def ratio(reference: float | None, value: float | None) -> str:
    """How many times sooner ``value`` is than ``reference`` (>1: sooner)."""
    return "-" if reference is None or value is None else f"{reference / value:.2f}x"


def data_text(args: argparse.Namespace) -> str:
    """What the runs train and test on, for the tables' captions."""
    if not args.train_samples and not args.test_samples:
        return "full Fashion-MNIST"
    return (f"Fashion-MNIST, first {args.train_samples or 60000} training and "
            f"{args.test_samples or 10000} test samples")


def part_accuracy(args: argparse.Namespace, tmp: str) -> None:
    print("\n## accuracy: 4 ranks, no straggler\n", flush=True)
    labels = selected(args, [k for k in RECIPES if k != "asgd-shard"])
    runs = {}
    for label in labels:
        strategy, lr, momentum, sets = recipe(args, label)
        runs[label] = (lr, momentum, train(args, os.path.join(tmp, f"accuracy-{label}"),
                                           strategy, lr, momentum, sets))
    base = accuracy(runs["sync"][2])
    rows = []
    for label, (lr, momentum, s) in runs.items():
        acc = accuracy(s)
        gap = None if acc is None or base is None else 100 * (acc - base)
        rows.append([label, f"{lr:g}", f"{momentum:g}",
                     "failed" if acc is None else f"{acc:.2%}",
                     "-" if gap is None else f"{gap:+.2f}",
                     "-" if gap is None else ("yes" if gap >= -1.5 else "NO"),
                     f"{s['wall_s']:.1f}" if s else "-", mean_staleness(s)])
    print(f"\n{args.model}, {data_text(args)}, {args.epochs} epochs, batch 64 per worker, "
          "seed 0, 4 ranks (parameter-server strategies: 3 workers + 1 server)")
    common.print_table(["strategy", "lr", "momentum", "test acc", "gap to sync (pt)",
                        "within 1.5 pt", "total s", "mean staleness"], rows)


def part_straggler(args: argparse.Namespace, tmp: str) -> None:
    print(f"\n## straggler: --slowdown {STRAGGLER} (rank 3 computes 3x slower)\n", flush=True)
    plan = [(label, *recipe(args, label)) for label in
            selected(args, ["sync", "asgd", "asgd-shard", "softsync", "dbs", "dbs-round",
                            "hogwild"])]
    for sets in args.dbs_variant:
        _, lr, momentum, base_sets = recipe(args, "dbs")
        plan.append((f"dbs ({sets})", "dbs", lr, momentum, base_sets + sets.split(",")))
    runs = {}
    for k, (label, strategy, lr, momentum, sets) in enumerate(plan):
        epochs = args.epochs if strategy == "sync" else args.async_epochs or args.epochs
        runs[label] = train(args, os.path.join(tmp, f"straggler-{k}"), strategy, lr, momentum,
                            sets, epochs=epochs, slowdown=STRAGGLER)
    target = accuracy(runs["sync"])
    if target is None:
        print("sync failed: no target accuracy", file=sys.stderr)
        return
    loose = target - args.slack / 100
    reach = {label: time_to(s, target) for label, s in runs.items()}
    reach_loose = {label: time_to(s, loose) for label, s in runs.items()}
    rows = []
    for label, s in runs.items():
        total = s["wall_s"] if s else None
        rows.append([label, "failed" if s is None else f"{accuracy(s):.2%}",
                     seconds(reach[label]), ratio(reach["sync"], reach[label]),
                     seconds(reach_loose[label]), ratio(reach_loose["sync"], reach_loose[label]),
                     seconds(total), ratio(runs["sync"]["wall_s"], total), mean_staleness(s)])
    epochs = f"{args.epochs} epochs" + (f" (sync), {args.async_epochs} (the others)"
                                        if args.async_epochs else "")
    print(f"\n{args.model}, {data_text(args)}, {epochs}, batch 64 per worker (dbs: "
          f"the mean), rank 3 {STRAGGLER.split(':')[1]}x slower; target: sync's final accuracy "
          f"{target:.2%} (and {loose:.2%}, {args.slack:g} points below); 'vs sync': sync's "
          "seconds / the strategy's (>1: sooner)")
    common.print_table(["strategy", "final acc", "s to target", "vs sync",
                        f"s to target-{args.slack:g}pt", "vs sync", "total s",
                        "vs sync", "mean staleness"], rows)
    for label, s in runs.items():
        if label.startswith("dbs") and s:
            last = s["epochs"][-1]["strategy"]
            speeds = {r: round(v) for r, v in last["throughput"].items()}
            means = {r: round(b, 1) for r, b in last["worker_mean_batch"].items()}
            print(f"{label}: final batch sizes {last['batch_sizes']} (worker rank: samples), "
                  f"throughput {speeds} samples/s, last epoch's mean batch {means}")
    for label in runs:
        for base in ("asgd", "asgd-shard"):
            if label.startswith("dbs") and base in runs:
                print(f"{label} vs {base}: {ratio(reach[base], reach[label])} sooner to "
                      f"{target:.2%}, {ratio(reach_loose[base], reach_loose[label])} to "
                      f"{loose:.2%} (target: 1.3x)")


def trace_busy_shares(out: str, servers: int) -> list[float]:
    """Each server's busy / (busy + idle) over the run, from trace.json."""
    with open(os.path.join(out, "trace.json")) as f:
        trace = json.load(f)
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    busy, idle = [0.0] * servers, [0.0] * servers
    for e in events:
        pid, op = e.get("pid"), str(e.get("args", {}).get("op", ""))
        if e.get("ph") != "X" or pid not in range(servers):
            continue
        if op.startswith(SERVE_IDLE):
            idle[pid] += e["dur"]
        elif e["name"] == "optimizer" or op.startswith(("recv ", "send ")):
            busy[pid] += e["dur"]
    return [b / max(b + i, 1e-9) for b, i in zip(busy, idle)]


def part_server(args: argparse.Namespace, tmp: str) -> None:
    print("\n## server: asgd on the MLP, 3 workers\n", flush=True)
    _, lr, _, _ = recipe(args, "asgd")
    rows, shares = [], []
    for servers in (1, 2):
        out = os.path.join(tmp, f"server-{servers}")
        s = train(args, out, "asgd", lr, 0.0, [f"asgd.servers={servers}"], ranks=3 + servers,
                  model="mlp", epochs=args.server_epochs)
        if s is None:
            rows.append([servers, 3 + servers, "failed", "-", "-", "-", "-"])
            shares.append(None)
            continue
        stats = [m["strategy"] for m in s["epochs"]]
        share0 = sum(x["server_busy_share"] for x in stats) / len(stats)
        traced = trace_busy_shares(out, servers)
        updates = sum(x["updates"] for x in stats)
        shares.append(share0)
        rows.append([servers, 3 + servers, f"{share0:.1%}",
                     ", ".join(f"{v:.1%}" for v in traced), f"{s['wall_s']:.1f}",
                     f"{updates / s['wall_s']:.0f}", f"{accuracy(s):.2%}"])
    print(f"\nMLP (784-512-256-10), {data_text(args)}, {args.server_epochs} epochs, asgd "
          f"lr {lr:g}, batch 64 per worker")
    common.print_table(["servers", "ranks", "server 0 busy (metrics)",
                        "busy per server (trace)", "total s", "updates / s", "test acc"], rows)
    if all(shares):
        print(f"server 0's busy share with 2 servers / with 1: {shares[1] / shares[0]:.2f} "
              "(target: about 0.5; one server under 50%)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", choices=("accuracy", "straggler", "server", "all"),
                        default="all")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--server-epochs", type=int, default=3)
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--train-samples", type=int, default=None)
    parser.add_argument("--test-samples", type=int, default=None)
    parser.add_argument("--quick", action="store_true",
                        help="2 epochs on 3000 training and 1000 test samples: a smoke run")
    parser.add_argument("--only", nargs="*", help="labels of RECIPES to run (sync always runs)")
    parser.add_argument("--lr", action="append", default=[], metavar="LABEL=LR[/MOMENTUM]",
                        help="override a recipe's learning rate (and momentum)")
    parser.add_argument("--dbs-variant", action="append", default=[], metavar="SETS",
                        help="straggler: one more dbs row with these comma-separated --set "
                        "options, e.g. dbs.ema=0.8,dbs.rebalance_every=1")
    parser.add_argument("--async-epochs", type=int, default=None,
                        help="straggler: epochs of the strategies other than sync (default "
                        "--epochs), so that they may reach sync's accuracy")
    parser.add_argument("--slack", type=float, default=1.0,
                        help="straggler: a second target this many points below sync's")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    parser.add_argument("--keep", metavar="DIR", help="write the runs into DIR (a new "
                        "directory) and keep them, instead of a temporary directory")
    args = parser.parse_args()
    if args.quick:
        args.epochs, args.server_epochs = 2, 1
        args.train_samples, args.test_samples = 3000, 1000
    started = time.perf_counter()
    parts = ("accuracy", "straggler", "server") if args.part == "all" else (args.part,)
    with tempfile.TemporaryDirectory(prefix="bench_async-") as tmp:
        if args.keep:
            os.makedirs(args.keep)
        for part in parts:
            {"accuracy": part_accuracy, "straggler": part_straggler,
             "server": part_server}[part](args, args.keep or tmp)
    print(f"\n(benchmark wall time {time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
