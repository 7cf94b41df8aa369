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
from minidp.run import checkpoint, owned
from minidp.run.compatible import is_int, is_number
from minidp.strategies import Strategy

# The JSON state of a rank file: its keys and what each holds.
STATE = {"lr": is_number, "optimizer_step": is_int, "scheduler_step": is_int,
         "dropout": lambda v: isinstance(v, list) and all(isinstance(d, dict) for d in v),
         "strategy": lambda v: isinstance(v, dict),
         "totals": lambda v: isinstance(v, dict) and is_number(v.get("elapsed_s", "")) and
         is_int(v.get("steps")) and all(is_number(x) for x in v.values()),
         "partial": lambda v: v is None or (isinstance(v, dict) and set(v) == set(PARTIAL) and
                                            all(is_int(v[k]) and v[k] >= 0 for k in PARTIAL[1:])
                                            and is_number(v["loss_sum"]))}
PARTIAL = ("loss_sum", "batch", "steps", "samples")


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


def refuse_non_finite(model: layers.Module, topology: Topology, epoch: int,
                      advice: Callable[[], str]) -> None:
    """Non-finite parameters on any rank are an error on every rank, never a checkpoint.

    ``advice()``: what to do instead (:func:`how_to_continue`), asked only then.
    """
    bad = first_non_finite(model, "data")
    worst = world_max(np.array([topology.rank if bad else -1.0]), topology,
                      "checkpoint parameters finite")
    if worst[0] >= 0:
        whose = (f"its parameter {bad!r} is" if bad else
                 f"rank {int(worst[0])}'s parameters are")
        raise FloatingPointError(f"rank {topology.rank}: not writing the checkpoint after "
                                 f"epoch {epoch}: {whose} not finite; {advice()}")


def check_finite(model: layers.Module, topology: Topology, epoch: int, test_loss: float,
                 out: str, run_id: str, lr: float) -> None:
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
    verb = "is" if worst < 0 else "are"
    raise FloatingPointError(f"rank {topology.rank}: the run diverged: {' and '.join(found)} "
                             f"{verb} not finite after epoch {epoch}; "
                             f"{how_to_continue(out, run_id, lr)}")


def how_to_continue(out: str, run_id: str, lr: float) -> str:
    """What to do after a divergence, from what ``out`` holds.

    Resume its last checkpoint (named) with a lower rate, or, with none, start the run
    over with one (``--overwrite``: the directory holds the diverged run).
    """
    written = owned.written(out, run_id)
    lower = f"--lr {lr / 10:g}"
    if written:
        return (f"the last checkpoint, '{written[-1]}', is finite: continue from it with a "
                f"lower rate: --resume --out {out} {lower}")
    return (f"no checkpoint of this run was written (there is nothing to resume): start it "
            f"over with a lower rate: --overwrite --out {out} {lower}")


def _dropouts(model: layers.Module) -> list[layers.Dropout]:
    return [m for _, m in model.named_modules() if isinstance(m, layers.Dropout)]


def _arrays(parts: Parts) -> dict[str, Any]:
    """The rank's arrays a checkpoint holds, by name (the arrays themselves, not copies)."""
    arrays = {"params": parts.strategy.flat.data, "optimizer": parts.optimizer.state}
    arrays.update({f"buffer:{k}": b for k, b in parts.model.named_buffers()})
    return arrays


def state_problems(state: Any, meta: dict[str, Any], dropouts: int) -> list[str]:
    """Why ``state`` (a rank file's JSON state) is not one this run can restore, or [].

    Args:
        state: the JSON state read from the file.
        meta: the checkpoint's record (a partial epoch is where its name says).
        dropouts: this model's Dropout layers (one generator state each).
    """
    if not isinstance(state, dict):
        return ["its state is not a JSON object"]
    if set(state) != set(STATE):
        return [f"its state's keys are {sorted(state)}, not {sorted(STATE)}"]
    bad = [k for k, fits in STATE.items() if not fits(state[k])]
    if bad:
        return [f"its state has no valid {', '.join(bad)}"]
    problems = []
    if len(state["dropout"]) != dropouts:
        problems.append(f"its state has {len(state['dropout'])} dropout generator(s), this "
                        f"model has {dropouts}")
    batch = state["partial"]["batch"] if state["partial"] else 0
    if batch != meta["batch"]:
        problems.append(f"its state stopped at batch {batch}, its checkpoint at batch "
                        f"{meta['batch']}")
    return problems


def save(out: str, run_id: str, epoch: int, topology: Topology, config: dict[str, Any],
         parts: Parts, record: Record, data: dict[str, dict[str, Any]],
         after_write: Callable[[], None] | None = None) -> str:
    """Collectively write the checkpoint after ``epoch`` epochs; returns its directory.

    Args:
        out: the run directory.
        run_id: the run's id (its claim's).
        epoch: epochs completed (``record.partial``: and that many batches of the next).
        topology: the job's ranks.
        config: the run's configuration (``dataclasses.asdict``), checked on resume.
        parts: this rank's model, strategy, optimizer and scheduler.
        record: the run so far.
        data: the dataset files' identity (``TrainingData.identity``), checked on resume.
        after_write: called once this rank's file is on disk (a fault injection point).
    """
    refuse_non_finite(parts.model, topology, epoch,
                      lambda: how_to_continue(out, run_id, config["lr"]))
    arrays = {k: np.array(v) for k, v in _arrays(parts).items()}
    state = {"lr": parts.optimizer.lr, "optimizer_step": parts.optimizer.step_count,
             "scheduler_step": parts.scheduler.last_step,
             "dropout": [m.rng.bit_generator.state for m in _dropouts(parts.model)],
             "strategy": parts.strategy.state_dict(), "totals": record.totals,
             "partial": record.partial}
    return checkpoint.save(out, run_id, epoch, topology, arrays, state,
                           {"strategy": config["strategy"], "history": record.history,
                            "data": data},
                           config, batch=record.partial["batch"] if record.partial else 0,
                           after_write=after_write)


def restore(out: str, run_id: str, topology: Topology, config: dict[str, Any], parts: Parts,
            batches: int, data: dict[str, dict[str, Any]]) -> tuple[int, Record]:
    """Restore this run's latest checkpoint in ``out``, checked against the run first.

    Returns the checkpoint's epoch and the run's record. Nothing is restored until every
    rank's file has checked (:func:`minidp.run.checkpoint.load`): the record against
    ``config`` and ``data``, each array's name, shape and dtype against this rank's
    parts, the JSON state against :data:`STATE` (:func:`state_problems`). The learning
    rate is the schedule's (this run's ``--lr``) at the restored step, so a resume with a
    new ``--lr`` takes it from its first step. On another world size (``sync`` only)
    every rank takes rank 0's state; the scheduler continues at the same epoch (in this
    job's ``batches`` per epoch), dropout masks restart from (seed, rank, epoch), and the
    byte counters count from here.
    """
    record = Record()
    dropouts = _dropouts(parts.model)

    def load(meta: dict, arrays: dict[str, np.ndarray], state: dict) -> None:
        same_world = meta["world_size"] == topology.size
        parts.strategy.flat.data[...] = arrays["params"]
        parts.optimizer.load_state_dict({"lr": state["lr"], "step": state["optimizer_step"],
                                         "state": arrays["optimizer"]})
        for key, b in parts.model.named_buffers():
            b[...] = arrays[f"buffer:{key}"]
        for module, saved in zip(dropouts, state["dropout"]):
            # Set in place: a GPU replica's Dropout shares this generator.
            module.rng.bit_generator.state = saved if same_world else np.random.default_rng(
                [config["seed"], topology.rank, meta["epoch"]]).bit_generator.state
        parts.scheduler.last_step = (state["scheduler_step"] if same_world
                                     else meta["epoch"] * batches)
        parts.optimizer.lr = parts.scheduler.schedule(parts.scheduler.last_step)
        parts.strategy.load_state_dict(state["strategy"])
        record.totals = (dict(state["totals"]) if same_world
                         else {"elapsed_s": float(state["totals"]["elapsed_s"]), "steps": 0})
        record.partial = state["partial"]
        record.history = list(meta["history"])

    expected = {k: (tuple(v.shape), np.dtype(v.dtype)) for k, v in _arrays(parts).items()}
    meta = checkpoint.load(out, run_id, topology, config, expected,
                           lambda state, meta: state_problems(state, meta, len(dropouts)),
                           load, data)
    return int(meta["epoch"]), record
