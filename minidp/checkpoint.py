"""Checkpoints: every rank's full state after an epoch, written atomically, resumed exactly.

Layout under ``--out``::

    checkpoints/epoch-0003/meta.json       epoch, world size, strategy, run time so far
    checkpoints/epoch-0003/rank-00000.npz  one per rank: parameters, buffers, optimizer,
                                           LR-scheduler step, strategy state, RNG states

Each rank writes (and fsyncs) its file into ``epoch-0003.tmp``; after a barrier rank 0
writes ``meta.json`` and renames the directory, so a checkpoint either exists whole or
not at all (a crash leaves only a ``.tmp`` directory, which is ignored and replaced).
Every rank keeps its own file because replicas may differ in their optimizer state
(momentum is per replica in ``hsgd``, ``hbsgd`` and ``daso``). The two newest
checkpoints are kept.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
from typing import Any

import numpy as np

from minidp.comm import Topology, guard

KEEP = 2


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save(out: str, epoch: int, topology: Topology, arrays: dict[str, np.ndarray],
         state: dict[str, Any], meta: dict[str, Any]) -> str:
    """Collectively write the checkpoint of ``epoch`` (1-based, completed); returns its path.

    ``arrays`` are this rank's numeric state, ``state`` its JSON-able state; ``meta``
    (rank 0's) describes the run.
    """
    root = os.path.join(out, "checkpoints")
    final = os.path.join(root, f"epoch-{epoch:04d}")
    tmp = final + ".tmp"
    if topology.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    guard.barrier(topology.world, "checkpoint start")
    path = os.path.join(tmp, f"rank-{topology.rank:05d}.npz")
    with open(path, "wb") as f:
        np.savez(f, state=np.frombuffer(json.dumps(state).encode(), np.uint8), **arrays)
        f.flush()
        os.fsync(f.fileno())
    guard.barrier(topology.world, "checkpoint written")
    if topology.rank == 0:
        with open(os.path.join(tmp, "meta.json"), "w") as f:
            json.dump(dict(meta, epoch=epoch, world_size=topology.size), f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        shutil.rmtree(final, ignore_errors=True)
        os.rename(tmp, final)
        _fsync_dir(root)
        for old in complete(out)[:-KEEP]:
            shutil.rmtree(old, ignore_errors=True)
    guard.barrier(topology.world, "checkpoint renamed")
    return final


def complete(out: str) -> list[str]:
    """Finished checkpoint directories under ``out``, oldest first."""
    found = glob.glob(os.path.join(out, "checkpoints", "epoch-[0-9][0-9][0-9][0-9]"))
    return sorted(d for d in found if os.path.exists(os.path.join(d, "meta.json")))


def load(out: str, topology: Topology) -> tuple[dict[str, Any], dict[str, np.ndarray],
                                                 dict[str, Any]]:
    """(meta, this rank's arrays, this rank's state) of the latest checkpoint in ``out``."""
    found = complete(out)
    latest = topology.world.bcast(found[-1] if found and topology.rank == 0 else None)
    if latest is None:
        raise FileNotFoundError(f"rank {topology.rank}: --resume: no complete checkpoint in "
                                f"'{os.path.join(out, 'checkpoints')}'")
    with open(os.path.join(latest, "meta.json")) as f:
        meta = json.load(f)
    if meta["world_size"] != topology.size:
        raise ValueError(f"rank {topology.rank}: --resume: checkpoint '{latest}' was written by "
                         f"{meta['world_size']} ranks, this job has {topology.size}")
    path = os.path.join(latest, f"rank-{topology.rank:05d}.npz")
    if not os.path.exists(path):
        raise FileNotFoundError(f"rank {topology.rank}: --resume: '{path}' is missing")
    with np.load(path) as data:
        arrays = {k: data[k] for k in data.files if k != "state"}
        state = json.loads(bytes(data["state"]).decode())
    return meta, arrays, state
