"""The epoch's end on every rank: one set of statistics, the consensus model evaluated.

After a worker's batches (or a server's ``serve``), every rank of the world takes part
in these steps, each collective over the world, so that the model a run reports, saves
and checkpoints is one model:

* :func:`average_buffers`: the BatchNorm statistics averaged over the workers (the
  servers hold none of their own);
* :func:`evaluate`: the strategy's consensus parameters (``Strategy.consensus()``: the
  replicas' common parameters, a server's shards, an elastic centre) put into the
  model, each rank its contiguous block of the test set, the sums reduced;
* :func:`consensus_state`: that model's ``state_dict`` (``model.npz``).

The model the strategy trains keeps its own parameters: the consensus is put in for
the evaluation and taken out again (:func:`consensus_parameters`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import numpy as np

from minidp import Tensor, layers, no_grad
from minidp import functional as F
from minidp.comm import Topology, allreduce
from minidp.io.training_data import TrainingData
from minidp.run.replica import HostCompute
from minidp.strategies import Strategy


def world_sum(values: np.ndarray, topology: Topology) -> np.ndarray:
    """The sum over the world of a few numbers (in float64), on every rank."""
    return allreduce(values.astype(np.float64), topology, "mpi")


def average_buffers(strategy: Strategy, topology: Topology, is_worker: bool) -> None:
    """BatchNorm statistics: averaged over the workers at each epoch's end (one model)."""
    buffers = strategy.float_buffers()
    if not buffers:
        return
    flat = np.concatenate([b.reshape(-1) for b in buffers]).astype(np.float64)
    if not is_worker:
        flat[...] = 0  # servers hold no statistics of their own
    flat = world_sum(flat, topology) / topology.num_workers
    offset = 0
    for b in buffers:
        b[...] = flat[offset:offset + b.size].reshape(b.shape)
        offset += b.size


@contextlib.contextmanager
def consensus_parameters(strategy: Strategy) -> Iterator[None]:
    """Inside: the model holds the strategy's consensus parameters; after: its own.

    Nothing is written where the consensus is the parameters themselves: DASO's node
    ranks may share them (one replica in a node window).
    """
    flat, consensus = strategy.flat, strategy.consensus()
    if consensus is flat.data:
        yield
        return
    own = flat.data.copy()
    flat.data[...] = consensus
    try:
        yield
    finally:
        flat.data[...] = own


def evaluate(compute: HostCompute, data: TrainingData, strategy: Strategy,
             topology: Topology, dtype: np.dtype) -> tuple[float, float]:
    """(mean loss, accuracy) of the consensus model: each rank its test block, sums reduced.

    Args:
        compute: where forward runs (the host model, or its replica on this rank's GPU).
        data: the run's data (this rank's block of the test set).
        strategy: whose consensus parameters are evaluated.
        topology: the world the sums are reduced over.
        dtype: the model's dtype.
    """
    sums, model = np.zeros(3), compute.model
    with consensus_parameters(strategy), no_grad():
        compute.parameters_to_device()
        compute.buffers_to_device()
        model.eval()
        for batch in data.test_batches(dtype):
            x, y = compute.inputs(*batch)
            out = model(Tensor(x))
            sums[0] += F.cross_entropy(out, y, reduction="sum").item()
            sums[1] += int((out.data.argmax(axis=1) == y).sum())
            sums[2] += len(y)
    model.train()
    total = world_sum(sums, topology)
    return float(total[0] / total[2]), float(total[1] / total[2])


def consensus_state(model: layers.Module, strategy: Strategy) -> dict[str, np.ndarray]:
    """The result model's state_dict (the strategy's consensus parameters)."""
    with consensus_parameters(strategy):
        return {k: np.array(v) for k, v in model.state_dict().items()}
