"""Command line: ``python -m minidp train|info|data prepare``.

Run distributed jobs under ``mpiexec -n N python -m mpi4py -m minidp train ...``; without
``-m mpi4py`` minidp installs its own hook, so an exception on one rank still aborts
every rank. Bad settings are reported by rank 0 and exit with status 2 on every rank.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys

import numpy as np

import minidp


def info(_: argparse.Namespace) -> int:
    """Print versions, MPI library, backend and thread settings."""
    import numba
    from mpi4py import MPI

    from minidp import threads

    report = {
        "minidp": minidp.__version__, "python": platform.python_version(),
        "numpy": np.__version__, "numba": numba.__version__,
        "numba_jit": not numba.config.DISABLE_JIT,
        "mpi4py": __import__("mpi4py").__version__,
        "mpi_library": MPI.Get_library_version().strip().splitlines()[0],
        "mpi_world_size": MPI.COMM_WORLD.Get_size(), "backend": minidp.get_backend(),
        "threads": threads.thread_info(),
    }
    print(json.dumps(report, indent=2))
    return 0


def data_prepare(args: argparse.Namespace) -> int:
    """Convert a data set into NAME-train.mdp and NAME-test.mdp under --out."""
    from minidp.io import load_dataset
    from minidp.io.mdp import write_mdp

    data = load_dataset(args.name, args.data_dir)
    os.makedirs(args.out, exist_ok=True)
    for split, x, y in (("train", data.x_train, data.y_train), ("test", data.x_test, data.y_test)):
        path = os.path.join(args.out, f"{args.name}-{split}.mdp")
        header = write_mdp(path, x, y, data.num_classes, progress=not args.quiet)
        print(f"{path}: {header.count} records of {header.record_size} bytes "
              f"(from {data.source})")
    return 0


def phase_table(history: list[dict]) -> str:
    """A short table: accuracy, wall time and seconds per phase for every epoch.

    Phases are the maximum over ranks; "comm %" is the largest share of one rank's
    epoch spent communicating or waiting (comm_intra + comm_inter + wait).
    """
    from minidp.trace import PHASES

    head = ["epoch", "test acc", "wall s", *PHASES, "comm %"]
    rows = []
    for m in history:
        comm = m["comm_s"]
        rows.append([str(m["epoch"]), f"{m['test_accuracy']:.2%}", f"{m['wall_s']:.1f}",
                     *(f"{m['phases'][p]:.2f}" for p in PHASES),
                     f"{comm / m['wall_s']:.0%}"])
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(head)]
    lines = [" | ".join(h.rjust(w) for h, w in zip(head, widths)),
             "-|-".join("-" * w for w in widths)]
    lines += [" | ".join(c.rjust(w) for c, w in zip(r, widths)) for r in rows]
    return "\n".join(lines)


def train(args: argparse.Namespace) -> int:
    """Run one training job (every rank); rank 0 prints epochs and the phase table."""
    from mpi4py import MPI

    from minidp.comm import guard
    from minidp.config import from_args
    from minidp.train import Trainer

    guard.install_abort_hook()
    rank = MPI.COMM_WORLD.Get_rank()
    try:
        config = from_args(args)
    except (ValueError, TypeError, OSError) as exc:
        if rank == 0:
            print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        trainer = Trainer(config)
        if rank == 0:
            t = trainer.topology
            print(f"minidp train: {config.strategy} on {t.size} rank(s) = {t.num_nodes} node(s) "
                  f"x {t.local_size}, {config.model} on {config.dataset} ({trainer.batches} "
                  f"batches of {trainer.batch_size} per rank per epoch), out: {config.out}",
                  flush=True)
        summary = trainer.fit()
    except (ValueError, TypeError, OSError, FloatingPointError) as exc:
        # Setup checks raise alike on every rank; anything else must not leave the other
        # ranks waiting in a collective, so a job of several ranks is aborted.
        print(f"error: {exc}", file=sys.stderr, flush=True)
        if MPI.COMM_WORLD.Get_size() > 1:
            MPI.COMM_WORLD.Abort(2)
        return 2
    if rank == 0:
        print(phase_table(summary["epochs"]))
        print(f"final test accuracy {summary['final']['test_accuracy']:.2%} after "
              f"{summary['wall_s']:.1f} s; bytes sent intra {summary['bytes_sent']['intra']:,}, "
              f"inter {summary['bytes_sent']['inter']:,}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m minidp``."""
    from minidp.io.datasets import DATASETS

    parser = argparse.ArgumentParser(prog="python -m minidp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, MPI, backend, threads").set_defaults(run=info)
    from minidp.config import build_parser

    train_parser = sub.add_parser("train", help="train a model with a distributed strategy")
    build_parser(train_parser).set_defaults(run=train)
    data = sub.add_parser("data", help="dataset files").add_subparsers(dest="action",
                                                                       required=True)
    prep = data.add_parser("prepare", help="write NAME-train.mdp and NAME-test.mdp")
    prep.add_argument("name", choices=DATASETS)
    prep.add_argument("--out", default="data", help="output directory (default data/)")
    prep.add_argument("--data-dir", default="data", help="where source files are looked for")
    prep.add_argument("--quiet", action="store_true", help="no progress bar")
    prep.set_defaults(run=data_prepare)
    args = parser.parse_args(argv)
    try:
        return args.run(args)
    except (FileNotFoundError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
