"""SPMD: collectives over Tensors' raw arrays; sharded gradients equal the full batch's."""

import numpy as np
from mpi4py import MPI

from minidp import Tensor
from minidp import functional as F

comm = MPI.COMM_WORLD


def test_allreduce_of_gradients_gives_the_mean_of_ranks():
    x = Tensor(np.zeros(5), requires_grad=True)
    (x * float(comm.rank)).sum().backward()  # grad == rank everywhere
    comm.Allreduce(MPI.IN_PLACE, x.grad, op=MPI.SUM)
    x.grad /= comm.size
    np.testing.assert_array_equal(x.grad, np.full(5, (comm.size - 1) / 2))


def test_sharded_gradients_average_to_the_full_batch_gradient():
    rng = np.random.default_rng(42)  # same data and weights on every rank
    per_rank = 3
    images = rng.standard_normal((per_rank * comm.size, 2, 6, 6))
    labels = rng.integers(0, 4, per_rank * comm.size)
    w0, lw0 = rng.standard_normal((3, 2, 3, 3)), rng.standard_normal((4, 12))

    def grads(x, y):
        w, lw = Tensor(w0.copy(), requires_grad=True), Tensor(lw0.copy(), requires_grad=True)
        h = F.max_pool2d(F.conv2d(Tensor(x), w, stride=1, padding=1).relu(), 3)
        F.cross_entropy(F.linear(F.flatten(h), lw), y).backward()
        return np.concatenate([w.grad.ravel(), lw.grad.ravel()])

    mine = slice(comm.rank * per_rank, (comm.rank + 1) * per_rank)
    local = grads(images[mine], labels[mine])
    comm.Allreduce(MPI.IN_PLACE, local, op=MPI.SUM)
    local /= comm.size
    np.testing.assert_allclose(local, grads(images, labels), rtol=1e-12, atol=1e-14)
