"""Turning a named data set into its two .mdp files, the training records shuffled once.

``python -m minidp data prepare NAME --out DIR`` and the automatic preparation at the
start of training both end here, so a data set is prepared one way only:

* ``NAME-train.mdp``: the source's training records, permuted once by
  ``np.random.default_rng(PREPARE_SEED)``; its header says ``shuffled=True`` (flag bit 0).
* ``NAME-test.mdp``: the source's test records in the source's order; ``shuffled=False``.

Why shuffle the training file once, at preparation:

1. Sources come ordered. ``mnist-5k`` is sorted by class, so its first 1,000 training
   records are digits 0-2 only, and ``--train-samples N`` takes the first N records.
2. The ``mpiio`` reader (:mod:`minidp.io.readers`) gives each rank one contiguous block
   of the file per epoch, read with one collective call; blocks rotate between epochs
   and samples are shuffled inside a block, but never across blocks. On a sorted file,
   4 ranks would each see 2-3 digits for a whole epoch: the local models of the
   strategies that synchronise rarely (``hsgd``, ``daso``) drift apart between
   synchronisations, and per-rank batch statistics (BatchNorm) are skewed. The
   ``leader`` reader's per-node blocks have the same problem.
3. A permutation applied once when the file is written costs nothing at run time and
   keeps every rank's read contiguous: any block and any prefix of the shuffled file is
   a uniform sample of the classes.

The permutation depends only on ``PREPARE_SEED`` and the number of training records, so
preparing the same source twice gives byte-identical files, and every run (whatever its
``--seed``) reads the same file. The test split stays in the source's order: evaluation
reads all of it, so order does not change the metrics, and the test file keeps matching
the source record for record.
"""

from __future__ import annotations

import os

import numpy as np

from minidp.io.datasets import load_dataset
from minidp.io.mdp import write_mdp

# "mini" in ASCII; fixed so that a prepared file is a function of its source alone.
PREPARE_SEED = 0x6D696E69


def dataset_paths(name: str, data_dir: str) -> tuple[str, str]:
    """Paths of the prepared files of data set ``name`` in ``data_dir``.

    Args:
        name: data set name, e.g. ``"mnist-5k"``.
        data_dir: directory holding the .mdp files.

    Returns:
        ``(DATA_DIR/NAME-train.mdp, DATA_DIR/NAME-test.mdp)``.
    """
    return (os.path.join(data_dir, f"{name}-train.mdp"),
            os.path.join(data_dir, f"{name}-test.mdp"))


def training_permutation(count: int) -> np.ndarray:
    """The fixed order in which ``count`` training records are written.

    Args:
        count: number of training records in the source.

    Returns:
        A permutation of ``range(count)`` drawn by ``np.random.default_rng(PREPARE_SEED)``;
        record ``i`` of the prepared file is source record ``permutation[i]``.
    """
    return np.random.default_rng(PREPARE_SEED).permutation(count)


def prepare_dataset(name: str, out_dir: str, source_dir: str | None = None,
                    progress: bool = False) -> tuple[str, str]:
    """Load a data set and write ``NAME-train.mdp`` (shuffled) and ``NAME-test.mdp``.

    Each file is written atomically by :func:`minidp.io.mdp.write_mdp` (temporary file,
    fsync, rename), so a failed preparation never leaves a half-written file.

    Args:
        name: data set name, one of :data:`minidp.io.datasets.DATASETS`.
        out_dir: directory for the two .mdp files; created if missing.
        source_dir: where the source files are looked for (see
            :func:`minidp.io.datasets.load_dataset`); ``None`` looks in ``out_dir``.
        progress: print a progress bar per file on stderr.

    Returns:
        ``(train_path, test_path)``, as :func:`dataset_paths` gives them.

    Raises:
        ValueError: an unknown data set name, a corrupt source, or labels outside
            [0, num_classes).
        FileNotFoundError: the source files are not found.
    """
    data = load_dataset(name, source_dir if source_dir is not None else out_dir)
    os.makedirs(out_dir, exist_ok=True)
    train_path, test_path = dataset_paths(name, out_dir)
    order = training_permutation(len(data.y_train))
    write_mdp(train_path, data.x_train[order], data.y_train[order], data.num_classes,
              progress=progress, shuffled=True)
    write_mdp(test_path, data.x_test, data.y_test, data.num_classes, progress=progress)
    return train_path, test_path
