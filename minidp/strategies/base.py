"""What every distributed strategy has: roles, options, the start-up broadcast, the hooks.

The Trainer drives a strategy through a small interface, the same for the synchronous,
parameter-server and elastic families:

* ``servers_needed(options)`` (class method): how many ranks take the server role; the
  Trainer builds the :class:`~minidp.comm.Topology` with that many;
* ``plan(total_epochs)`` once; ``begin_epoch(epoch, batches)`` on every rank;
* on workers, per step: ``batch_size(base)`` gives the samples to take next (0: this
  worker's epoch is over; a parameter-server worker pulls here), then after backward
  ``step(batch)``; on servers: ``serve()`` until every worker's epoch is over;
* ``end_epoch(epoch, train_loss)`` on every rank, with the loss averaged over workers;
  then ``consensus()`` (may be collective over the world): the parameters the run's
  result is (evaluation, model.npz), and ``epoch_stats()``: extra per-epoch metrics;
* ``state_dict()`` / ``load_state_dict()``: what a checkpoint must hold to resume exactly;
* ``write_events(path)`` at the run's end (collective): an asynchronous strategy's
  record of what it did, for ``python -m minidp replay`` (:mod:`minidp.strategies.events`);
* ``ignored_flags(options)`` (class method): the training flags it does not use, so a
  user who sets one is told.

What the rest of minidp needs to know about a strategy is a fact on its class, never a
table keyed by its name elsewhere: ``default_rates`` (the run's (lr, momentum) without
``--lr`` / ``--momentum``), ``any_world_size`` and ``fixed_epochs(options)`` (whether a
checkpoint resumes on another number of ranks, or with another ``--epochs``:
:mod:`minidp.run.compatible`), ``state_dict()`` (what a checkpoint keeps of it), and
``servers_needed``, ``stops_between_batches``, ``ignores``, ``sgd_only`` below. The
simulator keeps its cost formulas in a table keyed by the class
(:data:`minidp.simulate.predict.COSTS`).

Options are declared per class as :class:`Option` (type, default, allowed range) and
checked on construction; ``--set NAME.option=value`` strings are converted here.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from minidp.comm import (
    ALLREDUCE_ALGORITHMS,
    NodeBuffer,
    Topology,
    broadcast,
    guard,
    shared_buffer,
    world_mean,
)
from minidp.layers import Module
from minidp.optim.optimizer import Optimizer
from minidp.optim.schedules import Schedule
from minidp.optim.sgd import SGD
from minidp.strategies.events import EventLog, write_events
from minidp.trace import tracer


@dataclasses.dataclass(frozen=True)
class Option:
    """One strategy option: its type, default, a check and the words for what is allowed."""

    default: Any
    kind: type
    allowed: str
    check: Callable[[Any], bool] = lambda value: True
    help: str = ""

    def parse(self, strategy: str, name: str, value: Any) -> Any:
        """Convert (from a --set string if need be) and check; raise naming the option."""
        where = f"{strategy}.{name}"
        if isinstance(value, str) and self.kind is not str:
            value = _from_string(where, value, self.kind, self.allowed)
        if self.kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, self.kind) or (self.kind is int and isinstance(value, bool)):
            raise TypeError(f"{where}: got {value!r} ({type(value).__name__}), expected "
                            f"{self.kind.__name__}: {self.allowed}")
        if not self.check(value):
            raise ValueError(f"{where}: got {value!r}, allowed: {self.allowed}")
        return value


def _from_string(where: str, text: str, kind: type, allowed: str) -> Any:
    if kind is bool:
        lowered = text.strip().lower()
        if lowered in ("1", "true", "yes", "on"):
            return True
        if lowered in ("0", "false", "no", "off"):
            return False
        raise TypeError(f"{where}: got {text!r}, expected a bool: true or false")
    try:
        return kind(text)
    except ValueError:
        raise TypeError(f"{where}: got {text!r}, expected {kind.__name__}: {allowed}") from None


class Strategy(abc.ABC):
    """Base of every strategy: it owns communication and the parameter update.

    Args:
        model: the replica on this rank (parameters in one flat buffer).
        optimizer: the local optimizer that applies updates to ``model``.
        topology: nodes, rails and communicators.
        allreduce: the algorithm of ``sync``'s gradient allreduce (``ALLREDUCE_ALGORITHMS``;
            default ``mpi``, MPI's own, as ``--allreduce``). ``comm.allreduce`` called
            without one runs ``hierarchical``; the other strategies name their levels.
        **options: the strategy's own options (see its ``options``).
    """

    name: ClassVar[str]
    options: ClassVar[dict[str, Option]] = {}
    # (lr, momentum) of a run that gives no --lr / --momentum (TrainConfig.check). Each
    # class chooses its own so that every strategy's training loss falls every epoch for
    # 3 epochs on mnist-5k (LeNet-5, batch 32 per worker, 4 ranks; tests/test_defaults.py)
    # and `make demo` reaches 85% (docs/configuration.md); each says why at its value.
    default_rates: ClassVar[tuple[float, float]]
    # Whether every replica holds the same state after every step, so that a checkpoint
    # resumes on another number of ranks (minidp.run.compatible); else only on its own.
    any_world_size: ClassVar[bool] = False
    # Set by gradients_in_shared_memory(): the memory the gradients live in, which the
    # strategy hands to the reductions (zero-copy in the node).
    grad_buffer: NodeBuffer
    # Whether a run may stop between any two batches (a signal, minidp.run.stopping): only
    # where all ranks step together and the state after each step is whole; others stop
    # at the next epoch's end.
    stops_between_batches: ClassVar[bool] = False
    # The training flags (TrainConfig fields) this strategy does not use: a user who sets
    # one is told so, once, at the start (Trainer); see ignored_flags().
    ignores: ClassVar[tuple[str, ...]] = ()
    ignored_hint: ClassVar[str] = ""  # where the ignored flags do something, if anywhere
    # What this rank did, for the replay (asynchronous strategies set it; None: nothing).
    events: EventLog | None = None
    # Why --optimizer must be sgd, where the strategy steps a part of the parameters, or
    # another array, or without momentum (SGD.update; LARS has no such form).
    # Empty: any optimizer.
    sgd_only: ClassVar[str] = ""

    def __init__(self, model: Module, optimizer: Optimizer, topology: Topology,
                 allreduce: str = "mpi", **options: Any) -> None:
        if allreduce not in ALLREDUCE_ALGORITHMS:
            raise ValueError(f"rank {topology.rank}: allreduce: got {allreduce!r}, allowed: "
                             f"{', '.join(ALLREDUCE_ALGORITHMS)}")
        self.model, self.optimizer, self.topology = model, optimizer, topology
        self.algorithm = allreduce
        self.config = self.parse_options(options)
        self.flat = model.flat_parameters()
        if optimizer.flat is not self.flat:
            raise ValueError(f"rank {topology.rank}: the optimizer must be built on "
                             "model.parameters() of this model")
        if self.sgd_only and not isinstance(optimizer, SGD):
            raise ValueError(f"rank {topology.rank}: --optimizer: got "
                             f"{type(optimizer).__name__}, allowed with {self.name}: sgd "
                             f"({self.sgd_only})")
        needed = self.servers_needed(self.config)
        if topology.num_servers != needed:
            raise ValueError(f"rank {topology.rank}: strategy {self.name!r} needs {needed} "
                             f"server rank(s), the topology has {topology.num_servers}")
        self.epoch, self.batches, self.total_epochs, self.base_batch = 0, 0, 1, 1
        self.lr_schedule: Schedule | None = None
        self.steps = 0  # steps taken over the whole run (periods count in these)
        self.taken = 0  # batches this worker has begun in the current epoch
        self.broadcast_parameters()

    @classmethod
    def servers_needed(cls, options: dict[str, Any]) -> int:
        """How many ranks take the server role (the synchronous family: none)."""
        return 0

    @classmethod
    def fixed_epochs(cls, options: dict[str, Any]) -> str | None:
        """Why ``--epochs`` cannot change when a run with ``options`` resumes; None: it can.

        A strategy that places something by the run's total number of epochs says what
        (:func:`minidp.run.compatible.check_resumable` names it in its refusal).
        """
        return None

    @classmethod
    def ignored_flags(cls, options: dict[str, Any]) -> tuple[str, ...]:
        """The training flags this strategy does not use with these (parsed) options."""
        return cls.ignores

    @classmethod
    def ignored_notice(cls, options: dict[str, Any], given: dict[str, Any]) -> str | None:
        """One line for a user who set a flag this strategy does not use; None if none.

        Args:
            options: the strategy's parsed options.
            given: the settings the user gave (flag name -> value); a flag given as 0 or
                false asks for nothing this strategy lacks and is not named.
        """
        chosen = {name: given[name] for name in cls.ignored_flags(options) if given.get(name)}
        unused = [f"--{name.replace('_', '-')}" + ("" if value is True else f" {value}")
                  for name, value in chosen.items()]
        if not unused:
            return None
        hint = f"; {cls.ignored_hint}" if cls.ignored_hint else ""
        return f"note: --strategy {cls.name} ignores {' and '.join(unused)}{hint}"

    @classmethod
    def parse_options(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Defaults overridden by ``values``; unknown names are an error listing the valid."""
        unknown = sorted(set(values) - set(cls.options))
        if unknown:
            valid = ", ".join(sorted(cls.options)) or "(none)"
            raise ValueError(f"strategy {cls.name!r}: unknown option(s) "
                             f"{', '.join(unknown)}; valid options: {valid}")
        return {name: opt.parse(cls.name, name, values.get(name, opt.default))
                for name, opt in cls.options.items()}

    # -- set-up ---------------------------------------------------------------------

    def broadcast_parameters(self) -> None:
        """Start every rank from rank 0's parameters and buffers (not from a shared seed)."""
        sizes = guard.allgather_object(self.topology.world, self.flat.size,
                                       "broadcast parameters")
        if len(set(sizes)) > 1:
            raise ValueError(f"rank {self.topology.rank} has {self.flat.size} parameters, rank "
                             f"0 has {sizes[0]}: every rank must build the same model")
        broadcast(self.flat.data, self.topology, 0, "broadcast parameters")
        for buffer in self.float_buffers():
            broadcast(buffer, self.topology, 0, "broadcast buffers")

    def float_buffers(self) -> list[np.ndarray]:
        """The model's floating-point buffers (BatchNorm statistics), in a fixed order."""
        return [b for _, b in self.model.named_buffers()
                if isinstance(b, np.ndarray) and b.dtype.kind == "f"]

    def gradients_in_shared_memory(self) -> None:
        """Move the flat gradients into the node window (``self.grad_buffer``).

        ``self.flat.grad`` (what the optimizer reads) stays a NumPy array, a view of the
        window; reductions handed ``self.grad_buffer`` reduce it in place, without copies.
        """
        self.grad_buffer = shared_buffer(self.topology, self.flat.size, self.flat.grad.dtype,
                                         name="gradients")
        self.flat.rebind_grad(self.grad_buffer)

    # -- the interface the Trainer drives -----------------------------------------------

    def batch_size(self, base: int) -> int:
        """Samples this worker takes for its next step; 0 when its epoch is over.

        Synchronous strategies take ``base`` samples for ``batches`` steps per epoch.
        """
        if self.taken >= self.batches:
            return 0
        self.taken += 1
        return base

    def plan(self, total_epochs: int, base_batch: int = 1,
             lr_schedule: Schedule | None = None) -> None:
        """Told once, before training: epochs, the per-worker batch size, the LR schedule.

        A server applies updates without the Trainer's scheduler; it reads the learning
        rate from ``lr_schedule`` (None: the optimizer's own ``lr``).
        """
        self.total_epochs, self.base_batch, self.lr_schedule = total_epochs, base_batch, \
            lr_schedule

    def begin_epoch(self, epoch: int, batches: int) -> None:
        """Called before the first batch of ``epoch`` (0-based) of ``batches`` batches."""
        self.epoch, self.batches, self.taken = epoch, batches, 0

    def resume_at(self, batch: int) -> None:
        """The epoch just begun continues after ``batch`` batches done before a stop.

        Only strategies that stop between batches (:attr:`stops_between_batches`) are
        resumed inside an epoch.
        """
        self.taken = batch

    @abc.abstractmethod
    def step(self, batch: int) -> None:
        """Communicate and update the parameters after backward of batch ``batch``."""

    def serve(self) -> None:
        """On a server rank: answer workers until every worker's epoch is over."""
        raise RuntimeError(f"rank {self.topology.rank}: strategy {self.name!r} has no server "
                           "role")

    def end_epoch(self, epoch: int, train_loss: float) -> None:
        """Called on every rank after the epoch with the training loss averaged over workers."""

    def consensus(self) -> np.ndarray:
        """The parameters that are the result (every rank's own once they agree)."""
        return self.flat.data

    def epoch_stats(self) -> dict[str, Any]:
        """Extra JSON-able metrics of the epoch just ended (rank 0's go to metrics.jsonl)."""
        return {}

    def state_dict(self) -> dict[str, Any]:
        """Strategy state a checkpoint must hold (beyond parameters and optimizer)."""
        return {"steps": self.steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`."""
        self.steps = int(state["steps"])

    def write_events(self, path: str, tag: str | None = None) -> None:
        """Collective at the run's end: the ranks' event rows into ``path`` (none: no file).

        ``tag``: the run's id, which names the temporary file (:func:`write_events`).
        """
        if self.events is not None:
            write_events(path, self.name, self.topology, self.events, tag)

    # -- helpers for subclasses -----------------------------------------------------------

    def optimizer_step(self) -> None:
        """The local update, timed as the ``optimizer`` phase."""
        with tracer().phase("optimizer"):
            self.optimizer.step()

    def average_parameters(self) -> None:
        """Parameters <- their mean over every rank (hierarchical: node slices, then rails)."""
        world_mean(self.flat.data, self.topology, "hierarchical")

    def check_finite(self, values: np.ndarray | None = None) -> None:
        """Raise (naming rank and epoch) if the parameters are not all finite.

        ``values``: the part of them to check (a rank's slice of DASO's one replica).
        """
        if not np.all(np.isfinite(self.flat.data if values is None else values)):
            raise FloatingPointError(f"rank {self.topology.rank}: parameters are not finite "
                                     f"after a sync in epoch {self.epoch + 1}; lower --lr")
