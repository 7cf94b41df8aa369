"""Opening a run's data: prepare missing files once, check every rank sees them, open readers.

The training file is read by the workers only (a server rank takes no samples): the
reader splits it over ``topology.workers``. The test file is split over the whole world,
so every rank, servers included, evaluates a contiguous block and the sums are reduced.

Both files' checksums are verified when they are opened (unless ``--no-verify``), over
the whole world, servers included: every rank then reaches the same verdict, and a
corrupt file is one error, the same on every rank (exit 2), instead of a run that trains
on it without a word. The cost is one read of each file, split over the ranks
(docs/reliability.md gives it).
"""

from __future__ import annotations

import dataclasses
import os

import numpy as np

from minidp.comm import Topology, guard
from minidp.io.mdp import Header, decode, read_header
from minidp.io.prepare import dataset_paths, prepare_dataset
from minidp.io.readers import LeaderReader, MPIIOReader, Reader, open_reader, verify_checksum


@dataclasses.dataclass
class TrainingData:
    """What the Trainer reads: the training reader (None on servers) and this rank's test block."""

    reader: Reader | None
    header: Header
    samples_per_worker: int
    test_x: np.ndarray
    test_y: np.ndarray


def prepare_on_rank0(dataset: str, data_dir: str, topology: Topology) -> tuple[str, str]:
    """Rank 0 prepares the .mdp files when one is missing; every rank learns if it failed."""
    paths = dataset_paths(dataset, data_dir)
    error = None
    if topology.rank == 0 and not all(os.path.exists(p) for p in paths):
        try:
            prepare_dataset(dataset, data_dir)
        except (OSError, ValueError) as exc:
            error = str(exc)
    message = guard.bcast_object(topology.world, error, 0, "prepare dataset")
    if message:
        raise FileNotFoundError(f"rank {topology.rank}: dataset {dataset!r}: no .mdp files "
                                f"in '{data_dir}' and rank 0 could not prepare them: {message}")
    return paths


def open_training_data(dataset: str, data_dir: str, reader: str, seed: int,
                       train_samples: int | None, test_samples: int | None,
                       topology: Topology, verify: bool = True) -> TrainingData:
    """Prepare (rank 0, if missing), check on every rank, and open the run's data.

    ``verify``: check both files' payload checksums collectively (``--no-verify``: skip).

    Raises:
        FileNotFoundError: the files cannot be prepared, or some rank cannot read them
            (the message names those ranks: every rank must see the same ``data_dir``).
        ValueError: on every rank: a checksum mismatch (the file and its byte range).
    """
    paths = prepare_on_rank0(dataset, data_dir, topology)
    problem = None
    try:
        headers = [read_header(p) for p in paths]
    except (OSError, ValueError) as exc:
        problem = str(exc)
    problems = guard.allgather_object(topology.world, problem, "check dataset files")
    bad = [r for r, p in enumerate(problems) if p]
    if bad:
        raise FileNotFoundError(f"rank {topology.rank}: dataset files unusable on rank(s) "
                                f"{', '.join(map(str, bad))}: {problems[bad[0]]}; every rank "
                                "must read the same --data-dir (a shared file system)")
    train, test = paths
    if verify:
        for path, header in zip(paths, headers):
            verify_checksum(path, header, topology.world)
    count = headers[0].count if train_samples is None else min(train_samples, headers[0].count)
    if count < topology.num_workers:
        raise ValueError(f"rank {topology.rank}: dataset file '{train}' has {count} samples, "
                         f"fewer than the {topology.num_workers} workers")
    train_reader = None
    if topology.role == "worker":
        if reader == "leader":
            train_reader = LeaderReader(train, topology.workers, seed, train_samples,
                                        topology=topology)
        else:
            train_reader = open_reader(reader, train, topology.workers, seed, train_samples)
    tests = MPIIOReader(test, topology.world, limit=test_samples)
    x, y = decode(np.concatenate(tests.read_block(0) or [np.empty(0, np.uint8)]),
                  tests.header)
    return TrainingData(train_reader, headers[0], count // topology.num_workers, x, y)
