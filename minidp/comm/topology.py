"""Topology: who shares a node with whom, and the communicators built from it.

::

    world    all ranks
    node     ranks sharing memory: Split_type(COMM_TYPE_SHARED), or virtual nodes of
             ranks_per_node consecutive ranks (so P nodes x G ranks run on one machine)
    cross    the "rail": the ranks with this rank's local rank on every node
    leaders  local rank 0 of every node (the rail of local rank 0), None elsewhere

Nodes must be even (every node the same size): every hierarchical mean in minidp is
then a mean of equal groups. An uneven layout is a clear error on every rank.
"""

from __future__ import annotations

from mpi4py import MPI

from minidp.comm import guard


class Topology:
    """Communicators and numbers of a P-nodes x G-ranks layout.

    Args:
        comm: the world communicator (default ``MPI.COMM_WORLD``).
        ranks_per_node: build virtual nodes of this many consecutive ranks; None uses the
            real shared-memory nodes.
    """

    def __init__(self, comm: MPI.Comm | None = None, ranks_per_node: int | None = None) -> None:
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        if ranks_per_node is None:
            self.node = self.world.Split_type(MPI.COMM_TYPE_SHARED, key=self.rank)
        else:
            if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or \
                    ranks_per_node < 1 or self.size % ranks_per_node:
                raise ValueError(f"rank {self.rank}: ranks_per_node {ranks_per_node!r} must be "
                                 f"a positive divisor of the world size {self.size}")
            self.node = self.world.Split(self.rank // ranks_per_node, key=self.rank)
        self.local_rank, self.local_size = self.node.Get_rank(), self.node.Get_size()
        sizes = self.world.allgather(self.local_size)
        if len(set(sizes)) > 1:
            raise ValueError(f"rank {self.rank}: uneven nodes (ranks per node {sorted(set(sizes))}"
                             "); run the same number of ranks on every node or pass "
                             "ranks_per_node")
        self.cross = self.world.Split(self.local_rank, key=self.rank)
        self.leaders = self.cross if self.local_rank == 0 else None
        self.num_nodes = self.cross.Get_size()
        self.node_id = self.node.bcast(self.cross.Get_rank() if self.local_rank == 0 else None)
        # Names appear in timeout and debug messages.
        self.node.Set_name(f"node {self.node_id}")
        self.cross.Set_name(f"rail {self.local_rank}")
        guard.ensure_board(self.world)

    @property
    def is_leader(self) -> bool:
        """Whether this rank is local rank 0 of its node."""
        return self.local_rank == 0

    def describe(self) -> dict:
        """Numbers for summaries and logs."""
        return {"world_size": self.size, "num_nodes": self.num_nodes,
                "ranks_per_node": self.local_size}

    def free(self) -> None:
        """Free the communicators this topology created."""
        self.cross.Free()
        self.node.Free()
