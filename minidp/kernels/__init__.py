"""Numba CPU kernels and their CUDA counterparts, each beside its plain NumPy reference.

The public functions dispatch: Numba on NumPy arrays when the JIT is enabled, the CUDA
kernels of :mod:`.cuda` on CuPy arrays (im2col, col2im, max pooling, the SGD step),
the reference otherwise (``NUMBA_DISABLE_JIT=1``, ``MINIDP_CUDA_KERNELS=0``, the other
ops on CuPy). See :mod:`.jit` for how compilation is serialised per node.
"""

from minidp.kernels import winograd
from minidp.kernels.batchnorm import batchnorm_backward, batchnorm_forward
from minidp.kernels.elementwise import relu_backward, relu_forward, sgd_update, weighted_merge
from minidp.kernels.jit import ensure_compiled, jit_enabled, use_kernels
from minidp.kernels.pooling import (
    avgpool_backward,
    avgpool_forward,
    maxpool_backward,
    maxpool_forward,
)
from minidp.kernels.unfold import col2im, im2col, output_size

__all__ = [
    "avgpool_backward", "avgpool_forward", "batchnorm_backward", "batchnorm_forward", "col2im",
    "ensure_compiled", "im2col", "jit_enabled", "maxpool_backward", "maxpool_forward",
    "output_size", "relu_backward", "relu_forward", "sgd_update", "use_kernels", "weighted_merge",
    "winograd",
]
