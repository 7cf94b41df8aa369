"""Accounting of every data-moving MPI call, and the alpha-beta model of the network.

:func:`charged` wraps one communication operation: it times it under the phase
``comm_intra`` or ``comm_inter``, counts its bytes and messages per level on the
tracer, and, for inter-node operations when a model is set, sleeps the remainder when
the real operation was faster than ``messages * latency + bytes / bandwidth``. That lets
one machine show what a cluster network does to each algorithm; intra-node operations
are never charged.

Each algorithm states what it sends across nodes (per rank, for a buffer of n bytes):
a flat ring over N ranks on P > 1 nodes pays 2(N-1) latencies and 2(N-1)/N * n bytes,
the hierarchical rails a ring over P nodes on their slice.

Bytes and messages are counted under the operation's level, or under ``counted``
where that says more: ``mpi`` for MPI's own allreduce over ranks of several nodes of
several ranks each, whose messages MPI's algorithm places (docs/reporting.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterator
from types import TracebackType

from minidp.trace import tracer

LEVELS = ("intra", "inter")
COUNTED = (*LEVELS, "mpi")  # the byte and message counters: per level, and MPI's unsplit


@dataclasses.dataclass(frozen=True)
class NetworkModel:
    """alpha-beta cost: latency per message plus bytes over bandwidth."""

    latency_us: float = 0.0
    bandwidth_gbps: float = 0.0  # 0: infinite

    def __post_init__(self) -> None:
        if self.latency_us < 0:
            raise ValueError(f"--net-latency-us: got {self.latency_us}, allowed: >= 0")
        if self.bandwidth_gbps < 0:
            raise ValueError(f"--net-bandwidth-gbps: got {self.bandwidth_gbps}, allowed: >= 0"
                             " (0 means unlimited)")

    def seconds(self, messages: int, nbytes: float) -> float:
        """Modelled time of ``messages`` messages carrying ``nbytes`` in all."""
        transfer = nbytes * 8 / (self.bandwidth_gbps * 1e9) if self.bandwidth_gbps else 0.0
        return messages * self.latency_us * 1e-6 + transfer


_model = {"current": NetworkModel()}


def set_network_model(model: NetworkModel) -> NetworkModel:
    """Charge inter-node operations from now on by ``model``; returns it."""
    _model["current"] = model
    return model


def network_model() -> NetworkModel:
    """The model in force."""
    return _model["current"]


def ring_traffic(ranks: int, nbytes: int) -> tuple[int, float]:
    """(messages, bytes) one rank sends in a ring allreduce of nbytes over ``ranks``."""
    if ranks < 2:
        return 0, 0.0
    return 2 * (ranks - 1), 2 * (ranks - 1) / ranks * nbytes


def _account(level: str, messages: int, nbytes: float, counted: str | None = None) -> None:
    """Count one operation's bytes and messages on the tracer: under ``counted``, else level."""
    if level not in LEVELS:
        raise ValueError(f"level: got {level!r}, allowed: {LEVELS}")
    counter = counted or level
    if counter not in COUNTED:
        raise ValueError(f"counted: got {counter!r}, allowed: {COUNTED}")
    tracer().count(f"bytes_{counter}", int(nbytes))
    tracer().count(f"messages_{counter}", messages)


def _charge(messages: int, nbytes: float) -> float:
    """The model's seconds for one inter-node operation, recorded on the tracer.

    The counter ``charged_ns`` (nanoseconds) says what the model charged, whatever the
    machine's load made the operation itself take: tests check it exactly.
    """
    seconds = network_model().seconds(messages, nbytes)
    tracer().count("charged_ns", round(seconds * 1e9))
    return seconds


class Pending:
    """An operation in flight (a non-blocking collective): counted now, charged at its wait.

    The modelled time runs from the start, so computation done meanwhile hides it;
    :meth:`waiting` times the blocked part under ``phase`` (``wait``: the caller went on
    to other batches) and sleeps whatever of the model is left.
    """

    def __init__(self, level: str, operation: str, messages: int, nbytes: float,
                 counted: str | None = None, phase: str = "wait") -> None:
        _account(level, messages, nbytes, counted)
        self.level, self.operation, self.phase = level, operation, phase
        self.messages, self.nbytes = messages, nbytes
        self.model_s = _charge(messages, nbytes) if level == "inter" else 0.0
        self.start = time.perf_counter()

    @contextlib.contextmanager
    def waiting(self) -> Iterator[None]:
        """Time the wait; on leaving, sleep until the modelled completion time.

        Its slice carries what was counted at the start (``bytes``, ``messages``): every
        counted operation has one slice that says so, a blocking one its own.
        """
        with tracer().phase(self.phase, op=self.operation, level=self.level,
                            bytes=self.nbytes, messages=self.messages):
            yield
            remainder = self.model_s - (time.perf_counter() - self.start)
            if remainder > 0:
                time.sleep(remainder)


class Charge:
    """One operation being charged: what :func:`charged` returns, as a context manager.

    A class rather than a generator-based context manager: it wraps every phase of every
    collective, several per step, and a generator-based one costs almost a microsecond
    more each time (what a 64 KiB allreduce notices).
    """

    __slots__ = ("level", "operation", "messages", "nbytes", "counted", "phase", "start")

    def __init__(self, level: str, operation: str, messages: int, nbytes: float,
                 counted: str | None = None) -> None:
        self.level, self.operation, self.messages, self.nbytes = level, operation, messages, \
            nbytes
        self.counted = counted

    def __enter__(self) -> None:
        _account(self.level, self.messages, self.nbytes, self.counted)
        self.phase = tracer().phase(f"comm_{self.level}", op=self.operation, bytes=self.nbytes,
                                    messages=self.messages)
        self.phase.__enter__()
        # Measured inside the phase, so the phase itself lasts at least the model's time.
        self.start = time.perf_counter()

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None,
                 traceback: TracebackType | None) -> None:
        try:
            if kind is None and self.level == "inter":
                remainder = _charge(self.messages, self.nbytes) - \
                    (time.perf_counter() - self.start)
                if remainder > 0:
                    time.sleep(remainder)
        finally:
            self.phase.__exit__(kind, value, traceback)


def charged(level: str, operation: str, messages: int, nbytes: float,
            counted: str | None = None) -> Charge:
    """Time, count and (inter-node) charge one communication operation (a ``with`` block).

    ``counted``: the counter of its bytes and messages when not the level's (``mpi``).
    """
    return Charge(level, operation, messages, nbytes, counted)
