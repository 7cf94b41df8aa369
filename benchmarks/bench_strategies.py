r"""Every synchronous strategy on the same model, data and ranks: accuracy, epoch time, comm share.

    .venv/bin/python benchmarks/bench_strategies.py --model lenet5 --epochs 5
    .venv/bin/python benchmarks/bench_strategies.py --model mlp --epochs 3 \
        --net-latency-us 50 --net-bandwidth-gbps 1

Each strategy runs as its own job (``mpiexec -n 4 python -m mpi4py -m minidp train``,
4 ranks as 2 virtual nodes of 2 by default) on full Fashion-MNIST; the table gives the
final test accuracy, the mean epoch time, the share of time in communication
(comm_intra + comm_inter + wait of the busiest rank) and the epoch time relative to
``sync`` measured in the same run. With the network model on, inter-node operations
take at least latency + bytes / bandwidth (DESIGN.md s.5).
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# (label, strategy, --set options)
VARIANTS = [
    ("sync", "sync", []),
    ("hsgd", "hsgd", []),
    ("hbsgd k=4", "hbsgd", ["hbsgd.k=4"]),
    ("daso warm-up 1, cool-down 1", "daso", ["daso.warmup_epochs=1", "daso.cooldown_epochs=1"]),
    ("daso cycling only", "daso", ["daso.warmup_epochs=0", "daso.cooldown_epochs=0"]),
]


def run(args: argparse.Namespace, strategy: str, sets: list[str], out: str) -> dict:
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    cmd = [mpiexec, "-n", str(args.ranks), sys.executable, "-m", "mpi4py", "-m", "minidp",
           "train", "--model", args.model, "--dataset", args.dataset, "--strategy", strategy,
           "--ranks-per-node", str(args.ranks_per_node), "--epochs", str(args.epochs),
           "--batch-size", str(args.batch_size), "--lr", str(args.lr), "--momentum", "0.9",
           "--net-latency-us", str(args.net_latency_us),
           "--net-bandwidth-gbps", str(args.net_bandwidth_gbps), "--data-dir", args.data_dir,
           "--no-progress", "--overwrite", "--out", out]
    for item in sets:
        cmd += ["--set", item]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


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
    parser.add_argument("--only", nargs="*", help="labels of the variants to run")
    args = parser.parse_args()
    rows, base = [], None
    with tempfile.TemporaryDirectory() as tmp:
        for i, (label, strategy, sets) in enumerate(VARIANTS):
            if args.only and label not in args.only and strategy not in args.only:
                continue
            s = run(args, strategy, sets, os.path.join(tmp, str(i)))
            epochs = s["epochs"]
            epoch_s = sum(m["wall_s"] for m in epochs) / len(epochs)
            comm = sum(m["comm_s"] for m in epochs) / sum(m["wall_s"] for m in epochs)
            base = epoch_s if strategy == "sync" and base is None else base
            rows.append([label, f"{s['final']['test_accuracy']:.2%}", f"{epoch_s:.2f}",
                         f"{comm:.0%}", f"{epoch_s / base:.2f}x" if base else "-",
                         f"{s['bytes_sent']['inter'] / 2**20:.0f}"])
            print(f"done: {label}", file=sys.stderr, flush=True)
    net = (f"network model {args.net_latency_us:g} us, {args.net_bandwidth_gbps:g} Gbit/s"
           if args.net_latency_us or args.net_bandwidth_gbps else "no network model")
    print(f"{args.model} on {args.dataset}, {args.epochs} epochs, {args.ranks} ranks as "
          f"{args.ranks // args.ranks_per_node} nodes x {args.ranks_per_node}, batch "
          f"{args.batch_size} per rank, lr {args.lr}, momentum 0.9; {net}")
    common.print_table(["strategy", "test acc", "s / epoch", "comm share", "time vs sync",
                        "MiB inter"], rows)


if __name__ == "__main__":
    main()
