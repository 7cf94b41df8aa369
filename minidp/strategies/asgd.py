"""``asgd``: asynchronous SGD through a parameter server, every gradient applied at once.

The baseline of the elastic-averaging paper (You, Buluc, Demmel, SC17: "Async SGD") and
of the dynamic-batch-size paper (Ji et al. 2019: "ASGD"): Downpour-style, every gradient
applied by the server as soon as it arrives. ``amsgd`` (:mod:`minidp.strategies.amsgd`)
is the same with momentum at the server. The protocol is the family's base,
:mod:`minidp.strategies.ps_base`.
"""

from __future__ import annotations

from minidp.strategies.ps_base import ParameterServer


class AsyncSGD(ParameterServer):
    """Asynchronous SGD: workers pull, compute, push; the server applies each gradient at once.

    Communication: the pull/push protocol of :class:`ParameterServer` (numbered there).
    Update, at the server (``ParameterServer.on_gradient`` -> ``apply`` ->
    ``SGD.update`` of its shard), for a gradient g pulled at version v_read::

        w <- w - lr * g          staleness = version - v_read;   version += 1

    ``--momentum`` is not used (plain SGD, as the papers' Async SGD); ``amsgd`` keeps the
    momentum at the server. One worker: exactly sequential SGD, step for step.
    """

    name = "asgd"
    default_rates = (0.02, 0.0)  # the server applies plain SGD: --momentum is unused
