"""What every allreduce algorithm is made of: a request, and the waits its rounds yield.

An algorithm is a small subclass of :class:`AllreduceRequest` (ChainerMN's pattern: one
class per algorithm over one base) whose :meth:`~AllreduceRequest.rounds` is the whole
algorithm, from the buffer to the result (the mean included), written as a generator:
it does the work it can do now and yields a :class:`Waiting` for each request it
cannot go on without (a collective's ``Iallreduce``, a ring step's receive), and
:data:`IN_WAIT` before a last part that needs every rank of the node (the final
shared-memory sync). The base drives it::

    start    (creating the request) run rounds() up to its first Waiting
    test()   while the Waiting at hand has completed, run on to the next; stop at IN_WAIT
    wait()   complete every Waiting under the guard, then run what follows IN_WAIT

so the blocking ``allreduce`` is a request started and at once waited on,
``Algorithm(...).wait()``, and the non-blocking one is the same code with the caller's
computation between the two. The flat algorithms share one opening and the mean
(:class:`FlatAllreduce`): their files hold only their exchanges.

Accounting: a blocking operation is charged phase by phase as it runs (``comm_intra`` /
``comm_inter``, :func:`~minidp.comm.network.charged`). A started one counts its
background part (:meth:`~AllreduceRequest.communication`) when it starts, as a
:class:`~minidp.comm.network.Pending` whose modelled time runs from there, and
``wait()`` times what is left under the phase ``wait`` and sleeps the model's
remainder. Phases done at the start or after ``IN_WAIT`` (the node's shared-memory
work) are charged as they run in both forms.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator
from typing import Any, ClassVar

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.comm.arrows import Arrows
from minidp.comm.network import Pending, charged
from minidp.comm.p2p_wait import wait_peer
from minidp.comm.shared import NodeBuffer, SharedArray
from minidp.comm.topology import Topology
from minidp.trace import tracer

OPS = ("sum", "mean")
TAG = 7301  # point-to-point tags of the flat algorithms: TAG .. TAG + 4

Buffer = np.ndarray | NodeBuffer  # what an allreduce reduces in place


def as_array(buffer: Buffer) -> np.ndarray:
    """The NumPy array a buffer is (a NodeBuffer's segment)."""
    return buffer.array if isinstance(buffer, NodeBuffer) else buffer


def chunk_bounds(n: int, parts: int) -> list[int]:
    """Boundaries of ``parts`` contiguous chunks of n elements, sizes differing by <= 1."""
    return [i * n // parts for i in range(parts + 1)]


def node_bytes(buf: np.ndarray, topology: Topology) -> int:
    """Bytes a rank moves through the node's shared memory: none when it is alone."""
    return buf.nbytes if topology.local_size > 1 else 0


def node_window(buffer: Buffer, topology: Topology) -> tuple[SharedArray, bool]:
    """The window a node reduction works in, and whether that is without copies.

    A :class:`NodeBuffer` is reduced in its own window. A plain array is copied into
    the workspace's scratch window (and the caller copies the result back out).
    """
    if isinstance(buffer, NodeBuffer):
        if buffer.node is not topology.node:
            raise ValueError(f"rank {topology.rank}: {buffer!r} is a segment of another "
                             "topology's node window; make it with shared_buffer(topology, "
                             "...) of the topology that reduces it")
        return buffer.window, True
    shared = topology.workspace.window(buffer.size, buffer.dtype)
    shared.segment[...] = buffer
    return shared, False


def shared_buffer(topology: Topology, size: int, dtype: Any, name: str = "buffer"
                  ) -> NodeBuffer:
    """This rank's segment of the node window ``name``, which the node reduces in place.

    Placing a model's flat gradients there (``FlatParameters.rebind_grad``) and handing
    the NodeBuffer to ``allreduce`` or ``node_allreduce`` makes the intra-node level
    zero-copy. Kept by ``topology.workspace``: the same (size, dtype, name) gives the
    same buffer; use one name per buffer that must not share storage with another.
    """
    return topology.workspace.node_buffer(size, dtype, name)


class Waiting:
    """A request an algorithm cannot go on without, and the guarded wait that completes it.

    Args:
        request: the started MPI request.
        comm: the communicator it is on.
        label: what the status board and a timeout call this wait.
        peer: for a point-to-point request, the rank that can complete it (a timeout
            names it); None for a collective (a timeout names every missing rank).
        arrival: for a receive, its message's arrow id (:mod:`minidp.comm.arrows`): the
            arrow ends where the wait completes it.
    """

    __slots__ = ("request", "comm", "label", "peer", "arrival")  # one per message: kept light

    def __init__(self, request: MPI.Request, comm: MPI.Comm, label: str,
                 peer: int | None = None, arrival: str | None = None) -> None:
        self.request, self.comm, self.label, self.peer = request, comm, label, peer
        self.arrival = arrival

    def wait(self) -> None:
        """Complete it, or raise CommTimeout naming who never came."""
        if self.peer is None:
            guard.wait(self.request, self.comm, self.label)
        else:
            wait_peer(self.request, self.comm, [self.peer], self.label)
        Arrows.arrived(self.arrival)


def post_send(arrows: Arrows, comm: MPI.Comm, buf: np.ndarray, dest: int, tag: int,
              label: str, what: str) -> Waiting:
    """``Isend`` of ``buf`` to world rank ``dest`` (``comm`` is the world), its arrow leaving.

    The arrow leaves just before the post: the receiver may have it before Isend returns.
    """
    arrows.message_sent(dest, tag, what, buf.nbytes)
    return Waiting(comm.Isend(buf, dest=dest, tag=tag), comm, label, dest)


def post_recv(arrows: Arrows, comm: MPI.Comm, buf: np.ndarray, source: int, tag: int,
              label: str) -> Waiting:
    """``Irecv`` into ``buf`` from world rank ``source``; its arrow ends at the wait.

    The arrow is counted at the post: an algorithm's receives are never cancelled, and
    MPI matches the posted receives of one source and tag in the order they were posted.
    """
    receiving = comm.Irecv(buf, source=source, tag=tag)
    return Waiting(receiving, comm, label, source, arrows.received_id(source, tag))


def exchange(arrows: Arrows, comm: MPI.Comm, send: np.ndarray, dest: int, recv: np.ndarray,
             source: int, tag: int, label: str, what: str) -> Iterator[Waiting]:
    """A send-receive pair as waits to yield: the receive (naming source), then the send."""
    receiving = post_recv(arrows, comm, recv, source, tag, label)
    sending = post_send(arrows, comm, send, dest, tag, label, what)
    yield receiving
    yield sending


_UNTIMED = contextlib.nullcontext()  # a blocking operation's wait: its phases time it


class _InWait:
    """The marker a round yields before the part only ``wait()`` may run."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "IN_WAIT"


IN_WAIT = _InWait()  # what follows needs every rank of the node: run by wait(), not test()
Round = Waiting | _InWait  # what an algorithm's rounds() yields


class AllreduceRequest(abc.ABC):
    """An allreduce in progress on this rank: ``test()`` progresses it, ``wait()`` ends it.

    Each algorithm is a subclass. Creating one starts it: its rounds run up to the
    first request they must wait for. ``wait()`` completes the rest under the guard
    (timed under the phase ``wait`` when started, sleeping what is left of the network
    model's time, counted from the start), runs what follows :data:`IN_WAIT` (for the
    hierarchical ones a node-wide sync, so every rank of the node must call ``wait()``),
    and returns the reduced array.

    Args:
        buffer: what is reduced in place (a NodeBuffer: in its window, where the
            algorithm works through the node's shared memory).
        topology: the ranks it spans.
        started: whether the caller computes between the start and ``wait()``.
        op: "sum" or "mean".
        check_finite: raise FloatingPointError (naming the rank and the first bad
            element) unless the result is all finite.
    """

    name: ClassVar[str]
    waits_as = "wait"  # the phase of a started form's wait()

    def __init__(self, buffer: Buffer, topology: Topology, started: bool, op: str = "sum",
                 check_finite: bool = False) -> None:
        self.buffer, self.array = buffer, as_array(buffer)
        self.topology, self.started = topology, started
        self.op, self.check_finite = op, check_finite
        self.pending: Pending | None = None  # the started form's background part
        self.done = False
        self._steps = self.rounds()
        self._waiting: Round | None = self._posting()

    def _posting(self, completed: Waiting | None = None) -> Round | None:
        """Run the rounds on to the next request they wait for, outside wait().

        A started operation's part run at its start or in test() is a slice of its own,
        ``post``: the messages and collectives it starts leave from it (and those that
        test() found arrived end in it), so their arrows have a slice. A blocking one's
        phases are its slices. ``completed``: the request test() found complete; it is
        waited on all the same (at once), so that the status board counts the same calls
        on every rank, whether test() or wait() completed it.
        """
        if not self.started:
            return next(self._steps, None)
        with tracer().phase("post", op=self.name):
            if completed is not None:
                completed.wait()
            return next(self._steps, None)

    @abc.abstractmethod
    def rounds(self) -> Iterator[Round]:
        """The algorithm: yield each request the rest depends on, IN_WAIT before the end.

        Leaves the result (the sum, or for a mean the sum divided: :meth:`to_mean`) in
        the buffer.
        """

    def to_mean(self, total: np.ndarray, count: int) -> None:
        """A mean: ``total`` (a sum over ``count`` ranks) divided by them, in place.

        Nothing for a sum, or for one rank.
        """
        if self.op == "mean" and count > 1:
            total /= count

    def communication(self, level: str, operation: str, started_operation: str,
                      messages: int, nbytes: float, counted: str | None = None
                      ) -> contextlib.AbstractContextManager[None]:
        """Charge the part of the operation that may run in the background of the caller.

        Blocking: charged as ``operation``, its phase spanning the waits yielded inside
        (the start and wait() follow each other at once). Started: counted now as
        ``started_operation``; ``wait()`` times the rest. ``counted``: the byte counter
        when not the level's (:func:`~minidp.comm.network.charged`).
        """
        if not self.started:
            return charged(level, operation, messages, nbytes, counted)
        self.pending = Pending(level, started_operation, messages, nbytes, counted,
                               self.waits_as)
        return _UNTIMED

    def test(self) -> bool:
        """Progress the communication; True once it has completed (then call wait())."""
        while isinstance(self._waiting, Waiting) and self._waiting.request.Test():
            self._waiting = self._posting(self._waiting)
        return not isinstance(self._waiting, Waiting)

    def wait(self) -> np.ndarray:
        """Block until complete and finish the reduction (idempotent); returns the array."""
        if self.done:
            return self.array
        try:
            with self.pending.waiting() if self.pending is not None else _UNTIMED:
                while isinstance(self._waiting, Waiting):
                    self._waiting.wait()
                    self._waiting = next(self._steps, None)
            if self._waiting is IN_WAIT:
                self._waiting = next(self._steps, None)
            if self._waiting is not None:
                raise RuntimeError(f"{self.name}: rounds() yielded {self._waiting!r} after "
                                   "IN_WAIT; every wait must come before it")
        except BaseException:
            # Close the algorithm's open phases now, not whenever it is collected.
            self._steps.close()
            raise
        array = self.array
        if self.check_finite and not np.all(np.isfinite(array)):
            bad = int(np.flatnonzero(~np.isfinite(array))[0])
            raise FloatingPointError(f"rank {self.topology.rank}: allreduce result is not "
                                     f"finite (first at element {bad}: {array[bad]})")
        self.done = True
        return array


class FlatAllreduce(AllreduceRequest):
    """An algorithm over the world's ranks as one group, charged as a whole.

    The opening and the end every flat algorithm shares are here: nothing to exchange
    with one rank or an empty buffer; the sum divided by p for a mean. A subclass writes
    only :meth:`exchanges`. Its level is the world's (``inter`` once the world spans
    nodes), its cost what one rank sends (:meth:`traffic`); the blocking form is charged
    as ``name``, the started one as ``started_name``.
    """

    started_name: ClassVar[str]

    @staticmethod
    @abc.abstractmethod
    def traffic(ranks: int, nbytes: int) -> tuple[int, float]:
        """(messages, bytes) one rank sends for a buffer of ``nbytes`` over ``ranks``."""

    @abc.abstractmethod
    def exchanges(self, buf: np.ndarray, comm: MPI.Comm, p: int, r: int) -> Iterator[Waiting]:
        """The algorithm's messages among the p ranks of ``comm`` (this one is r).

        They leave the sum of every rank's ``buf`` in ``buf``, on every rank; p >= 2.
        """

    def rounds(self) -> Iterator[Waiting]:
        """The world's sum by :meth:`exchanges`, one charged operation; a mean divides it."""
        t, buf = self.topology, self.array
        with self.communication("inter" if t.num_nodes > 1 else "intra", self.name,
                                self.started_name, *self.traffic(t.size, buf.nbytes),
                                self.counted()):
            if t.size > 1 and buf.size:
                yield from self.exchanges(buf, t.world, t.size, t.rank)
        self.to_mean(buf, t.size)

    def counted(self) -> str | None:
        """The counter of its bytes when not the level's (None: the level's)."""
        return None
