"""Matrix products: ``matmul`` (batched, broadcasting) and the fused ``linear`` layer op.

``linear(x, W, b) = x @ W.T + b`` with PyTorch's weight layout ``(out, in)``. It is
one Function rather than three, so backward makes exactly the three BLAS calls it
needs (dx = g @ W, dW = g.T @ x, db = sum(g)) and skips dx when x needs no gradient
(the input batch). On 2-D inputs the output and dx are computed transposed and come
out Fortran-ordered (see Linear.forward). With several threads per rank, a layer whose
products are small (LeNet-5's) runs them on one BLAS thread
(:func:`minidp.threads.blas_threads_for`): a second thread costs it more than it saves.
A large weight's gradient (:data:`ADD_INTO_MIN_SIZE` entries and more) is added into its
gradient array by the BLAS itself where that array exists (the flat buffer's view),
with the bits of the product added after.
"""

from __future__ import annotations

from typing import Any

from minidp.autograd.function import Function, unbroadcast
from minidp.kernels.gemm import add_product
from minidp.threads import blas_threads_for


def _check_matmul(a: Any, b: Any) -> None:
    if a.ndim == 0 or b.ndim == 0:
        raise ValueError(f"matmul: both operands need at least 1 dim, got shapes "
                         f"{a.shape} and {b.shape}")
    k_a = a.shape[-1]
    k_b = b.shape[-2] if b.ndim > 1 else b.shape[0]
    if k_a != k_b:
        raise ValueError(
            f"matmul: shapes {a.shape} and {b.shape} do not align: the last dim of the "
            f"first ({k_a}) must equal the {'second-to-last' if b.ndim > 1 else 'only'} "
            f"dim of the second ({k_b})")


class Matmul(Function):
    """a @ b for 1-D and N-D operands, batch dims broadcast as in NumPy."""

    def forward(self, a: Any, b: Any) -> Any:
        _check_matmul(a, b)
        self.a, self.b = a, b
        return a @ b

    def backward(self, g: Any) -> tuple:
        # Promote vectors to matrices so one formula covers every case.
        a = self.a[None, :] if self.a.ndim == 1 else self.a
        b = self.b[:, None] if self.b.ndim == 1 else self.b
        if self.a.ndim == 1:
            g = g[..., None, :] if self.b.ndim > 1 else g[..., None]
        if self.b.ndim == 1:
            g = g[..., None]
        ga = gb = None
        if self.wants(0):
            ga = unbroadcast(g @ b.swapaxes(-1, -2), a.shape).reshape(self.a.shape)
        if self.wants(1):
            gb = unbroadcast(a.swapaxes(-1, -2) @ g, b.shape).reshape(self.b.shape)
        return ga, gb


# The weights from this many entries up take their gradient in the product (see
# Linear._weight_grad for what that saves on the MLP's, of 401,408 and 131,072 entries).
# Below it, the call costs more than the pass it saves. On the 2-core machine, LeNet-5's
# step with its 120 x 400 weight (48,000) in the product was slower than with it in
# NumPy's (by 0.05-0.27 ms in five of six cases; 200 interleaved steps a setting, three
# runs); its smaller two, called alone on one thread (best of 5 x 200 calls), took
# 12-13 us against 5 us in NumPy's product and pass, and 26 us against 20.
ADD_INTO_MIN_SIZE = 65536


class Linear(Function):
    """x @ W.T + b over the last axis of x (leading axes are batch axes)."""

    def forward(self, x: Any, w: Any, b: Any = None) -> Any:
        if w.ndim != 2 or x.ndim < 1 or x.shape[-1] != w.shape[1]:
            raise ValueError(
                f"linear: input of shape {x.shape} does not fit weight of shape {w.shape}: "
                f"the input's last dim must be in_features = {w.shape[1] if w.ndim == 2 else '?'}")
        if b is not None and b.shape != (w.shape[0],):
            raise ValueError(f"linear: bias shape {b.shape} must be ({w.shape[0]},)")
        self.x_shape = x.shape
        self.x2 = x.reshape(-1, x.shape[-1])  # (M, in)
        self.w = w
        self.flops = 2 * self.x2.shape[0] * w.shape[0] * w.shape[1]  # of each product
        # 2-D input: the product as (W x^T)^T, which OpenBLAS runs 10-25% faster on these
        # layers' shapes than x W^T; the result is its Fortran-ordered transpose, which
        # the elementwise ops keep and the next layer's product takes as it is.
        with blas_threads_for(self.flops):
            out = (w @ self.x2.T).T if x.ndim == 2 else self.x2 @ w.T
        if b is not None:
            out += b
        return out.reshape(x.shape[:-1] + (w.shape[0],))

    def backward(self, g: Any) -> tuple:
        g2 = g.reshape(-1, g.shape[-1])  # (M, out)
        # (W^T g^T)^T, Fortran-ordered like the forward's output: the relu before this
        # layer then takes its gradient and its input in one order, without a copy
        with blas_threads_for(self.flops):
            gx = (self.w.T @ g2.T).T.reshape(self.x_shape) if self.wants(0) else None
            gw = self._weight_grad(g2) if self.wants(1) else None
        gb = g2.sum(axis=0) if self.wants(2) else None
        return gx, gw, gb

    def _weight_grad(self, g2: Any) -> Any:
        """The weight gradient g^T x, or None where it went into the weight's gradient already.

        A leaf weight (a Parameter) with a gradient array takes g^T x into that array in
        the product itself (:func:`minidp.kernels.gemm.add_product`, beta = 1): on the
        784-512-256-10 MLP at batch 128 that saved 0.19-0.31 ms of a 4.5-5.0 ms step at
        one thread and 0.06-0.20 ms of a 3.7-4.9 ms step at two (three runs of 300
        interleaved steps a setting on the 2-core machine): the pass of ``+=`` over the
        product and the gradient, 1.6 MB each for the first layer. backward then returns
        None for it, and Tensor.backward adds nothing more. A smaller weight (under
        :data:`ADD_INTO_MIN_SIZE`) takes NumPy's product and the pass.
        """
        w = self.inputs[1]
        if (w._creator is None and w.grad is not None and w.grad.size >= ADD_INTO_MIN_SIZE
                and add_product(g2.T, self.x2, w.grad)):
            return None
        return g2.T @ self.x2
