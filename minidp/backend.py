"""The array module behind every Tensor (NumPy on the CPU, CuPy on a GPU), and staging.

minidp never imports ``cupy`` at module level: the GPU backend is chosen with
``MINIDP_BACKEND=cupy`` or :func:`set_backend`, and asking for it on a machine
without a GPU is a clear ``RuntimeError`` at that moment, not a crash deep inside
an op. Asked by the variable, the failure cannot break ``import minidp`` (on every
rank of a job, a traceback each): the import keeps the reason, the command line reports
it as one line naming the variable (:func:`check_environment`), and a program that uses
the backend anyway gets the same message from :func:`xp` and :func:`get_backend`, never
NumPy in its place. Every op gets its array module from its inputs
(:func:`array_module`), so NumPy and CuPy arrays are never mixed silently.

Devices are named as in PyTorch: ``"cpu"`` (NumPy arrays) and ``"cuda"`` (CuPy arrays
on this process's GPU). :class:`Staging` moves one host array to and from its device
twin through page-locked memory, the way the Trainer's GPU replica exchanges
parameters and gradients with the host buffers the strategies reduce.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Any

import numpy

BACKENDS = ("numpy", "cupy")

_state: dict[str, Any] = {"name": "numpy", "xp": numpy}


class Unavailable(RuntimeError):
    """The backend asked for cannot run here; the message says why (no cupy, no GPU)."""

    def __init__(self, why: str) -> None:
        super().__init__(f"backend 'cupy' was requested but {why}; install it with "
                         "`pip install minidp[gpu]` or use backend 'numpy'")
        self.why = why


def _import_cupy() -> ModuleType:
    try:
        import cupy
    except ImportError:
        raise Unavailable("cupy is not installed") from None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        raise Unavailable(f"CUDA reports: {exc}") from None
    if count < 1:
        raise Unavailable("no GPU is visible")
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
    _state.pop("unavailable", None)  # a choice made in code replaces the variable's
    _state.pop("asked", None)
    return xp


def get_backend() -> str:
    """Return the name of the selected backend (``"numpy"`` or ``"cupy"``).

    Raises:
        RuntimeError: ``MINIDP_BACKEND`` asked for a backend that cannot run here.
    """
    _refuse_unavailable()
    return _state["name"]


def xp() -> ModuleType:
    """Return the selected array module (``numpy`` or ``cupy``).

    Raises:
        RuntimeError: ``MINIDP_BACKEND`` asked for a backend that cannot run here.
    """
    if "unavailable" in _state:
        _refuse_unavailable()
    return _state["xp"]


def _refuse_unavailable() -> None:
    if "unavailable" in _state:
        raise RuntimeError(_state["unavailable"])


def describe() -> str:
    """The backend in use, or the one ``MINIDP_BACKEND`` asked for and why it cannot run."""
    return _state.get("asked", _state["name"])


def is_cupy_array(a: Any) -> bool:
    """Whether ``a`` is a CuPy array (checked without importing cupy)."""
    return type(a).__module__.startswith("cupy")


def array_module(*arrays: Any) -> ModuleType:
    """Return the array module of the given arrays; scalars and None are ignored.

    Raises:
        TypeError: NumPy and CuPy arrays are mixed.
    """
    kinds = {"cupy" if is_cupy_array(a) else "numpy" for a in arrays
             if hasattr(a, "dtype") and hasattr(a, "shape") and not isinstance(a, numpy.generic)}
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


DEVICES = ("cpu", "cuda")


def gpu_info() -> dict[str, Any]:
    """CuPy's version, the CUDA runtime and the visible GPUs, or why there are none."""
    try:
        import cupy
    except ImportError:
        return {"cupy": None, "devices": 0,
                "why": "cupy is not installed (pip install -e '.[gpu]')"}
    try:
        count = cupy.cuda.runtime.getDeviceCount()
        names = [cupy.cuda.runtime.getDeviceProperties(i)["name"].decode() for i in range(count)]
        runtime = cupy.cuda.runtime.runtimeGetVersion()
    except cupy.cuda.runtime.CUDARuntimeError as exc:
        return {"cupy": cupy.__version__, "devices": 0, "why": str(exc)}
    return {"cupy": cupy.__version__, "cuda_runtime": runtime, "devices": count, "names": names}


def device_module(device: str) -> ModuleType:
    """The array module of ``device``: NumPy for ``"cpu"``, CuPy for ``"cuda"``.

    Raises:
        ValueError: an unknown device name.
        RuntimeError: ``"cuda"`` without cupy or without a visible GPU.
    """
    if device not in DEVICES:
        raise ValueError(f"device: got {device!r}, allowed: {', '.join(map(repr, DEVICES))}")
    return numpy if device == "cpu" else _import_cupy()


def to_module(a: Any, xp: ModuleType) -> Any:
    """``a`` as an array of module ``xp`` (a copy across host and device, else no copy)."""
    return to_host(a) if xp is numpy else xp.asarray(a)


def like(value: Any, target: Any) -> Any:
    """``value`` as an array on the device ``target`` lives on (to assign into it)."""
    return to_module(value, array_module(target))


class Staging:
    """One host array and its device twin, copied between them through page-locked memory.

    On a GPU the host array itself is page-locked (``cudaHostRegister``): copies are then
    DMA straight into the memory the strategies reduce (a node window's segment, say),
    with no second host copy. Where CUDA refuses (memory another mapping already locked),
    a page-locked twin of the host array is used and the copy goes through it.
    ``upload`` runs on a side stream and only makes the compute stream wait for it, so
    the host goes on (to prepare the next batch) while the bytes move. On the CPU
    (``device`` a NumPy array: the host replica of ``MINIDP_HOST_REPLICA``) both are
    plain copies, so every staging point can be checked without a GPU.

    Args:
        host: a C-contiguous NumPy array that stays in place (its memory is locked).
        device: the device array of the same shape and dtype.
    """

    def __init__(self, host: numpy.ndarray, device: Any) -> None:
        if host.shape != device.shape or host.dtype != device.dtype:
            raise ValueError(f"staging: host array {host.shape} {host.dtype} and device array "
                             f"{device.shape} {device.dtype} must match")
        self.host, self.device = host, device
        self.twin: numpy.ndarray | None = None
        self.registered, self.stream, self.cupy = False, None, None
        if not is_cupy_array(device) or host.nbytes == 0:
            return
        import cupy
        import cupyx
        self.cupy, self.stream = cupy, cupy.cuda.Stream(non_blocking=True)
        self.copied = cupy.cuda.Event(disable_timing=True)  # reused: nothing per step
        try:
            cupy.cuda.runtime.hostRegister(host.ctypes.data, host.nbytes, 0)
            self.registered = True
        except cupy.cuda.runtime.CUDARuntimeError:
            self.twin = cupyx.empty_pinned(host.shape, host.dtype)

    def upload(self) -> None:
        """Host -> device; the compute stream (not the host) waits for the copy."""
        if self.stream is None:
            self.device[...] = self.host
            return
        source = self.host
        if self.twin is not None:
            self.twin[...] = self.host
            source = self.twin
        self.device.set(source, stream=self.stream)
        self.copied.record(self.stream)
        self.cupy.cuda.get_current_stream().wait_event(self.copied)

    def download(self) -> None:
        """Device -> host, finished when this returns (the host reads it next)."""
        if self.stream is None:
            self.host[...] = self.device
            return
        target = self.host if self.twin is None else self.twin
        self.device.get(out=target)
        if self.twin is not None:
            self.host[...] = self.twin

    def close(self) -> None:
        """Unlock the host memory (before whoever owns it frees it)."""
        if self.registered:
            self.cupy.cuda.runtime.hostUnregister(self.host.ctypes.data)
            self.registered = False


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


def check_environment() -> None:
    """Raise ValueError naming ``MINIDP_BACKEND`` if its value names no backend that runs here.

    ``train`` and the other commands report it as their one-line user error.
    """
    name = os.environ.get("MINIDP_BACKEND", "numpy")
    if name not in BACKENDS:
        raise ValueError(f"MINIDP_BACKEND: got {name!r}, allowed: {', '.join(BACKENDS)}")
    if "unavailable" in _state:
        raise ValueError(_state["unavailable"])


def _from_environment() -> None:
    """Select ``MINIDP_BACKEND``'s backend at import; keep the reason if it cannot run."""
    requested = os.environ.get("MINIDP_BACKEND", "numpy")
    if requested not in BACKENDS[1:]:  # an unknown name never breaks an import: train refuses it
        return
    try:
        set_backend(requested)
    except Unavailable as exc:
        _state["asked"] = f"{requested} (unavailable: {exc.why})"
        _state["unavailable"] = (f"MINIDP_BACKEND: got {requested!r}, but {exc.why}; allowed: "
                                 "numpy, or cupy where CuPy is installed (pip install -e "
                                 "'.[gpu]') and sees a GPU")


_from_environment()
