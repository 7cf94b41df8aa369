"""Module and Parameter: the containers of PyTorch, with its naming and state_dict keys.

Parameters, sub-modules and buffers (non-trained state such as BatchNorm's running
statistics) are registered by attribute assignment, in order; ``named_parameters()``
walks own parameters first, then children in registration order, exactly as PyTorch
does, so the order is the same on every rank and keys match PyTorch's
(``"features.3.bias"``).

A shape error raised inside a layer's forward is re-raised once, at the outermost
call, as :class:`LayerInputError` naming the layer's path and type.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from minidp import backend
from minidp.layers.flat import FlatParameters, Parameter


class LayerInputError(ValueError):
    """An input that does not fit a layer; the message names the layer and both shapes."""

    def __init__(self, message: str, layer: Module) -> None:
        super().__init__(message)
        self.layer = layer


_call_depth = [0]


class Module:
    """Base class of layers and models."""

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", {})
        object.__setattr__(self, "_modules", {})
        object.__setattr__(self, "_buffers", {})
        object.__setattr__(self, "training", True)

    def __setattr__(self, name: str, value: Any) -> None:
        params, modules, buffers = self._parameters, self._modules, self._buffers
        if isinstance(value, Parameter):
            modules.pop(name, None)
            buffers.pop(name, None)
            params[name] = value
        elif isinstance(value, Module):
            params.pop(name, None)
            buffers.pop(name, None)
            modules[name] = value
        elif name in buffers:
            buffers[name] = value
        else:
            params.pop(name, None)
            modules.pop(name, None)
        object.__setattr__(self, name, value)

    def register_buffer(self, name: str, value: Any) -> None:
        """Register a non-trained array (saved in state_dict, converted by to())."""
        self._buffers[name] = value
        object.__setattr__(self, name, value)

    # -- traversal -----------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """Yield (path, module) for this module and every descendant, depth first."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self, prefix: str = "") -> Iterator[tuple[str, Parameter]]:
        """Yield (key, parameter) in PyTorch's order: own parameters, then children's."""
        for path, module in self.named_modules(prefix):
            for name, p in module._parameters.items():
                yield (f"{path}.{name}" if path else name), p

    def parameters(self) -> list[Parameter]:
        """All parameters in named_parameters() order."""
        return [p for _, p in self.named_parameters()]

    def named_buffers(self) -> Iterator[tuple[str, Any]]:
        """Yield (key, array) for every buffer."""
        for path, module in self.named_modules():
            for name, b in module._buffers.items():
                yield (f"{path}.{name}" if path else name), b

    def children(self) -> list[Module]:
        """Direct sub-modules in registration order."""
        return list(self._modules.values())

    # -- modes and calls -----------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode (Dropout active, BatchNorm uses batch statistics)."""
        for _, module in self.named_modules():
            object.__setattr__(module, "training", mode)
        return self

    def eval(self) -> Module:
        """Set inference mode."""
        return self.train(False)

    def forward(self, *args: Any) -> Any:
        """Compute the module's output; subclasses define it."""
        raise TypeError(f"{type(self).__name__} defines no forward()")

    def __call__(self, *args: Any) -> Any:
        """Run forward(); an input error is re-raised naming the layer that refused it."""
        _call_depth[0] += 1
        try:
            return self.forward(*args)
        except ValueError as err:
            layer = err.layer if isinstance(err, LayerInputError) else self
            if _call_depth[0] > 1:
                if isinstance(err, LayerInputError):
                    raise
                raise LayerInputError(str(err), self) from err
            path = next((p for p, m in self.named_modules() if m is layer), "")
            raise LayerInputError(f"layer '{path or type(layer).__name__}' "
                                  f"({type(layer).__name__}({layer.extra_repr()})): {err}",
                                  layer) from err
        finally:
            _call_depth[0] -= 1

    def zero_grad(self) -> None:
        """Set every parameter's gradient to zero (in place where it exists)."""
        for p in self.parameters():
            p.zero_grad()

    # -- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Host copies of parameters and buffers, keyed and ordered as in PyTorch."""
        state = {}
        for path, module in self.named_modules():
            for name, value in [*((n, p.data) for n, p in module._parameters.items()),
                                *module._buffers.items()]:
                state[f"{path}.{name}" if path else name] = backend.to_host(value).copy()
        return state

    def load_state_dict(self, state: dict[str, Any], strict: bool = True) -> None:
        """Copy values into the existing parameters and buffers (views stay views).

        Raises:
            KeyError: with ``strict``, keys missing from ``state`` or unexpected in it.
            ValueError: a value whose shape differs from the model's.
        """
        own = dict(self.named_parameters())
        buffers = dict(self.named_buffers())
        expected = set(own) | set(buffers)
        missing, unexpected = sorted(expected - set(state)), sorted(set(state) - expected)
        if strict and (missing or unexpected):
            raise KeyError(f"load_state_dict: missing keys {missing}, unexpected keys "
                           f"{unexpected}")
        for key in sorted(expected & set(state)):
            value = np.asarray(backend.to_host(state[key]))
            target = own[key].data if key in own else buffers[key]
            if value.shape != target.shape:
                raise ValueError(f"load_state_dict: '{key}' has shape {value.shape} in the "
                                 f"state dict but {target.shape} in the model")
            target[...] = backend.like(value.astype(target.dtype, copy=False), target)

    def to(self, target: Any) -> Module:
        """Convert to a dtype (e.g. float64) or move to a device (``"cpu"``, ``"cuda"``).

        Floating parameters and buffers take the dtype; on a move every parameter and
        buffer goes. The flat parameter and gradient buffers are rebuilt; returns self.
        """
        moving = isinstance(target, str) and target in backend.DEVICES
        xp = backend.device_module(target) if moving else None
        dtype = None if moving else np.dtype(target)

        def convert(a: Any) -> Any:
            return backend.to_module(a, xp) if moving else a.astype(dtype)

        for p in self.parameters():
            p.data = convert(p.data)
            p.grad = None
        for _, module in self.named_modules():
            for name, b in list(module._buffers.items()):
                if moving or b.dtype.kind == "f":
                    setattr(module, name, convert(b))
        self.flat_parameters()
        return self

    def flat_parameters(self) -> FlatParameters:
        """The model's flat parameter/gradient buffers, built on first use.

        Every parameter's ``data`` and ``grad`` become views into them; they are
        rebuilt if a parameter array was replaced since.
        """
        flat = self.__dict__.get("_flat")
        params = self.parameters()
        if flat is None or not flat.intact(params):
            flat = FlatParameters(params)
            object.__setattr__(self, "_flat", flat)
        return flat

    def extra_repr(self) -> str:
        """Arguments shown inside the repr."""
        return ""

    def __repr__(self) -> str:
        if not self._modules:
            return f"{type(self).__name__}({self.extra_repr()})"
        lines = [f"  ({name}): {child!r}".replace("\n", "\n  ")
                 for name, child in self._modules.items()]
        return f"{type(self).__name__}(\n" + "\n".join(lines) + "\n)"
