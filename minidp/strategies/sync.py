"""``sync``: the "native distributed strategy", flat synchronous data-parallel SGD."""

from __future__ import annotations

from minidp.comm import allreduce
from minidp.strategies.base import Strategy


class SyncSGD(Strategy):
    """Average every gradient over all ranks every step, then the same local update.

    What PyTorch DDP and Horovod do, and the baseline every other strategy is measured
    against. With identical starting parameters (broadcast from rank 0) and identical
    updates, every replica stays bit-for-bit equal.

    Communication, per step::

        1. allreduce(grad, mean) over the world by the selected algorithm
           (``--allreduce``; default ``mpi``: MPI's own flat allreduce, the baseline;
           ``hierarchical``: node slices in the shared window, then the rails, with
           the gradient buffer this rank's segment of the window (``grad_buffer``, a
           NodeBuffer), so zero-copy: what ``hsgd`` runs).
           Every rank waits here for the slowest.
        2. optimizer.step() locally: no communication.

    One rank: the allreduce is the identity and this is plain SGD. One node: with
    ``hierarchical`` only the shared-memory level runs.
    """

    name = "sync"
    stops_between_batches = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.gradients_in_shared_memory()

    def step(self, batch: int) -> None:
        """Average the gradients over every rank, then update."""
        self.steps += 1
        allreduce(self.grad_buffer, self.topology, self.algorithm, op="mean")
        self.optimizer_step()
