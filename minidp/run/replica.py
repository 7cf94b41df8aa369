"""Where forward and backward run: the host model itself, or its replica on a GPU.

The strategies reduce in host shared-memory windows and over MPI, and the optimizer
updates the host model's flat buffers; none of them ever sees a device array. On the
GPU backend the Trainer computes on a replica of the model on this rank's GPU and
exchanges exactly two flat buffers with the host per step::

    1. parameters_to_device  host parameters -> device  (after the strategy's pull or
                                                        update; a side stream, overlapping
                                                        the host's preparation of the batch)
    2. zero_grad, forward, backward on the device       (the Trainer's loop, as on the CPU)
    3. gradients_to_host     device gradients -> host   (into the strategy's gradient
                                                        buffer, page-locked: a node
                                                        window's segment goes by DMA)
    4. strategy.step() on the host                      (reductions, optimizer)

The replica only moves data: the loop itself (zero the gradients, forward, backward,
step) is the Trainer's, the same lines on either device.

BatchNorm statistics change in forward, on the device: they go down before the
epoch's end work (averaging over workers, checkpoint) and up at each epoch's start
and before evaluation. So any strategy runs on a GPU unchanged, and its arithmetic
(reductions, updates) is the CPU's, bit for bit, given the same gradients.

Why not keep the parameters and the optimizer on the device and hand device arrays
to a CUDA-aware MPI? The node level is shared host memory (MPI windows), so the
gradients must come to the host once in any case, and a parameter-server pull or an
elastic exchange lands in host memory too; one download and one upload per step is
the least any strategy needs. ``MINIDP_HOST_REPLICA=1`` runs the same replica with
NumPy on the CPU, so every staging point is tested without a GPU.
"""

from __future__ import annotations

import copy
import os
from typing import Any

from minidp import backend, layers
from minidp.backend import Staging


class HostCompute:
    """Forward and backward on the host model itself: no copies (the NumPy backend)."""

    def __init__(self, model: layers.Module) -> None:
        self.model, self.flat = model, model.flat_parameters()

    def inputs(self, x: Any, y: Any) -> tuple[Any, Any]:
        """The batch as the model takes it (host arrays: as they are)."""
        return x, y

    def parameters_to_device(self) -> None:
        """Nothing to move: forward reads the host parameters."""

    def gradients_to_host(self) -> None:
        """Nothing to move: backward wrote the host gradients."""

    def buffers_to_device(self) -> None:
        """Nothing to move: the BatchNorm statistics are the host model's."""

    def buffers_to_host(self) -> None:
        """Nothing to move: the BatchNorm statistics are the host model's."""

    def close(self) -> None:
        """Nothing to release."""


class DeviceReplica(HostCompute):
    """A copy of ``host`` on ``device`` that forward and backward run on.

    Args:
        host: the host model (NumPy); the strategy and optimizer own it.
        device: ``"cuda"`` (this process's GPU) or ``"cpu"`` (a second host copy,
            for testing the staging without a GPU).
    """

    def __init__(self, host: layers.Module, device: str) -> None:
        super().__init__(copy.deepcopy(host).to(device))
        self.host, self.xp = host, backend.device_module(device)
        for (_, mine), (_, theirs) in zip(self.model.named_modules(), host.named_modules()):
            if isinstance(mine, layers.Dropout):  # one mask stream, saved by checkpoints
                mine.rng = theirs.rng
        self.host_flat = host.flat_parameters()
        self.parameters = Staging(self.host_flat.data, self.flat.data)
        self.gradients = Staging(self.host_flat.grad, self.flat.grad)

    def inputs(self, x: Any, y: Any) -> tuple[Any, Any]:
        """The batch on the device."""
        return backend.to_module(x, self.xp), backend.to_module(y, self.xp)

    def parameters_to_device(self) -> None:
        """Host parameters (the strategy's, after its pull or update) -> device.

        The staging follows the host parameters where a strategy moved them (DASO's
        identical node keeps one replica in a node window, and leaves it later).
        """
        if self.host_flat.data is not self.parameters.host:
            self.parameters.close()
            self.parameters = Staging(self.host_flat.data, self.flat.data)
        self.parameters.upload()

    def gradients_to_host(self) -> None:
        """Device gradients -> the host gradient buffer the strategy reduces."""
        self.gradients.download()

    def buffers_to_device(self) -> None:
        """Host BatchNorm statistics -> device (averaged, restored or broadcast there)."""
        for (_, mine), (_, theirs) in zip(self.model.named_buffers(),
                                          self.host.named_buffers()):
            mine[...] = backend.to_module(theirs, self.xp)

    def buffers_to_host(self) -> None:
        """Device BatchNorm statistics -> host, for the epoch's end work."""
        for (_, mine), (_, theirs) in zip(self.model.named_buffers(),
                                          self.host.named_buffers()):
            theirs[...] = backend.to_host(mine)

    def close(self) -> None:
        """Unlock the host buffers (the strategy frees its windows after this)."""
        self.parameters.close()
        self.gradients.close()


def replica_for(model: layers.Module) -> HostCompute:
    """Where this rank computes: a GPU replica on the cupy backend, else the host model.

    ``MINIDP_HOST_REPLICA=1`` (NumPy backend) computes on a host replica through the same
    staging, to check a strategy's staging points on a machine without a GPU.
    """
    if backend.get_backend() == "cupy":
        return DeviceReplica(model, "cuda")
    if os.environ.get("MINIDP_HOST_REPLICA", "0") not in ("0", ""):
        return DeviceReplica(model, "cpu")
    return HostCompute(model)
