"""Checkpoints: every rank's full state after an epoch, written atomically, resumed exactly.

Layout under ``--out``::

    checkpoints/epoch-0003/meta.json       epoch, world size, write sequence, the run's
                                           configuration, the epochs so far
    checkpoints/epoch-0003/rank-00000.npz  one per rank: parameters, buffers, optimizer,
                                           LR-scheduler step, strategy state, RNG states
    checkpoints/epoch-0003-batch-00042/    after epoch 3 and 42 batches of epoch 4: a
                                           run stopped between batches on a signal
                                           (:mod:`minidp.run.stopping`); the rank files also
                                           hold the partial epoch's loss sums

Each rank writes (and fsyncs) its file into ``epoch-0003.tmp``; once every rank's is
written rank 0 writes ``meta.json`` and renames the directory, so a checkpoint either
exists whole or not at all (a crash leaves only a ``.tmp`` directory, which is ignored
and replaced). Each step is agreed by all ranks (:func:`minidp.run.files.agree`): a write
that fails on any rank (a full disk) is one error on every rank naming the file, and
the ``.tmp`` directory is removed.
Every rank keeps its own file because replicas may differ in their optimizer state
(momentum is per replica in ``hsgd``, ``hbsgd`` and ``daso``).

Pruning follows write order, not epoch numbers: ``meta.json`` holds a ``sequence`` one
above the highest in the directory, the :data:`KEEP` most recently written checkpoints
are kept, and the one just written is never removed.

Resuming (:func:`load`) first checks what it resumes (:func:`check_resumable`): the
settings that change the computation (:data:`COMPUTATION`) must be the checkpoint's (the
node of every rank, recorded in ``meta.json``, stands for ``--ranks-per-node``, so that
virtual nodes continue a run on real ones of the same layout and the reverse), and so
must the dataset files (``meta.json`` records each file's header and payload checksums,
:func:`minidp.io.training_data.file_identity`: a file rewritten with other records is
refused, naming it); ``--epochs`` may grow unless something depends on the total (a
cosine, step or poly schedule; DASO's cool-down), and a checkpoint at or past
``--epochs`` is a finished run. ``--lr`` may change (the advice after a divergence is to
resume with a lower rate): the schedule restarts from the new base rate at the saved step.
Another world size is allowed for ``sync`` only, where every replica holds the same
state: every rank then loads rank 0's file. That run is not bit-exact with an
uninterrupted one, because the data split over the ranks (and the global batch, with
``--batch-size``) changes; a checkpoint taken between batches resumes on its own world
size only (its position in the epoch is a position in each rank's shard).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp.comm import Topology, guard
from minidp.io.atomic import write_failed
from minidp.run.errors import UsageError
from minidp.run.files import agree

KEEP = 2
COMPUTATION = ("model", "dataset", "strategy", "options", "batch_size", "global_batch_size",
               "momentum", "nesterov", "weight_decay", "optimizer", "trust_coefficient",
               "schedule", "warmup_epochs", "seed", "train_samples", "test_samples", "reader",
               "ranks_per_node", "dtype", "allreduce")
TOTAL_SCHEDULES = ("cosine", "step", "poly")  # their steps are counted from --epochs
ANY_WORLD_SIZE = ("sync",)  # strategies whose replicas all hold the same state


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def name(epoch: int, batch: int = 0) -> str:
    """The directory name of the checkpoint after ``epoch`` epochs and ``batch`` batches."""
    return f"epoch-{epoch:04d}" + (f"-batch-{batch:05d}" if batch else "")


def save(out: str, epoch: int, topology: Topology, arrays: dict[str, np.ndarray],
         state: dict[str, Any], meta: dict[str, Any], config: dict[str, Any],
         batch: int = 0, after_write: Callable[[], None] | None = None) -> str:
    """Collectively write the checkpoint of ``epoch`` (1-based, completed); returns its path.

    Args:
        out: the run directory.
        epoch: epochs completed.
        topology: the job's ranks.
        arrays: this rank's numeric state.
        state: this rank's JSON-able state.
        meta: rank 0's description of the run (``history`` of the epochs so far).
        config: the run's configuration (``dataclasses.asdict``), checked on resume.
        batch: batches of the next epoch done (a stop between batches), else 0.
        after_write: called once this rank's file is on disk, before any rank waits for
            the others (the fault injection point ``kill-in-save``, :mod:`minidp.run.faults`).
    """
    root = os.path.join(out, "checkpoints")
    final = os.path.join(root, name(epoch, batch))
    tmp = final + ".tmp"
    rank, world = topology.rank, topology.world
    path = os.path.join(tmp, f"rank-{rank:05d}.npz")

    def start() -> None:  # a .tmp left by a killed job is replaced, never in the way
        if rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
            _named(tmp, lambda: os.makedirs(tmp, exist_ok=True))

    def write_own() -> None:
        def write() -> None:
            with open(path, "wb") as f:
                np.savez(f, state=np.frombuffer(json.dumps(state).encode(), np.uint8), **arrays)
                f.flush()
                os.fsync(f.fileno())
        _named(path, write)
        if after_write is not None:
            after_write()

    def finish() -> None:  # rank 0: the record, then the rename that makes it whole
        if rank:
            return
        sequence = max((_sequence(d) for d in complete(out)), default=0) + 1
        record = dict(meta, epoch=epoch, batch=batch, world_size=topology.size,
                      nodes=topology.nodes_of_ranks, sequence=sequence, config=config)
        meta_path = os.path.join(tmp, "meta.json")
        _named(meta_path, lambda: _write_json(meta_path, record))
        shutil.rmtree(final, ignore_errors=True)
        _named(final, lambda: (os.rename(tmp, final), _fsync_dir(root)))
        for old in complete(out)[:-KEEP]:
            if old != final:
                shutil.rmtree(old, ignore_errors=True)

    try:
        for step in (start, write_own, finish):  # each step agreed by every rank
            agree(world, rank, step)
    except OSError:
        if rank == 0:  # a failed checkpoint leaves no .tmp behind (the last whole one stays)
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def _named(path: str, write: Callable[[], Any]) -> None:
    """``write()``; an OSError becomes one line naming ``path`` (a full disk says none)."""
    try:
        write()
    except OSError as exc:
        raise write_failed(path, exc) from None


def _write_json(path: str, record: dict[str, Any]) -> None:
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
        f.flush()
        os.fsync(f.fileno())


def _sequence(directory: str) -> int:
    """The write sequence number in ``directory/meta.json`` (0: none recorded, -1: unreadable)."""
    try:
        with open(os.path.join(directory, "meta.json")) as f:
            sequence = json.load(f).get("sequence", 0)
    except (OSError, ValueError, AttributeError):
        return -1
    return sequence if isinstance(sequence, int) else -1


def complete(out: str) -> list[str]:
    """Finished checkpoint directories under ``out``, least recently written first."""
    found = glob.glob(os.path.join(glob.escape(out), "checkpoints", "epoch-[0-9]*"))
    found = [d for d in found if not d.endswith(".tmp")]
    done = [d for d in found if os.path.exists(os.path.join(d, "meta.json"))]
    return sorted(done, key=lambda d: (_sequence(d), d))


def _read_meta(directory: str) -> dict[str, Any]:
    path = os.path.join(directory, "meta.json")
    try:
        with open(path) as f:
            meta = json.load(f)
    except (OSError, ValueError) as exc:
        raise UsageError(f"--resume: '{path}' is unreadable: {exc}") from None
    kinds = {"epoch": int, "world_size": int, "history": list, "config": dict}
    wrong = [k for k, kind in kinds.items()
             if not isinstance(meta, dict) or not isinstance(meta.get(k), kind)]
    if wrong:
        older = " (a checkpoint of an older minidp?)" if "config" in wrong else ""
        raise UsageError(f"--resume: '{path}' is not a usable checkpoint record: no valid "
                         f"{', '.join(wrong)}{older}; start a new run without --resume")
    return meta


def _differences(saved: dict[str, Any], now: dict[str, Any], layout: bool) -> list[str]:
    """``--flag: checkpoint A, now B`` for every computation setting that differs.

    ``layout``: the node of every rank is compared instead of ``--ranks-per-node``.
    """
    found = []
    for name in COMPUTATION:
        if name == "ranks_per_node" and layout:
            continue
        if name == "options":
            old, new = saved.get("options") or {}, now.get("options") or {}
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
    done, epochs = meta["epoch"], now["epochs"]
    if done >= epochs:
        problems.append(f"the run is complete (checkpoint at epoch {done}, --epochs {epochs}); "
                        f"allowed: --epochs above {done} to train on")
    elif saved.get("epochs") != epochs:
        if now["schedule"] in TOTAL_SCHEDULES:
            problems.append(f"--epochs: checkpoint {saved.get('epochs')}, now {epochs}, but "
                            f"--schedule {now['schedule']} counts its steps from the total "
                            "number of epochs, so it cannot change on resume")
        elif now["strategy"] == "daso" and now["options"].get("cooldown_epochs"):
            problems.append(f"--epochs: checkpoint {saved.get('epochs')}, now {epochs}, but "
                            "daso places its cool-down epochs at the end of the run, so it "
                            "cannot change on resume")
    if meta["world_size"] != world_size and meta.get("batch"):
        problems.append(f"world size: checkpoint {meta['world_size']} ranks, now {world_size}; "
                        f"it was taken between batches (batch {meta['batch']} of epoch "
                        f"{done + 1}), a position in each rank's shard, so it resumes only on "
                        f"{meta['world_size']} ranks")
    elif meta["world_size"] != world_size and now["strategy"] not in ANY_WORLD_SIZE:
        problems.append(f"world size: checkpoint {meta['world_size']} ranks, now {world_size}; "
                        f"strategy {now['strategy']!r} keeps a different state on every rank, "
                        f"so it resumes only on {meta['world_size']} ranks (allowed on any "
                        f"number: {', '.join(ANY_WORLD_SIZE)})")
    if problems:
        raise UsageError(f"--resume: cannot continue checkpoint '{where}': "
                         + "; ".join(problems))


Restore = Callable[[dict[str, Any], dict[str, np.ndarray], dict[str, Any]], None]


def load(out: str, topology: Topology, config: dict[str, Any], restore: Restore,
         data: dict[str, dict[str, Any]] | None = None) -> dict:
    """Collectively check and load the latest checkpoint in ``out``; returns its meta.

    Rank 0 reads ``meta.json`` and checks it against ``config`` and ``data`` (the dataset
    files' identity) (:func:`check_resumable`);
    then every rank reads its file (rank 0's when the world size changed, ``sync`` only)
    and passes ``(meta, arrays, state)`` to ``restore``. A missing, corrupt or incomplete
    file on any rank is one error on every rank naming the file, not a traceback.

    Raises:
        UsageError: on every rank, when there is nothing to resume or it does not fit.
    """
    world, found = topology.world, None
    if topology.rank == 0:
        try:
            written = complete(out)
            if not written:
                raise UsageError(f"--resume: no complete checkpoint in "
                                 f"'{os.path.join(out, 'checkpoints')}'")
            meta = _read_meta(written[-1])
            check_resumable(meta, config, topology.size, written[-1], data,
                            topology.nodes_of_ranks)
            found = (written[-1], meta)
        except UsageError as exc:
            found = str(exc)
    found = guard.bcast_object(world, found, 0, "checkpoint to resume")
    if isinstance(found, str):
        raise UsageError(found)
    latest, meta = found
    source = topology.rank if meta["world_size"] == topology.size else 0
    path = os.path.join(latest, f"rank-{source:05d}.npz")
    problem = None
    try:
        with np.load(path) as data:
            arrays = {k: data[k] for k in data.files if k != "state"}
            state = json.loads(bytes(data["state"]).decode())
        restore(meta, arrays, state)
    except KeyError as exc:
        problem = f"'{path}' has no {exc}"
    except (OSError, EOFError, ValueError, TypeError, zipfile.BadZipFile) as exc:
        problem = f"'{path}' is unreadable ({type(exc).__name__}: {exc})"
    problems = [p for p in guard.allgather_object(world, problem, "checkpoint loaded") if p]
    if problems:
        more = f" (and {len(problems) - 1} more rank file(s))" if len(problems) > 1 else ""
        raise UsageError(f"--resume: {problems[0]}{more}; start a new run without --resume")
    return meta
