"""One rank's checkpoint file: what it holds, and how it is read back, checked, before use.

A rank file (``checkpoints/NAME/rank-RRRRR.npz``, :mod:`minidp.run.checkpoint`) is an
uncompressed NumPy ``.npz`` (a zip of ``.npy`` files, each with a CRC-32) of:

* the rank's arrays (``params``, ``optimizer``, ``buffer:NAME``; :mod:`minidp.run.state`);
* ``state``: the rank's JSON state (learning rate, steps, generator states, the
  strategy's state, totals), as UTF-8 bytes;
* ``checkpoint``: a header naming what the file belongs to: format version, the run's
  id, the checkpoint's name and write sequence, the rank and the world size.

:func:`read` takes nothing on trust, in this order: the zip's entries must be exactly
this run's arrays and the two JSON texts; each ``.npy`` header (read before any data)
must give the shape and dtype this run holds, so a forged header allocates nothing;
then the data is read, which checks every entry's CRC-32; then the header must name
this run, this checkpoint (its sequence too: a file of an earlier write of the same
name is refused) and this rank; last the state's layout is checked by the caller's
``check_state``. A file from another run, of another shape or damaged is refused with
the reason, never loaded in part.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from collections.abc import Callable
from typing import Any

import numpy as np

from minidp.run.compatible import FORMAT

JSON_LIMIT = 1 << 26  # bytes of a rank file's header or JSON state (minidp's: kilobytes)
JSON_ENTRIES = ("checkpoint", "state")
# A damaged zip or .npy reaches the reader as any of these.
DAMAGED = (OSError, EOFError, ValueError, TypeError, KeyError, IndexError, NotImplementedError,
           OverflowError, RecursionError, struct.error, zipfile.BadZipFile)
Expected = dict[str, tuple[tuple[int, ...], np.dtype]]


def _json_bytes(value: Any) -> np.ndarray:
    return np.frombuffer(json.dumps(value).encode(), np.uint8)


def write(f: Any, header: dict[str, Any], state: dict[str, Any],
          arrays: dict[str, np.ndarray]) -> None:
    """Write a rank file into the open file ``f``, flushed and fsynced."""
    np.savez(f, checkpoint=_json_bytes(header), state=_json_bytes(state), **arrays)
    f.flush()
    os.fsync(f.fileno())


def _member_problem(key: str, shape: tuple, dtype: np.dtype, expected: Expected) -> str | None:
    """Why the entry ``key`` of this shape and dtype is not what this run holds, or None."""
    if key in JSON_ENTRIES:
        if dtype != np.uint8 or len(shape) != 1 or shape[0] > JSON_LIMIT:
            return f"its {key!r} entry is not JSON text of at most {JSON_LIMIT} bytes"
        return None
    want_shape, want_dtype = expected[key]
    if tuple(shape) != tuple(want_shape) or dtype != want_dtype:
        return (f"its array {key!r} has shape {tuple(shape)} and dtype {dtype}, this run's has "
                f"shape {tuple(want_shape)} and dtype {np.dtype(want_dtype)}")
    return None


def _arrays(f: Any, expected: Expected) -> tuple[dict[str, np.ndarray], list[str]]:
    """The entries of the zip ``f``, or the problems that stop them being read.

    The names, shapes and dtypes come from the zip directory and each ``.npy`` header
    and are compared with ``expected`` before any array's data is read.
    """
    with zipfile.ZipFile(f) as z:
        members = {info.filename.removesuffix(".npy"): info for info in z.infolist()}
        wanted = set(expected) | set(JSON_ENTRIES)
        if set(members) != wanted or len(members) != len(z.infolist()) or \
                not all(i.filename.endswith(".npy") for i in members.values()):
            extra, missing = sorted(set(members) - wanted), sorted(wanted - set(members))
            return {}, ["its entries are not this run's arrays"
                        + (f"; it lacks {', '.join(missing)}" if missing else "")
                        + (f"; this run has no {', '.join(extra)}" if extra else "")]
        problems = []
        for key, info in members.items():
            with z.open(info) as m:
                major, _ = np.lib.format.read_magic(m)
                header = np.lib.format.read_array_header_1_0 if major == 1 else \
                    np.lib.format.read_array_header_2_0
                shape, _, dtype = header(m)
            problem = _member_problem(key, shape, dtype, expected)
            if problem:
                problems.append(problem)
        if problems:
            return {}, problems
        arrays = {}
        for key, info in members.items():
            with z.open(info) as m:
                arrays[key] = np.lib.format.read_array(m, allow_pickle=False)
                if m.read(1):  # reading to the entry's end also checks its CRC-32
                    return {}, [f"its entry {key!r} has bytes after its array"]
        return arrays, []


def _header_problems(header: Any, meta: dict[str, Any], source: int) -> list[str]:
    """How a rank file's header differs from the checkpoint ``meta`` it must belong to."""
    if not isinstance(header, dict):
        return ["its header is not an object"]
    wanted = {"format": FORMAT, "run_id": meta["run_id"], "name": meta["name"],
              "sequence": meta["sequence"], "rank": source, "world_size": meta["world_size"]}
    what = {"format": "format version", "run_id": "run", "name": "checkpoint",
            "sequence": "write of this checkpoint", "rank": "rank", "world_size": "world size"}
    found = [f"it belongs to another {what[k]} ({k} {header.get(k)!r}, this checkpoint's "
             f"{v!r})" for k, v in wanted.items() if header.get(k) != v]
    unknown = sorted(set(header) - set(wanted))
    return found + ([f"its header has unknown key(s) {', '.join(map(str, unknown))}"]
                    if unknown else [])


def read(f: Any, expected: Expected, meta: dict[str, Any], source: int,
         check_state: Callable[[Any, dict[str, Any]], list[str]]
         ) -> tuple[tuple[dict[str, np.ndarray], Any] | None, list[str]]:
    """Read and check the rank file open as ``f`` (module doc).

    Args:
        f: the file, opened for reading (binary, seekable).
        expected: this run's arrays of the rank: name -> (shape, dtype).
        meta: the checkpoint's record, which the file's header must name.
        source: the rank whose file it must be.
        check_state: the problems of the JSON state, given ``meta`` (sentences; [] when
            it fits).

    Returns:
        ((arrays, state), []) when every check passes, else (None, the problems).
    """
    try:
        arrays, problems = _arrays(f, expected)
        if problems:
            return None, problems
        header = json.loads(bytes(arrays.pop("checkpoint")).decode())
        state = json.loads(bytes(arrays.pop("state")).decode())
    except DAMAGED as exc:
        return None, [f"it is unreadable ({type(exc).__name__}: {exc})"]
    problems = _header_problems(header, meta, source) or check_state(state, meta)
    return (None if problems else (arrays, state)), problems
