"""LARS: momentum SGD whose step each parameter tensor scales by its own trust ratio.

You, Gitman, Ginsburg, "Large Batch Training of Convolutional Networks" (2017),
Algorithm 1, in torchlars' convention. The paper calls it layer-wise; what it computes
is per parameter tensor: a layer's weight and its bias each get their own ratio (the
paper's "layer" is one weight tensor). For tensor l, after any data-parallel gradient
averaging::

    ratio_l = trust * ||w_l|| / (||g_l|| + wd*||w_l|| + eps)   (1 if either norm is 0)
    buf_l   = m*buf_l + ratio_l * (g_l + wd*w_l);   w_l -= lr * buf_l

The ratio is nonlinear in g, so it must see the *averaged* gradient: applying it to
each worker's gradient and then averaging is a different algorithm (``hsgd`` averages
first, then steps; docs/hsgd.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from minidp.backend import array_module
from minidp.kernels import sgd_update
from minidp.layers.flat import Parameter
from minidp.optim.optimizer import Optimizer, check_range


def trust_ratio(w_norm: float, g_norm: float, weight_decay: float, trust_coefficient: float,
                eps: float) -> float:
    """LARS' local learning rate: trust*||w|| / (||g|| + wd*||w|| + eps), 1 if a norm is 0."""
    if w_norm > 0 and g_norm > 0:
        return trust_coefficient * w_norm / (g_norm + weight_decay * w_norm + eps)
    return 1.0


class LARS(Optimizer):
    """Layer-wise adaptive rate scaling over momentum SGD: one trust ratio per tensor.

    Args:
        params: parameters; the trust ratio is computed per parameter tensor (each
            weight and each bias on its own), not per layer.
        lr: global learning rate (combine with :class:`PolynomialLR`, power 2, as the paper).
        momentum: in [0, 1).
        weight_decay: L2 coefficient, >= 0 (also in the ratio's denominator).
        trust_coefficient: eta, > 0 (0.001 in the paper and torchlars).
        eps: added to the denominator.
        exclude_bias_and_bn: give 1-D parameters (biases, BatchNorm) plain momentum SGD
            without weight decay, as later large-batch practice does. Off by default, which
            is the paper's "every layer".
    """

    def __init__(self, params: Iterable[Parameter], lr: float, momentum: float = 0.9,
                 weight_decay: float = 0.0, trust_coefficient: float = 0.001, eps: float = 1e-8,
                 exclude_bias_and_bn: bool = False) -> None:
        super().__init__(params, lr)
        self.momentum = check_range("momentum", momentum, 0.0, 1.0)
        self.weight_decay = check_range("weight_decay", weight_decay, 0.0)
        self.trust_coefficient = check_range("trust_coefficient", trust_coefficient, 0.0)
        if self.trust_coefficient == 0:
            raise ValueError("trust_coefficient: got 0, allowed: > 0")
        self.eps = check_range("eps", eps, 0.0)
        self.exclude_bias_and_bn = bool(exclude_bias_and_bn)
        self.last_ratios: list[float] = []

    def _update(self) -> None:
        """Each parameter tensor: its trust ratio, then momentum SGD on the scaled gradient."""
        self.last_ratios = []
        for p, buf in zip(self.params, self.state_views):
            if p.grad is None:
                continue
            if self.exclude_bias_and_bn and p.data.ndim <= 1:
                sgd_update(p.data, p.grad, buf, self.lr, self.momentum, 0.0, False)
                self.last_ratios.append(1.0)
                continue
            xp = array_module(p.data)
            w_norm, g_norm = float(xp.linalg.norm(p.data)), float(xp.linalg.norm(p.grad))
            ratio = trust_ratio(w_norm, g_norm, self.weight_decay, self.trust_coefficient,
                                self.eps)
            scaled = ratio * (p.grad + self.weight_decay * p.data)
            sgd_update(p.data, scaled, buf, self.lr, self.momentum, 0.0, False)
            self.last_ratios.append(ratio)
