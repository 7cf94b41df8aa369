"""2-D convolution as im2col + one BLAS matmul (PyTorch's weight layout (F, C, kh, kw)).

Forward::

    cols = im2col(x)                 # (C*kh*kw, N*OH*OW), Numba kernel
    out  = W.reshape(F, -1) @ cols   # (F, N*OH*OW), one GEMM
    out  = out.reshape(F, N, OH, OW).transpose(1, 0, 2, 3) + b

Backward reuses ``cols``: dW = (cols @ g2.T).T, db = g2.sum(1), and (only when the
input needs a gradient, i.e. not for the first layer) dx = col2im(W2.T @ g2).
"""

from __future__ import annotations

from typing import Any

from minidp.backend import array_module
from minidp.function import Function
from minidp.kernels import col2im, im2col, output_size


def _pair_to_int(value: Any, name: str) -> int:
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or value[0] != value[1]:
            raise ValueError(f"conv2d: {name} {value!r} must be one int or a pair of equal ints")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"conv2d: {name} must be an int, got {value!r}")
    return value


def check_conv_args(x: Any, w: Any, b: Any, stride: int, padding: int) -> None:
    """Validate shapes and hyper-parameters of a convolution, naming what is wrong."""
    if x.ndim != 4:
        raise ValueError(f"conv2d: input must be (N, C, H, W), got shape {x.shape}")
    if w.ndim != 4:
        raise ValueError(f"conv2d: weight must be (F, C, kh, kw), got shape {w.shape}")
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"conv2d: input has {x.shape[1]} channels but the weight of shape "
                         f"{w.shape} expects {w.shape[1]}")
    if stride < 1:
        raise ValueError(f"conv2d: stride must be >= 1, got {stride}")
    if padding < 0:
        raise ValueError(f"conv2d: padding must be >= 0, got {padding}")
    if b is not None and b.shape != (w.shape[0],):
        raise ValueError(f"conv2d: bias shape {b.shape} must be ({w.shape[0]},)")
    h, wd = x.shape[2] + 2 * padding, x.shape[3] + 2 * padding
    if h < w.shape[2] or wd < w.shape[3]:
        raise ValueError(f"conv2d: kernel {w.shape[2:]} is larger than the padded input "
                         f"({h}, {wd})")


class Conv2d(Function):
    """Cross-correlation of (N, C, H, W) with (F, C, kh, kw), plus an optional bias."""

    def forward(self, x: Any, w: Any, b: Any = None, stride: Any = 1, padding: Any = 0) -> Any:
        stride, padding = _pair_to_int(stride, "stride"), _pair_to_int(padding, "padding")
        check_conv_args(x, w, b, stride, padding)
        xp = array_module(x, w)
        n, _, h, wd = x.shape
        f, _, kh, kw = w.shape
        oh, ow = output_size(h, kh, stride, padding), output_size(wd, kw, stride, padding)
        self.x_shape, self.w, self.geometry = x.shape, w, (kh, kw, stride, padding)
        self.cols = im2col(x, kh, kw, stride, padding)  # (C*kh*kw, N*OH*OW)
        out = w.reshape(f, -1) @ self.cols  # (F, N*OH*OW)
        if b is not None:
            out += b.reshape(f, 1)
        return xp.ascontiguousarray(out.reshape(f, n, oh, ow).transpose(1, 0, 2, 3))

    def backward(self, g: Any) -> tuple:
        f = self.w.shape[0]
        g2 = g.transpose(1, 0, 2, 3).reshape(f, -1)  # (F, N*OH*OW)
        # (cols @ g2.T).T rather than g2 @ cols.T: BLAS runs the long reduction twice as fast
        gw = (self.cols @ g2.T).T.reshape(self.w.shape) if self.wants(1) else None
        gb = g2.sum(axis=1) if self.wants(2) else None
        gx = None
        if self.wants(0):
            kh, kw, stride, padding = self.geometry
            gx = col2im(self.w.reshape(f, -1).T @ g2, self.x_shape, kh, kw, stride, padding)
        return gx, gw, gb
