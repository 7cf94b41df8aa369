"""``amsgd``: asynchronous momentum SGD, the momentum buffer kept at the parameter server.

SC17's "Async MSGD" baseline (You, Buluc, Demmel), ``asgd``
(:mod:`minidp.strategies.asgd`) with ``--momentum`` (and ``--nesterov``) applied where
the parameters live; the protocol is :mod:`minidp.strategies.ps_base`.
"""

from __future__ import annotations

from minidp.strategies.ps_base import ParameterServer


class AsyncMomentumSGD(ParameterServer):
    """Asynchronous momentum SGD: as ``asgd``, with the momentum buffer kept at the server.

    Update at the server (PyTorch's form, ``--momentum`` m, ``--nesterov``; ``SGD.update``
    of the server's shard with its momentum)::

        buf <- m * buf + g;   w <- w - lr * buf

    The momentum mixes gradients of different staleness: an asynchronous run's
    effective momentum is larger than m (Mitliagkas et al. 2016, "asynchrony begets
    momentum"), so a lower m often trains better here than in ``sync``.
    One worker: exactly sequential momentum SGD.
    """

    name = "amsgd"
    # The server's momentum mixes stale gradients, which adds momentum of its own: less.
    default_rates = (0.02, 0.7)
    server_momentum = True
