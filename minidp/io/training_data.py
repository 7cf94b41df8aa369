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
from collections.abc import Iterator
from typing import Any

import numpy as np

from minidp.comm import Topology, guard
from minidp.io.datasets import NORMALIZATION, normalize
from minidp.io.mdp import Header, OldVersion, decode, read_header
from minidp.io.prepare import dataset_paths, prepare_dataset
from minidp.io.readers import (
    EpochStream,
    LeaderReader,
    MPIIOReader,
    Reader,
    epoch_rng,
    open_reader,
    verify_checksum,
)

TEST_BATCH = 1000  # samples per forward pass of the evaluation


class Batches:
    """A worker's batches of one epoch, normalised and in the run's dtype.

    A worker faster than its share of an epoch (an asynchronous strategy gives it more
    batches than its shard holds) starts another pass over its shard, in the order of
    ``epoch_rng(seed, epoch, rank + passes * world size)``, so every pass of every rank
    has its own order and a resumed run draws the same ones.

    Args:
        stream: the rank's shard of the epoch (:meth:`Reader.epoch`).
        data: the run's data (its dataset names the normalisation).
        dtype: the model's dtype.
        epoch: the epoch (0-based), for the next passes' order.
        asked_by: who asks for the batches (the strategy), for the error message.
    """

    def __init__(self, stream: EpochStream, data: TrainingData, dtype: np.dtype, epoch: int,
                 asked_by: str) -> None:
        self.stream, self.data, self.dtype = stream, data, dtype
        self.epoch, self.asked_by, self.passes = epoch, asked_by, 0

    def skip(self, samples: int) -> None:
        """Continue after ``samples`` samples (an epoch resumed between batches)."""
        self.stream.position = samples

    def take(self, n: int) -> tuple[Any, Any]:
        """The next ``n`` samples (normalised, in ``dtype``) and their labels."""
        d = self.data
        batch = self.stream.take(n)
        if batch is None:  # faster than its share (asynchronous): another pass
            self.passes += 1
            self.stream.rewind(epoch_rng(d.seed, self.epoch, d.rank + self.passes * d.ranks))
            batch = self.stream.take(n)
        if batch is None:
            raise ValueError(f"rank {d.rank}: batch of {n} samples asked by {self.asked_by}, "
                             f"but this worker's shard holds {self.stream.remaining}; use "
                             "fewer workers or smaller batches")
        return d.normalized(batch[0], self.dtype), batch[1]


@dataclasses.dataclass
class TrainingData:
    """What the Trainer reads: the training reader (None on servers) and this rank's test block.

    Attributes:
        reader: the training file's reader (None on a server rank).
        header: the training file's header.
        identity: what a checkpoint records of each file (:func:`file_identity`), under
            ``train`` and ``test``.
        samples_per_worker: the training samples of one worker per epoch.
        test_x: this rank's contiguous block of the test set (raw).
        test_y: its labels.
        dataset: the dataset's name (its normalisation).
        seed: the run's seed (the order of extra passes).
        rank: this rank in the world.
        ranks: the world's size.
    """

    reader: Reader | None
    header: Header
    identity: dict[str, dict[str, Any]]
    samples_per_worker: int
    test_x: np.ndarray
    test_y: np.ndarray
    dataset: str
    seed: int
    rank: int
    ranks: int

    def batches_per_epoch(self, batch_size: int) -> int:
        """A worker's batches of ``batch_size`` per epoch; a batch above its share is an error."""
        if batch_size > self.samples_per_worker:
            raise ValueError(f"rank {self.rank}: batch size {batch_size} for {self.dataset!r}: "
                             f"allowed 1 to {self.samples_per_worker} (samples per worker per "
                             "epoch)")
        return self.samples_per_worker // batch_size

    def normalized(self, x: Any, dtype: np.dtype) -> Any:
        """Samples as the model takes them: the dataset's normalisation, in ``dtype``."""
        mean, std = NORMALIZATION[self.dataset]
        return normalize(x, mean, std).astype(dtype, copy=False)

    def batches(self, epoch: int, batch_size: int, dtype: np.dtype, asked_by: str) -> Batches:
        """This worker's batches of ``epoch`` (``batch_size``: the reader's unit)."""
        return Batches(self.reader.epoch(epoch, batch_size), self, dtype, epoch, asked_by)

    def test_batches(self, dtype: np.dtype) -> Iterator[tuple[Any, np.ndarray]]:
        """This rank's test block in batches of :data:`TEST_BATCH`, normalised."""
        for i in range(0, len(self.test_y), TEST_BATCH):
            yield (self.normalized(self.test_x[i:i + TEST_BATCH], dtype),
                   self.test_y[i:i + TEST_BATCH])


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


def file_identity(path: str, header: Header) -> dict[str, Any]:
    """What tells one dataset file from another: its header's and its payload's checksums.

    A checkpoint records it (:mod:`minidp.run.checkpoint`), so ``--resume`` refuses a
    file rewritten with other records, whatever its name; the path is kept for messages.
    """
    return {"path": path, "header_checksum": header.sealed_checksum,
            "payload_checksum": list(header.checksum)}


def _limit(flag: str, value: int | None, path: str, header: Header) -> int:
    """The records a run uses of the file: ``--train-samples``/``--test-samples`` or all."""
    if value is None:
        return header.count
    if value > header.count:
        raise ValueError(f"{flag}: got {value}, allowed: 1 to {header.count} (the records in "
                         f"'{path}'), or unset for all of them")
    return value


def open_training_data(dataset: str, data_dir: str, reader: str, seed: int,
                       train_samples: int | None, test_samples: int | None,
                       topology: Topology, verify: bool = True) -> TrainingData:
    """Prepare (rank 0, if missing), check on every rank, and open the run's data.

    ``verify``: check both files' payload checksums collectively (``--no-verify``: skip).

    Raises:
        FileNotFoundError: the files cannot be prepared, or some ranks cannot read them
            (the message names those ranks: every rank must see the same ``data_dir``).
        ValueError: on every rank: a file every rank finds unusable (an older format
            version: the message gives the command that prepares it again), a checksum
            mismatch (the file and its byte range), or a sample limit above the file's
            records.
    """
    paths = prepare_on_rank0(dataset, data_dir, topology)
    problem = None
    try:
        headers = [read_header(p) for p in paths]
    except OldVersion as exc:
        problem = f"{exc}: python -m minidp data prepare {dataset} --out {data_dir}"
    except (OSError, ValueError) as exc:
        problem = str(exc)
    problems = guard.allgather_object(topology.world, problem, "check dataset files")
    bad = [r for r, p in enumerate(problems) if p]
    if len(bad) == topology.size and len(set(problems)) == 1:
        raise ValueError(f"rank {topology.rank}: {problems[0]}")
    if bad:
        raise FileNotFoundError(f"rank {topology.rank}: dataset files unusable on rank(s) "
                                f"{', '.join(map(str, bad))}: {problems[bad[0]]}; every rank "
                                "must read the same --data-dir (a shared file system)")
    train, test = paths
    count = _limit("--train-samples", train_samples, train, headers[0])
    _limit("--test-samples", test_samples, test, headers[1])
    if verify:
        for path, header in zip(paths, headers):
            verify_checksum(path, header, topology.world)
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
    identity = {split: file_identity(p, h) for split, p, h in zip(("train", "test"), paths,
                                                                    headers)}
    return TrainingData(train_reader, headers[0], identity, count // topology.num_workers, x,
                        y, dataset, seed, topology.rank, topology.size)
