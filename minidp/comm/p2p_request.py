"""A posted point-to-point message: ``isend``/``irecv``'s request, until it completes.

:func:`minidp.comm.p2p.isend` and :func:`~minidp.comm.p2p.irecv` return a
:class:`PeerRequest`; this module is what happens between the post and the end: progress
(``test()``), the timed wait that names the silent peer (``wait()``, through
:mod:`minidp.comm.p2p_wait`), the network model's remainder for a send, a receive
cancelled on a timeout, a truncated message refused, and the receive's end of the
message's arrow in the trace (:mod:`minidp.comm.arrows`). :class:`Message` is the
envelope every receive and probe of :mod:`minidp.comm.p2p` returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
from mpi4py import MPI

from minidp.comm import guard
from minidp.comm.network import Pending
from minidp.comm.p2p_wait import wait_peer
from minidp.comm.topology import Topology
from minidp.trace import tracer


class Message(NamedTuple):
    """A message's envelope: who sent it, with which tag, and how many bytes it holds."""

    source: int
    tag: int
    nbytes: int


def message_of(status: MPI.Status) -> Message:
    """The envelope a completed receive or a probe filled ``status`` with."""
    return Message(status.Get_source(), status.Get_tag(), status.Get_count(MPI.BYTE))


class PeerRequest:
    """A posted :func:`isend` or :func:`irecv`: ``test()`` polls it, ``wait()`` completes it.

    The buffer belongs to MPI until ``wait()`` returns (or ``test()`` returned True).
    ``wait()`` of a send is timed under the phase ``wait`` and sleeps what is left of
    the network model's time counted from the post, so work done meanwhile hides it;
    call it even after ``test()`` returned True. ``wait()`` of a receive is timed under
    ``wait`` and, on a timeout, cancels the receive. A receive is counted for its arrow
    when it completes (in ``test()`` or ``wait()``) and its arrow ends in ``wait()``'s
    slice, where this rank takes the message.

    Args:
        request: the mpi4py request.
        topology: gives the communicator and this rank.
        label: what the request does, for the status board and the timeout.
        peers: the ranks that could complete it.
        buffer: the array MPI reads or writes (kept alive here until completion).
        pending: for a send, its accounting (counted at the post); None for a receive.
        sent: for a send, the message it sends; None for a receive (known when done).
    """

    def __init__(self, request: MPI.Request, topology: Topology, label: str, peers: list[int],
                 buffer: np.ndarray, pending: Pending | None = None,
                 sent: Message | None = None) -> None:
        self.request, self.topology, self.label, self.peers = request, topology, label, peers
        self.buffer, self.pending = buffer, pending
        self.status = MPI.Status()
        self.message = sent
        self.arrival: str | None = None  # a completed receive's arrow id
        self.done = False  # MPI has completed the request
        self.waited = False  # wait() has returned (the model's time is paid)
        self.failed: Exception | None = None  # a receive refused or cancelled: wait() raises

    def test(self) -> bool:
        """Make progress; True once the communication is complete."""
        if not self.done and self.failed is None:
            with self._refusing_truncation():
                self.done = bool(self.request.Test(self.status))
            if self.done:
                self._finish()
        return self.done

    def wait(self) -> Message:
        """Block until complete (timed, naming the silent peer); idempotent.

        Returns:
            For a receive the message's source, tag and size in bytes; for a send this
            rank, the tag and the bytes sent.
        """
        if self.failed is not None:
            raise self.failed
        if not self.waited:
            phase = (self.pending.waiting() if self.pending is not None
                     else tracer().phase("wait", op=self.label))
            with phase:
                if not self.done:
                    self._complete()
                if self.arrival is not None:
                    self.topology.arrows.arrived(self.arrival)
            self.waited = True
        return self.message

    def _complete(self) -> None:
        try:
            with self._refusing_truncation():
                wait_peer(self.request, self.topology.world, self.peers, self.label,
                          self.status)
        except guard.CommTimeout as timeout:
            if self.pending is not None:
                raise  # a send stays posted; wait() may be called again
            if guard.withdraw(self.request, self.status):
                self.failed = timeout
                raise
            # The message slipped in between the timeout and the cancel: it is received.
        self.done = True
        self._finish()

    def _finish(self) -> None:
        if self.pending is not None:
            return
        self.message = message_of(self.status)
        # Counted even if refused below: MPI has taken it, the next one is the next k.
        self.arrival = self.topology.arrows.received_id(self.message.source, self.message.tag)
        if self.message.nbytes % self.buffer.itemsize:
            self.failed = ValueError(
                f"rank {self.topology.rank}: {self.label}: the message from rank "
                f"{self.message.source} with tag {self.message.tag} has "
                f"{self.message.nbytes} bytes, not a whole number of {self.buffer.dtype} "
                "elements")
            raise self.failed

    @contextlib.contextmanager
    def _refusing_truncation(self) -> Iterator[None]:
        """Turn MPI's truncation error into a ValueError naming source, tag and sizes."""
        try:
            yield
        except MPI.Exception as error:
            if error.Get_error_class() != MPI.ERR_TRUNCATE:
                raise
            self.failed = ValueError(
                f"rank {self.topology.rank}: {self.label}: the message from rank "
                f"{self.status.Get_source()} with tag {self.status.Get_tag()} is larger than "
                f"the buffer ({self.buffer.nbytes} bytes, shape {self.buffer.shape} "
                f"{self.buffer.dtype}); MPI truncated it (probe() first to learn its size)")
            raise self.failed from error
