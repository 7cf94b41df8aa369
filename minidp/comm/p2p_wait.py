"""The guard's waits for point-to-point requests: they name the silent peer, never hang.

One vocabulary for point-to-point (issue 38): every module that deals with single
messages is ``p2p*``. :mod:`minidp.comm.p2p` sends and receives them (the messages a
strategy calls, accounted and drawn as arrows in the trace), :mod:`minidp.comm.p2p_request`
holds a posted one until it completes, and this module is the guard's part of it: the
timed waits that complete a request or find a message. (It was ``minidp.comm.peers``;
the old path still imports, with a warning.) The *peer* is the rank at the other end.

A point-to-point request can be completed only by its peer, so its timeout names just
that peer (or the possible sources), with what the status board (:mod:`minidp.comm.board`)
says each of them is doing; the waits poll (:func:`minidp.comm.guard.poll_peers`), since
MPICH moves point-to-point data only inside MPI calls. An MPI error on the way (a killed
peer) is :class:`~minidp.comm.guard.PeerLost`, naming the peers.
"""

from __future__ import annotations

from mpi4py import MPI

from minidp.comm.guard import poll_peers


def wait_peer(request: MPI.Request, comm: MPI.Comm, peers: list[int], operation: str,
              status: MPI.Status | None = None) -> None:
    """Complete a point-to-point request, or raise CommTimeout naming the silent peers.

    Unlike :func:`~minidp.comm.guard.wait`, the ranks named on a timeout are only
    ``peers`` (those that could complete the request), each with what the status board
    says it is doing.
    The request is left as it is on a timeout: cancelling it is the caller's choice.

    Args:
        request: an ``Isend`` or ``Irecv`` request on ``comm``.
        comm: the communicator whose ranks ``peers`` are.
        peers: the ranks that could complete it (the destination, or the possible sources).
        operation: what this rank is doing, shown on the status board and in the timeout
            (e.g. ``"recv parameters from rank 2"``).
        status: filled with the source, tag and size of a completed receive.
    """
    poll_peers(lambda: request.Test(status), comm, peers, operation)


def probe_peer(comm: MPI.Comm, source: int, tag: int, peers: list[int],
               operation: str) -> MPI.Status:
    """Wait (polling ``Iprobe``) until a message can be received; return its status.

    Nothing is received and nothing is left posted, so a timeout leaves ``comm`` clean.

    Args:
        comm: the communicator to probe.
        source: the rank the message must come from, or ``MPI.ANY_SOURCE``.
        tag: the tag it must carry, or ``MPI.ANY_TAG``.
        peers: the ranks that could send it, named on a timeout.
        operation: what this rank is doing, for the status board and the timeout.

    Returns:
        The status of the first matching message: source, tag and size.
    """
    status = MPI.Status()
    poll_peers(lambda: comm.Iprobe(source, tag, status), comm, peers, operation)
    return status
