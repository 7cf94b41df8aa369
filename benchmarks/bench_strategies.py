r"""Strategies on the same model, data and ranks, through ``minidp compare``; DASO against sync.

    .venv/bin/python benchmarks/bench_strategies.py --model lenet5 --epochs 5
    .venv/bin/python benchmarks/bench_strategies.py --model mlp --epochs 20 \
        --net-latency-us 50 --net-bandwidth-gbps 1 \
        --strategies sync,daso,daso:global_sync=rail --out daso-vs-sync

Runs ``python -m minidp compare`` (each strategy its own job, 4 ranks as 2 virtual
nodes of 2 by default, on full Fashion-MNIST), which writes ``OUT/report.md`` with the
plots; then prints, measured in this one run: each run's final accuracy, training time
and its ratio to the first ``sync`` run, comm share and inter-node MiB; the time of every
epoch side by side; and for each DASO run, its blocking epochs (B = 0: warm-up,
cool-down) and cycling epochs against sync's mean epoch, and the whole run's time and
accuracy against sync's. With the network model on, inter-node operations take at
least latency + bytes / bandwidth (docs/design.md).
"""

import argparse
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

from minidp.reporting.runs import label_runs, load_run  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DEFAULT = "sync,hsgd,hbsgd:k=4,daso:warmup_epochs=1:cooldown_epochs=1"


def compare(args: argparse.Namespace, out: str) -> list:
    """Run ``minidp compare`` into ``out``; the runs it finished, labelled."""
    flags = ["--model", args.model, "--dataset", args.dataset, "--ranks-per-node",
             str(args.ranks_per_node), "--epochs", str(args.epochs), "--batch-size",
             str(args.batch_size), "--lr", str(args.lr), "--momentum", "0.9",
             "--net-latency-us", str(args.net_latency_us), "--net-bandwidth-gbps",
             str(args.net_bandwidth_gbps), "--data-dir", args.data_dir]
    command = [sys.executable, "-m", "minidp", "compare", "--strategies", args.strategies,
               "--ranks", str(args.ranks), "--out", out, "--timeout", str(args.timeout),
               "--", *flags]
    subprocess.run(command, cwd=ROOT, check=False)
    runs = [load_run(os.path.join(out, d)) for d in sorted(os.listdir(out))
            if os.path.exists(os.path.join(out, d, "summary.json"))]
    label_runs(runs)
    return runs


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def daso_rows(run, base) -> list[list[str]]:
    """Blocking and cycling epochs of a DASO run against sync's mean epoch; whole run."""
    walls = [m["wall_s"] for m in run.epochs]
    blocking = [w for w, b in zip(walls, run.strategy_stats("global_skip")) if b == 0]
    cycling = [w for w, b in zip(walls, run.strategy_stats("global_skip")) if b]
    sync_epoch = mean([m["wall_s"] for m in base.epochs])
    acc = run.epochs[-1]["test_accuracy"] - base.epochs[-1]["test_accuracy"]
    return [[run.label, f"{len(blocking)}", f"{mean(blocking) / sync_epoch:.2f}x",
             f"{len(cycling)}", f"{mean(cycling) / sync_epoch:.2f}x" if cycling else "-",
             f"{run.wall_s / base.wall_s:.2f}x", f"{acc * 100:+.2f}"]]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--strategies", default=DEFAULT,
                        help=f"compare's list, variants as S:OPTION=VALUE (default {DEFAULT})")
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--dataset", default="fashion-mnist")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--ranks-per-node", type=int, default=2)
    parser.add_argument("--net-latency-us", type=float, default=0.0)
    parser.add_argument("--net-bandwidth-gbps", type=float, default=0.0)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per job")
    parser.add_argument("--out", help="where compare writes the runs and report.md "
                                      "(default: a temporary directory, removed)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        runs = compare(args, args.out or os.path.join(tmp, "compare"))
        if not runs:
            sys.exit("no run finished")
        base = next((r for r in runs if r.strategy == "sync"), runs[0])
        net = (f"network model {args.net_latency_us:g} us, {args.net_bandwidth_gbps:g} Gbit/s"
               if args.net_latency_us or args.net_bandwidth_gbps else "no network model")
        print(f"\n{args.model} on {args.dataset}, {args.epochs} epochs, {args.ranks} ranks "
              f"as {args.ranks // args.ranks_per_node} nodes x {args.ranks_per_node}, batch "
              f"{args.batch_size} per rank, lr {args.lr}, momentum 0.9; {net}; times "
              f"relative to {base.label}\n")
        common.print_table(
            ["run", "test acc", "training s", "time vs base", "comm share", "MiB inter"],
            [[r.label, f"{r.epochs[-1]['test_accuracy']:.2%}", f"{r.wall_s:.1f}",
              f"{r.wall_s / base.wall_s:.2f}x",
              f"{sum(m['comm_s'] for m in r.epochs) / sum(m['wall_s'] for m in r.epochs):.0%}",
              f"{r.summary['bytes_sent']['inter'] / 2**20:.0f}"] for r in runs])
        print("\nseconds per epoch (DASO: (B, S, L) of the epoch)\n")
        rows = []
        for e in range(max(len(r.epochs) for r in runs)):
            row = [str(e + 1)]
            for r in runs:
                if e >= len(r.epochs):
                    row.append("-")
                    continue
                m = r.epochs[e]
                bsl = m.get("strategy", {})
                tag = (f" ({bsl['global_skip']},{bsl['batches_to_wait']},{bsl['local_skip']})"
                       if "global_skip" in bsl else "")
                row.append(f"{m['wall_s']:.2f}{tag}")
            rows.append(row)
        common.print_table(["epoch", *(r.label for r in runs)], rows)
        daso = [row for r in runs if r.strategy == "daso" for row in daso_rows(r, base)]
        if daso and base.strategy == "sync":
            print(f"\nDASO against {base.label}'s mean epoch\n")
            common.print_table(["run", "blocking epochs", "vs sync", "cycling epochs",
                                "vs sync", "whole run", "acc points"], daso)


if __name__ == "__main__":
    main()
