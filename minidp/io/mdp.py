r"""The minidp dataset file (``.mdp``): a fixed header, then fixed-size records, contiguous.

Layout (little-endian; documented byte by byte in ``docs/mdp-format.md``)::

    offset  size  field
         0     8  magic b"MINIDP\\x00\\x01"
         8     4  version (uint32) = 2
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
        88     4  flags (uint32): bit 0 = records shuffled at preparation; other bits 0
        92     4  header checksum (uint32): CRC-32 of the 128 header bytes, these 4 as 0
        96    32  zero padding
       128  N*R  records: sample bytes then label bytes, record i at 128 + i*R

The header checksum is verified first, before any field is used: a flipped bit in the
number of classes or in a dimension would otherwise train a wrong task or allocate
what the file does not hold. CRC-32 detects every error of up to 32 consecutive bits.
Version 1 (before the header checksum) is refused with the command that prepares the
file again (:class:`OldVersion`). A set flag bit this minidp does not know is refused
rather than ignored.

The checksum is Fletcher-like rather than a CRC because it can be computed block by
block and summed: each MPI reader checks its own contiguous block and one
``Allreduce`` compares the total with the header, without any rank reading the file
twice. S2 weights bytes by position, so swapped records are detected too.

Labels are checked against the number of classes when written (:func:`write_mdp`) and
when decoded (:func:`decode`): a label outside [0, num_classes) would otherwise index
past the model's output and fail far from its cause, or silently train a wrong task.

Every header field is checked before anything is allocated from it: the dtypes must be
plain numbers (a dtype string is matched against a pattern before NumPy parses it, and
an object dtype would make NumPy read file bytes as pointers), and the record size is
computed from the shape in Python integers and compared with the file's size, so a
header that claims more bytes than the file holds is an error naming the file, never a
MemoryError.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import stat
import struct
import sys
import zlib
from typing import BinaryIO

import numpy as np

from minidp.io.atomic import atomic_write
from minidp.kernels.checksum import byte_checksum as checksum

MAGIC = b"MINIDP\x00\x01"
VERSION = 2
HEADER_SIZE = 128
_HEADER = struct.Struct("<8sIIQQI4I8s8sIQQII32x")
HEADER_CHECKSUM_AT = 92  # offset of the header's own CRC-32
FLAG_SHUFFLED = 1  # bit 0: the records were permuted once when the file was prepared
KNOWN_FLAGS = FLAG_SHUFFLED
_CHUNK = 1 << 22  # records are converted and written in 4 MiB pieces
# NumPy's ``dtype.str`` of a plain number: byte order, kind, size. Nothing else is parsed:
# np.dtype() of an arbitrary string may raise SyntaxError or warn, and "O" is pointers.
_DTYPE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
SAMPLE_KINDS, LABEL_KINDS = "biufc", "iu"


@dataclasses.dataclass(frozen=True)
class Header:
    """What the header of an .mdp file says.

    ``shuffled`` is True when the records were permuted once at preparation (flag bit 0),
    so that every contiguous block, and every prefix, mixes the classes.
    """

    count: int
    record_size: int
    sample_shape: tuple[int, ...]
    sample_dtype: np.dtype
    label_dtype: np.dtype
    num_classes: int
    checksum: tuple[int, int]
    shuffled: bool = False

    @property
    def flags(self) -> int:
        """The uint32 flags word stored at offset 88."""
        return FLAG_SHUFFLED if self.shuffled else 0

    @property
    def sealed_checksum(self) -> int:
        """The header's own CRC-32, as stored at offset 92 (its identity with the payload's)."""
        return header_checksum(self.pack())

    @property
    def record_dtype(self) -> np.dtype:
        """Structured dtype of one record: fields ``x`` (sample) and ``y`` (label)."""
        return np.dtype([("x", self.sample_dtype, self.sample_shape), ("y", self.label_dtype)])

    def pack(self) -> bytes:
        """The 128 header bytes."""
        dims = list(self.sample_shape) + [0] * (4 - len(self.sample_shape))
        return seal(_HEADER.pack(MAGIC, VERSION, HEADER_SIZE, self.count, self.record_size,
                                 len(self.sample_shape), *dims, self.sample_dtype.str.encode(),
                                 self.label_dtype.str.encode(), self.num_classes,
                                 *self.checksum, self.flags, 0))


class OldVersion(ValueError):
    """A file of an older format version: prepare it again (the message says how)."""


def header_checksum(raw: bytes) -> int:
    """CRC-32 of 128 header bytes, its own field (offset 92) counted as zeros."""
    at = HEADER_CHECKSUM_AT
    return zlib.crc32(raw[:at] + bytes(4) + raw[at + 4:HEADER_SIZE])


def seal(raw: bytes) -> bytes:
    """The 128 header bytes ``raw`` with their checksum filled in at offset 92."""
    at = HEADER_CHECKSUM_AT
    return raw[:at] + header_checksum(raw).to_bytes(4, "little") + raw[at + 4:]


def add_checksums(a: tuple[int, int], b: tuple[int, int]) -> tuple[int, int]:
    """Combine the checksums of two disjoint byte ranges."""
    return (a[0] + b[0]) % 2 ** 64, (a[1] + b[1]) % 2 ** 64


def read_header(path: str) -> Header:
    """Read and validate the header against the file size.

    The header's own checksum is verified before any field is used, so no corrupt
    field can size an allocation or change the task.

    Raises:
        FileNotFoundError: no such file.
        OldVersion: a file of format version 1 (no header checksum).
        ValueError: not a regular file, wrong magic, a header checksum mismatch, another
            version, unknown flag bits, inconsistent fields, or a size that disagrees with
            the record count (truncated or extended file).
    """
    size = _regular_file_size(path)
    with open(path, "rb") as f:
        raw = f.read(HEADER_SIZE)
    if len(raw) < HEADER_SIZE:
        raise ValueError(f"dataset file '{path}' is truncated: {size} bytes, shorter than "
                         f"the {HEADER_SIZE}-byte header")
    (magic, version, header_size, count, record_size, ndim, d0, d1, d2, d3, sdt, ldt,
     classes, s1, s2, flags, stored) = _HEADER.unpack(raw)
    if magic != MAGIC:
        raise ValueError(f"dataset file '{path}': wrong magic {magic!r}, expected {MAGIC!r} "
                         "(not a minidp dataset file)")
    if version == 1 and raw[HEADER_CHECKSUM_AT:] == bytes(HEADER_SIZE - HEADER_CHECKSUM_AT):
        raise OldVersion(f"dataset file '{path}' is of format version 1, whose header has no "
                         f"checksum; this minidp reads version {VERSION}: prepare it again")
    if stored != header_checksum(raw):
        raise ValueError(f"dataset file '{path}': header checksum mismatch (CRC-32 "
                         f"{header_checksum(raw):#010x} of header bytes 0 to {HEADER_SIZE}, "
                         f"{stored:#010x} stored at offset {HEADER_CHECKSUM_AT}): the header "
                         "is corrupt; prepare the file again")
    if version != VERSION or header_size != HEADER_SIZE:
        raise ValueError(f"dataset file '{path}': version {version} with header size "
                         f"{header_size}; this minidp reads version {VERSION} ({HEADER_SIZE})")
    if flags & ~KNOWN_FLAGS:
        raise ValueError(f"dataset file '{path}': unknown flag bits {flags & ~KNOWN_FLAGS:#x} "
                         f"in flags {flags:#x} at offset 88; this minidp knows only "
                         f"{KNOWN_FLAGS:#x} (bit 0: shuffled)")
    sample_dtype = _read_dtype(path, "sample dtype", 52, sdt, SAMPLE_KINDS)
    label_dtype = _read_dtype(path, "label dtype", 60, ldt, LABEL_KINDS)
    dims = (d0, d1, d2, d3)
    if ndim > 4:
        raise ValueError(f"dataset file '{path}': sample ndim {ndim} at offset 32, allowed: "
                         "0 to 4")
    shape = dims[:ndim]
    if 0 in shape or any(dims[ndim:]):
        raise ValueError(f"dataset file '{path}': sample shape {dims} at offset 36 for ndim "
                         f"{ndim}, allowed: {ndim} dims >= 1, then zeros")
    if classes < 1:
        raise ValueError(f"dataset file '{path}': number of classes {classes} at offset 68, "
                         "allowed: >= 1")
    # In Python integers, before NumPy builds a dtype from the shape: no overflow.
    computed = math.prod(shape) * sample_dtype.itemsize + label_dtype.itemsize
    if computed != record_size:
        raise ValueError(f"dataset file '{path}': record size {record_size} disagrees with "
                         f"shape {shape} of {sample_dtype} plus a {label_dtype} label "
                         f"({computed} bytes)")
    header = Header(count, record_size, shape, sample_dtype, label_dtype, classes, (s1, s2),
                    shuffled=bool(flags & FLAG_SHUFFLED))
    expected = HEADER_SIZE + count * record_size
    if size != expected:
        what = "is truncated" if size < expected else "is longer than its header says"
        raise ValueError(f"dataset file '{path}' {what}: the header counts {count} records of "
                         f"{record_size} bytes ({expected} bytes in all), the file has {size}")
    return header


def _regular_file_size(path: str) -> int:
    """The size of ``path``, a regular file; else an error saying what is there."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"dataset file '{path}' does not exist") from None
    if not stat.S_ISREG(info.st_mode):
        raise ValueError(f"dataset file '{path}' is {file_kind(info.st_mode)}, not a regular "
                         "file; allowed: an .mdp file (python -m minidp data prepare writes them)")
    return info.st_size


def file_kind(mode: int) -> str:
    """What a path whose ``st_mode`` is ``mode`` is, in words ("a directory", "a FIFO ...")."""
    return ("a regular file" if stat.S_ISREG(mode) else
            "a directory" if stat.S_ISDIR(mode) else
            "a FIFO (named pipe)" if stat.S_ISFIFO(mode) else
            "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else
            "a socket" if stat.S_ISSOCK(mode) else "a special file")


def _read_dtype(path: str, field: str, offset: int, raw: bytes, kinds: str) -> np.dtype:
    """The dtype stored in an 8-byte field, if it is a plain number of one of ``kinds``."""
    text = raw.rstrip(b"\x00").decode("ascii", errors="replace")
    dtype = None
    if _DTYPE.fullmatch(text) and text[1] in kinds:
        try:
            dtype = np.dtype(text)
        except TypeError:  # a size NumPy does not have, such as "<f3"
            pass
    if dtype is None:
        names = {"b": "bool", "i": "int", "u": "uint", "f": "float", "c": "complex"}
        raise ValueError(f"dataset file '{path}': {field} {text!r} at offset {offset}, "
                         f"allowed: a NumPy number dtype string of kind "
                         f"{', '.join(names[k] for k in kinds)} (such as '|u1', '<f4', '<i8')")
    return dtype


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
              progress: bool = False, shuffled: bool = False) -> Header:
    """Write samples and labels atomically (temporary file, fsync, rename).

    Args:
        path: destination; a partial file never appears under this name.
        x: samples (N, ...), any fixed-size dtype.
        y: labels (N,), integers in [0, num_classes).
        num_classes: stored in the header; at least 1.
        progress: print a progress bar on stderr.
        shuffled: record in the header (flag bit 0) that the caller permuted the records
            once at preparation; the records are written in the order given either way.

    Raises:
        ValueError: lengths that differ, samples of more than 4 dims, of a dim of 0 or of
            a dtype that is not a number, ``num_classes`` < 1, or a label outside
            [0, num_classes) (the message names the file and the value).
        TypeError: labels that are not integers, or a ``num_classes`` that is not an int.
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
    header = dataclasses.replace(header, record_size=header.record_dtype.itemsize)
    step = max(1, _CHUNK // header.record_size)

    def write(f: BinaryIO) -> None:
        nonlocal header
        total = (0, 0)
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
        f.seek(0)  # the checksum is known only now
        f.write(header.pack())

    try:
        atomic_write(path, write, "wb")
    finally:
        if progress:
            sys.stderr.write("\n")
    return header


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


def read_mdp(path: str, verify: bool = True) -> tuple[np.ndarray, np.ndarray, Header]:
    """Read a whole file into memory: (samples, labels, header).

    Checks the checksum (unless ``verify`` is False) and the labels' range; errors name
    the file.
    """
    header = read_header(path)
    raw = np.fromfile(path, dtype=np.uint8, offset=HEADER_SIZE)
    found = checksum(raw) if verify else header.checksum
    if found != header.checksum:
        raise ValueError(checksum_mismatch(path, header, found))
    try:
        x, y = decode(raw, header)
    except ValueError as exc:
        raise ValueError(f"dataset file '{path}': {exc}") from exc
    return x, y, header
