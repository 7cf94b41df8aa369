"""The minidp dataset file (``.mdp``): a fixed header, then fixed-size records, contiguous.

The 128-byte header (its layout, its CRC-32, the checks of every field) is
:mod:`minidp.io.mdp_header`, whose names this module also gives; here are the records:
written (:func:`write_mdp`), read whole (:func:`read_mdp`), decoded into samples and
labels (:func:`decode`) and checked (the payload checksum, the labels). Record ``i`` is
at byte ``128 + i*R``, its sample's bytes then its label's; docs/mdp-format.md gives
the format byte by byte.

The checksum is Fletcher-like rather than a CRC because it can be computed block by
block and summed: each MPI reader checks its own contiguous block and one
``Allreduce`` compares the total with the header, without any rank reading the file
twice. S2 weights bytes by position, so swapped records are detected too.

Labels are checked against the number of classes when written (:func:`write_mdp`) and
when decoded (:func:`decode`): a label outside [0, num_classes) would otherwise index
past the model's output and fail far from its cause, or silently train a wrong task.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Iterator
from typing import BinaryIO

import numpy as np

from minidp.io.atomic import atomic_write
from minidp.io.filesystem import create_new, open_regular
from minidp.io.filesystem import file_kind as file_kind  # where run/flags.py imports it
from minidp.io.mdp_header import (
    FLAG_SHUFFLED,
    HEADER_CHECKSUM_AT,
    HEADER_SIZE,
    KNOWN_FLAGS,
    LABEL_KINDS,
    MAGIC,
    SAMPLE_KINDS,
    VERSION,
    Header,
    OldVersion,
    header_checksum,
    open_header,
    parse_header,
    read_header,
    seal,
)
from minidp.kernels.checksum import byte_checksum as checksum

__all__ = ["FLAG_SHUFFLED", "HEADER_CHECKSUM_AT", "HEADER_SIZE", "KNOWN_FLAGS", "LABEL_KINDS",
           "MAGIC", "SAMPLE_KINDS", "VERSION", "Header", "OldVersion", "add_checksums",
           "checksum", "checksum_mismatch", "decode", "file_kind", "header_checksum",
           "label_problem", "layout", "open_header", "parse_header", "read_header", "read_mdp",
           "record_pieces", "seal", "write_mdp"]

_CHUNK = 1 << 22  # records are converted and written in 4 MiB pieces


def add_checksums(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Combine the checksums of two disjoint byte ranges."""
    return (a[0] + b[0]) % 2 ** 64, (a[1] + b[1]) % 2 ** 64


def checksum_mismatch(path: str, header: Header, found: tuple[int, int]) -> str:
    """The error for a payload whose checksum ``found`` differs from the header's.

    The checked range is the whole payload (the header holds one checksum). One changed
    byte, the usual corruption, changes S1 by d and S2 by (k + 1) * d: when the sums
    differ so, the message says which byte that would be. Several changed bytes can
    mimic one, hence "if": the statement is exact when one byte changed.
    """
    size = header.count * header.record_size
    message = (f"dataset file '{path}': checksum mismatch over payload bytes {HEADER_SIZE} to "
               f"{HEADER_SIZE + size} (the {header.count} records): the payload is corrupt")
    d1, d2 = (_signed((f - e) % 2 ** 64) for f, e in zip(found, header.checksum))
    if d1 and abs(d1) < 256 and d2 % d1 == 0 and 1 <= d2 // d1 <= size:
        offset = HEADER_SIZE + d2 // d1 - 1
        message += (f"; if a single byte changed, it is the one at file offset {offset} "
                    f"(record {(offset - HEADER_SIZE) // header.record_size}), by {d1:+d}")
    return message + "; prepare the file again"


def _signed(value: int) -> int:
    return value - 2 ** 64 if value >= 2 ** 63 else value


def _label_out_of_range(y: np.ndarray, num_classes: int) -> tuple[int, int] | None:
    """(index, value) of the first label outside [0, num_classes), or None if all are in.

    Only min and max are computed unless a label is out of range (decode runs per epoch).
    """
    if len(y) == 0 or (y.min() >= 0 and y.max() < num_classes):
        return None
    index = int(np.flatnonzero((y < 0) | (y >= num_classes))[0])
    return index, int(y[index])


def write_mdp(path: str, x: np.ndarray, y: np.ndarray, num_classes: int,
              progress: bool = False, shuffled: bool = False,
              exclusive: bool = False) -> Header:
    """Write samples and labels atomically (temporary file, fsync, rename or link).

    Args:
        path: destination; a partial file never appears under this name.
        x: samples (N, ...), any fixed-size dtype.
        y: labels (N,), integers in [0, num_classes).
        num_classes: stored in the header; at least 1.
        progress: print a progress bar on stderr.
        shuffled: record in the header (flag bit 0) that the caller permuted the records
            once at preparation; the records are written in the order given either way.
        exclusive: never replace what is at ``path``: the whole file is linked under
            the name only if nothing is there (:func:`minidp.io.filesystem.create_new`),
            as preparation does; else it is renamed over the name.

    Raises:
        ValueError: lengths that differ, samples of more than 4 dims, of a dim of 0 or of
            a dtype that is not a number, ``num_classes`` < 1, or a label outside
            [0, num_classes) (the message names the file and the value).
        TypeError: labels that are not integers, or a ``num_classes`` that is not an int.
        FileExistsError: ``exclusive`` and something is at ``path`` (left as it is).
        WriteFailed: the file could not be written (the message names it).
    """
    header = layout(path, x, y, num_classes, shuffled)

    def write(f: BinaryIO) -> None:
        nonlocal header
        total = (0, 0)
        f.write(header.pack())
        for start, records in record_pieces(x, y, header):
            total = add_checksums(total, checksum(records, start * header.record_size))
            f.write(records.tobytes())
            if progress:
                done = (start + len(records)) / max(len(x), 1)
                sys.stderr.write(f"\r{os.path.basename(path)} [{'#' * int(30 * done):30s}] "
                                 f"{100 * done:5.1f}%")
        header = dataclasses.replace(header, checksum=total)
        f.seek(0)  # the checksum is known only now
        f.write(header.pack())

    try:
        if exclusive:
            create_new(path, write)
        else:
            atomic_write(path, write, "wb")
    finally:
        if progress:
            sys.stderr.write("\n")
    return header


def layout(path: str, x: np.ndarray, y: np.ndarray, num_classes: int,
           shuffled: bool = False) -> Header:
    """The header of a file of these records, its checksum still (0, 0); checks the arguments.

    Raises:
        ValueError, TypeError: as :func:`write_mdp`.
    """
    if len(x) != len(y):
        raise ValueError(f"write_mdp: {len(x)} samples but {len(y)} labels")
    if x.ndim - 1 > 4:
        raise ValueError(f"write_mdp: samples of shape {x.shape[1:]} have more than 4 dims")
    if x.dtype.kind not in SAMPLE_KINDS or 0 in x.shape[1:]:
        raise ValueError(f"write_mdp: samples of dtype {x.dtype} and shape {x.shape[1:]}, "
                         "allowed: a number dtype (bool, int, uint, float, complex) and "
                         "dims >= 1")
    if y.dtype.kind not in "iu":
        raise TypeError(f"write_mdp: labels must be integers, got {y.dtype}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)):
        raise TypeError(f"write_mdp: num_classes: got {num_classes!r}, allowed: an int >= 1")
    if not 1 <= num_classes < 2 ** 32:
        raise ValueError(f"write_mdp: num_classes: got {num_classes}, allowed: an int >= 1 "
                         "(stored as uint32)")
    bad = _label_out_of_range(y, num_classes)
    if bad is not None:
        raise ValueError(f"write_mdp: '{path}': label {bad[1]} (record {bad[0]}) is outside "
                         f"the allowed range [0, {num_classes}) for num_classes={num_classes}")
    header = Header(len(x), 0, tuple(x.shape[1:]), x.dtype, y.dtype, int(num_classes), (0, 0),
                    shuffled=bool(shuffled))
    return dataclasses.replace(header, record_size=header.record_dtype.itemsize)


def record_pieces(x: np.ndarray, y: np.ndarray,
                  header: Header) -> Iterator[tuple[int, np.ndarray]]:
    """The records of ``x`` and ``y`` as the file holds them, in pieces of about 4 MiB.

    Yields:
        (index of the piece's first record, the piece in ``header.record_dtype``).
    """
    step = max(1, _CHUNK // header.record_size)
    for a in range(0, len(x), step):
        records = np.empty(min(step, len(x) - a), dtype=header.record_dtype)
        records["x"], records["y"] = x[a:a + step], y[a:a + step]
        yield a, records


def decode(records: np.ndarray, header: Header) -> tuple[np.ndarray, np.ndarray]:
    """Split records (raw bytes or the record dtype) into (samples, labels) copies.

    Raises:
        ValueError: a label outside [0, header.num_classes); the message names the range
            and the value.
    """
    view = records.reshape(-1).view(header.record_dtype)
    labels = view["y"].astype(np.int64)
    bad = _label_out_of_range(labels, header.num_classes)
    if bad is not None:
        raise ValueError(f"dataset records: label {bad[1]} (record {bad[0]} of this block) is "
                         f"outside the allowed range [0, {header.num_classes}) of the header's "
                         f"{header.num_classes} classes")
    return np.ascontiguousarray(view["x"]), labels


def label_problem(path: str, records: np.ndarray, header: Header,
                  first: int | np.ndarray) -> str | None:
    """Why records read from ``path`` cannot be decoded (a label out of range), or None.

    A reader calls it on the bytes it read, before it shuffles them, so the message
    names the file and the record's place in it, and the ranks can agree on it before
    any of them raises.

    Args:
        path: the file, for the message.
        records: raw bytes (or records) read from the file.
        header: the file's header.
        first: the index in the file of the first of ``records``, which follow it; or
            the index of each record (records read at scattered places).
    """
    raw = records.reshape(-1)
    if raw.dtype == np.uint8:  # a read cut short may end inside a record: whole ones only
        raw = raw[:raw.size - raw.size % header.record_size]
    bad = _label_out_of_range(raw.view(header.record_dtype)["y"], header.num_classes)
    if bad is None:
        return None
    record = int(first) + bad[0] if np.ndim(first) == 0 else int(first[bad[0]])
    return (f"dataset file '{path}': label {bad[1]} of record {record} is outside the "
            f"allowed range [0, {header.num_classes}) of the header's {header.num_classes} "
            "classes; the file's labels do not fit its header: prepare it again")


def read_mdp(path: str, verify: bool = True) -> tuple[np.ndarray, np.ndarray, Header]:
    """Read a whole file into memory: (samples, labels, header).

    Checks the checksum (unless ``verify`` is False) and the labels' range; errors name
    the file. The header and the records come from one open of a regular file.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        header = parse_header(path, f.read(HEADER_SIZE), size)
        raw = np.fromfile(f, dtype=np.uint8, count=header.count * header.record_size)
    if raw.size != header.count * header.record_size:
        raise ValueError(f"dataset file '{path}' is truncated: read {raw.size} payload bytes "
                         f"of the {header.count * header.record_size} its header says")
    found = checksum(raw) if verify else header.checksum
    if found != header.checksum:
        raise ValueError(checksum_mismatch(path, header, found))
    problem = label_problem(path, raw, header, 0)
    if problem:
        raise ValueError(problem)
    return decode(raw, header) + (header,)
