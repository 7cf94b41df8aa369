"""``leader``: "the node reads once": one rank per node reads, the node's ranks share it out.

Local rank 0 of each node reads the node's contiguous block (rotating over the nodes
every epoch) with one collective read (``Iread_at_all``) among the leaders, into a
node window (:class:`~minidp.comm.SharedArray`, the shared memory the strategies use
too); every rank of the node then copies its own disjoint slice of the shuffled block.
"""

from __future__ import annotations

import numpy as np
from mpi4py import MPI

from minidp.comm import SharedArray, guard
from minidp.comm.topology import Topology
from minidp.io.mdp import HEADER_SIZE, decode, label_problem
from minidp.io.readers.base import (
    EpochStream,
    Reader,
    block_range,
    epoch_rng,
    first_problem,
    open_for_blocks,
)


class LeaderReader(Reader):
    """One reader per node fills a shared-memory window; the node's ranks share it out.

    Nodes are real (``Split_type(COMM_TYPE_SHARED)``) or virtual (``ranks_per_node``
    consecutive ranks); a Trainer passes its own ``topology`` (over the workers), so no
    second set of communicators is built. The node's block lies across the window's G
    segments (contiguous, in rank order: one array for the leader to fill). A window
    sync (:meth:`SharedArray.sync`) comes before the leader writes (no rank still copies
    last epoch's data) and after (the data is visible to the whole node).
    """

    def __init__(self, path: str, comm: MPI.Comm | None = None, seed: int = 0,
                 limit: int | None = None, ranks_per_node: int | None = None,
                 topology: Topology | None = None) -> None:
        super().__init__(path, comm, seed, limit)
        self.owns_topology = topology is None
        self.topology = t = Topology(self.comm, ranks_per_node) if topology is None \
            else topology
        largest = -(-self.count // t.num_nodes) * self.header.record_size
        self.window = SharedArray(t.node, -(-largest // t.local_size), np.uint8)
        self.shared = self.window.whole.reshape(-1)[:largest]

    def block_of(self, epoch: int) -> int:
        """The block this rank's node reads in ``epoch``."""
        return (self.topology.node_id + epoch) % self.topology.num_nodes

    def epoch(self, epoch: int, batch_size: int = 1) -> EpochStream:
        """This rank's disjoint slice of its node's shuffled block."""
        rs = self.header.record_size
        start, stop = block_range(self.block_of(epoch), self.topology.num_nodes,
                                  self.count)
        nbytes = (stop - start) * rs
        leaders = self.topology.leaders
        self.window.sync()  # every rank of the node is done with last epoch's block
        problem = None
        if self.topology.is_leader:  # as in MPIIOReader.read_block: every step timed
            problem = first_problem(leaders, self.changed(), "dataset file check")
            if problem is None:
                fh = open_for_blocks(leaders, self.path)
                there = max(0, min(nbytes, fh.Get_size() - HEADER_SIZE - start * rs))
                guard.wait(fh.Iread_at_all(HEADER_SIZE + start * rs, self.shared[:there]),
                           leaders, "read dataset block")
                short = self.short_read(HEADER_SIZE + start * rs, HEADER_SIZE + stop * rs,
                                        fh.Get_size()) if stop > start else None
                guard.collective(leaders, "close dataset file", fh.Close)
                problem = short or self.changed() or label_problem(
                    self.path, self.shared[:there], self.header, start)
        self.window.sync()  # the leader's block is visible to the whole node
        self.agree_whole(problem)
        order = epoch_rng(self.seed, epoch, self.topology.node_id).permutation(stop - start)
        n, k = self.samples_per_rank, self.topology.local_rank
        records = self.shared[:nbytes].view(self.header.record_dtype)
        return EpochStream(*decode(records[order[k * n:(k + 1) * n]], self.header))

    def free(self) -> None:
        """Release the shared window and communicators (collective on the node)."""
        self.window.free()
        if self.owns_topology:
            self.topology.free()
