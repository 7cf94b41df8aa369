"""Node shared memory: the window, a rank's segment as a type, and a topology's workspace.

:class:`SharedArray` is a NumPy view over a node's ``MPI.Win.Allocate_shared`` window.
Each local rank owns one segment of ``segment_size`` elements; MPI lays the segments
out contiguously in rank order, so ``whole`` (shape ``(G, segment_size)``) addresses
every segment of the node and ``segment`` is this rank's row.

:class:`NodeBuffer` is this rank's segment of a window, as a type of its own: handed to
a hierarchical reduction, it tells the reduction that the node can sum the buffer where
it lies, with no copy in or out. Nothing finds that out again by comparing addresses.

:class:`Workspace` holds what a topology's collectives reuse from call to call (scratch
arrays, scratch windows, named node buffers), so a training loop allocates nothing per
call; the :class:`~minidp.comm.Topology` owns one and frees it with its communicators.

Synchronisation (MPI-3 shared memory, unified model): the window is kept in one
passive-target epoch (``Lock_all`` at creation). :meth:`sync` is the standard
``Win.Sync`` / node barrier / ``Win.Sync`` sequence (the barrier times out naming
the ranks that never arrived, :mod:`minidp.comm.guard`): every store made before it by
any rank of the node is visible to every rank after it. Writers and readers of a
region must always be separated by a sync.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm import guard


class SharedArray:
    """Node-shared memory with one segment per local rank.

    Args:
        node: a communicator whose ranks share memory (``Topology.node``).
        segment_size: elements per rank.
        dtype: element type.
    """

    def __init__(self, node: MPI.Comm, segment_size: int, dtype: Any = np.float32) -> None:
        if not isinstance(segment_size, (int, np.integer)) or segment_size < 0:
            raise ValueError(f"segment_size: got {segment_size!r}, allowed: an int >= 0")
        self.node, self.dtype = node, np.dtype(dtype)
        self.segment_size = int(segment_size)
        itemsize = self.dtype.itemsize
        # Allocate at least one element so every rank has a valid base address.
        self.window = guard.collective(node, "allocate shared window", MPI.Win.Allocate_shared,
                                       max(self.segment_size, 1) * itemsize, itemsize,
                                       comm=node)
        base, _ = self.window.Shared_query(0)
        rows, stride = node.Get_size(), max(self.segment_size, 1)
        # Shared_query gives rank 0's segment only; the segments are contiguous, so the
        # whole window is the memory from that address on.
        whole = MPI.buffer.fromaddress(base.address, rows * stride * itemsize)
        self._whole = np.ndarray(buffer=whole, dtype=self.dtype, shape=(rows, stride))
        self._whole = self._whole[:, :self.segment_size]
        self.window.Lock_all()
        self._freed = False

    def _check(self) -> None:
        if self._freed:
            raise RuntimeError("SharedArray: used after free()")

    @property
    def whole(self) -> np.ndarray:
        """All segments of the node, shape (local_size, segment_size)."""
        self._check()
        return self._whole

    @property
    def segment(self) -> np.ndarray:
        """This rank's segment."""
        self._check()
        return self._whole[self.node.Get_rank()]

    def sync(self, *others: SharedArray) -> None:
        """Make every rank's earlier stores visible to every rank of the node.

        ``others``: more windows of the same node, published by the same barrier.
        """
        windows = (self, *others)
        for shared in windows:
            shared._check()
            shared.window.Sync()
        guard.barrier(self.node, "shared-memory sync")
        for shared in windows:
            shared.window.Sync()

    def free(self) -> None:
        """Release the window (collective on the node); later use is a RuntimeError."""
        if self._freed:
            return
        self.window.Unlock_all()
        guard.collective(self.node, "free shared window", self.window.Free)
        self._freed = True


class NodeBuffer:
    """This rank's segment of a node window: a buffer the node reduces where it lies.

    Made by :func:`minidp.comm.shared_buffer` (one per name, size and dtype, kept by the
    topology's :class:`Workspace`). ``array`` is the segment as a 1-D NumPy array;
    ``FlatParameters.rebind_grad`` puts a model's gradients there, and a strategy hands
    the NodeBuffer itself to ``allreduce`` and ``node_allreduce``, whose hierarchical
    algorithms then sum the node's segments in the window without copying.

    Args:
        window: the node window whose segment this is.
    """

    def __init__(self, window: SharedArray) -> None:
        self.window = window
        self.array = window.segment

    @property
    def node(self) -> MPI.Comm:
        """The communicator of the ranks sharing the window."""
        return self.window.node

    def __repr__(self) -> str:
        return (f"NodeBuffer({self.array.size} x {self.array.dtype} on "
                f"{self.node.Get_name()})")


class Workspace:
    """The buffers a topology's collectives reuse, made on first use and kept.

    A started (non-blocking) collective uses them until its ``wait()``, so two operations
    needing the same scratch (same owner, size and dtype; same size and dtype for a
    window) must not be in flight at once.

    Args:
        node: the node communicator the windows are made on (None on a server rank,
            which takes part in no node collective).
        rank: this world rank, for the messages.

    Attributes:
        windows: scratch windows by (elements per rank, dtype): where a hierarchical
            reduction copies a plain array in and the result out.
    """

    def __init__(self, node: MPI.Comm | None, rank: int) -> None:
        self.node, self.rank = node, rank
        self.windows: dict[tuple[int, np.dtype], SharedArray] = {}
        self._arrays: dict[tuple[str, int, np.dtype], np.ndarray] = {}
        self._buffers: dict[tuple[int, np.dtype, str], NodeBuffer] = {}

    def scratch(self, owner: str, size: int, dtype: Any) -> np.ndarray:
        """A private array of ``size`` elements of ``dtype`` for ``owner`` (contents undefined).

        One per owner (an algorithm's name), so that one algorithm's operation in flight
        never shares it with another algorithm's.
        """
        key = (owner, size, np.dtype(dtype))
        if key not in self._arrays:
            self._arrays[key] = np.empty(size, key[2])
        return self._arrays[key]

    def window(self, size: int, dtype: Any) -> SharedArray:
        """The scratch window of ``size`` elements per rank of ``dtype`` (node-collective)."""
        key = (size, np.dtype(dtype))
        if key not in self.windows:
            self.windows[key] = SharedArray(self._node("a scratch window"), size, key[1])
        return self.windows[key]

    def node_buffer(self, size: int, dtype: Any, name: str) -> NodeBuffer:
        """The node buffer ``name`` of ``size`` elements of ``dtype`` (node-collective).

        One window per (size, dtype, name): use one name per buffer that must not share
        storage with another.
        """
        key = (size, np.dtype(dtype), name)
        if key not in self._buffers:
            window = SharedArray(self._node(f"node buffer {name!r}"), size, key[1])
            self._buffers[key] = NodeBuffer(window)
        return self._buffers[key]

    def _node(self, what: str) -> MPI.Comm:
        if self.node is None:
            raise RuntimeError(f"rank {self.rank}: {what} needs a node; a server rank has "
                               "none")
        return self.node

    def free(self) -> None:
        """Free every window (collective on the node: each rank made them in one order)."""
        for shared in [*self.windows.values(), *(b.window for b in self._buffers.values())]:
            shared.free()
        self.windows.clear()
        self._arrays.clear()
        self._buffers.clear()
