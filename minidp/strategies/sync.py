"""``sync``: the "native distributed strategy", flat synchronous data-parallel SGD."""

from __future__ import annotations

from minidp.comm import world_mean
from minidp.strategies.base import Strategy


class SyncSGD(Strategy):
    """Average every gradient over all ranks every step, then the same local update.

    What PyTorch DDP and Horovod do, and the baseline every other strategy is measured
    against. With identical starting parameters (broadcast from rank 0) and identical
    updates, every replica stays bit-for-bit equal.

    Which allreduce a default run takes: ``--allreduce`` (this class's ``allreduce``
    argument) defaults to ``mpi``, MPI's own flat ``Iallreduce`` on the world, the
    baseline. ``minidp.comm.allreduce`` called without an algorithm defaults to
    ``hierarchical`` instead (what ``hsgd`` runs); ``sync`` always passes its own.

    Communication, per step::

        1. world_mean(grad): allreduce(grad, mean) over the world by ``--allreduce``
           (default ``mpi``: comm/allreducers/mpi.py; ``hierarchical``: node slices in
           the shared window, then the rails, with the gradient buffer this rank's
           segment of the window (``grad_buffer``, a NodeBuffer), so zero-copy:
           comm/allreducers/hierarchical.py). Every rank waits here for the slowest.
        2. optimizer.step() locally: w <- w - lr g (optim/sgd.py), no communication.

    One rank: the allreduce is the identity and this is plain SGD. One node: with
    ``hierarchical`` only the shared-memory level runs.
    """

    name = "sync"
    default_rates = (0.02, 0.9)  # momentum SGD, as every synchronous strategy
    any_world_size = True  # every replica holds the same state: any number of ranks resumes
    stops_between_batches = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()

    def step(self, batch: int) -> None:
        """Average the gradients over every rank, then update."""
        self.steps += 1
        world_mean(self.grad_buffer, self.topology, self.algorithm)
        self.optimizer_step()
