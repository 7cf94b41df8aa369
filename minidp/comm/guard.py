"""Nothing hangs silently: timed waits that name missing ranks, debug checks, abort hook.

* :func:`wait` completes a request by polling it; past the timeout
  (:func:`set_timeout`, else ``MINIDP_COMM_TIMEOUT`` seconds, default 300) it raises
  :class:`CommTimeout` naming the ranks of the communicator that never arrived and the
  operation each of them was last in. Every blocking MPI call of minidp goes through
  this module (``tests/unit/test_guard_scan.py`` checks the source), by one of:

  - :func:`wait`: a non-blocking collective the caller started (``Iallreduce``,
    ``Ibcast``, ``File.Iread_at_all``, ...); :func:`barrier`: ``Ibarrier``;
  - :func:`bcast_object`, :func:`allgather_object`: small picklable objects (decisions,
    messages, sizes), moved as bytes by ``Ibcast`` / ``Iallgatherv``;
  - :func:`collective`: what MPI has no non-blocking form of (``Split``,
    ``Win.Allocate_shared``, ``Win.Fence``, ``File.Open``, ``Free``): a timed barrier,
    then the call under a watchdog (a rank stopped between the two would hold the others
    inside MPI, where no poll runs: the watchdog names it and ends the process);
  - point-to-point: :mod:`minidp.comm.p2p_wait` (``wait_peer``, ``probe_peer``, on
    :func:`poll_peers`), timing out naming the silent peer;
  - :func:`roll_call`: a barrier that names missing ranks before the status board (the
    names' source, :mod:`minidp.comm.board`, built by the first world Topology) exists.
* :func:`check_same` (on when ``MINIDP_DEBUG=1`` or :func:`set_debug`) gathers, before a
  collective, each rank's operation, shape and dtype, and raises on every rank naming the
  ranks that differ from rank 0, instead of letting mismatched calls corrupt data or hang.
* :func:`install_abort_hook`: for scripts not started under ``python -m mpi4py``, an
  uncaught exception on one rank prints its traceback and aborts the whole job.

The two variables are read when first needed (a bad value cannot break ``--help``); a bad
one is a ValueError naming the variable, the value and what is allowed.
"""

from __future__ import annotations

import math
import os
import pickle
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
from mpi4py import MPI

from minidp.comm.board import RECORD, StatusBoard, blind

_settings: dict[str, Any] = {}  # "timeout", "debug": set_*, else the environment when needed
MIN_TIMEOUT_S = 1.0  # of MINIDP_COMM_TIMEOUT: shorter cannot cover the ranks' start-up skew
HAND_OVER_MAX_S = 30.0  # the longest a timed-out rank blind to the cause waits (hand_over_s)
NAP_S = 1e-4  # one sleep between polls, when ranks outnumber cores (set_oversubscribed)
ABORT_GRACE_S = 0.5  # before MPI_Abort, for the launcher to forward this rank's output
_ROLL_CALL_TAG = 7399  # point-to-point on the world, before any other minidp message
_T = TypeVar("_T")
_SWITCH = {"": False, "0": False, "false": False, "no": False, "off": False,
           "1": True, "true": True, "yes": True, "on": True}


class CommTimeout(TimeoutError):
    """A wait ran past the timeout; the message names the ranks that never arrived."""


class PeerLost(RuntimeError):
    """MPI failed to move a message to or from a peer: the peer process is most likely gone."""


class CollectiveMismatch(ValueError):
    """Ranks called one collective with different operations, shapes or dtypes."""


def set_timeout(seconds: float) -> float:
    """Set the wait timeout in seconds (> 0); returns it."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not seconds > 0:
        raise ValueError(f"comm timeout: got {seconds!r}, allowed: seconds > 0")
    _settings["timeout"] = float(seconds)
    return _settings["timeout"]


def set_oversubscribed(on: bool) -> None:
    """Tell the waits whether this machine's ranks (x threads) outnumber its cores.

    :class:`~minidp.comm.Topology` sets it. Then a wait that outlasts a few polls sleeps
    ``NAP_S`` between them: with more runnable processes than cores, a waiting rank that
    keeps polling (or yielding, which the scheduler largely ignores) takes the cores the
    ranks it waits for need. With a core per rank it keeps spinning, for the latency.
    """
    _settings["nap"] = NAP_S if on else 0.0


def set_debug(on: bool) -> None:
    """Turn the collective consistency checks on or off (``MINIDP_DEBUG``)."""
    _settings["debug"] = bool(on)


def comm_timeout() -> float:
    """Seconds a wait may take: :func:`set_timeout`'s, else ``MINIDP_COMM_TIMEOUT`` (300)."""
    if "timeout" not in _settings:
        _settings["timeout"] = timeout_from_environment()
    return _settings["timeout"]


def timeout_from_environment() -> float:
    """``MINIDP_COMM_TIMEOUT`` in seconds (300 when unset); ValueError naming a bad value."""
    text = os.environ.get("MINIDP_COMM_TIMEOUT", "").strip()
    try:
        seconds = float(text) if text else 300.0
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds >= MIN_TIMEOUT_S):
        raise ValueError(f"MINIDP_COMM_TIMEOUT: got {text!r}, allowed: a number of seconds "
                         f">= {MIN_TIMEOUT_S:g} (e.g. 300)")
    return seconds


def debug_checks() -> bool:
    """Whether :func:`check_same` checks: :func:`set_debug`'s, else ``MINIDP_DEBUG`` (off)."""
    if "debug" not in _settings:
        _settings["debug"] = debug_from_environment()
    return _settings["debug"]


def debug_from_environment() -> bool:
    """``MINIDP_DEBUG`` as a switch (off when unset); ValueError naming a bad value."""
    text = os.environ.get("MINIDP_DEBUG", "")
    if text.strip().lower() not in _SWITCH:
        raise ValueError(f"MINIDP_DEBUG: got {text!r}, allowed: 0 or 1 (also false/true, "
                         "no/yes, off/on)")
    return _SWITCH[text.strip().lower()]


_SET_UP = "topology set-up: status board"


_board: dict[str, StatusBoard] = {}


def ensure_board(world: MPI.Comm) -> None:
    """Build the status board once, collectively, when ``world`` is MPI's whole world."""
    if "board" in _board or MPI.Comm.Compare(world, MPI.COMM_WORLD) not in (
            MPI.IDENT, MPI.CONGRUENT):
        return
    # Until the board exists no timeout can name anyone: the roll call can.
    roll_call(world, _SET_UP)
    node = collective(world, _SET_UP, world.Split_type, MPI.COMM_TYPE_SHARED,
                      key=world.Get_rank())
    window = collective(node, _SET_UP, MPI.Win.Allocate_shared, RECORD.itemsize,
                        RECORD.itemsize, comm=node)
    # world rank -> slot on this node (absent: another real node)
    slots = {w: s for s, w in enumerate(allgather_object(node, world.Get_rank(), _SET_UP))}
    board = StatusBoard(world, node, window, slots)
    barrier(node, _SET_UP)  # no rank reads the board before every record is written
    _board["board"] = board


def wait(request: MPI.Request, comm: MPI.Comm, operation: str) -> None:
    """Complete ``request`` (a collective on ``comm``), or raise CommTimeout past the timeout.

    The request is left as it is on a timeout: the job is expected to end.
    """
    label = f"{operation} on {comm.Get_name()}"
    _waiting(request.Test, label, MPI.COMM_WORLD.Get_rank(),
             lambda board, count: board.missing(comm, label, count))


def _waiting(done: Callable[[], bool], label: str, rank: int,
             missing: Callable[[StatusBoard, int], list[str]]) -> None:
    """Call ``done`` until it is true, on the status board as ``label``, or time out.

    On a timeout, ``missing(board, count)`` describes the ranks waited for (``count``:
    this rank's number of calls under ``label``, which the others' records must match).
    """
    board = _board.get("board")
    count = board.call(label) if board else 0
    if done():
        return
    if board:
        board.enter(label, count)
    try:
        deadline = time.monotonic() + comm_timeout()
        polls = 0
        nap = _settings.get("nap", 0.0)
        # MPICH moves point-to-point data only inside MPI calls: each poll is progress.
        while not done():
            polls += 1
            if nap and polls > 16:
                time.sleep(nap)  # more ranks than cores: give the core to the rank awaited
            elif polls > 64:
                os.sched_yield()
            if time.monotonic() > deadline:
                details = missing(board, count) if board else ["(no status board)"]
                _hand_over(details)
                raise CommTimeout(f"rank {rank}: {label!r} waited {comm_timeout():g} s "
                                  "(MINIDP_COMM_TIMEOUT); " + "; ".join(details))
    finally:
        # A caller that handles the timeout goes on: the board must not say it still waits.
        if board:
            board.leave()


def barrier(comm: MPI.Comm, operation: str = "barrier") -> None:
    """A barrier that times out naming the ranks that never arrived."""
    wait(comm.Ibarrier(), comm, operation)


def collective(comm: MPI.Comm, operation: str, call: Callable[..., _T], /, *args: Any,
               **kwargs: Any) -> _T:
    """``call(*args, **kwargs)``, a blocking collective on ``comm``, once every rank is there.

    For what MPI has no non-blocking form of (``Split``, ``Split_type``,
    ``Win.Allocate_shared``, ``Win.Fence``, ``File.Open``, ``File.Close``, ``Free``): a
    timed :func:`barrier` first, so a rank that never comes is named; the call itself
    then only waits for ranks that have just arrived.

    A rank stopped (or lost) after the others saw it in the barrier, before it reached
    the call, still holds them inside the call, where no poll can time out: a watchdog
    thread then names the ranks of this node that are not in the call and ends this
    process with status 2, so that the launcher ends the job.

    Example: ``guard.collective(world, "split nodes", world.Split, color, key=rank)``.
    """
    barrier(comm, operation)
    label, board = f"{operation} on {comm.Get_name()}", _board.get("board")
    count = board.call(label) if board else 0
    # Asked now: the watchdog reads only the board, no MPI, while this thread is inside MPI.
    members = board.members(comm) if board else []
    watchdog = threading.Timer(comm_timeout(), _blocked,
                               (label, count, members, MPI.COMM_WORLD.Get_rank()))
    watchdog.daemon = True
    if board:
        board.enter(label, count)
    watchdog.start()
    try:
        return call(*args, **kwargs)
    finally:
        watchdog.cancel()
        if board:
            board.leave()


def _blocked(label: str, count: int, members: list[int], rank: int) -> None:
    """The watchdog of :func:`collective`: say who is not in the call, end this process."""
    board = _board.get("board")
    details = board.absent(members, label, count) if board else []
    sys.stderr.write(f"error: rank {rank}: {label!r} blocked inside MPI for {comm_timeout():g} s "
                     "(MINIDP_COMM_TIMEOUT) after every rank had come to its barrier: a rank "
                     "stopped or died before the call; "
                     + ("; ".join(details) or "every rank of this node is in it") + "\n")
    sys.stderr.flush()
    if board:
        board.give_up()
    _hand_over(details)
    os._exit(2)  # the main thread cannot raise from inside MPI; the launcher ends the job


def hand_over_s() -> float:
    """How long a timed-out rank waits for another rank to speak: one timeout, at most 30 s.

    A rank that timed out at t waited since t - timeout. Any rank that was already
    waiting at t began by t, and times out by t + timeout: waiting one timeout more,
    this rank lets every such rank speak first, however late its wait began, for
    timeouts up to the cap (under load the ranks of another host start seconds late; 2 s,
    the fixed wait this replaced, was once too short). A rank not yet waiting at t was
    still running, and no fixed wait could cover it. The cap keeps a job with the
    default 300 s timeout from waiting twice as long to end where no rank sees the cause
    (a node lost whole).
    """
    return min(comm_timeout(), HAND_OVER_MAX_S)


def _hand_over(details: list[str]) -> None:
    """Blind to the cause, let a rank of another node that sees it end the job first.

    The first process to end ends the job (:func:`~minidp.comm.board.blind` says when
    this rank sees no cause), so this one waits :func:`hand_over_s` before it ends.
    """
    if blind(details):
        time.sleep(hand_over_s())


def bcast_object(comm: MPI.Comm, obj: Any, root: int, operation: str) -> Any:
    """Root's small ``obj`` (decisions, messages; never arrays) on every rank, pickled."""
    if comm.Get_size() == 1:
        return obj
    mine = comm.Get_rank() == root
    data = pickle.dumps(obj, pickle.HIGHEST_PROTOCOL) if mine else b""
    size = np.array([len(data)], np.int64)
    wait(comm.Ibcast(size, root=root), comm, operation)
    payload = np.frombuffer(data, np.uint8) if mine else np.empty(int(size[0]), np.uint8)
    wait(comm.Ibcast(payload, root=root), comm, operation)
    return obj if mine else pickle.loads(payload.tobytes())


def allgather_object(comm: MPI.Comm, obj: Any, operation: str) -> list[Any]:
    """Every rank's ``obj`` (pickled), in rank order, by timed ``Iallgather(v)``."""
    data = np.frombuffer(pickle.dumps(obj, pickle.HIGHEST_PROTOCOL), np.uint8)
    sizes = np.empty(comm.Get_size(), np.int64)
    wait(comm.Iallgather(np.array([data.size], np.int64), sizes), comm, operation)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1]))
    gathered = np.empty(int(sizes.sum()), np.uint8)
    wait(comm.Iallgatherv(data, [gathered, sizes, offsets, MPI.BYTE]), comm, operation)
    return [pickle.loads(gathered[o:o + n].tobytes()) for o, n in zip(offsets, sizes)]


def roll_call(comm: MPI.Comm, operation: str) -> None:
    """A barrier that names the ranks that never arrive, before the status board exists.

    Every rank sends rank 0 one byte; rank 0 waits for all (or the timeout) and answers
    those that came with the list of who did; each names the missing ranks. Without
    rank 0, the others name it after the timeout and :func:`hand_over_s` more (rank 0,
    when there and no later than that in its own wait, speaks first). Point-to-point, a
    tag of its own: 2(size - 1) messages.
    """
    rank, size = comm.Get_rank(), comm.Get_size()
    if size == 1:
        return
    label, timeout = f"{operation} (roll call) on {comm.Get_name()}", comm_timeout()
    came = np.zeros(size, np.uint8)  # rank 0: who has come; the others: rank 0's answer
    if rank == 0:
        came[0] = 1
        calls = [comm.Irecv([came[r:r + 1], MPI.BYTE], r, _ROLL_CALL_TAG)
                 for r in range(1, size)]
        if not _poll_until(lambda: MPI.Request.Testall(calls), timeout):
            for call in calls:
                withdraw(call)
        present = [r for r in range(1, size) if came[r]]
        answers = [comm.Isend([came, MPI.BYTE], r, _ROLL_CALL_TAG) for r in present]
        poll_peers(lambda: MPI.Request.Testall(answers), comm, present, label)
    else:
        answer = comm.Irecv([came, MPI.BYTE], 0, _ROLL_CALL_TAG)
        hello = comm.Isend([np.ones(1, np.uint8), MPI.BYTE], 0, _ROLL_CALL_TAG)
        grace = hand_over_s()
        if _poll_until(answer.Test, timeout + grace):
            hello.Wait()  # local: rank 0 answers only the ranks whose byte it received
        else:
            withdraw(answer)
            raise CommTimeout(f"rank {rank}: {label!r} waited {timeout:g} s "
                              f"(MINIDP_COMM_TIMEOUT) and {grace:g} s more for rank 0; "
                              "rank 0: never answered (it never arrived, or still waits "
                              "for a rank that did not)")
    missing = [r for r in range(size) if not came[r]]
    if missing:
        raise CommTimeout(f"rank {rank}: {label!r} waited {timeout:g} s (MINIDP_COMM_TIMEOUT); "
                          + "; ".join(f"rank {r}: never arrived" for r in missing))


def _poll_until(done: Callable[[], bool], seconds: float) -> bool:
    """Call ``done`` until it is true (then True) or ``seconds`` have passed (False)."""
    deadline = time.monotonic() + seconds
    while not done():
        if time.monotonic() > deadline:
            return False
        os.sched_yield()
    return True


def poll_peers(test: Callable[[], bool], comm: MPI.Comm, peers: list[int],
               operation: str) -> None:
    """Call ``test`` until it is true, on the status board as ``operation``, or time out.

    An MPI error on the way (a killed peer: MPICH cannot read its memory) is PeerLost
    naming the peers, instead of an error stack that names none.
    """
    def done() -> bool:
        try:
            return test()
        except MPI.Exception as exc:
            if exc.Get_error_class() == MPI.ERR_TRUNCATE:
                raise  # the message came, too large: the caller's error to report
            raise PeerLost(f"rank {comm.Get_rank()}: {operation!r}: MPI failed with "
                           f"rank(s) {', '.join(map(str, peers))}, which may have died "
                           f"({exc.Get_error_string().splitlines()[0]})") from None

    _waiting(done, operation, comm.Get_rank(),
             lambda board, _: board.peer_states(comm, peers))


def withdraw(request: MPI.Request, status: MPI.Status | None = None) -> bool:
    """Cancel a posted receive: True if cancelled, False if a message completed it first.

    The ``Wait`` after ``Cancel`` is local (MPI guarantees that it returns whatever the
    other ranks do); ``status`` is filled either way.
    """
    status = status if status is not None else MPI.Status()
    request.Cancel()
    request.Wait(status)
    return status.Is_cancelled()


Request = MPI.Request  # for type hints outside comm, which never imports mpi4py


def start_max(comm: MPI.Comm, send: np.ndarray, recv: np.ndarray) -> MPI.Request:
    """Start the elementwise maximum of ``send`` over the ranks into ``recv`` (:func:`wait`)."""
    return comm.Iallreduce(send, recv, op=MPI.MAX)


def check_same(comm: MPI.Comm, operation: str, buffer: Any = None) -> None:
    """In debug mode, raise on every rank unless all ranks call the same collective."""
    if not debug_checks():
        return
    mine = (operation, None if buffer is None else tuple(buffer.shape),
            None if buffer is None else str(buffer.dtype))
    calls = allgather_object(comm, mine, f"check {operation}")
    differ = [r for r, call in enumerate(calls) if call != calls[0]]
    if differ:
        def show(r: int) -> str:
            op, shape, dtype = calls[r]
            return f"rank {r} calls {op}" + (f" with shape {shape} {dtype}" if shape else "")
        raise CollectiveMismatch(f"rank {comm.Get_rank()}: mismatched collective on "
                                 f"{comm.Get_name()}: {show(0)}, but "
                                 + ", ".join(show(r) for r in differ))


def install_abort_hook() -> None:
    """Make an uncaught exception on any rank print its traceback and abort every rank."""
    if MPI.COMM_WORLD.Get_size() == 1 or getattr(sys.excepthook, "minidp_abort", False):
        return
    previous = sys.excepthook

    def abort(kind: type, value: BaseException, tb: Any) -> None:
        previous(kind, value, tb)
        sys.stderr.write(f"minidp: uncaught {kind.__name__} on rank "
                         f"{MPI.COMM_WORLD.Get_rank()}; aborting the job\n")
        sys.stderr.flush()
        # MPICH's launcher drops output not yet forwarded when it tears the job down:
        # give it a moment, or the one traceback that explains the failure can be cut.
        time.sleep(ABORT_GRACE_S)
        MPI.COMM_WORLD.Abort(1)

    abort.minidp_abort = True
    sys.excepthook = abort
