"""Which worker's message a server (or the elastic master) takes next: the ``order`` option.

An asynchronous run differs from the sequential algorithm only in the order in which its
server takes the workers' messages; that order decides every gradient's staleness. Three
orders, one option (``--set asgd.order=...``, likewise amsgd, softsync, dbs, easgd-async,
measgd-async):

* ``fcfs`` (the default, the algorithm): whatever arrived first (``probe(ANY_SOURCE)``);
  the order, and so the staleness, follow the scheduler and differ from run to run.
* ``round_robin``: the workers in rank order, one message each, cycling; the script
  of every worker rank once (``1,2,3`` with three workers).
* a script: worker ranks separated by commas, ``RxN`` for rank R N times, e.g.
  ``2,3,1x12,2,3,1x2``. The server takes the next message of each named worker in turn
  and starts again from the first entry when it reaches the end. A worker's messages
  come in its own order (a parameter-server worker: pull, push, pull, push, ...; an
  elastic worker: one exchange per exchanging step, then DONE), so a script fixes the
  whole run: who read which version, how many updates each gradient missed. An entry
  whose worker has no message to give is skipped: the worker has left the epoch, or
  its pull waits for the server (``dbs`` with ``update=round`` holds a pull until the
  round's update). The script restarts at its first entry every epoch.

A script is how a test, or a reader, chooses the staleness: with 3 workers and one
server, ``1,2,3`` gives every round staleness 0, 1 and 2; ``3,1x6,3`` lets worker 3's
gradient miss the 3 updates of worker 1's. The run records the order it took in
``events.json`` as any run does, so ``python -m minidp replay`` re-executes it.

Every worker must be named at least once: a worker never named would never be served,
and a run would wait on it forever. A script is at most :data:`MAX_SCRIPT` entries long.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

FCFS, ROUND_ROBIN = "fcfs", "round_robin"
MAX_SCRIPT = 100_000  # entries, once RxN is written out: a few integers each, in memory
# a rank and a count of at most 9 digits: a longer number is no rank (and int() of
# thousands of digits is refused with a message that would not name the option)
_ENTRY = re.compile(r"\s*(\d{1,9})\s*(?:x\s*(\d{1,9})\s*)?")
ALLOWED = (f"{FCFS} (first come first served), {ROUND_ROBIN} (the workers in rank order, "
           "deterministic) or a script: worker ranks separated by commas, RxN for rank R "
           "N times (e.g. 2,3,1x4: the server takes the next message of each in turn, "
           "cycling; deterministic)")


def parse_script(text: str) -> tuple[int, ...] | None:
    """The ranks of a script written out (``"2,1x3"`` -> ``(2, 1, 1, 1)``); None if it is none.

    None for anything that is not a script: an empty entry, a word, a count of 0, or more
    than :data:`MAX_SCRIPT` entries in all.
    """
    ranks: list[int] = []
    for entry in text.split(","):
        match = _ENTRY.fullmatch(entry)
        if match is None:
            return None
        count = 1 if match.group(2) is None else int(match.group(2))
        if count < 1 or len(ranks) + count > MAX_SCRIPT:
            return None
        ranks += [int(match.group(1))] * count
    return tuple(ranks)


def is_order(value: str) -> bool:
    """Whether ``value`` is an order as written: ``fcfs``, ``round_robin`` or a script."""
    return value in (FCFS, ROUND_ROBIN) or parse_script(value) is not None


class ServingOrder:
    """The ``order`` option of one run: which worker the serve loop takes next.

    Args:
        order: the option's value (checked by :func:`is_order` already).
        workers: the worker ranks, in rank order.
        where: the option's name for errors (``asgd.order``).
        rank: this rank, for errors (every rank builds the order, so all refuse alike).

    Raises:
        ValueError: a script names a rank that is no worker, or leaves a worker out.
    """

    def __init__(self, order: str, workers: Sequence[int], where: str, rank: int) -> None:
        self.order = order
        self.script: tuple[int, ...] | None = None
        if order == ROUND_ROBIN:
            self.script = tuple(workers)
        elif order != FCFS:
            self.script = parse_script(order)
            if self.script is None:
                raise ValueError(f"rank {rank}: {where}: got {order!r}, allowed: {ALLOWED}")
            strangers = sorted(set(self.script) - set(workers))
            missing = sorted(set(workers) - set(self.script))
            if strangers or missing:
                said = (f"{', '.join(map(str, strangers))} not a worker" if strangers else
                        f"worker(s) {', '.join(map(str, missing))} never named")
                raise ValueError(f"rank {rank}: {where}: got {order!r} ({said}), allowed: "
                                 f"the worker ranks {', '.join(map(str, workers))}, each "
                                 "named at least once")
        self.position = 0  # the script's next entry

    def restart(self) -> None:
        """Back to the script's first entry (each epoch's serve loop starts here)."""
        self.position = 0

    def next(self, active: Sequence[int],
             waiting: Callable[[int], bool] = lambda worker: False) -> int | None:
        """The worker whose next message the server takes now; None: any (fcfs).

        Entries whose worker is not in ``active`` (it has left the epoch), or for which
        ``waiting(worker)`` is true (its pull waits for the server), are skipped. After
        one whole turn of the script without a worker that can send, RuntimeError: the
        server would wait forever (never the case for a script naming every worker).
        """
        if self.script is None:
            return None
        for _ in range(len(self.script)):
            worker = self.script[self.position]
            self.position = (self.position + 1) % len(self.script)
            if worker in active and not waiting(worker):
                return worker
        raise RuntimeError(f"order {self.order!r}: none of the active workers "
                           f"{list(active)} can send a message; the server would wait forever")
