r"""Strategies on the same model, data and ranks, through ``minidp compare``; DASO against sync.

    .venv/bin/python benchmarks/bench_strategies.py --model lenet5 --epochs 5
    .venv/bin/python benchmarks/bench_strategies.py --model mlp --epochs 20 \
        --net-latency-us 50 --net-bandwidth-gbps 1 --strategies sync,daso --out daso-vs-sync

Runs ``python -m minidp compare`` ``--repeats`` times (each strategy its own job, 4 ranks
as 2 virtual nodes of 2 by default, on full Fashion-MNIST; ``sync`` with
``--allreduce``, hierarchical by default), so the strategies' runs interleave: sync,
daso, sync, daso, ... and a machine shared with other jobs slows them alike. Each
repeat writes ``OUT/repeat-K/report.md``. Then prints, over the repeats (median, and
the spread as [min, max]): each run's final accuracy and its difference to the ``sync``
run of the same repeat, training time and its ratio to that sync run, comm share and
inter-node MiB; the median time of every epoch; and for each DASO run, its blocking
epochs (B = 0: warm-up, cool-down) and cycling epochs against the same repeat's sync
mean epoch, and the whole run's time and accuracy against sync's. With the network
model on, inter-node operations take at least latency + bytes / bandwidth
(docs/design.md).
"""

import argparse
import os
import statistics
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
             str(args.net_bandwidth_gbps), "--data-dir", args.data_dir,
             "--allreduce", args.allreduce, *args.train_flags]
    command = [sys.executable, "-m", "minidp", "compare", "--strategies", args.strategies,
               "--ranks", str(args.ranks), "--out", out, "--timeout", str(args.timeout),
               "--", *flags]
    done = subprocess.run(command, cwd=ROOT, check=False)
    if not os.path.isdir(out):  # compare refused its arguments: it said why, above
        sys.exit(f"bench_strategies.py: minidp compare ran nothing (exit {done.returncode})")
    runs = [load_run(os.path.join(out, d)) for d in sorted(os.listdir(out))
            if os.path.exists(os.path.join(out, d, "summary.json"))]
    label_runs(runs)
    return runs


def spread(values: list[float], fmt: str = "{:.2f}") -> str:
    """``median [min, max]`` of ``values``, each written with ``fmt``."""
    if not values:
        return "-"
    median = statistics.median(values)
    if len(values) == 1:
        return fmt.format(median)
    return f"{fmt.format(median)} [{fmt.format(min(values))}, {fmt.format(max(values))}]"


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


def accuracy(run) -> float:
    return run.epochs[-1]["test_accuracy"]


def comm_share(run) -> float:
    return sum(m["comm_s"] for m in run.epochs) / sum(m["wall_s"] for m in run.epochs)


def daso_ratios(run, base) -> dict[str, float]:
    """A DASO run's blocking and cycling epochs against sync's mean epoch; whole run."""
    walls = [m["wall_s"] for m in run.epochs]
    skips = run.strategy_stats("global_skip")
    sync_epoch = mean([m["wall_s"] for m in base.epochs])
    ratios = {"blocking": mean([w for w, b in zip(walls, skips) if b == 0]) / sync_epoch,
              "run": run.wall_s / base.wall_s,
              "acc": (accuracy(run) - accuracy(base)) * 100}
    cycling = [w for w, b in zip(walls, skips) if b]
    if cycling:
        ratios["cycling"] = mean(cycling) / sync_epoch
    return ratios


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
    parser.add_argument("--allreduce", default="hierarchical",
                        help="sync's algorithm (default hierarchical: the faster one)")
    parser.add_argument("--repeats", type=int, default=3,
                        help="times every strategy runs, interleaved (default 3)")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per job")
    parser.add_argument("--out", help="where compare writes the runs and report.md "
                                      "(default: a temporary directory, removed)")
    parser.add_argument("train_flags", nargs="*", metavar="-- FLAG",
                        help="more `minidp train` flags for every job, after --")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats: got {args.repeats}, allowed: 1 or more")
    with tempfile.TemporaryDirectory() as tmp:
        repeats = []
        for k in range(args.repeats):
            runs = compare(args, os.path.join(args.out or tmp, f"repeat-{k + 1}"))
            base = next((r for r in runs if r.strategy == "sync"), None)
            if base is not None:
                repeats.append((runs, base))
        if not repeats:
            sys.exit("no repeat finished a sync run to compare with")
        report(args, repeats)


def report(args: argparse.Namespace, repeats: list) -> None:
    """Print the tables over the repeats (each a list of runs and its sync run)."""
    labels = [r.label for r in repeats[0][0]]
    by_label = {label: [(next((r for r in runs if r.label == label), None), base)
                        for runs, base in repeats] for label in labels}
    net = (f"network model {args.net_latency_us:g} us, {args.net_bandwidth_gbps:g} Gbit/s"
           if args.net_latency_us or args.net_bandwidth_gbps else "no network model")
    print(f"\n{args.model} on {args.dataset}, {args.epochs} epochs, {args.ranks} ranks as "
          f"{args.ranks // args.ranks_per_node} nodes x {args.ranks_per_node}, batch "
          f"{args.batch_size} per rank, lr {args.lr}, momentum 0.9; {net}; sync's "
          f"allreduce {args.allreduce}; {len(repeats)} repeats, interleaved: median "
          "[min, max]; ratios to the sync run of the same repeat\n")
    rows = []
    for label, pairs in by_label.items():
        pairs = [(r, b) for r, b in pairs if r is not None]
        rows.append([label, str(len(pairs)), spread([accuracy(r) * 100 for r, _ in pairs]),
                     spread([(accuracy(r) - accuracy(b)) * 100 for r, b in pairs], "{:+.2f}"),
                     spread([r.wall_s for r, _ in pairs], "{:.1f}"),
                     spread([r.wall_s / b.wall_s for r, b in pairs], "{:.3f}x"),
                     spread([comm_share(r) * 100 for r, _ in pairs], "{:.0f}%"),
                     spread([r.summary["bytes_sent"]["inter"] / 2**20 for r, _ in pairs],
                            "{:.0f}")])
    common.print_table(["run", "runs", "test acc %", "acc vs sync (pt)", "training s",
                        "time vs sync", "comm share", "MiB inter"], rows)
    print("\nmedian seconds per epoch over the repeats (DASO: (B, S, L) of the epoch)\n")
    rows = []
    for e in range(args.epochs):
        row = [str(e + 1)]
        for pairs in by_label.values():
            walls = [r.epochs[e]["wall_s"] for r, _ in pairs if r and e < len(r.epochs)]
            first = next((r for r, _ in pairs if r and e < len(r.epochs)), None)
            bsl = first.epochs[e].get("strategy", {}) if first else {}
            tag = (f" ({bsl['global_skip']},{bsl['batches_to_wait']},{bsl['local_skip']})"
                   if "global_skip" in bsl else "")
            row.append(f"{statistics.median(walls):.2f}{tag}" if walls else "-")
        rows.append(row)
    common.print_table(["epoch", *by_label], rows)
    rows = []
    for label, pairs in by_label.items():
        ratios = [daso_ratios(r, b) for r, b in pairs if r is not None and r.strategy == "daso"]
        if not ratios:
            continue
        cycling = [x["cycling"] for x in ratios if "cycling" in x]
        rows.append([label, spread([x["blocking"] for x in ratios], "{:.3f}x"),
                     spread(cycling, "{:.3f}x"), spread([x["run"] for x in ratios], "{:.3f}x"),
                     "  ".join(f"{x['run']:.3f}x" for x in ratios),
                     spread([x["acc"] for x in ratios], "{:+.2f}")])
    if rows:
        print("\nDASO against the same repeat's sync: epochs against its mean epoch\n")
        common.print_table(["run", "blocking epochs", "cycling epochs", "whole run",
                            "every run", "acc points"], rows)


if __name__ == "__main__":
    main()
