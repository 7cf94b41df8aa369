"""The status board: what each rank of a node is waiting in, readable by the others.

A small shared-memory window over the ranks of each real node (one record a rank: the
operation it waits in, how many of them it has called, since when, its process id).
A rank writes its own record around every wait of :mod:`minidp.comm.guard`; when a
wait times out, the ranks that never arrived are named from their records, which needs
nothing from them (they are busy elsewhere, or stopped). A record says what its rank
last did, not whether the rank still runs: so the process behind it is looked at too
(:func:`condition`), and a rank stopped (SIGSTOP, a debugger) or gone (exited, killed) is
named as such, whatever its record says, in a collective's timeout and in a
point-to-point one alike (a worker waiting for a stopped parameter server is told that
the server is stopped, not that it is "waiting"). Ranks on other real nodes are reported
as not visible.
"""

from __future__ import annotations

import os
import time

import numpy as np
from mpi4py import MPI

NOT_VISIBLE = "on another node, state not visible here"
# A record's "waiting": what its rank did last in the call its label and count name.
LEFT, WAITING, GAVE_UP = 0, 1, 2
STATES = {LEFT: "last in", WAITING: "waiting in", GAVE_UP: "gave up in"}
RECORD = np.dtype([("waiting", "i8"), ("count", "i8"), ("since", "f8"), ("pid", "i8"),
                    ("label", "S96")])
NEVER_ARRIVED = "never arrived"  # a missing rank that runs (StatusBoard.absent)
# How :meth:`StatusBoard.absent` describes a running rank that waits in another call.
BLOCKED_ELSEWHERE = f": {NEVER_ARRIVED} ({STATES[WAITING]} "


def blind(details: list[str]) -> bool:
    """Whether the descriptions of the missing ranks name no culprit that this rank sees.

    So when some missing rank is on another node, and every missing rank of this node
    is running and waits in a call of its own: blocked, as this rank is, by a rank
    elsewhere (rank 1 waits for rank 0, which waits for a rank stopped on the other
    host). A rank of that node sees the cause; a stopped or gone rank here is the cause.
    """
    remote = [line for line in details if line.endswith(NOT_VISIBLE)]
    return bool(remote) and all(line in remote or BLOCKED_ELSEWHERE in line
                                for line in details)


class StatusBoard:
    """One record per rank of the real node: what that rank is waiting in, if anything."""

    def __init__(self, world: MPI.Comm, node: MPI.Comm, window: MPI.Win,
                 slots: dict[int, int]) -> None:
        """The board of ``node`` (this rank's real node) in ``window`` (a record a rank).

        Built collectively by :func:`minidp.comm.guard.ensure_board`; ``slots`` maps the
        world rank of every rank of the node to its record.
        """
        self.world, self.node, self.window, self.slots = world, node, window, slots
        base, _ = window.Shared_query(0)
        n = node.Get_size()
        memory = MPI.buffer.fromaddress(base.address, n * RECORD.itemsize)
        self.records = np.ndarray(buffer=memory, dtype=RECORD, shape=(n,))
        self.mine = self.records[node.Get_rank()]
        self.mine["waiting"], self.mine["count"], self.mine["pid"] = LEFT, 0, os.getpid()
        self.mine["label"], self.mine["since"] = b"start", time.time()
        self.counts: dict[str, int] = {}

    def call(self, label: str) -> int:
        """Number this rank's calls per label, finished at once or not, so ranks agree."""
        count = self.counts.get(label, 0) + 1
        self.counts[label] = count
        return count

    def enter(self, label: str, count: int) -> None:
        """This rank now waits in call ``count`` of ``label``."""
        self.mine["count"], self.mine["label"] = count, _stored(label)
        self.mine["since"], self.mine["waiting"] = time.time(), WAITING

    def leave(self) -> None:
        """This rank waits no more (its last label stays, as "last in")."""
        self.mine["waiting"], self.mine["since"] = LEFT, time.time()

    def give_up(self) -> None:
        """This rank's watchdog ends it inside the call it waits in: it came, and is a victim.

        Its process is gone a moment later; the others, whose watchdogs fire about
        together, must not name it among those who stopped or died before the call.
        """
        self.mine["waiting"], self.mine["since"] = GAVE_UP, time.time()

    def members(self, comm: MPI.Comm, ranks: list[int] | None = None) -> list[int]:
        """The world ranks of ``comm``'s ``ranks`` (default: all of them)."""
        group, board_group = comm.Get_group(), self.world.Get_group()
        members = MPI.Group.Translate_ranks(
            group, list(range(comm.Get_size())) if ranks is None else list(ranks), board_group)
        group.Free()
        board_group.Free()
        return members

    def missing(self, comm: MPI.Comm, label: str, count: int) -> list[str]:
        """Descriptions of the ranks of comm not waiting in this same call."""
        return self.absent(self.members(comm), label, count)

    def absent(self, members: list[int], label: str, count: int) -> list[str]:
        """Descriptions of the world ranks ``members`` not in this call nor past it.

        A rank waiting in a later call of the same label, or done with this one, has come:
        a collective can complete on one rank before another (it may have a stopped
        rank's part by way of a third), and naming that rank would hide the culprit.
        """
        now, lines = time.time(), []
        for world_rank in members:
            slot = self.slots.get(world_rank)
            if slot is None:
                lines.append(f"rank {world_rank}: {NOT_VISIBLE}")
                continue
            rec = self.records[slot]
            there, halted = rec["label"].decode(errors="replace"), condition(int(rec["pid"]))
            # A rank in a later call has come to this one, whatever became of it since (it
            # may have ended on its own timeout), as has one whose watchdog gave up in this
            # very call; one at this call is named if it halted there (a stopped process
            # holds the call, a killed one never completes it).
            if rec["label"] == _stored(label) and (
                    rec["count"] > count or (rec["count"] == count and (
                        not halted or rec["waiting"] == GAVE_UP))):
                continue
            state = STATES[int(rec["waiting"])]
            # A stopped process (SIGSTOP, a debugger) may be stopped inside this very call.
            what = f"process {rec['pid']} {halted}" if halted else NEVER_ARRIVED
            lines.append(f"rank {world_rank}: {what} ({state} {there!r} #{rec['count']}, "
                         f"{max(0.0, now - rec['since']):.1f} s ago)")
        return lines

    def peer_states(self, comm: MPI.Comm, peers: list[int]) -> list[str]:
        """What each of ``peers`` (ranks of ``comm``) is waiting in, or was last in."""
        now, lines = time.time(), []
        for peer, world_rank in zip(peers, self.members(comm, peers)):
            slot = self.slots.get(world_rank)
            if slot is None:
                lines.append(f"rank {peer}: {NOT_VISIBLE}")
                continue
            rec = self.records[slot]
            state = STATES[int(rec["waiting"])]
            label = rec["label"].decode(errors="replace")
            seen = f"{state} {label!r} #{rec['count']}, {max(0.0, now - rec['since']):.1f} s ago"
            halted = condition(int(rec["pid"]))
            lines.append(f"rank {peer}: process {rec['pid']} {halted} ({seen})" if halted
                         else f"rank {peer}: {seen}")
        return lines


def _stored(label: str) -> bytes:
    """``label`` as a record holds it: UTF-8, cut to the record's field."""
    return label.encode()[:RECORD["label"].itemsize]


def condition(pid: int) -> str | None:
    """``"stopped"``, ``"is gone"``, or None for process ``pid`` of this machine running.

    Linux's state: T or t is stopped (SIGSTOP, a debugger), Z or X has exited (not yet
    reaped), no ``/proc`` entry is gone. Where ``/proc`` cannot be read (another system),
    None: nothing is claimed.
    """
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return "is gone" if os.path.isdir("/proc/self") else None
    except (OSError, IndexError):
        return None
    return "stopped" if state in ("T", "t") else "is gone" if state in ("Z", "X") else None
