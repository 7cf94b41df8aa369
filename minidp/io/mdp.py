r"""The minidp dataset file (``.mdp``): a fixed header, then fixed-size records, contiguous.

Layout (little-endian; documented byte by byte in ``docs/mdp-format.md``)::

    offset  size  field
         0     8  magic b"MINIDP\\x00\\x01"
         8     4  version (uint32) = 1
        12     4  header size (uint32) = 128
        16     8  record count N (uint64)
        24     8  record size in bytes (uint64) = sample bytes + label bytes
        32     4  sample ndim (uint32), at most 4
        36    16  sample shape (4 x uint32, unused dims 0)
        52     8  sample dtype, NumPy string padded with NUL (e.g. "|u1", "<f4")
        60     8  label dtype, same encoding (e.g. "<i8")
        68     4  number of classes (uint32)
        72     8  checksum S1 = sum of payload bytes (uint64, mod 2**64)
        80     8  checksum S2 = sum of (k+1) * byte_k over payload positions k (mod 2**64)
        88    40  zero padding
       128  N*R  records: sample bytes then label bytes, record i at 128 + i*R

The checksum is Fletcher-like rather than a CRC because it can be computed block by
block and summed: each MPI reader checks its own contiguous block and one
``Allreduce`` compares the total with the header, without any rank reading the file
twice. S2 weights bytes by position, so swapped records are detected too.
"""

from __future__ import annotations

import dataclasses
import os
import struct
import sys

import numpy as np

from minidp.kernels.checksum import byte_checksum as checksum

MAGIC = b"MINIDP\x00\x01"
VERSION = 1
HEADER_SIZE = 128
_HEADER = struct.Struct("<8sIIQQI4I8s8sIQQ40x")
_CHUNK = 1 << 22  # records are converted and written in 4 MiB pieces


@dataclasses.dataclass(frozen=True)
class Header:
    """What the header of an .mdp file says."""

    count: int
    record_size: int
    sample_shape: tuple[int, ...]
    sample_dtype: np.dtype
    label_dtype: np.dtype
    num_classes: int
    checksum: tuple[int, int]

    @property
    def record_dtype(self) -> np.dtype:
        """Structured dtype of one record: fields ``x`` (sample) and ``y`` (label)."""
        return np.dtype([("x", self.sample_dtype, self.sample_shape), ("y", self.label_dtype)])

    def pack(self) -> bytes:
        """The 128 header bytes."""
        dims = list(self.sample_shape) + [0] * (4 - len(self.sample_shape))
        return _HEADER.pack(MAGIC, VERSION, HEADER_SIZE, self.count, self.record_size,
                            len(self.sample_shape), *dims, self.sample_dtype.str.encode(),
                            self.label_dtype.str.encode(), self.num_classes, *self.checksum)


def add_checksums(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Combine the checksums of two disjoint byte ranges."""
    return (a[0] + b[0]) % 2 ** 64, (a[1] + b[1]) % 2 ** 64


def read_header(path: str) -> Header:
    """Read and validate the header against the file size.

    Raises:
        FileNotFoundError: no such file.
        ValueError: wrong magic or version, inconsistent fields, or a size that disagrees
            with the record count (truncated or extended file).
    """
    if not os.path.isfile(path):
        raise FileNotFoundError(f"dataset file '{path}' does not exist")
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise ValueError(f"dataset file '{path}' is truncated: {size} bytes, shorter than "
                         f"the {HEADER_SIZE}-byte header")
    (magic, version, header_size, count, record_size, ndim, d0, d1, d2, d3, sdt, ldt,
     classes, s1, s2) = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise ValueError(f"dataset file '{path}': wrong magic {magic!r}, expected {MAGIC!r} "
                         "(not a minidp dataset file)")
    if version != VERSION or header_size != HEADER_SIZE:
        raise ValueError(f"dataset file '{path}': version {version} with header size "
                         f"{header_size}; this minidp reads version {VERSION} ({HEADER_SIZE})")
    try:
        sample_dtype = np.dtype(sdt.rstrip(b"\x00").decode())
        label_dtype = np.dtype(ldt.rstrip(b"\x00").decode())
    except (TypeError, UnicodeDecodeError) as exc:
        raise ValueError(f"dataset file '{path}': unreadable dtype field ({exc})") from exc
    if ndim > 4:
        raise ValueError(f"dataset file '{path}': sample ndim {ndim} > 4")
    shape = (d0, d1, d2, d3)[:ndim]
    header = Header(count, record_size, shape, sample_dtype, label_dtype, classes, (s1, s2))
    if header.record_dtype.itemsize != record_size:
        raise ValueError(f"dataset file '{path}': record size {record_size} disagrees with "
                         f"shape {shape} of {sample_dtype} plus a {label_dtype} label "
                         f"({header.record_dtype.itemsize} bytes)")
    expected = HEADER_SIZE + count * record_size
    if size != expected:
        what = "is truncated" if size < expected else "is longer than its header says"
        raise ValueError(f"dataset file '{path}' {what}: the header counts {count} records of "
                         f"{record_size} bytes ({expected} bytes in all), the file has {size}")
    return header


def write_mdp(path: str, x: np.ndarray, y: np.ndarray, num_classes: int,
              progress: bool = False) -> Header:
    """Write samples and labels atomically (temporary file, fsync, rename).

    Args:
        path: destination; a partial file never appears under this name.
        x: samples (N, ...), any fixed-size dtype.
        y: labels (N,), integer.
        num_classes: stored in the header.
        progress: print a progress bar on stderr.
    """
    if len(x) != len(y):
        raise ValueError(f"write_mdp: {len(x)} samples but {len(y)} labels")
    if x.ndim - 1 > 4:
        raise ValueError(f"write_mdp: samples of shape {x.shape[1:]} have more than 4 dims")
    if y.dtype.kind not in "iu":
        raise TypeError(f"write_mdp: labels must be integers, got {y.dtype}")
    header = Header(len(x), 0, tuple(x.shape[1:]), x.dtype, y.dtype, num_classes, (0, 0))
    header = dataclasses.replace(header, record_size=header.record_dtype.itemsize)
    tmp = f"{path}.tmp-{os.getpid()}"
    total = (0, 0)
    step = max(1, _CHUNK // header.record_size)
    try:
        with open(tmp, "wb") as f:
            f.write(header.pack())
            for a in range(0, len(x), step):
                records = np.empty(min(step, len(x) - a), dtype=header.record_dtype)
                records["x"], records["y"] = x[a:a + step], y[a:a + step]
                total = add_checksums(total, checksum(records, a * header.record_size))
                f.write(records.tobytes())
                if progress:
                    done = min(a + step, len(x)) / max(len(x), 1)
                    sys.stderr.write(f"\r{os.path.basename(path)} [{'#' * int(30 * done):30s}] "
                                     f"{100 * done:5.1f}%")
            header = dataclasses.replace(header, checksum=total)
            f.seek(0)
            f.write(header.pack())
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
        if progress:
            sys.stderr.write("\n")
    return header


def decode(records: np.ndarray, header: Header) -> tuple[np.ndarray, np.ndarray]:
    """Split records (raw bytes or the record dtype) into (samples, labels) copies."""
    view = records.reshape(-1).view(header.record_dtype)
    return np.ascontiguousarray(view["x"]), view["y"].astype(np.int64)


def read_mdp(path: str, verify: bool = True) -> tuple[np.ndarray, np.ndarray, Header]:
    """Read a whole file into memory: (samples, labels, header); checks the checksum."""
    header = read_header(path)
    raw = np.fromfile(path, dtype=np.uint8, offset=HEADER_SIZE)
    if verify and checksum(raw) != header.checksum:
        raise ValueError(f"dataset file '{path}': checksum mismatch, the payload is corrupt")
    x, y = decode(raw, header)
    return x, y, header
