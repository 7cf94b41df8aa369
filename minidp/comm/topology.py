"""Topology: which ranks are servers and which are workers, who shares a node with whom.

::

    world    all ranks
    role     "server" (ranks 0..K-1 when a strategy asks for K servers) or "worker"
    workers  the worker ranks (the world itself when there are no servers); None on servers
    node     the workers sharing memory: Split_type(COMM_TYPE_SHARED), or virtual nodes
             of ranks_per_node consecutive world ranks (so P nodes x G ranks run on one
             machine); None on servers
    cross    the "rail": the workers with this worker's local rank on every node
    leaders  local rank 0 of every node (the rail of local rank 0), None elsewhere
    workspace  the scratch arrays and windows its collectives reuse (Workspace)
    arrows   the trace's arrows: messages and collectives counted so that both ends of
             one carry the same id (minidp.comm.arrows); lane(): the rank's trace lane

Placement is decided over the whole world, servers included: at 4 ranks as 2 x 2 with
one server, node 0 holds the server (rank 0) and worker 1, node 1 workers 2 and 3.
``node_of(rank)`` gives any world rank's node, so point-to-point traffic is counted
and charged by the level it crosses. ``node_id``, ``num_nodes``, ``local_rank`` and
``local_size`` describe the worker nodes (a node holding only servers has none).

Without servers, nodes must be even (every node the same size): every hierarchical
mean in minidp is then a mean of equal groups, and an uneven layout is a clear error
on every rank. With servers the worker nodes may be uneven; the parameter-server
strategies do not average over nodes.

Virtual nodes must lie inside real ones, since a node's window is shared memory: on
several hosts, a ``ranks_per_node`` that would put one node on two machines is refused
on every rank, naming the machines and the values allowed. :func:`machines` lists the
real nodes (hosts and their ranks), for ``minidp info`` and ``run.json``.
"""

from __future__ import annotations

import platform
from collections import Counter
from typing import Any

import numpy as np
from mpi4py import MPI

from minidp import threads
from minidp.comm import guard
from minidp.comm.arrows import Arrows, Group
from minidp.comm.shared import Workspace

ROLES = ("worker", "server")
_SET_UP = "topology set-up"  # what a timeout says a rank was waiting in


Communicator = MPI.Comm  # for type hints outside comm, which never imports mpi4py


def mpi_library() -> str:
    """The first line of the MPI library's version string (without Open MPI's trailing NUL)."""
    return MPI.Get_library_version().replace("\x00", "").strip().splitlines()[0]


def versions() -> dict[str, str]:
    """minidp, Python, NumPy and mpi4py versions (run.json, summary.json, ``info``)."""
    import mpi4py

    import minidp

    return {"minidp": minidp.__version__, "python": platform.python_version(),
            "numpy": np.__version__, "mpi4py": mpi4py.__version__}


def _span(ranks) -> str:
    """``ranks 2-3`` or ``rank 2``, for messages."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {ranks[0]}-{ranks[-1]}"


def _places(comm: MPI.Comm, machine: MPI.Comm, operation: str) -> list[tuple[int, str]]:
    """For every rank of ``comm``: (the first rank of its machine, the machine's name)."""
    first = guard.bcast_object(machine, comm.Get_rank() if machine.Get_rank() == 0 else None,
                               0, operation)
    return guard.allgather_object(comm, (first, MPI.Get_processor_name()), operation)


def machines(comm: MPI.Comm | None = None) -> list[dict[str, Any]]:
    """The real nodes of ``comm``: MPI's shared-memory groups, whatever ``--ranks-per-node``.

    Collective. One ``{"host": name, "ranks": [ranks of comm]}`` per node, in the order of
    their first ranks; the name is ``MPI.Get_processor_name()`` (the hostname with MPICH).
    ``minidp info`` and ``run.json`` report them.
    """
    comm = comm if comm is not None else MPI.COMM_WORLD
    machine = guard.collective(comm, "find machines", comm.Split_type, MPI.COMM_TYPE_SHARED,
                               key=comm.Get_rank())
    places = _places(comm, machine, "find machines")
    guard.collective(machine, "find machines", machine.Free)
    nodes: dict[int, dict[str, Any]] = {}
    for rank, (first, host) in enumerate(places):
        nodes.setdefault(first, {"host": host, "ranks": []})["ranks"].append(rank)
    return list(nodes.values())


def _layout_refused(ranks_per_node: object, size: int) -> str:
    """Why ``--ranks-per-node`` cannot split the job's ``size`` ranks, and how to fix it."""
    allowed = ", ".join(str(g) for g in range(1, size + 1) if size % g == 0)
    fix = ""
    if isinstance(ranks_per_node, int) and not isinstance(ranks_per_node, bool) and \
            ranks_per_node >= 1:
        larger = -(-size // ranks_per_node) * ranks_per_node  # the next multiple of it
        fix = (f", or launch a multiple of {ranks_per_node} ranks (mpiexec -n {larger}, "
               f"{larger + ranks_per_node}, ...)")
    return (f"--ranks-per-node: got {ranks_per_node!r} for the job's {size} ranks (mpiexec "
            f"-n {size}), allowed: a divisor of {size} ({allowed}), so that the virtual "
            f"nodes of that many consecutive ranks are all full; give one of those{fix}")


class Topology:
    """Roles, communicators and numbers of a P-nodes x G-ranks layout.

    Args:
        comm: the world communicator (default ``MPI.COMM_WORLD``).
        ranks_per_node: build virtual nodes of this many consecutive ranks; None uses the
            real shared-memory nodes.
        servers: how many ranks (the first ones) take the server role.
    """

    def __init__(self, comm: MPI.Comm | None = None, ranks_per_node: int | None = None,
                 servers: int = 0) -> None:
        self.world = comm if comm is not None else MPI.COMM_WORLD
        self.rank, self.size = self.world.Get_rank(), self.world.Get_size()
        if isinstance(servers, bool) or not isinstance(servers, int) or servers < 0:
            raise ValueError(f"rank {self.rank}: servers: got {servers!r}, allowed: an int >= 0")
        if servers >= self.size:
            raise ValueError(f"rank {self.rank}: the strategy needs {servers} server rank(s), "
                             f"and a world of {self.size} rank(s) needs at least one worker "
                             f"besides them: launch at least {servers + 1} ranks")
        self.num_servers = servers
        self.server_ranks = list(range(servers))
        self.worker_ranks = list(range(servers, self.size))
        self.role = "server" if self.rank < servers else "worker"
        # First, so that every step of the set-up below can name a rank that never comes.
        guard.ensure_board(self.world)
        world_node = self._world_node(ranks_per_node)
        # The rank's index on its machine (virtual nodes aside): which GPU it takes.
        machine = world_node if ranks_per_node is None else self._machine()
        if ranks_per_node is not None:
            self._refuse_nodes_across_machines(ranks_per_node, machine)
        self.host_rank = machine.Get_rank()
        guard.set_oversubscribed(machine.Get_size() * threads.threads_per_rank() >
                                 threads.available_cores())
        if machine is not world_node:
            guard.collective(machine, _SET_UP, machine.Free)
        leaders = guard.allgather_object(
            self.world, self.rank if world_node.Get_rank() == 0 else None, _SET_UP)
        first = guard.bcast_object(
            world_node, self.rank if world_node.Get_rank() == 0 else None, 0, _SET_UP)
        node_index = {r: i for i, r in enumerate(x for x in leaders if x is not None)}
        self.nodes_of_ranks = guard.allgather_object(self.world, node_index[first], _SET_UP)
        guard.collective(world_node, _SET_UP, world_node.Free)
        self._build_worker_levels()
        self.workspace = Workspace(self.node, self.rank)
        self.arrows = Arrows(self.rank, self._groups())
        # Names appear in timeout and debug messages.
        if self.node is not None:
            self.node.Set_name(f"node {self.node_id}")
            self.cross.Set_name(f"rail {self.local_rank}")

    def _machine(self) -> MPI.Comm:
        """The ranks that share this rank's memory (its real node)."""
        return guard.collective(self.world, _SET_UP, self.world.Split_type,
                                MPI.COMM_TYPE_SHARED, key=self.rank)

    def _refuse_nodes_across_machines(self, ranks_per_node: int, machine: MPI.Comm) -> None:
        """Virtual nodes must lie inside real ones: a node's window is shared memory.

        On one machine every virtual node does; on several hosts, ``--ranks-per-node``
        larger than a host's ranks (or not dividing them) would put one node's window
        across hosts, which MPI refuses deep inside the first allocation.
        """
        places = _places(self.world, machine, _SET_UP)

        def inside(start: int, size: int) -> bool:
            return len({first for first, _ in places[start:start + size]}) == 1

        for start in range(0, self.size, ranks_per_node):
            if inside(start, ranks_per_node):
                continue
            block = range(start, start + ranks_per_node)
            hosts: dict[str, list[int]] = {}
            for r in block:
                hosts.setdefault(places[r][1], []).append(r)
            allowed = [g for g in range(1, self.size + 1) if self.size % g == 0 and
                       all(inside(s, g) for s in range(0, self.size, g))]
            raise ValueError(
                f"rank {self.rank}: --ranks-per-node {ranks_per_node}: virtual node "
                f"{start // ranks_per_node} ({_span(block)}) spans machines ("
                + "; ".join(f"{_span(r)} on {h}" for h, r in hosts.items())
                + f"), but a node's ranks share memory; allowed here: "
                f"{', '.join(map(str, allowed))}, or none to take MPI's nodes")

    def _world_node(self, ranks_per_node: int | None) -> MPI.Comm:
        if ranks_per_node is None:
            return self._machine()
        if isinstance(ranks_per_node, bool) or not isinstance(ranks_per_node, int) or \
                ranks_per_node < 1 or self.size % ranks_per_node:
            raise ValueError(f"rank {self.rank}: {_layout_refused(ranks_per_node, self.size)}")
        return self._split(self.rank // ranks_per_node)

    def _split(self, color: int) -> MPI.Comm:
        """``world.Split`` by ``color`` (``MPI.UNDEFINED``: none), ordered by world rank."""
        return guard.collective(self.world, _SET_UP, self.world.Split, color, key=self.rank)

    def _build_worker_levels(self) -> None:
        """workers, node, cross and leaders over the worker ranks (None on servers)."""
        worker = self.role == "worker"
        if self.num_servers:
            split = self._split(0 if worker else MPI.UNDEFINED)
            self.workers = split if worker else None
        else:
            self.workers = self.world
        color = self.nodes_of_ranks[self.rank] if worker else MPI.UNDEFINED
        node = self._split(color)
        self.node = node if worker else None
        self.local_rank = node.Get_rank() if worker else 0
        self.local_size = node.Get_size() if worker else 0
        sizes = guard.allgather_object(self.world, self.local_size if worker else None,
                                       _SET_UP)
        worker_sizes = sorted({s for s in sizes if s is not None})
        if not self.num_servers and len(worker_sizes) > 1:
            raise ValueError(f"rank {self.rank}: uneven nodes: MPI placed {worker_sizes} "
                             "ranks on the job's machines, and every hierarchical mean is "
                             "a mean of equal nodes; launch the same number of ranks on "
                             "every machine (mpiexec's placement), or give --ranks-per-node G "
                             f"with G dividing the {self.size} ranks (virtual nodes of G "
                             "consecutive ranks)")
        cross = self._split(self.local_rank if worker else MPI.UNDEFINED)
        self.cross = cross if worker else None
        self.leaders = self.cross if worker and self.local_rank == 0 else None
        node_ids = sorted({self.nodes_of_ranks[r] for r in self.worker_ranks})
        self.num_nodes = len(node_ids)
        self.node_id = node_ids.index(self.nodes_of_ranks[self.rank]) if worker else None

    def _groups(self) -> dict[str, Group]:
        """This rank's communicators as the trace's arrows name them (minidp.comm.arrows).

        Their world ranks are computed from ``nodes_of_ranks``, as the splits above
        ordered them, so every member names the same ranks without a message.
        """
        groups = {"world": Group("world", list(range(self.size)))}
        if self.role != "worker":
            return groups
        nodes: dict[int, list[int]] = {}
        for r in self.worker_ranks:
            nodes.setdefault(self.nodes_of_ranks[r], []).append(r)
        groups["node"] = Group(f"node {self.node_id}", nodes[self.nodes_of_ranks[self.rank]])
        k = self.local_rank
        groups["rail"] = Group(f"rail {k}", [members[k] for _, members in sorted(nodes.items())
                                             if k < len(members)])
        if k == 0:
            groups["leaders"] = groups["rail"]  # the same communicator: one count
        return groups

    def lane(self) -> tuple[str, int]:
        """This rank's lane in the trace: its name, and its place (grouped by node)."""
        node = self.nodes_of_ranks[self.rank]
        role = " (server)" if self.role == "server" else ""
        return f"node {node} / rank {self.rank}{role}", node * self.size + self.rank

    @property
    def is_leader(self) -> bool:
        """Whether this rank is a worker of local rank 0 on its node."""
        return self.role == "worker" and self.local_rank == 0

    @property
    def num_workers(self) -> int:
        """How many ranks train (the world minus the servers)."""
        return self.size - self.num_servers

    def node_of(self, rank: int) -> int:
        """The node (over the whole world, servers included) that world rank ``rank`` is on."""
        return self.nodes_of_ranks[rank]

    def level(self, peer: int) -> str:
        """``"intra"`` if world rank ``peer`` shares this rank's node, else ``"inter"``."""
        return "intra" if self.node_of(peer) == self.node_of(self.rank) else "inter"

    def describe(self) -> dict:
        """Numbers for summaries and logs."""
        per_node = Counter(self.nodes_of_ranks)
        return {"world_size": self.size, "num_nodes": len(per_node),
                "worker_nodes": self.num_nodes, "ranks_per_node": max(per_node.values()),
                "servers": self.num_servers, "workers": self.num_workers}

    def free(self) -> None:
        """Free the workspace's windows and the communicators this topology created."""
        self.workspace.free()
        # Each is freed collectively by the ranks that hold it (None on servers).
        for comm in (self.cross, self.node):
            if comm is not None:
                guard.collective(comm, "free topology", comm.Free)
        if self.num_servers and self.workers is not None:
            guard.collective(self.workers, "free topology", self.workers.Free)
