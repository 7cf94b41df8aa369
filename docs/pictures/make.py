"""Draw every strategy page's picture: a real 4-rank run's first steps, who sends what to whom.

    .venv/bin/python docs/pictures/make.py            # every picture
    .venv/bin/python docs/pictures/make.py daso asgd  # some of them
    .venv/bin/python docs/pictures/make.py --work runs/pictures  # the runs kept there

For each picture it trains one small job of 4 ranks (2 nodes x 2, virtual nodes of
``--ranks-per-node 2``; one server and three workers for the server strategies), MLP on
the synthetic dataset, then runs ``minidp report RUN --steps N`` and copies the run's
``messages.png`` to ``docs/pictures/NAME.png``. Each job's command is printed, and it is
the one under the picture on its page. Times in a picture are this machine's: another
machine, or another load, draws other lengths, the same arrows.
"""

from __future__ import annotations

import argparse
import os
import shlex
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, ROOT)

from minidp.__main__ import main  # noqa: E402 (the repository's minidp, whatever is installed)
from minidp.reporting.launcher import mpiexec, run_job  # noqa: E402

COMMON = ["--dataset", "synthetic", "--model", "mlp", "--batch-size", "16",
          "--ranks-per-node", "2", "--no-progress", "--seed", "1"]
# name: (what the page shows, train flags, steps drawn). 4 ranks each; 2 x 2 nodes.
PICTURES = {
    "sync": ("sync, hierarchical allreduce", ["--strategy", "sync", "--allreduce",
                                              "hierarchical", "--train-samples", "320"], 3),
    "hsgd": ("hsgd", ["--strategy", "hsgd", "--train-samples", "320"], 3),
    "hbsgd": ("hbsgd, k=2", ["--strategy", "hbsgd", "--set", "hbsgd.k=2",
                             "--train-samples", "320"], 4),
    # Epoch 1 (steps 1-2) warms up, blocking; epoch 2 (steps 3-4) cycles with (4, 1, 1).
    "daso": ("daso", ["--strategy", "daso", "--epochs", "3", "--set", "daso.warmup_epochs=1",
                      "--set", "daso.cooldown_epochs=1", "--train-samples", "128"], 4),
    "asgd": ("asgd", ["--strategy", "asgd", "--train-samples", "240"], 3),
    "softsync": ("softsync", ["--strategy", "softsync", "--train-samples", "240"], 3),
    "dbs": ("dbs", ["--strategy", "dbs", "--train-samples", "240"], 3),
    "hogwild": ("hogwild", ["--strategy", "hogwild", "--train-samples", "320"], 3),
    "easgd-rr": ("easgd-rr", ["--strategy", "easgd-rr", "--train-samples", "240"], 3),
    "easgd-async": ("easgd-async", ["--strategy", "easgd-async", "--train-samples", "240"], 3),
    "easgd-sync": ("easgd-sync", ["--strategy", "easgd-sync", "--train-samples", "320"], 3),
}
TIMEOUT_S = 1200.0  # a hang guard on a loaded machine, never a target


def command(name: str, data: str, out: str) -> list[str]:
    """The training job of picture ``name`` (printed, and shown under the picture)."""
    flags = PICTURES[name][1]
    return [mpiexec(), "-n", "4", sys.executable, "-m", "mpi4py", "-m", "minidp", "train",
            *COMMON, "--test-samples", "160", "--data-dir", data, *flags, "--out", out]


def make(name: str, work: str) -> str:
    """Train picture ``name``'s job in ``work`` and draw it into docs/pictures; the path."""
    steps = PICTURES[name][2]
    out = os.path.join(work, name)
    job = command(name, os.path.join(work, "data"), out)
    if os.path.exists(out):  # a --work directory's earlier run of it: replaced, by minidp
        job.append("--overwrite")
    print(f"$ {shlex.join(job)}", flush=True)
    status, output = run_job(job, TIMEOUT_S, env=dict(os.environ, PYTHONPATH=ROOT))
    if status != 0:
        raise SystemExit(f"{name}: the job failed (exit {status}):\n{output[-3000:]}")
    print(f"$ python -m minidp report {out} --out {out}-report --steps {steps}", flush=True)
    return redraw(name, work)


def redraw(name: str, work: str) -> str:
    """Draw picture ``name`` again from the run a ``--work`` directory kept; the path."""
    title, _, steps = PICTURES[name]
    out, report = os.path.join(work, name), os.path.join(work, f"{name}-report")
    if main(["report", out, "--out", report, "--steps", str(steps)]) != 0:
        raise SystemExit(f"{name}: the report failed")
    path = os.path.join(HERE, f"{name}.png")
    shutil.copyfile(os.path.join(report, "messages.png"), path)
    print(f"{title}: wrote {os.path.relpath(path, ROOT)}", flush=True)
    return path


def run(argv: list[str]) -> int:
    """Make the pictures named (every one when none is); 2 on an unknown name."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", metavar="NAME", help=", ".join(PICTURES))
    parser.add_argument("--work", metavar="DIR", help="keep the runs here (default: a "
                        "temporary directory, removed)")
    parser.add_argument("--redraw", action="store_true", help="draw again from the runs "
                        "in --work, without training")
    args = parser.parse_args(argv)
    unknown = [n for n in args.names if n not in PICTURES]
    if unknown or args.redraw and not args.work:
        print(f"error: make.py: got {', '.join(unknown) or '--redraw without --work'}, "
              f"allowed: {', '.join(PICTURES)}; --redraw with --work", file=sys.stderr)
        return 2
    names = args.names or list(PICTURES)
    if args.work:
        os.makedirs(args.work, exist_ok=True)
        for name in names:
            (redraw if args.redraw else make)(name, args.work)
        return 0
    with tempfile.TemporaryDirectory(prefix="minidp-pictures-") as work:
        for name in names:
            make(name, work)
    return 0


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
