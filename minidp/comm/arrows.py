"""Arrows in the trace: both ends of every message and every collective, with one id.

Perfetto and chrome://tracing draw an arrow between two slices when the sender's slice
holds a flow start (``"ph": "s"``) and the receiver's a flow end (``"ph": "f"``) with
the same ``id``, ``cat`` and name (:meth:`minidp.trace.Tracer.flow`). The two ends are
two processes that never tell each other the id, so each computes it from what it
knows already:

* **A message** (``p2p``: a pull, a push, the centre's reply, a tree's partial sum, a
  ring's or recursive doubling's exchange): (sender, receiver, tag, k), where k counts
  the messages from that sender to that receiver with that tag. MPI's non-overtaking
  rule (messages of one sender on one communicator with one tag are matched in the
  order they were sent) makes the sender's k-th send the receiver's k-th receive from
  it with that tag, whatever the receiver's wildcards. A receive that is cancelled or
  refused receives nothing and counts nothing.
* **A collective** (an allreduce done by MPI or in shared memory, a rail's sum, a
  node's sync): one arrow from each participant into the slice of the group's root
  (its lowest world rank); a broadcast: one arrow from its root to each participant.
  The id is (group, k, participant), where k counts the group's collectives: MPI has
  every member of a communicator call its collectives in the same order, so every
  member counts the same k. A group of one rank draws nothing. An allreduce written
  in messages (``ring``, ``recursive_doubling``) draws its messages instead.

The id is the first 8 bytes of a BLAKE2b hash of those numbers, written in hex (``0x``
and 16 digits): Perfetto reads a string id as a hexadecimal 64-bit number, and the
numbers themselves do not fit 64 bits for every rank, tag and count. Both ends are
recorded inside the slice of their operation (the send's, the receive's wait), at the
moment the message leaves or has arrived.

The flow start carries what moved and its bytes (``args``: ``what``, ``bytes``); for a
collective, the bytes this rank was counted for it. One :class:`Arrows` per
:class:`~minidp.comm.topology.Topology`: its counts are the run's.
"""

from __future__ import annotations

import contextlib
import hashlib

from minidp.trace import tracer

MESSAGE, COLLECTIVE = "p2p", "collective"  # the flows' cat (and name)


def flow_id(*numbers: object) -> str:
    """The arrow id of a message or a part of a collective: a hash of what names it."""
    text = " ".join(map(str, numbers)).encode()
    return "0x" + hashlib.blake2b(text, digest_size=8).hexdigest()


class Group:
    """The world ranks of one communicator and its name (the same on every member).

    Args:
        name: what every member calls it (``world``, ``node 1``, ``rail 0``).
        members: its world ranks, lowest first; the first is the arrows' root.
    """

    __slots__ = ("name", "members", "count")

    def __init__(self, name: str, members: list[int]) -> None:
        self.name, self.members, self.count = name, members, 0

    @property
    def root(self) -> int:
        """The rank whose slice every member's arrow goes into."""
        return self.members[0]


class Collective:
    """The arrows of one collective on this rank: starts on entering, ends on leaving.

    Args:
        group: the group (its count already this collective's).
        rank: this world rank.
        what: what moves, for the arrows' labels.
        nbytes: the bytes of this rank's arrows.
        source: a broadcast's root (world rank); None for a reduction.
    """

    __slots__ = ("ids", "leaving", "arriving", "what", "nbytes", "group")

    def __init__(self, group: Group, rank: int, what: str, nbytes: int,
                 source: int | None) -> None:
        hub = group.root if source is None else source  # where every arrow meets
        # The hub draws one end per other member; a member its own arrow's other end.
        ids = [flow_id("c", group.name, group.count, m)
               for m in (group.members if rank == hub else [rank]) if m != hub]
        into = source is None  # a reduction: into the root; a broadcast: out of its source
        self.leaving = ids if (rank == hub) != into else []
        self.arriving = ids if (rank == hub) == into else []
        self.what, self.nbytes, self.group = what, nbytes, group.name

    def __enter__(self) -> None:
        for arrow in self.leaving:
            tracer().flow("s", arrow, COLLECTIVE, what=self.what, bytes=self.nbytes,
                          group=self.group)

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        if kind is None:  # a collective that failed delivered nothing
            for arrow in self.arriving:
                tracer().flow("f", arrow, COLLECTIVE)


_NOTHING = contextlib.nullcontext()  # a collective nobody draws (alone, or not recording)


class Arrows:
    """One rank's arrow bookkeeping: messages counted per (peer, tag), collectives per group.

    Args:
        rank: this world rank.
        groups: the groups this rank belongs to, by the names the communication layer
            uses (``world``, ``node``, ``rail``; ``leaders`` is the rail of local rank 0).
    """

    def __init__(self, rank: int, groups: dict[str, Group]) -> None:
        self.rank, self.groups = rank, groups
        self.sent: dict[tuple[int, int], int] = {}
        self.received: dict[tuple[int, int], int] = {}

    def message_sent(self, dest: int, tag: int, what: str, nbytes: int) -> None:
        """A message to world rank ``dest`` leaves now: the arrow's start.

        Counted always; drawn (its id hashed, its event made) only while the tracer
        records events.
        """
        key = (dest, tag)
        k = self.sent[key] = self.sent.get(key, 0) + 1
        if tracer().record_events:
            tracer().flow("s", flow_id("m", self.rank, dest, tag, k), MESSAGE, what=what,
                          bytes=nbytes)

    def received_id(self, source: int, tag: int) -> str | None:
        """The arrow id of the message from ``source`` with ``tag`` that MPI just received.

        Call it once per completed receive, at its completion (the count is what pairs
        the ends); :meth:`arrived` records the end where the rank takes the message.
        None while the tracer records no events (counted all the same).
        """
        key = (source, tag)
        k = self.received[key] = self.received.get(key, 0) + 1
        return flow_id("m", source, self.rank, tag, k) if tracer().record_events else None

    def message_received(self, source: int, tag: int) -> None:
        """A message from world rank ``source`` has arrived and is taken now: the arrow's end."""
        self.arrived(self.received_id(source, tag))

    @staticmethod
    def arrived(arrow: str | None) -> None:
        """The end of the arrow ``arrow`` (an id of :meth:`received_id`), now."""
        if arrow is not None:
            tracer().flow("f", arrow, MESSAGE)

    def collective(self, group: str, what: str, nbytes: float, source: int | None = None
                   ) -> Collective:
        """This rank's part in a collective of ``group``: a ``with`` block around the call.

        A reduction (``source`` None): each member's arrow leaves as it enters and goes
        into the root's slice, ending where the root leaves (by then it has every part),
        carrying the bytes the member was counted for. A broadcast from world rank
        ``source``: an arrow from ``source`` as it enters to every other member as that
        member leaves, carrying the buffer's bytes. Every member runs the block, once
        per collective, inside the collective's slice (for a started one, the block may
        span the wait: its ends are drawn in the slice that completes it).
        """
        g = self.groups.get(group)
        if g is None or len(g.members) < 2:
            return _NOTHING
        g.count += 1
        if not tracer().record_events:
            return _NOTHING
        return Collective(g, self.rank, what, int(nbytes), source)

    def from_root(self, group: str, what: str, nbytes: float) -> Collective:
        """A collective whose result goes out from the root of ``group`` to every member."""
        g = self.groups.get(group)
        return self.collective(group, what, nbytes, None if g is None else g.root)

    def member(self, group: str, index: int) -> int:
        """The world rank of member ``index`` of ``group`` (e.g. a node's local rank)."""
        return self.groups[group].members[index]
