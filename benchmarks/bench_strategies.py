r"""Every synchronous strategy on the same model, data and ranks: accuracy, epoch time, comm share.

    .venv/bin/python benchmarks/bench_strategies.py --model lenet5 --epochs 5
    .venv/bin/python benchmarks/bench_strategies.py --model mlp --epochs 3 \
        --net-latency-us 50 --net-bandwidth-gbps 1

Each strategy runs as its own job (``mpiexec -n 4 python -m mpi4py -m minidp train``,
4 ranks as 2 virtual nodes of 2 by default) on full Fashion-MNIST; the table gives the
final test accuracy, the mean epoch time, the share of time in communication
(comm_intra + comm_inter + wait of the busiest rank) and the epoch time relative to the
fastest ``sync`` measured in the same run: ``sync`` runs once per allreduce algorithm
(flat ``mpi``, its default, and ``hierarchical``), and the column "reduction" says what
each row used. With the network model on, inter-node operations take at least
latency + bytes / bandwidth (DESIGN.md s.5).
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (label, strategy, extra flags, what reduces the gradients or parameters)
VARIANTS = [
    ("sync", "sync", ["--allreduce", "mpi"], "mpi (flat)"),
    ("sync hierarchical", "sync", ["--allreduce", "hierarchical"], "hierarchical"),
    ("hsgd", "hsgd", [], "node window, then rails"),
    ("hbsgd k=4", "hbsgd", ["--set", "hbsgd.k=4"], "node window; rails every 4"),
    ("daso warm-up 1, cool-down 1", "daso",
     ["--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=1"],
     "node window; one rail"),
    # Heat's schedule starts cycling only after a blocking epoch (warm-up 0 never cycles)
    ("daso warm-up 1, no cool-down", "daso",
     ["--set", "daso.warmup_epochs=1", "--set", "daso.cooldown_epochs=0"],
     "node window; one rail"),
]


def run(args: argparse.Namespace, flags: list[str], out: str) -> dict | None:
    return common.train_job(
        ["--model", args.model, "--dataset", args.dataset, "--ranks-per-node",
         str(args.ranks_per_node), "--epochs", str(args.epochs), "--batch-size",
         str(args.batch_size), "--lr", str(args.lr), "--momentum", "0.9", "--net-latency-us",
         str(args.net_latency_us), "--net-bandwidth-gbps", str(args.net_bandwidth_gbps),
         "--data-dir", args.data_dir, "--no-progress", "--overwrite", *flags],
        out, args.ranks, args.timeout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
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
    parser.add_argument("--only", nargs="*", help="labels or strategies of the variants to "
                                                  "run (sync always runs: the base)")
    args = parser.parse_args()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, strategy, flags, reduction) in enumerate(VARIANTS):
            if args.only and strategy != "sync" and not {label, strategy} & set(args.only):
                continue
            s = run(args, ["--strategy", strategy, *flags], os.path.join(tmp, str(i)))
            if s is not None:
                epochs = s["epochs"]
                epoch_s = sum(m["wall_s"] for m in epochs) / len(epochs)
                comm = sum(m["comm_s"] for m in epochs) / sum(m["wall_s"] for m in epochs)
                results.append((label, strategy, reduction, s, epoch_s, comm))
            print(f"done: {label}", file=sys.stderr, flush=True)
    base = min((r[4] for r in results if r[1] == "sync"), default=None)
    rows = [[label, reduction, f"{s['final']['test_accuracy']:.2%}", f"{epoch_s:.2f}",
             f"{comm:.0%}", f"{epoch_s / base:.2f}x" if base else "-",
             f"{s['bytes_sent']['inter'] / 2**20:.0f}"]
            for label, _, reduction, s, epoch_s, comm in results]
    net = (f"network model {args.net_latency_us:g} us, {args.net_bandwidth_gbps:g} Gbit/s"
           if args.net_latency_us or args.net_bandwidth_gbps else "no network model")
    print(f"{args.model} on {args.dataset}, {args.epochs} epochs, {args.ranks} ranks as "
          f"{args.ranks // args.ranks_per_node} nodes x {args.ranks_per_node}, batch "
          f"{args.batch_size} per rank, lr {args.lr}, momentum 0.9; {net}; times relative "
          "to the fastest sync")
    common.print_table(["strategy", "reduction", "test acc", "s / epoch", "comm share",
                        "time vs sync", "MiB inter"], rows)


if __name__ == "__main__":
    main()
