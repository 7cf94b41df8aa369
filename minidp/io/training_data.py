"""Opening a run's data: prepare missing files once, check every rank sees them, open readers.

The training file is read by the workers only (a server rank takes no samples): the
reader splits it over ``topology.workers``. The test file is split over the whole world,
so every rank, servers included, evaluates a contiguous block and the sums are reduced.

Both files' checksums are verified when they are opened (unless ``--no-verify``), over
the whole world, servers included: every rank then reaches the same verdict, and a
corrupt file is one error, the same on every rank (exit 2), instead of a run that trains
on it without a word. The cost is one read of each file, split over the ranks
(docs/reliability.md gives it). The two files must describe one task: the same number
of classes, sample shape and sample dtype (the model is built from the training file's
header, and a sample dtype decides the normalisation).

The files are the run's for the whole run. Every rank stamps both when it reads their
headers (:class:`minidp.io.filesystem.Stamp`: device, inode, size, mtime, header CRC),
and every epoch (:meth:`TrainingData.batches`, collective over the world) the workers
read their samples, then every rank compares both paths' stamps with its own and the
world agrees: a file moved in or written in place since the run opened it stops the
run, with one message naming the file on every rank (exit 2), before anything of that
epoch is trained or saved. The checkpoints' record of the files (:func:`file_identity`)
is therefore what the run trained on. A problem with one worker's read (a file cut
short, a label out of range) is agreed the same way, servers included, so it ends the
job as one error and not as an abort.
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

from minidp.comm import Topology, guard
from minidp.io.datasets import NORMALIZATION, normalize
from minidp.io.filesystem import Stamp, changed
from minidp.io.mdp import Header, OldVersion, decode, open_header
from minidp.io.prepare import PrepareError, dataset_paths, prepare_dataset
from minidp.io.readers import (
    EpochStream,
    LeaderReader,
    MPIIOReader,
    Reader,
    epoch_rng,
    first_problem,
    open_reader,
    verify_checksum,
)

if TYPE_CHECKING:
    from mpi4py import MPI

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
        stamps: each file's stamp when this rank read its header (``path: Stamp``),
            compared at every epoch; none: nothing compared.
        world: the communicator over which the ranks agree on the files every epoch;
            None: this rank alone (a replay).
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
    stamps: dict[str, Stamp] = dataclasses.field(default_factory=dict)
    world: MPI.Comm | None = None

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

    def batches(self, epoch: int, batch_size: int, dtype: np.dtype,
                asked_by: str) -> Batches | None:
        """This worker's batches of ``epoch`` (``batch_size``: the reader's unit); None on a server.

        Collective over ``world``: every rank calls it at the start of every epoch, and
        the ranks agree that the workers' reads went well and that both files are the
        ones the run opened (:meth:`check_files`).

        Raises:
            ValueError: on every rank alike: a file changed, a read or a label that failed
                on some worker (the first in rank order).
        """
        stream, problem = None, None
        if self.reader is not None:
            try:
                stream = self.reader.epoch(epoch, batch_size)
            except (OSError, ValueError) as exc:  # the reader's agreed error, or its own
                problem = re.sub(r"^rank \d+: ", "", str(exc))
        self.check_files(problem)
        return None if stream is None else Batches(stream, self, dtype, epoch, asked_by)

    def check_files(self, problem: str | None = None) -> None:
        """Raise on every rank if a rank has ``problem``, or finds a file no longer the same.

        Each rank compares the paths' stamps with those it took when it read the
        headers, then the ranks of ``world`` compare their findings (one small
        allgather), so a change one rank sees stops all of them with its message.
        """
        for path, opened in self.stamps.items():
            problem = problem or changed(path, opened)
        if self.world is not None:
            problem = first_problem(self.world, problem, "dataset files check")
        if problem:
            raise ValueError(f"rank {self.rank}: {problem}")

    def test_batches(self, dtype: np.dtype) -> Iterator[tuple[Any, np.ndarray]]:
        """This rank's test block in batches of :data:`TEST_BATCH`, normalised."""
        for i in range(0, len(self.test_y), TEST_BATCH):
            yield (self.normalized(self.test_x[i:i + TEST_BATCH], dtype),
                   self.test_y[i:i + TEST_BATCH])


def prepare_on_rank0(dataset: str, data_dir: str, topology: Topology) -> tuple[str, str]:
    """Rank 0 prepares the .mdp files when one is missing; every rank learns if it failed.

    Only a missing name is written, and only next to a file that is this source's
    preparation (:func:`minidp.io.prepare.prepare_dataset`); two present files are used
    as they are, if they check when opened.

    Raises:
        ValueError: on every rank: a present file that is not this source's preparation,
            beside a missing one (the message names both and says what to do).
        FileNotFoundError: on every rank: the missing file(s) cannot be prepared (no
            source, a directory that cannot be written); the message names them.
    """
    paths = dataset_paths(dataset, data_dir)
    error = None
    missing = [p for p in paths if not os.path.lexists(p)]  # a link counts, even dangling
    if topology.rank == 0 and missing:
        try:
            prepare_dataset(dataset, data_dir)
        except PrepareError as exc:
            error = ("refused", str(exc))
        except (OSError, ValueError) as exc:
            names = " and ".join(f"'{p}'" for p in missing)
            error = ("failed", f"dataset {dataset!r}: {names} missing, and rank 0 could not "
                               f"prepare {'it' if len(missing) == 1 else 'them'}: {exc}")
    error = guard.bcast_object(topology.world, error, 0, "prepare dataset")
    if error:
        kind, message = error
        raise (ValueError if kind == "refused" else FileNotFoundError)(
            f"rank {topology.rank}: {message}")
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
        (train_header, train_stamp), (test_header, test_stamp) = (open_header(p) for p in paths)
        headers = [train_header, test_header]
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
    one_task(paths, headers, topology.rank)
    count = _limit("--train-samples", train_samples, train, headers[0])
    _limit("--test-samples", test_samples, test, headers[1])
    if verify:
        for path, header in zip(paths, headers):
            verify_checksum(path, header, topology.world)
    if count < topology.num_workers:
        raise ValueError(f"rank {topology.rank}: dataset file '{train}' has {count} samples, "
                         f"fewer than the {topology.num_workers} workers")
    train_reader = None
    try:  # a worker's reader may fail alone (the memory reader reads the file): agreed below
        if topology.role == "worker" and reader == "leader":
            train_reader = LeaderReader(train, topology.workers, seed, train_samples,
                                        topology=topology)
        elif topology.role == "worker":
            train_reader = open_reader(reader, train, topology.workers, seed, train_samples)
    except (OSError, ValueError) as exc:
        problem = re.sub(r"^rank \d+: ", "", str(exc))
    problem = first_problem(topology.world, problem, "dataset reader")
    if problem:
        raise ValueError(f"rank {topology.rank}: {problem}")
    tests = MPIIOReader(test, topology.world, limit=test_samples)
    x, y = decode(np.concatenate(tests.read_block(0) or [np.empty(0, np.uint8)]),
                  tests.header)
    identity = {split: file_identity(p, h) for split, p, h in zip(("train", "test"), paths,
                                                                    headers)}
    data = TrainingData(train_reader, headers[0], identity, count // topology.num_workers, x,
                        y, dataset, seed, topology.rank, topology.size,
                        {train: train_stamp, test: test_stamp}, topology.world)
    data.check_files()  # what was verified and read is what the headers were read from
    return data


def one_task(paths: tuple[str, str], headers: list[Header], rank: int) -> None:
    """Refuse training and test files that disagree on classes, sample shape or dtype.

    The model is built from the training file's header: a test file of other classes
    would be scored against outputs that mean something else, one of another shape would
    fail in the first evaluation, and one of another sample dtype would be normalised
    otherwise (uint8 samples are scaled by 1/255, others not).
    """
    (train, test), (a, b) = paths, headers
    if (a.num_classes, a.sample_shape, a.sample_dtype) == (b.num_classes, b.sample_shape,
                                                           b.sample_dtype):
        return
    raise ValueError(f"rank {rank}: dataset files disagree: '{train}' has {a.num_classes} "
                     f"classes and samples of shape {a.sample_shape} and dtype "
                     f"{a.sample_dtype}, '{test}' has {b.num_classes} classes and samples of "
                     f"shape {b.sample_shape} and dtype {b.sample_dtype}; a run trains and "
                     "evaluates one task: both files must have the same number of classes, "
                     "sample shape and sample dtype")
