"""One level at a time: the node-only and rail-only collectives hierarchical strategies use.

``allreduce`` reduces over the whole world. The strategies also need each level on its
own: average inside a node (HSGD level 1, HBSGD and DASO every step), reduce over one
rail across nodes (DASO's global sync, blocking or not), and broadcast inside a node
from one local rank (DASO after a receive). Each goes through the same accounting as
``allreduce``: node operations are timed as ``comm_intra``, rail operations as
``comm_inter`` and charged by the network model.

A strategy's step calls them by what moves where, so that it reads as its paper::

    world_mean(grad, topology, algorithm)   every rank: the world's mean (allreduce)
    node_mean(grad, topology)               every rank of the node: the node's mean
    rail_sum(x, topology)                   the ranks of one rail: the sum over the nodes
    rail_sum_start(x, topology).wait()      the same, overlapped with the next batches
    rail_mean(x, topology)                  the rail's mean
    node_broadcast(x, topology, root)       local rank root's x to the node
    node_sync(window, ...)                  stores into node windows seen by the node

Each is the general call with its operation filled in (``allreduce(..., op="mean")``,
``node_allreduce``, ``rail_allreduce``, ``rail_iallreduce``); what they time, count,
charge and wait for with a timeout is below them, never in the strategy.
"""

from __future__ import annotations

import contextlib
from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.comm.allreducers import AllreduceRequest, Buffer, allreduce, check_buffer
from minidp.comm.allreducers.base import node_bytes
from minidp.comm.allreducers.hierarchical import NodeSlices, RailAllreduce
from minidp.comm.network import charged
from minidp.comm.shared import NodeBuffer, SharedArray
from minidp.comm.topology import Topology


def node_allreduce(buffer: Buffer, topology: Topology, op: str = "mean") -> np.ndarray:
    """Reduce ``buffer`` over the ranks of this node only, through the shared window.

    Pattern: every rank's buffer is (or is copied into) its segment; local rank k sums
    slice k of all segments (dividing it by G for a mean) and copies it back into each;
    sync. No message leaves the node. Zero-copy when ``buffer`` is a NodeBuffer
    (:func:`shared_buffer`). Returns the reduced array.
    """
    array = check_buffer(buffer, "hierarchical", op, topology.rank)
    guard.check_same(topology.node, f"node allreduce {op}", array)
    drawn = topology.arrows.collective("node", "node mean" if op == "mean" else "node sum",
                                       node_bytes(array, topology))
    with charged("intra", "node_allreduce", 0, node_bytes(array, topology)), drawn:
        if topology.local_size > 1 and array.size:
            slices = NodeSlices(buffer, topology)
            # A mean divides each block of the sum while it is in cache: the bits of a
            # division afterwards, without a pass over the whole buffer on every rank.
            slices.sum_slice(copy_back=True,
                             mean_over=topology.local_size if op == "mean" else 1)
            slices.publish()
    return array


def node_slice_mean(buffer: NodeBuffer, topology: Topology) -> tuple[slice, np.ndarray]:
    """This rank's slice of the mean of ``buffer`` over the node, and nothing more.

    The first half of ``node_allreduce``: one sync, then local rank k sums slice k of
    the node's segments into segment 0 (the same order, so the same bits) and divides
    it by G. Nothing is copied back, which saves ``node_allreduce``'s second sync; in
    exchange **the caller must synchronise the node** (a shared-memory sync, or any
    node-wide collective) before any rank writes ``buffer`` again: segment 0 holds the
    sums and the other ranks may still be reading. Needs two or more ranks on the node.

    Returns:
        (the slice, the mean over it: a view of segment 0).
    """
    array = check_buffer(buffer, "hierarchical", "mean", topology.rank)
    if not isinstance(buffer, NodeBuffer) or topology.local_size < 2:
        raise ValueError(f"rank {topology.rank}: node_slice_mean needs a NodeBuffer (got "
                         f"{type(buffer).__name__}) on a node of 2 or more ranks (got "
                         f"{topology.local_size})")
    guard.check_same(topology.node, "node slice mean", array)
    drawn = topology.arrows.collective("node", "node mean", node_bytes(array, topology))
    with charged("intra", "node_reduce", 0, node_bytes(array, topology)), drawn:
        slices = NodeSlices(buffer, topology)
        mean = slices.sum_slice(mean_over=topology.local_size)
    return slices.mine, mean


def rail_allreduce(buffer: np.ndarray, topology: Topology, op: str = "sum") -> np.ndarray:
    """Blocking reduce of ``buffer`` over this rank's rail (its local rank on every node).

    Only the ranks of one rail call it; the other rails are free. Charged as a ring
    over the P nodes: 2(P-1) messages, 2(P-1)/P of the bytes. ``rail_iallreduce(...)
    .wait()`` with nothing in between.
    """
    check_buffer(buffer, "mpi", op, topology.rank)
    guard.check_same(topology.cross, f"rail allreduce {op}", buffer)
    return RailAllreduce(buffer, topology, False, op).wait()


def rail_iallreduce(buffer: np.ndarray, topology: Topology, op: str = "sum",
                    waits_as: str = "wait") -> AllreduceRequest:
    """Start a non-blocking reduce of ``buffer`` over this rank's rail; wait() finishes it.

    The network model's time runs from now, so the batches computed before ``wait()``
    hide it; whatever is left is slept in ``wait()`` under the phase ``waits_as``
    (``comm_inter`` where the caller waits within the same batch). It uses no
    workspace: several may be in flight, each on its own buffer.
    """
    check_buffer(buffer, "mpi", op, topology.rank)
    guard.check_same(topology.cross, f"rail iallreduce {op}", buffer)
    return RailAllreduce(buffer, topology, True, op, waits_as)


def world_mean(buffer: Buffer, topology: Topology, algorithm: str) -> np.ndarray:
    """``buffer`` <- its mean over every rank of the world, by ``algorithm``; returns it."""
    return allreduce(buffer, topology, algorithm, op="mean")


def node_mean(buffer: Buffer, topology: Topology) -> np.ndarray:
    """``buffer`` <- its mean over the ranks of this node (shared memory only); returns it."""
    return node_allreduce(buffer, topology, op="mean")


def rail_sum(buffer: np.ndarray, topology: Topology) -> np.ndarray:
    """``buffer`` <- its sum over this rank's rail (one rank per node), blocking."""
    return rail_allreduce(buffer, topology, op="sum")


def rail_sum_start(buffer: np.ndarray, topology: Topology) -> AllreduceRequest:
    """Start ``rail_sum`` of ``buffer``; ``wait()`` on the request finishes it."""
    return rail_iallreduce(buffer, topology, op="sum")


def rail_mean(buffer: np.ndarray, topology: Topology) -> np.ndarray:
    """``buffer`` <- its mean over this rank's rail (one rank per node), blocking."""
    return rail_allreduce(buffer, topology, op="mean")


def node_sync(window: SharedArray, *others: SharedArray, what: str = "node_sync",
              topology: Topology | None = None) -> None:
    """Every rank's stores into these node windows made visible to the node: one barrier.

    Timed as ``comm_intra`` under ``what`` (no bytes: the stores are the callers').
    Drawn as the node's arrows into its root where ``topology`` is given.
    """
    drawn = topology.arrows.collective("node", what.replace("_", " "), 0) \
        if topology is not None else contextlib.nullcontext()
    with charged("intra", what, 0, 0), drawn:
        window.sync(*others)


def node_broadcast(buffer: np.ndarray, topology: Topology, root: int) -> np.ndarray:
    """Copy ``buffer`` of local rank ``root`` to every rank of the node (``Ibcast``)."""
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < topology.local_size:
        raise ValueError(f"rank {topology.rank}: broadcast root: got {root!r}, allowed: a local "
                         f"rank in [0, {topology.local_size})")
    guard.check_same(topology.node, f"node broadcast from {root}", buffer)
    if topology.local_size > 1:
        drawn = topology.arrows.collective("node", "node broadcast", buffer.nbytes,
                                           source=topology.arrows.member("node", root))
        with charged("intra", "node_broadcast", 0, buffer.nbytes), drawn:
            guard.wait(topology.node.Ibcast(buffer, root=root), topology.node, "node broadcast")
    return buffer


def broadcast(buffer: np.ndarray, topology: Topology, root: int = 0,
              what: str = "broadcast") -> np.ndarray:
    """Copy ``buffer`` of world rank ``root`` to every rank of the world (``Ibcast``).

    Charged as MPICH's binomial tree: ceil(log2 P) rounds over the P nodes, each moving
    the whole buffer (inter-node when the world spans nodes, else intra-node).
    """
    if isinstance(root, bool) or not isinstance(root, int) or not 0 <= root < topology.size:
        raise ValueError(f"rank {topology.rank}: broadcast root: got {root!r}, allowed: a world "
                         f"rank in [0, {topology.size})")
    guard.check_same(topology.world, f"{what} from {root}", buffer)
    nodes = len(set(topology.nodes_of_ranks))
    rounds = max(1, (nodes - 1).bit_length()) if topology.size > 1 else 0
    level = "inter" if nodes > 1 else "intra"
    if topology.size > 1:
        sent = buffer.nbytes if topology.rank == root else 0
        drawn = topology.arrows.collective("world", what, buffer.nbytes, source=root)
        with charged(level, what, rounds if sent else 0, sent * rounds), drawn:
            guard.wait(topology.world.Ibcast(buffer, root=root), topology.world, what)
    return buffer


def world_max(buffer: np.ndarray, topology: Topology, what: str = "world max") -> np.ndarray:
    """Element-wise maximum of ``buffer`` over the world, in place.

    Timed wait, not charged: a few numbers of bookkeeping (the epoch's phase timers).
    """
    guard.check_same(topology.world, what, buffer)
    guard.wait(topology.world.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.MAX), topology.world, what)
    return buffer


def broadcast_object(obj: Any, topology: Topology, root: int = 0) -> Any:
    """A small JSON-like object of world rank ``root`` on every rank (pickled: never arrays)."""
    return guard.bcast_object(topology.world, obj, root, "broadcast object")
