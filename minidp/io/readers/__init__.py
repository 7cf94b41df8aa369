"""Readers of an .mdp file for data-parallel training: one per file, over one small base.

``reader.epoch(e)`` returns an :class:`EpochStream` of this rank's samples for epoch
``e`` in order; ``stream.take(n)`` gives the next n samples (variable sizes, for
asynchronous strategies); ``reader.iterate(e, batch_size)`` yields equal batches.
Data order is a function of (seed, epoch) only.

* ``memory`` (:mod:`~minidp.io.readers.memory`): the whole set on every rank, one global
  permutation per epoch; rank r takes slice r of every global batch, so N ranks with
  batch b see, concatenated in rank order, exactly the batches of 1 rank with batch N*b.
* ``mpiio`` (:mod:`~minidp.io.readers.mpiio`, the default): contiguous blocks, one per
  rank, rotating every epoch, each read with collective ``Iread_at_all`` calls and
  shuffled inside.
* ``leader`` (:mod:`~minidp.io.readers.leader`): "the node reads once": local rank 0 of
  each node reads the node's block into a node window (``comm.SharedArray``); every
  rank of the node copies its own disjoint slice of the shuffled block.
* ``strided`` (:mod:`~minidp.io.readers.strided`): the naive baseline, this rank's
  samples of the ``memory`` order read one record at a time with ``File.Read_at``.

What they share is :mod:`~minidp.io.readers.base`: the header's checks on every rank
(errors: bad file, too few samples, a bad batch size, raised identically on every rank,
so nothing hangs), the stream, the order, the block split and the collective open.
:func:`verify_checksum` checks a file's payload collectively (each rank its block); a
run does it when it opens its files (:mod:`minidp.io.training_data`) unless
``--no-verify``. Every collective step (open, read, close, window sync) goes through
:mod:`minidp.comm.guard`, so a rank that never comes is named after the timeout.
"""

from __future__ import annotations

from mpi4py import MPI

from minidp.io.readers.base import (
    VERIFY_PIECE,
    EpochStream,
    Reader,
    block_range,
    epoch_rng,
    first_problem,
    open_for_blocks,
    verify_checksum,
)
from minidp.io.readers.leader import LeaderReader
from minidp.io.readers.memory import MemoryReader
from minidp.io.readers.mpiio import MPIIOReader
from minidp.io.readers.strided import StridedReader

READERS = ("memory", "mpiio", "leader", "strided")
CLASSES: dict[str, type[Reader]] = {"memory": MemoryReader, "mpiio": MPIIOReader,
                                    "leader": LeaderReader, "strided": StridedReader}


def open_reader(kind: str, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                limit: int | None = None) -> Reader:
    """A reader by name: ``memory``, ``mpiio``, ``leader`` or ``strided``."""
    if kind not in CLASSES:
        raise ValueError(f"reader: got {kind!r}, allowed: {', '.join(READERS)}")
    return CLASSES[kind](path, comm, seed, limit)


__all__ = ["CLASSES", "READERS", "VERIFY_PIECE", "EpochStream", "LeaderReader",
           "MPIIOReader", "MemoryReader", "Reader", "StridedReader", "block_range",
           "epoch_rng", "first_problem", "open_for_blocks", "open_reader", "verify_checksum"]
