"""The array module behind every Tensor: NumPy on the CPU, CuPy on an NVIDIA GPU.

minidp never imports ``cupy`` at module level: the GPU backend is chosen with
``MINIDP_BACKEND=cupy`` or :func:`set_backend`, and asking for it on a machine
without a GPU is a clear ``RuntimeError`` at that moment, not a crash deep inside
an op. Every op gets its array module from its inputs (:func:`array_module`), so
NumPy and CuPy arrays are never mixed silently.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy

BACKENDS = ("numpy", "cupy")

_state: dict[str, Any] = {"name": "numpy", "xp": numpy}


def _import_cupy() -> ModuleType:
    try:
        import cupy
    except ImportError as exc:
        raise RuntimeError(
            "backend 'cupy' was requested but cupy is not installed; "
            "install it with `pip install minidp[gpu]` or use backend 'numpy'"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise RuntimeError(f"backend 'cupy' was requested but CUDA reports: {exc}") from exc
    if count < 1:
        raise RuntimeError("backend 'cupy' was requested but no GPU is visible")
    return cupy


def set_backend(name: str) -> ModuleType:
    """Select the array module for new tensors and models.

    Args:
        name: ``"numpy"`` or ``"cupy"``.

    Returns:
        The selected array module.

    Raises:
        ValueError: the name is not a known backend.
        RuntimeError: ``"cupy"`` was asked for but no GPU (or no cupy) is available.
    """
    if name not in BACKENDS:
        raise ValueError(f"backend: got {name!r}, allowed: {', '.join(map(repr, BACKENDS))}")
    xp = numpy if name == "numpy" else _import_cupy()
    _state["name"], _state["xp"] = name, xp
    return xp


def get_backend() -> str:
    """Return the name of the selected backend (``"numpy"`` or ``"cupy"``)."""
    return _state["name"]


def xp() -> ModuleType:
    """Return the selected array module (``numpy`` or ``cupy``)."""
    return _state["xp"]


def is_cupy_array(a: Any) -> bool:
    """Whether ``a`` is a CuPy array (checked without importing cupy)."""
    return type(a).__module__.startswith("cupy")


def array_module(*arrays: Any) -> ModuleType:
    """Return the array module of the given arrays; scalars and None are ignored.

    Raises:
        TypeError: NumPy and CuPy arrays are mixed.
    """
    kinds = {"cupy" if is_cupy_array(a) else "numpy"
             for a in arrays if hasattr(a, "dtype") and hasattr(a, "shape")}
    if len(kinds) > 1:
        raise TypeError(
            "arrays: got a mix of numpy and cupy arrays; move them to one device first "
            "(minidp.backend.to_device / to_host)"
        )
    if "cupy" in kinds:
        import cupy
        return cupy
    return numpy


def to_host(a: Any) -> numpy.ndarray:
    """Copy an array to host memory as a NumPy array (no copy when it already is one)."""
    if is_cupy_array(a):
        return a.get()
    return numpy.asarray(a)


def to_device(a: Any) -> Any:
    """Move an array to the selected backend's device (identity on the NumPy backend)."""
    if _state["name"] == "numpy":
        return to_host(a)
    return _state["xp"].asarray(a)


def select_device(local_rank: int) -> int | None:
    """Bind this process to GPU ``local_rank % device_count`` when the backend is cupy.

    Returns:
        The device id chosen, or None on the NumPy backend.
    """
    if _state["name"] != "cupy":
        return None
    cupy = _state["xp"]
    device = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    return device


_requested = os.environ.get("MINIDP_BACKEND", "numpy")
if _requested != "numpy":
    set_backend(_requested)
