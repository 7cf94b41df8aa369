"""The simulator's cost formulas: messages, shared-memory passes, an epoch per strategy.

Arithmetic only; :mod:`minidp.simulate` measures the inputs. Every time is the critical
path of the job: the synchronous strategies meet at every collective, so their ranks
move in lockstep and one rank's time is everyone's. Three kinds of cost make a step:

* compute: the measured single-core step, times the node's oversubscription (ranks per
  core, at least 1);
* shared memory, inside a node: ``passes`` sweeps over a buffer at the measured seconds
  per byte, times the oversubscription (the ranks sharing a core do this work in turn),
  plus ``syncs`` sync points: a node barrier, or the meeting of a blocking collective
  (``Node.sync_s`` each; it includes waiting for a descheduled peer when ranks
  outnumber cores);
* network, between nodes: alpha-beta, ``latency + bytes / bandwidth`` per message
  (:class:`minidp.comm.network.NetworkModel`), summed over the rounds of the
  algorithm; a round that stays inside every node costs shared-memory time instead.
  Each rank has a link of its own by default, as in minidp's network model; with fewer
  links per node (``Cluster.links``), the ranks of a node that send across at once
  share them, and the bytes term grows by flows / links.

Two rules for what crosses the network (``Cluster.rule``):

* ``mpich``: what MPICH 4-5 does on a real cluster. Its ``Iallreduce`` (coll_selection.json)
  runs recursive doubling up to 2048 bytes or fewer elements than the power of two
  below the ranks, else Rabenseifner's reduce-scatter (recursive halving) + allgather
  (recursive doubling); both fold a non-power-of-two world first. Rounds are walked
  pair by pair with ranks placed node by node, so only rounds whose pairs cross nodes pay
  alpha-beta. minidp's own ``ring`` crosses nodes on every step.
* ``emulated``: what minidp's network model charges a run on one machine
  (:mod:`minidp.comm.network`): a flat allreduce over N ranks on P > 1 nodes as a whole
  by the algorithm's stated traffic (``mpi`` and ``ring``: 2(N-1) messages of n/N;
  ``recursive_doubling``: one whole buffer per round), a rail as a ring over the P
  nodes; the operation lasts the longer of the charge and its real (shared-memory) time.
"""

from __future__ import annotations

import dataclasses
from collections import Counter, deque
from collections.abc import Sequence

from minidp.comm.network import NetworkModel, ring_traffic
from minidp.strategies import DASO, HierarchicalBulkSGD, HierarchicalSGD, SyncSGD
from minidp.strategies.daso_schedule import BatchSchedule

RULES = ("mpich", "emulated")
FLAT_ALGORITHMS = ("mpi", "ring", "recursive_doubling")
WORLD_ALGORITHMS = (*FLAT_ALGORITHMS, "hierarchical", "hierarchical_leader")
SHORT_MESSAGE = 2048  # bytes: MPICH's Iallreduce switches from doubling to halving above


@dataclasses.dataclass(frozen=True)
class Node:
    """One node of the simulated cluster, off the network.

    Attributes:
        step_s: one training step (data, forward, backward, optimizer) on one core.
        byte_s: seconds per byte of one sweep over a buffer (``a += b``; copies count
            as a sweep too).
        sync_s: one sync point: a node barrier, or the ranks of a blocking collective
            meeting (with more ranks than cores, waiting for a descheduled peer).
        ranks: ranks per node (G).
        cores: cores those ranks share.
    """

    step_s: float
    byte_s: float
    sync_s: float
    ranks: int
    cores: float

    @property
    def share(self) -> float:
        """Oversubscription: ranks per core, at least 1."""
        return max(1.0, self.ranks / self.cores)

    def compute(self) -> float:
        """One step's computation with the node's cores shared."""
        return self.step_s * self.share

    def shm(self, passes: float, nbytes: float, syncs: int = 0) -> float:
        """``passes`` sweeps over ``nbytes`` (cores shared) and ``syncs`` sync points."""
        return passes * nbytes * self.byte_s * self.share + syncs * self.sync_s


@dataclasses.dataclass(frozen=True)
class Cluster:
    """P nodes of G ranks, a network, the rule for what crosses it, links per node."""

    nodes: int
    node: Node
    network: NetworkModel
    rule: str = "mpich"
    links: float | None = None  # None: one per rank (minidp's network model)

    @property
    def ranks(self) -> int:
        """All ranks, N = P x G."""
        return self.nodes * self.node.ranks

    def message(self, nbytes: float, crosses: bool, flows: int = 1) -> float:
        """One message: alpha-beta between nodes; inside, a copy in and out of shared memory.

        ``flows``: messages leaving the busiest node at the same time, sharing its links.
        """
        if not crosses:
            return self.node.shm(2, nbytes)
        links = self.node.ranks if self.links is None else self.links
        return self.network.seconds(1, nbytes * max(1.0, flows / links))


def mpich_algorithm(ranks: int, nbytes: float, itemsize: int) -> str:
    """The algorithm MPICH's ``Iallreduce`` picks (its coll_selection.json)."""
    pof2 = 1 << (ranks.bit_length() - 1)
    if nbytes <= SHORT_MESSAGE or nbytes // itemsize < pof2:
        return "recursive doubling"
    return "Rabenseifner"


def _pairwise(cluster: Cluster, homes: Sequence[int], nbytes: float, halving: bool,
              concurrent: int = 1) -> float:
    """Critical path of recursive doubling (whole buffer per round) or Rabenseifner.

    ``homes[r]`` is the node of rank r; ``concurrent`` collectives like this one run at
    once on the same nodes (the rails). Every round costs its slowest pair; a reducing
    round adds one sweep over what was received.
    """
    p = len(homes)
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2

    def round_cost(pairs: list[tuple[int, int]], size: float) -> float:
        leaving = Counter(homes[r] for a, b in pairs if homes[a] != homes[b] for r in (a, b))
        flows = concurrent * max(leaving.values(), default=0)
        return cluster.message(size, flows > 0, flows) + cluster.node.shm(1, size)

    # MPICH's fold: in the first 2*rem ranks each even rank hands its buffer to the odd
    # one above and gets the result back at the end.
    total = 2 * round_cost([(2 * i, 2 * i + 1) for i in range(rem)], nbytes) if rem else 0.0
    real = [2 * i + 1 if i < rem else i + rem for i in range(pof2)]
    for k in range(pof2.bit_length() - 1):
        mask = 1 << k
        pairs = [(real[i], real[i ^ mask]) for i in range(pof2) if i < i ^ mask]
        if halving:  # reduce-scatter round k moves n / 2^(k+1); its allgather mirror too
            total += 2 * round_cost(pairs, nbytes / (2 << k))
        else:
            total += round_cost(pairs, nbytes)
    return total


def flat_allreduce(cluster: Cluster, homes: Sequence[int], algorithm: str, nbytes: float,
                   itemsize: int, concurrent: int = 1) -> float:
    """A flat allreduce (``mpi``, ``ring``, ``recursive_doubling``) over ranks on ``homes``.

    ``concurrent``: how many such allreduces share the nodes' links at once.
    """
    p = len(homes)
    if p < 2 or nbytes == 0:
        return 0.0
    across = len(set(homes)) > 1
    if cluster.rule == "emulated" and across:
        # The charge runs alongside the real operation, which stays on one machine.
        traffic = (_doubling_traffic(p, nbytes) if algorithm == "recursive_doubling"
                   else ring_traffic(p, int(nbytes)))
        real = flat_allreduce(cluster, [0] * p, algorithm, nbytes, itemsize)
        return max(cluster.network.seconds(*traffic), real)
    if algorithm == "ring":
        # Every step of the ring crosses nodes once there are two (ranks placed node by
        # node: one rank of each node sends across).
        return 2 * (p - 1) * cluster.message(nbytes / p, across, concurrent) + \
            (p - 1) * cluster.node.shm(1, nbytes / p)
    halving = algorithm == "mpi" and mpich_algorithm(p, nbytes, itemsize) == "Rabenseifner"
    return _pairwise(cluster, homes, nbytes, halving, concurrent)


def _doubling_traffic(ranks: int, nbytes: float) -> tuple[int, float]:
    """The charge minidp puts on recursive doubling: a whole buffer per round (+1 unless 2^k)."""
    rounds = (ranks.bit_length() - 1) + (0 if ranks & (ranks - 1) == 0 else 1)
    return rounds, rounds * nbytes


def rail_allreduce(cluster: Cluster, nbytes: float, itemsize: int, rails: int = 1) -> float:
    """A rail's allreduce of ``nbytes`` over the P nodes, ``rails`` rails at once."""
    if cluster.rule == "emulated" and cluster.nodes > 1:
        # minidp charges a rail as a ring over the P nodes, whatever MPICH runs (network.py)
        charge = cluster.network.seconds(*ring_traffic(cluster.nodes, int(nbytes)))
        return max(charge, flat_allreduce(cluster, [0] * cluster.nodes, "mpi", nbytes, itemsize))
    return flat_allreduce(cluster, range(cluster.nodes), "mpi", nbytes, itemsize, rails)


def node_allreduce(cluster: Cluster, nbytes: float, zero_copy: bool = True) -> float:
    """comm.node_allreduce (mean): G-1 of G slices summed and copied back, two syncs."""
    g = cluster.node.ranks
    if g < 2:
        return 0.0
    copies = 0 if zero_copy else 2  # into the scratch window and back
    return cluster.node.shm(2 * (g - 1) / g + 1 + copies, nbytes, syncs=2)


def node_broadcast(cluster: Cluster, nbytes: float) -> float:
    """comm.node_broadcast: MPICH's shared-memory Ibcast, a copy in and out, one sync."""
    return cluster.node.shm(2, nbytes, syncs=1) if cluster.node.ranks > 1 else 0.0


def world_allreduce(cluster: Cluster, algorithm: str, nbytes: float, itemsize: int,
                    zero_copy: bool = True) -> float:
    """comm.allreduce(op="mean") over the world by ``algorithm``."""
    g = cluster.node.ranks
    if cluster.ranks < 2:
        return 0.0
    mean = cluster.node.shm(1, nbytes)
    meet = cluster.node.sync_s  # the ranks of the world, or of each rail, meet: a sync point
    if algorithm in FLAT_ALGORITHMS:
        homes = [r // g for r in range(cluster.ranks)]
        return flat_allreduce(cluster, homes, algorithm, nbytes, itemsize) + meet + mean
    copies = 0 if zero_copy else 2
    if algorithm == "hierarchical":
        # node slices (sum), rails on n/G each, slices copied back; two node syncs
        node = cluster.node.shm((g - 1) / g * 2 + copies, nbytes, syncs=2)
        rails = rail_allreduce(cluster, nbytes / g, itemsize, rails=g)
    elif algorithm == "hierarchical_leader":
        # the leader sums G rows and writes the result back into G rows; two node syncs
        node = cluster.node.shm(2 * g + copies, nbytes, syncs=2)
        rails = rail_allreduce(cluster, nbytes, itemsize)
    else:
        raise ValueError(f"--allreduce: got {algorithm!r}, allowed: "
                         f"{', '.join(WORLD_ALGORITHMS)}")
    return node + (rails + meet if cluster.nodes > 1 else 0.0) + mean


@dataclasses.dataclass(frozen=True)
class Epoch:
    """A predicted epoch: its batches, and the seconds computing and communicating."""

    strategy: str
    setting: str  # what distinguishes it: the allreduce, K, DASO's phase and (B,S,L)
    batches: int
    compute_s: float
    comm_s: float
    phase: str = ""  # the part of a run it predicts (DASO: blocking, cycling); "": all

    @property
    def label(self) -> str:
        """Strategy and setting, as the tables show them."""
        return f"{self.strategy} {self.setting}".strip()

    @property
    def seconds(self) -> float:
        """Wall time of the epoch."""
        return self.compute_s + self.comm_s

    @property
    def comm_share(self) -> float:
        """Share of the epoch not spent computing (the Trainer's comm + wait phases)."""
        return self.comm_s / self.seconds if self.seconds else 0.0


def make_epoch(strategy: str, setting: str, cluster: Cluster, batches: int,
               comm_s: float, phase: str = "") -> Epoch:
    """The epoch of ``batches`` steps: the node's compute each, and ``comm_s`` in all."""
    return Epoch(strategy, setting, batches, batches * cluster.node.compute(), comm_s, phase)


def sync_epoch(cluster: Cluster, batches: int, nbytes: float, itemsize: int,
               algorithm: str) -> Epoch:
    """sync: the gradient allreduce (mean) every step; the buffer is in the node window."""
    step = world_allreduce(cluster, algorithm, nbytes, itemsize)
    return make_epoch(SyncSGD.name, algorithm, cluster, batches, batches * step)


def hsgd_epoch(cluster: Cluster, batches: int, nbytes: float, itemsize: int,
               options: dict) -> Epoch:
    """hsgd: gradients through node and rails every step, or periodic parameter averages."""
    if options["average"] == "gradients":
        step = world_allreduce(cluster, "hierarchical", nbytes, itemsize)
        return make_epoch(HierarchicalSGD.name, "gradients", cluster, batches, batches * step)
    p1, p2 = options["level1_period"], options["level2_period"]
    world = world_allreduce(cluster, "hierarchical", nbytes, itemsize, zero_copy=False)
    node = node_allreduce(cluster, nbytes, zero_copy=False)
    level2 = batches // p2 + (1 if batches % p2 else 0)  # + the epoch's closing average
    level1 = batches // p1 - batches // p2
    return make_epoch(HierarchicalSGD.name, f"parameters ({p1},{p2})", cluster, batches,
                      level2 * world + level1 * node)


def hbsgd_epoch(cluster: Cluster, batches: int, nbytes: float, itemsize: int, k: int) -> Epoch:
    """hbsgd: node gradient average every step, model average over nodes every K steps.

    Counted for the first epoch: batches // K averages, one more at its end unless K
    divides the batches (later epochs differ by at most one).
    """
    averages = (batches // k + (1 if batches % k else 0)) if cluster.nodes > 1 else 0
    comm = batches * node_allreduce(cluster, nbytes) + averages * world_allreduce(
        cluster, "hierarchical", nbytes, itemsize, zero_copy=False)
    return make_epoch(HierarchicalBulkSGD.name, f"k={k}", cluster, batches, comm)


def daso_epoch(cluster: Cluster, batches: int, nbytes: float, itemsize: int,
               values: tuple[int, int, int]) -> Epoch:
    """daso: the batches of one epoch with (B, S, L) = ``values``, plan by plan.

    Drives DASO's own :class:`BatchSchedule`. A send starts the rail's sum (its charge
    runs from there); a merge waits for what of it the batches since have not covered,
    then three sweeps; a blocking send waits for all of it, then two sweeps; a node
    broadcast makes the node wait for its rail. One node: node sync only.
    """
    phase = "blocking" if values[0] == 0 else "cycling"
    setting = f"{phase} ({','.join(map(str, values))})"
    compute = cluster.node.compute()
    if cluster.nodes == 1:
        return make_epoch(DASO.name, setting, cluster, batches,
                          batches * node_allreduce(cluster, nbytes), phase)
    schedule = BatchSchedule(cluster.node.ranks)
    schedule.begin_epoch(values, batches)
    sum_s = rail_allreduce(cluster, nbytes, itemsize)
    clock, comm = 0.0, 0.0
    started: deque[float] = deque()  # the clock at each send still in flight

    def spend(seconds: float) -> None:
        nonlocal clock, comm
        clock, comm = clock + seconds, comm + seconds

    def finish() -> None:
        spend(max(0.0, started.popleft() + sum_s - clock))

    for batch in range(batches):
        plan = schedule.plan(batch)
        clock += compute
        if plan.node_sync:
            spend(node_allreduce(cluster, nbytes))
        if plan.send:
            spend(cluster.node.shm(1, nbytes))  # into the send buffer
            started.append(clock)
        if plan.merge:
            finish()
            spend(cluster.node.shm(3, nbytes))
        if plan.broadcast is not None:
            spend(node_broadcast(cluster, nbytes))
        if plan.send and plan.send.blocking:
            finish()  # the rail's ranks meet: one sync point
            spend(cluster.node.shm(2, nbytes, syncs=1) + node_broadcast(cluster, nbytes))
    return Epoch(DASO.name, setting, batches, batches * compute, comm, phase)
