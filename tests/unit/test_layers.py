"""Modules: parameter order, flat buffers, state_dict errors, modes, input errors."""

import numpy as np
import pytest

from minidp import Tensor, layers
from minidp import functional as F
from minidp.layers import LayerInputError


@pytest.mark.parametrize("name", sorted(layers.MODELS))
def test_every_parameter_views_the_flat_buffers(name):
    model = layers.MODELS[name]()
    flat = model.flat_parameters()
    assert flat.size == sum(p.data.size for p in model.parameters())
    for p, sl in zip(flat.params, flat.slices):
        assert np.shares_memory(p.data, flat.data) and np.shares_memory(p.grad, flat.grad)
        np.testing.assert_array_equal(p.data.ravel(), flat.data[sl])


def test_backward_writes_into_the_flat_gradient_buffer():
    model = layers.lenet5()
    flat = model.flat_parameters()
    x = Tensor(np.random.default_rng(0).standard_normal((4, 1, 28, 28)).astype(np.float32))
    F.cross_entropy(model(x), np.array([0, 1, 2, 3])).backward()
    assert np.abs(flat.grad).sum() > 0
    offset = 0
    for p in model.parameters():
        np.testing.assert_array_equal(flat.grad[offset:offset + p.grad.size], p.grad.ravel())
        offset += p.grad.size


class Memory:
    """What rebind_grad takes (a NodeBuffer outside MPI): an object holding an array."""

    def __init__(self, array):
        self.array = array


def test_rebind_grad_moves_gradients_into_another_buffer():
    model = layers.mlp(4, (3,), 2)
    flat = model.flat_parameters()
    flat.grad[...] = 7
    target = np.zeros(flat.size, np.float32)
    flat.rebind_grad(Memory(target))
    assert np.all(target == 7) and np.shares_memory(model.parameters()[0].grad, target)
    assert flat.grad is target
    with pytest.raises(ValueError, match=r"rebind_grad: buffer has shape \(3,\)"):
        flat.rebind_grad(Memory(np.zeros(3, np.float32)))


def test_rebind_data_makes_the_parameters_views_of_a_buffer_it_does_not_fill():
    model = layers.mlp(4, (3,), 2)
    flat = model.flat_parameters()
    target = np.arange(flat.size, dtype=np.float32)  # the caller's values are the new ones
    flat.rebind_data(target)
    first = model.parameters()[0]
    assert flat.data is target and np.shares_memory(first.data, target)
    np.testing.assert_array_equal(first.data.reshape(-1), target[:first.data.size])
    assert flat.intact(model.parameters())  # an optimizer built before still accepts them
    with pytest.raises(ValueError, match=r"rebind_data: buffer has shape \(3,\)"):
        flat.rebind_data(np.zeros(3, np.float32))


def test_named_parameters_order_and_keys_follow_pytorch():
    keys = [k for k, _ in layers.resnet20().named_parameters()]
    assert keys[:4] == ["conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.conv1.weight"]
    assert "layer2.0.downsample.0.weight" in keys and keys[-2:] == ["fc.weight", "fc.bias"]
    state = layers.resnet20().state_dict()
    assert list(state)[:6] == ["conv1.weight", "bn1.weight", "bn1.bias", "bn1.running_mean",
                               "bn1.running_var", "bn1.num_batches_tracked"]


def test_state_dict_round_trip_and_errors():
    a, b = layers.lenet5(), layers.lenet5()
    b.load_state_dict(a.state_dict())
    for (ka, pa), (kb, pb) in zip(a.named_parameters(), b.named_parameters()):
        assert ka == kb
        np.testing.assert_array_equal(pa.data, pb.data)
    assert b.flat_parameters().intact(b.parameters())  # loading keeps the flat views
    state = a.state_dict()
    with pytest.raises(KeyError, match=r"missing keys \['classifier.5.bias'\]"):
        b.load_state_dict({k: v for k, v in state.items() if k != "classifier.5.bias"})
    with pytest.raises(KeyError, match=r"unexpected keys \['extra'\]"):
        b.load_state_dict({**state, "extra": np.zeros(1)})
    with pytest.raises(ValueError, match=r"'features.0.bias' has shape \(7,\).*\(6,\)"):
        b.load_state_dict({**state, "features.0.bias": np.zeros(7)})


def test_to_float64_converts_parameters_buffers_and_flat_buffers():
    model = layers.resnet20().to(np.float64)
    assert model.flat_parameters().data.dtype == np.float64
    assert all(p.data.dtype == np.float64 for p in model.parameters())
    assert model.layer1[0].bn1.running_var.dtype == np.float64


def test_train_and_eval_modes_reach_every_layer():
    model = layers.resnet20()
    model.eval()
    assert all(not m.training for _, m in model.named_modules())
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 32, 32)).astype(np.float32))
    before = model.bn1.running_mean.copy()
    model(x)
    np.testing.assert_array_equal(model.bn1.running_mean, before)  # eval: stats untouched
    model.train()
    model(x)
    assert not np.array_equal(model.bn1.running_mean, before)
    assert int(model.bn1.num_batches_tracked) == 1


def test_wrong_input_shape_names_the_layer_and_both_shapes():
    with pytest.raises(LayerInputError,
                       match=r"layer 'classifier.1' \(Linear\(in_features=400.*\(\*, 400\).*"
                             r"\(2, 576\)"):
        layers.lenet5()(Tensor(np.zeros((2, 1, 32, 32), np.float32)))
    with pytest.raises(LayerInputError, match=r"layer 'features.0'.*\(N, 1, H, W\).*"
                                              r"\(2, 3, 28, 28\)"):
        layers.lenet5()(Tensor(np.zeros((2, 3, 28, 28), np.float32)))
    with pytest.raises(LayerInputError, match=r"layer '1'.*\(\*, 784\), got \(3, 10\)"):
        layers.mlp()(Tensor(np.zeros((3, 10), np.float32)))


def test_default_initialisation_bounds_follow_pytorch():
    lin = layers.Linear(100, 50)
    assert np.abs(lin.weight.data).max() <= 0.1 and np.abs(lin.weight.data).max() > 0.09
    conv = layers.Conv2d(3, 8, 5)
    bound = 1 / np.sqrt(75)
    assert np.abs(conv.weight.data).max() <= bound and np.abs(conv.bias.data).max() <= bound


def test_dropout_layer_respects_mode():
    drop = layers.Dropout(0.5)
    x = Tensor(np.ones((100, 100), np.float32))
    out = drop(x).data
    assert set(np.unique(out)) <= {0.0, 2.0} and 0.4 < (out == 0).mean() < 0.6
    drop.eval()
    np.testing.assert_array_equal(drop(x).data, x.data)
