"""``asgd`` and ``amsgd``: asynchronous SGD through a parameter server, without and with momentum.

The baselines of the elastic-averaging paper (You, Buluc, Demmel, SC17: "Async SGD",
"Async MSGD") and of the dynamic-batch-size paper (Ji et al. 2019: "ASGD"): Downpour-
style, every gradient applied by the server as soon as it arrives.
"""

from __future__ import annotations

from minidp.strategies.ps import ParameterServer


class AsyncSGD(ParameterServer):
    """Asynchronous SGD: workers pull, compute, push; the server applies each gradient at once.

    Communication: the pull/push protocol of :class:`ParameterServer` (numbered there).
    Update, at the server, for a gradient g pulled at version v_read::

        w <- w - lr * g          staleness = version - v_read;   version += 1

    ``--momentum`` is not used (plain SGD, as the papers' Async SGD); ``amsgd`` keeps the
    momentum at the server. One worker: exactly sequential SGD, step for step.
    """

    name = "asgd"


class AsyncMomentumSGD(ParameterServer):
    """Asynchronous momentum SGD: as ``asgd``, with the momentum buffer kept at the server.

    Update at the server (PyTorch's form, ``--momentum`` m, ``--nesterov``)::

        buf <- m * buf + g;   w <- w - lr * buf

    The momentum mixes gradients of different staleness: an asynchronous run's
    effective momentum is larger than m (Mitliagkas et al. 2016, "asynchrony begets
    momentum"), so a lower m often trains better here than in ``sync``.
    One worker: exactly sequential momentum SGD.
    """

    name = "amsgd"
    server_momentum = True
