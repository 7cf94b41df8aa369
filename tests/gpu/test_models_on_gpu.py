"""Every model and the optimizers on CuPy against NumPy, in float64 (``make test-gpu``).

The same forward and backward run on the host model and on its GPU replica; losses,
gradients and BatchNorm statistics must agree to rounding (cuBLAS and the host BLAS
sum in different orders, so equality is to 1e-9, not bitwise).
"""

import numpy as np
import pytest

from minidp import Tensor, backend, layers
from minidp import functional as F
from minidp.optim import LARS, SGD
from minidp.run.replica import DeviceReplica

pytestmark = pytest.mark.gpu

MODELS = {"mlp": (1, 8, 8), "lenet5": (1, 28, 28), "cifar_cnn": (3, 32, 32),
          "resnet20": (3, 32, 32)}


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_training_step_on_the_gpu_matches_the_host(name):
    shape = MODELS[name]
    layers.manual_seed(1)
    host = layers.model_for(name, shape, 10).to("cpu").to(np.float64)
    replica = DeviceReplica(host, "cuda")
    rng = np.random.default_rng(2)
    x, y = rng.standard_normal((4, *shape)), rng.integers(0, 10, 4)
    replica.parameters_to_device()
    replica.model.zero_grad()
    device_loss = F.cross_entropy(replica.model(Tensor(replica.inputs(x, y)[0])),
                                  replica.inputs(x, y)[1])
    device_loss.backward()
    replica.gradients_to_host()
    replica.buffers_to_host()
    device_grad = host.flat_parameters().grad.copy()
    device_buffers = {k: np.array(v) for k, v in host.named_buffers()}
    layers.manual_seed(1)
    twin = layers.model_for(name, shape, 10).to("cpu").to(np.float64)
    twin.flat_parameters().zero_grad()
    host_loss = F.cross_entropy(twin(Tensor(x)), y)
    host_loss.backward()
    assert device_loss.item() == pytest.approx(host_loss.item(), rel=1e-9)
    np.testing.assert_allclose(device_grad, twin.flat_parameters().grad, rtol=1e-9, atol=1e-12)
    for key, value in twin.named_buffers():
        np.testing.assert_allclose(device_buffers[key], value, rtol=1e-9, atol=1e-12)
    replica.close()


@pytest.mark.parametrize("make", [
    lambda p: SGD(p, lr=0.1, momentum=0.9, nesterov=True, weight_decay=1e-4),
    lambda p: LARS(p, lr=0.5, momentum=0.9, weight_decay=1e-4)], ids=["sgd", "lars"])
def test_the_optimizers_update_device_parameters_as_on_the_host(make):
    results = []
    for device in ("cpu", "cuda"):
        layers.manual_seed(4)
        model = layers.mlp(6, (5,), 3).to(device).to(np.float64)
        optimizer = make(model.parameters())
        flat = model.flat_parameters()
        for step in range(3):
            grad = np.random.default_rng(step).standard_normal(flat.size)
            flat.grad[...] = backend.to_module(grad, backend.device_module(device))
            optimizer.step()
        results.append(backend.to_host(flat.data))
    np.testing.assert_allclose(results[1], results[0], rtol=1e-12, atol=1e-14)
