"""Checkpoints: every rank's full state after an epoch, written atomically, resumed exactly.

Layout under ``--out``::

    checkpoints/epoch-0003/meta.json       the record (format 2): the run's id, the
                                           checkpoint's name and write sequence, epoch,
                                           batch, world size, the node of every rank, the
                                           run's configuration, the epochs so far, the
                                           dataset files, and a CRC-32 of all that
    checkpoints/epoch-0003/rank-00000.npz  one per rank: parameters, buffers, optimizer
                                           state, the JSON state (LR-scheduler step,
                                           strategy state, RNG states), and a header
                                           naming its run, checkpoint, sequence and rank
    checkpoints/epoch-0003-batch-00042/    after epoch 3 and 42 batches of epoch 4: a
                                           run stopped between batches on a signal
                                           (:mod:`minidp.run.stopping`); the rank files also
                                           hold the partial epoch's loss sums

**Whose it is** (:mod:`minidp.run.owned`). A checkpoint is this run's when its name is
exactly a checkpoint's, it is a directory (not a link), and its ``meta.json`` is a
regular file that matches its CRC and names this run's id (:mod:`minidp.run.claim`) and
this name. Nothing else in ``checkpoints/`` is ever chosen, rotated or removed:
a user's copies kept beside them (``epoch-0003-copy``, ``best/``) stay as they are, and
an entry under one of minidp's exact names that is not this run's checkpoint (another
run's, a file, a link, a damaged record) makes the run refuse to start, naming it;
minidp would otherwise have to choose past it, or write over it.

**Whole or not at all.** Each rank writes (and fsyncs) its file into the scratch
directory ``epoch-0003.tmp-RUNID``; once every rank's is written rank 0 writes
``meta.json`` and renames the directory, so a checkpoint exists whole or not at all. A
crash leaves only the scratch directory, which carries the run's id: it is recognised
and replaced by the next save, and never taken for a checkpoint. Each step is agreed by
all ranks (:func:`minidp.run.files.agree`): a write that fails on any rank (a full
disk) is one error on every rank naming the file, and the scratch directory is removed.
Every rank keeps its own file because replicas may differ in their optimizer state
(momentum is per replica in ``hsgd``, ``hbsgd`` and ``daso``).

**Rotation** follows write order, not epoch numbers: ``meta.json`` holds a ``sequence``
one above the highest of the run's checkpoints, the :data:`KEEP` most recently written
are kept, and the one just written is never removed. An older one is first renamed to
``NAME.old-RUNID``, then emptied and removed, so a crash while removing never leaves a
checkpoint's name without its record; one holding a file minidp did not write is kept.

**Resuming** (:func:`load`) checks everything before anything is restored: the record
(:mod:`minidp.run.compatible`: format version, keys, types, the settings and dataset
files of the run), then, on every rank, its file: the header (this run, this
checkpoint, this sequence, this rank), every array's name, shape and dtype against what
this run holds (read from the ``.npy`` headers before any array is read, so a forged
shape allocates nothing), the JSON state's layout. Only when every rank's file checks
is the state restored; any problem is one error on every rank, naming the file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp.comm import Topology, guard
from minidp.io.atomic import write_failed
from minidp.io.nofollow import REGULAR, Directory, WrongKind
from minidp.run import owned, rank_file
from minidp.run.compatible import FORMAT, check_meta, check_resumable, checksum
from minidp.run.errors import UsageError
from minidp.run.files import agree
from minidp.run.owned import DIRECTORY, META
from minidp.run.rank_file import Expected

KEEP = 2


def name(epoch: int, batch: int = 0) -> str:
    """The directory name of the checkpoint after ``epoch`` epochs and ``batch`` batches."""
    return f"epoch-{epoch:04d}" + (f"-batch-{batch:05d}" if batch else "")


def _named(path: str, write: Callable[[], Any]) -> Any:
    """``write()``; an OSError becomes one line naming ``path`` (a full disk says none)."""
    try:
        return write()
    except OSError as exc:
        raise write_failed(path, exc) from None


def _open_checkpoints(out: str, create: bool = False) -> Directory:
    with Directory.open(out) as run:
        return run.child(DIRECTORY, create=create)


def save(out: str, run_id: str, epoch: int, topology: Topology, arrays: dict[str, np.ndarray],
         state: dict[str, Any], meta: dict[str, Any], config: dict[str, Any],
         batch: int = 0, after_write: Callable[[], None] | None = None) -> str:
    """Collectively write the checkpoint of ``epoch`` (1-based, completed); returns its path.

    Args:
        out: the run directory.
        run_id: the run's id (its claim's), carried by every file of the checkpoint.
        epoch: epochs completed.
        topology: the job's ranks.
        arrays: this rank's numeric state.
        state: this rank's JSON-able state.
        meta: rank 0's description of the run (``strategy``, ``history``, ``data``).
        config: the run's configuration (``dataclasses.asdict``), checked on resume.
        batch: batches of the next epoch done (a stop between batches), else 0.
        after_write: called once this rank's file is on disk, before any rank waits for
            the others (the fault injection point ``kill-in-save``, :mod:`minidp.run.faults`).
    """
    final = name(epoch, batch)
    tmp, old = f"{final}.tmp-{run_id}", f"{final}.old-{run_id}"
    rank, world = topology.rank, topology.world
    root = os.path.join(out, DIRECTORY)
    sequence = [0]

    def start() -> None:  # rank 0: a scratch directory left by a killed save is replaced
        if rank == 0:
            with _named(root, lambda: _open_checkpoints(out, create=True)) as ck:
                if ck.kind(tmp) is not None:
                    _named(ck.path(tmp), lambda: owned.discard(ck, tmp))
                _named(ck.path(tmp), lambda: ck.mkdir(tmp))
                found = owned.checkpoints_in(ck, run_id).found
                sequence[0] = max((f.meta["sequence"] for f in found), default=0) + 1

    def write_own() -> None:
        path = os.path.join(root, tmp, f"rank-{rank:05d}.npz")
        header = {"format": FORMAT, "run_id": run_id, "name": final, "sequence": sequence[0],
                  "rank": rank, "world_size": topology.size}

        def write() -> None:
            with _open_checkpoints(out) as ck, ck.child(tmp) as d, \
                    d.create(f"rank-{rank:05d}.npz") as f:
                rank_file.write(f, header, state, arrays)
        _named(path, write)
        if after_write is not None:
            after_write()

    def finish() -> None:  # rank 0: the record, then the rename that makes it whole
        if rank:
            return
        record = dict(meta, format=FORMAT, run_id=run_id, name=final, sequence=sequence[0],
                      epoch=epoch, batch=batch, world_size=topology.size,
                      nodes=topology.nodes_of_ranks, config=config)
        record["checksum"] = checksum(record)
        with _named(root, lambda: _open_checkpoints(out)) as ck:
            _named(os.path.join(root, tmp, META), lambda: _write_meta(ck, tmp, record))
            _named(ck.path(final), lambda: _publish(ck, tmp, final, old, run_id))
            # Past the KEEP newest: never the one just written, nor one holding a user's file.
            for f in owned.checkpoints_in(ck, run_id).found[:-KEEP]:
                if f.name != final and not f.others:
                    _named(ck.path(f.name), lambda f=f: owned.retire(ck, f.name, run_id))

    try:
        agree(world, rank, start)  # each step agreed by every rank
        sequence[0] = guard.bcast_object(world, sequence[0], 0, "checkpoint sequence")
        agree(world, rank, write_own)
        agree(world, rank, finish)
    except OSError:
        if rank == 0:  # a failed checkpoint leaves no scratch behind (the last whole one stays)
            try:
                with _open_checkpoints(out) as ck:
                    if ck.kind(tmp) is not None:
                        owned.discard(ck, tmp)
            except OSError:
                pass  # the failure itself (a removed directory, say) is what is reported
        raise
    return os.path.join(root, final)


def _write_meta(ck: Directory, tmp: str, record: dict[str, Any]) -> None:
    with ck.child(tmp) as d:
        with d.create(META, "w") as f:
            json.dump(record, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        d.fsync()


def _publish(ck: Directory, tmp: str, final: str, old: str, run_id: str) -> None:
    """Rename the scratch directory ``tmp`` to ``final``; this run's ``final`` is replaced."""
    if ck.kind(final) is not None:  # this run's own (the survey at the start refused others)
        found = owned.as_checkpoint(ck, final, run_id)
        if not isinstance(found, owned.Found):
            raise WrongKind(f"'{ck.path(final)}' is not a checkpoint of this run ({found}); "
                            "minidp does not replace it: move it away")
        if ck.kind(old) is not None:
            owned.discard(ck, old)
        ck.rename(final, old)
    ck.rename(tmp, final)
    ck.fsync()
    if ck.kind(old) is not None:
        owned.discard(ck, old)


Restore = Callable[[dict[str, Any], dict[str, np.ndarray], dict[str, Any]], None]


def load(out: str, run_id: str, topology: Topology, config: dict[str, Any], expected: Expected,
         check_state: Callable[[Any, dict[str, Any]], list[str]], restore: Restore,
         data: dict[str, dict[str, Any]] | None = None) -> dict:
    """Collectively check, then load, this run's latest checkpoint in ``out``; returns its meta.

    Rank 0 surveys ``out`` and checks the latest record against ``config`` and ``data``
    (the dataset files' identity); then every rank reads its file (rank 0's when the
    world size changed, ``sync`` only) and checks it (module doc). Only when every rank's
    file checks does each pass ``(meta, arrays, state)`` to ``restore``.

    Args:
        out: the run directory.
        run_id: this run's id (its claim's).
        topology: the job's ranks.
        config: this run's configuration (``dataclasses.asdict``).
        expected: this rank's arrays: name -> (shape, dtype).
        check_state: the problems of a file's JSON state, given the record (sentences;
            [] when it fits).
        restore: puts the state into the run.
        data: this run's dataset files' identity; None skips their comparison.

    Raises:
        UsageError: on every rank, when there is nothing to resume or it does not fit.
    """
    world, found = topology.world, None
    if topology.rank == 0:
        try:
            found = _latest(out, run_id, config, topology, data)
        except UsageError as exc:
            found = str(exc)
    found = guard.bcast_object(world, found, 0, "checkpoint to resume")
    if isinstance(found, str):
        raise UsageError(found)
    latest, meta = found
    source = topology.rank if meta["world_size"] == topology.size else 0
    own = f"rank-{source:05d}.npz"
    path = os.path.join(latest, own)
    loaded, problems = None, ["it is missing"]
    try:
        with _open_checkpoints(out) as ck, ck.child(meta["name"]) as d:
            kind = d.kind(own)
            if kind not in (None, REGULAR):
                problems = [f"it is {kind}, not a regular file that minidp wrote"]
            elif kind is not None:
                with d.open_read(own) as f:
                    loaded, problems = rank_file.read(f, expected, meta, source, check_state)
    except OSError as exc:  # the checkpoint's directory swapped meanwhile, say
        problems = [str(exc) if exc.errno is None else f"it cannot be read ({exc.strerror})"]
    _agree_loaded(world, path, problems)
    try:
        restore(meta, *loaded)
        problems = []
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        problems = [f"it holds a state this run cannot take ({type(exc).__name__}: {exc})"]
    _agree_loaded(world, path, problems)
    return meta


def _agree_loaded(world: Any, path: str, problems: list[str]) -> None:
    """Every rank's problems with its file, as one error on every rank."""
    mine = f"'{path}': {'; '.join(problems)}" if problems else None
    every = [p for p in guard.allgather_object(world, mine, "checkpoint loaded") if p]
    if every:
        more = f" (and {len(every) - 1} more rank file(s))" if len(every) > 1 else ""
        raise UsageError(f"--resume: {every[0]}{more}; move that checkpoint away to resume "
                         "from an earlier one, or start over (--overwrite, or another --out)")


def _latest(out: str, run_id: str, config: dict[str, Any], topology: Topology,
            data: dict[str, dict[str, Any]] | None) -> tuple[str, dict[str, Any]]:
    """Rank 0: (directory, record) of this run's latest checkpoint, checked against the run."""
    try:
        with Directory.open(out) as run:
            checkpoints = owned.survey_checkpoints(run, run_id)
    except OSError as exc:
        raise UsageError(f"--resume: '{os.path.join(out, DIRECTORY)}' cannot be read: "
                         f"{exc}") from None
    if checkpoints.problems:
        raise UsageError(f"--resume: {'; '.join(checkpoints.problems)}; minidp chooses only "
                         "among the checkpoints it wrote and never removes what it did not "
                         "write: move that away")
    if not checkpoints.found:
        raise UsageError(f"--resume: no complete checkpoint of this run in "
                         f"'{os.path.join(out, DIRECTORY)}'")
    last = checkpoints.found[-1]
    where = os.path.join(out, DIRECTORY, last.name)
    check_meta(last.meta, last.name, os.path.join(where, META))
    if name(last.meta["epoch"], last.meta["batch"]) != last.name:
        raise UsageError(f"--resume: '{os.path.join(where, META)}' records epoch "
                         f"{last.meta['epoch']} and batch {last.meta['batch']}, not its "
                         f"directory's name {last.name!r}; move that checkpoint away")
    check_resumable(last.meta, config, topology.size, where, data, topology.nodes_of_ranks)
    return where, last.meta
