"""Batch norm's running statistics after several updates from non-zero values, as PyTorch's.

The rule (``minidp/autograd/ops/norm.py``, PyTorch's): after each training batch,
``running = (1 - momentum) running + momentum batch``, with the batch's *unbiased*
variance. Started from the defaults (mean 0, variance 1), a first update cannot tell
``(1 - m) running`` from ``m running`` for the mean; several updates from other values
can. The expected numbers are PyTorch's (``torch.nn.BatchNorm2d`` / ``BatchNorm1d`` in
float64, torch 2.13.0 CPU), computed once and written here, so the test needs no torch:

    bn = torch.nn.BatchNorm2d(3, momentum=m).double()   # BatchNorm1d for (N, C)
    bn.running_mean[:] = [0.5, -1.0, 2.0]; bn.running_var[:] = [2.0, 0.25, 1.5]
    bn.train(); for x in batches(shape, seed): bn(torch.from_numpy(x))

on the three batches of :func:`batches` (NumPy's generator, the same here and there).
"""

import numpy as np
import pytest

from minidp import Tensor, layers
from minidp import functional as F

START_MEAN, START_VAR = [0.5, -1.0, 2.0], [2.0, 0.25, 1.5]

# (shape, seed, momentum) -> PyTorch's running mean and variance after three batches
PYTORCH = {
    ((4, 3, 2, 3), 41, 0.1): ([0.4744495897946647, -1.2838213260260456, 2.3093019055970565],
                              [1.7009471928702449, 0.2337321161750615, 2.3765803030085957]),
    ((4, 3, 2, 3), 41, 0.3): ([0.4479734527428118, -1.6892100153151475, 2.751326599089236],
                              [1.2850528868161537, 0.2104637790018945, 3.7926383414213216]),
    ((5, 3), 42, 0.1): ([0.5204313768647226, -1.2636691222229097, 2.298945750347931],
                        [1.6867496042523764, 0.23554838421892757, 1.7123852091624627]),
    ((5, 3), 42, 0.3): ([0.5587367039489443, -1.6321331803340895, 2.7228926757627163],
                        [1.2996903996842724, 0.20017920913281753, 1.9985743486890835]),
}


def batches(shape, seed):
    """Three batches whose channels have other means and scales than the running values."""
    rng = np.random.default_rng(seed)
    shift = np.array([0.5, -2.0, 3.0]).reshape((1, 3) + (1,) * (len(shape) - 2))
    scale = np.array([1.0, 0.5, 2.0]).reshape((1, 3) + (1,) * (len(shape) - 2))
    return [rng.standard_normal(shape) * scale + shift for _ in range(3)]


def expected(shape, seed, momentum):
    mean, var = PYTORCH[shape, seed, momentum]
    return pytest.approx(mean, rel=1e-13), pytest.approx(var, rel=1e-13)


@pytest.mark.parametrize("momentum", [0.1, 0.3])
@pytest.mark.parametrize("fused", [False, True])
def test_batchnorm2d_running_statistics_after_three_batches_are_pytorchs(momentum, fused):
    bn = layers.BatchNorm2d(3, momentum=momentum).to(np.float64)
    bn.running_mean[...] = START_MEAN
    bn.running_var[...] = START_VAR
    bn.train()
    for x in batches((4, 3, 2, 3), 41):
        if fused:  # batch norm + relu in one op (ResNet's blocks): the same statistics
            bn.forward_relu(Tensor(x))
        else:
            bn(Tensor(x))
    mean, var = expected((4, 3, 2, 3), 41, momentum)
    assert bn.running_mean.tolist() == mean
    assert bn.running_var.tolist() == var
    assert int(bn.num_batches_tracked) == 3


@pytest.mark.parametrize("momentum", [0.1, 0.3])
def test_batch_norm_over_n_c_updates_the_running_statistics_as_batchnorm1d(momentum):
    running_mean, running_var = np.array(START_MEAN), np.array(START_VAR)
    for x in batches((5, 3), 42):
        F.batch_norm(Tensor(x), running_mean, running_var, training=True, momentum=momentum)
    mean, var = expected((5, 3), 42, momentum)
    assert running_mean.tolist() == mean
    assert running_var.tolist() == var


def test_inference_leaves_the_running_statistics_and_uses_them():
    bn = layers.BatchNorm2d(3, momentum=0.3).to(np.float64)
    bn.running_mean[...] = START_MEAN
    bn.running_var[...] = START_VAR
    bn.eval()
    x = batches((4, 3, 2, 3), 41)[0]
    out = bn(Tensor(x)).data
    assert bn.running_mean.tolist() == START_MEAN and bn.running_var.tolist() == START_VAR
    shape = (1, 3, 1, 1)
    by_hand = (x - np.reshape(START_MEAN, shape)) / np.sqrt(np.reshape(START_VAR, shape) + 1e-5)
    np.testing.assert_allclose(out, by_hand, rtol=1e-12, atol=1e-12)
