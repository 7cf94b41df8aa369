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

Preparation writes only names where nothing is (:func:`minidp.io.filesystem.create_new`:
a whole file linked under the name, which fails if anything is there), and never
replaces a file: under a dataset's name there may be the user's own records. A file
already under one of the two names is compared, byte for byte, with what this source
prepares (:func:`differs`):

* the same bytes: it is this source's preparation (by this command, an earlier run, or
  another job at the same moment), and the other file, if missing, is written;
* other bytes: nothing is written, and the error names the file. A user's own training
  file beside a test file prepared from minidp's source would be a run that trains on
  one data set and evaluates on another without a word (PyTorch and Horovod never pair
  a user's split with another); the message says how to give the missing split, or how
  to prepare both.

A run prepares only when a file is missing (:func:`minidp.io.training_data.prepare_on_rank0`):
two files present are the user's to choose, and are used if they check.
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from minidp.io.datasets import load_dataset
from minidp.io.filesystem import open_regular
from minidp.io.mdp import HEADER_SIZE, Header, layout, parse_header, record_pieces, write_mdp

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


class PrepareError(ValueError):
    """A data set cannot be prepared in a directory: one line naming the file or directory."""


def prepare_dataset(name: str, out_dir: str, source_dir: str | None = None,
                    progress: bool = False) -> tuple[str, str]:
    """Make ``out_dir`` hold this source's ``NAME-train.mdp`` (shuffled) and ``NAME-test.mdp``.

    A missing file is written (a temporary file, fsync, then linked under its name only
    if nothing is there); a present one is kept if it holds the bytes this would write,
    and refused otherwise, before anything is written. See the module docstring.

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
        PrepareError: a file under one of the names that this source does not prepare
            (nothing is written), or a directory or file that cannot be made.
        FileNotFoundError: the source files are not found.
    """
    if not out_dir:
        raise PrepareError("dataset directory: got '', allowed: the path of a directory")
    data = load_dataset(name, source_dir if source_dir is not None else out_dir)
    if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
        raise PrepareError(f"dataset directory '{out_dir}' is not a directory; allowed: a "
                           "directory, or a path where one can be made")
    try:
        os.makedirs(out_dir, exist_ok=True)
    except OSError as exc:
        raise PrepareError(f"dataset directory '{out_dir}' cannot be made: "
                           f"{exc.strerror or exc}") from None
    paths = dataset_paths(name, out_dir)
    order = training_permutation(len(data.y_train))
    splits = [(paths[0], "training", data.x_train[order], data.y_train[order], True),
              (paths[1], "test", data.x_test, data.y_test, False)]
    present = [os.path.lexists(split[0]) for split in splits]
    for (path, _, x, y, shuffled), there in zip(splits, present):  # all checked first
        if there:
            _refuse_if_other(name, out_dir, path, paths, present,
                             differs(path, x, y, data.num_classes, shuffled))
    for (path, _, x, y, shuffled), there in zip(splits, present):
        if there:
            continue
        try:
            write_mdp(path, x, y, data.num_classes, progress=progress, shuffled=shuffled,
                      exclusive=True)
        except FileExistsError:  # another job prepared it meanwhile: the same bytes?
            _refuse_if_other(name, out_dir, path, paths, [True, True],
                             differs(path, x, y, data.num_classes, shuffled))
        except OSError as exc:  # WriteFailed: names the file and the reason
            raise PrepareError(str(exc)) from None
    return paths


def _refuse_if_other(name: str, out_dir: str, path: str, paths: tuple[str, str],
                     present: list[bool], difference: str | None) -> None:
    """Raise the refusal of a file under ``path`` that is not this source's preparation."""
    if difference is None:
        return
    missing = [p for p, there in zip(paths, present) if not there]
    message = (f"dataset {name!r}: '{path}' is not what minidp prepares from {name}'s source "
               f"({difference}); minidp never replaces a file")
    if missing:
        split = "training" if missing[0] == paths[0] else "test"
        message += (f", and it will not pair yours with a {split} set of its own: put your "
                    f"{split} records beside it as '{missing[0]}' (minidp.io.mdp.write_mdp "
                    f"writes .mdp files), or move '{path}' away and prepare both with: python "
                    f"-m minidp data prepare {name} --out {out_dir}")
    else:
        message += ": move it away, or prepare into another directory"
    raise PrepareError(message)


def differs(path: str, x: np.ndarray, y: np.ndarray, num_classes: int,
            shuffled: bool) -> str | None:
    """How the file at ``path`` differs from the one ``write_mdp`` would write, or None.

    Byte for byte: the header (every field but the payload checksum, which the records
    decide), then the records in pieces, so a file is this preparation or it is not; no
    checksum has to be trusted. Never opens what is not a regular file.
    """
    expected = layout(path, x, y, num_classes, shuffled)
    if os.path.islink(path) and not os.path.exists(path):
        return f"it is a symbolic link to '{os.readlink(path)}', where nothing is"
    try:
        with open_regular(path) as f:
            size = os.fstat(f.fileno()).st_size
            found = parse_header(path, f.read(HEADER_SIZE), size)
            if dataclasses.replace(found, checksum=(0, 0)) != expected:
                return (f"its header says {describe(found)}; this source has "
                        f"{describe(expected)}")
            for start, records in record_pieces(x, y, expected):
                want, have = records.tobytes(), f.read(records.nbytes)
                if have != want:
                    first = next((i for i, (a, b) in enumerate(zip(have, want)) if a != b),
                                 min(len(have), len(want)))
                    return f"its record {start + first // expected.record_size} differs"
    except (OSError, ValueError) as exc:
        return str(exc)
    return None


def describe(header: Header) -> str:
    """A header's shape of the data, in words, to compare two files."""
    return (f"{header.count} records of {header.sample_shape} {header.sample_dtype} samples, "
            f"{header.label_dtype} labels, {header.num_classes} classes"
            f"{', shuffled' if header.shuffled else ''}")
