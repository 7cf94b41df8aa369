r"""The header of an ``.mdp`` file: 128 bytes, sealed by a CRC-32 of itself, checked field by field.

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
import struct
import zlib

import numpy as np

from minidp.io.filesystem import Stamp, open_regular, stamp_of

MAGIC = b"MINIDP\x00\x01"
VERSION = 2
HEADER_SIZE = 128
_HEADER = struct.Struct("<8sIIQQI4I8s8sIQQII32x")
HEADER_CHECKSUM_AT = 92  # offset of the header's own CRC-32
FLAG_SHUFFLED = 1  # bit 0: the records were permuted once when the file was prepared
KNOWN_FLAGS = FLAG_SHUFFLED
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


def read_header(path: str) -> Header:
    """Read and validate the header against the file size.

    The header's own checksum is verified before any field is used, so no corrupt
    field can size an allocation or change the task.

    Raises:
        FileNotFoundError: no such file.
        OldVersion: a file of format version 1 (no header checksum).
        ValueError: not a regular file (never opened: a FIFO would block), wrong magic,
            a header checksum mismatch, another version, unknown flag bits, inconsistent
            fields, or a size that disagrees with the record count (truncated or extended
            file).
    """
    return open_header(path)[0]


def open_header(path: str) -> tuple[Header, Stamp]:
    """:func:`read_header`, and the file's :class:`~minidp.io.filesystem.Stamp`, of one open.

    Both come from the same open file, so the header checked is the one of the file
    stamped: a reader compares the stamp with the path's at every epoch.
    """
    with open_regular(path) as f:
        size = os.fstat(f.fileno()).st_size
        raw = f.read(HEADER_SIZE)
        return parse_header(path, raw, size), stamp_of(f)


def parse_header(path: str, raw: bytes, size: int) -> Header:
    """The header in ``raw`` (a file's first bytes) of the file ``path`` of ``size`` bytes.

    Raises:
        OldVersion, ValueError: as :func:`read_header`.
    """
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
