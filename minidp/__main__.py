"""Command line: ``python -m minidp info`` and ``python -m minidp data prepare NAME --out DIR``."""

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


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m minidp``."""
    from minidp.io.datasets import DATASETS

    parser = argparse.ArgumentParser(prog="python -m minidp", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="versions, MPI, backend, threads").set_defaults(run=info)
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
