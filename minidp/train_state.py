"""A Trainer's checkpoint: what it holds, the refusal to save non-finite parameters, resume.

The state is the components' own, taken from the host model (on a GPU the replica's
BatchNorm statistics came down at the epoch's end, :mod:`minidp.replica`)::

    arrays   params (the strategy's flat parameters), optimizer (its flat state),
             buffer:NAME (BatchNorm statistics)
    state    lr, optimizer_step, scheduler_step, dropout (generator states),
             strategy (its state_dict), totals (steps, seconds, bytes), partial (where
             an epoch stopped between batches, or None)
    meta     strategy, history (the epochs' metrics so far)

:mod:`minidp.checkpoint` writes and reads them (atomically, every rank its own part)
and refuses a checkpoint of another configuration.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import numpy as np

from minidp import checkpoint, layers
from minidp.comm import world_max

if TYPE_CHECKING:
    from minidp.train import Trainer


def first_non_finite(model: layers.Module, field: str) -> str | None:
    """The name of the first parameter whose ``field`` (data or grad) is not all finite."""
    return next((name for name, p in model.named_parameters()
                 if not np.all(np.isfinite(getattr(p, field)))), None)


def refuse_non_finite(trainer: Trainer, epoch: int) -> None:
    """Non-finite parameters on any rank are an error on every rank, never a checkpoint."""
    bad = first_non_finite(trainer.model, "data")
    worst = world_max(np.array([trainer.rank if bad else -1.0]), trainer.topology,
                      "checkpoint parameters finite")
    if worst[0] >= 0:
        whose = (f"its parameter {bad!r} is" if bad else
                 f"rank {int(worst[0])}'s parameters are")
        raise FloatingPointError(f"rank {trainer.rank}: not writing the checkpoint after "
                                 f"epoch {epoch}: {whose} not finite; lower --lr, or "
                                 "resume from the last checkpoint")


def _dropouts(model: layers.Module) -> list[layers.Dropout]:
    return [m for _, m in model.named_modules() if isinstance(m, layers.Dropout)]


def save(trainer: Trainer, epoch: int, partial: dict[str, Any] | None = None) -> str:
    """Write the checkpoint after ``epoch`` epochs (and ``partial``'s batches of the next).

    Returns the checkpoint's directory.
    """
    refuse_non_finite(trainer, epoch)
    t = trainer
    arrays = {"params": np.array(t.strategy.flat.data), "optimizer": np.array(t.optimizer.state)}
    arrays.update({f"buffer:{k}": np.array(b) for k, b in t.model.named_buffers()})
    state = {"lr": t.optimizer.lr, "optimizer_step": t.optimizer.step_count,
             "scheduler_step": t.scheduler.last_step,
             "dropout": [m.rng.bit_generator.state for m in _dropouts(t.model)],
             "strategy": t.strategy.state_dict(), "totals": t.totals, "partial": partial}
    return checkpoint.save(t.config.out, epoch, t.topology, arrays, state,
                           {"strategy": t.config.strategy, "history": t.history},
                           dataclasses.asdict(t.config),
                           batch=partial["batch"] if partial else 0,
                           after_write=lambda: t.injector.in_save(epoch))


def restore(trainer: Trainer) -> int:
    """Restore the latest checkpoint in --out, checked against this run; returns its epoch.

    On another world size (``sync`` only) every rank takes rank 0's state; the
    scheduler continues at the same epoch (in this job's batches), dropout masks
    restart from (seed, rank, epoch), and the byte counters count from here.
    """
    t = trainer

    def load(meta: dict, arrays: dict[str, np.ndarray], state: dict) -> None:
        same_world = meta["world_size"] == t.size
        t.strategy.flat.data[...] = arrays["params"]
        t.optimizer.load_state_dict({"lr": state["lr"], "step": state["optimizer_step"],
                                     "state": arrays["optimizer"]})
        for key, b in t.model.named_buffers():
            b[...] = arrays[f"buffer:{key}"]
        for module, saved in zip(_dropouts(t.model), state["dropout"]):
            # Set in place: a GPU replica's Dropout shares this generator.
            module.rng.bit_generator.state = saved if same_world else \
                np.random.default_rng([t.config.seed, t.rank, meta["epoch"]]).bit_generator.state
        t.scheduler.last_step = (state["scheduler_step"] if same_world
                                 else meta["epoch"] * t.batches)
        t.optimizer.lr = state["lr"]
        t.strategy.load_state_dict(state["strategy"])
        t.totals = (dict(state["totals"]) if same_world
                    else {"elapsed_s": float(state["totals"]["elapsed_s"]), "steps": 0})
        t.partial = state.get("partial")
        t.history = list(meta["history"])

    meta = checkpoint.load(t.config.out, t.topology, dataclasses.asdict(t.config), load)
    return int(meta["epoch"])
