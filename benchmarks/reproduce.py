r"""Regenerate docs/reproduction.md: each seed paper's headline claim, measured here.

    .venv/bin/python benchmarks/reproduce.py                 # about 5 min on 2 cores
    .venv/bin/python benchmarks/reproduce.py --only daso     # one claim, the others kept
    .venv/bin/python benchmarks/reproduce.py --only dbs easgd --dataset mnist-5k --epochs 10

Every claim is a set of training jobs (``mpiexec ... python -m mpi4py -m minidp train``,
LeNet-5 or the MLP, seed 0, run one after the other), reported by ``minidp report`` into
``docs/reproduction/CLAIM/`` (report.md and plots), and judged by a rule written below
next to the claim. Each section of the page says its data, how the setup is scaled down
from the paper's (virtual nodes of 2 ranks on one 2-core machine, the network model for
the inter-node links), the machine's load while it ran, and gives a verdict from the
numbers of its invocation; ``--only`` regenerates the sections named and keeps the
others as they are. Where one machine cannot show a claim of scale (SC17's
communication share), ``minidp simulate``'s prediction at the paper's scale stands
beside the measured row and the verdict says which one it rests on.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable

sys.path.insert(0, os.path.dirname(__file__))
import common  # noqa: E402

from minidp.reporting.report import runs_table, write_report  # noqa: E402
from minidp.reporting.runs import Run, load_run  # noqa: E402
from minidp.simulate.command import add_arguments as simulate_arguments  # noqa: E402
from minidp.simulate.predict import setup as simulate_setup  # noqa: E402

ROOT = common.ROOT
NETWORK = ["--ranks-per-node", "2", "--net-latency-us", "50", "--net-bandwidth-gbps", "1"]
STRAGGLER = ["--slowdown", "3:3"]
# sync's faster reduction under the network model: MPI's flat allreduce is charged for
# every message between the nodes (docs/benchmarks.md, DASO over a whole run)
HIER = ["--allreduce", "hierarchical"]


@dataclasses.dataclass
class Job:
    """One training job of a claim: its label, ranks, flags and environment."""

    label: str
    ranks: int
    flags: list[str]
    env: dict[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class Claim:
    """A paper's headline claim, the jobs that test it here, and the rule that judges them."""

    name: str
    paper: str
    claim: str
    setup: str
    jobs: list[Job]
    verdict: Callable[[dict[str, Run]], str]


def rate(run: Run) -> float:
    """Training samples per second, over the epochs after the first (compilation)."""
    epochs = run.epochs[1:] or run.epochs
    return sum(m["samples"] for m in epochs) / sum(m["wall_s"] for m in epochs)


def acc(run: Run) -> float:
    return 100 * run.epochs[-1]["test_accuracy"]


def inter_mib(run: Run) -> float:
    return run.summary["bytes_sent"]["inter"] / 2**20 if run.summary else 0.0


def comm_share(run: Run) -> float:
    """Mean over the workers of their time communicating or waiting over the run's time."""
    workers = [p for r, p in run.rank_phases.items()
               if p["forward"] > 0]  # servers compute nothing
    comm = [sum(p[k] for k in ("comm_intra", "comm_inter", "wait")) for p in workers]
    return sum(comm) / len(comm) / run.wall_s if comm else 0.0


def change(fraction: float, what: str) -> str:
    """'12% less time' or '5% more time' for a fraction saved (negative: spent more)."""
    return f"{abs(fraction):.0%} {'less' if fraction >= 0 else 'more'} {what}"


def judge_hsgd(runs: dict[str, Run]) -> str:
    speedup = rate(runs["hsgd"]) / rate(runs["native"])
    gap = acc(runs["hsgd"]) - acc(runs["native"])
    ok = speedup > 1.0 and gap > -1.0
    return (f"{'Reproduced' if ok else 'Not reproduced'} in shape: two single-thread ranks "
            f"with shared-memory averaging train {speedup:.2f}x the samples per second of "
            f"one process using two threads, at {gap:+.2f} points of accuracy.")


def judge_daso(runs: dict[str, Run]) -> str:
    saved = 1 - runs["daso"].wall_s / runs["sync"].wall_s
    gap = acc(runs["daso"]) - acc(runs["sync"])
    ok = saved >= 0.2 and gap >= -0.5
    return (f"{'Reproduced' if ok else 'Not reproduced'}: DASO took "
            f"{change(saved, 'training time')} than sync (the paper: up to 34% less), at "
            f"{gap:+.2f} points.")


def judge_hbsgd(runs: dict[str, Run]) -> str:
    fewer = inter_mib(runs["sync"]) / max(inter_mib(runs["hbsgd k=4"]), 1e-9)
    gap = acc(runs["hbsgd k=4"]) - acc(runs["sync"])
    ok = fewer >= 2 and gap >= -1.0
    return (f"{'Reproduced' if ok else 'Not reproduced'}: averaging across nodes every 4 "
            f"steps sends {fewer:.1f}x fewer inter-node bytes than sync, at {gap:+.2f} "
            f"points; training time {runs['sync'].wall_s / runs['hbsgd k=4'].wall_s:.2f}x "
            "sync's speed.")


def judge_dbs(runs: dict[str, Run]) -> str:
    loss = {k: r.epochs[-1]["train_loss"] for k, r in runs.items()}
    cut = {k: 1 - loss["dbs"] / loss[k] for k in ("asgd", "asgd-shard", "softsync")}
    ok = all(v >= 0.3 for v in cut.values())
    words = ", ".join(f"{change(v, 'loss')} than {k}'s" for k, v in cut.items())
    return (f"{'Reproduced' if ok else 'Not reproduced'} (rule: at least 30% lower final "
            f"training loss than every baseline; the paper: 60% on MNIST): after the same "
            f"epochs dbs has {words}. Training time: "
            + ", ".join(f"{k} {r.wall_s:.1f} s" for k, r in runs.items()) + ".")


PAPER_RANKS = (8, 64)  # SC17's scale: 8 GPUs, and 64
# (latency us, bandwidth Gbit/s): the runs' network model, and an InfiniBand-like link
NETWORKS = {"the runs' 50 us / 1 Gbit/s": (50, 1), "InfiniBand-like 2 us / 56 Gbit/s": (2, 56)}


def predicted_shares(dataset: str, latency_us: float,
                     gbps: float) -> dict[int, tuple[float, float]]:
    """``minidp simulate``'s communication share of (easgd-rr, easgd-sync) per world size.

    The runs' MLP and batch, 2 ranks per node with a core each, this machine's one-core
    step timed now, the network given.
    """
    flags = ["--strategy", "easgd-rr,easgd-sync", "--ranks-per-node", "2", "--nodes",
             ",".join(str(n // 2) for n in PAPER_RANKS), "--model", "mlp", "--dataset", dataset,
             "--samples", "60000", "--batch-size", "64", "--net-latency-us", str(latency_us),
             "--net-bandwidth-gbps", str(gbps)]
    args = simulate_arguments(argparse.ArgumentParser()).parse_args(flags)
    sim = simulate_setup(args)
    shares = {}
    for p in sim.nodes:
        epochs = {e.strategy: e for e in sim.predict(p, args)}
        shares[2 * p] = (epochs["easgd-rr"].comm_share, epochs["easgd-sync"].comm_share)
    return shares


def judge_easgd(runs: dict[str, Run]) -> str:
    rr, sync = comm_share(runs["easgd-rr"]), comm_share(runs["easgd-sync"])
    weak = rate(runs["easgd-sync 4 ranks"]) / rate(runs["easgd-sync 2 ranks"])
    dataset = runs["easgd-rr"].config["dataset"]
    predicted = {name: predicted_shares(dataset, *net) for name, net in NETWORKS.items()}
    words = "; ".join(f"{name}: " + ", ".join(f"{n} ranks {a:.0%} -> {b:.0%}"
                                              for n, (a, b) in shares.items())
                      for name, shares in predicted.items())
    direction = sync < rr
    # the size: the original communication-bound at the paper's larger scale, Sync EASGD
    # at most half its share there
    size = direction and any(a >= 0.5 and b <= 0.5 * a
                             for shares in predicted.values() for a, b in [shares[64]])
    return (f"{'Reproduced in direction' if direction else 'Not reproduced'} (measured), "
            f"{'and in size by the prediction only' if size else 'not in size'}. Measured "
            f"here (4 ranks on 2 shared cores): the workers' communication share is {rr:.0%} "
            f"with the original round-robin EASGD and {sync:.0%} with Sync EASGD (the paper: "
            "87% -> 14% on 8 GPUs). Predicted by `minidp simulate` (easgd-rr -> easgd-sync, "
            "the same MLP and batch, 2 ranks per node with a core each, this machine's step) "
            f"for two networks: {words}. The direction rests on the measured rows; the size "
            "on the prediction (rule: at 64 ranks the original above 50% and Sync EASGD at "
            "most half of it, on either network): 4 ranks sharing 2 cores cannot show how "
            "8 or 64 workers queue at the master. Weak scaling from 2 to 4 ranks: "
            f"{weak:.2f}x the samples per second (ideal 2x; 4 ranks share 2 cores here, so "
            "at most about 1x is possible on this machine).")


def claims(args: argparse.Namespace) -> list[Claim]:
    data = ["--dataset", args.dataset, "--seed", "0", "--train-samples",
            str(args.train_samples), "--epochs", str(args.epochs)]
    native = ["--model", "lenet5", *data, "--batch-size", "128"]
    data += ["--batch-size", "64"]
    lenet = ["--model", "lenet5", *data]
    sgd = ["--lr", "0.05", "--momentum", "0.9"]
    # DASO with its own defaults (4 warm-up and 4 cool-down epochs) needs a run long
    # enough to cycle, and a model whose syncs cost something: the MLP, 20 epochs.
    daso_run = ["--model", "mlp", "--dataset", args.dataset, "--seed", "0",
                "--train-samples", str(args.train_samples), "--epochs", str(args.daso_epochs),
                "--batch-size", "64", *sgd, *NETWORK]
    one_thread = {"MINIDP_NUM_THREADS": "1"}
    return [
        Claim("hsgd", "Wang, Lu, Chen, Li, IEICE Trans. Inf. E103-D(12), 2020 (HSGD)",
              "On multi-core CPU nodes, one process per core with a shared-memory reduction "
              "beats one multi-threaded process per node.",
              "One node of 2 cores: `sync` on 1 rank with 2 threads at batch 128 against "
              "`hsgd` on 2 single-thread ranks at batch 64 each (the same global batch).",
              [Job("native", 1, ["--strategy", "sync", *native, *sgd],
                   {"MINIDP_NUM_THREADS": "2"}),
               Job("hsgd", 2, ["--strategy", "hsgd", *lenet, *sgd], one_thread)],
              judge_hsgd),
        Claim("daso", "Coquelin et al., 2021 (DASO, Heat's code)",
              "Up to 34% less training time than flat synchronous SGD at the same accuracy.",
              f"The MLP (2.1 MB per sync), {args.daso_epochs} epochs, 2 virtual nodes x 2 "
              "ranks, network model 50 us / 1 Gbit/s; DASO with Heat's defaults (4 "
              "warm-up and 4 cool-down epochs of blocking syncs, plateau-driven cycling "
              "between them) against `sync` with the hierarchical allreduce (the faster "
              "of sync's two here).",
              [Job("sync", 4, ["--strategy", "sync", *daso_run, *HIER], one_thread),
               Job("daso", 4, ["--strategy", "daso", *daso_run], one_thread)],
              judge_daso),
        Claim("hbsgd", "Zhou and Cong, K-AVG, IJCAI 2018 (the basis of HBSGD)",
              "Averaging models every K steps across nodes cuts communication with little "
              "loss of accuracy.",
              "2 virtual nodes x 2 ranks, network model 50 us / 1 Gbit/s; `hbsgd` with "
              "k = 4 (gradients averaged in the node every step) against `sync` with the "
              "hierarchical allreduce.",
              [Job("sync", 4, ["--strategy", "sync", *lenet, *sgd, *NETWORK, *HIER],
                   one_thread),
               Job("hbsgd k=4", 4, ["--strategy", "hbsgd", *lenet, *sgd, *NETWORK, "--set",
                                    "hbsgd.k=4"], one_thread)],
              judge_hbsgd),
        Claim("dbs", "Ji, Zhang, Fu, Gao, Li, JCRD 56(11), 2019 (DBS-SGD)",
              "With nodes of different speeds, dynamic batch sizes reduce MNIST's loss by "
              "60% against ASGD and n-softsync.",
              "4 ranks (1 server, 3 workers), rank 3 computes 3x slower; plain SGD lr 0.1 "
              "at the server; `asgd` (shared epoch budget), `asgd` with `epoch=shard` "
              "(each worker its own data share, as the paper's ASGD), `softsync` (n = 1, "
              "Gupta et al.'s lr / <sigma>) and `dbs` (each gradient weighted b_i / b).",
              [Job("asgd", 4, ["--strategy", "asgd", *lenet, "--lr", "0.1", "--momentum",
                               "0", *STRAGGLER], one_thread),
               Job("asgd-shard", 4, ["--strategy", "asgd", *lenet, "--lr", "0.1",
                                     "--momentum", "0", *STRAGGLER, "--set",
                                     "asgd.epoch=shard"], one_thread),
               Job("softsync", 4, ["--strategy", "softsync", *lenet, "--lr", "0.1",
                                   "--momentum", "0", *STRAGGLER], one_thread),
               Job("dbs", 4, ["--strategy", "dbs", *lenet, "--lr", "0.1", "--momentum", "0",
                              *STRAGGLER], one_thread)],
              judge_dbs),
        Claim("easgd", "You, Buluç, Demmel, SC17 (Sync EASGD)",
              "Sync EASGD cuts the communication share of the original EASGD from 87% to "
              "14% and scales weakly.",
              "The MLP, 2 virtual nodes x 2 ranks, network model 50 us / 1 Gbit/s; "
              "`easgd-rr` (rank 0 the master) against `easgd-sync` (lr 0.3; its sum up and "
              "its centre down binomial trees); weak scaling: `easgd-sync` at 2 and 4 ranks "
              "with batch 64 per worker. Beside them, `minidp simulate`'s prediction at "
              "SC17's scale.",
              [Job("easgd-rr", 4, ["--strategy", "easgd-rr", "--model", "mlp", *data,
                                   "--lr", "0.2", "--momentum", "0", *NETWORK], one_thread),
               Job("easgd-sync", 4, ["--strategy", "easgd-sync", "--model", "mlp", *data,
                                     "--lr", "0.3", "--momentum", "0", *NETWORK], one_thread),
               Job("easgd-sync 2 ranks", 2, ["--strategy", "easgd-sync", "--model", "mlp",
                                             *data, "--lr", "0.3", "--momentum", "0"],
                   one_thread),
               Job("easgd-sync 4 ranks", 4, ["--strategy", "easgd-sync", "--model", "mlp",
                                             *data, "--lr", "0.3", "--momentum", "0"],
                   one_thread)],
              judge_easgd),
    ]


def run_claim(claim: Claim, tmp: str, args: argparse.Namespace) -> list[str]:
    """Train the claim's jobs, write its report; the page's section as lines."""
    runs: dict[str, Run] = {}
    commands = []
    started, load = time.perf_counter(), os.getloadavg()[0]
    for k, job in enumerate(claim.jobs):
        out = os.path.join(tmp, claim.name, f"{k + 1:02d}")
        flags = [*job.flags, "--data-dir", args.data_dir, "--no-progress"]
        env = " ".join(f"{key}={value}" for key, value in job.env.items())
        commands.append(f"{env} .venv/bin/mpiexec -n {job.ranks} .venv/bin/python -m mpi4py "
                        f"-m minidp train {shlex.join(job.flags)}".strip())
        os.environ.update(job.env)
        try:
            if common.train_job(flags, out, job.ranks, args.timeout) is None:
                return [f"## {claim.name}", "", f"The job `{job.label}` failed: no verdict.",
                        ""]
        finally:
            for key in job.env:
                os.environ.pop(key)
        runs[job.label] = load_run(out)
        runs[job.label].label = job.label
    where = os.path.join(args.docs, "reproduction", claim.name)
    write_report(list(runs.values()), where)
    table = runs_table(list(runs.values()), paths=False)
    verdict = claim.verdict(runs)
    made = shlex.join([".venv/bin/python", "benchmarks/reproduce.py", *sys.argv[1:]])
    # the epochs are the table's: a claim may run its own number (DASO's schedule)
    data = (f"{args.dataset}, the first {args.train_samples} training samples (or all, if "
            "fewer)")
    return [f"## {claim.name}: {claim.paper}", "", f"**Claim.** {claim.claim}", "",
            f"**Here.** {claim.setup} Data: {data}.", "", *table, "",
            f"![accuracy](reproduction/{claim.name}/accuracy.png)", "",
            f"**Verdict.** {verdict}", "",
            f"Plots and per-epoch tables: [`reproduction/{claim.name}/report.md`]"
            f"(reproduction/{claim.name}/report.md). Commands:", "",
            *(f"    {c}" for c in commands), "",
            f"(Made by `{made}` on {time.strftime('%Y-%m-%d')} in "
            f"{time.perf_counter() - started:.0f} s; the machine's load average (1 min) was "
            f"{load:.1f} at the start and "
            f"{os.getloadavg()[0]:.1f} at the end, on {os.cpu_count()} cores shared with "
            "other jobs.)", ""]


def sections(page: str) -> dict[str, list[str]]:
    """The existing page's sections by claim name (``## NAME: ...``), as lines."""
    found: dict[str, list[str]] = {}
    name = None
    for line in page.splitlines():
        match = re.match(r"## ([\w-]+)[:\s]", line + " ")
        if match:
            name = match.group(1)
            found[name] = []
        if name is not None and not line.startswith("(The whole page took"):
            found[name].append(line)
    return found


HEADER = ("Generated by `benchmarks/reproduce.py` (do not edit by hand; `--only` regenerates "
          "the sections named and keeps the others). Seed 0, float32, batch 64 per worker, "
          "on a 2-core machine shared with other jobs: 4 ranks share 2 cores, so times "
          "compare the runs of one section with each other only; each section names its "
          "data, its command and the machine's load while it ran. Virtual nodes "
          "(`--ranks-per-node 2`) stand for cluster nodes and the network model (an "
          "alpha-beta cost on every inter-node message) for their links. Every table below "
          "is `minidp report`'s. A section without a line saying how it was made comes "
          "from the last full generation (commit 2edf58c: Fashion-MNIST, the first 30000 "
          "training samples, all 10,000 test samples, 4 epochs, DASO's 20, a quiet machine).")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", help="claims to run (default: all)")
    parser.add_argument("--dataset", default="fashion-mnist",
                        help="the data set of every job (default fashion-mnist)")
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--train-samples", type=int, default=30000)
    parser.add_argument("--daso-epochs", type=int, default=20,
                        help="epochs of the DASO claim (at least 9 for a cycling epoch)")
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per job")
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "data"))
    parser.add_argument("--docs", default=os.path.join(ROOT, "docs"))
    args = parser.parse_args()
    path = os.path.join(args.docs, "reproduction.md")
    kept = {}
    if os.path.exists(path):
        with open(path) as f:
            kept = sections(f.read())
    every = claims(args)
    unknown = sorted(set(args.only or []) - {c.name for c in every})
    if unknown:
        parser.error(f"--only: got {', '.join(unknown)}, allowed: "
                     f"{', '.join(c.name for c in every)}")
    lines = ["# Reproduction: the seed papers' claims, scaled down to one machine", "",
             HEADER, ""]
    with tempfile.TemporaryDirectory(prefix="reproduce-") as tmp:
        for claim in every:
            if args.only and claim.name not in args.only:
                lines += kept.get(claim.name, [])
                continue
            print(f"\n# {claim.name}", flush=True)
            lines += run_claim(claim, tmp, args)
    with open(path, "w") as f:
        f.write("\n".join(lines).rstrip("\n") + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
