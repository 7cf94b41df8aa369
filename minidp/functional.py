"""The functional API: stateless ops on Tensors, named as in ``torch.nn.functional``."""

from minidp.autograd.ops import (
    avg_pool2d,
    batch_norm,
    conv2d,
    cross_entropy,
    dropout,
    flatten,
    linear,
    log_softmax,
    max_pool2d,
    mse_loss,
    relu,
    sigmoid,
    softmax,
    tanh,
)

__all__ = [
    "avg_pool2d", "batch_norm", "conv2d", "cross_entropy", "dropout", "flatten", "linear",
    "log_softmax", "max_pool2d", "mse_loss", "relu", "sigmoid", "softmax", "tanh",
]
