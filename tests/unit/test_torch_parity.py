"""Outputs and gradients of every layer and model agree with PyTorch's for the same weights.

Skipped when torch is not installed (``make torch`` installs the CPU build).

ResNet-20 is compared in float64: in float32 the two frameworks round differently
(Winograd against direct convolution), and a pre-activation within rounding of
zero then passes one relu and not the other, which changes that sample's gradients
by far more than any tolerance. In float64 no gate flips and the match is tight.
"""

import numpy as np
import pytest

from minidp import Tensor, layers
from minidp import functional as F

torch = pytest.importorskip("torch")
nn = torch.nn
torch_models = pytest.importorskip("torch_models")


CASES = {
    **{name: (layers.MODELS[name], lambda name=name: torch_models.build(name),
              (8, 1, 28, 28) if name in ("mlp", "lenet5") else (8, 3, 32, 32))
       for name in layers.MODELS},
    "conv_stride2": (lambda: layers.Conv2d(3, 5, 3, stride=2, padding=1),
                     lambda: nn.Conv2d(3, 5, 3, stride=2, padding=1), (4, 3, 9, 8)),
    "avgpool": (lambda: layers.Sequential(layers.Conv2d(2, 3, 1), layers.AvgPool2d(3, 2)),
                lambda: nn.Sequential(nn.Conv2d(2, 3, 1), nn.AvgPool2d(3, 2)), (4, 2, 9, 9)),
    "maxpool_overlap": (lambda: layers.Sequential(layers.Conv2d(2, 3, 1), layers.MaxPool2d(3, 2)),
                        lambda: nn.Sequential(nn.Conv2d(2, 3, 1), nn.MaxPool2d(3, 2)),
                        (4, 2, 9, 9)),
    "batchnorm": (lambda: layers.Sequential(layers.Conv2d(2, 3, 3), layers.BatchNorm2d(3)),
                  lambda: nn.Sequential(nn.Conv2d(2, 3, 3), nn.BatchNorm2d(3)), (4, 2, 6, 6)),
    "conv_winograd": (lambda: layers.Conv2d(32, 8, 3, padding=1),  # odd sizes: partial tiles
                      lambda: nn.Conv2d(32, 8, 3, padding=1), (3, 32, 9, 6)),
    "conv_rowtap": (lambda: layers.Conv2d(16, 8, 3, padding=1),
                    lambda: nn.Conv2d(16, 8, 3, padding=1), (3, 16, 9, 6)),
}
DOUBLE = {"resnet20"}


def load_into_torch(tmodel, state):
    tmodel.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in state.items()})


@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_outputs_and_gradients_match_pytorch(name, mode):
    make, make_torch, shape = CASES[name]
    layers.manual_seed(1)
    model, tmodel = make(), make_torch()
    dtype, tol = (np.float64, 1e-6) if name in DOUBLE else (np.float32, 1)
    if name in DOUBLE:
        model.to(dtype)
        tmodel.double()
    load_into_torch(tmodel, model.state_dict())
    rng = np.random.default_rng(0)
    x_np = rng.standard_normal(shape).astype(dtype)
    getattr(model, mode)()
    getattr(tmodel, mode)()

    x = Tensor(x_np, requires_grad=True)
    out = model(x)
    tx = torch.from_numpy(x_np.copy()).requires_grad_(True)
    tout = tmodel(tx)
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=1e-4 * tol, atol=1e-5 * tol)

    g = rng.standard_normal(out.shape).astype(dtype)
    out.backward(g)
    tout.backward(torch.from_numpy(g))
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-3 * tol, atol=1e-5 * tol)
    tparams = dict(tmodel.named_parameters())
    for key, p in model.named_parameters():
        np.testing.assert_allclose(p.grad, tparams[key].grad.numpy(), rtol=1e-3 * tol,
                                   atol=1e-4 * tol, err_msg=key)
    tstate = tmodel.state_dict()
    for key, value in model.state_dict().items():  # running statistics after the step
        np.testing.assert_allclose(value, tstate[key].numpy(), rtol=1e-4 * tol,
                                   atol=1e-5 * tol, err_msg=key)


def test_cross_entropy_matches_pytorch():
    rng = np.random.default_rng(3)
    logits, labels = rng.standard_normal((16, 10)).astype(np.float32), rng.integers(0, 10, 16)
    x = Tensor(logits, requires_grad=True)
    loss = F.cross_entropy(x, labels)
    loss.backward()
    tx = torch.from_numpy(logits.copy()).requires_grad_(True)
    tloss = torch.nn.functional.cross_entropy(tx, torch.from_numpy(labels))
    tloss.backward()
    assert loss.item() == pytest.approx(tloss.item(), rel=1e-6)
    np.testing.assert_allclose(x.grad, tx.grad.numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("momentum,nesterov,wd", [(0.9, False, 5e-4), (0.9, True, 0.0)])
def test_sgd_steps_match_pytorch(momentum, nesterov, wd):
    from minidp.optim import SGD

    layers.manual_seed(2)
    model, tmodel = layers.lenet5(), torch_models.build("lenet5")
    load_into_torch(tmodel, model.state_dict())
    opt = SGD(model.parameters(), lr=0.05, momentum=momentum, nesterov=nesterov,
              weight_decay=wd)
    topt = torch.optim.SGD(tmodel.parameters(), lr=0.05, momentum=momentum, nesterov=nesterov,
                           weight_decay=wd)
    rng = np.random.default_rng(4)
    for _ in range(3):
        x, y = rng.standard_normal((8, 1, 28, 28)).astype(np.float32), rng.integers(0, 10, 8)
        opt.zero_grad()
        F.cross_entropy(model(Tensor(x)), y).backward()
        opt.step()
        topt.zero_grad()
        torch.nn.functional.cross_entropy(tmodel(torch.from_numpy(x)),
                                          torch.from_numpy(y)).backward()
        topt.step()
    tparams = dict(tmodel.named_parameters())
    for key, p in model.named_parameters():
        np.testing.assert_allclose(p.data, tparams[key].detach().numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=key)
