"""Point-to-point messages between world ranks: every send, receive and probe of minidp.

The parameter-server and elastic strategies talk through here and never call mpi4py
themselves, so that every message is

* buffer-based: ``Isend``, ``Irecv`` and ``Iprobe`` on a C-contiguous NumPy array,
  moved as raw bytes (``MPI.BYTE``); dtype and shape are a contract between the two ends;
* completed by a timed wait (:func:`minidp.comm.p2p_wait.wait_peer`,
  :func:`minidp.comm.p2p_wait.probe_peer`) that shows a label on the status board (e.g.
  ``"recv parameters from rank 2"``) and, past ``MINIDP_COMM_TIMEOUT``, raises
  :class:`~minidp.comm.guard.CommTimeout` naming the silent peer and what it was last in;
* counted, timed and charged by the level it crosses (``topology.level(peer)``);
* drawn: the send's slice holds the start of the message's arrow in the trace, the
  receive's slice its end (:mod:`minidp.comm.arrows`).

A posted message (:func:`isend`, :func:`irecv`) is a :class:`PeerRequest`
(:mod:`minidp.comm.p2p_request`) until it completes. Besides ``bytes_<level>``, every
message counts ``messages_p2p`` and ``bytes_p2p`` (of them, point-to-point), which the
trace's counters show beside its arrows.

Accounting and the network model: the sender's link pays, as a serialising NIC does::

    who                        counts (tracer)              phase        charged (inter only)
    send of n bytes            bytes_<level> += n,          comm_<level> sleeps until
                               messages_<level> += 1                     latency + 8n / bandwidth
                                                                         after the call began
    isend of n bytes           the same, at the post        wait, in     sleeps until the same
                                                            wait()       time after the post
    recv, irecv, probe         nothing                      wait         never

A receiver is not charged: it gets the data as soon as MPI delivers it, and the model
delays the sender's next step instead, so a worker behind a slow link pushes less
often. A round trip (a pull and its reply) is charged once to each side's sender.

Sizes are bytes: :class:`Message` has ``nbytes`` (a receive into a float64 buffer got
``nbytes // 8`` elements). A message may be smaller than the buffer, never larger:
:func:`recv` probes first and refuses an oversized message, leaving it unreceived (MPI
would truncate it); :func:`irecv` posts its receive at once, so it can only report the
truncation when it completes. A message that is not a whole number of the buffer's
elements is refused too (the two ends disagree on the dtype).

Progress: MPICH moves point-to-point data only inside MPI calls, so a posted
:func:`isend`/:func:`irecv` advances when this rank calls ``test()``, ``wait()`` or any
other MPI operation; the timed waits poll ``Test``/``Iprobe`` and so make progress.

A blocking :func:`recv` waits in its probe with nothing posted, so a timeout leaves the
communicator clean. A :func:`irecv` whose ``wait()`` times out is cancelled (its buffer
is not written afterwards; the message, if it ever comes, stays for another receive).
A send that times out stays posted (MPI-4 deprecates cancelling sends): its buffer must
not be reused, and under ``python -m mpi4py`` the exception ends the job anyway.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from mpi4py import MPI

from minidp.comm.network import Pending, charged
from minidp.comm.p2p_request import Message, PeerRequest, message_of
from minidp.comm.p2p_wait import probe_peer, wait_peer
from minidp.comm.topology import Topology
from minidp.trace import tracer

ANY_SOURCE = MPI.ANY_SOURCE
ANY_TAG = MPI.ANY_TAG
TAG_UB = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB)  # the largest tag MPI accepts
IDLE = "idle"  # a server waiting for its next request: traced, but not one of PHASES


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def _check_rank(name: str, value: Any, topology: Topology, wildcard: bool) -> int:
    """``value`` as a peer rank: in the world, not this rank (or ANY_SOURCE if allowed)."""
    if wildcard and _is_int(value) and value == ANY_SOURCE:
        return ANY_SOURCE
    if not _is_int(value) or not 0 <= value < topology.size or value == topology.rank:
        allowed = (f"a rank in [0, {topology.size}) other than {topology.rank}"
                   + (", or ANY_SOURCE" if wildcard else ""))
        raise ValueError(f"rank {topology.rank}: {name}: got {value!r}, allowed: {allowed}")
    return int(value)


def _check_tag(tag: Any, topology: Topology, wildcard: bool) -> int:
    if wildcard and _is_int(tag) and tag == ANY_TAG:
        return ANY_TAG
    if not _is_int(tag) or not 0 <= tag <= TAG_UB:
        allowed = f"an int in [0, {TAG_UB}]" + (", or ANY_TAG" if wildcard else "")
        raise ValueError(f"rank {topology.rank}: tag: got {tag!r}, allowed: {allowed}")
    return int(tag)


def _check_buffer(buffer: Any, topology: Topology, writable: bool) -> None:
    if isinstance(buffer, np.ndarray) and buffer.flags.c_contiguous and \
            not buffer.dtype.hasobject and (buffer.flags.writeable or not writable):
        return
    if isinstance(buffer, np.ndarray):
        got = (f"{'' if buffer.flags.c_contiguous else 'non-contiguous '}"
               f"{'' if buffer.flags.writeable else 'read-only '}array of shape "
               f"{buffer.shape} {buffer.dtype}")
    else:
        got = type(buffer).__name__
    need = "writable " if writable else ""
    raise TypeError(f"rank {topology.rank}: buffer: got a {got}, allowed: a {need}C-contiguous "
                    "NumPy array of numbers")


def _check_peers(peers: Any, source: int, topology: Topology) -> list[int]:
    """The ranks a receive may hear from: given, else ``source`` or every other rank."""
    if peers is None:
        if source != ANY_SOURCE:
            return [source]
        peers = [r for r in range(topology.size) if r != topology.rank]
        if not peers:
            raise ValueError(f"rank {topology.rank}: source: got ANY_SOURCE in a world of "
                             "1 rank, allowed: a source that exists (no other rank can send)")
        return peers
    if isinstance(peers, (str, bytes)) or not hasattr(peers, "__iter__"):
        raise ValueError(f"rank {topology.rank}: peers: got {peers!r}, allowed: a list of ranks")
    checked = [_check_rank("peers", p, topology, wildcard=False) for p in peers]
    if not checked:
        raise ValueError(f"rank {topology.rank}: peers: got [], allowed: a non-empty list of "
                         "the ranks the message may come from")
    return checked


def _ranks_text(ranks: list[int]) -> str:
    """``[1, 2, 3, 5]`` as ``"1-3, 5"``: labels stay short on large worlds."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][1] + 1:
            runs[-1][1] = r
        else:
            runs.append([r, r])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _from_text(source: int, peers: list[int]) -> str:
    if source != ANY_SOURCE:
        return f"rank {source}"
    return f"rank {peers[0]}" if len(peers) == 1 else f"any of ranks {_ranks_text(peers)}"


def _check_fits(message: Message, buffer: np.ndarray, topology: Topology, label: str) -> None:
    """Refuse a message larger than ``buffer`` or not a whole number of its elements."""
    if message.nbytes > buffer.nbytes:
        problem = f"more than the buffer's {buffer.nbytes}"
    elif message.nbytes % buffer.itemsize:
        problem = f"not a whole number of {buffer.dtype} elements"
    else:
        return
    raise ValueError(f"rank {topology.rank}: {label}: the message from rank {message.source} "
                     f"with tag {message.tag} has {message.nbytes} bytes, {problem} (buffer "
                     f"of shape {buffer.shape} {buffer.dtype}); it was left unreceived")


def send(buffer: np.ndarray, dest: int, tag: int, topology: Topology, what: str) -> None:
    """Send ``buffer`` to world rank ``dest``; return when the buffer may be reused.

    Counted on this rank at ``topology.level(dest)``; across nodes, charged by the
    network model (the call lasts at least ``latency + 8 * nbytes / bandwidth``).

    Args:
        buffer: the C-contiguous array to send (its bytes; the receiver knows the dtype).
        dest: the world rank to send to (not this rank).
        tag: an int in ``[0, TAG_UB]`` the receiver matches on.
        topology: gives the communicator (``topology.world``) and the level of ``dest``.
        what: a short label for traces, timeouts and the status board.

    Raises:
        CommTimeout: ``dest`` did not take the message within the timeout.
    """
    tag = _check_tag(tag, topology, wildcard=False)
    _check_buffer(buffer, topology, writable=False)
    dest = _check_rank("dest", dest, topology, wildcard=False)
    label = f"send {what} to rank {dest}"
    with charged(topology.level(dest), label, 1, buffer.nbytes):
        _count(buffer.nbytes)
        # Drawn before it is posted: the receiver may have it before Isend returns.
        topology.arrows.message_sent(dest, tag, what, buffer.nbytes)
        request = topology.world.Isend([buffer, MPI.BYTE], dest, tag)
        wait_peer(request, topology.world, [dest], label)


def recv(buffer: np.ndarray, source: int, tag: int, topology: Topology, what: str,
         peers: list[int] | None = None) -> Message:
    """Receive one message into ``buffer`` (timed under the phase ``wait``).

    Args:
        buffer: where the message is written; it may be larger than the message.
        source: the world rank to receive from, or ``ANY_SOURCE``.
        tag: the tag to match, or ``ANY_TAG``.
        topology: gives the communicator (``topology.world``).
        what: a short label for traces, timeouts and the status board.
        peers: the ranks an ``ANY_SOURCE`` message may come from, named on a timeout
            (default: ``[source]``, or every other rank).

    Returns:
        The message's source, tag and size in bytes.

    Raises:
        ValueError: the message is larger than ``buffer``, or not a whole number of its
            elements (it stays unreceived).
        CommTimeout: no message came within the timeout.
    """
    tag = _check_tag(tag, topology, wildcard=True)
    _check_buffer(buffer, topology, writable=True)
    source = _check_rank("source", source, topology, wildcard=True)
    peers = _check_peers(peers, source, topology)
    label = f"recv {what} from {_from_text(source, peers)}"
    with tracer().phase("wait", op=label):
        # Probe first: the size is checked before anything is written, and the receive
        # below matches exactly the probed message (same source and tag, first in order).
        message = message_of(probe_peer(topology.world, source, tag, peers, label))
        _check_fits(message, buffer, topology, label)
        request = topology.world.Irecv([buffer, MPI.BYTE], message.source, message.tag)
        wait_peer(request, topology.world, [message.source], label)
        topology.arrows.message_received(message.source, message.tag)
    return message


def probe(topology: Topology, source: int = ANY_SOURCE, tag: int = ANY_TAG,
          what: str = "probe", peers: list[int] | None = None, phase: str = "wait") -> Message:
    """Wait until a message is there and return its envelope without receiving it.

    A server calls this with ``ANY_SOURCE`` to serve first come, first served, then
    :func:`recv` with the returned source and tag. Timed under ``phase`` (``wait``);
    ``peers`` are the ranks a timeout names (default: ``[source]``, or every other rank).
    """
    source = _check_rank("source", source, topology, wildcard=True)
    tag = _check_tag(tag, topology, wildcard=True)
    peers = _check_peers(peers, source, topology)
    label = f"{what} (probe from {_from_text(source, peers)})"
    with tracer().phase(phase, op=label):
        return message_of(probe_peer(topology.world, source, tag, peers, label))


def next_request(topology: Topology, active: list[int], turn: int | None) -> Message:
    """A server's next message, from any of ``active`` (first come, first served).

    With ``turn`` given, from ``active[turn]`` only: workers in turn, a deterministic order.
    Timed under the phase :data:`IDLE`, not ``wait``: a server with nothing to do is not
    communicating, and the epoch's phases (the maximum over ranks) would otherwise show
    its idle time as the run's communication.
    """
    if turn is None:
        return probe(topology, ANY_SOURCE, ANY_TAG, "serve", peers=active, phase=IDLE)
    return probe(topology, active[turn], ANY_TAG, "serve", peers=[active[turn]], phase=IDLE)


def poll(topology: Topology, source: int = ANY_SOURCE, tag: int = ANY_TAG) -> Message | None:
    """One non-blocking probe: the envelope of a message that is there, else None."""
    source = _check_rank("source", source, topology, wildcard=True)
    tag = _check_tag(tag, topology, wildcard=True)
    status = MPI.Status()
    return message_of(status) if topology.world.Iprobe(source, tag, status) else None


def _count(nbytes: int) -> None:
    """Of the level's counters, what is point-to-point: one message of ``nbytes``."""
    tracer().count("messages_p2p")
    tracer().count("bytes_p2p", nbytes)


def isend(buffer: np.ndarray, dest: int, tag: int, topology: Topology,
          what: str) -> PeerRequest:
    """Start sending ``buffer`` to ``dest``; counted now, charged from now (see wait())."""
    tag = _check_tag(tag, topology, wildcard=False)
    _check_buffer(buffer, topology, writable=False)
    dest = _check_rank("dest", dest, topology, wildcard=False)
    label = f"send {what} to rank {dest}"
    # The post is a slice of its own ("post"): the arrow leaves from it, now.
    with tracer().phase("post", op=label):
        pending = Pending(topology.level(dest), label, 1, buffer.nbytes)
        _count(buffer.nbytes)
        topology.arrows.message_sent(dest, tag, what, buffer.nbytes)  # before, as in send()
        request = topology.world.Isend([buffer, MPI.BYTE], dest, tag)
    return PeerRequest(request, topology, label, [dest], buffer, pending,
                       Message(topology.rank, tag, buffer.nbytes))


def irecv(buffer: np.ndarray, source: int, tag: int, topology: Topology, what: str,
          peers: list[int] | None = None) -> PeerRequest:
    """Post a receive into ``buffer`` now; ``wait()`` completes it (arguments as recv())."""
    tag = _check_tag(tag, topology, wildcard=True)
    _check_buffer(buffer, topology, writable=True)
    source = _check_rank("source", source, topology, wildcard=True)
    peers = _check_peers(peers, source, topology)
    label = f"recv {what} from {_from_text(source, peers)}"
    request = topology.world.Irecv([buffer, MPI.BYTE], source, tag)
    return PeerRequest(request, topology, label, peers, buffer)
