"""Allreduce of a flat float buffer, five ways, same signature, selectable by name.

``allreduce(buffer, topology, algorithm, op)`` reduces ``buffer`` in place on every
rank (``op`` "sum" or "mean"). Every call is accounted and, across nodes, charged by
the network model (:mod:`minidp.comm.network`): the flat algorithms as a whole at the
world's level, the hierarchical ones per phase (node phases intra, rails inter).
Receive buffers and shared windows are workspaces cached on the topology, so a
training loop allocates nothing per call. A buffer that *is* this rank's segment of
the node's window (:func:`shared_buffer`) is reduced without any copy by the
hierarchical algorithms.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.comm.network import Pending, charged, ring_traffic
from minidp.comm.shared import SharedArray
from minidp.comm.topology import Topology

ALLREDUCE_ALGORITHMS = ("mpi", "ring", "recursive_doubling", "hierarchical_leader",
                        "hierarchical")
OPS = ("sum", "mean")
_TAG = 7301


def _workspace(topology: Topology, key: tuple, make: Any) -> Any:
    cache = topology.__dict__.setdefault("_workspaces", {})
    if key not in cache:
        cache[key] = make()
    return cache[key]


def _window(topology: Topology, size: int, dtype: Any, name: str = "scratch") -> SharedArray:
    """The node window ``name`` of ``size`` elements (per rank) of ``dtype``."""
    dtype = np.dtype(dtype)
    return _workspace(topology, ("shared", size, dtype, name),
                      lambda: SharedArray(topology.node, size, dtype))


def shared_buffer(topology: Topology, size: int, dtype: Any, name: str = "buffer") -> np.ndarray:
    """This rank's segment of a node window the hierarchical algorithms reduce in place.

    Placing a model's flat gradient buffer here (``FlatParameters.rebind_grad``) makes
    the intra-node level zero-copy. Windows are cached by (size, dtype, name): use one
    name per buffer that must not share storage with another.
    """
    return _window(topology, size, dtype, name).segment


def _scratch(topology: Topology, size: int, dtype: np.dtype) -> np.ndarray:
    return _workspace(topology, ("scratch", size, dtype), lambda: np.empty(size, dtype))


def sum_rows(rows: np.ndarray, out: np.ndarray) -> None:
    """Sum the rows into out with contiguous adds (faster than a strided reduce)."""
    np.copyto(out, rows[0])
    for row in rows[1:]:
        out += row


def node_bytes(buf: np.ndarray, topology: Topology) -> int:
    """Bytes a rank moves through the node's shared memory: none when it is alone."""
    return buf.nbytes if topology.local_size > 1 else 0


def chunk_bounds(n: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` contiguous chunks of n elements, sizes differing by <= 1."""
    return [i * n // parts for i in range(parts + 1)]


def mpi_allreduce(buf: np.ndarray, topology: Topology) -> None:
    """The library's own allreduce on the world communicator (the reference).

    Started as ``Iallreduce`` and completed by :func:`guard.wait`, so a rank that never
    arrives is named instead of hanging the job.
    """
    guard.wait(topology.world.Iallreduce(MPI.IN_PLACE, buf, op=MPI.SUM), topology.world,
               "allreduce")


def ring_allreduce(buf: np.ndarray, topology: Topology) -> None:
    """Reduce-scatter then allgather around a ring, p-1 steps each.

    Pattern::

        step s of reduce-scatter: rank r sends chunk (r-s) to r+1, receives chunk (r-s-1)
        from r-1 and adds it; after p-1 steps rank r holds the full sum of chunk (r+1).
        allgather: the finished chunks travel p-1 steps further around the same ring.

    Each rank sends 2(p-1)/p of the buffer, in 2(p-1) messages; chunk sizes differ by
    at most one element, so any world size and buffer size work. Every exchange is a
    :func:`guard.sendrecv`: a stopped neighbour is named after the timeout, and the
    label names both neighbours, so a rank two steps away from a stopped one finds it
    in what its own neighbour is waiting in.
    """
    comm, p, r = topology.world, topology.size, topology.rank
    if p == 1 or buf.size == 0:
        return
    b = chunk_bounds(buf.size, p)
    tmp = _scratch(topology, b[1] - b[0] + 1, buf.dtype)
    right, left = (r + 1) % p, (r - 1) % p
    label = f"ring allreduce from rank {left} to rank {right}"
    for step in range(p - 1):
        send, recv = (r - step) % p, (r - step - 1) % p
        n = b[recv + 1] - b[recv]
        guard.sendrecv(comm, buf[b[send]:b[send + 1]], right, tmp[:n], left, _TAG, label)
        buf[b[recv]:b[recv + 1]] += tmp[:n]
    for step in range(p - 1):
        send, recv = (r + 1 - step) % p, (r - step) % p
        guard.sendrecv(comm, buf[b[send]:b[send + 1]], right, buf[b[recv]:b[recv + 1]], left,
                       _TAG + 1, label)


def recursive_doubling_allreduce(buf: np.ndarray, topology: Topology) -> None:
    """Exchange whole buffers with partners at distance 1, 2, 4, ... (log2 p rounds).

    Pattern::

        non-power-of-two fix (p = 2^k + rem): in the first 2*rem ranks, each even rank
        sends its buffer to the odd rank above it and sits out; the 2^k remaining ranks
        run the doubling rounds (partner = new_rank XOR mask); at the end every odd
        rank of the first 2*rem sends the result back to its even neighbour.
    """
    comm, p, r = topology.world, topology.size, topology.rank
    if p == 1 or buf.size == 0:
        return
    pof2 = 1 << (p.bit_length() - 1)
    rem = p - pof2
    tmp = _scratch(topology, buf.size, buf.dtype)
    # Every send and receive is completed by a timed wait naming the partner; the label
    # names it too, so the status board shows who waits for whom.
    label = "recursive doubling allreduce with rank {}".format
    if r < 2 * rem:
        if r % 2 == 0:
            guard.wait_peer(comm.Isend(buf, dest=r + 1, tag=_TAG + 2), comm, [r + 1],
                            label(r + 1))
            guard.wait_peer(comm.Irecv(buf, source=r + 1, tag=_TAG + 3), comm, [r + 1],
                            label(r + 1))
            return
        guard.wait_peer(comm.Irecv(tmp, source=r - 1, tag=_TAG + 2), comm, [r - 1],
                        label(r - 1))
        buf += tmp
        new_rank = r // 2
    else:
        new_rank = r - rem
    mask = 1
    while mask < pof2:
        partner_new = new_rank ^ mask
        partner = partner_new * 2 + 1 if partner_new < rem else partner_new + rem
        guard.sendrecv(comm, buf, partner, tmp, partner, _TAG + 4, label(partner))
        buf += tmp
        mask <<= 1
    if r < 2 * rem:
        guard.wait_peer(comm.Isend(buf, dest=r - 1, tag=_TAG + 3), comm, [r - 1],
                        label(r - 1))


def _node_window(buf: np.ndarray, topology: Topology) -> tuple[SharedArray, bool]:
    """The window buf is the segment of (zero copy), else the scratch window, copied into."""
    cache = topology.__dict__.get("_workspaces", {})
    for key, shared in cache.items():
        if key[:3] == ("shared", buf.size, buf.dtype) and buf.size > 0 and \
                buf.ctypes.data == shared.segment.ctypes.data:
            return shared, True
    shared = _window(topology, buf.size, buf.dtype)
    shared.segment[...] = buf
    return shared, False


def hierarchical_leader_allreduce(buf: np.ndarray, topology: Topology) -> None:
    """Leader-only two-level reduction (for teaching; ``hierarchical`` is faster).

    Pattern::

        1. every rank writes its buffer into its segment of the node window; sync
        2. the leader sums the G segments, allreduces the sum over ``leaders``, and
           writes the result into every segment; sync
        3. every rank reads its own segment
    """
    with charged("intra", "node_reduce", 0, node_bytes(buf, topology)):
        shared, zero_copy = _node_window(buf, topology)
        shared.sync()
    if topology.is_leader and buf.size:
        total = _scratch(topology, buf.size, buf.dtype)
        sum_rows(shared.whole, total)
        if topology.num_nodes > 1:
            with charged("inter", "leaders_allreduce", *ring_traffic(topology.num_nodes,
                                                                     buf.nbytes)):
                guard.wait(topology.leaders.Iallreduce(MPI.IN_PLACE, total, op=MPI.SUM),
                           topology.leaders, "leaders allreduce")
        shared.whole[...] = total
    with charged("intra", "node_broadcast", 0, node_bytes(buf, topology)):
        shared.sync()
        if not zero_copy:
            buf[...] = shared.segment


# Elements per block of the slice reduction: a block of every row stays in L2 while
# it is summed and copied back, so the window is streamed through memory once.
_BLOCK = 1 << 15


def slice_reduce(buf: np.ndarray, topology: Topology, broadcast: bool
                  ) -> tuple[SharedArray, bool, slice, np.ndarray]:
    """Sum this local rank's slice over the node's segments, into row 0 of the window.

    With ``broadcast`` (nothing left to do across nodes) each block of the sum is also
    copied into the other rows while it is in cache. Returns the window, whether buf
    is its segment, this rank's slice and the summed part (a view of row 0).
    """
    shared, zero_copy = _node_window(buf, topology)
    shared.sync()
    b = chunk_bounds(buf.size, topology.local_size)
    mine = slice(b[topology.local_rank], b[topology.local_rank + 1])
    whole = shared.whole
    for start in range(mine.start, mine.stop, _BLOCK):
        block = slice(start, min(start + _BLOCK, mine.stop))
        acc = whole[0, block]
        for row in whole[1:, block]:
            acc += row
        if broadcast:
            for row in whole[1:, block]:
                row[...] = acc
    return shared, zero_copy, mine, whole[0, mine]


def slice_finish(buf: np.ndarray, shared: SharedArray, zero_copy: bool, mine: slice,
                  broadcast: bool) -> None:
    """Copy the finished slice into every row (unless done already); sync; read back."""
    if broadcast:
        whole = shared.whole
        for row in whole[1:, mine]:
            row[...] = whole[0, mine]
    shared.sync()
    if not zero_copy:
        buf[...] = shared.segment


def hierarchical_allreduce(buf: np.ndarray, topology: Topology) -> None:
    """Every local rank reduces one slice; the rails reduce the slices in parallel.

    Pattern::

        1. every rank writes its buffer into its segment of the node window; sync
        2. local rank k sums slice k (1/G of the buffer) over the G segments into
           segment 0, block by block
        3. rail k (``cross``) allreduces slice k across the nodes: G rails at once
        4. local rank k copies slice k into every other segment (on one node, done
           in step 2 while each block is in cache); sync; each rank has the sum

    Zero-copy when the buffer is this rank's segment (:func:`shared_buffer`).
    """
    across = topology.num_nodes > 1
    with charged("intra", "node_reduce", 0, node_bytes(buf, topology)):
        shared, zero_copy, mine, part = slice_reduce(buf, topology, broadcast=not across)
    if across and part.size:
        with charged("inter", "rail_allreduce", *ring_traffic(topology.num_nodes, part.nbytes)):
            guard.wait(topology.cross.Iallreduce(MPI.IN_PLACE, part, op=MPI.SUM),
                       topology.cross, "rail allreduce")
    with charged("intra", "node_broadcast", 0, node_bytes(buf, topology)):
        slice_finish(buf, shared, zero_copy, mine, broadcast=across)


_ALGORITHMS = {"mpi": mpi_allreduce, "ring": ring_allreduce,
               "recursive_doubling": recursive_doubling_allreduce,
               "hierarchical_leader": hierarchical_leader_allreduce,
               "hierarchical": hierarchical_allreduce}


def _doubling_traffic(ranks: int, nbytes: int) -> tuple[int, float]:
    """One whole buffer per round, log2 of the power of two below ranks (+1 if not one)."""
    if ranks < 2:
        return 0, 0.0
    rounds = (ranks.bit_length() - 1) + (0 if ranks & (ranks - 1) == 0 else 1)
    return rounds, float(rounds * nbytes)


# What one rank sends, per flat algorithm: (messages, bytes) for N ranks and n bytes.
_FLAT = {"mpi": ring_traffic, "ring": ring_traffic, "recursive_doubling": _doubling_traffic}


def check_buffer(buffer: Any, algorithm: str, op: str, rank: int) -> None:
    """Raise (naming the rank) unless algorithm, op and buffer are ones allreduce takes."""
    if algorithm not in _ALGORITHMS:
        raise ValueError(f"rank {rank}: allreduce algorithm {algorithm!r}, allowed: "
                         f"{', '.join(ALLREDUCE_ALGORITHMS)}")
    if op not in OPS:
        raise ValueError(f"rank {rank}: allreduce op {op!r}, allowed: {', '.join(OPS)}")
    if not isinstance(buffer, np.ndarray) or buffer.ndim != 1 or \
            not buffer.flags.c_contiguous or buffer.dtype.kind != "f":
        raise TypeError(f"rank {rank}: allreduce buffer must be a contiguous 1-D float NumPy "
                        f"array, got {type(buffer).__name__} {getattr(buffer, 'shape', '')} "
                        f"{getattr(buffer, 'dtype', '')}")


def _finish(buffer: np.ndarray, topology: Topology, op: str, check_finite: bool) -> None:
    if op == "mean":
        buffer /= topology.size
    if check_finite and not np.all(np.isfinite(buffer)):
        bad = int(np.flatnonzero(~np.isfinite(buffer))[0])
        raise FloatingPointError(f"rank {topology.rank}: allreduce result is not finite "
                                 f"(first at element {bad}: {buffer[bad]})")


def allreduce(buffer: np.ndarray, topology: Topology, algorithm: str = "hierarchical",
              op: str = "sum", check_finite: bool = False) -> np.ndarray:
    """Reduce ``buffer`` in place over all ranks of ``topology.world``; returns it."""
    check_buffer(buffer, algorithm, op, topology.rank)
    guard.check_same(topology.world, f"allreduce {algorithm} {op}", buffer)
    if algorithm in _FLAT:
        level = "inter" if topology.num_nodes > 1 else "intra"
        with charged(level, algorithm, *_FLAT[algorithm](topology.size, buffer.nbytes)):
            _ALGORITHMS[algorithm](buffer, topology)
    else:
        _ALGORITHMS[algorithm](buffer, topology)
    _finish(buffer, topology, op, check_finite)
    return buffer


class AllreduceRequest:
    """A started non-blocking allreduce: ``test()`` polls, ``wait()`` completes it.

    ``wait()`` is timed under the phase ``wait`` and sleeps what is left of the network
    model's time for the operation (counted from its start, so overlapped computation
    hides it). ``wait()`` of the hierarchical form ends with a node-wide sync, so every
    rank of the node must call it.
    """

    def __init__(self, request: MPI.Request, comm: MPI.Comm, pending: Pending,
                 finish: Any) -> None:
        self.request, self.comm, self.pending = request, comm, pending
        self._finish, self.done = finish, False

    def test(self) -> bool:
        """Progress the communication; True once it has completed (then call wait())."""
        return self.done or bool(self.request.Test())

    def wait(self) -> None:
        """Block until complete and finish the reduction (idempotent)."""
        if not self.done:
            with self.pending.waiting():
                guard.wait(self.request, self.comm, self.pending.operation)
            self._finish()
            self.done = True


def iallreduce(buffer: np.ndarray, topology: Topology, algorithm: str = "hierarchical",
               op: str = "sum") -> AllreduceRequest:
    """Start a non-blocking allreduce (``mpi`` or ``hierarchical``) of ``buffer``.

    The buffer must not be touched until ``wait()``. For ``hierarchical``, the intra-node
    slice reduction runs now and the rails' ``Iallreduce`` runs in the background.
    """
    if algorithm not in ("mpi", "hierarchical"):
        raise ValueError(f"rank {topology.rank}: non-blocking allreduce algorithm "
                         f"{algorithm!r}, allowed: 'mpi', 'hierarchical'")
    check_buffer(buffer, algorithm, op, topology.rank)
    guard.check_same(topology.world, f"iallreduce {algorithm} {op}", buffer)
    across = topology.num_nodes > 1
    level = "inter" if across else "intra"
    if algorithm == "mpi":
        pending = Pending(level, "iallreduce", *ring_traffic(topology.size, buffer.nbytes))
        request = topology.world.Iallreduce(MPI.IN_PLACE, buffer, op=MPI.SUM)
        return AllreduceRequest(request, topology.world, pending,
                                lambda: _finish(buffer, topology, op, False))
    with charged("intra", "node_reduce", 0, node_bytes(buffer, topology)):
        shared, zero_copy, mine, part = slice_reduce(buffer, topology, broadcast=not across)
    comm = topology.cross if across else MPI.COMM_SELF
    traffic = ring_traffic(topology.num_nodes, part.nbytes)
    pending = Pending(level, "rail iallreduce", *traffic)
    request = comm.Iallreduce(MPI.IN_PLACE, part, op=MPI.SUM)

    def finish() -> None:
        with charged("intra", "node_broadcast", 0, node_bytes(buffer, topology)):
            slice_finish(buffer, shared, zero_copy, mine, broadcast=across)
        _finish(buffer, topology, op, False)
    return AllreduceRequest(request, comm, pending, finish)
