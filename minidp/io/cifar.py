"""CIFAR-10's python batches, read without running what a pickle asks for.

A batch file (``data_batch_1`` ... ``data_batch_5``, ``test_batch`` of
cifar-10-python.tar.gz) is a Python 2 pickle (protocol 2) of a dict: ``data``, a uint8
array (N, 3072); ``labels``, N ints; ``batch_label`` and ``filenames``, strings.
``pickle.load`` calls whatever function a file names and allocates whatever sizes it
claims, so a damaged or foreign file could run code or ask for terabytes. Here:

1. The file is read whole (its size bounds memory) and its opcodes are scanned first
   (:func:`pickletools.genops`): every length an opcode claims is checked against the
   bytes that follow it, and every memo index against the opcodes seen so far, because
   the unpickler allocates what ``BINBYTES8``, ``BYTEARRAY8`` or a memo index claim
   before it reads anything.
2. :class:`BatchUnpickler` admits three globals, all that an array needs: NumPy's
   ``_reconstruct`` (as ``numpy.core.multiarray._reconstruct``, where the 2009 files
   name it, or ``numpy._core.multiarray._reconstruct``, where NumPy 2 writes it),
   ``numpy.ndarray`` and ``numpy.dtype``. dict, list, str, bytes and int come from
   pickle's own opcodes and need no global. None of the three is NumPy's own: each is a
   placeholder (:class:`_ArrayState`, :class:`_DtypeSpec`) that checks what the pickle
   gives it (a plain number dtype, a shape whose bytes are the bytes given) before one
   array is built from the data, so NumPy never allocates from a pickle's shape.
3. The result must be a dict with ``data`` a uint8 (N, 3072) array and ``labels`` N
   ints in [0, 10).
"""

from __future__ import annotations

import io
import math
import os
import pickle
import pickletools
import re
import warnings
from typing import Any

import numpy as np

from minidp.io.filesystem import open_regular

PIXELS = 3 * 32 * 32
CLASSES = 10
# Where the batches come from and the folder their archive unpacks to.
SOURCE = "https://www.cs.toronto.edu/~kriz/cifar.html"
ARCHIVE = "cifar-10-python.tar.gz"
UNPACKED = "cifar-10-batches-py"
_NUMBER = re.compile(r"[<>|=]?[biuf][0-9]{1,2}")  # "u1", as the batches store uint8
_MEMO_PUT = ("PUT", "BINPUT", "LONG_BINPUT")


class _DtypeSpec:
    """``numpy.dtype`` in a batch: a plain number type, kept as text until it is checked."""

    def __init__(self, spec: Any, align: Any = False, copy: Any = True) -> None:
        if isinstance(spec, bytes):
            spec = spec.decode("ascii", errors="replace")
        if not isinstance(spec, str) or not _NUMBER.fullmatch(spec):
            raise pickle.UnpicklingError(f"dtype {spec!r}, allowed: a plain number type "
                                         "such as 'u1'")
        self.spec, self.order = spec.lstrip("<>|="), "|"

    def __setstate__(self, state: Any) -> None:
        # NumPy's dtype state: (version, byte order, subarray, names, fields, ...).
        order = state[1] if isinstance(state, tuple) and len(state) >= 5 else None
        order = order.decode("ascii", errors="replace") if isinstance(order, bytes) else order
        if order not in ("<", ">", "|", "=") or state[2:5] != (None, None, None):
            raise pickle.UnpicklingError(f"dtype state {state!r:.80}, allowed: a plain "
                                         "number type (no fields, no subarray)")
        self.order = order

    def dtype(self) -> np.dtype:
        """The checked dtype."""
        try:
            return np.dtype(("" if self.order == "|" else self.order) + self.spec)
        except TypeError as exc:  # a size NumPy does not have, such as "f3"
            raise pickle.UnpicklingError(f"dtype {self.spec!r}: {exc}") from None


class _ArrayState:
    """``numpy.ndarray`` in a batch: the array, built once its state is checked (BUILD)."""

    def __init__(self) -> None:
        self.array: np.ndarray | None = None

    def __setstate__(self, state: Any) -> None:
        # NumPy's array state: (version, shape, dtype, Fortran order, raw bytes).
        if not isinstance(state, tuple) or len(state) != 5:
            raise pickle.UnpicklingError("array state: not NumPy's 5-tuple")
        _, shape, spec, fortran, raw = state
        if (not isinstance(shape, tuple) or not all(type(n) is int and n >= 0 for n in shape)
                or not isinstance(spec, _DtypeSpec) or not isinstance(raw, bytes)):
            raise pickle.UnpicklingError(f"array state: shape {shape!r:.60}, dtype "
                                         f"{type(spec).__name__} and data "
                                         f"{type(raw).__name__}, allowed: a tuple of sizes, a "
                                         "number dtype and bytes")
        dtype = spec.dtype()
        needed = math.prod(shape) * dtype.itemsize  # Python integers: no overflow
        if needed != len(raw):
            raise pickle.UnpicklingError(f"array of shape {shape} of {dtype} needs {needed} "
                                         f"bytes, the pickle holds {len(raw)}")
        order = "F" if fortran else "C"
        self.array = np.frombuffer(raw, dtype).reshape(shape, order=order).copy()


def _reconstruct(subtype: Any, shape: Any, typecode: Any) -> _ArrayState:
    """NumPy's ``_reconstruct(ndarray, (0,), b"b")``: an empty array that BUILD fills."""
    if subtype is not _ArrayState or shape != (0,):
        raise pickle.UnpicklingError(f"_reconstruct({getattr(subtype, '__name__', subtype)}, "
                                     f"{shape!r:.40}), allowed: NumPy's empty ndarray, (0,)")
    return _ArrayState()


class BatchUnpickler(pickle.Unpickler):
    """An unpickler that admits only the globals of a CIFAR-10 batch (placeholders)."""

    ADMITTED = {("numpy.core.multiarray", "_reconstruct"): _reconstruct,
                ("numpy._core.multiarray", "_reconstruct"): _reconstruct,
                ("numpy", "ndarray"): _ArrayState, ("numpy", "dtype"): _DtypeSpec}

    def find_class(self, module: str, name: str) -> Any:
        """The placeholder of an admitted global; any other is refused."""
        if (module, name) not in self.ADMITTED:
            raise pickle.UnpicklingError(f"global '{module}.{name}' is not allowed in a "
                                         "CIFAR-10 batch (allowed: numpy's _reconstruct, "
                                         "ndarray, dtype)")
        return self.ADMITTED[(module, name)]


def _scan(raw: bytes) -> None:
    """Check every opcode's claimed length and memo index before anything is unpickled."""
    for count, (opcode, arg, _) in enumerate(pickletools.genops(raw)):
        if opcode.name in _MEMO_PUT and not 0 <= arg <= count:
            raise pickle.UnpicklingError(f"memo index {arg} after {count} opcodes")


def load_cifar_batch(path: str) -> tuple[np.ndarray, np.ndarray]:
    """One batch file as (images (N, 3, 32, 32) uint8, labels (N,) int64).

    Raises:
        FileNotFoundError: no such file (the message says where to get the files and
            how to lay them out).
        ValueError: the file is not a CIFAR-10 python batch (the message names it and
            says why: a refused global, a length past the end, a wrong shape...).
    """
    if not os.path.exists(path):
        directory = os.path.dirname(path) or "."
        data_dir = (os.path.dirname(directory) or ".") \
            if os.path.basename(directory) == UNPACKED else directory
        raise FileNotFoundError(
            f"CIFAR-10 batch '{path}' does not exist. minidp reads CIFAR-10's python "
            f"version: download {ARCHIVE} from {SOURCE} and unpack it in the data "
            f"directory (tar xzf {ARCHIVE} -C {data_dir}), which gives "
            f"{os.path.join(data_dir, UNPACKED)}/ holding data_batch_1 ... data_batch_5 and "
            f"test_batch; point --data-dir at {data_dir}")
    with open_regular(path, ("CIFAR-10 batch", f"a python batch file of {ARCHIVE}")) as f:
        raw = f.read()  # never a FIFO or a device, which could wait for ever
    try:
        # A protocol-0 string with an unknown escape warns (DeprecationWarning); it is
        # refused or loaded like any other, so the warning says nothing here.
        with warnings.catch_warnings(action="ignore", category=DeprecationWarning):
            _scan(raw)
            batch = BatchUnpickler(io.BytesIO(raw), encoding="bytes").load()
    except (pickle.UnpicklingError, ValueError, TypeError, EOFError, KeyError, AttributeError,
            IndexError, OverflowError) as exc:
        raise ValueError(f"CIFAR-10 batch '{path}' is not a valid python batch file: "
                         f"{exc!r:.300}") from None
    return _images_and_labels(path, batch)


def _images_and_labels(path: str, batch: Any) -> tuple[np.ndarray, np.ndarray]:
    """The checked arrays of an unpickled batch."""
    data, labels = (batch.get(b"data"), batch.get(b"labels")) if isinstance(batch, dict) \
        else (None, None)
    array = data.array if isinstance(data, _ArrayState) else None
    if array is None or array.dtype != np.uint8 or array.ndim != 2 or array.shape[1] != PIXELS:
        found = f"{array.dtype} {array.shape}" if array is not None else type(data).__name__
        raise ValueError(f"CIFAR-10 batch '{path}': data is {found}, expected a dict whose "
                         f"b'data' is a uint8 array (N, {PIXELS})")
    if not isinstance(labels, list) or len(labels) != len(array):
        found = f"{len(labels)} labels" if isinstance(labels, list) else type(labels).__name__
        raise ValueError(f"CIFAR-10 batch '{path}': {found} for {len(array)} images, expected "
                         "a list b'labels' of one int per image")
    bad = [v for v in labels if type(v) is not int or not 0 <= v < CLASSES]
    if bad:
        raise ValueError(f"CIFAR-10 batch '{path}': label {bad[0]!r:.40}, allowed: ints in "
                         f"[0, {CLASSES})")
    return array.reshape(-1, 3, 32, 32), np.array(labels, dtype=np.int64)
