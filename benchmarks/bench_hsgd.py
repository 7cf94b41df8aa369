r"""HSGD's premise on one node: G single-thread replicas beat one process using G threads.

    .venv/bin/python benchmarks/bench_hsgd.py

"native": 1 rank whose BLAS and Numba use every core of the node (the "native
distributed strategy" of the HSGD paper on one node), batch 2b. "hsgd": one rank per
core, one thread each, batch b each (the same global batch), level-1 averaging
through the node's shared-memory window. Both train the same model on the same
Fashion-MNIST samples; the table gives samples per second (mean over epochs after the
first, which includes compilation) and the ratio hsgd / native measured in this run.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

from minidp.reporting.launcher import mpiexec

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(ranks: int, strategy: str, batch: int, args: argparse.Namespace, out: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "MINIDP_NUM_THREADS"}
    cmd = [mpiexec(), "-n", str(ranks), sys.executable, "-m", "mpi4py", "-m", "minidp", "train",
           "--model", args.model, "--dataset", "fashion-mnist", "--strategy", strategy,
           "--epochs", str(args.epochs), "--batch-size", str(batch), "--lr", "0.05",
           "--train-samples", str(args.train_samples), "--data-dir", args.data_dir,
           "--no-progress", "--overwrite", "--out", out]
    subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL, env=env)
    with open(os.path.join(out, "summary.json")) as f:
        return json.load(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lenet5")
    parser.add_argument("--cores", type=int, default=os.cpu_count())
    parser.add_argument("--batch-size", type=int, default=64, help="per hsgd rank")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--train-samples", type=int, default=30000)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    args = parser.parse_args()
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        rows["native"] = run(1, "sync", args.batch_size * args.cores, args, f"{tmp}/native")
        rows["hsgd"] = run(args.cores, "hsgd", args.batch_size, args, f"{tmp}/hsgd")
    rates = {}
    print(f"{args.model}, {args.train_samples} Fashion-MNIST samples, global batch "
          f"{args.batch_size * args.cores}, {args.cores} cores")
    print("| run | ranks x threads | samples/s | test acc |")
    print("|---|---|---|---|")
    for name, s in rows.items():
        epochs = s["epochs"][1:] or s["epochs"]
        rates[name] = sum(m["samples"] for m in epochs) / sum(m["wall_s"] for m in epochs)
        print(f"| {name} | {s['world_size']} x {s['threads_per_rank']} | {rates[name]:.0f} | "
              f"{s['final']['test_accuracy']:.2%} |")
    print(f"hsgd / native: {rates['hsgd'] / rates['native']:.2f}x samples per second")


if __name__ == "__main__":
    main()
