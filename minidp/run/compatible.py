"""Whether a checkpoint can continue this run: its record read strictly, then compared.

Two checks, both before anything is restored (:func:`minidp.run.checkpoint.load`):

* :func:`check_meta`: ``meta.json`` is a record this minidp wrote and reads: its format
  version is :data:`FORMAT` (another is refused, naming both), it has exactly the keys
  :data:`META` with their types (an unknown key is refused: a newer minidp's, or not
  minidp's), its name agrees with its epoch and batch, its history has one row per
  finished epoch with the values that the run's tables read;
* :func:`check_resumable`: the settings that change the computation
  (:data:`COMPUTATION`) are the checkpoint's, and so are the dataset files (header and
  payload checksums, from :func:`minidp.io.training_data.file_identity`: a file
  rewritten with other records is refused, naming it); ``--epochs`` may grow unless
  something depends on the total (a cosine, step or poly schedule; DASO's cool-down),
  and a checkpoint at or past ``--epochs`` is a finished run. ``--lr`` may change (the
  advice after a divergence is to resume with a lower rate). Another world size is
  allowed only where every replica holds the same state (``sync``); a checkpoint
  taken between batches resumes on its own world size only (its position in the
  epoch is a position in each rank's shard). Both rules are facts on the strategy's
  class: ``Strategy.fixed_epochs(options)`` and ``Strategy.any_world_size``.

Every problem found is listed in one message, each with both values.
"""

from __future__ import annotations

import json
import zlib
from typing import Any

from minidp.run.errors import UsageError
from minidp.strategies import STRATEGIES, strategy_class
from minidp.trace import PHASES

FORMAT = 2  # 1: the checkpoints of minidp before issue 40 (no format key, no run id)
META = {"format": int, "run_id": str, "name": str, "sequence": int, "epoch": int, "batch": int,
        "world_size": int, "nodes": list, "config": dict, "strategy": str, "history": list,
        "data": dict, "checksum": int}
ROW_NUMBERS = ("train_loss", "test_loss", "test_accuracy", "wall_s", "comm_s")
COMPUTATION = ("model", "dataset", "strategy", "options", "batch_size", "global_batch_size",
               "momentum", "nesterov", "weight_decay", "optimizer", "trust_coefficient",
               "schedule", "warmup_epochs", "seed", "train_samples", "test_samples", "reader",
               "ranks_per_node", "dtype", "allreduce")
TOTAL_SCHEDULES = ("cosine", "step", "poly")  # their steps are counted from --epochs


def checksum(meta: dict[str, Any]) -> int:
    """CRC-32 of the record without its ``checksum`` (keys sorted, floats as JSON writes them)."""
    rest = {k: v for k, v in meta.items() if k != "checksum"}
    return zlib.crc32(json.dumps(rest, sort_keys=True, separators=(",", ":")).encode())


def is_int(value: Any) -> bool:
    """An int that is not a bool (JSON's true is no count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float that is not a bool; None (a strict JSON file's non-finite) allowed."""
    return value is None or (isinstance(value, (int, float)) and not isinstance(value, bool))


def _row_problem(row: Any, epoch: int) -> str | None:
    """Why ``row`` is not epoch ``epoch``'s metrics as the Trainer wrote them, or None."""
    if not isinstance(row, dict):
        return f"history row {epoch} is not an object"
    bad = [k for k in ROW_NUMBERS if not is_number(row.get(k, "missing"))]
    bad += [k for k in ("samples", "steps") if not is_int(row.get(k))]
    phases = row.get("phases")
    if not isinstance(phases, dict) or not all(is_number(phases.get(p, "")) for p in PHASES):
        bad.append("phases")
    if row.get("epoch") != epoch or not is_int(row.get("epoch")):
        bad.append(f"epoch (it should be {epoch})")
    return f"history row {epoch} has no valid {', '.join(bad)}" if bad else None


def meta_problems(meta: Any, name: str) -> list[str]:
    """What makes ``meta`` (the meta.json of checkpoint ``name``) unreadable here."""
    if not isinstance(meta, dict):
        return ["it is not a JSON object"]
    if meta.get("format") != FORMAT:
        older = " (minidp before issue 40)" if "format" not in meta else ""
        return [f"its format version is {meta.get('format', 1)}{older}; this minidp reads "
                f"version {FORMAT}"]
    problems = []
    unknown = sorted(set(meta) - set(META))
    if unknown:
        problems.append(f"it has key(s) this minidp does not know: {', '.join(unknown)}")
    wrong = [k for k, kind in META.items()
             if not isinstance(meta.get(k), kind) or (kind is int and not is_int(meta.get(k)))]
    if wrong:
        problems.append(f"it has no valid {', '.join(wrong)}")
        return problems
    if min(meta["epoch"], meta["batch"], meta["sequence"] - 1, meta["world_size"] - 1) < 0:
        problems.append("its epoch, batch, sequence or world size is out of range")
    if meta["name"] != name:
        problems.append(f"its name {meta['name']!r} is not the directory's, {name!r}")
    if len(meta["nodes"]) != meta["world_size"] or not all(map(is_int, meta["nodes"])):
        problems.append(f"its nodes are not one node number for each of its "
                        f"{meta['world_size']} ranks")
    if len(meta["history"]) != meta["epoch"]:
        problems.append(f"its history has {len(meta['history'])} rows for {meta['epoch']} "
                        "finished epochs")
    problems += [p for i, row in enumerate(meta["history"]) if (p := _row_problem(row, i + 1))]
    return problems


def check_meta(meta: Any, name: str, path: str) -> None:
    """Raise UsageError naming ``path`` if ``meta`` (of checkpoint ``name``) is not readable."""
    problems = meta_problems(meta, name)
    if problems:
        raise UsageError(f"--resume: '{path}' is not a checkpoint record this minidp can "
                         f"continue: {'; '.join(problems)}; move that checkpoint away, or "
                         "start over (--overwrite, or another --out)")


def _differences(saved: dict[str, Any], now: dict[str, Any], layout: bool) -> list[str]:
    """``--flag: checkpoint A, now B`` for every computation setting that differs.

    ``layout``: the node of every rank is compared instead of ``--ranks-per-node``.
    """
    found = []
    for name in COMPUTATION:
        if name == "ranks_per_node" and layout:
            continue
        if name == "options":
            old = saved.get("options") if isinstance(saved.get("options"), dict) else {}
            new = now.get("options") or {}
            for key in sorted(set(old) | set(new)):
                if old.get(key, "(unset)") != new.get(key, "(unset)"):
                    found.append(f"{now['strategy']}.{key}: checkpoint "
                                 f"{old.get(key, '(unset)')!r}, now {new.get(key, '(unset)')!r}")
        elif saved.get(name, "(unset)") != now.get(name):
            found.append(f"--{name.replace('_', '-')}: checkpoint "
                         f"{saved.get(name, '(unset)')!r}, now {now.get(name)!r}")
    return found


def _other_files(saved: Any, now: dict[str, dict[str, Any]]) -> list[str]:
    """How the dataset files ``now`` differ from those the checkpoint recorded (``saved``)."""
    if not isinstance(saved, dict):
        return ["the checkpoint records no dataset files' checksums (an older minidp wrote "
                "it), so it cannot tell whether they are the same; start a new run without "
                "--resume"]
    found = []
    for split, file in now.items():
        old = saved.get(split) if isinstance(saved.get(split), dict) else {}
        changed = [f"{what}: checkpoint {old.get(key)}, now {file[key]}"
                   for key, what in (("header_checksum", "header checksum"),
                                     ("payload_checksum", "payload checksum (S1, S2)"))
                   if old.get(key) != file[key]]
        if changed:
            was = f" (the checkpoint's was '{old.get('path')}')" \
                if old.get("path") != file["path"] else ""
            found.append(f"{split} data file '{file['path']}'{was} is another file than the "
                         f"checkpoint's: {', '.join(changed)}")
    return found


def check_resumable(meta: dict[str, Any], config: dict[str, Any], world_size: int,
                    where: str, data: dict[str, dict[str, Any]] | None = None,
                    nodes: list[int] | None = None) -> None:
    """Raise UsageError listing every reason the checkpoint ``meta`` cannot continue ``config``.

    Args:
        meta: the checkpoint's meta.json (``epoch``, ``world_size``, ``config``, ``data``).
        config: this run's configuration (``dataclasses.asdict``).
        world_size: this job's number of ranks.
        where: the checkpoint directory, for the message.
        data: this run's dataset files (``train``, ``test``: path and checksums), compared
            with the checkpoint's; None skips the comparison.
        nodes: this job's node of every rank (``Topology.nodes_of_ranks``). When the
            checkpoint recorded its own, the two layouts are compared instead of
            ``--ranks-per-node``: 2 virtual nodes of 2 on one machine continue a run
            on 2 hosts of 2 ranks, and the reverse.
    """
    saved = meta["config"]
    now = json.loads(json.dumps(config))  # compared as the checkpoint stored it
    layout = nodes is not None and isinstance(meta.get("nodes"), list)
    problems = _differences(saved, now, layout)
    if layout and meta["world_size"] == world_size and meta["nodes"] != nodes:
        problems.append(f"nodes (the node of each rank): checkpoint {meta['nodes']}, now "
                        f"{nodes}")
    if data is not None:
        problems += _other_files(meta.get("data"), json.loads(json.dumps(data)))
    strategy = strategy_class(now["strategy"])
    done, epochs = meta["epoch"], now["epochs"]
    fixed = strategy.fixed_epochs(now["options"])
    if done >= epochs:
        problems.append(f"the run is complete (checkpoint at epoch {done}, --epochs {epochs}); "
                        f"allowed: --epochs above {done} to train on")
    elif saved.get("epochs") != epochs:
        if now["schedule"] in TOTAL_SCHEDULES:
            problems.append(f"--epochs: checkpoint {saved.get('epochs')}, now {epochs}, but "
                            f"--schedule {now['schedule']} counts its steps from the total "
                            "number of epochs, so it cannot change on resume")
        elif fixed:
            problems.append(f"--epochs: checkpoint {saved.get('epochs')}, now {epochs}, but "
                            f"{fixed}, so it cannot change on resume")
    if meta["world_size"] != world_size and meta.get("batch"):
        problems.append(f"world size: checkpoint {meta['world_size']} ranks, now {world_size}; "
                        f"it was taken between batches (batch {meta['batch']} of epoch "
                        f"{done + 1}), a position in each rank's shard, so it resumes only on "
                        f"{meta['world_size']} ranks")
    elif meta["world_size"] != world_size and not strategy.any_world_size:
        anywhere = [name for name, cls in STRATEGIES.items() if cls.any_world_size]
        problems.append(f"world size: checkpoint {meta['world_size']} ranks, now {world_size}; "
                        f"strategy {now['strategy']!r} keeps a different state on every rank, "
                        f"so it resumes only on {meta['world_size']} ranks (allowed on any "
                        f"number: {', '.join(anywhere)})")
    if problems:
        raise UsageError(f"--resume: cannot continue checkpoint '{where}': "
                         + "; ".join(problems))
