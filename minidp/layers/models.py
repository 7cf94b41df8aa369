"""The models the papers' experiments are scaled down to: MLP, LeNet-5, a CIFAR CNN, ResNet-20.

Each factory returns a Module whose parameters already live in flat buffers
(:meth:`Module.flat_parameters`), with PyTorch-compatible state_dict keys.
"""

from __future__ import annotations

import math
from typing import Any

from minidp.autograd import ops
from minidp.layers.basic import (
    AvgPool2d,
    BatchNorm2d,
    Conv2d,
    Flatten,
    Linear,
    MaxPool2d,
    ReLU,
    Sequential,
)
from minidp.layers.module import Module


def _flat(model: Module) -> Module:
    model.flat_parameters()
    return model


def mlp(in_features: int = 784, hidden: tuple[int, ...] = (512, 256),
        num_classes: int = 10) -> Module:
    """Flatten, then Linear+ReLU per hidden width, then a Linear classifier."""
    layers: list[Module] = [Flatten()]
    width = in_features
    for h in hidden:
        layers += [Linear(width, h), ReLU()]
        width = h
    layers.append(Linear(width, num_classes))
    return _flat(Sequential(*layers))


class LeNet5(Module):
    """LeNet-5 for 28x28 inputs (padding 2 on the first convolution), ReLU and max pooling.

    features: conv(1->6, 5x5, pad 2) relu pool2 conv(6->16, 5x5) relu pool2
    classifier: flatten linear(400->120) relu linear(120->84) relu linear(84->classes)
    """

    def __init__(self, in_channels: int = 1, num_classes: int = 10) -> None:
        super().__init__()
        self.features = Sequential(Conv2d(in_channels, 6, 5, padding=2), ReLU(), MaxPool2d(2),
                                   Conv2d(6, 16, 5), ReLU(), MaxPool2d(2))
        self.classifier = Sequential(Flatten(), Linear(16 * 5 * 5, 120), ReLU(),
                                     Linear(120, 84), ReLU(), Linear(84, num_classes))

    def forward(self, x: Any) -> Any:
        """Class scores of a (N, C, 28, 28) batch."""
        return self.classifier(self.features(x))


def lenet5(in_channels: int = 1, num_classes: int = 10) -> Module:
    """LeNet-5 (see :class:`LeNet5`)."""
    return _flat(LeNet5(in_channels, num_classes))


class CifarCNN(Module):
    """A small 3x32x32 CNN: three conv(3x3, pad 1)+ReLU+pool blocks (32, 64, 128), two FC."""

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.features = Sequential(
            Conv2d(in_channels, 32, 3, padding=1), ReLU(), MaxPool2d(2),
            Conv2d(32, 64, 3, padding=1), ReLU(), MaxPool2d(2),
            Conv2d(64, 128, 3, padding=1), ReLU(), MaxPool2d(2))
        self.classifier = Sequential(Flatten(), Linear(128 * 4 * 4, 256), ReLU(),
                                     Linear(256, num_classes))

    def forward(self, x: Any) -> Any:
        """Class scores of a (N, C, 32, 32) batch."""
        return self.classifier(self.features(x))


def cifar_cnn(in_channels: int = 3, num_classes: int = 10) -> Module:
    """The small CIFAR CNN (see :class:`CifarCNN`)."""
    return _flat(CifarCNN(in_channels, num_classes))


class BasicBlock(Module):
    """Two 3x3 conv+BN layers with a shortcut (1x1 conv+BN when the shape changes)."""

    def __init__(self, in_planes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = Conv2d(in_planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = BatchNorm2d(planes)
        self.conv2 = Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or in_planes != planes:
            self.downsample = Sequential(Conv2d(in_planes, planes, 1, stride=stride, bias=False),
                                         BatchNorm2d(planes))

    def forward(self, x: Any) -> Any:
        """relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x)), each relu fused into its BN."""
        out = self.bn1.forward_relu(self.conv1(x))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.bn2.forward_relu(self.conv2(out), residual=shortcut)


class ResNet20(Module):
    """ResNet-20 for CIFAR (He et al. 2016, 3 stages of 3 basic blocks: 16, 32, 64 planes).

    The shortcut that changes shape is a 1x1 convolution with BatchNorm (option B),
    named ``downsample`` as in torchvision, so weights map one-to-one to PyTorch.
    """

    def __init__(self, in_channels: int = 3, num_classes: int = 10) -> None:
        super().__init__()
        self.conv1 = Conv2d(in_channels, 16, 3, padding=1, bias=False)
        self.bn1 = BatchNorm2d(16)
        stages, planes = [], 16
        for width, stride in ((16, 1), (32, 2), (64, 2)):
            blocks = [BasicBlock(planes, width, stride), BasicBlock(width, width),
                      BasicBlock(width, width)]
            stages.append(Sequential(*blocks))
            planes = width
        self.layer1, self.layer2, self.layer3 = stages
        self.avgpool = AvgPool2d(8)
        self.fc = Linear(64, num_classes)

    def forward(self, x: Any) -> Any:
        """Class scores of a (N, C, 32, 32) batch."""
        out = self.bn1.forward_relu(self.conv1(x))
        out = self.layer3(self.layer2(self.layer1(out)))
        return self.fc(ops.flatten(self.avgpool(out), 1))


def resnet20(in_channels: int = 3, num_classes: int = 10) -> Module:
    """ResNet-20 (see :class:`ResNet20`)."""
    return _flat(ResNet20(in_channels, num_classes))


MODELS = {"mlp": mlp, "lenet5": lenet5, "cifar_cnn": cifar_cnn, "resnet20": resnet20}


def model_for(name: str, sample_shape: tuple[int, ...], num_classes: int) -> Module:
    """Model ``name`` for samples of ``sample_shape`` (C, H, W), or flattened for the MLP."""
    if name == "mlp":
        return mlp(math.prod(sample_shape), num_classes=num_classes)
    return MODELS[name](in_channels=sample_shape[0], num_classes=num_classes)
