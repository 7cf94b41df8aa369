"""Numba CPU kernels, each beside the plain NumPy reference it is tested against.

The public functions dispatch: Numba on NumPy arrays when the JIT is enabled, the
reference otherwise (CuPy arrays, ``NUMBA_DISABLE_JIT=1``). See :mod:`.jit` for how
compilation is serialised per node.
"""

from minidp.kernels import winograd
from minidp.kernels.batchnorm import batchnorm_backward, batchnorm_forward
from minidp.kernels.elementwise import relu_backward, sgd_update
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
    "output_size", "relu_backward", "sgd_update", "use_kernels", "winograd",
]
