"""Reader of the IDX format of MNIST and Fashion-MNIST (plain or gzip-compressed).

Layout: two zero bytes, a type code (0x08 = unsigned byte), the number of
dimensions, one big-endian uint32 per dimension, then the values in C order.
Every inconsistency is an error naming the file: the data sets are small enough
to check completely on every load.
"""

from __future__ import annotations

import gzip
import os
import struct

import numpy as np

_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}


def read_idx(path: str) -> np.ndarray:
    """Read an IDX file into a NumPy array.

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: the file is not valid IDX (bad magic, unknown type, truncated or too long).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"IDX file '{path}' does not exist")
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rb") as f:
            raw = f.read()
    except (OSError, EOFError) as exc:
        raise ValueError(f"IDX file '{path}' cannot be decompressed: {exc}") from exc
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0:
        raise ValueError(f"IDX file '{path}': magic {raw[:4].hex() or 'empty'} does not start "
                         "with two zero bytes; this is not an IDX file")
    code, ndim = raw[2], raw[3]
    if code not in _TYPES:
        raise ValueError(f"IDX file '{path}': unknown element type 0x{code:02x}")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise ValueError(f"IDX file '{path}' is truncated inside its header")
    dims = struct.unpack(f">{ndim}I", raw[4:header])
    dtype = np.dtype(_TYPES[code])
    expected = int(np.prod(dims, dtype=np.int64)) * dtype.itemsize
    got = len(raw) - header
    if got != expected:
        shape = "x".join(map(str, dims))
        raise ValueError(f"IDX file '{path}' {'is truncated' if got < expected else 'is too long'}:"
                         f" its header says {shape} values ({expected} bytes), the file holds "
                         f"{got} bytes")
    return np.frombuffer(raw, dtype=dtype, offset=header).reshape(dims).astype(
        dtype.newbyteorder("="))


def write_idx(path: str, array: np.ndarray) -> None:
    """Write a uint8 array as an uncompressed IDX file (tests and small conversions)."""
    if array.dtype != np.uint8:
        raise TypeError(f"write_idx: array dtype {array.dtype}, only uint8 is written")
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(struct.pack(f">{array.ndim}I", *array.shape))
        f.write(np.ascontiguousarray(array).tobytes())
