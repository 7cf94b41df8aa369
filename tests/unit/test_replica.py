"""The compute replica and its staging: what the GPU path moves, checked on both devices.

Each body runs with the replica on ``"cpu"`` (a second host copy, always) and on
``"cuda"`` (marked ``gpu``: skipped without a device, run by ``make test-gpu``).
"""

import numpy as np
import pytest

from minidp import Tensor, backend, layers
from minidp import functional as F
from minidp.backend import Staging
from minidp.run.replica import DeviceReplica, HostCompute

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def small_bn_model():
    """Conv, BatchNorm (running statistics: buffers), ReLU, Linear, in float64."""
    layers.manual_seed(3)
    return layers.Sequential(layers.Conv2d(2, 4, 3, padding=1), layers.BatchNorm2d(4),
                             layers.ReLU(), layers.Flatten(),
                             layers.Linear(4 * 5 * 5, 3)).to(np.float64)


def batch(seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((6, 2, 5, 5)), rng.integers(0, 3, 6)


def host_step(model, x, y):
    model.flat_parameters().zero_grad()
    loss = F.cross_entropy(model(Tensor(x)), y)
    loss.backward()
    return loss.item()


@pytest.mark.parametrize("device", DEVICES)
def test_a_step_on_the_replica_is_the_host_step(device):
    host, twin = small_bn_model(), small_bn_model()
    replica = DeviceReplica(host, device)
    x, y = batch()
    replica.parameters_to_device()
    replica.model.zero_grad()  # the Trainer's loop zeroes the gradients, on any device
    rx, ry = replica.inputs(x, y)
    loss = F.cross_entropy(replica.model(Tensor(rx)), ry)
    loss.backward()
    replica.gradients_to_host()
    expected = host_step(twin, x, y)
    assert loss.item() == pytest.approx(expected, rel=1e-12)
    np.testing.assert_allclose(host.flat_parameters().grad, twin.flat_parameters().grad,
                               rtol=1e-10, atol=1e-13)
    # forward changed the replica's BatchNorm statistics only, until they are brought down
    host_mean = dict(host.named_buffers())["1.running_mean"]
    assert np.all(host_mean == 0)
    replica.buffers_to_host()
    np.testing.assert_allclose(host_mean, dict(twin.named_buffers())["1.running_mean"],
                               rtol=1e-12)
    replica.close()


@pytest.mark.parametrize("device", DEVICES)
def test_the_replica_takes_what_the_strategy_wrote_on_the_host(device):
    host = small_bn_model()
    replica = DeviceReplica(host, device)
    flat = host.flat_parameters()
    flat.data[...] = np.arange(flat.size) / flat.size  # an update, a pull, an average
    dict(host.named_buffers())["1.running_var"][...] = 7.0
    replica.parameters_to_device()
    replica.buffers_to_device()
    np.testing.assert_array_equal(backend.to_host(replica.flat.data), flat.data)
    assert np.all(backend.to_host(dict(replica.model.named_buffers())["1.running_var"]) == 7)
    replica.flat.grad[...] = 1.0  # left over from the last batch
    replica.parameters_to_device()  # moves parameters only: zeroing is the Trainer's loop
    assert np.all(backend.to_host(replica.flat.grad) == 1.0)
    replica.close()


def test_the_host_compute_moves_nothing_and_leaves_the_gradients_to_the_loop():
    host = small_bn_model()
    compute = HostCompute(host)
    flat = host.flat_parameters()
    flat.grad[...] = 3.0
    x, y = batch()
    assert compute.inputs(x, y) == (x, y)
    compute.parameters_to_device()
    compute.gradients_to_host()
    assert compute.model is host and np.all(flat.grad == 3.0)


@pytest.mark.parametrize("device", DEVICES)
def test_staging_a_window_sized_segment_both_ways(device):
    xp = backend.device_module(device)
    host = np.zeros(1000, np.float32)[100:900]  # a segment of a larger buffer
    twin = xp.arange(800, dtype=np.float32)
    staged = Staging(host, twin)
    staged.download()
    np.testing.assert_array_equal(host, np.arange(800))
    host[...] = -1
    staged.upload()
    assert float(twin.sum()) == -800
    staged.close()


def test_staging_mismatched_arrays_is_a_clear_error():
    with pytest.raises(ValueError, match=r"staging: host array \(4,\) float32 and device "
                                         r"array \(4,\) float64 must match"):
        Staging(np.zeros(4, np.float32), np.zeros(4, np.float64))


def test_unknown_device_is_a_clear_error():
    with pytest.raises(ValueError, match=r"device: got 'gpu', allowed: 'cpu', 'cuda'"):
        backend.device_module("gpu")


def test_moving_a_model_to_the_cpu_keeps_its_values_and_rebuilds_the_flat_buffers():
    model = small_bn_model()
    before = {k: np.array(v) for k, v in model.state_dict().items()}
    old_flat = model.flat_parameters()
    assert model.to("cpu") is model
    assert model.flat_parameters() is not old_flat
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, before[key])
    assert model.flat_parameters().data.dtype == np.float64


def test_info_says_why_there_is_no_gpu():
    info = backend.gpu_info()
    if info["devices"]:
        pytest.skip("a GPU is visible here")
    assert info["why"] and (info["cupy"] is None) == ("not installed" in info["why"])
