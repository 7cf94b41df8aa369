"""Reader of the IDX format of MNIST and Fashion-MNIST (plain or gzip-compressed).

Layout: two zero bytes, a type code (0x08 = unsigned byte), the number of
dimensions, one big-endian uint32 per dimension, then the values in C order.
Every inconsistency is an error naming the file: the data sets are small enough
to check completely on every load.

Bounds come before allocation: the header's dimensions give the size of the values
(in Python integers, so four dimensions of 2**32 - 1 do not overflow), which is
compared with the plain file's size before the values are read; a compressed file is
decompressed in pieces up to that size plus one byte, so memory follows what the file
really holds, never what its header claims.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from typing import BinaryIO

import numpy as np

from minidp.io.filesystem import open_regular

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}
_PIECE = 1 << 24  # bytes decompressed at a time


def _read_at_most(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes of ``f``, read in pieces (``f.read(n)`` would allocate n bytes)."""
    out = bytearray()
    while len(out) < n:
        piece = f.read(min(_PIECE, n - len(out)))
        if not piece:
            break
        out += piece
    return bytes(out)


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file into a NumPy array.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not valid IDX (bad magic, unknown type, truncated or too long,
            or not decompressible), or not a regular file (a FIFO, a device: never opened).
    """
    compressed = path.endswith(".gz")
    # Never a FIFO or a device (opened, it could wait for ever): refused by name.
    with open_regular(path, ("IDX file", "an IDX file, plain or .gz")) as plain:
        try:
            if not compressed:
                return _parse(path, plain, os.fstat(plain.fileno()).st_size)
            with gzip.GzipFile(fileobj=plain, mode="rb") as f:
                return _parse(path, f, None)
        except (OSError, EOFError, zlib.error) as exc:
            raise ValueError(f"IDX file '{path}' cannot be read or decompressed: "
                             f"{exc}") from exc


def _parse(path: str, f: BinaryIO, size: int | None) -> np.ndarray:
    """The array in open file ``f``; ``size``: the file's size if it is not compressed."""
    head = _read_at_most(f, 4)
    if len(head) < 4 or head[0] != 0 or head[1] != 0:
        raise ValueError(f"IDX file '{path}': magic {head.hex() or 'empty'} does not start "
                         "with two zero bytes; this is not an IDX file")
    code, ndim = head[2], head[3]
    if code not in _TYPES:
        raise ValueError(f"IDX file '{path}': unknown element type 0x{code:02x}, allowed: "
                         f"{', '.join(f'0x{c:02x}' for c in _TYPES)}")
    header = 4 + 4 * ndim
    raw_dims = _read_at_most(f, 4 * ndim)
    if len(raw_dims) < 4 * ndim:
        raise ValueError(f"IDX file '{path}' is truncated inside its header ({ndim} dims need "
                         f"{header} bytes, the file holds {4 + len(raw_dims)})")
    dims = struct.unpack(f">{ndim}I", raw_dims)
    dtype = np.dtype(_TYPES[code])
    expected = math.prod(dims) * dtype.itemsize
    if math.prod(max(d, 1) for d in dims) * dtype.itemsize >= 2 ** 63:  # even with a 0 dim
        raise ValueError(f"IDX file '{path}': dims {'x'.join(map(str, dims))} of "
                         f"{dtype.itemsize}-byte values, allowed: at most 2**63 bytes however "
                         "many of them are 0")
    # A plain file is measured first; a compressed one is read up to one byte too many.
    got = size - header if size is not None else None
    if got is None or got == expected:
        values = _read_at_most(f, expected + 1)
        got = len(values)
    if got != expected:
        shape = "x".join(map(str, dims))
        raise ValueError(f"IDX file '{path}' {'is truncated' if got < expected else 'is too long'}:"
                         f" its header says {shape} values ({expected} bytes), the file holds "
                         f"{got}{' or more' if got > expected and size is None else ''} bytes")
    return np.frombuffer(values, dtype=dtype).reshape(dims).astype(dtype.newbyteorder("="))


def write_idx(path: str, array: np.ndarray) -> None:
    """Write a uint8 array as an uncompressed IDX file (tests and small conversions)."""
    if array.dtype != np.uint8:
        raise TypeError(f"write_idx: array dtype {array.dtype}, only uint8 is written")
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(np.ascontiguousarray(array).tobytes())
