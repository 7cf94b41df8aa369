"""A run's checkpoint state: what it holds, the refusal to save non-finite parameters, resume.

The state is the components' own, taken from the host model (on a GPU the replica's
BatchNorm statistics came down at the epoch's end, :mod:`minidp.run.replica`)::

    arrays   params (the strategy's flat parameters), optimizer (its flat state),
             buffer:NAME (BatchNorm statistics)
    state    lr, optimizer_step, scheduler_step, dropout (generator states),
             strategy (its state_dict), totals (steps, seconds, bytes), partial (where
             an epoch stopped between batches, or None)
    meta     strategy, history (the epochs' metrics so far)

:func:`save` and :func:`restore` take the parts they save (:class:`Parts`) and the
run's :class:`Record`, never the Trainer; :mod:`minidp.run.checkpoint` writes and reads
the files (atomically, every rank its own part) and refuses a checkpoint of another
configuration.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp import layers
from minidp.comm import Topology, world_max
from minidp.optim import LRScheduler, Optimizer
from minidp.run import checkpoint
from minidp.strategies import Strategy


@dataclasses.dataclass
class Parts:
    """What a checkpoint saves the state of: one rank's model and what updates it."""

    model: layers.Module
    strategy: Strategy
    optimizer: Optimizer
    scheduler: LRScheduler


@dataclasses.dataclass
class Record:
    """What the run has done so far, beyond the parts' state.

    Attributes:
        history: every finished epoch's metrics (``metrics.jsonl``'s rows).
        totals: this rank's steps and seconds over the run, and its byte and message
            counters (``summary.json`` sums them over the ranks).
        partial: where an epoch stopped between batches on a signal (``batch``, and the
            partial ``loss_sum``, ``steps``, ``samples``), else None.
    """

    history: list[dict[str, Any]] = dataclasses.field(default_factory=list)
    totals: dict[str, Any] = dataclasses.field(
        default_factory=lambda: {"elapsed_s": 0.0, "steps": 0})
    partial: dict[str, Any] | None = None


def first_non_finite(model: layers.Module, field: str) -> str | None:
    """The name of the first parameter whose ``field`` (data or grad) is not all finite."""
    return next((name for name, p in model.named_parameters()
                 if not np.all(np.isfinite(getattr(p, field)))), None)


def refuse_non_finite(model: layers.Module, topology: Topology, epoch: int) -> None:
    """Non-finite parameters on any rank are an error on every rank, never a checkpoint."""
    bad = first_non_finite(model, "data")
    worst = world_max(np.array([topology.rank if bad else -1.0]), topology,
                      "checkpoint parameters finite")
    if worst[0] >= 0:
        whose = (f"its parameter {bad!r} is" if bad else
                 f"rank {int(worst[0])}'s parameters are")
        raise FloatingPointError(f"rank {topology.rank}: not writing the checkpoint after "
                                 f"epoch {epoch}: {whose} not finite; lower --lr, or "
                                 "resume from the last checkpoint")


def check_finite(model: layers.Module, topology: Topology, epoch: int, test_loss: float,
                 out: str, lr: float) -> None:
    """A run whose test loss or parameters are not finite stops here, every rank alike.

    Checked at each epoch's end, before its checkpoint: the last checkpoint written is
    then the last finite state, and the message says how to continue from it.

    Raises:
        FloatingPointError: on every rank, naming the epoch, what is not finite and the
            last (finite) checkpoint to resume with a lower ``--lr`` (exit status 4).
    """
    bad = first_non_finite(model, "data")
    worst = world_max(np.array([topology.rank if bad else -1.0]), topology,
                      "parameters finite")[0]
    if np.isfinite(test_loss) and worst < 0:
        return
    found = [] if np.isfinite(test_loss) else [f"the test loss ({test_loss})"]
    if worst >= 0:
        found.append(f"rank {int(worst)}'s parameters")
    written = checkpoint.complete(out)
    lower = f"--lr {lr / 10:g}"
    advice = (f"the last checkpoint, '{written[-1]}', is finite: continue from it with a lower "
              f"rate, --resume {lower}" if written else
              f"no checkpoint was written: start again with a lower rate, e.g. {lower}")
    verb = "is" if worst < 0 else "are"
    raise FloatingPointError(f"rank {topology.rank}: the run diverged: {' and '.join(found)} "
                             f"{verb} not finite after epoch {epoch}; {advice}")


def _dropouts(model: layers.Module) -> list[layers.Dropout]:
    return [m for _, m in model.named_modules() if isinstance(m, layers.Dropout)]


def save(out: str, epoch: int, topology: Topology, config: dict[str, Any], parts: Parts,
         record: Record, data: dict[str, dict[str, Any]],
         after_write: Callable[[], None] | None = None) -> str:
    """Collectively write the checkpoint after ``epoch`` epochs; returns its directory.

    Args:
        out: the run directory.
        epoch: epochs completed (``record.partial``: and that many batches of the next).
        topology: the job's ranks.
        config: the run's configuration (``dataclasses.asdict``), checked on resume.
        parts: this rank's model, strategy, optimizer and scheduler.
        record: the run so far.
        data: the dataset files' identity (``TrainingData.identity``), checked on resume.
        after_write: called once this rank's file is on disk (a fault injection point).
    """
    refuse_non_finite(parts.model, topology, epoch)
    arrays = {"params": np.array(parts.strategy.flat.data),
              "optimizer": np.array(parts.optimizer.state)}
    arrays.update({f"buffer:{k}": np.array(b) for k, b in parts.model.named_buffers()})
    state = {"lr": parts.optimizer.lr, "optimizer_step": parts.optimizer.step_count,
             "scheduler_step": parts.scheduler.last_step,
             "dropout": [m.rng.bit_generator.state for m in _dropouts(parts.model)],
             "strategy": parts.strategy.state_dict(), "totals": record.totals,
             "partial": record.partial}
    return checkpoint.save(out, epoch, topology, arrays, state,
                           {"strategy": config["strategy"], "history": record.history,
                            "data": data},
                           config, batch=record.partial["batch"] if record.partial else 0,
                           after_write=after_write)


def restore(out: str, topology: Topology, config: dict[str, Any], parts: Parts,
            batches: int, data: dict[str, dict[str, Any]]) -> tuple[int, Record]:
    """Restore the latest checkpoint in ``out``, checked against ``config`` and ``data``.

    Returns the checkpoint's epoch and the run's record. The learning rate is the
    schedule's (this run's ``--lr``) at the restored step, so a resume with a new
    ``--lr`` takes it from its first step. On another world size (``sync`` only) every
    rank takes rank 0's state; the scheduler continues at the same epoch (in this job's
    ``batches`` per epoch), dropout masks restart from (seed, rank, epoch), and the byte
    counters count from here.
    """
    record = Record()

    def load(meta: dict, arrays: dict[str, np.ndarray], state: dict) -> None:
        same_world = meta["world_size"] == topology.size
        parts.strategy.flat.data[...] = arrays["params"]
        parts.optimizer.load_state_dict({"lr": state["lr"], "step": state["optimizer_step"],
                                         "state": arrays["optimizer"]})
        for key, b in parts.model.named_buffers():
            b[...] = arrays[f"buffer:{key}"]
        for module, saved in zip(_dropouts(parts.model), state["dropout"]):
            # Set in place: a GPU replica's Dropout shares this generator.
            module.rng.bit_generator.state = saved if same_world else np.random.default_rng(
                [config["seed"], topology.rank, meta["epoch"]]).bit_generator.state
        parts.scheduler.last_step = (state["scheduler_step"] if same_world
                                     else meta["epoch"] * batches)
        parts.optimizer.lr = parts.scheduler.schedule(parts.scheduler.last_step)
        parts.strategy.load_state_dict(state["strategy"])
        record.totals = (dict(state["totals"]) if same_world
                         else {"elapsed_s": float(state["totals"]["elapsed_s"]), "steps": 0})
        record.partial = state.get("partial")
        record.history = list(meta["history"])

    meta = checkpoint.load(out, topology, config, load, data)
    return int(meta["epoch"]), record
